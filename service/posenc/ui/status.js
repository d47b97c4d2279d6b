// Busy state and errors. An error is shown beside the control whose action caused it (`near`),
// in full (every field the server named, each once), and stays until the user acts again.
import { $, el } from "./dom.js";

let busy = 0;

function setStatus(text) {
  $("#status").textContent = text;
}

export function errorBox(err, attrs = {}) {
  const box = el("div", { class: "error-near", role: "alert", ...attrs });
  let text = err.message || String(err);
  if (err.status === 401) text += ": type the server's API key above and press \u201cUse key\u201d.";
  box.append(el("strong", {}, "Error: "), text);
  const detail = Array.isArray(err.body?.detail) ? err.body.detail : [];
  const extra = detail.filter((d) => d.field || (d.message && !text.includes(d.message)));
  if (extra.length) {
    box.append(
      el(
        "ul",
        {},
        extra.map((d) =>
          el(
            "li",
            {},
            d.field ? el("code", {}, d.field) : "",
            d.field ? ": " : "",
            d.message || "",
            d.value !== undefined && d.value !== null ? ` (got ${JSON.stringify(d.value)})` : "",
          ),
        ),
      ),
    );
  }
  return box;
}

// Shows `err` right after `near` (replacing an error already there), else in the page banner.
export function showError(err, near = null) {
  if (!near) {
    const banner = $("#error");
    banner.replaceChildren(...errorBox(err).childNodes);
    banner.hidden = false;
    return;
  }
  const next = near.nextElementSibling;
  if (next?.classList.contains("error-near")) next.remove();
  near.after(errorBox(err));
}

export function clearErrors() {
  $("#error").hidden = true;
  for (const box of document.querySelectorAll(".error-near")) box.remove();
}

// Runs `job` with the page marked busy (`aria-busy` on the body); its error, if any, is shown
// beside `near` and the job's result is undefined.
export async function working(label, job, near = null) {
  busy += 1;
  setStatus(`${label}…`);
  document.body.setAttribute("aria-busy", "true");
  try {
    return await job();
  } catch (err) {
    showError(err, near);
    return undefined;
  } finally {
    busy -= 1;
    if (!busy) {
      setStatus("");
      document.body.removeAttribute("aria-busy");
    }
  }
}
