// latscope web page: plain JavaScript over the /v1 API, no build step.
"use strict";

const BUCKETS = ["network", "queue", "preprocess", "prefill", "decode", "postprocess", "other"];
const $ = (sel) => document.querySelector(sel);
const state = { token: localStorage.getItem("latscope.token") || "", range: null };
// More views (static/time.js) add their loaders here; refresh() runs them with the others.
const VIEWS = [];

class ApiError extends Error {
  constructor(status, body) {
    super((body && (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail))) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error;
  }
}

async function api(path, params = {}) {
  const url = new URL(path, document.baseURI);
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, item);
  }
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const response = await fetch(url, { headers });
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    if (response.status === 401) $("#auth").hidden = false;
    throw new ApiError(response.status, body);
  }
  return body;
}

// -- formatting --------------------------------------------------------------------------------

function ms(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 10000) return `${(v / 1000).toFixed(2)} s`;
  return `${v.toFixed(digits)} ms`;
}
const num = (v, digits = 1) => (v === null || v === undefined ? "–" : v.toFixed(digits));
const pct = (v) => (v === null || v === undefined ? "–" : `${(v * 100).toFixed(1)}%`);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "style") node.setAttribute("style", v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bucketCell(bucket, extra = "") {
  return el("td", { class: `b ${extra}`, style: `--c: var(--${bucket})`, "data-bucket": bucket }, bucket);
}

// A stacked bar: one segment per bucket, widths in proportion to ``parts`` (ms or shares).
function stackedBar(parts, cls = "bar") {
  const total = BUCKETS.reduce((s, b) => s + Math.max(0, parts[b] || 0), 0);
  const bar = el("div", { class: cls });
  if (total <= 0) return bar;
  for (const b of BUCKETS) {
    const v = Math.max(0, parts[b] || 0);
    if (!v) continue;
    const share = v / total;
    bar.append(el("div", {
      class: `seg ${b}`, style: `width: ${(share * 100).toFixed(3)}%`,
      title: `${b}: ${(share * 100).toFixed(1)}%`, "data-bucket": b, "data-share": share.toFixed(4),
    }));
  }
  return bar;
}

function showError(err) {
  const box = $("#error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = err.code ? `${err.message} (${err.code})` : String(err.message || err);
}

// -- filters -----------------------------------------------------------------------------------

function filters() {
  // A window dragged on the over-time chart (state.range) wins over the window menu.
  const range = state.range || { since: $("#window").value };
  return { ...range, service: $("#service").value, model: $("#model").value };
}

async function loadServices() {
  const body = await api("v1/services", { since: $("#window").value });
  const services = $("#service"), models = $("#model");
  const keepService = services.value, keepModel = models.value;
  const modelNames = new Set();
  services.replaceChildren(el("option", { value: "" }, "all"));
  for (const s of body.services) {
    services.append(el("option", { value: s.service }, `${s.service} (${s.count})`));
    for (const m of s.models) modelNames.add(m.model);
  }
  models.replaceChildren(el("option", { value: "" }, "all"));
  for (const m of [...modelNames].sort()) models.append(el("option", { value: m }, m || "(none)"));
  services.value = keepService;
  models.value = keepModel;
}

// -- sections ----------------------------------------------------------------------------------

function renderLegend() {
  $("#legend").replaceChildren(...BUCKETS.map((b) => el("span", { style: `--c: var(--${b})` }, b)));
}

function shares(section) {
  return Object.fromEntries(BUCKETS.map((b) => [b, section.buckets_ms[b].share]));
}

async function loadSummary() {
  const body = await api("v1/attribution/summary", { ...filters(), group_by: $("#group-by").value });
  $("#summary-count").textContent = body.count;
  $("#summary-window").textContent = `${body.window.since} → ${body.window.until}`;
  const rows = [{ key: "all", count: body.count, section: body }];
  for (const g of body.groups) rows.push({ key: g.key || "(none)", count: g.count, section: g });
  $("#budget-bars").replaceChildren(...rows.map((r) => el("div", { class: "row", "data-group": r.key },
    el("span", { class: "label", title: r.key }, r.key),
    el("span", { class: "n" }, r.count),
    r.count ? stackedBar(shares(r.section)) : el("div", { class: "bar" }),
    el("span", { class: "p99", title: "p99 end-to-end" }, `p99 ${ms(r.section.e2e_ms.p99)}`),
  )));
  const tbody = $("#percentile-table tbody");
  const e2e = body.e2e_ms;
  tbody.replaceChildren(
    el("tr", { "data-bucket": "e2e" }, el("td", { class: "b" }, "e2e"),
      el("td", {}, num(e2e.p50)), el("td", {}, num(e2e.p95)), el("td", {}, num(e2e.p99)),
      el("td", {}, num(e2e.mean)), el("td", {}, body.count ? "100.0%" : "–")),
    ...BUCKETS.map((b) => {
      const s = body.buckets_ms[b];
      return el("tr", { "data-bucket": b }, bucketCell(b),
        el("td", {}, num(s.p50)), el("td", {}, num(s.p95)), el("td", {}, num(s.p99)),
        el("td", {}, num(s.mean)), el("td", { class: "share" }, pct(s.share)));
    }),
  );
  const st = body.streaming || {};
  const ttft = st.ttft_ms || {}, tpot = st.tpot_ms || {};
  $("#streaming").textContent = body.count
    ? `TTFT p50 ${ms(ttft.p50)} · p99 ${ms(ttft.p99)} — TPOT p50 ${ms(tpot.p50, 2)} · p99 ${ms(tpot.p99, 2)}` +
      (st.stalled_requests ? ` — ${st.stalled_requests} request(s) with inter-token stalls` : "")
    : "";
}

async function loadTail() {
  const body = await api("v1/attribution/tail", filters());
  const tbody = $("#tail-table tbody");
  if (!body.count) {
    $("#tail-text").textContent = "no requests in this window";
    tbody.replaceChildren();
    return;
  }
  $("#tail-text").textContent =
    `${body.tail_count} of ${body.count} requests at or above p${body.percentile} (${ms(body.threshold_ms)}): ` +
    `mean ${ms(body.tail_e2e_ms)} against ${ms(body.median_e2e_ms)} for the median — most of the extra is ${body.dominant}.`;
  tbody.replaceChildren(...BUCKETS.map((b) => {
    const s = body.buckets_ms[b] || {};
    return el("tr", { "data-bucket": b, class: b === body.dominant ? "dominant" : "" }, bucketCell(b),
      el("td", {}, num(s.tail_mean)), el("td", {}, num(s.median_mean)),
      el("td", { class: "extra" }, num(s.extra)), el("td", {}, pct(s.extra_share)));
  }));
}

function evidenceText(evidence) {
  return Object.entries(evidence).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => {
    if (typeof v !== "number") return `${k} ${v}`;
    if (k.endsWith("_ms")) return `${k.replace(/_ms$/, "")} ${ms(v)}`;
    if (k.includes("share")) return `${k} ${pct(v)}`;
    return `${k} ${Number.isInteger(v) ? v : v.toFixed(3)}`;
  }).join(" · ");
}

async function loadDiagnosis() {
  const body = await api("v1/attribution/diagnose", filters());
  $("#diagnosis-summary").textContent = body.count
    ? `most time in ${body.dominant}; most of the tail in ${body.tail_dominant}.`
    : "no requests in this window";
  $("#verdicts").replaceChildren(...body.verdicts.map((v) => el("li", { class: "verdict", "data-verdict": v.id },
    el("div", { class: "cause" }, v.cause),
    el("div", {}, "usual first fixes: ", v.fixes.join("; ")),
    el("div", { class: "evidence" }, evidenceText(v.evidence)),
    v.where ? el("div", { class: "where" }, `where: ${v.where.dimension} = ${v.where.value}` +
      (v.where.since_ns ? ` since ${new Date(v.where.since_ns / 1e6).toISOString()}` : "") +
      ` (${pct(v.where.in_share)} of ${v.where.selection}, ${pct(v.where.out_share)} of the others)`) : null,
  )));
  if (body.count && !body.verdicts.length) {
    $("#verdicts").replaceChildren(el("li", {}, "no known pattern stands out — see the tail and the slowest requests"));
  }
}

async function loadSlowest() {
  const body = await api("v1/requests", { ...filters(), limit: 15 });
  $("#slowest-table tbody").replaceChildren(...body.requests.map((r) => el("tr", { "data-trace": r.trace_id },
    el("td", { class: "trace" }, el("a", { class: "trace", href: `#trace=${r.trace_id}` }, r.trace_id.slice(0, 16))),
    el("td", {}, r.service), el("td", {}, r.model),
    el("td", { class: "e2e" }, num(r.e2e_ms)), el("td", {}, num(r.ttft_ms)),
    el("td", { class: "budget" }, stackedBar(r.buckets_ms)),
  )));
}

async function loadGpu() {
  const body = await api("v1/gpu", filters());
  const rows = [];
  for (const [phase, figures] of Object.entries(body.phases)) {
    for (const [figure, f] of Object.entries(figures)) {
      rows.push(el("tr", { "data-phase": phase, "data-figure": figure },
        el("td", { class: "b", style: `--c: var(--${phase})` }, phase), el("td", {}, figure),
        el("td", { class: "mean" }, num(f.mean)), el("td", {}, num(f.max)),
        el("td", {}, num(f.total)), el("td", {}, f.n)));
    }
  }
  $("#gpu-table tbody").replaceChildren(...rows);
  $("#gpu-empty").hidden = rows.length > 0;
}

// -- one request -------------------------------------------------------------------------------

function renderWaterfall(spans, total) {
  const scale = (v) => Math.max(0, Math.min(100, (v / total) * 100));
  $("#waterfall").replaceChildren(...spans.map((s) => {
    const colour = s.phase ? `var(--${s.phase})` : null;
    const box = el("div", {
      class: `box ${s.kind === "Client" ? "client" : ""}`,
      style: `left: ${scale(s.start_ms)}%; width: ${Math.max(0.2, scale(s.duration_ms))}%;` + (colour ? ` background: ${colour};` : ""),
      title: `${s.name}: starts ${ms(s.start_ms)}, lasts ${ms(s.duration_ms)}`,
    }, el("span", { class: "t" }, ms(s.duration_ms)));
    return el("div", { class: "span", "data-span": s.span_id, "data-phase": s.phase || "" },
      el("span", { class: "name", style: `padding-left: ${s.depth}rem`, title: s.name }, s.name),
      el("span", { class: "muted" }, s.service),
      el("div", { class: "track" }, box));
  }));
}

function renderTokens(tokens, total) {
  const svg = $("#tokens");
  const NS = "http://www.w3.org/2000/svg";
  const width = svg.clientWidth || 900, height = 70;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const x = (t) => 4 + (Math.max(0, t) / total) * (width - 8);
  const add = (tag, attrs) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    svg.append(node);
    return node;
  };
  for (const s of tokens.stalls) {
    add("rect", { class: "stall", x: x(s.at_ms - s.gap_ms), y: 8, width: Math.max(1, x(s.at_ms) - x(s.at_ms - s.gap_ms)), height: 44, "data-index": s.index });
  }
  for (const t of tokens.times_ms) add("line", { class: "tok", x1: x(t), x2: x(t), y1: 14, y2: 46 });
  if (tokens.first_token_ms !== null) {
    add("line", { class: "first", x1: x(tokens.first_token_ms), x2: x(tokens.first_token_ms), y1: 4, y2: 56 });
    add("text", { x: x(tokens.first_token_ms) + 3, y: 66 }).textContent = `first token ${ms(tokens.first_token_ms)}`;
  }
  add("text", { x: width - 60, y: 66 }).textContent = ms(total);
}

