/* A small SVG line chart for the sample series the API serves (no library): time on x over the
   last `ageMs`, values on y from 0, a legend whose entries carry the newest value (data-value). */
"use strict";
(() => {
  const W = 600, H = 190, L = 48, R = 10, T = 10, B = 22;
  const COLORS = ["#c5501b", "#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#17becf"];
  const NS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs) => {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  };
  const nice = (max) => {
    if (max <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(max)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= max) return m * p;
    return 10 * p;
  };
  const short = (v) => (v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e4 ? (v / 1e3).toFixed(0) + "k"
    : v >= 1000 ? (v / 1e3).toFixed(1) + "k" : Number.isInteger(v) ? String(v) : v.toFixed(1));

  /* Rates per second from a counter's samples (newest first): one point per pair of samples. */
  EB.ratesFrom = (details) => {
    const samples = (details && details.samples) || [];
    const out = [];
    for (let i = 0; i + 1 < samples.length; i += 1) {
      const a = samples[i], b = samples[i + 1];
      const dt = a.timestamp - b.timestamp;
      if (dt > 0) out.push([a.timestamp, Math.max(0, ((a.sample - b.sample) * 1000) / dt)]);
    }
    return out;
  };
  EB.pointsFrom = (details) => ((details && details.samples) || []).map((x) => [x.timestamp, x.sample]);

  /* chart(title, [{name, points: [[ts, v], ...], current, format}], {ageMs, id}) -> element */
  EB.chart = (title, series, opts) => {
    opts = opts || {};
    const all = series.flatMap((x) => x.points);
    const now = all.length ? Math.max(...all.map((p) => p[0])) : Date.now();
    const oldest = all.length ? Math.min(...all.map((p) => p[0])) : now;
    // the last 10 minutes, or less while the broker has not kept that much yet (at least 1 minute)
    const ageMs = Math.min(opts.ageMs || 600000, Math.max(60000, now - oldest));
    const t0 = now - ageMs;
    const top = Math.max(4, nice(Math.max(0, ...all.map((p) => p[1]))));
    const x = (t) => L + ((t - t0) / ageMs) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
    for (let i = 0; i <= 4; i += 1) {
      const v = (top * i) / 4;
      svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      const label = s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" });
      label.textContent = short(v);
      svg.append(label);
    }
    const step = [10, 15, 30, 60, 120, 300].find((sec) => ageMs / 1000 / sec <= 6) * 1000;
    for (let ago = 0; ago <= ageMs; ago += step) {
      const label = s("text", { x: x(now - ago), y: H - 6, "text-anchor": ago === 0 ? "end" : "middle" });
      label.textContent = ago === 0 ? "now" : ago % 60000 === 0 ? "-" + ago / 60000 + "m" : "-" + ago / 1000 + "s";
      svg.append(label);
    }
    const legend = EB.h("div", { class: "legend" });
    series.forEach((ser, i) => {
      const color = COLORS[i % COLORS.length];
      const pts = ser.points.filter((p) => p[0] >= t0).sort((a, b) => a[0] - b[0]);
      if (pts.length) {
        svg.append(s("polyline", { stroke: color, points: pts.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ") }));
      }
      const fmt = ser.format || EB.num;
      legend.append(EB.h("span", { class: "legend-item", dataset: { series: ser.name, value: ser.current } },
        EB.h("span", { class: "swatch", style: "background:" + color }), ser.name + " ",
        EB.h("b", {}, ser.current === undefined ? "" : fmt(ser.current))));
    });
    return EB.h("figure", { class: "chart card", id: opts.id, style: "margin:0" },
      EB.h("figcaption", {}, EB.h("h2", { style: "margin-top:0" }, title)), svg, legend);
  };

  /* The samples query for charts: 10 minutes, one point per sample interval (at most 500). */
  EB.sampleQuery = (kinds) => {
    const incr = Math.max(EB.sampleIncr || 5, 2);
    const age = Math.min(600, incr * 500);
    return kinds.map((k) => `${k}_age=${age}&${k}_incr=${incr}`).join("&");
  };
})();
