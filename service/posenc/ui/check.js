// The check pane: a table file (.npy, .safetensors) compared with the exact table plotted, in
// this browser (only the exact rows are fetched), or an ONNX model's RoPE sites checked by the
// server (onnxcheck.js). Tolerances per dtype are the server's (GET /v1/kinds).
import { call, session, tableUrl } from "./api.js";
import { lineChart } from "./chart.js";
import { $, el, fmt, shapeText } from "./dom.js";
import { checkModel, diagnoseTables } from "./onnxcheck.js";
import { errorBox, working } from "./status.js";
import { readTables, typed } from "./tables.js";

let checkFile = null;

// A check's error is shown at the top of the check pane (the file and the table it was about).
export function checkWorking(label, job) {
  return working(label, async () => {
    try {
      return await job();
    } catch (err) {
      const out = $("#check-result");
      out.querySelector(".check-error")?.remove();
      out.prepend(errorBox(err, { class: "error-near check-error", "data-check-error": "true" }));
      return undefined;
    }
  });
}

export function checkTargetChanged() {
  if (checkFile) runCheck();
}

// By its name, else by its first bytes: an ONNX ModelProto starts with field 1 (ir_version,
// a varint: 0x08); safetensors has "{" at byte 8 (after the header length).
function isModel(name, head) {
  if (/\.onnx$/i.test(name)) return true;
  if (/\.(npy|safetensors)$/i.test(name)) return false;
  return head[0] === 0x08 && head[8] !== 0x7b;
}

export async function onFile(file) {
  if (!file) return;
  const head = new Uint8Array(await file.slice(0, 9).arrayBuffer());
  if (isModel(file.name, head)) checkFile = { name: file.name, model: file };
  else checkFile = { name: file.name, tables: readTables(await file.arrayBuffer(), file.name) };
  runCheck();
}

function runCheck() {
  const out = $("#check-result");
  const selected = session.selected;
  if (!selected) {
    out.replaceChildren(el("p", {}, "Choose a model and a table first."));
    return;
  }
  if (checkFile.model) {
    checkWorking("Checking the model's RoPE sites", () => checkModel(checkFile, out));
    return;
  }
  const fileNames = Object.keys(checkFile.tables);
  const tableNames = Object.keys(selected.outputs);
  const fileSel = el(
    "select",
    { name: "file_tensor", "aria-label": "tensor in the file" },
    fileNames.map((n) => el("option", { value: n }, n)),
  );
  const tableSel = el(
    "select",
    { name: "table_tensor", "aria-label": "tensor of the exact table" },
    tableNames.map((n) => el("option", { value: n }, n)),
  );
  const guess = tableNames.find((n) => fileNames.includes(n)) || tableNames.find((n) => n === "cos") || tableNames[0];
  tableSel.value = guess;
  if (fileNames.includes(guess)) fileSel.value = guess;
  const result = el("div");
  const diagnosis = el("div", { class: "table-diagnosis" });
  const go = () => checkWorking("Checking", () => compareFile(checkFile.tables[fileSel.value], tableSel.value, result));
  const form = el(
    "form",
    {
      class: "controls",
      onsubmit: (ev) => {
        ev.preventDefault();
        go();
      },
    },
    el("span", {}, el("strong", {}, checkFile.name), ": "),
    fileNames.length > 1 ? el("label", {}, "tensor ", fileSel) : `${fileNames[0]} `,
    el("label", {}, `against ${selected.name}'s `, tableSel),
    el("button", { type: "submit" }, "Compare"),
  );
  out.replaceChildren(form, result, diagnosis);
  go();
  if (selected.kind === "rope")
    checkWorking("Diagnosing the file's cos/sin", () => diagnoseTables(checkFile, diagnosis));
}

function shapeProblem(shape, exact, tensor) {
  let hint = "";
  const a = shape[shape.length - 1];
  const b = exact.shape[exact.shape.length - 1];
  if (a === 2 * b)
    hint =
      " The file is twice as wide: a full-width table (cat(c, c)) against a half-width one? Pick the width or profile your runtime uses.";
  if (2 * a === b)
    hint =
      " The file is half as wide: a half-width table against a full-width one? Pick the width or profile your runtime uses.";
  return new Error(
    `the file's ${shapeText(shape)} does not match the table's ${tensor} ${shapeText(exact.shape)}.${hint}`,
  );
}