async function loadRequest(traceId) {
  const body = await api(`v1/requests/${encodeURIComponent(traceId)}`);
  const a = body.attribution;
  $("#request-body").hidden = false;
  $("#request-id").textContent = a.trace_id;
  $("#trace-input").value = a.trace_id;
  $("#request-summary").textContent =
    `${a.service} · ${a.model || "(no model)"} · e2e ${ms(a.e2e_ms)} · TTFT ${ms(a.ttft_ms)} · TPOT ${ms(a.tpot_ms, 2)}` +
    ` · tokens ${a.input_tokens ?? "–"} in / ${a.output_tokens ?? "–"} out` +
    (a.clock_skew_ms ? ` · server clock ${ms(a.clock_skew_ms)} ahead (adjusted)` : "") +
    (a.buckets_ms.network === null ? " · network unknown (no client span)" : "");
  $("#request-bar").replaceWith(Object.assign(stackedBar(a.buckets_ms, "bar big"), { id: "request-bar" }));
  $("#request-buckets tbody").replaceChildren(...BUCKETS.map((b) => {
    const v = a.buckets_ms[b];
    return el("tr", { "data-bucket": b }, bucketCell(b), el("td", { class: "ms" }, num(v)),
      el("td", {}, v === null ? "–" : pct(v / a.e2e_ms)));
  }), el("tr", { "data-bucket": "e2e" }, el("td", { class: "b" }, "e2e"), el("td", { class: "ms" }, num(a.e2e_ms)), el("td", {}, "100.0%")));
  renderWaterfall(body.spans, a.e2e_ms);
  const t = body.tokens;
  $("#token-summary").textContent = t.count
    ? `${t.count} tokens · ITL p50 ${ms(a.itl_ms.p50, 2)} · p99 ${ms(a.itl_ms.p99, 2)} · max ${ms(a.itl_ms.max, 2)} · ${t.stalls.length} stall(s) over ${ms(t.stall_threshold_ms, 1)}`
    : "no token times recorded";
  renderTokens(t, a.e2e_ms);
  $("#stalls").replaceChildren(...t.stalls.slice(0, 20).map((s) =>
    el("li", { "data-index": s.index }, `token ${s.index} at ${ms(s.at_ms)} after a ${ms(s.gap_ms)} gap`)));
}

