// latscope web page: over time, the latency heatmap, what is different, cold starts.
// Plain JavaScript over the /v1 API; uses app.js's helpers (api, el, $, ms, pct, stackedBar,
// filters, state, BUCKETS) and registers its loaders in VIEWS, so the page refreshes them.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PAD = { left: 58, right: 14, top: 10, bottom: 24 };
const why = { selection: null, heat: null };

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

const iso = (ns) => new Date(ns / 1e6).toISOString();
// A time label as precise as the axis needs: the date over a day, seconds below six minutes.
const clock = (ns, span) => {
  const d = new Date(ns / 1e6).toISOString();
  if (span > 86400e9) return d.slice(5, 16).replace("T", " ");
  return span < 360e9 ? d.slice(11, 19) : d.slice(11, 16);
};
const niceMs = (v) => (v >= 10000 ? `${(v / 1000).toFixed(0)} s` : v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${v.toFixed(v < 10 ? 1 : 0)} ms`);

// Round values for a linear axis from 0 to at least ``top``: ticks a 1, 2 or 5 x 10^k step
// apart (niceStep), and the axis' top, the first tick at or above ``top``.
function roundTicks(top, count = 4) {
  const step = niceStep(top, count);
  const ticks = [];
  for (let v = 0; v < top + step * 1e-9; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] < top) ticks.push(ticks[ticks.length - 1] + step);
  return { ticks, top: ticks[ticks.length - 1] };
}

// A time axis along the bottom of a chart and a value axis on the left (ticks: ``yTicks``).
function axes(chart, x, lo, hi, width, height, yTicks) {
  for (let i = 0; i <= 6; i++) {
    const t = lo + ((hi - lo) * i) / 6;
    chart.append(svg("text", { x: x(t), y: height - 6, class: "tick", "text-anchor": i === 0 ? "start" : i === 6 ? "end" : "middle" }, clock(t, hi - lo)));
  }
  for (const [y, label] of yTicks) {
    chart.append(svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y, y2: y, class: "grid" }));
    chart.append(svg("text", { x: PAD.left - 6, y: y + 4, class: "tick value", "text-anchor": "end" }, label));
  }
}

// Drag across ``chart`` (horizontally, or a rectangle): ``done({x0, x1, y0, y1})`` in pixels.
function brush(chart, { vertical = false, done }) {
  let start = null, box = null;
  const point = (e) => {
    const r = chart.getBoundingClientRect();
    return { x: e.clientX - r.left, y: e.clientY - r.top };
  };
  chart.onmousedown = (e) => {
    start = point(e);
    box?.remove();
    box = svg("rect", { class: "brush", x: start.x, y: vertical ? start.y : PAD.top, width: 0, height: vertical ? 0 : chart.clientHeight - PAD.top - PAD.bottom });
    chart.append(box);
    e.preventDefault();
  };
  chart.onmousemove = (e) => {
    if (!start) return;
    const p = point(e);
    box.setAttribute("x", Math.min(start.x, p.x));
    box.setAttribute("width", Math.abs(p.x - start.x));
    if (vertical) {
      box.setAttribute("y", Math.min(start.y, p.y));
      box.setAttribute("height", Math.abs(p.y - start.y));
    }
  };
  chart.onmouseup = (e) => {
    if (!start) return;
    const p = point(e);
    const sel = { x0: Math.min(start.x, p.x), x1: Math.max(start.x, p.x), y0: Math.min(start.y, p.y), y1: Math.max(start.y, p.y) };
    start = null;
    if (sel.x1 - sel.x0 < 4) { box?.remove(); return; }
    done(sel);
  };
}

// -- over time -----------------------------------------------------------------------------------

async function loadTimeline() {
  const body = await api("v1/attribution/timeseries", filters());
  renderTimeline(body);
}

function renderTimeline(body) {
  const chart = $("#timeline-chart");
  const width = chart.clientWidth || 1000, height = 240;
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.replaceChildren();
  $("#timeline-legend").replaceChildren(...BUCKETS.map((b) => el("span", { style: `--c: var(--${b})` }, b)),
    el("span", { class: "p99key" }, "e2e p99"));
  const { since_ns: lo, until_ns: hi } = body.window;
  const points = body.series[0].points;
  $("#timeline-step").textContent = `${points.length} steps of ${body.step_s} s`;
  chart.dataset.points = points.length;
  // Stacked means: share x mean e2e, so the stack is exactly the step's mean end to end.
  const stacks = points.map((p) => BUCKETS.map((b) => (p.count ? (p.buckets_ms[b].share || 0) * p.e2e_ms.mean : 0)));
  const highest = Math.max(1, ...points.map((p) => p.e2e_ms.p99 || 0), ...points.map((p) => p.e2e_ms.mean || 0));
  const { ticks, top } = roundTicks(highest);
  const x = (t) => PAD.left + ((t - lo) / (hi - lo)) * (width - PAD.left - PAD.right);
  const y = (v) => height - PAD.bottom - (v / top) * (height - PAD.top - PAD.bottom);
  axes(chart, x, lo, hi, width, height, ticks.map((v) => [y(v), niceMs(v)]));
  points.forEach((p, i) => {
    if (!p.count) return;
    const x0 = x(p.start_ns), w = Math.max(1, x(p.end_ns) - x0 - 0.5);
    let base = 0;
    const group = svg("g", { class: "step", "data-start": p.start_ns, "data-count": p.count, "data-mean": p.e2e_ms.mean.toFixed(3) });
    group.append(svg("title", {}, `${iso(p.start_ns)}: ${p.count} requests, mean ${ms(p.e2e_ms.mean)}, p99 ${ms(p.e2e_ms.p99)}`));
    stacks[i].forEach((v, k) => {
      if (v <= 0) return;
      group.append(svg("rect", { x: x0, width: w, y: y(base + v), height: Math.max(0, y(base) - y(base + v)), fill: `var(--${BUCKETS[k]})`, "data-bucket": BUCKETS[k] }));
      base += v;
    });
    chart.append(group);
  });
  const line = points.filter((p) => p.count && p.e2e_ms.p99 !== null)
    .map((p) => `${x((p.start_ns + p.end_ns) / 2).toFixed(1)},${y(p.e2e_ms.p99).toFixed(1)}`);
  if (line.length) chart.append(svg("polyline", { class: "p99", points: line.join(" "), "data-count": line.length }));
  brush(chart, {
    done: ({ x0, x1 }) => {
      const t = (px) => lo + ((px - PAD.left) / (width - PAD.left - PAD.right)) * (hi - lo);
      const since = Math.max(lo, t(x0)), until = Math.min(hi, t(x1));
      if (until <= since) return;
      state.range = { since: iso(since), until: iso(until) };
      showRange();
      refresh();
    },
  });
}

function showRange() {
  const r = state.range;
  $("#range-label").textContent = r ? `Showing ${r.since} → ${r.until}.` : "";
  $("#range-reset").hidden = !r;
}

// -- the heatmap --------------------------------------------------------------------------------

async function loadHeatmap() {
  // A new heatmap drops the old rectangle (it may not lie in the new window).
  why.selection = null;
  $("#why-selection option[value=region]").disabled = true;
  if ($("#why-selection").value === "region") $("#why-selection").value = "percentile";
  $("#heat-selected").textContent = "";
  const body = await api("v1/attribution/heatmap", { ...filters(), metric: $("#heat-metric").value });
  renderHeatmap(body);
}

function renderHeatmap(body) {
  why.heat = body;
  const chart = $("#heat-chart");
  const width = chart.clientWidth || 1000, height = 260;
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.replaceChildren();
  chart.dataset.count = body.count;
  const steps = body.times_ns.length, rows = body.bins.length;
  if (!rows) return;
  const ch = (height - PAD.top - PAD.bottom) / rows;
  // The window's time axis, as the over-time chart draws it: a partial first or last step is a
  // narrower column, so both charts' steps line up.
  const { since_ns: lo, until_ns: hi } = body.window;
  const x = (t) => PAD.left + ((Math.max(lo, Math.min(hi, t)) - lo) / (hi - lo)) * (width - PAD.left - PAD.right);
  const edges = [...body.times_ns.map(x), x(body.times_ns[steps - 1] + body.step_s * 1e9)];
  // Value ticks at round latencies (1, 2 and 5 x 10^k ms), placed on the bins' log scale.
  const first = Math.log10(body.bins[0].lo_ms), last = Math.log10(body.bins[rows - 1].hi_ms);
  const yOf = (v) => height - PAD.bottom - ((Math.log10(v) - first) / (last - first)) * rows * ch;
  const yTicks = [];
  for (let k = Math.floor(first); k <= Math.ceil(last); k++) {
    for (const m of rows > 12 ? [1, 2, 5] : [1, 2, 3, 5, 7]) {
      const v = m * 10 ** k;
      if (Math.log10(v) >= first && Math.log10(v) <= last) yTicks.push([yOf(v), niceMs(v)]);
    }
  }
  axes(chart, x, lo, hi, width, height, yTicks);
  const peak = Math.log1p(body.max_count || 1);
  body.counts.forEach((column, i) => column.forEach((n, j) => {
    if (!n) return;
    const heat = Math.log1p(n) / peak;
    chart.append(svg("rect", {
      class: "cell", x: edges[i], y: height - PAD.bottom - (j + 1) * ch, width: edges[i + 1] - edges[i] + 0.3, height: ch + 0.3,
      fill: `hsl(${(1 - heat) * 220}, 85%, ${62 - heat * 22}%)`, "data-i": i, "data-j": j, "data-n": n, "data-start": body.times_ns[i],
    }, null));
  }));
  const column = (px) => edges.findIndex((e, i) => i === steps || (px >= e && px < edges[i + 1]));
  brush(chart, {
    vertical: true,
    done: ({ x0, x1, y0, y1 }) => {
      // Snap to whole cells: the selection is exactly the requests of the cells it covers.
      const i0 = Math.max(0, column(Math.max(x0, edges[0]))), i1 = Math.min(steps - 1, column(Math.min(x1, edges[steps] - 1e-6)));
      const j0 = Math.max(0, Math.floor((height - PAD.bottom - y1) / ch)), j1 = Math.min(rows - 1, Math.floor((height - PAD.bottom - y0) / ch));
      if (i1 < i0 || j1 < j0) return;
      let n = 0;
      for (let i = i0; i <= i1; i++) for (let j = j0; j <= j1; j++) n += body.counts[i][j];
      chart.dataset.brushed = n;
      $("#heat-selected").textContent = `Selected ${n} requests: ${body.metric} ${ms(body.bins[j0].lo_ms)} – ${ms(body.bins[j1].hi_ms)}, ${iso(body.times_ns[i0])} → ${iso(body.times_ns[i0] + (i1 - i0 + 1) * body.step_s * 1e9)}.`;
      why.selection = {
        selection: "region", metric: body.metric,
        sel_since: iso(body.times_ns[i0]),
        sel_until: iso(Math.min(body.times_ns[i1] + body.step_s * 1e9, Date.parse(body.window.until) * 1e6)),
        min_ms: body.bins[j0].lo_ms, max_ms: body.bins[j1].hi_ms,
      };
      const option = $("#why-selection option[value=region]");
      option.disabled = false;
      $("#why-selection").value = "region";
      run(loadWhy).catch(() => {});
    },
  });
}

// -- what is different --------------------------------------------------------------------------

function whyParams() {
  const kind = $("#why-selection").value;
  const attribute = $("#why-attributes").value.split(/[\s,]+/).filter(Boolean);
  const base = { ...filters(), attribute };
  if (kind === "region" && why.selection) return { ...base, ...why.selection };
  if (kind === "before") return { ...base, selection: "before" };
  return { ...base, selection: "percentile", percentile: 99 };
}

async function loadWhy() {
  const body = await api("v1/attribution/why", whyParams());
  renderWhy(body);
}

function shareBars(v) {
  return el("div", { class: "shares", title: `${pct(v.in_share)} of the selection, ${pct(v.out_share)} of the rest` },
    el("div", { class: "in", style: `width: ${(v.in_share * 100).toFixed(2)}%` }),
    el("div", { class: "out", style: `width: ${(v.out_share * 100).toFixed(2)}%` }));
}

function renderWhy(body) {
  const sel = body.selection, base = body.baseline;
  const box = $("#why-dimensions");
  $("#why").dataset.count = sel.count;
  if (!sel.count || !base.count) {
    $("#why-text").textContent = `${sel.count} requests (${sel.description}) against ${base.count} (${base.description}): nothing to compare.`;
    box.replaceChildren();
    return;
  }
  $("#why-examples").replaceChildren(...(body.examples.length ? ["The slowest of them: "] : []),
    ...body.examples.flatMap((e, i) => [i ? ", " : "", el("a", { class: "trace", href: `#trace=${e.trace_id}`, "data-trace": e.trace_id }, e.trace_id.slice(0, 16)), ` (${ms(e.e2e_ms)})`]));
  const top = body.top;
  $("#why-text").textContent = `${sel.count} requests (${sel.description}) against ${base.count} (${base.description}): mean ${ms(sel.e2e_mean_ms)} against ${ms(base.e2e_mean_ms)}, +${ms(body.extra_e2e_ms)}, most of it ${body.dominant || "–"}.` +
    (top ? ` Most different: ${top.dimension} = ${top.value} (${pct(top.in_share)} of them, ${pct(top.out_share)} of the rest), +${ms(top.extra_ms)} each, mostly ${top.dominant || "–"}${top.since_ns ? `, since ${iso(top.since_ns)}` : ""}.` : "");
  // The six that differ most, and every span attribute asked for.
  const shown = body.dimensions.filter((d, i) => i < 6 || d.dimension.startsWith("attribute."));
  box.replaceChildren(...shown.map((d) => el("div", { class: "dimension", "data-dimension": d.dimension, "data-score": d.score.toFixed(4) },
    el("h3", {}, d.dimension, el("span", { class: "muted" }, ` score ${(d.score * 100).toFixed(0)} · ${d.values_seen} values`)),
    el("table", { class: "numbers" },
      el("thead", {}, el("tr", {}, el("th", {}, "value"), el("th", {}, "selection vs rest"), el("th", {}, "here"), el("th", {}, "rest"), el("th", {}, "extra each"), el("th", {}, "where the extra went"))),
      el("tbody", {}, ...d.values.map((v) => el("tr", { "data-value": v.value },
        el("td", { class: "value" }, v.value || "(none)"),
        el("td", { class: "bars" }, shareBars(v)),
        el("td", {}, pct(v.in_share)), el("td", {}, pct(v.out_share)),
        el("td", { class: "extra" }, ms(v.extra_ms)),
        el("td", { class: "budget" }, stackedBar(Object.fromEntries(BUCKETS.map((b) => [b, Math.max(0, v.buckets_ms[b] || 0)])))),
      )))))));
}

