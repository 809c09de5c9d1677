// looptrace viewer: the experiment pages (the list, one experiment, two side by side).
//
// Loaded after viewer.js, whose helpers (el, api, show, link, badge...) it uses; the same
// safety rule holds: span data reaches the page as text only, never as markup.
//
// One experiment's page asks the collector for one page of cases at a time
// (/api/experiments/<id>?limit=&offset=&filter=): counts, errors and score means come summed by
// the store, so a 10,000-case experiment draws 100 rows, not 10,000.
"use strict";

const CASE_PAGE_SIZE = 100;
const CASE_FILTER_OPTIONS = [["", "all cases"], ["task_error", "task errors"], ["scorer_error", "scorer errors"],
  ["error", "any failure"], ["ok", "passed"]];
const TREND_RUNS = 10;

function scoreNames(experiments) {
  const names = new Set();
  for (const e of experiments) for (const name of Object.keys(e.scores || {})) names.add(name);
  return [...names].sort();
}

async function experimentsPage() {
  const data = await api(`/api/experiments?limit=200`);
  const experiments = data.experiments;
  const names = scoreNames(experiments);
  const withCost = experiments.some((e) => e.cost_usd != null);
  const picked = [];
  const compare = el("button", { type: "button", disabled: true, id: "compare" }, "Compare two");
  compare.addEventListener("click", () => {
    location.href = `/compare?a=${encodeURIComponent(picked[0])}&b=${encodeURIComponent(picked[1])}`;
  });
  const onPick = (id, box) => {
    if (box.checked) picked.push(id); else picked.splice(picked.indexOf(id), 1);
    while (picked.length > 2) {
      const dropped = picked.shift();
      document.querySelector(`input[data-experiment-id="${CSS.escape(dropped)}"]`).checked = false;
    }
    compare.disabled = picked.length !== 2;
  };
  const rows = experiments.map((e) => {
    const box = el("input", { type: "checkbox", "data-experiment-id": e.id, "aria-label": "compare" });
    box.addEventListener("change", () => onPick(e.id, box));
    return el("tr", { "data-experiment-id": e.id },
      el("td", {}, box),
      el("td", {}, link(`/experiments/${encodeURIComponent(e.id)}`, e.name || e.id)),
      el("td", { className: "mono" }, fmtTime(e.created_ns)),
      el("td", { className: "num" }, String(e.case_count)),
      el("td", { className: `num${e.error_count ? " worse" : ""}` }, String(e.error_count)),
      el("td", { className: `num${e.scorer_error_count ? " worse" : ""}` }, e.scorer_error_count ? String(e.scorer_error_count) : ""),
      withCost ? costCell(e.cost_usd) : null,
      names.map((n) => el("td", { className: "num" }, e.scores?.[n] ? fmtNumber(e.scores[n].mean) : "")));
  });
  show(el("h1", {}, "Experiments"),
    experiments.length
      ? [el("div", { className: "filters" }, compare, el("span", { className: "muted" }, " tick two experiments to compare their scores")),
        el("table", { className: "grid experiments" },
          el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "Experiment"), el("th", {}, "Created"),
            el("th", { className: "num" }, "Cases"), el("th", { className: "num" }, "Errors"),
            el("th", { className: "num" }, "Scorer errors"),
            withCost ? el("th", { className: "num" }, "Cost") : null,
            names.map((n) => el("th", { className: "num", title: "mean" }, `${n} (mean)`)))),
          el("tbody", {}, rows))]
      : el("p", { className: "muted" }, "No experiments yet: run one with `async with looptrace.experiment(...)`."));
}

// A payload cell: one line, cut with an ellipsis; a click opens the indented form in place.
function caseCell(value, size, kind) {
  const td = el("td", { className: `payload clip ${kind}` });
  if (value === null || value === undefined) return td;
  const cut = (size ?? 0) > value.length;
  // One line as the value came (the store keeps compact JSON); the indented form is made on
  // the first opening, not for each of a page's hundreds of cells.
  const details = el("details", {}, el("summary", { title: "show all" }, value));
  details.addEventListener("toggle", () => {
    if (!details.open || details.querySelector("pre")) return;
    append(details, [el("pre", { className: "json" }, pretty(value)),
      cut ? el("p", { className: "muted" }, `the first ${value.length.toLocaleString()} of ${size.toLocaleString()} characters; the trace has all of it`) : null]);
  });
  td.appendChild(details);
  return td;
}

