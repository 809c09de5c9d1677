// looptrace viewer: plain JavaScript, no framework, no build step.
//
// Safety rule for this file: values that come from spans reach the page only through
// textContent, element properties and setAttribute on non-script attributes (see el() below).
// No string is ever parsed as markup here, so a span named "<script>" is shown as text.
"use strict";

const LAG_MARK_MS = 10; // a span whose loop lag exceeded this gets a marker in the waterfall
const COLLAPSE_CHARS = 2048; // JSON longer than this starts collapsed
const PAGE_SIZE = 50;
const FOLD_ABOVE = 500; // a trace with more spans opens folded below its roots' children
const SVG_NS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------------------------------------
// DOM and data helpers

// el("a", {href: "/x", className: "y"}, "text", child): props are set as properties (or as
// attributes for data-* and aria-*), children are nodes or strings (always text nodes).
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key.startsWith("data-") || key.startsWith("aria-")) node.setAttribute(key, String(value));
    else node[key] = value;
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat(Infinity)) {
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { headers: { accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function show(...children) {
  const main = document.getElementById("main");
  main.replaceChildren();
  append(main, children);
}

// Listeners a page adds outside #main (window, document) end when the page is drawn again, as
// live mode (live.js) does when the store changes: freshPage() at the start of such a page.
let pageListeners = new AbortController();
function freshPage() {
  pageListeners.abort();
  pageListeners = new AbortController();
  return pageListeners.signal;
}

// What the open trace page would keep across a redraw (scroll, folds, search): set by
// tracePage, read by live.js, which hands it back to tracePage(traceId, keep).
let traceState = null;

function fail(error) {
  show(el("p", { className: "error-text" }, `Could not load this page: ${error.message}`));
}

function fmtDuration(ns) {
  if (ns === null || ns === undefined) return "—";
  const ms = ns / 1e6;
  if (ms < 1) return `${(ns / 1e3).toFixed(ns < 1e4 ? 1 : 0)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 2 : 1)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)} m ${Math.round((ms % 60000) / 1000)} s`;
}

function fmtTime(ns) {
  if (!ns) return "—";
  const d = new Date(ns / 1e6);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function fmtNumber(x, digits = 3) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  return x.toFixed(digits);
}

// USD: blank when unknown (never $0 for "no price"); a "+" when some LLM calls had no price.
function fmtCost(usd, uncosted = 0) {
  if (usd === null || usd === undefined) return "";
  // Cents past a dollar, four decimals past a cent, two significant digits below that.
  const text = usd === 0 ? "$0" : usd >= 1 ? `$${usd.toFixed(2)}` : usd >= 0.01 ? `$${usd.toFixed(4)}`
    : usd < 1e-8 ? "<$0.00000001" : `$${usd.toFixed(1 - Math.floor(Math.log10(usd)))}`;
  return uncosted ? `${text}+` : text;
}

function costTitle(usd, uncosted = 0) {
  const parts = [];
  if (usd !== null && usd !== undefined) parts.push(`${usd} USD`);
  if (uncosted) parts.push(`${uncosted} LLM call${uncosted === 1 ? "" : "s"} of unknown price not included`);
  return parts.join("; ");
}

function costCell(usd, uncosted = 0) {
  return el("td", { className: "num cost", title: costTitle(usd, uncosted) }, fmtCost(usd, uncosted));
}

function fmtTokens(tokensIn, tokensOut) {
  if ((tokensIn ?? null) === null && (tokensOut ?? null) === null) return "";
  return `${tokensIn ?? 0} / ${tokensOut ?? 0}`;
}

function hasLLM(rows) {
  return rows.some((r) => r.input_tokens != null || r.output_tokens != null || r.cost_usd != null || r.uncosted_calls);
}

function badge(status) {
  const label = status === "in_progress" ? "in progress" : status;
  return el("span", { className: `badge ${status}` }, label);
}

// Pretty-print a payload: JSON strings are re-indented; other strings are shown as they are.
function pretty(value) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "string") return JSON.stringify(value, null, 2);
  try {
    return JSON.stringify(JSON.parse(value), null, 2);
  } catch {
    return value;
  }
}

// A <pre> for small values, a collapsed <details> past COLLAPSE_CHARS.
function jsonBlock(value, note) {
  const text = pretty(value);
  const pre = el("pre", { className: "json" }, text);
  if (text.length <= COLLAPSE_CHARS) return note ? el("div", {}, pre, note) : pre;
  const kb = (text.length / 1024).toFixed(1);
  return el("details", {}, el("summary", {}, `${kb} KB — show`), pre, note);
}

// looptrace exports bytes as base64 text (docs/serialization.md): say so when a payload is one.
const BASE64 = /^"(?:[A-Za-z0-9+/]{4}){4,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?(?:\.\.\.<truncated: (\d+) bytes>)?"$/;
function bytesHint(value) {
  if (typeof value !== "string") return null;
  const m = BASE64.exec(value);
  if (!m) return null;
  const body = value.slice(1, value.indexOf(m[1] ? "..." : '"', 1));
  const size = m[1] ? Number(m[1]) : Math.floor((body.length * 3) / 4) - (body.endsWith("==") ? 2 : body.endsWith("=") ? 1 : 0);
  return el("p", { className: "muted bytes-hint" }, `bytes, shown as base64: ${size.toLocaleString()} bytes${m[1] ? " (the first shown)" : ""}`);
}

function query() {
  return new URLSearchParams(location.search);
}

function link(href, text) {
  return el("a", { href }, text);
}

// ---------------------------------------------------------------------------------------------
// Traces: the list

const TRACE_FILTERS = ["q", "name", "service", "status", "min_duration_ms", "range", "experiment", "user", "session"];
// Filters that may be given more than once (every one must match).
const MULTI_FILTERS = ["attr", "tag", "meta"];
const TIME_RANGES = [["900", "last 15 minutes"], ["3600", "last hour"], ["86400", "last 24 hours"], ["604800", "last 7 days"]];

async function tracesPage() {
  const q = query();
  const offset = Math.max(0, parseInt(q.get("offset") || "0", 10) || 0);
  const params = new URLSearchParams({ limit: String(PAGE_SIZE + 1), offset: String(offset) });
  for (const key of TRACE_FILTERS) if (q.get(key)) params.set(key, q.get(key));
  for (const key of MULTI_FILTERS) for (const v of q.getAll(key)) if (v) params.append(key, v);
  const [data, services] = await Promise.all([api(`/api/traces?${params}`), api("/api/services")]);
  const traces = data.traces.slice(0, PAGE_SIZE);
  const more = data.traces.length > PAGE_SIZE;

  // A GET form: submitting puts the filters in the address, so a filtered list can be shared.
  const select = (name, options, any) => el("select", { name },
    el("option", { value: "" }, any),
    options.map(([value, text]) => el("option", { value, selected: q.get(name) === value }, text)));
  // The search box: words of span names, attribute values and error messages (q), and span
  // attributes as key=value (attr, repeatable), looked up in the store's search index.
  const form = el("form", { className: "filters", method: "get", action: "/" },
    el("input", { name: "q", type: "search", id: "trace-search", className: "search",
      placeholder: "search names, values, errors…", value: q.get("q") || "" }),
    multiInputs(q, "attr", "attribute key=value"),
    el("input", { name: "name", placeholder: "name contains…", value: q.get("name") || "" }),
    select("service", services.services.map((s) => [s, s]), "any service"),
    select("status", ["ok", "error", "unset", "in_progress"].map((s) => [s, s]), "any status"),
    el("input", { name: "min_duration_ms", type: "number", min: "0", step: "any", placeholder: "min ms",
      className: "narrow", value: q.get("min_duration_ms") || "" }),
    select("range", TIME_RANGES, "any time"),
    el("input", { name: "experiment", placeholder: "experiment id", value: q.get("experiment") || "" }),
    el("input", { name: "user", placeholder: "user id", className: "mid", value: q.get("user") || "" }),
    el("input", { name: "session", placeholder: "session id", className: "mid", value: q.get("session") || "" }),
    multiInputs(q, "tag", "tag"),
    multiInputs(q, "meta", "metadata key=value"),
    el("button", { type: "submit" }, "Filter"),
    [...TRACE_FILTERS, ...MULTI_FILTERS].some((k) => q.get(k)) ? link("/", "clear") : null);

  // Columns for what a page's traces carry: LLM tokens and cost, scores, sessions and users.
  const llm = hasLLM(traces);
  const scored = traces.some((t) => t.score_count);
  const people = traces.some((t) => t.session_id || t.user_id);

  const rows = traces.map((t) => el("tr", { "data-trace-id": t.trace_id },
    el("td", {}, link(`/traces/${encodeURIComponent(t.trace_id)}`, t.name)),
    el("td", { className: "mono" }, fmtTime(t.start_ns)),
    el("td", { className: "num" }, t.in_progress ? "running" : fmtDuration(t.duration_ns)),
    el("td", {}, badge(t.error_count > 0 && t.status !== "error" && t.status !== "in_progress" ? "error" : t.status)),
    el("td", { className: "num" }, String(t.span_count)),
    el("td", { className: "num" }, t.error_count ? String(t.error_count) : ""),
    llm ? el("td", { className: "num tokens" }, fmtTokens(t.input_tokens, t.output_tokens)) : null,
    llm ? costCell(t.cost_usd, t.uncosted_calls) : null,
    scored ? el("td", { className: "num scores" }, t.score_count ? String(t.score_count) : "") : null,
    people ? el("td", { className: "session" }, t.session_id ? link(`/sessions/${encodeURIComponent(t.session_id)}`, clipText(t.session_id, 14)) : "") : null,
    people ? el("td", { className: "user" }, t.user_id ? link(`/?user=${encodeURIComponent(t.user_id)}`, clipText(t.user_id, 14)) : "") : null,
    el("td", {}, t.experiment_id ? link(`/experiments/${encodeURIComponent(t.experiment_id)}`, t.experiment_id.slice(0, 8)) : ""),
    el("td", { className: "muted" }, t.service_name || "")));
  const heads = [["Name"], ["Start"], ["Duration", "num"], ["Status"], ["Spans", "num"], ["Errors", "num"],
    llm && ["Tokens in / out", "num"], llm && ["Cost", "num"], scored && ["Scores", "num"],
    people && ["Session"], people && ["User"], ["Experiment"], ["Service"]].filter(Boolean);
  const table = el("table", { className: "grid traces" },
    el("thead", {}, el("tr", {}, heads.map(([h, cls]) => el("th", { className: cls || "" }, h)))),
    el("tbody", {}, rows));

  const page = (o) => { const p = query(); p.set("offset", String(o)); return `/?${p}`; };
  const pager = el("div", { className: "pager" },
    el("a", { href: page(Math.max(0, offset - PAGE_SIZE)), className: offset ? "" : "disabled" }, "← newer"),
    el("span", { className: "muted" }, traces.length ? `${offset + 1}–${offset + traces.length}` : ""),
    el("a", { href: page(offset + PAGE_SIZE), className: more ? "" : "disabled" }, "older →"));

  show(el("h1", {}, "Traces"), form,
    traces.length ? table : el("p", { className: "muted" }, offset ? "No more traces." : "No traces yet: run your program (or `looptrace demo`) with this store."),
    pager);
}

// One text input per value already in the address (every one must match), and an empty one to
// add another.
function multiInputs(q, name, placeholder) {
  const values = q.getAll(name).filter(Boolean);
  return [...values, ""].map((v) => el("input", { name, placeholder, className: "mid", value: v }));
}

function clipText(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

// ---------------------------------------------------------------------------------------------
// Sessions: the list, and one session's traces in conversation order

async function sessionsPage() {
  const q = query();
  const offset = Math.max(0, parseInt(q.get("offset") || "0", 10) || 0);
  const params = new URLSearchParams({ limit: String(PAGE_SIZE + 1), offset: String(offset) });
  for (const key of ["user", "range"]) if (q.get(key)) params.set(key, q.get(key));
  const data = await api(`/api/sessions?${params}`);
  const sessions = data.sessions.slice(0, PAGE_SIZE);
  const more = data.sessions.length > PAGE_SIZE;
  const form = el("form", { className: "filters", method: "get", action: "/sessions" },
    el("input", { name: "user", placeholder: "user id", value: q.get("user") || "" }),
    el("select", { name: "range" }, el("option", { value: "" }, "any time"),
      TIME_RANGES.map(([value, text]) => el("option", { value, selected: q.get("range") === value }, text))),
    el("button", { type: "submit" }, "Filter"),
    q.get("user") || q.get("range") ? link("/sessions", "clear") : null);
  const rows = sessions.map((s) => el("tr", { "data-session-id": s.session_id },
    el("td", { title: s.session_id }, link(`/sessions/${encodeURIComponent(s.session_id)}`, clipText(s.session_id, 24))),
    el("td", { className: "num" }, String(s.trace_count)),
    el("td", { className: "users" }, usersText(s)),
    el("td", { className: "mono" }, fmtTime(s.first_start_ns)),
    el("td", { className: "mono" }, fmtTime(s.last_ns)),
    el("td", { className: "num tokens" }, fmtTokens(s.input_tokens, s.output_tokens)),
    costCell(s.cost_usd, s.uncosted_calls),
    el("td", { className: "num" }, s.score_count ? String(s.score_count) : ""),
    el("td", { className: `num${s.error_count ? " worse" : ""}` }, s.error_count ? String(s.error_count) : ""),
    payloadCell(s.first_input)));
  const page = (o) => { const p = query(); p.set("offset", String(o)); return `/sessions?${p}`; };
  show(el("h1", {}, "Sessions"), form,
    sessions.length
      ? el("table", { className: "grid sessions" },
        el("thead", {}, el("tr", {}, el("th", {}, "Session"), el("th", { className: "num" }, "Traces"), el("th", {}, "Users"),
          el("th", {}, "First"), el("th", {}, "Last"), el("th", { className: "num" }, "Tokens in / out"), el("th", { className: "num" }, "Cost"),
          el("th", { className: "num" }, "Scores"), el("th", { className: "num" }, "Failed"), el("th", {}, "First input"))),
        el("tbody", {}, rows))
      : el("p", { className: "muted" }, offset ? "No more sessions." : "No sessions yet: traces join a session through `session.id`, which `looptrace.attributes(session_id=...)` sets on every span."),
    el("div", { className: "pager" },
      el("a", { href: page(Math.max(0, offset - PAGE_SIZE)), className: offset ? "" : "disabled" }, "← newer"),
      el("span", { className: "muted" }, sessions.length ? `${offset + 1}–${offset + sessions.length}` : ""),
      el("a", { href: page(offset + PAGE_SIZE), className: more ? "" : "disabled" }, "older →")));
}

function usersText(s) {
  const shown = s.user_ids.slice(0, 3).map((u, i) => [i ? ", " : "", link(`/?user=${encodeURIComponent(u)}`, u)]);
  return [shown, s.user_count > 3 ? el("span", { className: "muted" }, ` +${s.user_count - 3}`) : null];
}

async function sessionPage(sessionId) {
  const s = await api(`/api/sessions/${encodeURIComponent(sessionId)}?preview=2000`);
  const card = (k, v, attrs = {}) => el("div", { className: "card", ...attrs }, el("div", { className: "k" }, k), el("div", { className: "v" }, v));
  const multiUser = s.user_count > 1;
  const turns = s.traces.map((t, i) => el("tr", { "data-trace-id": t.trace_id },
    el("td", { className: "num" }, String(i + 1)),
    el("td", {}, link(`/traces/${encodeURIComponent(t.trace_id)}`, t.name),
      el("div", { className: "mono muted" }, fmtTime(t.start_ns)),
      multiUser && t.user_id ? el("div", { className: "muted" }, `user ${t.user_id}`) : null),
    payloadCell(t.input), payloadCell(t.output),
    el("td", { className: "num tokens" }, fmtTokens(t.input_tokens, t.output_tokens)),
    costCell(t.cost_usd, t.uncosted_calls),
    el("td", { className: "num" }, t.in_progress ? "running" : fmtDuration(t.duration_ns)),
    el("td", {}, badge(t.error_count > 0 && t.status === "ok" ? "error" : t.status),
      t.score_count ? el("span", { className: "score-badge", title: "scores attached to this trace's spans" }, `${t.score_count} score${t.score_count === 1 ? "" : "s"}`) : null)));
  show(
    el("div", { className: "trace-head" }, el("h1", {}, s.session_id),
      el("span", { className: "muted" }, `${fmtTime(s.first_start_ns)} → ${fmtTime(s.last_ns)}`),
      link(`/?session=${encodeURIComponent(s.session_id)}`, "in the trace list")),
    el("div", { className: "cards" },
      card("traces", String(s.trace_count)),
      card(s.user_count === 1 ? "user" : "users", s.user_count ? usersText(s) : "—", { "data-users": "" }),
      card("LLM tokens", s.input_tokens != null || s.output_tokens != null ? `${s.input_tokens ?? 0} in · ${s.output_tokens ?? 0} out` : "—", { "data-tokens": "" }),
      card("cost", fmtCost(s.cost_usd, s.uncosted_calls) || "—", { "data-cost": "", title: costTitle(s.cost_usd, s.uncosted_calls) }),
      card("first to last", fmtDuration(s.last_ns - s.first_start_ns))),
    el("table", { className: "grid session-traces" },
      el("thead", {}, el("tr", {}, el("th", { className: "num" }, "#"), el("th", {}, "Trace"), el("th", {}, "Input"), el("th", {}, "Output"),
        el("th", { className: "num" }, "Tokens in / out"), el("th", { className: "num" }, "Cost"), el("th", { className: "num" }, "Duration"), el("th", {}, "Status"))),
      el("tbody", {}, turns)),
    s.truncated ? el("p", { className: "truncated" }, `Showing the first ${s.traces.length.toLocaleString()} of ${s.trace_count.toLocaleString()} traces.`) : null);
}

// ---------------------------------------------------------------------------------------------
// One trace: waterfall and span panel

// Depth-first order with depths; spans whose parent is not in the trace are roots.
function spanTree(spans) {
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  const children = new Map();
  const roots = [];
  for (const s of spans) {
    if (s.parent_span_id && byId.has(s.parent_span_id)) {
      if (!children.has(s.parent_span_id)) children.set(s.parent_span_id, []);
      children.get(s.parent_span_id).push(s);
    } else {
      roots.push(s);
    }
  }
  const out = [];
  const seen = new Set();
  const stack = roots.slice().reverse().map((s) => [s, 0]);
  while (stack.length) {
    const [s, depth] = stack.pop();
    if (seen.has(s.span_id)) continue; // a cycle in bad data must not hang the page
    seen.add(s.span_id);
    out.push({ span: s, depth });
    const kids = children.get(s.span_id) || [];
    for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], depth + 1]);
  }
  return out;
}

