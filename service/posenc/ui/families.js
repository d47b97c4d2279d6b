// Plots of the families other than RoPE's text tables: ALiBi slopes and bias, T5 buckets and
// bias, 1-D tensors, 2-D sinusoidal grids and the vision towers' patch grids.
import { call, overLimit, postSpec, tableUrl, tensorJSON } from "./api.js";
import { lineChart, panel, valuesTable } from "./chart.js";
import { el, shapeText } from "./dom.js";
import { heatmapPanel } from "./heatpanel.js";
import { tinyImage } from "./matrix.js";
import { canSample, sampledRows } from "./sampled.js";
import { working } from "./status.js";
import { typed } from "./tables.js";

export function vectorPanel(entry, name) {
  const holder = el("div");
  working(
    `Fetching ${name}`,
    async () => {
      const t = await tensorJSON(entry.key, name);
      const x = t.data.map((_, i) => i);
      holder.append(
        lineChart({
          series: [{ name, x, y: t.data }],
          xLabel: "index",
          yLabel: name,
          markers: t.data.length <= 128,
          name,
        }),
      );
    },
    holder,
  );
  return panel(`${name} ${shapeText(entry.outputs[name].shape)}`, holder);
}

export function slopesPanel(entry) {
  const holder = el("div");
  working(
    "Fetching slopes",
    async () => {
      const t = await tensorJSON(entry.key, "slopes");
      const heads = t.data.map((_, i) => i);
      holder.append(
        lineChart({
          series: [{ name: "slope", x: heads, y: t.data }],
          xLabel: "head",
          yLabel: "slope m",
          logY: true,
          markers: true,
          title: "ALiBi slope per head",
          name: "slopes",
        }),
      );
      holder.append(
        valuesTable(
          ["head", "slope", "log2 slope"],
          t.data.map((v, i) => [i, v, Math.log2(v)]),
          "slopes as a table",
        ),
      );
    },
    holder,
  );
  return panel(`Slopes per head (${entry.outputs.slopes.shape[0]} heads)`, holder);
}

export function alibiBiasPanel(entry) {
  const holder = el("div");
  const length = 64;
  working(
    "Building the bias",
    async () => {
      const spec = { ...entry.spec, bias: "causal", key_length: length, query_length: length };
      const heads = entry.outputs.slopes.shape[0];
      const bias = { shape: [heads, length, length], dtype: spec.dtype || "float32" };
      // over the response limit (many heads): entries computed by /v2 (sampled.js), the last
      // query's row among them
      const sampled = overLimit(heads * length * length * (bias.dtype === "float32" ? 4 : 2));
      const local = { ...entry, spec, outputs: { bias } };
      const posted = sampled ? null : await postSpec(spec, "bias", [length - 1, length]);
      const last = posted ? posted.tensor.data.flat(2) : (await sampledRows(local, "bias", [length - 1, length])).data;
      const n = Math.min(8, heads);
      const picks = [
        ...new Set(Array.from({ length: n }, (_, k) => Math.round((k * (heads - 1)) / Math.max(1, n - 1)))),
      ];
      const x = Array.from({ length }, (_, j) => j - (length - 1));
      const series = picks.map((h) => ({ name: `head ${h}`, x, y: x.map((_, j) => last[h * length + j]) }));
      holder.append(
        lineChart({
          series,
          xLabel: "key position − query position (j − i)",
          yLabel: "bias",
          title: "ALiBi bias of the last query per head",
          name: "bias_last_query",
        }),
      );
      holder.append(
        heatmapPanel(
          { key: posted?.key, outputs: { bias }, label: "causal bias", only: "bias", sampled, entry: local },
          `Causal bias (${length} × ${length}) per head`,
        ),
      );
    },
    holder,
  );
  return panel("Bias per head (causal form, 64 positions)", holder);
}

export function bucketLinePanel(entry) {
  const holder = el("div");
  const q = entry.outputs.buckets.shape[0];
  const mid = Math.floor(q / 2);
  working(
    "Fetching buckets",
    async () => {
      // over the response limit: the row computed by /v2 at sampled keys
      const over = overLimit(entry.bytes) && canSample(entry);
      const row = over
        ? await sampledRows(entry, "buckets", [mid, mid + 1])
        : { data: (await tensorJSON(entry.key, "buckets", [mid, mid + 1])).data[0], axes: [{}, { step: 1 }] };
      const keyStep = row.axes[1].step;
      const x = Array.from({ length: row.data.length }, (_, j) => j * keyStep - mid);
      if (keyStep > 1)
        holder.append(el("p", { class: "muted" }, `Keys sampled: one every ${keyStep}, computed by /v2.`));
      holder.append(
        lineChart({
          series: [{ name: "bucket", x, y: row.data }],
          xLabel: `key position − query position (query ${mid})`,
          yLabel: "bucket",
          title: "T5 bucket by relative position",
          name: "buckets",
        }),
      );
    },
    holder,
  );
  return panel("Bucket by relative position", holder);
}