// -- compare -----------------------------------------------------------------------------------

async function loadCompare() {
  const body = await api("v1/attribution/compare", {
    before_since: $("#before-since").value, before_until: $("#before-until").value,
    after_since: $("#after-since").value, after_until: $("#after-until").value,
    service: $("#service").value, model: $("#model").value,
  });
  $("#compare-text").textContent =
    `before: ${body.before.count} requests · after: ${body.after.count} requests` +
    (body.mover ? ` — biggest mover: ${body.mover} (${body.mover_delta_ms > 0 ? "+" : ""}${ms(body.mover_delta_ms)} on the mean)` : "");
  $("#compare-table tbody").replaceChildren(...BUCKETS.map((b) => {
    const d = body.buckets_ms[b];
    const delta = d.mean.delta;
    return el("tr", { "data-bucket": b, class: b === body.mover ? "dominant" : "" }, bucketCell(b),
      el("td", {}, num(d.p50.before)), el("td", {}, num(d.p50.after)),
      el("td", {}, num(d.p99.before)), el("td", {}, num(d.p99.after)),
      el("td", {}, pct(d.share.before)), el("td", {}, pct(d.share.after)),
      el("td", { class: delta > 0 ? "up" : delta < 0 ? "down" : "" }, delta === null ? "–" : `${delta > 0 ? "+" : ""}${num(delta)}`));
  }));
}

