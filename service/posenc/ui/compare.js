// This RoPE table minus another (the same without scaling, default RoPE, or another table of
// this model): the server pools the element-wise difference per block (GET .../preview?minus=,
// each block's largest |difference|, min, max and mean), so a difference faster than the block
// is not aliased, and subtracting two pooled tables (which is not the pooled difference) is
// never done here.
import { postSpec, preview, session } from "./api.js";
import { lineChart, panel } from "./chart.js";
import { el, fmt, shapeText } from "./dom.js";
import { heatmap } from "./heatmap.js";
import { DIFF_POOLS, previewMatrix, sampled } from "./matrix.js";
import { working } from "./status.js";

function choicesFor(entry) {
  const choices = [];
  const spec = entry.spec;
  if (spec.rope_scaling && spec.rope_scaling.rope_type !== "default") {
    const plain = { ...spec };
    delete plain.rope_scaling;
    choices.push({ label: "the same without its scaling", spec: plain });
  }
  const dflt = {
    kind: "rope",
    head_dim: spec.head_dim,
    rotary_dim: spec.rotary_dim,
    max_positions: spec.max_positions,
    width: spec.width,
    packing: spec.packing,
    interleaved: spec.interleaved,
  };
  choices.push({ label: "default RoPE (rope_theta 10000, no scaling)", spec: dflt });
  for (const other of session.model ? session.model.entries : []) {
    if (other.key !== entry.key && other.kind === "rope")
      choices.push({ label: `${other.name} of this model`, key: other.key });
  }
  return choices;
}

// The largest |difference| of each row (block of rows) over every column: from the pooled
// maxabs, so over every element of the block.
function perRowWorst(m) {
  const out = [];
  for (let r = 0; r < m.rows; r += 1) {
    let worst = 0;
    for (let c = 0; c < m.cols; c += 1) worst = Math.max(worst, m.data[r * m.cols + c]);
    out.push(worst);
  }
  return out;
}

function firstDeparture(worst, m) {
  const first = worst.findIndex((v) => v > 0);
  if (first < 0) return "The tables are identical over these positions (every element compared).";
  const largest = fmt(Math.max(...worst));
  const at = m.rowIndex(first);
  const where =
    m.rowStep > 1
      ? `in positions ${at}–${at + m.rowStep - 1} (the first block of ${m.rowStep} whose largest |difference| is not 0; zoom in for the position)`
      : `at position ${at}`;
  return `The tables first differ ${where}; the largest |difference| is ${largest}.`;
}

export function comparePanel(entry) {
  const holder = el("div");
  const choices = choicesFor(entry);
  const against = el(
    "select",
    { name: "compare_with", "aria-label": "compare with" },
    choices.map((c, i) => el("option", { value: i }, c.label)),
  );
  const tensors = Object.entries(entry.outputs)
    .filter(([, o]) => o.shape.length >= 2)
    .map(([n]) => n);
  const tensorSel = el(
    "select",
    { name: "compare_tensor", "aria-label": "tensor" },
    tensors.map((n) => el("option", { value: n }, n)),
  );
  const poolSel = el(
    "select",
    { name: "compare_pool", "aria-label": "each difference pixel shows" },
    Object.entries(DIFF_POOLS).map(([v, t]) => el("option", { value: v }, t)),
  );
  const total = entry.outputs[tensors[0]].shape[0];
  const start = el("input", {
    type: "number",
    name: "compare_start",
    min: 0,
    value: 0,
    "aria-label": "first position",
  });
  const end = el("input", { type: "number", name: "compare_end", min: 1, value: total, "aria-label": "end position" });
  let shown = null;
  function render() {
    const { diff, label } = shown;
    const mode = poolSel.value;
    const m = previewMatrix(diff, {}, {}, mode);
    const worst = perRowWorst(previewMatrix(diff, {}, {}, "maxabs"));
    const blocks = diff.axes.map((a) => a.step).join(" × ");
    const what = sampled(diff)
      ? mode === "sample"
        ? `one element every ${blocks} (stride)`
        : `each pixel the ${DIFF_POOLS[mode].replace(" in the block", "")} of a block of ${blocks} elements`
      : "every element";
    holder.replaceChildren(
      heatmap(m, {
        title: "difference",
        caption: `${diff.tensor} ${shapeText(diff.shape)} of this table minus ${label}, in float64: ${what}.`,
        name: "difference",
      }),
      lineChart({
        series: [{ name: "max |difference|", x: worst.map((_, r) => m.rowIndex(r)), y: worst }],
        xLabel: "position",
        yLabel: "max |difference| over dimensions",
        height: 200,
        title: "difference per position",
        name: "difference_per_position",
      }),
      el("p", { class: "difference-summary" }, firstDeparture(worst, m)),
    );
  }
  async function run() {
    const choice = choices[Number(against.value)];
    const key = choice.key || (await postSpec(choice.spec, "inv_freq")).key;
    const rows = [Number(start.value), Number(end.value)];
    const diff = await preview(entry.key, tensorSel.value, rows, undefined, key);
    shown = { diff, label: choice.label };
    render();
  }
  poolSel.addEventListener("change", () => {
    if (shown) render();
  });
  const form = el(
    "form",
    {
      class: "controls",
      onsubmit: (ev) => {
        ev.preventDefault();
        working("Comparing", run, form);
      },
    },
    el("label", {}, "this table minus ", against),
    el("label", {}, "tensor ", tensorSel),
    el("label", {}, "positions from ", start),
    el("label", {}, " to ", end),
    el("button", { type: "submit" }, "Show difference"),
    el("label", {}, " each pixel: ", poolSel),
  );
  return panel("Two configs compared: difference heatmap", form, holder);
}