function caseStatus(c) {
  const scorerErrors = Object.entries(c.scorer_errors || {});
  // The task's outcome first; a case whose task passed but a scorer raised says so.
  const head = c.in_progress ? badge("in_progress") : c.error ? badge("error")
    : scorerErrors.length ? el("span", { className: "badge error" }, "scorer error") : badge(c.status);
  return el("td", { className: "status" }, head,
    c.error ? el("div", { className: "error-text task-error" }, c.error) : null,
    scorerErrors.length
      ? el("ul", { className: "scorer-errors" }, scorerErrors.map(([name, message]) => el("li", { "data-scorer": name },
        el("span", { className: "badge error" }, `scorer ${name}`), " ", el("span", { className: "error-text" }, message))))
      : null);
}

function experimentCards(e, names) {
  const scorerNames = Object.keys(e.scorer_errors || {});
  const repeated = e.dataset_cases && e.dataset_cases < e.case_count;
  return el("div", { className: "cards" },
    el("div", { className: "card", "data-card": "cases" }, el("div", { className: "k" }, "cases"), el("div", { className: "v" }, e.case_count.toLocaleString()),
      repeated ? el("div", { className: "muted" }, `${e.dataset_cases.toLocaleString()} dataset rows, repeated`) : null,
      e.in_progress ? el("div", { className: "muted" }, `${e.in_progress} running`) : null),
    el("div", { className: "card", "data-card": "errors", title: "cases whose task raised" }, el("div", { className: "k" }, "errors"),
      el("div", { className: `v${e.error_count ? " worse" : ""}` }, String(e.error_count))),
    el("div", { className: "card", "data-card": "scorer-errors", title: "cases on which at least one scorer raised" }, el("div", { className: "k" }, "scorer errors"),
      el("div", { className: `v${e.scorer_error_count ? " worse" : ""}` }, String(e.scorer_error_count || 0)),
      scorerNames.length ? el("div", { className: "muted" }, scorerNames.map((n) => `${n} ${e.scorer_errors[n]}`).join(" · ")) : null),
    e.input_tokens || e.output_tokens
      ? el("div", { className: "card", "data-tokens": "" }, el("div", { className: "k" }, "LLM tokens"),
        el("div", { className: "v" }, `${e.input_tokens} in · ${e.output_tokens} out`))
      : null,
    e.cost_usd != null
      ? el("div", { className: "card", "data-cost": "", title: `${e.cost_usd} USD over ${e.costed_cases} of ${e.case_count} cases` },
        el("div", { className: "k" }, "cost"), el("div", { className: "v" }, fmtCost(e.cost_usd)),
        e.costed_cases < e.case_count ? el("div", { className: "muted" }, `${e.costed_cases} of ${e.case_count} cases priced`) : null)
      : null,
    names.map((n) => el("div", { className: "card", "data-score": n },
      el("div", { className: "k" }, `${n} mean`), el("div", { className: "v" }, fmtNumber(e.scores[n].mean)),
      el("div", { className: "muted" }, `min ${fmtNumber(e.scores[n].min)} · max ${fmtNumber(e.scores[n].max)} · n ${e.scores[n].count}`))));
}

// A scorer's means over the runs as a small line (no axis: the table beside it has the values).
function sparkline(values) {
  const w = 120;
  const h = 28;
  const known = values.filter((v) => typeof v === "number");
  if (known.length < 2) return null;
  // Scores between 0 and 1 are drawn on that scale, so a small move looks small.
  const unit = known.every((v) => v >= 0 && v <= 1);
  const lo = unit ? 0 : Math.min(...known);
  const hi = unit ? 1 : Math.max(...known);
  const span = hi - lo || 1;
  const pts = values.map((v, i) => typeof v === "number"
    ? `${((i / (values.length - 1)) * (w - 4) + 2).toFixed(1)},${(h - 3 - ((v - lo) / span) * (h - 6)).toFixed(1)}` : null).filter(Boolean);
  return svg("svg", { class: "sparkline", viewBox: `0 0 ${w} ${h}`, width: w, height: h },
    svg("polyline", { points: pts.join(" ") }));
}

