// Small SVG line charts: lineChart(title, series, {xLabel, step}) -> <div class="chart">.
// series: [{name, points: [[x, y], ...]}]; nulls are skipped. No dependencies.
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// Enough digits to tell ticks `range` apart (entropy 4.0912 vs 4.0915 must not both read 4.09).
function fmtTick(v, range) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-4) return v.toExponential(2);
  const digits = range ? Math.max(0, Math.min(6, 2 - Math.floor(Math.log10(range)))) : 3;
  return String(+v.toFixed(digits));
}

function lineChart(title, series, opts) {
  opts = opts || {};
  const W = 380, H = 200, L = 48, R = 10, T = 22, B = 30;
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.title = title;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": title });
  svg.appendChild(svgEl("text", { x: L, y: 14, class: "title" }, title));
  const pts = series.flatMap(s => s.points).filter(p => p[1] !== null && p[1] !== undefined && isFinite(p[1]));
  if (!pts.length) {
    svg.appendChild(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data"));
    box.appendChild(svg);
    return box;
  }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1])), Math.max(...pts.map(p => p[1]))];
  if (opts.unit && y0 >= 0 && y1 <= 1) { y0 = 0; y1 = 1; }
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#c5cad3" }));
  svg.appendChild(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#c5cad3" }));
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    svg.appendChild(svgEl("line", { x1: L, y1: sy(y), x2: W - R, y2: sy(y), stroke: "#eef0f3" }));
    svg.appendChild(svgEl("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" }, fmtTick(y, y1 - y0)));
  }
  const xfmt = opts.xFormat || (x => fmtTick(x, x1 - x0));
  for (const x of [x0, (x0 + x1) / 2, x1]) {
    svg.appendChild(svgEl("text", { x: sx(x), y: H - B + 14, "text-anchor": "middle" }, xfmt(x)));
  }
  svg.appendChild(svgEl("text", { x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle" }, opts.xLabel || "step"));
  series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const good = s.points.filter(p => p[1] !== null && p[1] !== undefined && isFinite(p[1]));
    if (!good.length) return;
    const d = good.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
    const path = svgEl("path", { d, fill: "none", stroke: color, "stroke-width": 1.8 });
    if (opts.step) path.setAttribute("d", stepPath(good, sx, sy));
    svg.appendChild(path);
    if (good.length <= 60) {
      for (const p of good) {
        const dot = svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: color });
        dot.appendChild(svgEl("title", {}, `${s.name}: ${xfmt(p[0])} → ${fmtTick(p[1])}`));
        svg.appendChild(dot);
      }
    }
    if (series.length > 1) {
      svg.appendChild(svgEl("rect", { x: W - R - 110, y: T + 2 + i * 13, width: 8, height: 8, fill: color }));
      svg.appendChild(svgEl("text", { x: W - R - 98, y: T + 10 + i * 13 }, s.name));
    }
  });
  box.appendChild(svg);
  return box;
}

function stepPath(points, sx, sy) {
  let d = `M${sx(points[0][0])} ${sy(points[0][1])}`;
  for (let i = 1; i < points.length; i++) d += ` H${sx(points[i][0])} V${sy(points[i][1])}`;
  return d;
}

window.lineChart = lineChart;