function isOpen(span) {
  return span.in_progress || !span.end_ns || span.attributes?.["looptrace.in_progress"] === true;
}

function lagOf(span) {
  const lag = span.lag_max_ms ?? span.attributes?.["looptrace.loop.lag_max_ms"];
  return typeof lag === "number" ? lag : null;
}

function timeAxis(t0, total) {
  const ticks = el("div", { className: "ticks" });
  for (let i = 0; i <= 4; i++) {
    const mark = el("span", {}, i === 0 ? "0" : fmtDuration((total * i) / 4));
    mark.style.left = `${i * 25}%`;
    ticks.appendChild(mark);
  }
  return el("div", { className: "wf-axis" }, el("div", { className: "label muted" }, ""), ticks);
}

// A score attached after the fact is a span of its own (looptrace.span.type "score") parented to
// the span it scores, with the GenAI evaluation attributes.
function isScore(span) {
  return span.attributes?.["looptrace.span.type"] === "score";
}

function scoreOf(span) {
  const a = span.attributes || {};
  return {
    name: a["gen_ai.evaluation.name"] ?? span.name,
    value: a["gen_ai.evaluation.score.value"],
    label: a["gen_ai.evaluation.score.label"],
    comment: a["gen_ai.evaluation.explanation"],
    time: span.start_ns,
    span_id: span.span_id,
  };
}

