// latscope web page: plain JavaScript over the /v1 API, no build step.
"use strict";

const BUCKETS = ["network", "queue", "preprocess", "prefill", "decode", "postprocess", "other"];
// A run's critical path: the LLM calls' seven buckets, then tool calls and the app's own time.
const RUN_PARTS = [...BUCKETS, "tool", "app"];
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
// A tiny negative share is nothing, not "-0.0%".
const pct = (v) => (v === null || v === undefined ? "–" : `${(v * 100).toFixed(1).replace(/^-0\.0$/, "0.0")}%`);
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
function stackedBar(parts, cls = "bar", keys = BUCKETS) {
  const total = keys.reduce((s, b) => s + Math.max(0, parts[b] || 0), 0);
  const bar = el("div", { class: cls });
  if (total <= 0) return bar;
  for (const b of keys) {
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
  $("#run-legend").replaceChildren(...RUN_PARTS.map((b) => el("span", { style: `--c: var(--${b})` }, b)));
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
  // A row opens its request: by request id when the answer has one (a trace id may name several).
  $("#slowest-table tbody").replaceChildren(...body.requests.map((r) => el("tr", { "data-trace": r.trace_id },
    el("td", { class: "trace" }, el("a", { class: "trace", href: `#trace=${r.request_id || r.trace_id}`, title: r.request_id || r.trace_id }, r.trace_id.slice(0, 16))),
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

// The spans of one call: in a trace with several calls, the span marked with its request id and
// everything under it (depths from there); else every span of the trace.
function callSpans(spans, requestId) {
  const marked = spans.filter((s) => s.request_id);
  if (marked.length <= 1) return { spans, calls: marked.length };
  const top = marked.find((s) => s.request_id === requestId);
  if (!top) return { spans, calls: marked.length };
  const children = new Map();
  for (const s of spans) children.set(s.parent_span_id, [...(children.get(s.parent_span_id) || []), s.span_id]);
  const keep = new Set(), stack = [top.span_id];
  while (stack.length) {
    const id = stack.pop();
    if (keep.has(id)) continue;
    keep.add(id);
    stack.push(...(children.get(id) || []));
  }
  return { spans: spans.filter((s) => keep.has(s.span_id)).map((s) => ({ ...s, depth: s.depth - top.depth })), calls: marked.length };
}

// One row per span on the time axis; ``marks`` (span id -> {label, href, start_ms, e2e_ms})
// labels the calls and outlines each call's whole extent (a headers-only client span is shorter
// than its call).
function renderWaterfall(target, spans, total, marks = new Map()) {
  const scale = (v) => Math.max(0, Math.min(100, (v / total) * 100));
  target.replaceChildren(...spans.map((s) => {
    const colour = s.phase ? `var(--${s.phase})` : null;
    const mark = marks.get(s.span_id);
    const box = el("div", {
      class: `box ${s.kind === "Client" ? "client" : ""} ${mark ? "call" : ""}`,
      style: `left: ${scale(s.start_ms)}%; width: ${Math.max(0.2, scale(s.duration_ms))}%;` + (colour ? ` background: ${colour};` : ""),
      title: `${s.name}: starts ${ms(s.start_ms)}, lasts ${ms(s.duration_ms)}`,
    }, el("span", { class: "t" }, ms(s.duration_ms)));
    return el("div", { class: `span ${mark ? "call" : ""}`, "data-span": s.span_id, "data-phase": s.phase || "", "data-request": s.request_id || "" },
      el("span", { class: "name", style: `padding-left: ${s.depth}rem`, title: s.name },
        mark ? el("a", { class: "mark", href: mark.href }, mark.label) : null, s.name),
      el("span", { class: "muted" }, s.service),
      el("div", { class: "track" }, box, mark && mark.e2e_ms !== undefined ? el("div", {
        class: "extent", style: `left: ${scale(mark.start_ms)}%; width: ${Math.max(0.2, scale(mark.e2e_ms))}%;`,
        title: `${mark.label}: ${ms(mark.e2e_ms)} from ${ms(mark.start_ms)}`,
      }) : null));
  }));
}

// A readable step for an axis over ``span`` with at most ``count`` ticks: 1, 2 or 5 times 10^k.
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

function tickText(v, step) {
  if (v >= 10000 || step >= 1000) return `${(v / 1000).toFixed(step >= 1000 ? 0 : Math.max(0, -Math.floor(Math.log10(step / 1000))))} s`;
  return `${v.toFixed(Math.max(0, -Math.floor(Math.log10(step))))} ms`;
}

// Token arrivals on the request's axis. Three rows that never overlap: the first token's label
// on top, the tokens (and stalls) in the middle, a time axis with its tick labels at the bottom.
const TOKENS_GEOMETRY = { height: 82, pad: 8, label: 11, top: 16, bottom: 50, axis: 56, ticks: 72, minGap: 90 };

function renderTokens(tokens, total) {
  const chart = $("#tokens");
  const g = TOKENS_GEOMETRY;
  const width = chart.clientWidth || 900;
  chart.setAttribute("viewBox", `0 0 ${width} ${g.height}`);
  chart.replaceChildren();
  const x = (t) => g.pad + (Math.max(0, Math.min(total, t)) / total) * (width - 2 * g.pad);
  const add = (tag, attrs, text = null) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== null) node.textContent = text;
    chart.append(node);
    return node;
  };
  for (const s of tokens.stalls) {
    add("rect", { class: "stall", x: x(s.at_ms - s.gap_ms), y: g.top, width: Math.max(1, x(s.at_ms) - x(s.at_ms - s.gap_ms)), height: g.bottom - g.top, "data-index": s.index });
  }
  for (const t of tokens.times_ms) add("line", { class: "tok", x1: x(t), x2: x(t), y1: g.top + 2, y2: g.bottom - 2 });
  if (tokens.first_token_ms !== null) {
    const fx = x(tokens.first_token_ms);
    add("line", { class: "first", x1: fx, x2: fx, y1: g.label + 2, y2: g.axis });
    // Left of the marker when it sits in the right half, so the label stays inside the chart.
    const right = fx > width / 2;
    add("text", { class: "first-label", x: right ? fx - 4 : fx + 4, y: g.label, "text-anchor": right ? "end" : "start" },
      `first token ${ms(tokens.first_token_ms)}`);
  }
  add("line", { class: "axis", x1: x(0), x2: x(total), y1: g.axis, y2: g.axis });
  // Ticks at round times at least minGap px apart, and one at the end of the request; a round
  // tick too close to the end gives way to it.
  const step = niceStep(total, Math.floor((width - 2 * g.pad) / g.minGap));
  const ticks = [];
  for (let t = 0; t < total; t += step) if (x(total) - x(t) >= g.minGap) ticks.push([t, tickText(t, step)]);
  ticks.push([total, Math.abs(total / step - Math.round(total / step)) < 1e-9 ? tickText(total, step) : ms(total)]);
  ticks.forEach(([t, label], i) => {
    add("line", { class: "tick-mark", x1: x(t), x2: x(t), y1: g.axis, y2: g.axis + 4 });
    const anchor = i === 0 ? "start" : i === ticks.length - 1 ? "end" : "middle";
    add("text", { class: "tick", x: x(t), y: g.ticks, "text-anchor": anchor, "data-ms": t }, label);
  });
}

// The request view: buckets, its own spans, tokens. ``body`` is /v1/requests/{id}'s answer.
function renderRequest(body) {
  const a = body.attribution;
  $("#request-body").hidden = false;
  $("#request-id").textContent = a.request_id || a.trace_id;
  $("#trace-input").value = a.request_id || a.trace_id;
  $("#request-summary").textContent =
    `${a.service} · ${a.model || "(no model)"} · e2e ${ms(a.e2e_ms)} · TTFT ${ms(a.ttft_ms)} · TPOT ${ms(a.tpot_ms, 2)}` +
    ` · tokens ${a.input_tokens ?? "–"} in / ${a.output_tokens ?? "–"} out` +
    (a.clock_skew_ms ? ` · server clock ${ms(Math.abs(a.clock_skew_ms))} ${a.clock_skew_ms > 0 ? "ahead" : "behind"} (adjusted)` : "") +
    (a.client_headers_only ? " · the client span ended at the response headers (extended to the server's end)" : "") +
    (a.buckets_ms.network === null ? " · network unknown (no client span)" : "");
  $("#request-bar").replaceWith(Object.assign(stackedBar(a.buckets_ms, "bar big"), { id: "request-bar" }));
  // Percentile ranks among the request's peers (its service and model, the hour before it).
  const st = body.standing;
  const pN = (k) => (st.percentiles[k] === null ? "–" : `p${st.percentiles[k].toFixed(1)}`);
  const rank = (k) => el("td", { class: "rank" }, pN(k));
  $("#request-buckets tbody").replaceChildren(...BUCKETS.map((b) => {
    const v = a.buckets_ms[b];
    return el("tr", { "data-bucket": b }, bucketCell(b), el("td", { class: "ms" }, num(v)),
      el("td", {}, v === null ? "–" : pct(v / a.e2e_ms)), rank(b));
  }), el("tr", { "data-bucket": "e2e" }, el("td", { class: "b" }, "e2e"), el("td", { class: "ms" }, num(a.e2e_ms)), el("td", {}, "100.0%"), rank("e2e")));
  $("#request-standing").textContent = st.peers
    ? `Percentiles among the ${st.peers} requests of ${a.service} · ${a.model || "(no model)"} that started in the hour before it (${st.since} → ${st.until}): e2e ${pN("e2e")}, TTFT ${pN("ttft")}, TPOT ${pN("tpot")}.`
    : `No other request of ${a.service} · ${a.model || "(no model)"} started in the hour before it: no percentiles.`;
  const own = callSpans(body.spans, a.request_id);
  $("#waterfall-note").textContent = own.calls > 1 ? `this call's spans (its trace holds ${own.calls} calls)` : "";
  renderWaterfall($("#waterfall"), own.spans, a.e2e_ms);
  const t = body.tokens;
  $("#token-summary").textContent = t.count
    ? `${t.count} tokens · ITL p50 ${ms(a.itl_ms.p50, 2)} · p99 ${ms(a.itl_ms.p99, 2)} · max ${ms(a.itl_ms.max, 2)} · ${t.stalls.length} stall(s) over ${ms(t.stall_threshold_ms, 1)}`
    : "no token times recorded";
  renderTokens(t, a.e2e_ms);
  $("#stalls").replaceChildren(...t.stalls.slice(0, 20).map((s) =>
    el("li", { "data-index": s.index }, `token ${s.index} at ${ms(s.at_ms)} after a ${ms(s.gap_ms)} gap`)));
}

async function loadRequest(id) {
  renderRequest(await api(`v1/requests/${encodeURIComponent(id)}`));
}

// -- a trace with several calls (an agent run) ----------------------------------------------------

function dominantBucket(buckets) {
  let best = null;
  for (const b of BUCKETS) if ((buckets[b] || 0) > 0 && (best === null || buckets[b] > buckets[best])) best = b;
  return best;
}

function runParts(budget) {
  return { ...budget.llm_buckets, tool: budget.tool, app: budget.app };
}

// ``body`` is /v1/traces/{trace_id}'s answer: the run and the waterfall.
function renderRun(body, openCall = null) {
  const run = body.run, budget = run.critical_path_ms;
  $("#run").hidden = false;
  $("#run-id").textContent = run.trace_id;
  $("#run-summary").textContent =
    `${run.root.name} (${run.root.service}) · e2e ${ms(run.e2e_ms)} · ${run.calls.length} inference call(s), ${run.tools.length} tool call(s)` +
    ` · LLM ${ms(budget.llm)} · tool ${ms(budget.tool)} · app ${ms(budget.app)} on the critical path`;
  $("#run-bar").replaceWith(Object.assign(stackedBar(runParts(budget), "bar big", RUN_PARTS), { id: "run-bar" }));
  $("#run-budget tbody").replaceChildren(...budgetRows(budget, run.e2e_ms, "e2e (root)"));
  const number = new Map(run.calls.map((c, i) => [c.request_id, i + 1]));
  const href = (rid) => `#trace=${run.trace_id}&call=${rid}`;
  $("#run-calls tbody").replaceChildren(...run.calls.map((c) => {
    const a = c.attribution, top = dominantBucket(a.buckets_ms);
    return el("tr", { "data-request": c.request_id, class: c.request_id === openCall ? "open" : "" },
      el("td", {}, `call ${number.get(c.request_id)}`),
      el("td", { class: "trace" }, el("a", { class: "call", href: href(c.request_id), title: c.request_id }, c.request_id)),
      el("td", {}, a.service), el("td", {}, a.model || "–"),
      el("td", {}, num(c.start_ms)), el("td", { class: "e2e" }, num(c.e2e_ms)),
      el("td", { class: "on-path" }, c.on_critical_path_ms ? num(c.on_critical_path_ms) : "–"),
      top ? bucketCell(top, "dominant") : el("td", {}, "–"),
      el("td", { class: "budget" }, stackedBar(a.buckets_ms)));
  }));
  const calls = new Map(run.calls.map((c) => [c.request_id, c]));
  const marks = new Map(body.spans.filter((s) => s.request_id).map((s) => {
    const c = calls.get(s.request_id);
    return [s.span_id, { label: `call ${number.get(s.request_id)}`, href: href(s.request_id), start_ms: c?.start_ms, e2e_ms: c?.e2e_ms }];
  }));
  renderWaterfall($("#run-waterfall"), body.spans, run.e2e_ms, marks);
}

// -- conversations across traces ------------------------------------------------------------------

async function loadConversations() {
  const { since, until, service } = filters();
  const body = await api("v1/conversations", { since, until, service, limit: 20 });
  $("#conversations-empty").hidden = body.conversations.length > 0;
  $("#conversations-table tbody").replaceChildren(...body.conversations.map((c) => el("tr", { "data-conversation": c.conversation_id },
    el("td", { class: "trace" }, el("a", { class: "conversation", href: `#conversation=${encodeURIComponent(c.conversation_id)}` }, c.conversation_id)),
    el("td", { class: "traces" }, c.traces), el("td", {}, c.first), el("td", {}, c.last), el("td", {}, c.services.join(", ")))));
}

// Rows of a run's (or a conversation's) critical path: the seven LLM buckets, the LLM subtotal,
// tool and app time, and the total they add up to.
function budgetRows(budget, total, totalLabel) {
  const parts = runParts(budget);
  const share = (v) => (total ? pct(v / total) : "–");
  return [
    ...BUCKETS.map((b) => el("tr", { "data-part": b }, el("td", { class: "b", style: `--c: var(--${b})` }, `LLM ${b}`),
      el("td", { class: "ms" }, num(parts[b])), el("td", {}, share(parts[b])))),
    el("tr", { "data-part": "llm", class: "subtotal" }, el("td", { class: "b" }, "LLM calls"), el("td", { class: "ms" }, num(budget.llm)), el("td", {}, share(budget.llm))),
    ...["tool", "app"].map((k) => el("tr", { "data-part": k }, el("td", { class: "b", style: `--c: var(--${k})` }, k === "tool" ? "tool calls" : "app (orchestration)"),
      el("td", { class: "ms" }, num(parts[k])), el("td", {}, share(parts[k])))),
    el("tr", { "data-part": "e2e" }, el("td", { class: "b" }, totalLabel), el("td", { class: "ms" }, num(total)), el("td", {}, "100.0%")),
  ];
}

// ``body`` is /v1/conversations/{id}'s answer.
function renderConversation(body) {
  $("#conversation").hidden = false;
  $("#conversation-id").textContent = body.conversation_id;
  $("#conversation-summary").textContent =
    `${body.turns.length} turn(s)${body.truncated ? ` (the latest of ${body.turn_count})` : ""} · ${body.start} → ${body.end}` +
    ` (${ms(body.duration_ms)}) · busy ${ms(body.busy_ms)}: LLM ${ms(body.critical_path_ms.llm)} · tool ${ms(body.critical_path_ms.tool)} · app ${ms(body.critical_path_ms.app)}`;
  $("#conversation-bar").replaceWith(Object.assign(stackedBar(runParts(body.critical_path_ms), "bar big", RUN_PARTS), { id: "conversation-bar" }));
  $("#conversation-budget tbody").replaceChildren(...budgetRows(body.critical_path_ms, body.busy_ms, "the turns' e2e"));
  $("#conversation-turns tbody").replaceChildren(...body.turns.map((t, i) => el("tr", { "data-trace": t.trace_id },
    el("td", {}, `turn ${i + 1}`),
    el("td", { class: "trace" }, el("a", { class: "turn", href: `#trace=${t.trace_id}`, title: t.trace_id }, t.trace_id.slice(0, 16))),
    el("td", {}, `${t.root.name} (${t.root.service})`), el("td", {}, ms(t.offset_ms)), el("td", { class: "gap" }, ms(t.gap_ms)),
    el("td", { class: "e2e" }, num(t.e2e_ms)), el("td", { class: "llm" }, num(t.critical_path_ms.llm)),
    el("td", { class: "tool" }, num(t.critical_path_ms.tool)), el("td", { class: "app" }, num(t.critical_path_ms.app)),
    el("td", {}, `${t.calls} / ${t.tools}`),
    el("td", { class: "budget" }, stackedBar(runParts(t.critical_path_ms), "bar", RUN_PARTS)))));
  $("#conversation-tools").textContent = body.tools.length
    ? "Tools: " + body.tools.map((t) => `${t.tool} ×${t.calls}, ${ms(t.on_critical_path_ms)} on the path`).join(" · ")
    : "no tool calls";
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
  const tasks = [loadSummary, loadTail, loadDiagnosis, loadGpu, loadSlowest, loadConversations, loadCompare, ...VIEWS].map((t) => run(t));
  const results = await Promise.allSettled(tasks);
  document.body.dataset.loaded = results.every((r) => r.status === "fulfilled") ? "ok" : "error";
}

function fromHash(key) {
  const m = new RegExp(`[#&]${key}=([^&]+)`).exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

// The card the address opened, brought into view; again once the charts above it have drawn
// (they change its place), unless the reader has scrolled meanwhile.
let revealed = null;
function reveal(card) {
  revealed = card;
  card.scrollIntoView({ block: "start" });
}
for (const type of ["wheel", "touchstart", "keydown"]) {
  window.addEventListener(type, () => { revealed = null; }, { passive: true });
}

// ``#trace=ID``: a request id (``TRACE-SPAN``), or a trace id. A trace with one call shows that
// request; one with several (or none) shows the run, and ``&call=REQUEST_ID`` opens one of its
// calls below it. A trace id is asked as a trace (the run names its calls), so the page never
// asks for a multi-call trace as one request. What opens is brought into view.
async function openFromHash() {
  const id = fromHash("trace"), call = fromHash("call"), conversation = fromHash("conversation");
  if (conversation) {
    document.body.dataset.conversation = "loading";
    try {
      await run(async () => renderConversation(await api(`v1/conversations/${encodeURIComponent(conversation)}`)));
      document.body.dataset.conversation = "ok";
      if (!id) reveal($("#conversation"));
    } catch (_) { document.body.dataset.conversation = "error"; }
  }
  if (!id) return;
  document.body.dataset.request = "loading";
  try {
    let shown = $("#request");
    await run(async () => {
      if (id.includes("-")) {
        await loadRequest(id);
        $("#run").hidden = true;
        return;
      }
      const body = await api(`v1/traces/${encodeURIComponent(id)}`);
      if (body.run.calls.length === 1) {
        await loadRequest(body.run.calls[0].request_id);
        $("#run").hidden = true;
        return;
      }
      $("#request-body").hidden = true;
      renderRun(body, call);
      if (call) await loadRequest(call);
      else { $("#request-id").textContent = ""; $("#trace-input").value = id; shown = $("#run"); }
    });
    reveal(shown);
    document.body.dataset.request = "ok";
  } catch (_) { document.body.dataset.request = "error"; }
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
  window.addEventListener("hashchange", () => { if (windowFromHash()) refresh(); openFromHash(); });
  await start_data();
}

// ``#since=...&until=...`` (RFC 3339: an SLO alert links to the window that burnt its budget)
// sets the window, ``&service=`` and ``&model=`` the filters.
function windowFromHash() {
  const since = fromHash("since");
  if (since) state.range = { since, until: fromHash("until") || undefined };
  for (const key of ["service", "model"]) {
    const value = fromHash(key);
    if (!value) continue;
    const select = $(`#${key}`);
    if (![...select.options].some((o) => o.value === value)) select.append(el("option", { value }, value));
    select.value = value;
  }
  if (typeof showRange === "function") showRange();
  return Boolean(since);
}

// A page opened without a window in its address opens on the data: when the requests of the
// menu's window span less than half of it (a demo's 30 s, a service that just started), the
// window is theirs, with a step's margin, so they are not a sliver at the edge of every chart.
async function openOnData() {
  if (state.range) return;
  const body = await api("v1/attribution/timeseries", { since: $("#window").value, service: $("#service").value, model: $("#model").value });
  const busy = body.series[0].points.filter((p) => p.count);
  if (!busy.length) return;
  const { since_ns: lo, until_ns: hi } = body.window;
  const first = busy[0].start_ns, last = busy[busy.length - 1].end_ns;
  if (last - first >= (hi - lo) / 2) return;
  const margin = body.step_s * 1e9;
  const iso = (ns) => new Date(ns / 1e6).toISOString();
  state.range = { since: iso(Math.max(lo, first - margin)), until: iso(Math.min(hi, last + margin)) };
  if (typeof showRange === "function") showRange();
}

async function start_data() {
  try { await run(loadServices); } catch (_) { document.body.dataset.loaded = "error"; return; }
  if (!windowFromHash()) {
    try { await run(openOnData); } catch (_) { /* the menu's window, as the page would anyway */ }
  }
  await Promise.all([refresh(), openFromHash()]);
  if (revealed && !revealed.hidden) revealed.scrollIntoView({ block: "start" });
  document.body.dataset.settled = "ok";
}

start();
