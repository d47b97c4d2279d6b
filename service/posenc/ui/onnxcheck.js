// The RoPE caches of an ONNX model, and a table file's cos/sin, checked by the server
// (POST /v1/check/onnx: posenc-client verify's check, run there). A file's cos and sin (2-D, one
// shape; full width cat(c, c) or repeat_interleave(c, 2) brought to half width here) are wrapped
// as the two cache initializers of a one-node RotaryEmbedding-23 model and sent the same way.
import { call, session } from "./api.js";
import { el, fmt, shapeText } from "./dom.js";
import { heatmap } from "./heatmap.js";

const ONNX_TYPES = { float32: 1, float16: 10, float64: 11, bfloat16: 16 };

function pbVarint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return out;
}
function pbJoin(parts) {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
const pbBytes = (field, bytes) =>
  pbJoin([Uint8Array.from([...pbVarint(field * 8 + 2), ...pbVarint(bytes.length)]), bytes]);
const pbString = (field, text) => pbBytes(field, new TextEncoder().encode(text));
const pbInt = (field, n) => Uint8Array.from([...pbVarint(field * 8), ...pbVarint(n)]);
const pbTensor = (name, shape, dtype, raw) =>
  pbJoin([...shape.map((d) => pbInt(1, d)), pbInt(2, ONNX_TYPES[dtype]), pbString(8, name), pbBytes(9, raw)]);

// (P, d) full width -> (P, d/2) raw bytes, when both tables repeat their halves or pairs
function halfWidth(t, other) {
  const [rows, cols] = t.shape;
  const size = t.raw.length / (rows * cols);
  const w = cols / 2;
  const same = (f) =>
    [t, other].every((x) => {
      for (let r = 0; r < rows; r += 1) {
        for (let c = 0; c < w; c += 1) {
          const [i, j] = f(r, c);
          if (x.values[i] !== x.values[j]) return false;
        }
      }
      return true;
    });
  let pick = null;
  if (same((r, c) => [r * cols + c, r * cols + c + w])) pick = (r, c) => r * cols + c;
  else if (same((r, c) => [r * cols + 2 * c, r * cols + 2 * c + 1])) pick = (r, c) => r * cols + 2 * c;
  if (!pick) return null;
  const out = new Uint8Array(rows * w * size);
  for (let r = 0; r < rows; r += 1) {
    for (let c = 0; c < w; c += 1) {
      const i = pick(r, c);
      out.set(t.raw.subarray(i * size, (i + 1) * size), (r * w + c) * size);
    }
  }
  return { shape: [rows, w], raw: out };
}

function tablesAsModel(cos, sin, names) {
  const node = pbJoin([
    pbString(1, "x"),
    pbString(1, names[0]),
    pbString(1, names[1]),
    pbString(1, "position_ids"),
    pbString(2, "y"),
    pbString(3, "table file"),
    pbString(4, "RotaryEmbedding"),
  ]);
  const graph = pbJoin([
    pbBytes(1, node),
    pbString(2, "table file"),
    pbBytes(5, pbTensor(names[0], cos.shape, cos.dtype, cos.raw)),
    pbBytes(5, pbTensor(names[1], sin.shape, sin.dtype, sin.raw)),
  ]);
  const opset = pbJoin([pbString(1, ""), pbInt(2, 23)]);
  return new Blob([pbJoin([pbInt(1, 10), pbBytes(7, graph), pbBytes(8, opset)])], { type: "application/octet-stream" });
}

export async function diagnoseTables(file, out) {
  const names = Object.keys(file.tables);
  const cosName = names.find((n) => /(^|[^a-z])cos/i.test(n));
  const sinName = names.find((n) => /(^|[^a-z])sin/i.test(n));
  const cos = cosName && file.tables[cosName];
  const sin = sinName && file.tables[sinName];
  if (
    !cos ||
    !sin ||
    cos.shape.length !== 2 ||
    cos.shape.join() !== sin.shape.join() ||
    cos.dtype !== sin.dtype ||
    !(cos.dtype in ONNX_TYPES)
  ) {
    out.replaceChildren(
      el(
        "p",
        { class: "muted", "data-diagnosis": "none" },
        "The diagnosis (which scaling, rounding, pairing) reads a cos and a sin table of one (positions, columns) shape: save both in one .safetensors (tensors named cos and sin) to get it.",
      ),
    );
    return;
  }
  const target = session.selected;
  let pair = [cos, sin];
  const exact = target.outputs.cos;
  const width = exact ? exact.shape[exact.shape.length - 1] : null;
  const halfCols = target.spec && target.spec.width === "full" && width ? width / 2 : width;
  if (halfCols && cos.shape[1] === 2 * halfCols) {
    const a = halfWidth(cos, sin);
    const b = halfWidth(sin, cos);
    if (!a || !b)
      throw new Error(
        `${cosName}/${sinName} ${shapeText(cos.shape)} are twice the table's half width but neither cat(c, c) nor repeat_interleave(c, 2)`,
      );
    pair = [
      { ...a, dtype: cos.dtype },
      { ...b, dtype: sin.dtype },
    ];
  }
  const response = await call(`v1/check/onnx?key=${target.key}`, {
    method: "POST",
    body: tablesAsModel(pair[0], pair[1], [cosName, sinName]),
  });
  const result = await response.json();
  out.replaceChildren(
    el("h3", {}, `Diagnosis of ${cosName} and ${sinName} (posenc-client verify's check)`),
    outcomeLine(result),
    ...result.caches.map(cacheReport),
  );
}

const VERDICTS = {
  exact: "✓ Exact: bit-identical to the exact table",
  repair: "✗ Departs: a known error or rounding (posenc-client plug repairs it)",
  placeholder: "– A placeholder: all zeros, nothing to compare",
  mismatch: "✗ Departs: these caches do not look like this config",
  not_checkable: "? Not checkable: the model holds no values to compare here",
};
const OUTCOMES = {
  exact: ["✓ Every site checked is exact", 0],
  repair: ["✗ A site departs in a way posenc-client plug repairs", 8],
  mismatch: ["✗ A site does not look like this config", 6],
  not_checkable: ["? Some or all sites could not be checked: no verdict for them", 9],
};

function outcomeLine(result) {
  const [text, code] = OUTCOMES[result.outcome] || [result.outcome, "?"];
  const cls = result.outcome === "exact" ? "verdict-ok" : "verdict-bad";
  return el("p", { class: cls, "data-outcome": result.outcome }, `${text} (posenc-client verify exits ${code}).`);
}

export async function checkModel(file, out) {
  const target = session.selected;
  if (target.kind !== "rope") {
    out.replaceChildren(
      el(
        "p",
        {},
        `${file.name}: an ONNX model's RoPE caches are compared with a rope table; ${target.name} is ${target.kind}. Plot a rope table first.`,
      ),
    );
    return;
  }
  const response = await call(`v1/check/onnx?key=${target.key}`, { method: "POST", body: file.model });
  const result = await response.json();
  const unchecked = result.caches.filter((r) => r.verdict === "not_checkable").length;
  const n = result.caches.length;
  const parts = [
    el(
      "p",
      {},
      el("strong", {}, file.name),
      ` against ${target.name} (key ${target.key.slice(0, 12)}…): ${n} report${n === 1 ? "" : "s"}, ${unchecked} not checkable.`,
    ),
    outcomeLine(result),
  ];
  for (const r of result.caches) parts.push(cacheReport(r));
  if (result.external.length) {
    const names = result.external.map((e) => `${e.name} (in ${e.location})`).join(", ");
    parts.push(
      el(
        "p",
        { class: "muted", "data-external": "true" },
        `Not read: ${names}. Caches stored in external data stay with the weights, which are never sent; posenc-client verify reads them locally.`,
      ),
    );
  }
  out.replaceChildren(...parts);
}

function departureMap(r, where) {
  const m = r.map;
  const rows = m.data.length;
  const cols = rows ? m.data[0].length : 0;
  const matrix = {
    rows,
    cols,
    data: Float64Array.from(m.data.flat()),
    rowIndex: (k) => k * m.row_step,
    colIndex: (k) => k * m.col_step,
    rowStep: m.row_step,
    rowName: "position",
    colName: "column",
  };
  const s = (n) => (n > 1 ? "s" : "");
  const block =
    m.row_step > 1 || m.col_step > 1
      ? ` Each cell is the largest difference over ${m.row_step} position${s(m.row_step)} × ${m.col_step} column${s(m.col_step)}.`
      : "";
  return heatmap(matrix, {
    title: `|${r.name} − exact|`,
    caption: `|model − exact| of ${where}.${block}`,
    name: `${r.name}_departure`,
  });
}

function cacheReport(r) {
  const where = `${r.name}${r.side ? ` (${r.side} side of the length switch)` : ""}`;
  const ok = r.verdict === "exact";
  const cls = ok ? "verdict-ok" : r.verdict === "placeholder" ? "" : "verdict-bad";
  const verdict = el("p", { class: cls, "data-verdict": r.verdict }, `${where}: ${VERDICTS[r.verdict] || r.verdict}`);
  const diagnosis = r.diagnosis.length
    ? el(
        "ul",
        { class: "diagnosis" },
        r.diagnosis.map((d) => el("li", {}, d)),
      )
    : null;
  if (r.verdict === "not_checkable") {
    return el(
      "div",
      { class: "cache-report", "data-cache": r.name },
      verdict,
      el("dl", {}, el("dt", {}, "read by"), el("dd", {}, r.nodes.join(", "))),
      diagnosis,
    );
  }
  const facts = el(
    "dl",
    {},
    el("dt", {}, "site"),
    el("dd", {}, r.kind),
    el("dt", {}, "read by"),
    el("dd", {}, r.nodes.join(", ")),
    el("dt", {}, "cache"),
    el("dd", {}, `${shapeText(r.shape)} ${r.dtype}; ${r.rows} rows compared`),
    el("dt", {}, "largest error"),
    el("dd", {}, r.max_abs === null ? "not comparable (another width)" : `${fmt(r.max_abs)} (${r.max_ulp} ulp)`),
    el("dt", {}, "first departs"),
    el("dd", {}, r.first ? `position ${r.first[0]}, column ${r.first[1]}` : "nowhere"),
  );
  return el(
    "div",
    { class: "cache-report", "data-cache": r.name },
    verdict,
    facts,
    diagnosis,
    r.map && !ok ? departureMap(r, where) : null,
  );
}
