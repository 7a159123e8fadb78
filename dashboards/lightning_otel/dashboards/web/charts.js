// Inline SVG charts and small DOM helpers, written for this page (no chart library, no network).

const SVG_NS = "http://www.w3.org/2000/svg";
const MARGIN = { top: 12, right: 14, bottom: 34, left: 56 };

export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** Numbers for people: integers grouped, others to 4 significant digits; null as an em dash. */
export function fmt(value, digits = 4) {
  if (value === null || value === undefined || value === "") return "—";
  const x = Number(value);
  if (!Number.isFinite(x)) return String(value);
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return Math.abs(x) >= 1e5 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(2) : String(Number(x.toPrecision(digits)));
}

export const pct = (x) => (x === null || x === undefined || !Number.isFinite(Number(x)) ? "—" : `${(100 * x).toFixed(1)}%`);

/** An element from an HTML string (the caller escapes data with esc()). */
export function html(markup) {
  const template = document.createElement("template");
  template.innerHTML = markup.trim();
  return template.content.firstElementChild;
}

export function section(title, note = "") {
  return html(`<section class="card"><h2>${esc(title)}</h2>${note ? `<p class="note">${note}</p>` : ""}</section>`);
}

/** A table from rows of objects; `columns` is [[key, header, format?]]; rowAttrs(row) adds data attributes. */
export function table(rows, columns, { rowAttrs = () => ({}), className = "" } = {}) {
  const head = columns.map(([, header]) => `<th>${esc(header)}</th>`).join("");
  const body = rows.map((row) => {
    const attrs = Object.entries(rowAttrs(row)).map(([k, v]) => ` ${k}="${esc(v)}"`).join("");
    const cells = columns.map(([key, , format]) => `<td data-col="${esc(key)}">${format ? format(row[key], row) : esc(fmt(row[key]))}</td>`);
    return `<tr${attrs}>${cells.join("")}</tr>`;
  });
  return html(`<table class="grid ${className}"><thead><tr>${head}</tr></thead><tbody>${body.join("")}</tbody></table>`);
}

/** About n round tick values covering [lo, hi]. */
export function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) [lo, hi] = [lo - 1, hi + 1];
  const rough = (hi - lo) / n;
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const r = rough / magnitude;
  const step = (r >= 7 ? 10 : r >= 3 ? 5 : r >= 1.5 ? 2 : 1) * magnitude;
  // Each tick from an integer multiple (no accumulated error), so zero is 0, not -3e-24.
  const ticks = [];
  for (let k = Math.floor(lo / step + 1e-9); ; k++) {
    ticks.push(Number((k * step).toPrecision(12)));
    if (k * step >= hi - step * 1e-9) return ticks;
  }
}

const clockTime = (seconds) => new Date(seconds * 1000).toLocaleTimeString("en-GB", { hour12: false });

function frame(width, height, xTicks, yTicks, sx, sy, { xFormat = fmt, xLabel = "", yLabel = "", xTickLabels = null } = {}) {
  const [x0, x1, y0, y1] = [MARGIN.left, width - MARGIN.right, MARGIN.top, height - MARGIN.bottom];
  const parts = [`<line class="axis" x1="${x0}" y1="${y1}" x2="${x1}" y2="${y1}"/>`, `<line class="axis" x1="${x0}" y1="${y0}" x2="${x0}" y2="${y1}"/>`];
  for (const t of yTicks) {
    parts.push(`<line class="gridline" x1="${x0}" x2="${x1}" y1="${sy(t)}" y2="${sy(t)}"/>`);
    parts.push(`<text class="tick" x="${x0 - 6}" y="${sy(t) + 4}" text-anchor="end">${esc(fmt(t, 3))}</text>`);
  }
  xTicks.forEach((t, i) => {
    const label = xTickLabels ? xTickLabels[i] : xFormat(t);
    parts.push(`<text class="tick" x="${sx(t)}" y="${y1 + 15}" text-anchor="middle">${esc(label)}</text>`);
  });
  if (xLabel) parts.push(`<text class="axis-label" x="${(x0 + x1) / 2}" y="${height - 3}" text-anchor="middle">${esc(xLabel)}</text>`);
  if (yLabel) parts.push(`<text class="axis-label" x="12" y="${(y0 + y1) / 2}" text-anchor="middle" transform="rotate(-90 12 ${(y0 + y1) / 2})">${esc(yLabel)}</text>`);
  return parts.join("");
}

const attrText = (attrs = {}) => Object.entries(attrs).map(([k, v]) => ` ${k}="${esc(v)}"`).join("");

/**
 * Lines with a dot per point. series: [{name, points: [{x, y, title?, attrs?}]}]; points with
 * a null y are left out. xTime: x is epoch seconds, ticks show clock time.
 */
