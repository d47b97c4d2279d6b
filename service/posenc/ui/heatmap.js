// Heatmaps on canvas: viridis (lightness rises monotonically: readable in grey too), a colour
// bar whose middle is 0 when the values have both signs, a keyboard cursor reading values out,
// and a drag that picks a row range.
import { niceTicks } from "./chart.js";
import { el, fmt } from "./dom.js";
import { exportControls } from "./export.js";

export const VIRIDIS = (() => {
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

export const isMasked = (v) => !Number.isFinite(v) || Math.abs(v) >= 1e30;

// The colour scale of values in [lo, hi]: symmetric about 0 when they have both signs.
export function colourScale(lo, hi) {
  if (lo < 0 && hi > 0) {
    const m = Math.max(-lo, hi);
    return { lo: -m, hi: m, mid: 0 };
  }
  return { lo, hi, mid: (lo + hi) / 2 };
}

function extent(data) {
  const out = { lo: Infinity, hi: -Infinity, loAt: 0, hiAt: 0, masked: 0 };
  for (let i = 0; i < data.length; i += 1) {
    const v = data[i];
    if (isMasked(v)) {
      out.masked += 1;
    } else {
      if (v < out.lo) [out.lo, out.loAt] = [v, i];
      if (v > out.hi) [out.hi, out.hiAt] = [v, i];
    }
  }
  return out;
}

function paint(data, rows, cols, scale) {
  const image = document.createElement("canvas");
  image.width = cols;
  image.height = rows;
  const ictx = image.getContext("2d");
  const pixels = ictx.createImageData(cols, rows);
  const span = scale.hi - scale.lo || 1;
  for (let i = 0; i < data.length; i += 1) {
    if (isMasked(data[i])) {
      pixels.data.set([226, 226, 226, 255], i * 4);
      continue;
    }
    const level = Math.round(((data[i] - scale.lo) / span) * 255) * 3;
    pixels.data.set([VIRIDIS[level], VIRIDIS[level + 1], VIRIDIS[level + 2], 255], i * 4);
  }
  ictx.putImageData(pixels, 0, 0);
  return image;
}

const LAYOUT = { left: 64, top: 8, bottom: 36, right: 100 };

// matrix: {rows, cols, data (row-major), rowIndex(i), colIndex(j), rowStep, rowName, colName}
export function heatmap(matrix, { caption, title, onRange, name } = {}) {
  const { rows, cols, data } = matrix;
  const { lo, hi, loAt, hiAt, masked } = extent(data);
  const scale = colourScale(lo, hi);
  const { left, top, bottom, right } = LAYOUT;
  const plotW = Math.max(120, Math.min(720, cols * Math.max(1, Math.floor(720 / cols))));
  const plotH = Math.max(80, Math.min(360, rows * Math.max(1, Math.floor(360 / rows))));
  const canvas = el("canvas", {
    width: left + plotW + right,
    height: top + plotH + bottom,
    tabindex: 0,
    role: "img",
    "data-scale": `${scale.lo},${scale.mid},${scale.hi}`,
    "aria-label": `${title || "heatmap"}: ${rows} by ${cols} values from ${fmt(lo)} to ${fmt(hi)}; arrow keys move a cursor whose value is read out below`,
  });
  const image = paint(data, rows, cols, scale);
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
  function axes(ctx) {
    ctx.fillStyle = "#1b1b1b";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    // round index values, placed at the row or column that holds them
    const rowFirst = matrix.rowIndex(0);
    for (const v of niceTicks(rowFirst, matrix.rowIndex(rows - 1), 5)) {
      const y = top + (((v - rowFirst) / matrix.rowStep + 0.5) / rows) * plotH;
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
  }
  function colourBar(ctx) {
    const barX = left + plotW + 12;
    for (let y = 0; y < plotH; y += 1) {
      const level = Math.round((1 - y / (plotH - 1)) * 255) * 3;
      ctx.fillStyle = `rgb(${VIRIDIS[level]},${VIRIDIS[level + 1]},${VIRIDIS[level + 2]})`;
      ctx.fillRect(barX, top + y, 14, 1);
    }
    ctx.fillStyle = "#1b1b1b";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(fmt(scale.hi), barX + 18, top + 5);
    ctx.fillText(fmt(scale.mid), barX + 18, top + plotH / 2);
    ctx.fillText(fmt(scale.lo), barX + 18, top + plotH - 5);
  }
  function draw() {
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(image, left, top, plotW, plotH);
    ctx.strokeStyle = "#444";
    ctx.strokeRect(left - 0.5, top - 0.5, plotW + 1, plotH + 1);
    axes(ctx);
    colourBar(ctx);
    if (drag && drag.to !== null) {
      const a = Math.min(drag.from, drag.to);
      const b = Math.max(drag.from, drag.to);
      ctx.strokeStyle = "#e8a200";
      ctx.lineWidth = 2;
      ctx.strokeRect(left, top + (a / rows) * plotH, plotW, ((b - a + 1) / rows) * plotH);
      ctx.lineWidth = 1;
    }
    if (cursor.r >= 0) {
      const w = Math.max(3, plotW / cols);
      const h = Math.max(3, plotH / rows);
      const x = left + (cursor.c / cols) * plotW;
      const y = top + (cursor.r / rows) * plotH;
      ctx.strokeStyle = "#fff";
      ctx.lineWidth = 2;
      ctx.strokeRect(x, y, w, h);
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 1;
      ctx.strokeRect(x - 1, y - 1, w + 2, h + 2);
    }
  }
  const label = (r, c) => `${matrix.rowName} ${fmt(matrix.rowIndex(r))}, ${matrix.colName} ${fmt(matrix.colIndex(c))}`;
  function point(r, c) {
    cursor.r = Math.max(0, Math.min(rows - 1, r));
    cursor.c = Math.max(0, Math.min(cols - 1, c));
    const v = data[cursor.r * cols + cursor.c];
    readout.textContent = `${label(cursor.r, cursor.c)}: ${isMasked(v) ? `masked (${fmt(v)})` : fmt(v)}`;
    draw();
  }
  canvas.addEventListener("focus", () => {
    if (cursor.r < 0) point(0, 0);
  });
  canvas.addEventListener("keydown", (ev) => {
    const page = Math.ceil(rows / 10);
    const moves = {
      ArrowUp: [-1, 0],
      ArrowDown: [1, 0],
      ArrowLeft: [0, -1],
      ArrowRight: [0, 1],
      PageUp: [-page, 0],
      PageDown: [page, 0],
    };
    const move = moves[ev.key];
    if (!move) return;
    ev.preventDefault();
    point(cursor.r < 0 ? 0 : cursor.r + move[0], cursor.c < 0 ? 0 : cursor.c + move[1]);
  });
  canvas.addEventListener("mousemove", (ev) => {
    const cell = cellAt(ev);
    if (!cell) return;
    if (drag) drag.to = cell.r;
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
      if (!chosen || chosen.to === null || chosen.to === chosen.from) {
        draw();
        return;
      }
      const a = Math.min(chosen.from, chosen.to);
      const b = Math.max(chosen.from, chosen.to);
      onRange(matrix.rowIndex(a), matrix.rowIndex(b) + matrix.rowStep);
    });
  }
  canvas.addEventListener("mouseleave", () => {
    if (!drag) {
      cursor.r = -1;
      draw();
    }
  });
  draw();
  const where = (at) => label(Math.floor(at / cols), at % cols);
  const figure = el(
    "figure",
    {},
    el("div", { class: "heat" }, canvas),
    readout,
    el(
      "figcaption",
      {},
      caption ? `${caption} ` : "",
      masked ? `${masked} masked entries (at or beyond ±1e30) are drawn light grey and left out of the scale. ` : "",
      `Minimum ${fmt(lo)} at ${where(loAt)}; maximum ${fmt(hi)} at ${where(hiAt)}. `,
      el(
        "span",
        { class: "scale" },
        `Colour scale ${fmt(scale.lo)} to ${fmt(scale.hi)}, ${fmt(scale.mid)} at its middle.`,
      ),
    ),
  );
  const csv = () => {
    const out = [
      [`${matrix.rowName} \\ ${matrix.colName}`, ...Array.from({ length: cols }, (_, c) => matrix.colIndex(c))],
    ];
    for (let r = 0; r < rows; r += 1) out.push([matrix.rowIndex(r), ...data.slice(r * cols, (r + 1) * cols)]);
    return out;
  };
  figure.append(exportControls(figure, name || title || "heatmap", csv));
  return figure;
}
