// Line charts in SVG, round ticks, value tables and plot panels.
import { el, fmt, svg } from "./dom.js";
import { exportControls } from "./export.js";

export const SERIES = [
  { color: "#0b5cad", dash: "" },
  { color: "#c2410c", dash: "7 4" },
  { color: "#1d6b2f", dash: "2 3" },
  { color: "#7e22ce", dash: "10 3 2 3" },
  { color: "#4b5563", dash: "4 2" },
  { color: "#b91c1c", dash: "1 5" },
  { color: "#0e7490", dash: "12 4" },
  { color: "#a16207", dash: "6 2 2 2 2 2" },
];

// Round tick values (1, 2, 5 times a power of ten) inside [lo, hi].
export function niceTicks(lo, hi, count) {
  if (!(hi > lo) || !Number.isFinite(hi - lo)) return Number.isFinite(lo) ? [lo] : [];
  const raw = (hi - lo) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw) || 10 * power;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
  return out;
}

// The y range: the data's, widened to hold `include` and to span at least 1% of its magnitude
// (a constant ratio's float32 noise is drawn flat, not blown up to the axis' height).
function yRange(ys, include, logY) {
  const tf = logY ? Math.log10 : (v) => v;
  const all = ys.concat(include.filter((v) => Number.isFinite(v) && (!logY || v > 0)));
  let y0 = tf(Math.min(...all));
  let y1 = tf(Math.max(...all));
  const magnitude = Math.max(Math.abs(y0), Math.abs(y1));
  const floor = logY ? 0.02 : 0.01 * magnitude;
  if (y1 - y0 < floor || y0 === y1) {
    const mid = (y0 + y1) / 2;
    const half = Math.max(floor, 1e-12) / 2 || 1;
    y0 = mid - half;
    y1 = mid + half;
  }
  const pad = (y1 - y0) * 0.05;
  return [y0 - pad, y1 + pad, tf];
}

// series: [{name, x: [], y: []}]; hlines: [{y, label}]; bands: [{x0, x1, label}]; yInclude:
// values the y axis must show (1 for a ratio); name: the plot's name in exported file names.
export function lineChart(options) {
  const { series, xLabel, yLabel, logY = false, hlines = [], bands = [], yInclude = [] } = options;
  const { title, markers = false, width = 720, height = 280, name } = options;
  const m = { l: 70, r: 16, t: 12, b: 40 };
  const W = width - m.l - m.r;
  const H = height - m.t - m.b;
  const xs = series.flatMap((s) => s.x);
  const ys = series
    .flatMap((s) => s.y)
    .concat(hlines.map((h) => h.y))
    .filter((v) => Number.isFinite(v) && (!logY || v > 0));
  let x0 = Math.min(...xs);
  let x1 = Math.max(...xs);
  if (x0 === x1) {
    x0 -= 1;
    x1 += 1;
  }
  const [y0, y1, tf] = yRange(ys, yInclude, logY);
  const X = (v) => m.l + ((v - x0) / (x1 - x0)) * W;
  const Y = (v) => m.t + H - ((tf(v) - y0) / (y1 - y0)) * H;
  const root = svg("svg", {
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": title || yLabel,
  });
  root.append(svg("title", {}, title || yLabel));
  for (const band of bands) {
    const w = Math.max(2, X(band.x1) - X(band.x0));
    root.append(
      svg("rect", {
        class: "band",
        x: X(band.x0),
        y: m.t,
        width: w,
        height: H,
        fill: "#f1e3b5",
        stroke: "#a16207",
        "stroke-dasharray": "3 3",
      }),
    );
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
    root.append(svg("text", { class: "ytick", x: m.l - 6, y: py + 4, "text-anchor": "end" }, fmt(ty)));
  }
  for (const tx of niceTicks(x0, x1, 8)) {
    root.append(svg("line", { class: "grid", x1: X(tx), x2: X(tx), y1: m.t, y2: m.t + H }));
    root.append(svg("text", { class: "xtick", x: X(tx), y: m.t + H + 15, "text-anchor": "middle" }, fmt(tx)));
  }
  root.append(svg("rect", { x: m.l, y: m.t, width: W, height: H, fill: "none", stroke: "#444" }));
  root.append(svg("text", { x: m.l + W / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
  const yMid = m.t + H / 2;
  root.append(
    svg(
      "text",
      { x: 14, y: yMid, transform: `rotate(-90 14 ${yMid})`, "text-anchor": "middle" },
      yLabel + (logY ? " (log scale)" : ""),
    ),
  );
  for (const h of hlines) {
    if (logY && h.y <= 0) continue;
    root.append(
      svg("line", { x1: m.l, x2: m.l + W, y1: Y(h.y), y2: Y(h.y), stroke: "#111", "stroke-dasharray": "8 4 1 4" }),
    );
    root.append(
      svg("text", { class: "hline", x: m.l + W - 4, y: Y(h.y) - 4, "text-anchor": "end" }, `${h.label}: ${fmt(h.y)}`),
    );
  }
  const shown = (y) => Number.isFinite(y) && (!logY || y > 0);
  series.forEach((s, i) => {
    const style = SERIES[i % SERIES.length];
    const pts = [];
    s.x.forEach((x, k) => {
      if (shown(s.y[k])) pts.push(`${X(x).toFixed(1)},${Y(s.y[k]).toFixed(1)}`);
    });
    root.append(
      svg("polyline", {
        "data-series": s.name,
        points: pts.join(" "),
        fill: "none",
        stroke: style.color,
        "stroke-width": 2,
        "stroke-dasharray": style.dash,
      }),
    );
    if (!markers) return;
    s.x.forEach((x, k) => {
      const y = s.y[k];
      if (shown(y))
        root.append(
          svg(
            "circle",
            { cx: X(x), cy: Y(y), r: 2.5, fill: style.color },
            svg("title", {}, `${s.name}: ${fmt(x)} → ${fmt(y)}`),
          ),
        );
    });
  });
  const legend = el("ul", { class: "legend", "aria-label": "legend" });
  series.forEach((s, i) => {
    const style = SERIES[i % SERIES.length];
    const sample = svg(
      "svg",
      { width: 34, height: 10, "aria-hidden": "true" },
      svg("line", {
        x1: 0,
        x2: 34,
        y1: 5,
        y2: 5,
        stroke: style.color,
        "stroke-width": 2,
        "stroke-dasharray": style.dash,
      }),
    );
    legend.append(el("li", {}, sample, ` ${s.name}`));
  });
  const figure = el("figure", {}, root, series.length > 1 ? legend : null);
  const csv = () => [["series", xLabel, yLabel], ...series.flatMap((s) => s.x.map((x, k) => [s.name, x, s.y[k]]))];
  figure.append(exportControls(figure, name || title || yLabel, csv));
  return figure;
}

export function valuesTable(headers, rows, summary) {
  return el(
    "details",
    {},
    el("summary", {}, summary || "values as a table"),
    el(
      "table",
      { class: "values" },
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          headers.map((h) => el("th", { scope: "col" }, h)),
        ),
      ),
      el(
        "tbody",
        {},
        rows.map((r) =>
          el(
            "tr",
            {},
            r.map((v) => el("td", {}, typeof v === "number" ? fmt(v) : v)),
          ),
        ),
      ),
    ),
  );
}

export function panel(title, ...body) {
  return el("div", { class: "plot" }, el("h4", {}, title), ...body);
}
