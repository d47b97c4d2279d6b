// The model: a preset, a Hugging Face model id or a pasted config.json resolved into its tables
// (POST /v1/resolve: `model_id` is read by the server from its Hugging Face cache), the
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
  writeView({ preset: name, model_id: null, config: null, max_positions: null, profile: null });
  const p = await getJSON(`v1/presets/${encodeURIComponent(name)}`);
  showModel({
    title: `${p.title} (${p.model})`,
    slug: name,
    notes: p.notes,
    entries: p.parts.map((part) => ({ ...part, notes: [] })),
  });
}

// The model-id field wins over the text box; each is sent with max_positions and profile.
export async function resolveConfig() {
  clearModel();
  const modelId = $("#model-id").value.trim();
  const text = $("#config").value.trim();
  if (modelId && text) throw new Error("give a model id or a config.json, not both: clear one of them");
  if (!modelId && !text) throw new Error("type a model id or paste a config.json first");
  let config = null;
  if (!modelId) {
    try {
      config = JSON.parse(text);
    } catch (err) {
      throw new Error(`the config is not valid JSON: ${err.message}`);
    }
  }
  const maxPositions = $("#max-positions").value.trim();
  const profile = $("#profile").value;
  writeView({
    preset: null,
    model_id: modelId,
    config: config && JSON.stringify(config),
    max_positions: maxPositions,
    profile,
  });
  const overrides = {};
  if (maxPositions) overrides.max_positions = Number(maxPositions);
  if (profile) overrides.profile = profile;
  const source = modelId ? { model_id: modelId } : { hf_config: config };
  const body = modelId || Object.keys(overrides).length ? { ...source, ...overrides } : config;
  const out = await getJSON("v1/resolve", { method: "POST", body });
  showModel({ ...described(out.model, config), notes: [], entries: out.specs, unserved: out.unserved || [] });
}

// The title and file-name slug of a resolved model: its id (and the commit the server read), or
// the pasted config's model type.
function described(model, config) {
  if (model) {
    const commit = /^[0-9a-f]{40}$/.test(model.commit) ? ` at ${model.commit.slice(0, 12)}` : "";
    return { title: `${model.id}${commit}`, slug: model.id.replace(/[/@]/g, "_") };
  }
  const name = config.text_config?.model_type || config.model_type || "config";
  return { title: `config.json (${name})`, slug: name };
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

// The model of a permalink: its preset, or its model id or config (with max_positions and
// profile).
export function restoreModel() {
  const view = readView();
  if (view.preset) {
    $("#preset").value = view.preset;
    return { label: `Loading ${view.preset}`, job: () => showPreset(view.preset), near: $("#preset-form") };
  }
  if (view.model_id || view.config) {
    $("#model-id").value = view.model_id || "";
    $("#config").value = view.config || "";
    $("#max-positions").value = view.max_positions || "";
    $("#profile").value = view.profile || "";
    const label = view.model_id ? `Resolving ${view.model_id}` : "Resolving the config";
    return { label, job: resolveConfig, near: $("#config-form") };
  }
  return null;
}
