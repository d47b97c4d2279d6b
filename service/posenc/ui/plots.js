// The plots of one table. PLOTS maps each family (kind) to the panels drawn for it; a family not
// in it gets the generic ones (a heatmap of every tensor of two or more axes, a line per 1-D
// tensor).
import { overLimit, session } from "./api.js";
import { checkTargetChanged } from "./check.js";
import { comparePanel } from "./compare.js";
import { $, el } from "./dom.js";
import {
  alibiBiasPanel,
  bucketLinePanel,
  gridPanel,
  patchOrder,
  slopesPanel,
  t5WeightsPanel,
  vectorPanel,
  visionGridPanel,
} from "./families.js";
import { heatmapPanel } from "./heatpanel.js";
import { writeView } from "./permalink.js";
import { wavelengthPanel } from "./rope.js";
import { canSample } from "./sampled.js";

// What a heatmap panel draws: the table's previews, or, over the response limit, rows computed
// directly at sampled positions (sampled.js).
const target = (entry, extra = {}) => ({
  key: entry.key,
  outputs: entry.outputs,
  label: entry.name,
  main: true,
  entry,
  sampled: overLimit(entry.bytes) && canSample(entry),
  ...extra,
});

const vectors = (entry) =>
  Object.entries(entry.outputs)
    .filter(([, o]) => o.shape.length === 1)
    .map(([name]) => vectorPanel(entry, name));
const positional = (entry) => Object.values(entry.outputs).some((o) => o.shape.length >= 2);

const generic = (entry) => [positional(entry) ? heatmapPanel(target(entry), "table") : null, ...vectors(entry)];

export const PLOTS = {
  rope: (entry) => [
    heatmapPanel(target(entry), "cos/sin by position and dimension"),
    entry.outputs.inv_freq ? wavelengthPanel(entry) : null,
    overLimit(entry.bytes) ? null : comparePanel(entry),
  ],
  alibi: (entry) => [
    slopesPanel(entry),
    alibiBiasPanel(entry),
    entry.outputs.bias ? heatmapPanel(target(entry), "bias per head") : null,
  ],
  t5_bias: (entry) => [
    heatmapPanel(target(entry, { only: "buckets" }), "bucket map (query × key)"),
    bucketLinePanel(entry),
    entry.outputs.bias ? heatmapPanel(target(entry, { only: "bias" }), "bias per head") : t5WeightsPanel(entry),
  ],
  sinusoidal_2d: (entry) => {
    const grid = entry.spec.grid_height && entry.spec.grid_width && entry.outputs.embedding;
    return [
      positional(entry) ? heatmapPanel(target(entry), "2-D embedding") : null,
      grid && grid.shape.length === 2 ? gridPanel(entry) : null,
      ...vectors(entry),
    ];
  },
  vision_rope: (entry) => [
    visionGridPanel(entry, plotEntry),
    heatmapPanel(target(entry, { rowName: patchOrder(entry.spec) }), "cos/sin by patch and dimension"),
  ],
};

export function plotEntry(entry) {
  session.selected = entry;
  writeView({ table: entry.name });
  for (const card of document.querySelectorAll(".card")) {
    const on = card.dataset.key === entry.key || card.dataset.name === entry.name;
    card.classList.toggle("selected", on);
    $(".plot-button", card)?.setAttribute("aria-pressed", String(on));
  }
  const area = $("#plot-area");
  area.replaceChildren(
    el("p", {}, "Plots of ", el("strong", {}, entry.name), ` (${entry.kind}, key ${entry.key.slice(0, 12)}…).`),
  );
  $("#plots").hidden = false;
  const panels = (PLOTS[entry.kind] || generic)(entry);
  area.append(...panels.filter(Boolean));
  checkTargetChanged();
}