// Each scorer across the last runs of this experiment (same name), and what regressed since the
// run before this one: the mean dropping past the threshold, and the cases that scored lower.
function trendSection(trend, experimentId) {
  if (!trend || trend.runs.length < 2) return null;
  const runs = trend.runs;
  const names = scoreNames(runs);
  if (!names.length) return null;
  const here = runs.length - 1;
  const head = el("tr", {}, el("th", {}, "Scorer (mean)"),
    runs.map((r, i) => el("th", { className: `num${i === here ? " current" : ""}`, title: fmtTime(r.created_ns) },
      i === here ? "this run" : link(`/experiments/${encodeURIComponent(r.id)}`, `run −${here - i}`))),
    el("th", {}, "trend"), el("th", { className: "num" }, "Δ since previous"), el("th", {}, "regressions"));
  const rows = names.map((n) => {
    const reg = trend.regressions[n] || {};
    const means = runs.map((r) => r.scores[n]?.mean ?? null);
    const delta = reg.delta;
    const flagged = reg.mean_regressed || reg.cases_dropped > 0;
    const calls = [];
    if (reg.mean_regressed) calls.push(el("div", { className: "worse mean-drop" }, `mean dropped ${fmtNumber(-delta)} (more than ${trend.threshold})`));
    if (reg.cases_dropped) {
      const shown = reg.dropped.slice(0, 10);
      calls.push(el("div", { className: "worse cases-drop" },
        `${reg.cases_dropped} case${reg.cases_dropped === 1 ? "" : "s"} scored lower: `,
        shown.map((d, k) => [k ? ", " : "", el("span", { className: "mono", title: `${fmtNumber(d.previous)} → ${fmtNumber(d.score)}` }, `#${d.case_index}`)]),
        reg.cases_dropped > shown.length ? " …" : ""));
    }
    return el("tr", { "data-trend-score": n, className: flagged ? "regressed" : "" },
      el("td", {}, n),
      means.map((m, i) => el("td", { className: `num${i === here ? " current" : ""}` }, fmtNumber(m))),
      el("td", {}, sparkline(means)),
      el("td", { className: `num${typeof delta === "number" && delta !== 0 ? (delta < 0 ? " worse" : " better") : ""}` },
        typeof delta === "number" ? `${delta > 0 ? "+" : ""}${fmtNumber(delta)}` : "—"),
      el("td", {}, calls.length ? calls : el("span", { className: "muted" }, "none")));
  });
  const errorsRow = el("tr", { "data-trend-score": "failed" }, el("td", { className: "muted" }, "failed cases (task or scorer)"),
    runs.map((r, i) => el("td", { className: `num muted${i === here ? " current" : ""}` }, `${r.failed_count} of ${r.case_count}`)),
    el("td", {}), el("td", {}), el("td", {}));
  const previous = runs[here - 1];
  return el("section", { className: "trend", id: "trend" },
    el("h2", {}, `Scorers over the last ${runs.length} runs`,
      el("span", { className: "muted" }, " (same experiment name; regressions against "),
      link(`/compare?a=${encodeURIComponent(previous.id)}&b=${encodeURIComponent(experimentId)}`, "the previous run"),
      el("span", { className: "muted" }, `, threshold ${trend.threshold})`)),
    el("table", { className: "grid trend-table" }, el("thead", {}, head), el("tbody", {}, rows, errorsRow)));
}