// -- cold starts --------------------------------------------------------------------------------

async function loadColdStart() {
  const body = await api("v1/attribution/coldstart", filters());
  const appeared = body.replicas.filter((r) => r.appeared && r.first_seen_ns >= body.window.since_ns);
  $("#cold").dataset.appeared = body.appeared;
  $("#cold-text").textContent = body.appeared
    ? `${body.appeared} replica(s) appeared; their ${body.warmup.count} warm-up requests took ${ms(body.warmup.e2e_mean_ms)} on average against ${ms(body.warm.e2e_mean_ms)} warm (+${ms(body.extra_e2e_ms)}, mostly ${body.dominant || "–"}). Rule: the first ${body.rule.warmup_requests} requests or ${body.rule.warmup_s} s of a replica.`
    : `No replica appeared in this window (${body.replica_count} seen).`;
  $("#cold-table tbody").replaceChildren(...appeared.map((r) => el("tr", { "data-replica": r.replica },
    el("td", {}, r.replica), el("td", {}, r.service), el("td", {}, iso(r.first_seen_ns)),
    el("td", {}, r.warmup_requests), el("td", { class: "warmup" }, num(r.warmup_e2e_mean_ms)), el("td", {}, num(r.warm_e2e_mean_ms)))));
}

// -- wiring -------------------------------------------------------------------------------------

$("#range-reset").addEventListener("click", () => { state.range = null; showRange(); refresh(); });
$("#heat-metric").addEventListener("change", () => run(loadHeatmap).catch(() => {}));
$("#why-selection").addEventListener("change", () => run(loadWhy).catch(() => {}));
$("#why-form").addEventListener("submit", (e) => { e.preventDefault(); run(loadWhy).catch(() => {}); });
VIEWS.push(loadTimeline, loadHeatmap, loadWhy, loadColdStart);
