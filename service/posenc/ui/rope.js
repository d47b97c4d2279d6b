// RoPE plots: wavelength per rotary pair against the context (scaled, unscaled, and another
// model's overlaid); the difference heatmap against another config is compare.js.
import { getJSON, overLimit, postSpec, session, tensorJSON } from "./api.js";
import { lineChart, panel, valuesTable } from "./chart.js";
import { el, fmt } from "./dom.js";
import { take, writeView } from "./permalink.js";
import { working } from "./status.js";

const META_SKIP = new Set(["kind", "spec", "key", "algorithm_version", "device", "shapes", "dtypes"]);
export const metaFacts = (meta) =>
  Object.entries(meta)
    .filter(([k]) => !META_SKIP.has(k))
    .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : fmt(v)}`);

// The rows the table holds (its position axis), not the spec's seq_len.
export const tableRows = (entry) => Object.values(entry.outputs).find((o) => o.shape.length >= 2)?.shape[0];

const wavelengths = (inv) => inv.map((f) => (f > 0 ? (2 * Math.PI) / f : Infinity));

// Per-pair factors: the scaling's fields that are lists (LongRoPE's short_factor, long_factor),
// as the spec the server canonicalised says; such a scaling has no ramp.
const perPairFields = (scaling) =>
  Object.entries(scaling || {})
    .filter(([, v]) => Array.isArray(v))
    .map(([k]) => k);

function scalingSummary(scaling, ratio, meta) {
  const finite = ratio.filter(Number.isFinite);
  const rmin = Math.min(...finite);
  const rmax = Math.max(...finite);
  const lists = perPairFields(scaling);
  if (lists.length) {
    const used = meta.longrope_factors ? `${meta.longrope_factors}_factor` : lists.join(" or ");
    return {
      bands: [],
      text: `Per-pair factors (${used}): each pair's wavelength is scaled by its own factor, from ${fmt(rmin)} to ${fmt(rmax)}; no ramp.`,
    };
  }
  if (!(rmax / rmin > 1 + 1e-6))
    return { bands: [], text: `Every pair's wavelength is scaled by ${fmt(rmax)} (no ramp).` };
  const near = (r, v) => Math.abs(r - v) <= v * 1e-6;
  const inside = ratio.map((r, i) => (near(r, rmin) || near(r, rmax) ? -1 : i)).filter((i) => i >= 0);
  const low = ratio.filter((r) => near(r, rmin)).length;
  const high = ratio.filter((r) => near(r, rmax)).length;
  if (!inside.length)
    return {
      bands: [],
      text: `Pairs scaled by ${fmt(rmin)}: ${low}; scaled by ${fmt(rmax)}: ${high} (no pair in between).`,
    };
  const [a, b] = [inside[0], inside[inside.length - 1]];
  return {
    bands: [{ x0: a - 0.5, x1: b + 0.5, label: "ramp" }],
    text: `Pairs scaled by ${fmt(rmin)}: ${low}; on the ramp: pairs ${a}–${b}; scaled by ${fmt(rmax)}: ${high}.`,
  };
}

// The first rope table of a preset: {label, wavelengths}.
async function presetWavelengths(name) {
  const p = await getJSON(`v1/presets/${encodeURIComponent(name)}`);
  const part = p.parts.find((x) => x.kind === "rope" && x.outputs?.inv_freq) || p.parts.find((x) => x.kind === "rope");
  if (!part) throw new Error(`${p.title} has no rope table to overlay`);
  const t = await tensorJSON(part.key, "inv_freq");
  return { label: `${name} ${part.name}`, y: wavelengths(t.data) };
}

// The table's inv_freq; over the response limit, from the same spec with one row (inv_freq does
// not depend on the row count; the canonical spec keeps any seq_len the scaling reads).
async function invFreq(entry) {
  if (!overLimit(entry.bytes)) return tensorJSON(entry.key, "inv_freq");
  const small = await postSpec({ ...entry.spec, max_positions: 1 }, "inv_freq");
  return { ...small.tensor, meta: small.meta };
}