async function experimentPage(experimentId) {
  const base = `/api/experiments/${encodeURIComponent(experimentId)}`;
  const q = query();
  const state = {
    offset: Math.max(0, parseInt(q.get("offset") || "0", 10) || 0),
    filter: q.get("filter") || "",
  };
  const pageUrl = () => {
    const p = new URLSearchParams({ limit: String(CASE_PAGE_SIZE), offset: String(state.offset) });
    if (state.filter) p.set("filter", state.filter);
    return `${base}?${p}`;
  };
  const e = await api(pageUrl());
  // The trend is asked for once the cases are here: the first paint neither waits for it nor
  // shares the collector with it.
  const trendRequest = api(`${base}/trend?runs=${TREND_RUNS}`).catch(() => null);
  const names = Object.keys(e.scores || {}).sort();
  const withTokens = Boolean(e.input_tokens || e.output_tokens);
  const withCost = e.cost_usd != null;
  const repeated = e.dataset_cases < e.case_count;

  const tbody = el("tbody", {});
  const pagerText = el("span", { className: "muted", id: "case-range" });
  const prev = el("button", { type: "button", id: "cases-prev" }, "← previous");
  const next = el("button", { type: "button", id: "cases-next" }, "next →");
  const filter = el("select", { id: "case-filter", "aria-label": "show" },
    CASE_FILTER_OPTIONS.map(([value, text]) => el("option", { value, selected: state.filter === value }, text)));
  const drawCases = (page) => {
    tbody.replaceChildren(...page.cases.map((c) => el("tr", { "data-case-index": c.case_index, "data-repetition": c.repetition ?? "" },
      el("td", { className: "num" }, String(c.case_index)),
      repeated ? el("td", { className: "num rep" }, c.repetition ?? "") : null,
      el("td", { className: "case-name" }, c.name || ""),
      caseCell(c.input, c.input_size, "input"), caseCell(c.output, c.output_size, "output"), caseCell(c.expected, null, "expected"),
      names.map((n) => el("td", { className: "num", title: c.comments?.[n] || "" }, c.scores?.[n] !== undefined ? fmtNumber(c.scores[n]) : "")),
      caseStatus(c),
      el("td", { className: "num" }, fmtDuration(c.duration_ns)),
      withTokens ? el("td", { className: "num" }, c.input_tokens || c.output_tokens ? `${c.input_tokens ?? 0} / ${c.output_tokens ?? 0}` : "") : null,
      withCost ? costCell(c.cost_usd) : null,
      el("td", {}, link(`/traces/${encodeURIComponent(c.trace_id)}#span=${encodeURIComponent(c.span_id)}`, "trace")))));
    const total = page.case_rows;
    pagerText.textContent = total
      ? `${(state.offset + 1).toLocaleString()}–${(state.offset + page.cases.length).toLocaleString()} of ${total.toLocaleString()}`
      : "no cases";
    prev.disabled = state.offset === 0;
    next.disabled = state.offset + page.cases.length >= total;
  };
  // Paging and the filter redraw the table only, and put the page in the address.
  const go = async (offset, push = true) => {
    state.offset = Math.max(0, offset);
    const p = query();
    if (state.offset) p.set("offset", String(state.offset)); else p.delete("offset");
    if (state.filter) p.set("filter", state.filter); else p.delete("filter");
    if (push) history.pushState(null, "", `${location.pathname}${p.toString() ? `?${p}` : ""}`);
    document.body.dataset.casesReady = "0";
    try {
      drawCases(await api(pageUrl()));
    } catch (error) {
      tbody.replaceChildren(el("tr", {}, el("td", { className: "error-text", colSpan: 99 }, error.message)));
    }
    document.body.dataset.casesReady = "1";
  };
  prev.addEventListener("click", () => go(state.offset - CASE_PAGE_SIZE));
  next.addEventListener("click", () => go(state.offset + CASE_PAGE_SIZE));
  filter.addEventListener("change", () => { state.filter = filter.value; go(0); });
  window.addEventListener("popstate", () => {
    const p = query();
    state.offset = Math.max(0, parseInt(p.get("offset") || "0", 10) || 0);
    state.filter = p.get("filter") || "";
    filter.value = state.filter;
    go(state.offset, false);
  }, { signal: freshPage() });

  const meta = e.metadata && Object.keys(e.metadata).length ? el("details", {}, el("summary", {}, "metadata"), jsonBlock(e.metadata)) : null;
  const table = el("table", { className: "grid cases" },
    el("thead", {}, el("tr", {}, el("th", { className: "num" }, "#"), repeated ? el("th", { className: "num", title: "repetition" }, "rep") : null,
      el("th", {}, "Case"), el("th", { className: "input" }, "Input"), el("th", {}, "Output"), el("th", {}, "Expected"),
      names.map((n) => el("th", { className: "num" }, n)), el("th", {}, "Status"), el("th", { className: "num" }, "Duration"),
      withTokens ? el("th", { className: "num" }, "Tokens in / out") : null,
      withCost ? el("th", { className: "num" }, "Cost") : null, el("th", {}, ""))),
    tbody);
  drawCases(e);
  document.body.dataset.casesReady = "1";
  const trendSlot = el("div", { id: "trend-slot" });
  trendRequest.then((trend) => {
    const section = trendSection(trend, e.id);
    if (section) trendSlot.replaceChildren(section);
    document.body.dataset.trendReady = "1";
  });
  show(
    el("div", { className: "trace-head" }, el("h1", {}, e.name || e.id), el("span", { className: "muted" }, fmtTime(e.created_ns)),
      (e.tags || []).map((t) => el("span", { className: "badge unset" }, t)),
      e.trace ? link(`/traces/${encodeURIComponent(e.trace.trace_id)}`, "experiment trace") : null,
      el("span", { className: "mono muted" }, e.id)),
    meta, experimentCards(e, names), trendSlot,
    el("div", { className: "filters case-tools" }, filter, prev, pagerText, next),
    el("div", { className: "cases-box" }, table));
}

