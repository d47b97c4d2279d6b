// Sampled rows of a table over the server's response limit (GET /v1/kinds' max_response_bytes),
// which neither /v1/tables nor its preview serve: the rows at evenly spaced positions, computed
// directly by POST /v2/models/{kind}/infer (rows for the asked positions only, never the whole
// table), shaped as a preview so the heatmap draws them.
import { getJSON, PREVIEW_POINTS } from "./api.js";

export const SAMPLED_KINDS = new Set(["rope"]);

// A preview-shaped sample: one row every `step` positions of [first, end) of `tensor`.
export async function sampledRows(entry, tensor, rows) {
  const shape = entry.outputs[tensor].shape;
  const [first, end] = rows || [0, shape[0]];
  const width = shape.slice(1).reduce((a, b) => a * b, 1);
  const count = Math.max(1, Math.min(end - first, Math.floor(PREVIEW_POINTS / width)));
  const step = Math.max(1, Math.ceil((end - first) / count));
  const positions = [];
  for (let p = first; p < end; p += step) positions.push(p);
  const body = {
    parameters: { spec: JSON.stringify(entry.spec) },
    inputs: [{ name: "position_ids", shape: [positions.length], datatype: "INT64", data: positions }],
    outputs: [{ name: tensor }],
  };
  const answer = await getJSON(`v2/models/${entry.kind}/infer`, { method: "POST", body });
  const out = answer.outputs.find((o) => o.name === tensor);
  if (!out) throw new Error(`/v2/models/${entry.kind} computed no ${tensor}`);
  return {
    kind: entry.kind,
    tensor,
    dtype: entry.outputs[tensor].dtype,
    shape,
    row_axis: 0,
    axes: [
      { start: first, step, count: positions.length },
      ...shape.slice(1).map((n) => ({ start: 0, step: 1, count: n })),
    ],
    data: out.data,
    computed: true,
  };
}