function fmtScore(value) {
  if (typeof value !== "number") return value === undefined || value === null ? "" : String(value);
  return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(3)));
}

function scoreText(sc) {
  const value = fmtScore(sc.value);
  if (value && sc.label !== undefined && sc.label !== null) return `${sc.name}: ${value} (${sc.label})`;
  return `${sc.name}: ${value || sc.label || "—"}`;
}

function scoreBadges(scores) {
  return (scores || []).map((sc) => el("span", { className: "score-badge", title: sc.comment || "", "data-score-name": sc.name }, scoreText(sc)));
}

// On a waterfall row, where the name column is narrow: one score in full, several as a count
// (each on hover, and in the span's Scores table).
function rowScoreBadge(scores) {
  if (!scores?.length) return null;
  if (scores.length === 1) return scoreBadges(scores);
  return el("span", { className: "score-badge", title: scores.map((sc) => scoreText(sc) + (sc.comment ? ` — ${sc.comment}` : "")).join("\n") },
    `${scores.length} scores`);
}

function scoresTable(scores) {
  return el("table", { className: "grid attributes scores" }, el("tbody", {}, scores.map((sc) => el("tr", { "data-score-name": sc.name },
    el("td", { className: "mono" }, sc.name),
    el("td", { className: "num" }, fmtScore(sc.value)),
    el("td", {}, sc.label ?? ""),
    el("td", {}, sc.comment ?? "", el("div", { className: "muted" }, fmtTime(sc.time)))))));
}

