// The view in the URL (its fragment): the model (preset, or config.json with max_positions and
// profile), the table plotted, the heatmap's tensor, pooling and rows, and an overlay model. A
// link to it reopens the same view.

const params = () => new URLSearchParams(window.location.hash.slice(1));

export function readView() {
  return Object.fromEntries(params());
}

// Sets (or, for null/undefined/"", drops) fields of the view in the URL, without a reload.
export function writeView(patch) {
  const p = params();
  for (const [k, v] of Object.entries(patch)) {
    if (v === null || v === undefined || v === "") p.delete(k);
    else p.set(k, String(v));
  }
  const text = p.toString();
  window.history.replaceState(null, "", text ? `#${text}` : window.location.pathname + window.location.search);
}

// Fields a panel takes once from the URL it was opened with (then the user's choices rule).
let pending = {};
export function restoreOnce(view) {
  pending = { ...view };
}
export function take(name) {
  const v = pending[name];
  delete pending[name];
  return v;
}