// wavelength 2*pi/inv_freq of each rotary pair, scaled and unscaled, against the original and
// extended context; a ramp where the scaling factor varies smoothly between two values.
export function wavelengthPanel(entry) {
  const holder = el("div");
  const spec = entry.spec;
  const scaling = spec.rope_scaling && spec.rope_scaling.rope_type !== "default" ? spec.rope_scaling : null;
  const overlaySel = el(
    "select",
    { name: "overlay", "aria-label": "overlay another model" },
    el("option", { value: "" }, "none"),
    (session.presets || []).map((p) => el("option", { value: p.name }, p.name)),
  );
  const chartBox = el("div");
  let draw = () => {};
  working(
    "Fetching frequencies",
    async () => {
      const mine = await invFreq(entry);
      const pairs = mine.data.map((_, i) => i);
      const wl = wavelengths(mine.data);
      const series = [{ name: scaling ? `${scaling.rope_type} (this table)` : "this table", x: pairs, y: wl }];
      const rows = tableRows(entry);
      const hlines = [];
      const orig = scaling && (scaling.original_max_position_embeddings || mine.meta.longrope_switch_point);
      if (orig) hlines.push({ y: orig, label: "original context" });
      hlines.push({ y: rows, label: `table length (${rows} rows)` });
      let ratio = null;
      let summary = { bands: [], text: "No scaling: wavelengths are 2π·rope_theta^(2i/d)." };
      if (scaling) {
        const plain = { ...spec, max_positions: 1 };
        delete plain.rope_scaling;
        delete plain.seq_len;
        const base = await postSpec(plain, "inv_freq");
        const wl0 = wavelengths(base.tensor.data);
        series.push({ name: "no scaling (same rope_theta)", x: pairs, y: wl0 });
        ratio = wl.map((w, i) => (Number.isFinite(w) && Number.isFinite(wl0[i]) ? w / wl0[i] : NaN));
        summary = scalingSummary(scaling, ratio, mine.meta);
      }
      let overlay = null;
      draw = () => {
        const all = overlay
          ? [...series, { name: overlay.label, x: overlay.y.map((_, i) => i), y: overlay.y }]
          : series;
        chartBox.replaceChildren(
          lineChart({
            series: all,
            xLabel: "rotary pair i",
            yLabel: "wavelength (positions)",
            logY: true,
            hlines,
            bands: summary.bands,
            title: "wavelength per rotary pair",
            name: "wavelengths",
          }),
        );
      };
      overlaySel.onchange = () =>
        working(
          "Overlaying",
          async () => {
            overlay = overlaySel.value ? await presetWavelengths(overlaySel.value) : null;
            writeView({ overlay: overlaySel.value || null });
            draw();
          },
          overlaySel.parentElement,
        );
      draw();
      const parts = [el("p", { class: "scaling-summary" }, summary.text)];
      if (spec.seq_len && spec.seq_len !== rows)
        parts.push(
          el("p", {}, `The factors are the ones chosen for seq_len ${spec.seq_len}; the table holds ${rows} rows.`),
        );
      const facts = metaFacts(mine.meta);
      if (facts.length)
        parts.push(el("p", { class: "meta-facts" }, "Computed with the table: ", facts.join("; "), "."));
      if (ratio) {
        const lists = perPairFields(scaling).length;
        parts.push(
          lineChart({
            series: [{ name: "scale", x: pairs, y: ratio }],
            xLabel: "rotary pair i",
            yLabel: lists ? "per-pair factor (wavelength ÷ unscaled)" : "wavelength ÷ unscaled",
            bands: summary.bands,
            hlines: [{ y: 1, label: "unscaled" }],
            height: 200,
            title: "scaling per pair",
            name: "scaling",
          }),
        );
      }
      parts.push(
        valuesTable(
          ["pair", "inv_freq", "wavelength", ...(ratio ? ["scale"] : [])],
          pairs.map((i) => [i, mine.data[i], wl[i], ...(ratio ? [ratio[i]] : [])]),
          "wavelengths as a table",
        ),
      );
      holder.replaceChildren(...parts);
      const wanted = take("overlay");
      if (wanted && (session.presets || []).some((p) => p.name === wanted)) {
        overlaySel.value = wanted;
        overlaySel.onchange();
      }
    },
    chartBox,
  );
  const form = el("div", { class: "controls" }, el("label", {}, "overlay another model's wavelengths: ", overlaySel));
  return panel("Wavelength per dimension against the context", form, chartBox, holder);
}