function differences(got, want, rows, tol) {
  const cols = got.length / rows;
  const out = {
    perRow: new Float64Array(rows),
    equal: 0,
    within: 0,
    worst: -1,
    worstAt: 0,
    badRows: 0,
    firstBad: -1,
    cols,
  };
  for (let r = 0; r < rows; r += 1) {
    let rowWorst = 0;
    let rowBad = false;
    for (let c = 0; c < cols; c += 1) {
      const i = r * cols + c;
      const d = Math.abs(got[i] - want[i]);
      if (d === 0) out.equal += 1;
      if (d <= tol * Math.max(1, Math.abs(want[i]))) out.within += 1;
      else rowBad = true;
      const dd = Number.isNaN(d) ? Number.POSITIVE_INFINITY : d;
      if (dd > rowWorst) rowWorst = dd;
      if (dd > out.worst) [out.worst, out.worstAt] = [dd, i];
    }
    out.perRow[r] = rowWorst;
    if (rowBad) {
      out.badRows += 1;
      if (out.firstBad < 0) out.firstBad = r;
    }
  }
  return out;
}

async function compareFile(mine, tensor, out) {
  const selected = session.selected;
  const exact = selected.outputs[tensor];
  const shape = mine.shape;
  const rowsFirst =
    exact.shape.length >= 2 &&
    exact.shape.length === shape.length &&
    shape[0] <= exact.shape[0] &&
    shape.slice(1).join() === exact.shape.slice(1).join();
  if (!rowsFirst && shape.join() !== exact.shape.join()) throw shapeProblem(shape, exact, tensor);
  const rows = shape[0];
  const params = { format: "raw", tensor };
  if (exact.shape.length >= 2 && rows < exact.shape[0]) params.rows = `0:${rows}`;
  const response = await call(tableUrl(selected.key, params));
  const dtype = response.headers.get("X-Posenc-Dtype");
  const buffer = await response.arrayBuffer();
  const want = typed(buffer, 0, buffer.byteLength, dtype);
  const got = mine.values;
  if (got.length !== want.length) throw new Error(`the file holds ${got.length} values, the exact rows ${want.length}`);
  const tolerances = session.facts.tolerances;
  const tol = Math.max(tolerances[dtype] ?? 0, tolerances[mine.dtype] ?? 0);
  const d = differences(got, want, rows, tol);
  const total = got.length;
  const where = `position ${Math.floor(d.worstAt / d.cols)}, element ${d.worstAt % d.cols}`;
  const verdict =
    d.within === total
      ? el(
          "p",
          { class: "verdict-ok", "data-verdict": "match" },
          `✓ Matches: all ${total} values within ${fmt(tol)} (×max(1,|x|)) of the exact ${tensor}; ${d.equal} bit-identical; largest difference ${fmt(d.worst)} at ${where}.`,
        )
      : el(
          "p",
          { class: "verdict-bad", "data-verdict": "departs" },
          `✗ Departs from position ${d.firstBad}: ${total - d.within} of ${total} values in ${d.badRows} of ${rows} positions are beyond ${fmt(tol)}; largest difference ${fmt(d.worst)} at ${where} (file ${fmt(got[d.worstAt])}, exact ${fmt(want[d.worstAt])}).`,
        );
  // per-position maximum, pooled to at most 2000 points so long tables stay light
  const pool = Math.max(1, Math.ceil(rows / 2000));
  const xs = [];
  const ys = [];
  for (let r = 0; r < rows; r += pool) {
    let v = 0;
    for (let k = r; k < Math.min(rows, r + pool); k += 1) v = Math.max(v, d.perRow[k]);
    xs.push(r);
    ys.push(v);
  }
  const chart = lineChart({
    series: [{ name: "max |file − exact|", x: xs, y: ys }],
    xLabel: "position",
    yLabel: "max |file − exact|",
    height: 220,
    hlines: [{ y: tol, label: "tolerance" }],
    title: "difference per position",
    name: "check_difference",
  });
  out.replaceChildren(
    verdict,
    chart,
    el(
      "p",
      { class: "muted" },
      `Compared ${shapeText(shape)} ${mine.dtype} from the file with rows 0–${rows - 1} of ${selected.name}'s ${tensor} (${dtype}).`,
    ),
  );
}
