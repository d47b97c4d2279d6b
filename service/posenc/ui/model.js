// The model: a preset or a pasted config.json resolved into its tables (POST /v1/resolve), the
// profile options (GET /v1/kinds), and what is shown of it: its cards, then its first table's
// plots. A new model, or an error resolving one, clears the previous model's tables and plots.
import { getJSON, remember, session } from "./api.js";
import { tableCard } from "./cards.js";
import { $, el } from "./dom.js";
import { readView, take, writeView } from "./permalink.js";
import { plotEntry } from "./plots.js";

export async function loadPresets() {
  const body = await getJSON("v1/presets");
  session.presets = body.presets;
  $("#preset").replaceChildren(
    el("option", { value: "" }, "choose a model…"),
    ...body.presets.map((p) => el("option", { value: p.name }, `${p.title} (${p.model})`)),
  );
}

// The profile <select> from the server's list (`profiles` of GET /v1/kinds), in its order; the
// first (transformers) is the default, sent as no profile.
export function fillProfiles(profiles) {
  $("#profile").replaceChildren(
    ...profiles.map((p, i) =>
      el("option", { value: i === 0 ? "" : p.name, title: `${p.consumer} (${p.source})` }, p.label),
    ),
  );
}

export function clearModel() {
  session.model = null;
  session.selected = null;
  $("#table-list").replaceChildren();
  $("#tables-intro").replaceChildren();
  $("#plot-area").replaceChildren();
  $("#tables").hidden = true;
  $("#plots").hidden = true;
  $("#check").hidden = true;
}

export async function showPreset(name) {
  clearModel();
  writeView({ preset: name, config: null, max_positions: null, profile: null });
  const p = await getJSON(`v1/presets/${encodeURIComponent(name)}`);
  showModel({
    title: `${p.title} (${p.model})`,
    slug: name,
    notes: p.notes,
    entries: p.parts.map((part) => ({ ...part, notes: [] })),
  });
}

export async function resolveConfig() {
  clearModel();
  const text = $("#config").value.trim();
  if (!text) throw new Error("paste a config.json into the text box first");
  let config;
  try {
    config = JSON.parse(text);
  } catch (err) {
    throw new Error(`the config is not valid JSON: ${err.message}`);
  }
  const maxPositions = $("#max-positions").value.trim();
  const profile = $("#profile").value;
  writeView({ preset: null, config: JSON.stringify(config), max_positions: maxPositions, profile });
  const overrides = {};
  if (maxPositions) overrides.max_positions = Number(maxPositions);
  if (profile) overrides.profile = profile;
  const body = Object.keys(overrides).length ? { hf_config: config, ...overrides } : config;
  const out = await getJSON("v1/resolve", { method: "POST", body });
  const name = config.text_config?.model_type || config.model_type || "config";
  showModel({
    title: `config.json (${name})`,
    slug: name,
    notes: [],
    entries: out.specs,
    unserved: out.unserved || [],
  });
}

function showModel(m) {
  session.model = m;
  const list = $("#table-list");
  const n = m.entries.length;
  // /v1/resolve's `unserved`: the parts of the model no table is served for, and why.
  const unserved = m.unserved?.length
    ? el(
        "span",
        { class: "unserved" },
        `Not served (${m.unserved.length}):`,
        el(
          "ul",
          { class: "notes" },
          m.unserved.map((u) => el("li", {}, el("strong", {}, u.part), ` (${u.config_key}): ${u.reason}`)),
        ),
      )
    : "";
  $("#tables-intro").replaceChildren(
    el("strong", {}, m.title),
    `: ${n} table${n === 1 ? "" : "s"}. `,
    m.notes.length
      ? el(
          "ul",
          { class: "notes" },
          m.notes.map((t) => el("li", {}, t)),
        )
      : "",
    unserved,
  );
  m.entries.forEach((entry, i) => {
    remember(entry.key, entry.spec, entry.outputs, entry.url);
    list.append(tableCard(entry, i, plotEntry));
  });
  $("#tables").hidden = false;
  $("#check").hidden = false;
  const wanted = take("table");
  const first = m.entries.find((e) => e.name === wanted) || m.entries[0];
  if (first) plotEntry(first);
}

// The model of a permalink: its preset, or its config (with max_positions and profile).
export function restoreModel() {
  const view = readView();
  if (view.preset) {
    $("#preset").value = view.preset;
    return { label: `Loading ${view.preset}`, job: () => showPreset(view.preset), near: $("#preset-form") };
  }
  if (view.config) {
    $("#config").value = view.config;
    $("#max-positions").value = view.max_positions || "";
    $("#profile").value = view.profile || "";
    return { label: "Resolving the config", job: resolveConfig, near: $("#config-form") };
  }
  return null;
}
