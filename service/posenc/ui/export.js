// PNG, SVG and CSV export of a plot, named after the model, the table and the plot.
import { session } from "./api.js";
import { el, safeName, saveBlob } from "./dom.js";

// "<model>_<table>[_<what>]": the model's slug (preset name or config's model type), the table
// (the one plotted unless named).
export function fileBase(what, table = session.selected?.name || "table") {
  const model = session.model?.slug || "model";
  return [model, table, what].filter(Boolean).map(safeName).join("_");
}

const SVG_STYLE =
  "text{font-family:system-ui,'DejaVu Sans',sans-serif;font-size:11px;fill:#1b1b1b}" + ".grid{stroke:#e3e3e3}";

function svgText(root) {
  const copy = root.cloneNode(true);
  copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  const style = document.createElementNS("http://www.w3.org/2000/svg", "style");
  style.textContent = SVG_STYLE;
  copy.prepend(style);
  return new XMLSerializer().serializeToString(copy);
}

async function svgToPng(root) {
  const url = URL.createObjectURL(new Blob([svgText(root)], { type: "image/svg+xml" }));
  try {
    const image = new Image();
    image.src = url;
    await image.decode();
    const canvas = el("canvas", { width: root.width.baseVal.value * 2, height: root.height.baseVal.value * 2 });
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
    return await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  } finally {
    URL.revokeObjectURL(url);
  }
}

const csvCell = (v) => (typeof v === "string" && /[",\n]/.test(v) ? `"${v.replace(/"/g, '""')}"` : String(v));
export const csvText = (rows) => `${rows.map((r) => r.map(csvCell).join(",")).join("\n")}\n`;

// Buttons saving `figure`'s plot (its canvas or svg) as PNG, the svg as SVG, and `csvRows()` as
// CSV; `what` names the plot in the file names.
export function exportControls(figure, what, csvRows) {
  const base = () => fileBase(what);
  const pngButton = el(
    "button",
    {
      type: "button",
      class: "secondary export",
      "data-export": "png",
      onclick: async () => {
        const canvas = figure.querySelector("canvas");
        const root = figure.querySelector("svg[role=img]");
        const blob = canvas
          ? await new Promise((resolve) => canvas.toBlob(resolve, "image/png"))
          : await svgToPng(root);
        saveBlob(blob, `${base()}.png`);
      },
    },
    "PNG",
  );
  const buttons = [pngButton];
  if (figure.querySelector("svg[role=img]") && !figure.querySelector("canvas")) {
    buttons.push(
      el(
        "button",
        {
          type: "button",
          class: "secondary export",
          "data-export": "svg",
          onclick: () =>
            saveBlob(
              new Blob([svgText(figure.querySelector("svg[role=img]"))], { type: "image/svg+xml" }),
              `${base()}.svg`,
            ),
        },
        "SVG",
      ),
    );
  }
  if (csvRows) {
    buttons.push(
      el(
        "button",
        {
          type: "button",
          class: "secondary export",
          "data-export": "csv",
          onclick: () => saveBlob(new Blob([csvText(csvRows())], { type: "text/csv" }), `${base()}.csv`),
        },
        "CSV",
      ),
    );
  }
  return el("div", { class: "controls exports", "aria-label": `export ${what}` }, "Export: ", buttons);
}
