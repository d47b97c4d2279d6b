// A heatmap of any tensor through the preview route: tensor choice, row range (zoom), what a
// pixel shows when the preview samples (its block's mean, max or min, or one element), and a
// choice of index on the axes not shown (heads, channels).
import { PREVIEW_POINTS, preview } from "./api.js";
import { panel } from "./chart.js";
import { el, shapeText } from "./dom.js";
import { heatmap } from "./heatmap.js";
import { multiples, POOLS, previewMatrix, sampled } from "./matrix.js";
import { take, writeView } from "./permalink.js";
import { sampledNote, sampledRows } from "./sampled.js";
import { working } from "./status.js";

// target: {key, outputs, label, only (one tensor), rowName (what a row is), main (in the URL),
// sampled (over the response limit: rows computed by /v2 for `entry`)}
export function heatmapPanel(target, title) {
  const names = Object.entries(target.outputs)
    .filter(([n, o]) => o.shape.length >= 2 && (!target.only || n === target.only))
    .map(([n]) => n);
  if (!names.length) return panel(title, el("p", {}, "No tensor with two or more axes to draw."));
  const holder = el("div");
  const tensorSel = el(
    "select",
    { name: "tensor", "aria-label": "tensor" },
    names.map((n) => el("option", { value: n }, n)),
  );
  if (names.includes("cos")) tensorSel.value = "cos";
  const poolSel = el(
    "select",
    { name: "pool", "aria-label": "each pixel shows" },
    Object.entries(POOLS).map(([v, t]) => el("option", { value: v }, t)),
  );
  const rowWord = target.rowName || "position";
  const start = el("input", { type: "number", name: "row_start", min: 0, step: 1, "aria-label": `first ${rowWord}` });
  const end = el("input", {
    type: "number",
    name: "row_end",
    min: 1,
    step: 1,
    "aria-label": `end ${rowWord} (exclusive)`,
  });
  const fixed = {};
  let last = null;
  let rowsShown = null;
  const total = () => (last && last.row_axis !== null ? last.shape[last.row_axis] : null);
  if (target.main) {
    const tensor = take("tensor");
    if (names.includes(tensor)) tensorSel.value = tensor;
    const pool = take("pool");
    if (pool in POOLS) poolSel.value = pool;
    const rows = /^(\d+):(\d+)$/.exec(take("rows") || "");
    if (rows) rowsShown = [Number(rows[1]), Number(rows[2])];
  }
  const remember = () => {
    if (!target.main) return;
    writeView({
      tensor: tensorSel.value,
      pool: poolSel.value === "mean" ? null : poolSel.value,
      rows: rowsShown ? rowsShown.join(":") : null,
    });
  };
  async function show(rows) {
    await working(
      "Sampling the table",
      async () => {
        const p = target.sampled
          ? await sampledRows(target.entry, tensorSel.value, rows)
          : await preview(target.key, tensorSel.value, rows);
        last = p;
        rowsShown = rows;
        const n = total();
        if (n !== null) {
          start.value = rows ? rows[0] : 0;
          end.value = rows ? rows[1] : n;
          start.max = n - 1;
          end.max = n;
        }
        remember();
        render();
      },
      controls,
    );
  }
  function axisSelects(p, m0) {
    const selects = [];
    const nd = p.axes.length;
    for (let axis = 0; axis < nd; axis += 1) {
      if (axis === m0.rowAxis || axis === m0.colAxis) continue;
      const pairAxis = p.tensor === "pairs" && axis === nd - 1;
      const label = p.tensor === "bias" && axis === 0 ? "head" : pairAxis ? "cos or sin" : `axis ${axis}`;
      const options = Array.from({ length: p.axes[axis].count }, (_, k) =>
        el(
          "option",
          { value: k },
          pairAxis ? ["cos", "sin"][k] : `${label} ${p.axes[axis].start + k * p.axes[axis].step}`,
        ),
      );
      const sel = el(
        "select",
        {
          "aria-label": label,
          name: `axis_${axis}`,
          onchange: () => {
            fixed[axis] = Number(sel.value);
            render();
          },
        },
        options,
      );
      sel.value = String(fixed[axis] || 0);
      selects.push(el("label", {}, `${label} `, sel));
    }
    return selects;
  }
  function render() {
    const p = last;
    holder.replaceChildren();
    const nd = p.axes.length;
    const m0 = previewMatrix(p, fixed);
    const selects = axisSelects(p, m0);
    const axisNames = {};
    if (p.tensor === "bias" || p.tensor === "buckets") {
      axisNames[m0.rowAxis] = "query";
      axisNames[m0.colAxis] = "key";
    }
    if (p.kind === "sinusoidal_2d" && nd === 3) {
      axisNames[1] = "y (row)";
      axisNames[2] = "x (column)";
    }
    if (p.tensor === "pairs") axisNames[m0.colAxis] = "rotary pair";
    // rows computed by /v2 are single entries: nothing pooled to choose from
    poolSel.disabled = Boolean(p.computed);
    const mode = poolSel.value;
    const m = previewMatrix(p, fixed, axisNames, mode, rowWord);
    const blocks = p.axes.map((a) => a.step).join(" × ");
    let note = `${p.tensor} ${shapeText(p.shape)} ${p.dtype}, every element.`;
    if (p.computed && sampled(p)) {
      note = sampledNote(p, shapeText(p.shape), rowWord);
    } else if (sampled(p)) {
      note =
        mode === "sample"
          ? `${p.tensor} ${shapeText(p.shape)} ${p.dtype}, sampled every ${blocks} elements (at most ${PREVIEW_POINTS} points; zoom to see every row).`
          : `${p.tensor} ${shapeText(p.shape)} ${p.dtype}: each pixel is the ${mode} of a block of ${blocks} elements (at most ${PREVIEW_POINTS} blocks; zoom to see every row).`;
    }
    holder.append(selects.length ? el("div", { class: "controls" }, selects) : "");
    const onRange = p.row_axis !== null ? (a, b) => show([a, Math.min(b, total())]) : null;
    holder.append(
      heatmap(m, { title: `${target.label} ${p.tensor}`, caption: note, onRange, name: `${p.tensor}_heatmap` }),
    );
    if (nd === 3 && p.row_axis === null) holder.append(multiples(p));
  }
  const zoom = (factor) => {
    const n = total();
    if (n === null) return;
    const a = Number(start.value || 0);
    const b = Number(end.value || n);
    const mid = (a + b) / 2;
    const half = Math.max(1, Math.round(((b - a) * factor) / 2));
    const lo = Math.max(0, Math.round(mid - half));
    show([lo, Math.min(n, Math.max(lo + 1, Math.round(mid + half)))]);
  };
  const submit = (ev) => {
    ev.preventDefault();
    const n = total();
    show(n === null ? null : [Number(start.value || 0), Number(end.value || n)]);
  };
  const button = (text, onclick) => el("button", { type: "button", class: "secondary", onclick }, text);
  const controls = el(
    "form",
    { class: "controls", onsubmit: submit },
    names.length > 1 ? el("label", {}, "tensor ", tensorSel) : null,
    el("label", {}, `${rowWord}s from `, start),
    el("label", {}, " to ", end),
    el("button", { type: "submit" }, "Show"),
    button("Zoom in", () => zoom(0.5)),
    button("Zoom out", () => zoom(2)),
    button("Whole table", () => show(null)),
    el("label", {}, " each pixel: ", poolSel),
  );
  tensorSel.addEventListener("change", () => show(null));
  poolSel.addEventListener("change", () => {
    remember();
    if (last) render();
  });
  show(rowsShown);
  const hint = el(
    "p",
    { class: "muted" },
    `Drag over the heatmap to zoom to those ${rowWord}s; focus it and use the arrow keys to read values.`,
  );
  return panel(`${title}: heatmap`, controls, hint, holder);
}
