// posenc explorer: plain JavaScript, no build step, no third-party code. Talks to this server's
// /v1 API (same origin; the API key typed into the page is sent as a bearer token) and draws
// every plot itself: heatmaps on canvas, line charts in SVG. See README.md, "Explorer".
"use strict";
(() => {
  const PREVIEW_POINTS = 65536;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const $ = (sel, root = document) => root.querySelector(sel);

  // --- DOM helpers ------------------------------------------------------------------------
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function svg(tag, attrs = {}, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  const fmt = (x) => {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    if (!Number.isFinite(x)) return x > 0 ? "∞" : "-∞";
    if (Number.isInteger(x) && Math.abs(x) < 1e7) return String(x);
    const a = Math.abs(x);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? x.toExponential(3) : String(+x.toPrecision(5));
  };
  const fmtBytes = (n) => {
    const units = ["bytes", "KiB", "MiB", "GiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  };
  const shapeText = (shape) => `(${shape.join(", ")})`;

  // --- the API ----------------------------------------------------------------------------
  let apiKey = sessionStorage.getItem("posenc-api-key") || "";

  class ApiError extends Error {
    constructor(status, body, path) {
      super(body && body.error ? body.error : `HTTP ${status} from ${path}`);
      this.status = status;
      this.body = body;
    }
  }

  async function call(path, { method = "GET", body, accept } = {}) {
    const headers = {};
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    if (accept) headers.Accept = accept;
    const init = { method, headers };
    const binary = body instanceof Blob;
    if (binary) {
      headers["Content-Type"] = "application/octet-stream";
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = typeof body === "string" ? body : JSON.stringify(body);
    }
    let response = await fetch(path, init);
    // A key this server does not know (another replica resolved it, or it left the server's
    // LRU of keys): POST its spec again, asking for one byte, and retry (a GET, or a file sent
    // to the check route, which can be sent again).
    for (let attempt = 0; attempt < 3 && response.status === 404 && (method === "GET" || binary); attempt += 1) {
      const found = /v1\/tables\/([0-9a-f]{64})|[?&]key=([0-9a-f]{64})/.exec(path);
      const spec = found && knownSpecs.get(found[1] || found[2]);
      if (!spec) break;
      const again = await fetch(`v1/tables?format=raw&tensor=${encodeURIComponent(spec.tensor)}`, {
        method: "POST", body: JSON.stringify(spec.spec),
        headers: { ...headers, "Content-Type": "application/json", Range: "bytes=0-0" } });
      if (!again.ok) break;
      response = await fetch(path, init);
    }
    if (!response.ok) {
      let parsed = null;
      try { parsed = await response.json(); } catch (_) { parsed = null; }
      throw new ApiError(response.status, parsed, path);
    }
    return response;
  }
  const getJSON = async (path, options) => (await call(path, options)).json();

  // content key -> {spec, tensor (its smallest)}: what re-registers a key the server forgot
  const knownSpecs = new Map();
  // content key -> the table URL the server handed out (/v1/tables/{key}.{spec}: the spec rides
  // in the URL, so any replica answers it, after any restart), relative to the page
  const knownUrls = new Map();
  function remember(key, spec, outputs, url) {
    const sizes = Object.entries(outputs || {}).map(([n, o]) => [n, o.shape.reduce((a, b) => a * b, 1)]);
    sizes.sort((a, b) => a[1] - b[1]);
    if (sizes.length) knownSpecs.set(key, { spec, tensor: sizes[0][0] });
    if (url && url.startsWith(`/v1/tables/${key}.`)) knownUrls.set(key, url.slice(1));
  }
  const tableUrl = (key, params) => `${knownUrls.get(key) || `v1/tables/${key}`}${params ? "?" + new URLSearchParams(params) : ""}`;

  async function preview(key, tensor, rows, maxPoints = PREVIEW_POINTS) {
    const params = { tensor, max_points: maxPoints };
    if (rows) params.rows = `${rows[0]}:${rows[1]}`;
    return getJSON(`${tableUrl(key)}/preview?${new URLSearchParams(params)}`);
  }

  async function tensorJSON(key, tensor, rows) {
    const params = { format: "json", tensor };
    if (rows) params.rows = `${rows[0]}:${rows[1]}`;
    const body = await getJSON(tableUrl(key, params));
    return { ...body.tensors[tensor], meta: body.meta || {} };
  }

  // What a runtime must know about a table, in words: from its canonical spec (pairing, width,
  // scaling) and, when given, the facts the server computed with it (attention scaling, switch
  // points, YaRN's correction range...).
  const META_SKIP = new Set(["kind", "spec", "key", "algorithm_version", "device", "shapes", "dtypes"]);
  function specFacts(spec) {
    const facts = [];
    if (spec.kind === "rope") {
      facts.push(spec.interleaved ? "pairing: interleaved (2i, 2i+1; GPT-J)" : "pairing: half split (i, i + d/2; NeoX, transformers)");
      facts.push(`width: ${spec.width === "full" ? "full (d columns)" : "half (d/2 columns)"}, packing ${spec.packing}, ${spec.dtype}, precision ${spec.precision}`);
      const sc = spec.rope_scaling;
      facts.push(sc && sc.rope_type !== "default"
        ? `scaling: ${Object.entries(sc).map(([k, v]) => `${k} ${Array.isArray(v) ? `[${v.length} values]` : v}`).join(", ")}`
        : `no scaling; rope_theta ${spec.rope_theta}`);
    }
    return facts;
  }
  // /v1/resolve's notes: an object of runtime facts (or a list of sentences, for presets);
  // `spelledOut`: keys that specFacts says in words.
  function noteLines(notes, spelledOut = []) {
    if (!notes) return [];
    if (Array.isArray(notes)) return notes;
    return Object.entries(notes).filter(([k]) => !spelledOut.includes(k)).map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : v}`);
  }
  function metaFacts(meta) {
    return Object.entries(meta).filter(([k]) => !META_SKIP.has(k)).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : fmt(v)}`);
  }

  // POST a spec, ask for one small tensor as JSON: the table's key (X-Posenc-Key) and that tensor.
  async function postSpec(spec, tensor, rows) {
    const params = { format: "json", tensor };
    if (rows) params.rows = `${rows[0]}:${rows[1]}`;
    const response = await call(`v1/tables?${new URLSearchParams(params)}`, { method: "POST", body: spec });
    const body = await response.json();
    const key = response.headers.get("X-Posenc-Key");
    const shapes = body.meta && body.meta.shapes ? Object.fromEntries(Object.entries(body.meta.shapes).map(([n, shape]) => [n, { shape }])) : { [tensor]: { shape: [1] } };
    remember(key, spec, shapes, response.headers.get("Content-Location"));
    return { key, tensor: body.tensors[tensor] };
  }

  // --- status and errors ------------------------------------------------------------------
  let busy = 0;
  function setStatus(text) { $("#status").textContent = text; }
  // Runs `job` with the page marked busy; its error, if any, stays shown until the user starts
  // something else (see `bind`), so a later success elsewhere never hides it.
  async function working(label, job) {
    busy += 1;
    setStatus(`${label}…`);
    document.body.setAttribute("aria-busy", "true");
    try {
      return await job();
    } catch (err) {
      showError(err);
      return undefined;
    } finally {
      busy -= 1;
      if (!busy) { setStatus(""); document.body.removeAttribute("aria-busy"); }
    }
  }
  function showError(err, box = $("#error")) {
    box.replaceChildren();
    let text = err.message || String(err);
    if (err.status === 401) text += ": type the server's API key above and press \u201cUse key\u201d.";
    box.append(el("strong", {}, "Error: "), text);
    const detail = err.body && Array.isArray(err.body.detail) ? err.body.detail : [];
    if (detail.length) {
      box.append(el("ul", {}, detail.slice(0, 8).map((d) => el("li", {},
        d.field ? el("code", {}, d.field) : "", d.field ? ": " : "", d.message || "",
        d.value !== undefined && d.value !== null ? ` (got ${JSON.stringify(d.value)})` : ""))));
    }
    box.hidden = false;
  }
  function clearError() { $("#error").hidden = true; }

  // A check's error is shown beside the check pane (the file and the table it was about), not
  // only in the page-top banner, which is far above the pane.
  async function checkWorking(label, job) {
    return working(label, async () => {
      try {
        return await job();
      } catch (err) {
        const box = el("div", { class: "check-error", role: "alert", "data-check-error": "true" });
        showError(err, box);
        const out = $("#check-result");
        const stale = out.querySelector(".check-error");
        if (stale) stale.remove();
        out.prepend(box);
        throw err;
      }
    });
  }

  // --- colour: viridis (lightness rises monotonically: readable in grey too) ----------------
  const VIRIDIS = (() => {
    const c = [
      [0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
      [0.1050930431085774, 1.404613529898575, 1.384590162594685],
      [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
      [-4.634230498983486, -5.799100973351585, -19.33244095627987],
      [6.228269936347081, 14.17993336680509, 56.69055260068105],
      [4.776384997670288, -13.74514537774601, -65.35303263337234],
      [-5.435455855934631, 4.645852612178535, 26.3124352495832],
    ];
    const lut = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i += 1) {
      const t = i / 255;
      for (let k = 0; k < 3; k += 1) {
        let v = c[6][k];
        for (let j = 5; j >= 0; j -= 1) v = c[j][k] + t * v;
        lut[i * 3 + k] = Math.round(255 * Math.min(1, Math.max(0, v)));
      }
    }
    return lut;
  })();
  const SERIES = [
    { color: "#0b5cad", dash: "" },
    { color: "#c2410c", dash: "7 4" },
    { color: "#1d6b2f", dash: "2 3" },
    { color: "#7e22ce", dash: "10 3 2 3" },
    { color: "#4b5563", dash: "4 2" },
    { color: "#b91c1c", dash: "1 5" },
    { color: "#0e7490", dash: "12 4" },
    { color: "#a16207", dash: "6 2 2 2 2 2" },
  ];

  // --- heatmap (canvas) ---------------------------------------------------------------------
  const isMasked = (v) => !Number.isFinite(v) || Math.abs(v) >= 1e30;
  // matrix: {rows, cols, data (row-major), rowIndex(i) -> label value, colIndex(j), rowName, colName}
  function heatmap(matrix, { caption, title, onRange } = {}) {
    const { rows, cols, data } = matrix;
    let lo = Infinity;
    let hi = -Infinity;
    let loAt = 0;
    let hiAt = 0;
    let masked = 0;
    for (let i = 0; i < data.length; i += 1) {
      const v = data[i];
      if (isMasked(v)) { masked += 1; continue; }
      if (v < lo) { lo = v; loAt = i; }
      if (v > hi) { hi = v; hiAt = i; }
    }
    const left = 64;
    const top = 8;
    const bottom = 36;
    const right = 100;
    const plotW = Math.max(120, Math.min(720, cols * Math.max(1, Math.floor(720 / cols))));
    const plotH = Math.max(80, Math.min(360, rows * Math.max(1, Math.floor(360 / rows))));
    const canvas = el("canvas", {
      width: left + plotW + right, height: top + plotH + bottom, tabindex: 0, role: "img",
      "aria-label": `${title || "heatmap"}: ${rows} by ${cols} values from ${fmt(lo)} to ${fmt(hi)}; arrow keys move a cursor whose value is read out below`,
    });
    const image = document.createElement("canvas");
    image.width = cols;
    image.height = rows;
    const ictx = image.getContext("2d");
    const pixels = ictx.createImageData(cols, rows);
    const span = hi - lo || 1;
    for (let i = 0; i < data.length; i += 1) {
      if (isMasked(data[i])) { pixels.data.set([226, 226, 226, 255], i * 4); continue; }
      const level = Math.round(((data[i] - lo) / span) * 255) * 3;
      pixels.data[i * 4] = VIRIDIS[level];
      pixels.data[i * 4 + 1] = VIRIDIS[level + 1];
      pixels.data[i * 4 + 2] = VIRIDIS[level + 2];
      pixels.data[i * 4 + 3] = 255;
    }
    ictx.putImageData(pixels, 0, 0);
    const readout = el("div", { class: "readout", "aria-live": "polite" });
    const cursor = { r: -1, c: -1 };
    let drag = null;
    const cellAt = (ev) => {
      const box = canvas.getBoundingClientRect();
      const x = ((ev.clientX - box.left) * canvas.width) / box.width - left;
      const y = ((ev.clientY - box.top) * canvas.height) / box.height - top;
      if (x < 0 || y < 0 || x >= plotW || y >= plotH) return null;
      return { r: Math.floor((y / plotH) * rows), c: Math.floor((x / plotW) * cols) };
    };
    function draw() {
      const ctx = canvas.getContext("2d");
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, canvas.width, canvas.height);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(image, left, top, plotW, plotH);
      ctx.strokeStyle = "#444";
      ctx.strokeRect(left - 0.5, top - 0.5, plotW + 1, plotH + 1);
      ctx.fillStyle = "#1b1b1b";
      ctx.font = "11px system-ui, sans-serif";
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      // round index values, placed at the sampled row or column that holds them
      const rowFirst = matrix.rowIndex(0);
      const rowStep = matrix.rowStep;
      for (const v of niceTicks(rowFirst, matrix.rowIndex(rows - 1), 5)) {
        const y = top + (((v - rowFirst) / rowStep + 0.5) / rows) * plotH;
        ctx.fillText(fmt(v), left - 6, y);
        ctx.fillRect(left - 4, y, 3, 1);
      }
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      const colFirst = matrix.colIndex(0);
      const colStep = cols > 1 ? matrix.colIndex(1) - colFirst : 1;
      for (const v of niceTicks(colFirst, matrix.colIndex(cols - 1), 6)) {
        const x = left + (((v - colFirst) / colStep + 0.5) / cols) * plotW;
        ctx.fillText(fmt(v), x, top + plotH + 4);
        ctx.fillRect(x, top + plotH + 1, 1, 3);
      }
      ctx.fillText(matrix.colName, left + plotW / 2, top + plotH + 20);
      ctx.save();
      ctx.translate(12, top + plotH / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(matrix.rowName, 0, -6);
      ctx.restore();
      // colour bar with its values: the scale is read from numbers, not from hue alone
      const barX = left + plotW + 12;
      for (let y = 0; y < plotH; y += 1) {
        const level = Math.round((1 - y / (plotH - 1)) * 255) * 3;
        ctx.fillStyle = `rgb(${VIRIDIS[level]},${VIRIDIS[level + 1]},${VIRIDIS[level + 2]})`;
        ctx.fillRect(barX, top + y, 14, 1);
      }
      ctx.fillStyle = "#1b1b1b";
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      ctx.fillText(fmt(hi), barX + 18, top + 5);
      ctx.fillText(fmt((hi + lo) / 2), barX + 18, top + plotH / 2);
      ctx.fillText(fmt(lo), barX + 18, top + plotH - 5);
      if (drag && drag.to !== null) {
        const a = Math.min(drag.from, drag.to);
        const b = Math.max(drag.from, drag.to);
        ctx.strokeStyle = "#e8a200";
        ctx.lineWidth = 2;
        ctx.strokeRect(left, top + (a / rows) * plotH, plotW, ((b - a + 1) / rows) * plotH);
        ctx.lineWidth = 1;
      }
      if (cursor.r >= 0) {
        ctx.strokeStyle = "#fff";
        ctx.lineWidth = 2;
        const w = Math.max(3, plotW / cols);
        const h = Math.max(3, plotH / rows);
        ctx.strokeRect(left + (cursor.c / cols) * plotW, top + (cursor.r / rows) * plotH, w, h);
        ctx.strokeStyle = "#000";
        ctx.lineWidth = 1;
        ctx.strokeRect(left + (cursor.c / cols) * plotW - 1, top + (cursor.r / rows) * plotH - 1, w + 2, h + 2);
      }
    }
    function point(r, c) {
      cursor.r = Math.max(0, Math.min(rows - 1, r));
      cursor.c = Math.max(0, Math.min(cols - 1, c));
      const v = data[cursor.r * cols + cursor.c];
      readout.textContent = `${matrix.rowName} ${fmt(matrix.rowIndex(cursor.r))}, ${matrix.colName} ${fmt(matrix.colIndex(cursor.c))}: ${isMasked(v) ? `masked (${fmt(v)})` : fmt(v)}`;
      draw();
    }
    canvas.addEventListener("focus", () => { if (cursor.r < 0) point(0, 0); });
    canvas.addEventListener("keydown", (ev) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
        PageUp: [-Math.ceil(rows / 10), 0], PageDown: [Math.ceil(rows / 10), 0] };
      const move = moves[ev.key];
      if (!move) return;
      ev.preventDefault();
      point((cursor.r < 0 ? 0 : cursor.r + move[0]), (cursor.c < 0 ? 0 : cursor.c + move[1]));
    });
    canvas.addEventListener("mousemove", (ev) => {
      const cell = cellAt(ev);
      if (!cell) return;
      if (drag) { drag.to = cell.r; }
      point(cell.r, cell.c);
    });
    if (onRange) {
      canvas.addEventListener("mousedown", (ev) => {
        const cell = cellAt(ev);
        if (cell) drag = { from: cell.r, to: null };
      });
      canvas.addEventListener("mouseup", () => {
        const chosen = drag;
        drag = null;
        if (!chosen || chosen.to === null || chosen.to === chosen.from) { draw(); return; }
        const a = Math.min(chosen.from, chosen.to);
        const b = Math.max(chosen.from, chosen.to);
        onRange(matrix.rowIndex(a), matrix.rowIndex(b) + matrix.rowStep);
      });
    }
    canvas.addEventListener("mouseleave", () => { if (!drag) { cursor.r = -1; draw(); } });
    draw();
    const where = (at) => `${matrix.rowName} ${fmt(matrix.rowIndex(Math.floor(at / cols)))}, ${matrix.colName} ${fmt(matrix.colIndex(at % cols))}`;
    return el("figure", {},
      el("div", { class: "heat" }, canvas),
      readout,
      el("figcaption", {}, caption ? `${caption} ` : "",
        masked ? `${masked} masked entries (at or beyond ±1e30) are drawn light grey and left out of the scale. ` : "",
        `Minimum ${fmt(lo)} at ${where(loAt)}; maximum ${fmt(hi)} at ${where(hiAt)}.`));
  }

  // A 2-D matrix out of a preview: the displayed axes are the position axis (or the second to
  // last) down and the last other axis across; `fixed` picks an index on every other axis.
  function previewMatrix(p, fixed = {}, names = {}) {
    const nd = p.axes.length;
    const counts = p.axes.map((a) => a.count);
    const strides = counts.map((_, i) => counts.slice(i + 1).reduce((x, y) => x * y, 1));
    let rowAxis;
    let colAxis;
    if (nd === 1) { rowAxis = -1; colAxis = 0; }
    else {
      rowAxis = p.row_axis !== null && p.row_axis !== undefined ? p.row_axis : nd - 2;
      colAxis = rowAxis === nd - 1 ? nd - 2 : nd - 1;
      // a trailing (cos, sin) pair axis (packing "pairs") is chosen with a select instead
      if (nd >= 3 && colAxis === nd - 1 && p.shape[nd - 1] === 2 && rowAxis !== nd - 2) colAxis = nd - 2;
    }
    const rows = rowAxis < 0 ? 1 : counts[rowAxis];
    const cols = counts[colAxis];
    let base = 0;
    for (let i = 0; i < nd; i += 1) {
      if (i !== rowAxis && i !== colAxis) base += (fixed[i] || 0) * strides[i];
    }
    const out = new Float64Array(rows * cols);
    const rs = rowAxis < 0 ? 0 : strides[rowAxis];
    const cs = strides[colAxis];
    for (let r = 0; r < rows; r += 1) {
      for (let c = 0; c < cols; c += 1) out[r * cols + c] = p.data[base + r * rs + c * cs];
    }
    const axisIndex = (axis) => (k) => (axis < 0 ? 0 : p.axes[axis].start + k * p.axes[axis].step);
    return {
      rows, cols, data: out, rowAxis, colAxis,
      rowIndex: axisIndex(rowAxis), colIndex: axisIndex(colAxis),
      rowStep: rowAxis < 0 ? 1 : p.axes[rowAxis].step,
      rowName: names[rowAxis] || (rowAxis === p.row_axis ? "position" : `axis ${rowAxis}`),
      colName: names[colAxis] || (nd === 2 || colAxis === nd - 1 ? "dimension" : `axis ${colAxis}`),
    };
  }

  // Round tick values (1, 2, 5 times a power of ten) inside [lo, hi].
  function niceTicks(lo, hi, count) {
    if (!(hi > lo) || !Number.isFinite(hi - lo)) return Number.isFinite(lo) ? [lo] : [];
    const raw = (hi - lo) / Math.max(1, count);
    const power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw) || 10 * power;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    return out;
  }

  // --- line chart (SVG) ---------------------------------------------------------------------
  // series: [{name, x: [], y: []}]; hlines: [{y, label}]; bands: [{x0, x1, label}]
  function lineChart({ series, xLabel, yLabel, logY = false, hlines = [], bands = [], title, markers = false, width = 720, height = 280 }) {
    const m = { l: 70, r: 16, t: 12, b: 40 };
    const W = width - m.l - m.r;
    const H = height - m.t - m.b;
    const xs = series.flatMap((s) => s.x);
    const ys = series.flatMap((s) => s.y).concat(hlines.map((h) => h.y)).filter((v) => Number.isFinite(v) && (!logY || v > 0));
    let x0 = Math.min(...xs);
    let x1 = Math.max(...xs);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const tf = logY ? Math.log10 : (v) => v;
    let y0 = tf(Math.min(...ys));
    let y1 = tf(Math.max(...ys));
    if (y0 === y1) { y0 -= 1; y1 += 1; }
    const pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    const X = (v) => m.l + ((v - x0) / (x1 - x0)) * W;
    const Y = (v) => m.t + H - ((tf(v) - y0) / (y1 - y0)) * H;
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title || yLabel });
    root.append(svg("title", {}, title || yLabel));
    for (const band of bands) {
      root.append(svg("rect", { x: X(band.x0), y: m.t, width: Math.max(2, X(band.x1) - X(band.x0)), height: H, fill: "#f1e3b5", stroke: "#a16207", "stroke-dasharray": "3 3" }));
      root.append(svg("text", { x: (X(band.x0) + X(band.x1)) / 2, y: m.t + 12, "text-anchor": "middle" }, band.label));
    }
    let yTicks = niceTicks(y0, y1, 6);
    if (logY) {
      const decades = yTicks.filter((t) => Number.isInteger(t));
      yTicks = (decades.length >= 2 ? decades : yTicks).map((t) => 10 ** t);
    }
    for (const ty of yTicks) {
      const py = Y(ty);
      root.append(svg("line", { class: "grid", x1: m.l, x2: m.l + W, y1: py, y2: py }));
      root.append(svg("text", { x: m.l - 6, y: py + 4, "text-anchor": "end" }, fmt(ty)));
    }
    for (const tx of niceTicks(x0, x1, 8)) {
      root.append(svg("line", { class: "grid", x1: X(tx), x2: X(tx), y1: m.t, y2: m.t + H }));
      root.append(svg("text", { x: X(tx), y: m.t + H + 15, "text-anchor": "middle" }, fmt(tx)));
    }
    root.append(svg("rect", { x: m.l, y: m.t, width: W, height: H, fill: "none", stroke: "#444" }));
    root.append(svg("text", { x: m.l + W / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
    root.append(svg("text", { x: 14, y: m.t + H / 2, transform: `rotate(-90 14 ${m.t + H / 2})`, "text-anchor": "middle" }, yLabel + (logY ? " (log scale)" : "")));
    for (const h of hlines) {
      if (logY && h.y <= 0) continue;
      root.append(svg("line", { x1: m.l, x2: m.l + W, y1: Y(h.y), y2: Y(h.y), stroke: "#111", "stroke-dasharray": "8 4 1 4" }));
      root.append(svg("text", { x: m.l + W - 4, y: Y(h.y) - 4, "text-anchor": "end" }, `${h.label}: ${fmt(h.y)}`));
    }
    series.forEach((s, i) => {
      const style = SERIES[i % SERIES.length];
      const pts = [];
      s.x.forEach((x, k) => { const y = s.y[k]; if (Number.isFinite(y) && (!logY || y > 0)) pts.push(`${X(x).toFixed(1)},${Y(y).toFixed(1)}`); });
      root.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: style.color, "stroke-width": 2, "stroke-dasharray": style.dash }));
      if (markers) {
        s.x.forEach((x, k) => {
          const y = s.y[k];
          if (Number.isFinite(y) && (!logY || y > 0)) root.append(svg("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: style.color }, svg("title", {}, `${s.name}: ${fmt(x)} → ${fmt(y)}`)));
        });
      }
    });
    const legend = el("ul", { class: "legend", "aria-label": "legend" });
    series.forEach((s, i) => {
      const style = SERIES[i % SERIES.length];
      const sample = svg("svg", { width: 34, height: 10, "aria-hidden": "true" },
        svg("line", { x1: 0, x2: 34, y1: 5, y2: 5, stroke: style.color, "stroke-width": 2, "stroke-dasharray": style.dash }));
      legend.append(el("li", {}, sample, ` ${s.name}`));
    });
    return el("figure", {}, root, series.length > 1 ? legend : null);
  }

  function valuesTable(headers, rows, summary) {
    return el("details", {}, el("summary", {}, summary || "values as a table"),
      el("table", { class: "values" },
        el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows.map((r) => el("tr", {}, r.map((v) => el("td", {}, typeof v === "number" ? fmt(v) : v)))))));
  }

  function panel(title, ...body) {
    return el("div", { class: "plot" }, el("h4", {}, title), ...body);
  }

  // --- the model: presets and config.json -----------------------------------------------
  let model = null;
  let selected = null;

  async function loadPresets() {
    const body = await getJSON("v1/presets");
    const select = $("#preset");
    select.replaceChildren(el("option", { value: "" }, "choose a model…"),
      ...body.presets.map((p) => el("option", { value: p.name }, `${p.title} (${p.model})`)));
  }

  async function showPreset(name) {
    const p = await getJSON(`v1/presets/${encodeURIComponent(name)}`);
    showModel({
      title: `${p.title} (${p.model})`,
      source: p.source,
      notes: p.notes,
      entries: p.parts.map((part) => ({ ...part, notes: [], stable: part.table_url })),
    });
  }

  async function resolveConfig() {
    const text = $("#config").value.trim();
    if (!text) throw new Error("paste a config.json into the text box first");
    let config;
    try { config = JSON.parse(text); } catch (err) { throw new Error(`the config is not valid JSON: ${err.message}`); }
    const maxPositions = $("#max-positions").value.trim();
    const profile = $("#profile").value;
    const overrides = {};
    if (maxPositions) overrides.max_positions = Number(maxPositions);
    if (profile) overrides.profile = profile;
    const body = Object.keys(overrides).length ? { hf_config: config, ...overrides } : config;
    const out = await getJSON("v1/resolve", { method: "POST", body });
    const name = (config.text_config && config.text_config.model_type) || config.model_type || "config.json";
    showModel({ title: `config.json (${name})`, notes: [], entries: out.specs, config: body, unserved: out.unserved || [] });
  }

  function showModel(m) {
    model = m;
    const list = $("#table-list");
    list.replaceChildren();
    const intro = $("#tables-intro");
    intro.replaceChildren(
      el("strong", {}, m.title), `: ${m.entries.length} table${m.entries.length === 1 ? "" : "s"}. `,
      m.notes.length ? el("ul", { class: "notes" }, m.notes.map((n) => el("li", {}, n))) : "",
      // /v1/resolve's `unserved`: the parts of the model no table is served for, and why.
      m.unserved && m.unserved.length
        ? el("span", { class: "unserved" }, `Not served (${m.unserved.length}):`,
          el("ul", { class: "notes" }, m.unserved.map((u) => el("li", {}, el("strong", {}, u.part), ` (${u.config_key}): ${u.reason}`))))
        : "");
    m.entries.forEach((entry, i) => {
      remember(entry.key, entry.spec, entry.outputs, entry.url);
      list.append(tableCard(entry, i));
    });
    $("#tables").hidden = false;
    $("#check").hidden = false;
    if (m.entries.length) plotEntry(m.entries[0]);
  }

  const NUMPY = new Set(["float32", "float64", "float16", "int64", "int32"]);

  function downloadLink(entry, params, label) {
    const href = tableUrl(entry.key, params);
    const suffix = { safetensors: "safetensors", npz: "npz", npy: "npy", raw: "bin" }[params.format];
    const file = `${entry.name.replace(/[^A-Za-z0-9_.-]+/g, "_")}${params.tensor ? "." + params.tensor : ""}.${suffix}`;
    return el("a", {
      href, download: file,
      onclick: (ev) => {
        if (!apiKey) return; // a plain link: the browser downloads it
        ev.preventDefault(); // with a key the request needs its header: fetch, then save
        working(`Downloading ${file}`, async () => {
          const blob = await (await call(href)).blob();
          const url = URL.createObjectURL(blob);
          const a = el("a", { href: url, download: file });
          document.body.append(a);
          a.click();
          a.remove();
          setTimeout(() => URL.revokeObjectURL(url), 10000);
        });
      },
    }, label);
  }

  function snippets(entry) {
    const origin = window.location.origin;
    const auth = apiKey ? ` -H "Authorization: Bearer $POSENC_API_KEY"` : "";
    const file = entry.name.replace(/[^A-Za-z0-9_.-]+/g, "_");
    const spec = JSON.stringify(entry.spec);
    const curl = [
      `# by spec (any posenc server)`,
      `curl -s${auth} ${origin}/v1/tables -o ${file}.safetensors \\`,
      `  -d '${spec}'`,
      `# by URL (the spec rides in it: any replica answers, after any restart)`,
      `curl -s${auth} "${origin}/${tableUrl(entry.key, { format: "safetensors" })}" -o ${file}.safetensors`,
    ].join("\n");
    const keyArg = apiKey ? ", api_key=os.environ[\"POSENC_API_KEY\"]" : "";
    const python = [
      apiKey ? "import os\n" : "",
      "from posenc_client import Client\n",
      `client = Client("${origin}"${keyArg})`,
      `table = client.table(${JSON.stringify(entry.spec, null, 0).replace(/true/g, "True").replace(/false/g, "False").replace(/null/g, "None")})`,
      `# or, by URL (any replica): table = client.table_by_key("${knownUrls.has(entry.key) ? "/" + knownUrls.get(entry.key) : entry.key}")`,
      `${Object.keys(entry.outputs).map((n) => `table["${n}"]`).join(", ")}  # numpy arrays`,
    ].join("\n");
    return [
      el("details", {}, el("summary", {}, "curl"), el("pre", {}, curl)),
      el("details", {}, el("summary", {}, "Python client (posenc-client)"), el("pre", {}, python)),
    ];
  }

  function tableCard(entry, index) {
    const outputs = Object.entries(entry.outputs);
    const numpyOk = outputs.every(([, o]) => NUMPY.has(o.dtype));
    const links = [downloadLink(entry, { format: "safetensors" }, "safetensors (all tensors)")];
    if (numpyOk) links.push(downloadLink(entry, { format: "npz" }, "npz"));
    for (const [name, o] of outputs) {
      if (NUMPY.has(o.dtype)) links.push(downloadLink(entry, { format: "npy", tensor: name }, `${name}.npy`));
      links.push(downloadLink(entry, { format: "raw", tensor: name }, `${name} raw`));
    }
    const button = el("button", { type: "button", class: "secondary plot-button", "aria-pressed": "false", "data-index": index,
      onclick: () => plotEntry(entry) }, "Plot this table");
    return el("article", { class: "card", id: `table-${index}`, "data-key": entry.key },
      el("h3", {}, entry.name, el("span", { class: "kind" }, entry.kind)),
      el("ul", { class: "notes" }, [...noteLines(entry.notes, entry.kind === "rope" ? ["pairing", "rope_type"] : []), ...specFacts(entry.spec)].map((n) => el("li", {}, n))),
      el("dl", {},
        el("dt", {}, "key"), el("dd", {}, el("code", {}, entry.key)),
        el("dt", {}, "tensors"), el("dd", {}, outputs.map(([n, o]) => `${n} ${shapeText(o.shape)} ${o.dtype}`).join(" · ")),
        el("dt", {}, "size"), el("dd", {}, fmtBytes(entry.bytes)),
        el("dt", {}, "spec"), el("dd", {}, el("details", {}, el("summary", {}, "canonical spec"), el("pre", {}, JSON.stringify(entry.spec, null, 1)))),
        el("dt", {}, "download"), el("dd", { class: "downloads" }, links)),
      snippets(entry),
      button);
  }

  // --- plots of one table -------------------------------------------------------------------
  function plotEntry(entry) {
    selected = entry;
    document.querySelectorAll(".card").forEach((card) => {
      const on = card.dataset.key === entry.key;
      card.classList.toggle("selected", on);
      const b = $(".plot-button", card);
      if (b) b.setAttribute("aria-pressed", String(on));
    });
    const area = $("#plot-area");
    area.replaceChildren(el("p", {}, "Plots of ", el("strong", {}, entry.name), ` (${entry.kind}, key ${entry.key.slice(0, 12)}…).`));
    $("#plots").hidden = false;
    const tensors = Object.entries(entry.outputs);
    const positional = tensors.filter(([, o]) => o.shape.length >= 2);
    const target = { key: entry.key, outputs: entry.outputs, label: entry.name };
    if (entry.kind === "rope") {
      area.append(heatmapPanel(target, "cos/sin by position and dimension"));
      if (entry.outputs.inv_freq) area.append(wavelengthPanel(entry));
      area.append(comparePanel(entry));
    } else if (entry.kind === "alibi") {
      area.append(slopesPanel(entry));
      area.append(alibiBiasPanel(entry));
      if (entry.outputs.bias) area.append(heatmapPanel(target, "bias per head"));
    } else if (entry.kind === "t5_bias") {
      area.append(heatmapPanel({ ...target, only: "buckets" }, "bucket map (query × key)"));
      area.append(bucketLinePanel(entry));
      if (entry.outputs.bias) area.append(heatmapPanel({ ...target, only: "bias" }, "bias per head"));
      else area.append(t5WeightsPanel(entry));
    } else {
      if (positional.length) area.append(heatmapPanel(target, entry.kind === "sinusoidal_2d" ? "2-D embedding" : "table"));
      const grid = entry.spec.grid_height && entry.spec.grid_width && entry.outputs.embedding;
      if (entry.kind === "sinusoidal_2d" && grid && grid.shape.length === 2) area.append(gridPanel(entry));
      for (const [name, o] of tensors) {
        if (o.shape.length === 1) area.append(vectorPanel(entry, name));
      }
    }
    checkTargetChanged();
  }

  // A heatmap of any tensor through the preview route: tensor choice, row range (zoom), and a
  // choice of index on the axes not shown (heads, channels).
  function heatmapPanel(target, title) {
    const names = Object.entries(target.outputs).filter(([n, o]) => o.shape.length >= 2 && (!target.only || n === target.only)).map(([n]) => n);
    const holder = el("div");
    const tensorSel = el("select", { name: "tensor", "aria-label": "tensor" }, names.map((n) => el("option", { value: n }, n)));
    if (names.includes("cos")) tensorSel.value = "cos";
    const start = el("input", { type: "number", name: "row_start", min: 0, step: 1, "aria-label": "first position" });
    const end = el("input", { type: "number", name: "row_end", min: 1, step: 1, "aria-label": "end position (exclusive)" });
    const fixed = {};
    let last = null;
    const total = () => (last && last.row_axis !== null ? last.shape[last.row_axis] : null);
    async function show(rows) {
      await working("Sampling the table", async () => {
        const p = await preview(target.key, tensorSel.value, rows);
        last = p;
        const n = total();
        if (n !== null) {
          const a = rows ? rows[0] : 0;
          const b = rows ? rows[1] : n;
          start.value = a; end.value = b;
          start.max = n - 1; end.max = n;
        }
        render();
      });
    }
    function render() {
      const p = last;
      holder.replaceChildren();
      const nd = p.axes.length;
      const m0 = previewMatrix(p, fixed);
      const selects = [];
      for (let axis = 0; axis < nd; axis += 1) {
        if (axis === m0.rowAxis || axis === m0.colAxis) continue;
        const pairAxis = p.tensor === "pairs" && axis === nd - 1;
        const label = p.tensor === "bias" && axis === 0 ? "head" : pairAxis ? "cos or sin" : `axis ${axis}`;
        const sel = el("select", { "aria-label": label, name: `axis_${axis}`,
          onchange: () => { fixed[axis] = Number(sel.value); render(); } },
          Array.from({ length: p.axes[axis].count }, (_, k) => el("option", { value: k },
            pairAxis ? ["cos", "sin"][k] : `${label} ${p.axes[axis].start + k * p.axes[axis].step}`)));
        sel.value = String(fixed[axis] || 0);
        selects.push(el("label", {}, `${label} `, sel));
      }
      const names = {};
      if (p.tensor === "bias" || p.tensor === "buckets") { names[m0.rowAxis] = "query"; names[m0.colAxis] = "key"; }
      if (p.kind === "sinusoidal_2d" && nd === 3) { names[1] = "y (row)"; names[2] = "x (column)"; }
      if (p.tensor === "pairs") names[m0.colAxis] = "rotary pair";
      const m = previewMatrix(p, fixed, names);
      const sampled = p.axes.some((a) => a.step > 1);
      const note = `${p.tensor} ${shapeText(p.shape)} ${p.dtype}` + (sampled
        ? `, sampled every ${p.axes.map((a) => a.step).join(" × ")} elements (at most ${PREVIEW_POINTS} points; zoom to see every row).`
        : ", every element.");
      holder.append(selects.length ? el("div", { class: "controls" }, selects) : "");
      holder.append(heatmap(m, { title: `${target.label} ${p.tensor}`, caption: note,
        onRange: p.row_axis !== null ? (a, b) => show([a, Math.min(b, total())]) : null }));
      if (nd === 3 && p.row_axis === null) holder.append(multiples(p));
    }
    const zoom = (factor) => {
      const n = total();
      if (n === null) return;
      const a = Number(start.value || 0);
      const b = Number(end.value || n);
      const mid = (a + b) / 2;
      const half = Math.max(1, Math.round(((b - a) * factor) / 2));
      const lo = Math.max(0, Math.round(mid - half));
      show([lo, Math.min(n, Math.max(lo + 1, Math.round(mid + half)))]);
    };
    const controls = el("form", { class: "controls", onsubmit: (ev) => {
      ev.preventDefault();
      const n = total();
      const a = Number(start.value || 0);
      const b = Number(end.value || n);
      show(n === null ? null : [a, b]);
    } },
    names.length > 1 ? el("label", {}, "tensor ", tensorSel) : null,
    el("label", {}, "positions from ", start), el("label", {}, " to ", end),
    el("button", { type: "submit" }, "Show"),
    el("button", { type: "button", class: "secondary", onclick: () => zoom(0.5) }, "Zoom in"),
    el("button", { type: "button", class: "secondary", onclick: () => zoom(2) }, "Zoom out"),
    el("button", { type: "button", class: "secondary", onclick: () => show(null) }, "Whole table"));
    tensorSel.addEventListener("change", () => show(null));
    if (!names.length) return panel(title, el("p", {}, "No tensor with two or more axes to draw."));
    show(null);
    return panel(`${title}: heatmap`, controls, el("p", { class: "muted" }, "Drag over the heatmap to zoom to those positions; focus it and use the arrow keys to read values."), holder);
  }

  // One small image of a rows x cols grid of values, scaled to its own range.
  function tinyImage(values, rows, cols, label) {
    let lo = Infinity; let hi = -Infinity;
    for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const c = el("canvas", { width: cols, height: rows, role: "img",
      "aria-label": `${label}: ${rows} by ${cols}, values ${fmt(lo)} to ${fmt(hi)}` });
    const ctx = c.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    for (let i = 0; i < values.length; i += 1) {
      const level = Math.round(((values[i] - lo) / (hi - lo || 1)) * 255) * 3;
      img.data.set([VIRIDIS[level], VIRIDIS[level + 1], VIRIDIS[level + 2], 255], i * 4);
    }
    ctx.putImageData(img, 0, 0);
    const scale = Math.max(1, Math.floor(112 / Math.max(rows, cols)));
    c.style.width = `${cols * scale}px`;
    c.style.height = `${rows * scale}px`;
    return el("figure", {}, c, el("figcaption", {}, label, el("br"), `${fmt(lo)} to ${fmt(hi)}`));
  }

  // Small multiples of the first axis of a 3-D preview (DETR's channels over the H x W grid).
  function multiples(p) {
    const count = Math.min(8, p.axes[0].count);
    const figs = [];
    for (let k = 0; k < count; k += 1) {
      const idx = Math.round((k * (p.axes[0].count - 1)) / Math.max(1, count - 1));
      const m = previewMatrix(p, { 0: idx }, { 1: "y", 2: "x" });
      figs.push(tinyImage(m.data, m.rows, m.cols, `channel ${p.axes[0].start + idx * p.axes[0].step}`));
    }
    return el("div", {}, el("p", { class: "muted" }, "Channels side by side (each scaled to its own range):"), el("div", { class: "multiples" }, figs));
  }

  // A (grid_height*grid_width [+ class rows], D) 2-D table (MAE, timm) as images: one
  // dimension over the grid per image, rows after the class-token rows laid out row-major.
  function gridPanel(entry) {
    const holder = el("div");
    const spec = entry.spec;
    const [n, d] = entry.outputs.embedding.shape;
    const gh = spec.grid_height;
    const gw = spec.grid_width;
    const offset = n - gh * gw;
    working("Fetching the embedding", async () => {
      const response = await call(tableUrl(entry.key, { format: "raw", tensor: "embedding" }));
      const buffer = await response.arrayBuffer();
      const values = typed(buffer, 0, buffer.byteLength, response.headers.get("X-Posenc-Dtype"));
      const figs = [];
      const dims = [...new Set(Array.from({ length: 8 }, (_, k) => Math.round((k * (d - 1)) / 7)))];
      for (const dim of dims) {
        const img = new Float64Array(gh * gw);
        for (let i = 0; i < gh * gw; i += 1) img[i] = values[(offset + i) * d + dim];
        figs.push(tinyImage(img, gh, gw, `dimension ${dim}`));
      }
      holder.append(el("p", { class: "muted" }, `Each image is one dimension over the ${gh} × ${gw} grid (y down, x across)${offset ? `, after ${offset} class-token row${offset > 1 ? "s" : ""}` : ""}; each scaled to its own range.`),
        el("div", { class: "multiples" }, figs));
    });
    return panel("2-D grid", holder);
  }

  function vectorPanel(entry, name) {
    const holder = el("div");
    working(`Fetching ${name}`, async () => {
      const t = await tensorJSON(entry.key, name);
      const x = t.data.map((_, i) => i);
      holder.append(lineChart({ series: [{ name, x, y: t.data }], xLabel: "index", yLabel: name, markers: t.data.length <= 128 }));
    });
    return panel(`${name} ${shapeText(entry.outputs[name].shape)}`, holder);
  }

  // RoPE: wavelength 2*pi/inv_freq of each rotary pair, scaled and unscaled, against the
  // original and extended context; the ramp is where the scaling factor per pair varies.
  function wavelengthPanel(entry) {
    const holder = el("div");
    const spec = entry.spec;
    const scaling = spec.rope_scaling && spec.rope_scaling.rope_type !== "default" ? spec.rope_scaling : null;
    working("Fetching frequencies", async () => {
      const mine = await tensorJSON(entry.key, "inv_freq");
      const pairs = mine.data.map((_, i) => i);
      const wl = mine.data.map((f) => (f > 0 ? (2 * Math.PI) / f : Infinity));
      const series = [{ name: scaling ? `${scaling.rope_type} (this table)` : "this table", x: pairs, y: wl }];
      const hlines = [];
      const bands = [];
      let summary = "";
      let ratio = null;
      const orig = scaling && scaling.original_max_position_embeddings;
      if (orig) hlines.push({ y: orig, label: "original context" });
      hlines.push({ y: spec.seq_len || spec.max_positions, label: scaling ? "extended context (table length)" : "table length" });
      if (scaling) {
        const plain = { ...spec, max_positions: 1 };
        delete plain.rope_scaling;
        delete plain.seq_len;
        const base = await postSpec(plain, "inv_freq");
        const wl0 = base.tensor.data.map((f) => (f > 0 ? (2 * Math.PI) / f : Infinity));
        series.push({ name: "no scaling (same rope_theta)", x: pairs, y: wl0 });
        ratio = wl.map((w, i) => (Number.isFinite(w) && Number.isFinite(wl0[i]) ? w / wl0[i] : NaN));
        const finite = ratio.filter(Number.isFinite);
        const rmin = Math.min(...finite);
        const rmax = Math.max(...finite);
        if (rmax / rmin > 1 + 1e-6) {
          const inside = ratio.map((r, i) => (r > rmin * (1 + 1e-6) && r < rmax * (1 - 1e-6) ? i : -1)).filter((i) => i >= 0);
          const low = ratio.filter((r) => r <= rmin * (1 + 1e-6)).length;
          const high = ratio.filter((r) => r >= rmax * (1 - 1e-6)).length;
          if (inside.length) {
            bands.push({ x0: inside[0] - 0.5, x1: inside[inside.length - 1] + 0.5, label: "ramp" });
            summary = `Pairs scaled by ${fmt(rmin)}: ${low}; on the ramp: pairs ${inside[0]}–${inside[inside.length - 1]}; scaled by ${fmt(rmax)}: ${high}.`;
          } else {
            summary = `Pairs scaled by ${fmt(rmin)}: ${low}; scaled by ${fmt(rmax)}: ${high} (no pair in between).`;
          }
        } else {
          summary = `Every pair's wavelength is scaled by ${fmt(rmax)} (no ramp).`;
        }
      } else {
        summary = "No scaling: wavelengths are 2π·rope_theta^(2i/d).";
      }
      holder.append(lineChart({ series, xLabel: "rotary pair i", yLabel: "wavelength (positions)", logY: true, hlines, bands,
        title: "wavelength per rotary pair" }));
      holder.append(el("p", {}, summary));
      const facts = metaFacts(mine.meta);
      if (facts.length) holder.append(el("p", {}, "Computed with the table: ", facts.join("; "), "."));
      if (ratio) {
        holder.append(lineChart({ series: [{ name: "scale", x: pairs, y: ratio }], xLabel: "rotary pair i", yLabel: "wavelength ÷ unscaled", bands, height: 200, title: "scaling per pair" }));
      }
      holder.append(valuesTable(["pair", "inv_freq", "wavelength", ...(ratio ? ["scale"] : [])],
        pairs.map((i) => [i, mine.data[i], wl[i], ...(ratio ? [ratio[i]] : [])]), "wavelengths as a table"));
    });
    return panel("Wavelength per dimension against the context", holder);
  }

  // Two configs compared: this RoPE table minus another (the same without scaling, default RoPE,
  // or another table of this model), sampled at the same positions.
  function comparePanel(entry) {
    const holder = el("div");
    const choices = [];
    const spec = entry.spec;
    if (spec.rope_scaling && spec.rope_scaling.rope_type !== "default") {
      const plain = { ...spec };
      delete plain.rope_scaling;
      choices.push({ label: "the same without its scaling", spec: plain });
    }
    const dflt = { kind: "rope", head_dim: spec.head_dim, rotary_dim: spec.rotary_dim, max_positions: spec.max_positions,
      width: spec.width, packing: spec.packing, interleaved: spec.interleaved };
    choices.push({ label: "default RoPE (rope_theta 10000, no scaling)", spec: dflt });
    for (const other of (model ? model.entries : [])) {
      if (other.key !== entry.key && other.kind === "rope") choices.push({ label: `${other.name} of this model`, key: other.key });
    }
    const against = el("select", { name: "compare_with", "aria-label": "compare with" }, choices.map((c, i) => el("option", { value: i }, c.label)));
    const tensors = Object.entries(entry.outputs).filter(([, o]) => o.shape.length >= 2).map(([n]) => n);
    const tensorSel = el("select", { name: "compare_tensor", "aria-label": "tensor" }, tensors.map((n) => el("option", { value: n }, n)));
    const total = entry.outputs[tensors[0]].shape[0];
    const start = el("input", { type: "number", name: "compare_start", min: 0, value: 0, "aria-label": "first position" });
    const end = el("input", { type: "number", name: "compare_end", min: 1, value: total, "aria-label": "end position" });
    async function run() {
      await working("Comparing", async () => {
        const choice = choices[Number(against.value)];
        const key = choice.key || (await postSpec(choice.spec, "inv_freq")).key;
        const rows = [Number(start.value), Number(end.value)];
        const [a, b] = await Promise.all([preview(entry.key, tensorSel.value, rows), preview(key, tensorSel.value, rows)]);
        if (a.shape.join() !== b.shape.join()) {
          throw new Error(`the tables differ in shape: ${shapeText(a.shape)} against ${shapeText(b.shape)}; compare tables of one head size and layout`);
        }
        const diff = { ...a, data: a.data.map((v, i) => v - b.data[i]) };
        const m = previewMatrix(diff);
        const perRow = [];
        for (let r = 0; r < m.rows; r += 1) {
          let worst = 0;
          for (let c = 0; c < m.cols; c += 1) worst = Math.max(worst, Math.abs(m.data[r * m.cols + c]));
          perRow.push(worst);
        }
        const first = perRow.findIndex((v) => v > 0);
        holder.replaceChildren(
          heatmap(m, { title: "difference", caption: `${tensorSel.value} of this table minus ${choice.label}.` }),
          lineChart({ series: [{ name: "max |difference|", x: perRow.map((_, r) => m.rowIndex(r)), y: perRow }], xLabel: "position", yLabel: "max |difference| over dimensions", height: 200, title: "difference per position" }),
          el("p", {}, first < 0 ? "The sampled values are identical." : `The tables first differ at position ${m.rowIndex(first)} (among the sampled positions); the largest difference is ${fmt(Math.max(...perRow))}.`));
      });
    }
    const form = el("form", { class: "controls", onsubmit: (ev) => { ev.preventDefault(); run(); } },
      el("label", {}, "this table minus ", against), el("label", {}, "tensor ", tensorSel),
      el("label", {}, "positions from ", start), el("label", {}, " to ", end),
      el("button", { type: "submit" }, "Show difference"));
    return panel("Two configs compared: difference heatmap", form, holder);
  }

  function slopesPanel(entry) {
    const holder = el("div");
    working("Fetching slopes", async () => {
      const t = await tensorJSON(entry.key, "slopes");
      const heads = t.data.map((_, i) => i);
      holder.append(lineChart({ series: [{ name: "slope", x: heads, y: t.data }], xLabel: "head", yLabel: "slope m", logY: true, markers: true, title: "ALiBi slope per head" }));
      holder.append(valuesTable(["head", "slope", "log2 slope"], t.data.map((v, i) => [i, v, Math.log2(v)]), "slopes as a table"));
    });
    return panel(`Slopes per head (${entry.outputs.slopes.shape[0]} heads)`, holder);
  }

  function alibiBiasPanel(entry) {
    const holder = el("div");
    const length = 64;
    working("Building the bias", async () => {
      const spec = { ...entry.spec, bias: "causal", key_length: length, query_length: length };
      const { key, tensor } = await postSpec(spec, "bias", [length - 1, length]);
      const heads = tensor.shape[0];
      const picks = [...new Set(Array.from({ length: Math.min(8, heads) }, (_, k) => Math.round((k * (heads - 1)) / Math.max(1, Math.min(8, heads) - 1))))];
      const x = Array.from({ length }, (_, j) => j - (length - 1));
      const series = picks.map((h) => ({ name: `head ${h}`, x, y: x.map((_, j) => tensor.data[h][0][j]) }));
      holder.append(lineChart({ series, xLabel: "key position − query position (j − i)", yLabel: "bias", title: "ALiBi bias of the last query per head" }));
      holder.append(heatmapPanel({ key, outputs: { bias: { shape: tensor.shape } }, label: "causal bias", only: "bias" }, `Causal bias (${length} × ${length}) per head`));
    });
    return panel("Bias per head (causal form, 64 positions)", holder);
  }

  function bucketLinePanel(entry) {
    const holder = el("div");
    const [q, k] = entry.outputs.buckets.shape;
    const mid = Math.floor(q / 2);
    working("Fetching buckets", async () => {
      const t = await tensorJSON(entry.key, "buckets", [mid, mid + 1]);
      const x = Array.from({ length: k }, (_, j) => j - mid);
      holder.append(lineChart({ series: [{ name: "bucket", x, y: t.data[0] }], xLabel: `key position − query position (query ${mid})`, yLabel: "bucket", title: "T5 bucket by relative position" }));
    });
    return panel("Bucket by relative position", holder);
  }

  function t5WeightsPanel(entry) {
    const holder = el("div");
    const area = el("textarea", { name: "relative_attention_bias", rows: 3, spellcheck: "false", "aria-label": "relative_attention_bias as JSON",
      placeholder: `[[...H values...], ... ${entry.spec.num_buckets} rows]` });
    const form = el("form", { onsubmit: (ev) => {
      ev.preventDefault();
      working("Building the bias", async () => {
        let weights;
        try { weights = JSON.parse(area.value); } catch (err) { throw new Error(`the weights are not valid JSON: ${err.message}`); }
        const { key } = await postSpec({ ...entry.spec, relative_attention_bias: weights }, "buckets", [0, 1]);
        const shape = [weights[0].length, ...entry.outputs.buckets.shape];
        holder.replaceChildren(heatmapPanel({ key, outputs: { bias: { shape } }, label: "bias", only: "bias" }, "Bias per head"));
      });
    } }, el("label", {}, "The bias per head is the checkpoint's relative_attention_bias (num_buckets × heads) looked up by bucket: paste it as JSON to see it."), area, el("button", { type: "submit" }, "Show the bias"));
    return panel("Bias per head", form, holder);
  }

  // --- check: a table file against the exact table -------------------------------------------
  const TOLERANCE = { float32: 2.4e-7, float64: 1e-12, float16: 9.8e-4, bfloat16: 7.9e-3, int64: 0, int32: 0 };

  function half(bits) {
    const s = bits & 0x8000 ? -1 : 1;
    const e = (bits >> 10) & 0x1f;
    const f = bits & 0x3ff;
    if (e === 0) return s * 2 ** -14 * (f / 1024);
    if (e === 31) return f ? NaN : s * Infinity;
    return s * 2 ** (e - 15) * (1 + f / 1024);
  }
  function typed(buffer, offset, length, dtype) {
    const bytes = buffer.slice(offset, offset + length);
    switch (dtype) {
      case "float32": return new Float32Array(bytes);
      case "float64": return new Float64Array(bytes);
      case "int32": return new Int32Array(bytes);
      case "int64": return Float64Array.from(new BigInt64Array(bytes), Number);
      case "float16": return Float32Array.from(new Uint16Array(bytes), half);
      case "bfloat16": {
        const out = new Uint32Array(length / 2);
        new Uint16Array(bytes).forEach((v, i) => { out[i] = v << 16; });
        return new Float32Array(out.buffer);
      }
      default: throw new Error(`dtype ${dtype} is not read here (float16/32/64, bfloat16, int32/64 are)`);
    }
  }
  const NPY_DTYPES = { "<f4": "float32", "<f8": "float64", "<f2": "float16", "<i4": "int32", "<i8": "int64" };
  const ST_DTYPES = { F32: "float32", F64: "float64", F16: "float16", BF16: "bfloat16", I32: "int32", I64: "int64" };

  // {name: {dtype, shape, values}} from an .npy or .safetensors file.
  function readTables(buffer, fileName) {
    const view = new DataView(buffer);
    const magic = new Uint8Array(buffer, 0, Math.min(6, buffer.byteLength));
    if (magic[0] === 0x93 && String.fromCharCode(...magic.slice(1)) === "NUMPY") {
      const major = view.getUint8(6);
      const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
      const start = major === 1 ? 10 : 12;
      const header = new TextDecoder().decode(new Uint8Array(buffer, start, headerLength));
      const descr = /'descr':\s*'([^']+)'/.exec(header);
      const fortran = /'fortran_order':\s*(True|False)/.exec(header);
      const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
      if (!descr || !fortran || !shape) throw new Error(`${fileName}: not a readable .npy header`);
      if (fortran[1] === "True") throw new Error(`${fileName}: Fortran-ordered arrays are not read; save it C-ordered`);
      const dtype = NPY_DTYPES[descr[1].replace("|", "<")];
      if (!dtype) throw new Error(`${fileName}: dtype ${descr[1]} is not read here`);
      const dims = shape[1].split(",").map((s) => s.trim()).filter(Boolean).map(Number);
      const offset = start + headerLength;
      return { array: { dtype, shape: dims, values: typed(buffer, offset, buffer.byteLength - offset, dtype),
        raw: new Uint8Array(buffer, offset, buffer.byteLength - offset) } };
    }
    if (buffer.byteLength > 8 && view.getUint8(8) === 0x7b) {
      const length = Number(view.getBigUint64(0, true));
      const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, length)));
      const out = {};
      for (const [name, info] of Object.entries(header)) {
        if (name === "__metadata__") continue;
        const dtype = ST_DTYPES[info.dtype];
        if (!dtype) continue;
        const [a, b] = info.data_offsets;
        out[name] = { dtype, shape: info.shape, values: typed(buffer, 8 + length + a, b - a, dtype),
          raw: new Uint8Array(buffer, 8 + length + a, b - a) };
      }
      return out;
    }
    throw new Error(`${fileName} is neither .npy nor .safetensors`);
  }

  let checkFile = null;
  function checkTargetChanged() { if (checkFile) runCheck(); }

  // By its name, else by its first bytes: an ONNX ModelProto starts with field 1 (ir_version,
  // a varint: 0x08); safetensors has "{" at byte 8 (after the header length).
  function isModel(name, head) {
    if (/\.onnx$/i.test(name)) return true;
    if (/\.(npy|safetensors)$/i.test(name)) return false;
    return head[0] === 0x08 && head[8] !== 0x7b;
  }

  async function onFile(file) {
    if (!file) return;
    const head = new Uint8Array(await file.slice(0, 9).arrayBuffer());
    if (isModel(file.name, head)) {
      checkFile = { name: file.name, model: file };
    } else {
      checkFile = { name: file.name, tables: readTables(await file.arrayBuffer(), file.name) };
    }
    runCheck();
  }

  function runCheck() {
    const out = $("#check-result");
    if (!selected) { out.replaceChildren(el("p", {}, "Choose a model and a table first.")); return; }
    if (checkFile.model) { checkWorking("Checking the model's RoPE sites", () => checkModel(checkFile, out)); return; }
    const fileNames = Object.keys(checkFile.tables);
    const tableNames = Object.keys(selected.outputs);
    const fileSel = el("select", { name: "file_tensor", "aria-label": "tensor in the file" }, fileNames.map((n) => el("option", { value: n }, n)));
    const tableSel = el("select", { name: "table_tensor", "aria-label": "tensor of the exact table" }, tableNames.map((n) => el("option", { value: n }, n)));
    const guess = tableNames.find((n) => fileNames.includes(n)) || tableNames.find((n) => n === "cos") || tableNames[0];
    tableSel.value = guess;
    if (fileNames.includes(guess)) fileSel.value = guess;
    const result = el("div");
    const diagnosis = el("div", { class: "table-diagnosis" });
    const go = () => checkWorking("Checking", () => compareFile(checkFile.tables[fileSel.value], tableSel.value, result));
    out.replaceChildren(el("form", { class: "controls", onsubmit: (ev) => { ev.preventDefault(); go(); } },
      el("span", {}, el("strong", {}, checkFile.name), ": "),
      fileNames.length > 1 ? el("label", {}, "tensor ", fileSel) : `${fileNames[0]} `,
      el("label", {}, `against ${selected.name}'s `, tableSel),
      el("button", { type: "submit" }, "Compare")), result, diagnosis);
    go();
    if (selected.kind === "rope") checkWorking("Diagnosing the file's cos/sin", () => diagnoseTables(checkFile, diagnosis));
  }

  // --- the diagnosis of a table file's cos/sin: the same check as a model's (one code) -------
  // The file's cos and sin (2-D, one shape; full width cat(c, c) or repeat_interleave(c, 2)
  // brought to half width here) are wrapped as the two cache initializers of a one-node
  // RotaryEmbedding-23 model and sent to POST /v1/check/onnx: the server reports them as it
  // reports a model's caches (verdict, departure, diagnosis, map), posenc-client verify's code.
  const ONNX_TYPES = { float32: 1, float16: 10, float64: 11, bfloat16: 16 };
  function pbVarint(n) {
    const out = [];
    let v = BigInt(n);
    do { let b = Number(v & 0x7fn); v >>= 7n; if (v) b |= 0x80; out.push(b); } while (v);
    return out;
  }
  function pbJoin(parts) {
    const total = parts.reduce((a, p) => a + p.length, 0);
    const out = new Uint8Array(total);
    let at = 0;
    for (const p of parts) { out.set(p, at); at += p.length; }
    return out;
  }
  const pbBytes = (field, bytes) => pbJoin([Uint8Array.from([...pbVarint(field * 8 + 2), ...pbVarint(bytes.length)]), bytes]);
  const pbString = (field, text) => pbBytes(field, new TextEncoder().encode(text));
  const pbInt = (field, n) => Uint8Array.from([...pbVarint(field * 8), ...pbVarint(n)]);
  function pbTensor(name, shape, dtype, raw) {
    return pbJoin([...shape.map((d) => pbInt(1, d)), pbInt(2, ONNX_TYPES[dtype]), pbString(8, name), pbBytes(9, raw)]);
  }
  function halfWidth(t, other) {
    // (P, d) full width -> (P, d/2) raw bytes, when both tables repeat their halves or pairs
    const [rows, cols] = t.shape;
    const size = t.raw.length / (rows * cols);
    const w = cols / 2;
    const same = (f) => [t, other].every((x) => { for (let r = 0; r < rows; r += 1) for (let c = 0; c < w; c += 1) { const [i, j] = f(r, c); if (x.values[i] !== x.values[j]) return false; } return true; });
    let pick = null;
    if (same((r, c) => [r * cols + c, r * cols + c + w])) pick = (r, c) => r * cols + c;
    else if (same((r, c) => [r * cols + 2 * c, r * cols + 2 * c + 1])) pick = (r, c) => r * cols + 2 * c;
    if (!pick) return null;
    const out = new Uint8Array(rows * w * size);
    for (let r = 0; r < rows; r += 1) for (let c = 0; c < w; c += 1) {
      const i = pick(r, c);
      out.set(t.raw.subarray(i * size, (i + 1) * size), (r * w + c) * size);
    }
    return { shape: [rows, w], raw: out };
  }
  function tablesAsModel(cos, sin, names) {
    const node = pbJoin([pbString(1, "x"), pbString(1, names[0]), pbString(1, names[1]), pbString(1, "position_ids"),
      pbString(2, "y"), pbString(3, "table file"), pbString(4, "RotaryEmbedding")]);
    const graph = pbJoin([pbBytes(1, node), pbString(2, "table file"),
      pbBytes(5, pbTensor(names[0], cos.shape, cos.dtype, cos.raw)), pbBytes(5, pbTensor(names[1], sin.shape, sin.dtype, sin.raw))]);
    const opset = pbJoin([pbString(1, ""), pbInt(2, 23)]);
    return new Blob([pbJoin([pbInt(1, 10), pbBytes(7, graph), pbBytes(8, opset)])], { type: "application/octet-stream" });
  }
  async function diagnoseTables(file, out) {
    const names = Object.keys(file.tables);
    const cosName = names.find((n) => /(^|[^a-z])cos/i.test(n));
    const sinName = names.find((n) => /(^|[^a-z])sin/i.test(n));
    const cos = cosName && file.tables[cosName];
    const sin = sinName && file.tables[sinName];
    if (!cos || !sin || cos.shape.length !== 2 || cos.shape.join() !== sin.shape.join() || cos.dtype !== sin.dtype || !(cos.dtype in ONNX_TYPES)) {
      out.replaceChildren(el("p", { class: "muted", "data-diagnosis": "none" },
        "The diagnosis (which scaling, rounding, pairing) reads a cos and a sin table of one (positions, columns) shape: save both in one .safetensors (tensors named cos and sin) to get it."));
      return;
    }
    let pair = [cos, sin];
    const exact = selected.outputs.cos;
    const width = exact ? exact.shape[exact.shape.length - 1] : null;
    const halfCols = selected.spec && selected.spec.width === "full" && width ? width / 2 : width;
    if (halfCols && cos.shape[1] === 2 * halfCols) {
      const a = halfWidth(cos, sin);
      const b = halfWidth(sin, cos);
      if (!a || !b) throw new Error(`${cosName}/${sinName} ${shapeText(cos.shape)} are twice the table's half width but neither cat(c, c) nor repeat_interleave(c, 2)`);
      pair = [{ ...a, dtype: cos.dtype }, { ...b, dtype: sin.dtype }];
    }
    const target = selected;
    const response = await call(`v1/check/onnx?key=${target.key}`, { method: "POST", body: tablesAsModel(pair[0], pair[1], [cosName, sinName]) });
    const result = await response.json();
    out.replaceChildren(el("h3", {}, `Diagnosis of ${cosName} and ${sinName} (posenc-client verify's check)`),
      outcomeLine(result), ...result.caches.map(cacheReport));
  }

  async function compareFile(mine, tensor, out) {
    const exact = selected.outputs[tensor];
    const shape = mine.shape;
    const rowsFirst = exact.shape.length >= 2 && exact.shape.length === shape.length && shape[0] <= exact.shape[0]
      && shape.slice(1).join() === exact.shape.slice(1).join();
    if (!rowsFirst && shape.join() !== exact.shape.join()) {
      let hint = "";
      const a = shape[shape.length - 1];
      const b = exact.shape[exact.shape.length - 1];
      if (a === 2 * b) hint = " The file is twice as wide: a full-width table (cat(c, c)) against a half-width one? Pick the width or profile your runtime uses.";
      if (2 * a === b) hint = " The file is half as wide: a half-width table against a full-width one? Pick the width or profile your runtime uses.";
      throw new Error(`the file's ${shapeText(shape)} does not match the table's ${tensor} ${shapeText(exact.shape)}.${hint}`);
    }
    const rows = shape[0];
    const params = { format: "raw", tensor };
    if (exact.shape.length >= 2 && rows < exact.shape[0]) params.rows = `0:${rows}`;
    const response = await call(tableUrl(selected.key, params));
    const dtype = response.headers.get("X-Posenc-Dtype");
    const buffer = await response.arrayBuffer();
    const want = typed(buffer, 0, buffer.byteLength, dtype);
    const got = mine.values;
    if (got.length !== want.length) throw new Error(`the file holds ${got.length} values, the exact rows ${want.length}`);
    const tol = Math.max(TOLERANCE[dtype] ?? 0, TOLERANCE[mine.dtype] ?? 0);
    const cols = got.length / rows;
    const perRow = new Float64Array(rows);
    let equal = 0;
    let within = 0;
    let worst = -1;
    let worstAt = 0;
    let badRows = 0;
    let firstBad = -1;
    for (let r = 0; r < rows; r += 1) {
      let rowWorst = 0;
      let rowBad = false;
      for (let c = 0; c < cols; c += 1) {
        const i = r * cols + c;
        const d = Math.abs(got[i] - want[i]);
        const bad = !(d <= tol * Math.max(1, Math.abs(want[i])));
        if (d === 0) equal += 1;
        if (!bad) within += 1; else rowBad = true;
        const dd = Number.isNaN(d) ? Infinity : d;
        if (dd > rowWorst) rowWorst = dd;
        if (dd > worst) { worst = dd; worstAt = i; }
      }
      perRow[r] = rowWorst;
      if (rowBad) { badRows += 1; if (firstBad < 0) firstBad = r; }
    }
    const total = got.length;
    const ok = within === total;
    const where = `position ${Math.floor(worstAt / cols)}, element ${worstAt % cols}`;
    const verdict = ok
      ? el("p", { class: "verdict-ok", "data-verdict": "match" }, `✓ Matches: all ${total} values within ${fmt(tol)} (×max(1,|x|)) of the exact ${tensor}; ${equal} bit-identical; largest difference ${fmt(worst)} at ${where}.`)
      : el("p", { class: "verdict-bad", "data-verdict": "departs" }, `✗ Departs from position ${firstBad}: ${total - within} of ${total} values in ${badRows} of ${rows} positions are beyond ${fmt(tol)}; largest difference ${fmt(worst)} at ${where} (file ${fmt(got[worstAt])}, exact ${fmt(want[worstAt])}).`);
    // per-position maximum, pooled to at most 2000 points so long tables stay light
    const pool = Math.max(1, Math.ceil(rows / 2000));
    const xs = [];
    const ys = [];
    for (let r = 0; r < rows; r += pool) {
      let v = 0;
      for (let k = r; k < Math.min(rows, r + pool); k += 1) v = Math.max(v, perRow[k]);
      xs.push(r); ys.push(v);
    }
    const chart = lineChart({ series: [{ name: "max |file − exact|", x: xs, y: ys }], xLabel: "position", yLabel: "max |file − exact|", height: 220,
      hlines: [{ y: tol, label: "tolerance" }], title: "difference per position" });
    out.replaceChildren(verdict, chart,
      el("p", { class: "muted" }, `Compared ${shapeText(shape)} ${mine.dtype} from the file with rows 0–${rows - 1} of ${selected.name}'s ${tensor} (${dtype}).`));
  }

  // --- check: the RoPE caches baked into an ONNX model (POST /v1/check/onnx) -----------------
  // The server finds the caches the model's RotaryEmbedding / GroupQueryAttention nodes read,
  // compares them with the exact table of the selected rope table (half width, the caches' rows
  // and dtype) and diagnoses the departure: posenc-client verify's check, run on the server.
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

  async function checkModel(file, out) {
    if (selected.kind !== "rope") {
      out.replaceChildren(el("p", {}, `${file.name}: an ONNX model's RoPE caches are compared with a rope table; ${selected.name} is ${selected.kind}. Plot a rope table first.`));
      return;
    }
    const target = selected;
    const response = await call(`v1/check/onnx?key=${target.key}`, { method: "POST", body: file.model });
    const result = await response.json();
    const unchecked = result.caches.filter((r) => r.verdict === "not_checkable").length;
    const parts = [el("p", {}, el("strong", {}, file.name), ` against ${target.name} (key ${target.key.slice(0, 12)}…): ${result.caches.length} report${result.caches.length === 1 ? "" : "s"}, ${unchecked} not checkable.`),
      outcomeLine(result)];
    for (const r of result.caches) parts.push(cacheReport(r));
    if (result.external.length) {
      parts.push(el("p", { class: "muted", "data-external": "true" },
        `Not read: ${result.external.map((e) => `${e.name} (in ${e.location})`).join(", ")}. Caches stored in external data stay with the weights, which are never sent; posenc-client verify reads them locally.`));
    }
    out.replaceChildren(...parts);
  }

  function cacheReport(r) {
    const where = `${r.name}${r.side ? ` (${r.side} side of the length switch)` : ""}`;
    const ok = r.verdict === "exact";
    const verdict = el("p", { class: ok ? "verdict-ok" : r.verdict === "placeholder" ? "" : "verdict-bad", "data-verdict": r.verdict },
      `${where}: ${VERDICTS[r.verdict] || r.verdict}`);
    if (r.verdict === "not_checkable") {
      return el("div", { class: "cache-report", "data-cache": r.name }, verdict,
        el("dl", {}, el("dt", {}, "read by"), el("dd", {}, r.nodes.join(", "))),
        el("ul", { class: "diagnosis" }, r.diagnosis.map((d) => el("li", {}, d))));
    }
    const facts = el("dl", {},
      el("dt", {}, "site"), el("dd", {}, r.kind),
      el("dt", {}, "read by"), el("dd", {}, r.nodes.join(", ")),
      el("dt", {}, "cache"), el("dd", {}, `${shapeText(r.shape)} ${r.dtype}; ${r.rows} rows compared`),
      el("dt", {}, "largest error"), el("dd", {}, r.max_abs === null ? "not comparable (another width)" : `${fmt(r.max_abs)} (${r.max_ulp} ulp)`),
      el("dt", {}, "first departs"), el("dd", {}, r.first ? `position ${r.first[0]}, column ${r.first[1]}` : "nowhere"));
    const parts = [verdict, facts];
    if (r.diagnosis.length) parts.push(el("ul", { class: "diagnosis" }, r.diagnosis.map((d) => el("li", {}, d))));
    if (r.map && !ok) {
      const m = r.map;
      const rows = m.data.length;
      const cols = rows ? m.data[0].length : 0;
      const matrix = {
        rows, cols, data: Float64Array.from(m.data.flat()),
        rowIndex: (k) => k * m.row_step, colIndex: (k) => k * m.col_step, rowStep: m.row_step,
        rowName: "position", colName: "column",
      };
      const block = m.row_step > 1 || m.col_step > 1 ? ` Each cell is the largest difference over ${m.row_step} position${m.row_step > 1 ? "s" : ""} × ${m.col_step} column${m.col_step > 1 ? "s" : ""}.` : "";
      parts.push(heatmap(matrix, { title: `|${r.name} − exact|`, caption: `|model − exact| of ${where}.${block}` }));
    }
    return el("div", { class: "cache-report", "data-cache": r.name }, ...parts);
  }

  // --- start ----------------------------------------------------------------------------
  function bind() {
    $("#api-key").value = apiKey;
    // every user action starts with a clean error box (capture: before the action's handler)
    for (const type of ["submit", "change", "drop"]) document.addEventListener(type, clearError, true);
    document.addEventListener("click", (ev) => { if (ev.target.closest("button, a")) clearError(); }, true);
    $("#key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      apiKey = $("#api-key").value.trim();
      if (apiKey) sessionStorage.setItem("posenc-api-key", apiKey); else sessionStorage.removeItem("posenc-api-key");
      start();
    });
    $("#preset-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const name = $("#preset").value;
      if (!name) { showError(new Error("choose a model in the list first")); return; }
      working(`Loading ${name}`, () => showPreset(name));
    });
    $("#config-form").addEventListener("submit", (ev) => { ev.preventDefault(); working("Resolving the config", resolveConfig); });
    const drop = $("#drop");
    drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (ev) => {
      ev.preventDefault();
      drop.classList.remove("over");
      checkWorking("Reading the file", () => onFile(ev.dataTransfer.files[0]));
    });
    $("#check-file").addEventListener("change", (ev) => checkWorking("Reading the file", () => onFile(ev.target.files[0])));
  }

  function start() {
    working("Connecting", async () => {
      const version = await getJSON("v1/version");
      const refs = Object.entries(version.verified_against || {}).slice(0, 3).map(([k, v]) => `${k} ${v}`).join(", ");
      $("#server-version").textContent = `posenc ${version.posenc}${refs ? ` · verified against ${refs}` : ""}`;
      await loadPresets();
    });
  }

  bind();
  start();
})();
