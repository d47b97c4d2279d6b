// posenc explorer: native ES modules, no build step, no third-party code. Talks to this server's
// /v1 API and draws every plot itself: heatmaps on canvas, line charts in SVG. See README.md,
// "Explorer". This module binds the page's forms and starts it (a permalink's view restored).
import { getJSON, loadFacts, session } from "./api.js";
import { checkWorking, onFile } from "./check.js";
import { $ } from "./dom.js";
import { fillProfiles, loadPresets, resolveConfig, restoreModel, showPreset } from "./model.js";
import { readView, restoreOnce } from "./permalink.js";
import { clearErrors, showError, working } from "./status.js";

function bind() {
  $("#api-key").value = session.apiKey;
  // every user action starts with no error shown (capture: before the action's handler)
  for (const type of ["submit", "change", "drop"]) document.addEventListener(type, clearErrors, true);
  document.addEventListener(
    "click",
    (ev) => {
      if (ev.target.closest("button, a")) clearErrors();
    },
    true,
  );
  $("#key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    session.apiKey = $("#api-key").value.trim();
    if (session.apiKey) sessionStorage.setItem("posenc-api-key", session.apiKey);
    else sessionStorage.removeItem("posenc-api-key");
    start();
  });
  $("#preset-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = $("#preset").value;
    const form = $("#preset-form");
    if (!name) {
      showError(new Error("choose a model in the list first"), form);
      return;
    }
    restoreOnce({});
    working(`Loading ${name}`, () => showPreset(name), form);
  });
  $("#config-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    restoreOnce({});
    working("Resolving the config", resolveConfig, $("#config-form"));
  });
  const drop = $("#drop");
  drop.addEventListener("dragover", (ev) => {
    ev.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (ev) => {
    ev.preventDefault();
    drop.classList.remove("over");
    checkWorking("Reading the file", () => onFile(ev.dataTransfer.files[0]));
  });
  $("#check-file").addEventListener("change", (ev) =>
    checkWorking("Reading the file", () => onFile(ev.target.files[0])),
  );
}

function start() {
  working("Connecting", async () => {
    const version = await getJSON("v1/version");
    const refs = Object.entries(version.verified_against || {})
      .slice(0, 3)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    $("#server-version").textContent = `posenc ${version.posenc}${refs ? ` · verified against ${refs}` : ""}`;
    const facts = await loadFacts();
    fillProfiles(facts.profiles);
    await loadPresets();
    restoreOnce(readView());
    const restore = restoreModel();
    if (restore) await working(restore.label, restore.job, restore.near);
  });
}

bind();
start();