async function tracePage(traceId, keep = null) {
  const data = await api(`/api/traces/${encodeURIComponent(traceId)}`);
  const signal = freshPage();
  const trace = data.trace;
  // Scores are shown on the span they score, not as rows: one sent minutes later would stretch
  // the time axis. A score whose span is not here is shown above the waterfall.
  const spans = [];
  const scoreSpans = [];
  for (const s of data.spans) (isScore(s) ? scoreSpans : spans).push(s);
  const present = new Set(spans.map((s) => s.span_id));
  const scoresOf = new Map();
  const orphanScores = [];
  for (const s of scoreSpans) {
    if (!present.has(s.parent_span_id)) { orphanScores.push(scoreOf(s)); continue; }
    if (!scoresOf.has(s.parent_span_id)) scoresOf.set(s.parent_span_id, []);
    scoresOf.get(s.parent_span_id).push(scoreOf(s));
  }
  const ordered = spanTree(spans);
  // Loops, not Math.min(...spans): a spread of 100,000 arguments overflows the stack.
  let t0 = Infinity;
  let t1 = -Infinity;
  for (const s of spans) {
    t0 = Math.min(t0, s.start_ns);
    t1 = Math.max(t1, s.start_ns, s.end_ns || 0);
    for (const e of s.events || []) t1 = Math.max(t1, e.time_ns || 0);
  }
  const total = Math.max(t1 - t0, 1);
  const pct = (ns) => `${(((ns - t0) / total) * 100).toFixed(3)}%`;

  const panel = el("aside", { className: "panel", id: "span-panel" }, el("p", { className: "muted" }, "Select a span."));
  const n = ordered.length;
  // Depth-first order keeps a subtree contiguous: end[i] is one past its last descendant.
  const end = new Int32Array(n);
  const parentOf = new Int32Array(n).fill(-1);
  const open = [];
  for (let i = 0; i < n; i++) {
    const d = ordered[i].depth;
    while (open.length && ordered[open[open.length - 1]].depth >= d) end[open.pop()] = i;
    parentOf[i] = open.length ? open[open.length - 1] : -1;
    open.push(i);
  }
  while (open.length) end[open.pop()] = n;
  const indexOf = new Map(ordered.map((o, i) => [o.span.span_id, i]));
  // A link to a score's own span selects the span it scores.
  for (const s of scoreSpans) if (indexOf.has(s.parent_span_id)) indexOf.set(s.span_id, indexOf.get(s.parent_span_id));
  // A large trace opens with only its roots' children shown; rows are built when first shown,
  // so a 10,000-span trace draws the few dozen rows it opens with, not all of them.
  const folded = new Uint8Array(n);
  const foldBelowRoots = () => { for (let i = 0; i < n; i++) if (ordered[i].depth >= 1 && end[i] > i + 1) folded[i] = 1; };
  if (n > FOLD_ABOVE) foldBelowRoots();
  // Redrawn with more spans: the spans seen before keep their fold, new ones take the default.
  if (keep) for (let i = 0; i < n; i++) if (keep.known.has(ordered[i].span.span_id)) folded[i] = keep.folded.has(ordered[i].span.span_id) ? 1 : 0;
  const rowEls = new Array(n);
  let shown = [];

  const buildRow = (i) => {
    const { span, depth } = ordered[i];
    const running = isOpen(span);
    const lag = lagOf(span);
    const error = span.status === "error" || span.status_code === 2;
    const lagged = lag !== null && lag > LAG_MARK_MS;
    const toggle = end[i] > i + 1
      ? el("button", { className: "fold", type: "button", tabIndex: -1, title: `${end[i] - i - 1} spans below`,
        onclick: (e) => { e.stopPropagation(); setFolded(i, !folded[i]); } })
      : el("span", { className: "fold leaf" });
    const label = el("div", { className: "label", title: span.name }, toggle,
      el("span", { className: "name" }, span.name),
      el("span", { className: "dur" }, running ? "running" : fmtDuration(span.end_ns - span.start_ns)),
      rowScoreBadge(scoresOf.get(span.span_id)),
      lagged ? el("span", { className: "lag-mark", title: "the event loop was blocked while this span ran" }, `⚠ lag ${lag.toFixed(1)} ms`) : null);
    label.style.paddingLeft = `${4 + depth * 14}px`;
    const bar = el("div", { className: `bar${running ? " open" : ""}${lagged ? " lagged" : ""}` });
    bar.style.left = pct(span.start_ns);
    bar.style.width = `${(((running ? t1 : span.end_ns) - span.start_ns) / total) * 100}%`;
    const track = el("div", { className: "track" }, bar);
    for (const event of span.events || []) {
      const mark = el("div", { className: "event-mark", title: event.name });
      mark.style.left = pct(event.time_ns);
      track.appendChild(mark);
    }
    const row = el("div", {
      className: `wf-row${error ? " error" : ""}`, "data-span-id": span.span_id, "data-index": String(i), tabIndex: -1,
      onclick: () => choose(i),
    }, label, track);
    return row;
  };
  const paintToggle = (i) => {
    const button = rowEls[i]?.querySelector("button.fold");
    if (!button) return;
    button.textContent = folded[i] ? "▸" : "▾";
    button.setAttribute("aria-expanded", folded[i] ? "false" : "true");
    rowEls[i].classList.toggle("folded", folded[i] === 1);
  };

  const rowsBox = el("div", { className: "wf-rows", id: "wf-rows", tabIndex: 0 });
  const render = () => {
    // Moving rows into the fragment drops the focus: put it back where the keyboard had it.
    const focused = rowsBox.contains(document.activeElement) ? document.activeElement : null;
    shown = [];
    for (let i = 0; i < n; i = folded[i] ? end[i] : i + 1) shown.push(i);
    const frag = document.createDocumentFragment();
    for (const i of shown) {
      if (!rowEls[i]) rowEls[i] = buildRow(i);
      paintToggle(i);
      rowEls[i].classList.toggle("match", matchSet.has(i));
      frag.appendChild(rowEls[i]);
    }
    rowsBox.replaceChildren(frag);
    if (focused) (focused.isConnected ? focused : rowsBox).focus({ preventScroll: true });
    drawMinimap();
  };
  const setFolded = (i, value) => { folded[i] = value ? 1 : 0; render(); };
  const reveal = (i) => {
    let changed = false;
    for (let p = parentOf[i]; p >= 0; p = parentOf[p]) if (folded[p]) { folded[p] = 0; changed = true; }
    if (changed) render();
  };
  const choose = (i) => { location.hash = `span=${ordered[i].span.span_id}`; };
  const selectedIndex = () => indexOf.get(new URLSearchParams(location.hash.slice(1)).get("span")) ?? -1;

  // Keyboard: up/down (or k/j) move, left/right (or h/l) fold and unfold, "/" searches.
  rowsBox.addEventListener("keydown", (e) => {
    const i = selectedIndex();
    const at = shown.indexOf(i);
    let target = -1;
    if (e.key === "ArrowDown" || e.key === "j") target = shown[Math.min(at + 1, shown.length - 1)] ?? shown[0];
    else if (e.key === "ArrowUp" || e.key === "k") target = shown[Math.max(at - 1, 0)] ?? shown[0];
    else if ((e.key === "ArrowRight" || e.key === "l") && i >= 0) {
      if (folded[i]) setFolded(i, false); else if (end[i] > i + 1) target = i + 1;
    } else if ((e.key === "ArrowLeft" || e.key === "h") && i >= 0) {
      if (end[i] > i + 1 && !folded[i]) setFolded(i, true); else if (parentOf[i] >= 0) target = parentOf[i];
    } else if (e.key === "Home") target = shown[0];
    else if (e.key === "End") target = shown[shown.length - 1];
    else return;
    e.preventDefault();
    if (target >= 0) choose(target);
  });

  // Search in the trace: names, attribute keys and values; every match is revealed.
  const haystacks = new Array(n);
  const haystack = (i) => {
    if (haystacks[i] === undefined) {
      const s = ordered[i].span;
      const parts = [s.name, s.span_id];
      for (const [k, v] of Object.entries(s.attributes || {})) parts.push(k, typeof v === "string" ? v : JSON.stringify(v));
      haystacks[i] = parts.join(" ").toLowerCase();
    }
    return haystacks[i];
  };
  let matches = [];
  let matchSet = new Set();
  let current = -1;
  const search = el("input", { type: "search", id: "trace-search", placeholder: "find in trace (/)", autocomplete: "off" });
  const count = el("span", { className: "muted", id: "search-count" });
  const goTo = (k) => {
    if (!matches.length) return;
    current = (k + matches.length) % matches.length;
    count.textContent = `${current + 1} of ${matches.length}`;
    choose(matches[current]);
  };
  const runSearch = () => {
    const q = search.value.trim().toLowerCase();
    matches = [];
    if (q) for (let i = 0; i < n; i++) if (haystack(i).includes(q)) matches.push(i);
    const before = matchSet;
    matchSet = new Set(matches);
    let opened = false;
    for (const i of matches) {
      for (let p = parentOf[i]; p >= 0; p = parentOf[p]) if (folded[p]) { folded[p] = 0; opened = true; }
    }
    current = -1;
    count.textContent = q ? (matches.length ? `${matches.length} found` : "no match") : "";
    if (opened) {
      render();
    } else {
      // Nothing to open: mark the rows in place rather than re-laying out every row.
      for (const i of before) rowEls[i]?.classList.remove("match");
      for (const i of matches) rowEls[i]?.classList.add("match");
    }
  };
  let pending = null;
  search.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(runSearch, 120); });
  search.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      if (pending) { clearTimeout(pending); pending = null; runSearch(); }
      goTo(e.shiftKey ? current - 1 : current + 1);
    } else if (e.key === "Escape") {
      search.value = "";
      runSearch();
      rowsBox.focus();
    }
  });
  const onSlash = (e) => {
    if (e.key === "/" && document.activeElement !== search && !(e.target instanceof HTMLInputElement)) {
      e.preventDefault();
      search.focus();
    }
  };
  document.addEventListener("keydown", onSlash, { signal });

  // The minimap: every span of the trace as a line (time across, depth-first order down), the
  // rows in view as a frame; a click there scrolls the waterfall to that span.
  const minimap = el("canvas", { className: "minimap", id: "minimap", height: 56, title: "click to jump" });
  const frame = el("div", { className: "minimap-frame" });
  const mapBox = el("div", { className: "minimap-box" }, minimap, frame);
  const drawMinimap = () => {
    const width = Math.max(minimap.clientWidth, 100);
    if (minimap.width !== width) minimap.width = width;
    const ctx = minimap.getContext("2d");
    if (!ctx) return;
    const h = minimap.height;
    ctx.clearRect(0, 0, width, h);
    const line = Math.max(1, h / n);
    for (let i = 0; i < n; i++) {
      const s = ordered[i].span;
      const e1 = isOpen(s) ? t1 : s.end_ns;
      const x = ((s.start_ns - t0) / total) * width;
      ctx.fillStyle = s.status === "error" || s.status_code === 2 ? "#d64545" : (lagOf(s) ?? 0) > LAG_MARK_MS ? "#e0a000" : "#5b7fd6";
      ctx.fillRect(x, (i / n) * h, Math.max(1, ((e1 - s.start_ns) / total) * width), line);
    }
    placeFrame();
  };
  const placeFrame = () => {
    if (!shown.length) return;
    const rowH = rowsBox.firstElementChild?.offsetHeight || 26;
    const first = shown[Math.min(shown.length - 1, Math.floor(rowsBox.scrollTop / rowH))];
    const last = shown[Math.min(shown.length - 1, Math.floor((rowsBox.scrollTop + rowsBox.clientHeight) / rowH))];
    const h = minimap.height;
    frame.style.top = `${(first / n) * h}px`;
    frame.style.height = `${Math.max(3, ((last + 1 - first) / n) * h)}px`;
  };
  rowsBox.addEventListener("scroll", placeFrame);
  minimap.addEventListener("click", (e) => {
    const i = Math.min(n - 1, Math.max(0, Math.floor((e.offsetY / minimap.clientHeight) * n)));
    reveal(i);
    choose(i);
  });

  const waterfall = el("div", { className: "waterfall", id: "waterfall" },
    el("div", { className: "wf-tools" }, search, count,
      el("button", { type: "button", id: "fold-all", onclick: () => { foldBelowRoots(); render(); } }, "fold all"),
      el("button", { type: "button", id: "unfold-all", onclick: () => { folded.fill(0); render(); } }, "unfold all"),
      el("span", { className: "muted keys" }, "↑↓ move · ←→ fold · / find")),
    mapBox, timeAxis(t0, total), rowsBox);

  let selected = null;
  const select = async () => {
    let i = selectedIndex();
    if (i < 0) i = indexOf.get(trace.root_span_id) ?? (n ? 0 : -1);
    if (i < 0) return;
    const id = ordered[i].span.span_id;
    reveal(i);
    const row = rowEls[i];
    if (row) {
      for (const r of rowsBox.querySelectorAll(".wf-row.selected")) r.classList.remove("selected");
      row.classList.add("selected");
      row.scrollIntoView({ block: "nearest" });
      if (document.activeElement === rowsBox || rowsBox.contains(document.activeElement)) row.focus({ preventScroll: true });
    }
    if (selected === id) return;
    selected = id;
    let span = ordered[i].span;
    // The trace came with payload previews; fetch the whole span when a preview was cut.
    const cut = (span.input_size ?? 0) > (span.input?.length ?? 0) || (span.output_size ?? 0) > (span.output?.length ?? 0);
    if (cut) {
      panel.replaceChildren(el("p", { className: "muted" }, "Loading span…"));
      try {
        const full = (await api(`/api/traces/${encodeURIComponent(traceId)}/spans/${encodeURIComponent(id)}`)).span;
        span = { ...full, input: full.attributes["input.value"] ?? null, output: full.attributes["output.value"] ?? null };
        ordered[i].span = span;
      } catch (error) {
        panel.replaceChildren(el("p", { className: "error-text" }, error.message));
        return;
      }
    }
    if (selected === id) panel.replaceChildren(...spanDetails(span, t0, scoresOf.get(id)));
  };
  window.addEventListener("hashchange", select, { signal });
  traceState = () => ({
    trace,
    scrollTop: rowsBox.scrollTop,
    search: search.value,
    known: new Set(ordered.map((o) => o.span.span_id)),
    folded: new Set(ordered.filter((_, i) => folded[i]).map((o) => o.span.span_id)),
  });

  show(
    el("div", { className: "trace-head" },
      el("h1", {}, trace.name),
      badge(trace.status),
      el("span", { className: "muted" }, `${fmtTime(trace.start_ns)} · ${trace.in_progress ? "running" : fmtDuration(trace.duration_ns)} · ${trace.span_count} spans`),
      trace.input_tokens != null || trace.output_tokens != null
        ? el("span", { className: "muted", id: "trace-tokens" }, `${trace.input_tokens ?? 0} in · ${trace.output_tokens ?? 0} out tokens`) : null,
      fmtCost(trace.cost_usd, trace.uncosted_calls)
        ? el("span", { className: "cost", id: "trace-cost", title: costTitle(trace.cost_usd, trace.uncosted_calls) }, fmtCost(trace.cost_usd, trace.uncosted_calls)) : null,
      trace.session_id ? el("span", {}, "session ", link(`/sessions/${encodeURIComponent(trace.session_id)}`, trace.session_id)) : null,
      trace.user_id ? el("span", {}, "user ", link(`/?user=${encodeURIComponent(trace.user_id)}`, trace.user_id)) : null,
      trace.experiment_id ? link(`/experiments/${encodeURIComponent(trace.experiment_id)}`, "experiment") : null,
      el("span", { className: "mono muted" }, trace.trace_id)),
    orphanScores.length
      ? el("div", { className: "orphan-scores", id: "orphan-scores" }, el("span", { className: "muted" }, "Scores on spans not in this trace: "), scoreBadges(orphanScores))
      : null,
    data.truncated
      ? el("p", { className: "truncated", id: "truncated" },
        `Showing the first ${spans.length.toLocaleString()} of ${trace.span_count.toLocaleString()} spans (by start time): the collector returns at most that many per trace.`)
      : null,
    el("div", { className: "trace-layout" }, waterfall, panel));
  if (keep?.search) { search.value = keep.search; runSearch(); }
  render();
  await select();
  if (keep) rowsBox.scrollTop = keep.scrollTop;
}

