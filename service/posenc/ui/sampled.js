// Sampled entries of a table over the server's response limit (GET /v1/kinds'
// max_response_bytes), which neither /v1/tables nor its preview serve: computed directly by
// POST /v2/models/{kind}/infer at the sampled rows only (rope and sinusoidal: position_ids; ALiBi
// and T5: query x key positions, both axes sampled), never the whole table, and shaped as a
// preview so the heatmap draws them. SAMPLERS says, per kind, how row (and key) indices become
// the model's inputs; a kind not in it, or a spec whose rows are not a function of their position
// alone (PatchTST's standardized table), is not sampled.
import { getJSON, PREVIEW_POINTS, session } from "./api.js";

const ids = (name, values) => ({ name, shape: [values.length], datatype: "INT64", data: values });

// Query x key kinds: queries are rows (query_offset + row), keys are columns (positions 0..K-1).
const pairInputs = (spec, rows, keys) => [
  ids(
    "query_positions",
    rows.map((r) => (spec.query_offset || 0) + r),
  ),
  ids("key_positions", keys),
];

export const SAMPLERS = {
  rope: { inputs: (_spec, rows) => [ids("position_ids", rows)] },
  // row r holds position position_offset + r (position_offset - r when position_step is -1)
  sinusoidal: {
    usable: (spec) => !spec.standardize,
    inputs: (spec, rows) => [
      ids(
        "position_ids",
        rows.map((r) => (spec.position_offset || 0) + (spec.position_step === -1 ? -r : r)),
      ),
    ],
  },
  alibi: { pairs: true, inputs: pairInputs },
  t5_bias: { pairs: true, inputs: pairInputs },
};

export const canSample = (entry) => {
  const sampler = SAMPLERS[entry.kind];
  return Boolean(sampler) && (!sampler.usable || sampler.usable(entry.spec));
};

const ITEM_BYTES = { int64: 8, float64: 8, float32: 4, float16: 2, bfloat16: 2 };

const range = (first, end, step) => {
  const out = [];
  for (let p = first; p < end; p += step) out.push(p);
  return out;
};

// Strides for `lengths` (the sampled axes) so that their product of counts stays within
// `budget`: each axis scaled by the same factor, the leftover budget given to the last.
function strides(lengths, budget) {
  if (lengths.length === 1) {
    const count = Math.max(1, Math.min(lengths[0], budget));
    return [Math.max(1, Math.ceil(lengths[0] / count))];
  }
  const [a, b] = lengths;
  const f = Math.min(1, Math.sqrt(budget / (a * b)));
  const first = Math.max(1, Math.ceil(a / Math.max(1, Math.floor(a * f))));
  const rows = Math.ceil(a / first);
  const count = Math.max(1, Math.min(b, Math.floor(budget / rows)));
  return [first, Math.max(1, Math.ceil(b / count))];
}

// A preview-shaped sample of `tensor`: rows [first, end) of its row axis (and for query x key
// kinds every key) at even strides, at most PREVIEW_POINTS elements in all.
export async function sampledRows(entry, tensor, rows) {
  const sampler = SAMPLERS[entry.kind];
  const shape = entry.outputs[tensor].shape;
  const rowAxis = sampler.pairs ? shape.length - 2 : 0;
  const keyAxis = sampler.pairs ? shape.length - 1 : null;
  const [first, end] = rows || [0, shape[rowAxis]];
  const sampledAxes = sampler.pairs ? [rowAxis, keyAxis] : [rowAxis];
  const whole = shape.reduce((n, len, axis) => (sampledAxes.includes(axis) ? n : n * len), 1);
  const lengths = sampler.pairs ? [end - first, shape[keyAxis]] : [end - first];
  // at most PREVIEW_POINTS elements, and within the server's limits on one /v2 answer
  const { max_response_bytes: maxBytes, json_max_elements: maxJson } = session.facts.limits;
  const itemBytes = ITEM_BYTES[entry.outputs[tensor].dtype] || 8;
  const most = Math.min(PREVIEW_POINTS, maxJson || Infinity, Math.floor((maxBytes || Infinity) / itemBytes));
  const [rowStep, keyStep] = strides(lengths, Math.max(1, Math.floor(most / whole)));
  const rowIndex = range(first, end, rowStep);
  const keyIndex = sampler.pairs ? range(0, shape[keyAxis], keyStep) : null;
  const body = {
    parameters: { spec: JSON.stringify(entry.spec) },
    inputs: sampler.inputs(entry.spec, rowIndex, keyIndex),
    outputs: [{ name: tensor }],
  };
  const answer = await getJSON(`v2/models/${entry.kind}/infer`, { method: "POST", body });
  const out = answer.outputs.find((o) => o.name === tensor);
  if (!out) throw new Error(`/v2/models/${entry.kind} computed no ${tensor}`);
  const axes = shape.map((n, axis) => {
    if (axis === rowAxis) return { start: first, step: rowStep, count: rowIndex.length };
    if (axis === keyAxis) return { start: 0, step: keyStep, count: keyIndex.length };
    return { start: 0, step: 1, count: n };
  });
  return {
    kind: entry.kind,
    tensor,
    dtype: entry.outputs[tensor].dtype,
    shape,
    row_axis: rowAxis,
    key_axis: keyAxis,
    axes,
    data: out.data,
    computed: true,
  };
}

// What a heatmap of such a sample says: where its values come from and how they are spaced.
export function sampledNote(p, shapeText, rowWord) {
  const keys = p.key_axis !== null ? ` and one key every ${p.axes[p.key_axis].step}` : "";
  return `${p.tensor} ${shapeText} ${p.dtype}: over the server's response limit, so rows are computed directly (POST /v2/models/${p.kind}/infer), one every ${p.axes[p.row_axis].step} ${rowWord}s${keys}. Rows are sampled, not pooled: each pixel is one exact entry, the rows between are not drawn (zoom to see every row).`;
}