export function t5WeightsPanel(entry) {
  const holder = el("div");
  const area = el("textarea", {
    name: "relative_attention_bias",
    rows: 3,
    spellcheck: "false",
    "aria-label": "relative_attention_bias as JSON",
    placeholder: `[[...H values...], ... ${entry.spec.num_buckets} rows]`,
  });
  const form = el(
    "form",
    {
      onsubmit: (ev) => {
        ev.preventDefault();
        working(
          "Building the bias",
          async () => {
            let weights;
            try {
              weights = JSON.parse(area.value);
            } catch (err) {
              throw new Error(`the weights are not valid JSON: ${err.message}`);
            }
            const spec = { ...entry.spec, relative_attention_bias: weights };
            const shape = [weights[0].length, ...entry.outputs.buckets.shape];
            const dtype = spec.dtype || "float32";
            const outputs = { bias: { shape, dtype } };
            const bytes = shape.reduce((a, b) => a * b, 1) * (dtype === "float32" ? 4 : 2);
            // over the response limit: sampled query x key entries computed by /v2 (sampled.js)
            const sampled = overLimit(bytes);
            const key = sampled ? null : (await postSpec(spec, "buckets", [0, 1])).key;
            const target = { key, outputs, label: "bias", only: "bias", sampled, entry: { ...entry, spec, outputs } };
            holder.replaceChildren(heatmapPanel(target, "Bias per head"));
          },
          form,
        );
      },
    },
    el(
      "label",
      {},
      "The bias per head is the checkpoint's relative_attention_bias (num_buckets × heads) looked up by bucket: paste it as JSON to see it.",
    ),
    area,
    el("button", { type: "submit" }, "Show the bias"),
  );
  return panel("Bias per head", form, holder);
}

// A (grid_height*grid_width [+ class rows], D) 2-D table (MAE, timm) as images: one dimension
// over the grid per image, rows after the class-token rows laid out row-major.
export function gridPanel(entry) {
  const holder = el("div");
  const spec = entry.spec;
  const [n, d] = entry.outputs.embedding.shape;
  const gh = spec.grid_height;
  const gw = spec.grid_width;
  const offset = n - gh * gw;
  working(
    "Fetching the embedding",
    async () => {
      const response = await call(tableUrl(entry.key, { format: "raw", tensor: "embedding" }));
      const buffer = await response.arrayBuffer();
      const values = typed(buffer, 0, buffer.byteLength, response.headers.get("X-Posenc-Dtype"));
      const dims = [...new Set(Array.from({ length: 8 }, (_, k) => Math.round((k * (d - 1)) / 7)))];
      const figs = dims.map((dim) => {
        const img = new Float64Array(gh * gw);
        for (let i = 0; i < gh * gw; i += 1) img[i] = values[(offset + i) * d + dim];
        return tinyImage(img, gh, gw, `dimension ${dim}`);
      });
      const after = offset ? `, after ${offset} class-token row${offset > 1 ? "s" : ""}` : "";
      holder.append(
        el(
          "p",
          { class: "muted" },
          `Each image is one dimension over the ${gh} × ${gw} grid (y down, x across)${after}; each scaled to its own range.`,
        ),
        el("div", { class: "multiples" }, figs),
      );
    },
    holder,
  );
  return panel("2-D grid", holder);
}

// What a vision tower's table row is: a patch, in the order the tower reads them (its spec says
// whether merge blocks and attention windows reorder them).
export function patchOrder(spec) {
  if (spec.window_size) return "patch (merge-block, window order)";
  if (spec.spatial_merge_size && spec.spatial_merge_size > 1) return "patch (merge-block order)";
  return "patch (row-major)";
}

// The grid of one image (or video): grid_height, grid_width and frames, posted as a new table
// (config.json has no image size), its heatmap with rows labelled as patches.
export function visionGridPanel(entry, replot) {
  const spec = entry.spec;
  const fields = ["grid_height", "grid_width", ...(spec.frames ? ["frames"] : [])];
  const inputs = fields.map((f) =>
    el("input", { type: "number", name: f, min: 1, step: 1, value: spec[f] ?? 1, "aria-label": f }),
  );
  const form = el(
    "form",
    {
      class: "controls vision-grid",
      onsubmit: (ev) => {
        ev.preventDefault();
        working(
          "Building the grid's table",
          async () => {
            const next = { ...spec };
            fields.forEach((f, i) => {
              next[f] = Number(inputs[i].value);
            });
            const posted = await postSpec(next, Object.keys(entry.outputs)[0], [0, 1]);
            replot({ ...entry, spec: next, key: posted.key, outputs: posted.outputs, url: posted.url });
          },
          form,
        );
      },
    },
    fields.map((f, i) => el("label", {}, `${f.replace("_", " ")} `, inputs[i])),
    el("button", { type: "submit" }, "Show this grid"),
  );
  const rows = Object.values(entry.outputs)[0].shape[0];
  const what = el(
    "p",
    { class: "muted" },
    `${rows} rows: one per ${patchOrder(spec)} of a ${fields.map((f) => spec[f] ?? 1).join(" × ")} grid (${fields.join(" × ")}).`,
  );
  return panel("Patch grid", form, what);
}