// Attributes shown in their own sections, not in the attribute table.
const HIDDEN_ATTRIBUTES = new Set(["input.value", "output.value", "input.mime_type", "output.mime_type",
  "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"]);

// Structured attribute values arrive as JSON text; the conversation needs them as objects.
function parsed(v) {
  if (typeof v !== "string" || !/^\s*[[{]/.test(v)) return v;
  try { return JSON.parse(v); } catch { return v; }
}

// One message part of the GenAI conventions: text, a tool call, a tool's result, reasoning.
function messagePart(part) {
  if (part === null || typeof part !== "object") return el("div", { className: "msg-text" }, String(part));
  const content = part.content ?? part.text;
  if (part.type === "text" && typeof content === "string") return el("div", { className: "msg-text" }, content);
  if (part.type === "tool_call") {
    const args = typeof part.arguments === "string" ? part.arguments : JSON.stringify(part.arguments ?? {});
    return el("div", { className: "msg-tool mono" }, `→ ${part.name || "tool"}(${args})`, part.id ? el("span", { className: "muted" }, `  ${part.id}`) : null);
  }
  if (part.type === "tool_call_response") {
    const response = typeof part.response === "string" ? part.response : JSON.stringify(part.response);
    return el("div", { className: "msg-tool mono" }, `← ${response}`, part.id ? el("span", { className: "muted" }, `  ${part.id}`) : null);
  }
  if (part.type === "reasoning") return el("details", {}, el("summary", {}, "reasoning"), el("div", { className: "msg-text" }, String(content ?? "")));
  return jsonBlock(part);
}

function message(role, parts, note) {
  return el("div", { className: `msg role-${role || "unknown"}` },
    el("div", { className: "msg-role" }, role || "?", note ? el("span", { className: "muted" }, ` · ${note}`) : null),
    (Array.isArray(parts) ? parts : [parts]).map(messagePart));
}

// An LLM call (GenAI attributes): model, tokens and timing, then the conversation by role.
function llmDetails(span) {
  const a = span.attributes || {};
  if (!("gen_ai.operation.name" in a)) return [];
  const model = a["gen_ai.response.model"] || a["gen_ai.request.model"] || "?";
  const tokensIn = a["gen_ai.usage.input_tokens"], tokensOut = a["gen_ai.usage.output_tokens"];
  // The conventions' time to the first chunk is in seconds.
  const firstS = a["gen_ai.response.time_to_first_chunk"];
  const first = typeof firstS === "number" ? firstS * 1000 : undefined;
  const blocked = a["looptrace.genai.loop_blocked_ms"];
  const reasons = parsed(a["gen_ai.response.finish_reasons"]);
  const facts = [
    ["model", `${a["gen_ai.provider.name"] || ""} ${model}`.trim()],
    ["operation", a["gen_ai.operation.name"]],
    ...(tokensIn !== undefined || tokensOut !== undefined ? [["tokens", `${tokensIn ?? "?"} in · ${tokensOut ?? "?"} out`]] : []),
    ...(typeof a["llm.cost.total"] === "number" ? [["cost", costFact(a)]] : []),
    ...(typeof first === "number" ? [["first chunk", `${first.toFixed(1)} ms`]] : []),
    ...(Array.isArray(reasons) && reasons.length ? [["finish", reasons.join(", ")]] : []),
    ...(typeof blocked === "number" ? [["loop blocked", `${blocked.toFixed(1)} ms`]] : []),
  ];
  const out = [el("h3", {}, "LLM call"), kv(facts)];
  const system = parsed(a["gen_ai.system_instructions"]);
  const input = parsed(a["gen_ai.input.messages"]);
  const output = parsed(a["gen_ai.output.messages"]);
  const messages = [];
  if (Array.isArray(system) && system.length) messages.push(message("system", system));
  if (Array.isArray(input)) for (const m of input) messages.push(message(m.role, m.parts || []));
  if (Array.isArray(output)) for (const m of output) messages.push(message(m.role || "assistant", m.parts || [], m.finish_reason ? `finish: ${m.finish_reason}` : null));
  if (messages.length) out.push(el("h3", {}, "Conversation"), el("div", { className: "conversation" }, messages));
  return out;
}

function costFact(a) {
  const parts = [["prompt", a["llm.cost.prompt"]], ["completion", a["llm.cost.completion"]]].filter(([, v]) => typeof v === "number");
  const detail = parts.map(([k, v]) => `${k} ${fmtCost(v)}`).join(" · ");
  return el("span", { className: "cost", title: `${a["llm.cost.total"]} USD` }, fmtCost(a["llm.cost.total"]), detail ? el("span", { className: "muted" }, ` (${detail})`) : null);
}

// Objects, lists and JSON-looking strings get a JSON block; plain values stay inline.
function isStructured(v) {
  return (typeof v === "object" && v !== null) || (typeof v === "string" && /^\s*[[{]/.test(v));
}

// An attribute key that may wrap only after a dot or an underscore, never inside a word
// ("looptrace.case." / "repetition", not "looptrace.case.repetitio" / "n").
function keyText(key) {
  const out = [];
  for (const part of String(key).split(/(?<=[._])/)) out.push(part, el("wbr"));
  out.pop();
  return out;
}

function kv(pairs) {
  return el("dl", { className: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// One attribute value: numbers rounded (the exact value on hover), text with line breaks (a
// stall's stack) as lines, structures as a JSON block.
function attrValue(key, v) {
  if (typeof v === "number" && !Number.isInteger(v)) {
    return el("span", { className: "mono", title: String(v) }, String(Number(v.toPrecision(6))));
  }
  if (typeof v === "string" && v.includes("\n")) return el("pre", { className: "lines" }, v);
  if (isStructured(v)) return jsonBlock(v);
  return el("span", { className: "mono" }, String(v));
}

// A span's status as the trace list says it: OpenTelemetry's UNSET means nothing failed.
function statusText(span, open) {
  if (open) return "in progress";
  const shown = span.status === "unset" ? "ok (status unset)" : span.status;
  return span.status_message ? `${shown}: ${span.status_message}` : shown;
}

function spanDetails(span, t0, scores) {
  const open = isOpen(span);
  const out = [
    el("h2", {}, span.name),
    kv([
      ["status", statusText(span, open)],
      ["duration", open ? "running" : fmtDuration(span.end_ns - span.start_ns)],
      ["starts at", `+${fmtDuration(span.start_ns - t0)}`],
      ["span id", span.span_id],
      ["parent", span.parent_span_id || "—"],
      ...(lagOf(span) !== null ? [["loop lag max", `${lagOf(span).toFixed(2)} ms`]] : []),
    ]),
    ...(scores?.length ? [el("h3", {}, "Scores"), scoresTable(scores)] : []),
    ...llmDetails(span),
  ];
  const exception = (span.events || []).find((e) => e.name === "exception");
  if (exception) {
    const a = exception.attributes || {};
    out.push(el("h3", {}, "Exception"), el("div", { className: "exception" },
      el("div", { className: "etype" }, `${a["exception.type"] || "Exception"}: ${a["exception.message"] || ""}`),
      a["exception.stacktrace"] ? el("details", {}, el("summary", {}, "stack trace"), el("pre", {}, a["exception.stacktrace"])) : null));
  }
  const input = span.input ?? span.attributes?.["input.value"];
  const output = span.output ?? span.attributes?.["output.value"];
  if (input !== null && input !== undefined) out.push(el("h3", {}, "Input"), jsonBlock(input, bytesHint(input)));
  if (output !== null && output !== undefined) out.push(el("h3", {}, "Output"), jsonBlock(output, bytesHint(output)));
  const attrs = Object.entries(span.attributes || {}).filter(([k]) => !HIDDEN_ATTRIBUTES.has(k));
  if (attrs.length) {
    out.push(el("h3", {}, "Attributes"), el("table", { className: "grid attributes" }, el("tbody", {},
      attrs.sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => el("tr", {},
        el("td", { className: "mono key" }, keyText(k)),
        el("td", {}, attrValue(k, v)))))));
  }
  const events = (span.events || []).filter((e) => e !== exception);
  if (events.length) {
    out.push(el("h3", {}, "Events"), el("ul", { className: "events" }, events.map((e) => el("li", {},
      el("strong", {}, e.name), el("span", { className: "muted" }, ` +${fmtDuration(e.time_ns - t0)}`),
      Object.keys(e.attributes || {}).length
        ? el("table", { className: "grid attributes" }, el("tbody", {},
          Object.entries(e.attributes).map(([k, v]) => el("tr", {}, el("td", { className: "mono key" }, keyText(k)), el("td", {}, attrValue(k, v))))))
        : null))));
  }
  if (span.resource && Object.keys(span.resource).length) {
    out.push(el("details", {}, el("summary", {}, "resource"), jsonBlock(span.resource)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Experiments: experimentsPage, experimentPage and comparePage are in experiments.js.

// Table cells show payloads on one line (compact JSON); the tooltip has the indented form.
function compact(value) {
  if (typeof value !== "string") return JSON.stringify(value);
  try {
    return JSON.stringify(JSON.parse(value));
  } catch {
    return value;
  }
}

function payloadCell(value) {
  if (value === null || value === undefined) return el("td", { className: "payload" });
  return el("td", { className: "payload" }, el("pre", { title: pretty(value) }, compact(value)));
}

// ---------------------------------------------------------------------------------------------
// Event-loop lag
//
// The figures (worst stall, p99 lag, not scheduled, looptrace's own) come named from /api/lag
// ("figures"): the page shows them, it does not recompute them, so they read as the CLI's do.

// One colour per process (service and instance), in the order processes first appear: classes
// s0..s7 of viewer.css (the page's CSP allows no inline style).
const LAG_COLOURS = 8;
// Steps a time axis may tick at (ms): round numbers of milliseconds, seconds, minutes, hours.
const TIME_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 250, 500, 1e3, 2e3, 5e3, 10e3, 15e3, 30e3,
  60e3, 120e3, 300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 10800e3, 21600e3, 43200e3, 86400e3];

function lagValue(values, name) {
  const v = values[`${name}_ms`] ?? values[name];
  return typeof v === "number" ? v : null;
}

// A round step (1, 2 or 5 times a power of ten) that cuts `range` into at most `parts`.
function roundStep(range, parts) {
  const raw = range / Math.max(1, parts);
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// 24-hour clock, as every other page: 14:05:09, or 14:05 for steps of a minute or more.
function clock24(ms, seconds = true) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}${seconds ? `:${pad(d.getSeconds())}` : ""}`;
}

function fmtOffset(ms, step) {
  if (step >= 60e3) return `+${Math.round(ms / 60e3)} min`;
  const decimals = step >= 1e3 ? 0 : Math.max(0, Math.ceil(-Math.log10(step / 1e3) - 1e-9));
  return `+${(ms / 1e3).toFixed(decimals)} s`;
}

// Runs far apart (a program started twice, minutes apart) would each be a sliver of one linear
// axis: the axis is cut into segments where nothing was measured for a while, each drawn to its
// own scale, with a marked break between them.
function lagSegments(points) {
  const sorted = points.slice().sort((a, b) => a.start - b.start);
  const longest = Math.max(...sorted.map((p) => p.end - p.start), 0);
  const segments = [];
  for (const p of sorted) {
    const last = segments[segments.length - 1];
    if (last && p.start - last.end <= Math.max(10e9, 2 * longest)) {
      last.end = Math.max(last.end, p.end, p.t);
    } else {
      segments.push({ start: p.start, end: Math.max(p.end, p.t) });
    }
  }
  return segments;
}

function lagChart(points) {
  // Times are nanoseconds since the epoch, past what a JS number holds exactly: the chart works
  // in milliseconds from each segment's start.
  const W = 960, H = 300, L = 56, R = 16, T = 14, B = 34, GAP = 26;
  const segments = lagSegments(points);
  const plot = W - L - R - GAP * (segments.length - 1);
  const total = segments.reduce((sum, g) => sum + Math.max(g.end - g.start, 1), 0);
  // Each segment gets its share of the width, and never less than 90 px.
  let left = L;
  for (const g of segments) {
    g.width = Math.max(90, (plot * Math.max(g.end - g.start, 1)) / total);
  }
  const scale = plot / segments.reduce((sum, g) => sum + g.width, 0);
  for (const g of segments) {
    g.width *= scale;
    g.left = left;
    left += g.width + GAP;
  }
  const segmentOf = (ns) => segments.find((g) => ns >= g.start && ns <= g.end) || segments[segments.length - 1];
  const x = (ns) => {
    const g = segmentOf(ns);
    const span = Math.max((g.end - g.start) / 1e6, 1e-9);
    return g.left + (((ns - g.start) / 1e6) / span) * g.width;
  };
  const peak = Math.max(...points.map((p) => Math.max(p.p99 ?? 0, p.max ?? 0)), 0);
  const yStep = roundStep(peak > 0 ? peak : 1, 4);
  const top = Math.max(yStep, Math.ceil(peak / yStep - 1e-9) * yStep);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "event-loop lag over time" });
  const yDecimals = yStep >= 1 ? 0 : Math.ceil(-Math.log10(yStep) - 1e-9);
  for (let v = 0; v <= top + yStep / 2; v += yStep) {
    chart.append(svg("line", { class: "gridline", x1: L, x2: W - R, y1: y(v), y2: y(v) }),
      svg("text", { class: "y-tick", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, `${v.toFixed(yDecimals)} ms`));
  }
  // Time ticks, per segment: its start on the 24-hour clock, then round offsets from it.
  for (const g of segments) {
    const span = (g.end - g.start) / 1e6;
    const step = TIME_STEPS.find((s) => s >= span / Math.max(1, Math.floor(g.width / 90))) || TIME_STEPS[TIME_STEPS.length - 1];
    const startMs = g.start / 1e6;
    chart.append(svg("text", { class: "x-tick", x: g.left, y: H - 12, "text-anchor": "start" }, clock24(startMs, step < 60e3)));
    const last = g === segments[segments.length - 1];
    for (let k = 1; k * step <= span; k++) {
      const px = g.left + ((k * step) / Math.max(span, 1e-9)) * g.width;
      // Room for the run's clock label, and for the next run's.
      if (px - g.left < 70 || (!last && g.left + g.width - px < 30)) continue;
      const anchor = last && W - R - px < 24 ? "end" : "middle";
      chart.append(svg("text", { class: "x-tick", x: px, y: H - 12, "text-anchor": anchor }, fmtOffset(k * step, step)));
    }
    chart.append(svg("line", { class: "axis", x1: g.left, x2: g.left + g.width, y1: H - B, y2: H - B }));
  }
  segments.slice(1).forEach((g, i) => {
    const prev = segments[i];
    const mid = g.left - GAP / 2;
    const away = (g.start - prev.end) / 1e9;
    chart.append(svg("g", { class: "axis-break" },
      svg("line", { x1: mid - 4, x2: mid, y1: H - B + 5, y2: H - B - 5 }),
      svg("line", { x1: mid, x2: mid + 4, y1: H - B + 5, y2: H - B - 5 }),
      svg("title", {}, `nothing measured for ${away >= 120 ? `${Math.round(away / 60)} min` : `${Math.round(away)} s`}`)));
  });
  chart.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  // One series per process (service and instance), each in its own colour: lines never join
  // two processes, nor two segments. Within a series the line also breaks where summaries stop
  // (the program was not running): when a window starts more than a second, and more than half
  // its own length, after the previous ended.
  const series = new Map();
  for (const p of points) {
    const key = `${p.service ?? ""} ${p.instance ?? ""}`;
    if (!series.has(key)) series.set(key, { colour: `s${series.size % LAG_COLOURS}`, points: [], service: p.service, instance: p.instance });
    series.get(key).points.push(p);
  }
  for (const [key, s] of series) {
    for (const kind of ["p99", "max"]) {
      const own = s.points.filter((p) => p[kind] !== null).sort((a, b) => a.t - b.t);
      let run = [];
      const flush = () => {
        if (run.length > 1) chart.append(svg("polyline", { class: `${kind} ${s.colour}`, "data-series": key, points: run.join(" ") }));
        run = [];
      };
      own.forEach((p, i) => {
        const prev = own[i - 1];
        if (prev && (p.start - prev.end > Math.max(1e9, 0.5 * (p.end - p.start)) || segmentOf(prev.t) !== segmentOf(p.t))) flush();
        run.push(`${x(p.t).toFixed(1)},${y(p[kind]).toFixed(1)}`);
      });
      flush();
      for (const p of own) {
        chart.append(svg("circle", { class: `dot-${kind} ${s.colour}`, "data-series": key, cx: x(p.t).toFixed(1), cy: y(p[kind]).toFixed(1), r: kind === "p99" ? 3.5 : 2 },
          svg("title", {}, `${kind === "p99" ? "p99 lag" : "worst lag"} ${p[kind].toFixed(2)} ms, window ending ${clock24(p.t / 1e6)}${series.size > 1 ? ` (${p.service ?? "?"}, process ${(p.instance ?? "?").slice(0, 8)})` : ""}`)));
      }
    }
  }
  const processes = [...series.values()].map((s) => el("span", { className: "process" },
    el("span", { className: `sw ${s.colour}` }),
    `${s.service ?? "?"}${series.size > 1 ? ` · process ${(s.instance ?? "?").slice(0, 8)}` : ""}`));
  return el("div", { className: "chart", id: "lag-chart" }, chart,
    el("div", { className: "legend" },
      el("span", {}, el("span", { className: "sw kind" }), "p99 lag (solid)"),
      el("span", {}, el("span", { className: "sw kind dashed" }), "worst lag (dashed)"),
      processes));
}

const LAG_FILTERS = ["service", "range"];

async function lagPage() {
  const q = query();
  const params = new URLSearchParams({ limit: "500", worst: "20" });
  if (q.get("service")) params.set("service", q.get("service"));
  const range = parseInt(q.get("range") || "", 10);
  if (range > 0) params.set("since_ns", String(BigInt(Date.now() - range * 1000) * 1000000n));
  const [data, services] = await Promise.all([api(`/api/lag?${params}`), api("/api/services")]);
  const figures = data.figures || {};
  const select = (name, options, any) => el("select", { name },
    el("option", { value: "" }, any),
    options.map(([value, text]) => el("option", { value, selected: q.get(name) === value }, text)));
  const form = el("form", { className: "filters", id: "lag-filters", method: "get", action: "/lag" },
    select("service", services.services.map((s) => [s, s]), "any service"),
    select("range", TIME_RANGES, "any time"),
    el("button", { type: "submit" }, "Filter"),
    LAG_FILTERS.some((k) => q.get(k)) ? link("/lag", "clear") : null);
  const points = data.summaries.slice().reverse().map((s) => ({
    t: s.end_ns || s.start_ns, start: s.start_ns, end: s.end_ns || s.start_ns,
    service: s.service_name, instance: s.instance,
    p99: lagValue(s.values, "p99"), max: lagValue(s.values, "max"),
  }));
  const worst = data.worst_spans.map((w) => el("tr", {},
    el("td", {}, link(`/traces/${encodeURIComponent(w.trace_id)}#span=${encodeURIComponent(w.span_id)}`, w.name)),
    el("td", { className: "mono" }, fmtTime(w.start_ns)),
    el("td", { className: "num" }, fmtDuration(w.duration_ns)),
    el("td", { className: `num${w.lag_max_ms > LAG_MARK_MS ? " worse" : ""}` }, `${w.lag_max_ms.toFixed(2)} ms`)));
  const spanLinks = (spans) => spans.map((v, k) => [k ? ", " : "",
    link(`/traces/${encodeURIComponent(v.trace_id)}#span=${encodeURIComponent(v.span_id)}`, v.name)]);
  const CAUSES = { gc: "garbage collection", looptrace: "looptrace's own work", unscheduled: "process not scheduled" };
  const culpritRow = (c) => el("tr", { className: "culprit", "data-cause": c.cause || "code" },
    el("td", {},
      el("div", { className: "mono" }, c.function || "?", CAUSES[c.cause] ? el("span", { className: "badge cause" }, ` ${CAUSES[c.cause]}`) : null),
      el("div", { className: "muted" }, `${c.filepath || "?"}:${c.lineno ?? "?"}${c.task ? ` · task ${c.task}` : ""}`),
      c.stack ? el("details", {}, el("summary", {}, "stack"), el("pre", { className: "stack" }, c.stack)) : null),
    el("td", { className: "num" }, String(c.stalls)),
    el("td", { className: "num worse" }, `${fmtNumber(c.max_ms, 1)} ms`),
    el("td", { className: "num" }, `${fmtNumber(c.total_ms, 1)} ms`),
    el("td", {}, spanLinks(c.in_spans)),
    el("td", {}, c.waiting ? [spanLinks(c.waiting_spans), c.waiting > c.waiting_spans.length ? ` and ${c.waiting - c.waiting_spans.length} more` : ""] : el("span", { className: "muted" }, "none")));
  const culpritTable = (rows, id) => el("table", { className: "grid culprits", id }, el("thead", {}, el("tr", {},
      el("th", {}, "Blocking code"), el("th", { className: "num" }, "Stalls"), el("th", { className: "num" }, "Worst stall"),
      el("th", { className: "num" }, "Total"), el("th", {}, "Blocked in"), el("th", {}, "Spans that waited"))),
    el("tbody", {}, rows.map(culpritRow)));
  const culprits = data.culprits || [];
  const others = data.other_stalls || [];
  const ms = (v) => (typeof v === "number" ? `${v.toFixed(2)} ms` : "—");
  const card = (key, label, value, note) => el("div", { className: "card", "data-figure": key },
    el("div", { className: "k" }, label), el("div", { className: "v" }, value), note ? el("div", { className: "muted note" }, note) : null);
  const windowNote = figures.window_start_ns
    ? `${fmtTime(figures.window_start_ns)} to ${fmtTime(figures.window_end_ns)}, ${figures.summaries} summaries, ${figures.processes} process${figures.processes === 1 ? "" : "es"}`
    : "";
  show(el("h1", {}, "Event-loop lag"), form,
    el("h2", {}, "What blocked the loop"),
    culprits.length
      ? culpritTable(culprits, "culprits")
      : el("p", { className: "muted" }, "No stall recorded: the lag monitor names the code that blocks the loop for longer than its threshold."),
    others.length
      ? [el("h3", {}, "Not the program's: looptrace's own work, and pauses of the process"), culpritTable(others, "other-stalls")]
      : null,
    el("h2", {}, "Lag over time"),
    points.length
      ? [el("div", { className: "cards" },
          card("worst-stall", "worst stall", ms(figures.worst_stall_ms), figures.worst_stall_cause || "the program's longest hold of the loop"),
          card("p99-lag", "p99 lag", ms(figures.p99_lag_ms), figures.p99_window_ms ? `worst ${fmtDuration(figures.p99_window_ms * 1e6)} window` : ""),
          card("not-scheduled", "not scheduled", ms(figures.unscheduled_ms), "the process did not run: not counted as a stall"),
          card("looptrace-own", "looptrace's own", ms(figures.looptrace_ms), "looptrace's work on the loop: not counted as a stall")),
        windowNote ? el("p", { className: "muted", id: "lag-window" }, windowNote) : null,
        lagChart(points)]
      : el("p", { className: "muted" }, "No lag summaries yet: run with the lag monitor on (LOOPTRACE_LAG_MONITOR=1)."),
    el("h2", {}, "Spans that saw the worst stalls"),
    worst.length
      ? el("table", { className: "grid worst" }, el("thead", {}, el("tr", {}, el("th", {}, "Span"), el("th", {}, "Start"),
          el("th", { className: "num" }, "Duration"), el("th", { className: "num" }, "Worst stall seen"))), el("tbody", {}, worst))
      : el("p", { className: "muted" }, "No span recorded loop lag."));
}

// ---------------------------------------------------------------------------------------------
// Routing: every page is this same shell; the path says what to draw.

function route() {
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  let nav = "traces";
  let render;
  if (path === "/" || path === "/traces") render = tracesPage;
  else if (parts[0] === "traces" && parts.length === 2) render = () => tracePage(parts[1]);
  else if (path === "/sessions") { nav = "sessions"; render = sessionsPage; }
  else if (parts[0] === "sessions" && parts.length === 2) { nav = "sessions"; render = () => sessionPage(parts[1]); }
  else if (path === "/experiments") { nav = "experiments"; render = experimentsPage; }
  else if (parts[0] === "experiments" && parts.length === 2) { nav = "experiments"; render = () => experimentPage(parts[1]); }
  else if (path === "/compare") { nav = "experiments"; render = comparePage; }
  else if (path === "/lag") { nav = "lag"; render = lagPage; }
  else render = async () => show(el("p", {}, "No such page. "), link("/", "Back to traces"));
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  document.body.dataset.page = nav;
  // data-ready marks the page drawn (tests wait on it); data-ready-ms is the time from the start
  // of navigation, which the benchmark reports.
  const done = () => {
    document.body.dataset.readyMs = performance.now().toFixed(1);
    document.body.dataset.ready = "1";
  };
  render().then(done, (error) => { fail(error); done(); });
}

document.addEventListener("DOMContentLoaded", route);