async function comparePage() {
  const q = query();
  // The first COMPARE_CASES cases of each (case order); the summaries cover every case.
  const COMPARE_CASES = 1000;
  const [a, b] = await Promise.all([q.get("a"), q.get("b")].map((id) => api(`/api/experiments/${encodeURIComponent(id || "")}?limit=${COMPARE_CASES}`)));
  const names = scoreNames([a, b]);
  const title = (e) => link(`/experiments/${encodeURIComponent(e.id)}`, e.name || e.id);
  // Scores: higher is better. Errors: fewer is better (lowerIsBetter flips the colour only).
  const delta = (x, y, lowerIsBetter = false, digits = 3) => {
    if (typeof x !== "number" || typeof y !== "number") return el("td", { className: "num" }, "");
    const d = y - x;
    const good = lowerIsBetter ? d < 0 : d > 0;
    return el("td", { className: `num ${d === 0 ? "" : good ? "better" : "worse"}` }, `${d > 0 ? "+" : ""}${fmtNumber(d, digits)}`);
  };
  const summary = el("table", { className: "grid compare-summary" },
    el("thead", {}, el("tr", {}, el("th", {}, "Score (mean)"), el("th", { className: "num" }, el("span", {}, "A: ", title(a))),
      el("th", { className: "num" }, el("span", {}, "B: ", title(b))), el("th", { className: "num" }, "B − A"))),
    el("tbody", {},
      names.map((n) => el("tr", { "data-score": n }, el("td", {}, n),
        el("td", { className: "num" }, fmtNumber(a.scores[n]?.mean)), el("td", { className: "num" }, fmtNumber(b.scores[n]?.mean)),
        delta(a.scores[n]?.mean, b.scores[n]?.mean))),
      el("tr", {}, el("td", {}, "errors"), el("td", { className: "num" }, String(a.error_count)), el("td", { className: "num" }, String(b.error_count)),
        delta(a.error_count, b.error_count, true, 0)),
      el("tr", {}, el("td", {}, "scorer errors"), el("td", { className: "num" }, String(a.scorer_error_count || 0)),
        el("td", { className: "num" }, String(b.scorer_error_count || 0)), delta(a.scorer_error_count || 0, b.scorer_error_count || 0, true, 0))));
  // Cases line up by their index in the dataset (first repetition of each).
  const byIndex = (e) => { const m = new Map(); for (const c of e.cases) if (!m.has(c.case_index)) m.set(c.case_index, c); return m; };
  const ca = byIndex(a);
  const cb = byIndex(b);
  const indexes = [...new Set([...ca.keys(), ...cb.keys()])].sort((x, y) => x - y);
  const caseLink = (c) => c ? link(`/traces/${encodeURIComponent(c.trace_id)}#span=${encodeURIComponent(c.span_id)}`, "trace") : "";
  const rows = indexes.map((i) => {
    const x = ca.get(i);
    const y = cb.get(i);
    return el("tr", { "data-case-index": i }, el("td", { className: "num" }, String(i)),
      caseCell((x || y).input, (x || y).input_size, "input"), caseCell(x?.output, x?.output_size, "output"), caseCell(y?.output, y?.output_size, "output"),
      names.map((n) => [el("td", { className: "num" }, fmtNumber(x?.scores?.[n])), el("td", { className: "num" }, fmtNumber(y?.scores?.[n])),
        delta(x?.scores?.[n], y?.scores?.[n])]),
      el("td", {}, caseLink(x), " ", caseLink(y)));
  });
  const cut = Math.max(a.case_rows, b.case_rows) > COMPARE_CASES;
  show(el("h1", {}, "Compare experiments"), summary,
    el("h2", {}, "Cases"),
    cut ? el("p", { className: "muted", id: "compare-cut" }, `The first ${COMPARE_CASES.toLocaleString()} cases of each, in case order; the means above cover every case.`) : null,
    el("table", { className: "grid compare-cases" },
      el("thead", {}, el("tr", {}, el("th", { className: "num" }, "#"), el("th", { className: "input" }, "Input"), el("th", {}, "Output A"), el("th", {}, "Output B"),
        names.map((n) => [el("th", { className: "num" }, `${n} A`), el("th", { className: "num" }, `${n} B`), el("th", { className: "num" }, "Δ")]),
        el("th", {}, "Traces"))),
      el("tbody", {}, rows)));
}