export function lineChart(series, { width = 560, height = 220, xLabel = "", yLabel = "", xTime = false, integerX = false, zeroY = false, testid = "" } = {}) {
  const all = series.flatMap((s) => s.points.filter((p) => p.y !== null && p.y !== undefined && Number.isFinite(Number(p.y))));
  if (all.length === 0) return html(`<p class="empty">no data</p>`);
  const xs = all.map((p) => Number(p.x));
  const ys = all.map((p) => Number(p.y));
  let [xlo, xhi] = [Math.min(...xs), Math.max(...xs)];
  if (xlo === xhi) [xlo, xhi] = [xlo - 1, xhi + 1];
  const yTicks = niceTicks(zeroY ? Math.min(0, ...ys) : Math.min(...ys), Math.max(...ys), 4);
  const [ylo, yhi] = [yTicks[0], yTicks[yTicks.length - 1]];
  const sx = (x) => MARGIN.left + ((x - xlo) / (xhi - xlo)) * (width - MARGIN.left - MARGIN.right);
  const sy = (y) => height - MARGIN.bottom - ((y - ylo) / (yhi - ylo || 1)) * (height - MARGIN.top - MARGIN.bottom);
  let xTicks = niceTicks(xlo, xhi, 6).filter((t) => t >= xlo && t <= xhi);
  if (integerX) xTicks = xTicks.filter(Number.isInteger);
  const parts = [frame(width, height, xTicks, yTicks, sx, sy, { xFormat: xTime ? clockTime : fmt, xLabel, yLabel })];
  series.forEach((s, i) => {
    const points = s.points.filter((p) => p.y !== null && p.y !== undefined && Number.isFinite(Number(p.y)));
    const path = points.map((p) => `${sx(Number(p.x)).toFixed(1)},${sy(Number(p.y)).toFixed(1)}`).join(" ");
    parts.push(`<polyline class="line series-${i}" points="${path}"/>`);
    if (points.length <= 200) {
      for (const p of points) {
        parts.push(`<circle class="dot series-${i}" cx="${sx(Number(p.x)).toFixed(1)}" cy="${sy(Number(p.y)).toFixed(1)}" r="3"${attrText(p.attrs)}>` +
          `<title>${esc(p.title ?? `${s.name}: ${fmt(p.y)}`)}</title></circle>`);
      }
    }
  });
  const legend = series.length > 1 ? `<div class="legend">${series.map((s, i) => `<span class="key series-${i}">${esc(s.name)}</span>`).join("")}</div>` : "";
  return html(`<figure class="chart"${testid ? ` data-testid="${esc(testid)}"` : ""}><svg xmlns="${SVG_NS}" viewBox="0 0 ${width} ${height}" width="100%" role="img">${parts.join("")}</svg>${legend}</figure>`);
}

/** Vertical bars with a label under each. bars: [{label, value, title?, attrs?}]. */
export function barChart(bars, { width = 560, height = 200, xLabel = "", yLabel = "", testid = "" } = {}) {
  if (bars.length === 0) return html(`<p class="empty">no data</p>`);
  const values = bars.map((b) => Number(b.value) || 0);
  const yTicks = niceTicks(Math.min(0, ...values), Math.max(...values, 1e-9), 4);
  const [ylo, yhi] = [yTicks[0], yTicks[yTicks.length - 1]];
  const inner = width - MARGIN.left - MARGIN.right;
  const slot = inner / bars.length;
  const sx = (i) => MARGIN.left + slot * (i + 0.5);
  const sy = (y) => height - MARGIN.bottom - ((y - ylo) / (yhi - ylo || 1)) * (height - MARGIN.top - MARGIN.bottom);
  const every = Math.ceil(bars.length / 16); // keep labels from overlapping
  const xTicks = bars.map((_, i) => i).filter((i) => i % every === 0);
  const parts = [frame(width, height, xTicks, yTicks, sx, sy, { xLabel, yLabel, xTickLabels: xTicks.map((i) => bars[i].label) })];
  bars.forEach((b, i) => {
    const v = Number(b.value) || 0;
    const [top, bottom] = [sy(Math.max(v, 0)), sy(Math.min(v, 0))];
    parts.push(`<rect class="bar" x="${(sx(i) - slot * 0.38).toFixed(1)}" width="${(slot * 0.76).toFixed(1)}" y="${top.toFixed(1)}" height="${Math.max(bottom - top, 0.5).toFixed(1)}"${attrText(b.attrs)}>` +
      `<title>${esc(b.title ?? `${b.label}: ${fmt(b.value)}`)}</title></rect>`);
  });
  return html(`<figure class="chart"${testid ? ` data-testid="${esc(testid)}"` : ""}><svg xmlns="${SVG_NS}" viewBox="0 0 ${width} ${height}" width="100%" role="img">${parts.join("")}</svg></figure>`);
}

/** A horizontal bar inside a table cell, `value` of `max`. */
export function cellBar(value, max, className = "") {
  const width = max > 0 ? Math.max(0, Math.min(100, (100 * Number(value)) / max)) : 0;
  return `<span class="cell-bar ${className}"><span style="width:${width.toFixed(1)}%"></span></span>`;
}