// -- wiring ------------------------------------------------------------------------------------

async function run(task) {
  try { await task(); } catch (err) { showError(err); throw err; }
}

async function refresh() {
  showError(null);
  const tasks = [loadSummary, loadTail, loadDiagnosis, loadGpu, loadSlowest, loadCompare, ...VIEWS].map((t) => run(t));
  const results = await Promise.allSettled(tasks);
  document.body.dataset.loaded = results.every((r) => r.status === "fulfilled") ? "ok" : "error";
}

function traceFromHash() {
  const m = /trace=([^&]+)/.exec(location.hash);
  return m ? m[1] : null;
}

async function openFromHash() {
  const id = traceFromHash();
  if (!id) return;
  document.body.dataset.request = "loading";
  try { await run(() => loadRequest(id)); document.body.dataset.request = "ok"; }
  catch (_) { document.body.dataset.request = "error"; }
}

async function start() {
  renderLegend();
  $("#filters").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  $("#window").addEventListener("change", () => { state.range = null; });  // before refresh runs
  for (const id of ["#window", "#service", "#model", "#group-by"]) $(id).addEventListener("change", refresh);
  $("#compare-form").addEventListener("submit", (e) => { e.preventDefault(); run(loadCompare).catch(() => {}); });
  $("#request-form").addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = `trace=${$("#trace-input").value.trim()}`;
  });
  $("#auth-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("#token").value.trim();
    localStorage.setItem("latscope.token", state.token);
    $("#auth").hidden = true;
    start_data();
  });
  window.addEventListener("hashchange", openFromHash);
  await start_data();
}

async function start_data() {
  try { await run(loadServices); } catch (_) { document.body.dataset.loaded = "error"; return; }
  await Promise.all([refresh(), openFromHash()]);
}

start();
