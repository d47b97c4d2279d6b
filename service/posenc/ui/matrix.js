// 2-D matrices out of previews (GET /v1/tables/{key}/preview?pool=block), and small images.
import { el, fmt } from "./dom.js";
import { VIRIDIS } from "./heatmap.js";

// What each heatmap pixel shows when a preview samples: the block's mean, max or min (pooled
// over every element the sample stands for), or the one sampled element (stride).
export const POOLS = {
  mean: "mean of the block",
  max: "largest in the block",
  min: "smallest in the block",
  sample: "one element per block (stride)",
};

export const sampled = (p) => p.axes.some((a) => a.step > 1);

// What each pixel of a difference heatmap shows: the largest |difference| in its block first.
export const DIFF_POOLS = {
  maxabs: "largest |difference| in the block",
  ...POOLS,
};

// The flat values a mode draws: pooled ones when the preview samples and has them (maxabs, the
// difference's, whenever it is there: |difference| even element by element).
export function previewValues(p, mode = "mean") {
  if (mode === "maxabs" && p.pooled?.maxabs) return p.pooled.maxabs;
  if (mode !== "sample" && sampled(p) && p.pooled?.[mode]) return p.pooled[mode];
  return p.data;
}

// A 2-D matrix out of a preview: the displayed axes are the position axis (or the second to
// last) down and the last other axis across; `fixed` picks an index on every other axis;
// `names` names the axes (the row axis defaults to `rowName`).
export function previewMatrix(p, fixed = {}, names = {}, mode = "mean", rowName = "position") {
  const values = previewValues(p, mode);
  const nd = p.axes.length;
  const counts = p.axes.map((a) => a.count);
  const strides = counts.map((_, i) => counts.slice(i + 1).reduce((x, y) => x * y, 1));
  let rowAxis;
  let colAxis;
  if (nd === 1) {
    rowAxis = -1;
    colAxis = 0;
  } else {
    rowAxis = p.row_axis !== null && p.row_axis !== undefined ? p.row_axis : nd - 2;
    colAxis = rowAxis === nd - 1 ? nd - 2 : nd - 1;
    // a trailing (cos, sin) pair axis (packing "pairs") is chosen with a select instead
    if (nd >= 3 && colAxis === nd - 1 && p.shape[nd - 1] === 2 && rowAxis !== nd - 2) colAxis = nd - 2;
  }
  const rows = rowAxis < 0 ? 1 : counts[rowAxis];
  const cols = counts[colAxis];
  let base = 0;
  for (let i = 0; i < nd; i += 1) {
    if (i !== rowAxis && i !== colAxis) base += (fixed[i] || 0) * strides[i];
  }
  const out = new Float64Array(rows * cols);
  const rs = rowAxis < 0 ? 0 : strides[rowAxis];
  const cs = strides[colAxis];
  for (let r = 0; r < rows; r += 1) {
    for (let c = 0; c < cols; c += 1) out[r * cols + c] = values[base + r * rs + c * cs];
  }
  const axisIndex = (axis) => (k) => (axis < 0 ? 0 : p.axes[axis].start + k * p.axes[axis].step);
  return {
    rows,
    cols,
    data: out,
    rowAxis,
    colAxis,
    rowIndex: axisIndex(rowAxis),
    colIndex: axisIndex(colAxis),
    rowStep: rowAxis < 0 ? 1 : p.axes[rowAxis].step,
    rowName: names[rowAxis] || (rowAxis === p.row_axis ? rowName : `axis ${rowAxis}`),
    colName: names[colAxis] || (nd === 2 || colAxis === nd - 1 ? "dimension" : `axis ${colAxis}`),
  };
}

// One small image of a rows x cols grid of values, scaled to its own range.
export function tinyImage(values, rows, cols, label) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  const c = el("canvas", {
    width: cols,
    height: rows,
    role: "img",
    "aria-label": `${label}: ${rows} by ${cols}, values ${fmt(lo)} to ${fmt(hi)}`,
  });
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let i = 0; i < values.length; i += 1) {
    const level = Math.round(((values[i] - lo) / (hi - lo || 1)) * 255) * 3;
    img.data.set([VIRIDIS[level], VIRIDIS[level + 1], VIRIDIS[level + 2], 255], i * 4);
  }
  ctx.putImageData(img, 0, 0);
  const scale = Math.max(1, Math.floor(112 / Math.max(rows, cols)));
  c.style.width = `${cols * scale}px`;
  c.style.height = `${rows * scale}px`;
  return el("figure", {}, c, el("figcaption", {}, label, el("br"), `${fmt(lo)} to ${fmt(hi)}`));
}

// Small multiples of the first axis of a 3-D preview (DETR's channels over the H x W grid).
export function multiples(p) {
  const count = Math.min(8, p.axes[0].count);
  const figs = [];
  for (let k = 0; k < count; k += 1) {
    const idx = Math.round((k * (p.axes[0].count - 1)) / Math.max(1, count - 1));
    const m = previewMatrix(p, { 0: idx }, { 1: "y", 2: "x" }, "sample");
    figs.push(tinyImage(m.data, m.rows, m.cols, `channel ${p.axes[0].start + idx * p.axes[0].step}`));
  }
  return el(
    "div",
    {},
    el("p", { class: "muted" }, "Channels side by side (each scaled to its own range):"),
    el("div", { class: "multiples" }, figs),
  );
}
