// One card per table of the model: its facts, tensors, downloads (named after the model, the
// table and the tensor) and the curl / Python lines that fetch it.
import { call, knownUrls, overLimit, session, tableUrl } from "./api.js";
import { el, fmtBytes, safeName, saveBlob, shapeText } from "./dom.js";
import { fileBase } from "./export.js";
import { working } from "./status.js";

const NUMPY = new Set(["float32", "float64", "float16", "int64", "int32"]);

// What a runtime must know about a table, in words, from its canonical spec.
function specFacts(spec) {
  if (spec.kind !== "rope") return [];
  const facts = [
    spec.interleaved
      ? "pairing: interleaved (2i, 2i+1; GPT-J)"
      : "pairing: half split (i, i + d/2; NeoX, transformers)",
  ];
  facts.push(
    `width: ${spec.width === "full" ? "full (d columns)" : "half (d/2 columns)"}, packing ${spec.packing}, ${spec.dtype}, precision ${spec.precision}`,
  );
  const sc = spec.rope_scaling;
  const fields = sc ? Object.entries(sc).map(([k, v]) => `${k} ${Array.isArray(v) ? `[${v.length} values]` : v}`) : [];
  facts.push(
    sc && sc.rope_type !== "default" ? `scaling: ${fields.join(", ")}` : `no scaling; rope_theta ${spec.rope_theta}`,
  );
  return facts;
}

// /v1/resolve's notes: an object of runtime facts (or a list of sentences, for presets);
// `spelledOut`: keys that specFacts says in words.
function noteLines(notes, spelledOut = []) {
  if (!notes) return [];
  if (Array.isArray(notes)) return notes;
  const text = (v) => (Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : v);
  return Object.entries(notes)
    .filter(([k]) => !spelledOut.includes(k))
    .map(([k, v]) => `${k}: ${text(v)}`);
}

// A download saved as "<model>_<table>[_<tensor>].<ext>": fetched, then saved from a blob, as
// the server's Content-Disposition (the content key) would otherwise name the file.
function downloadLink(entry, params, label) {
  const href = tableUrl(entry.key, params);
  const suffix = { safetensors: "safetensors", npz: "npz", npy: "npy", raw: "bin" }[params.format];
  const file = `${fileBase(params.tensor, entry.name)}.${suffix}`;
  const onclick = (ev) => {
    ev.preventDefault();
    const link = ev.currentTarget;
    working(`Downloading ${file}`, async () => saveBlob(await (await call(href)).blob(), file), link.parentElement);
  };
  return el("a", { href, download: file, onclick }, label);
}

function snippets(entry) {
  const origin = window.location.origin;
  const auth = session.apiKey ? ` -H "Authorization: Bearer $POSENC_API_KEY"` : "";
  const file = safeName(entry.name);
  const curl = [
    "# by spec (any posenc server)",
    `curl -s${auth} ${origin}/v1/tables -o ${file}.safetensors \\`,
    `  -d '${JSON.stringify(entry.spec)}'`,
    "# by URL (the spec rides in it: any replica answers, after any restart)",
    `curl -s${auth} "${origin}/${tableUrl(entry.key, { format: "safetensors" })}" -o ${file}.safetensors`,
  ].join("\n");
  const keyArg = session.apiKey ? ', api_key=os.environ["POSENC_API_KEY"]' : "";
  const pySpec = JSON.stringify(entry.spec, null, 0)
    .replace(/true/g, "True")
    .replace(/false/g, "False")
    .replace(/null/g, "None");
  const byUrl = knownUrls.has(entry.key) ? `/${knownUrls.get(entry.key)}` : entry.key;
  const python = [
    session.apiKey ? "import os\n" : "",
    "from posenc_client import Client\n",
    `client = Client("${origin}"${keyArg})`,
    `table = client.table(${pySpec})`,
    `# or, by URL (any replica): table = client.table_by_key("${byUrl}")`,
    `${Object.keys(entry.outputs)
      .map((n) => `table["${n}"]`)
      .join(", ")}  # numpy arrays`,
  ].join("\n");
  return [
    el("details", {}, el("summary", {}, "curl"), el("pre", {}, curl)),
    el("details", {}, el("summary", {}, "Python client (posenc-client)"), el("pre", {}, python)),
  ];
}

function downloads(entry) {
  if (overLimit(entry.bytes)) {
    const limit = fmtBytes(session.facts.limits.max_response_bytes);
    return el(
      "p",
      { class: "over-limit" },
      `${fmtBytes(entry.bytes)}: over this server's response limit (${limit}), so it is not served whole: no download here (rows=a:b through the API or the client fetches a slice that fits); its plots are drawn from rows computed at sampled positions.`,
    );
  }
  const outputs = Object.entries(entry.outputs);
  const links = [downloadLink(entry, { format: "safetensors" }, "safetensors (all tensors)")];
  if (outputs.every(([, o]) => NUMPY.has(o.dtype))) links.push(downloadLink(entry, { format: "npz" }, "npz"));
  for (const [name, o] of outputs) {
    if (NUMPY.has(o.dtype)) links.push(downloadLink(entry, { format: "npy", tensor: name }, `${name}.npy`));
    links.push(downloadLink(entry, { format: "raw", tensor: name }, `${name} raw`));
  }
  return links;
}

export function tableCard(entry, index, onPlot) {
  const outputs = Object.entries(entry.outputs);
  const button = el(
    "button",
    {
      type: "button",
      class: "secondary plot-button",
      "aria-pressed": "false",
      "data-index": index,
      onclick: () => onPlot(entry),
    },
    "Plot this table",
  );
  const notes = [
    ...noteLines(entry.notes, entry.kind === "rope" ? ["pairing", "rope_type"] : []),
    ...specFacts(entry.spec),
  ];
  return el(
    "article",
    { class: "card", id: `table-${index}`, "data-key": entry.key, "data-name": entry.name },
    el("h3", {}, entry.name, el("span", { class: "kind" }, entry.kind)),
    el(
      "ul",
      { class: "notes" },
      notes.map((n) => el("li", {}, n)),
    ),
    el(
      "dl",
      {},
      el("dt", {}, "key"),
      el("dd", {}, el("code", {}, entry.key)),
      el("dt", {}, "tensors"),
      el("dd", {}, outputs.map(([n, o]) => `${n} ${shapeText(o.shape)} ${o.dtype}`).join(" · ")),
      el("dt", {}, "size"),
      el("dd", {}, fmtBytes(entry.bytes)),
      el("dt", {}, "spec"),
      el(
        "dd",
        {},
        el("details", {}, el("summary", {}, "canonical spec"), el("pre", {}, JSON.stringify(entry.spec, null, 1))),
      ),
      el("dt", {}, "download"),
      el("dd", { class: "downloads" }, downloads(entry)),
    ),
    snippets(entry),
    button,
  );
}
