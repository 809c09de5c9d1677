// looptrace viewer: live mode. Loaded after viewer.js, whose pages it redraws.
//
// The trace list and a trace's page ask the collector about once a second whether the store
// changed (/api/changes?cursor=...: SQLite's change counter, one PRAGMA, no table read), and
// redraw only when it did: the list re-reads its page, a trace re-reads its spans only when its
// own summary changed. Nothing is polled while the tab is hidden or the toggle says paused; the
// choice is kept in this browser (localStorage).
"use strict";

const LIVE_INTERVAL_MS = 1000;
const LIVE_KEY = "looptrace.live";

const live = {
  cursor: null,
  formTouched: false,
  timer: null,
  busy: false,
  trace: null, // the open trace's summary as drawn: a change to it means new spans
  updates: 0,
};

function liveOn() {
  try {
    return localStorage.getItem(LIVE_KEY) !== "off";
  } catch {
    return true;
  }
}

// Which page is live: the trace list ("/") or one trace ("/traces/<id>"); others are not.
function livePage() {
  const path = location.pathname.replace(/\/+$/, "") || "/";
  if (path === "/" || path === "/traces") return { kind: "traces" };
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "traces" && parts.length === 2) return { kind: "trace", id: parts[1].toLowerCase() };
  return null;
}

// The fields of a trace's summary that change as its spans arrive or finish.
function traceShape(t) {
  return t ? [t.span_count, t.end_ns, t.in_progress, t.status, t.error_count, t.score_count].join("/") : "";
}

async function livePoll() {
  const page = livePage();
  if (!page || live.busy || document.hidden || !liveOn()) return;
  live.busy = true;
  try {
    const params = new URLSearchParams({ cursor: live.cursor || "" });
    if (page.kind === "trace") params.set("trace", page.id);
    const answer = await api(`/api/changes?${params}`);
    // The cursor moves on only once what changed is drawn: a failed redraw is tried again.
    if (!answer.changed) {
      document.body.dataset.live = "ready";
      return;
    }
    if (page.kind === "trace") {
      if (live.trace === null) live.trace = traceShape(traceState?.().trace);
      const shape = traceShape(answer.trace);
      if (answer.trace && shape !== live.trace) {
        await liveRedraw(() => tracePage(page.id, traceState ? traceState() : null));
        live.trace = shape;
      }
    } else if (live.cursor !== null) {
      // A filter being typed or changed and not yet applied keeps the list still: a redraw
      // would put the form back as the address has it.
      if (live.formTouched || document.activeElement?.closest("form.filters")) return;
      await liveRedraw(() => tracesPage());
    }
    // (The list's first answer only takes the cursor: the list was drawn a moment ago.)
    live.cursor = answer.cursor;
    // Live from here on (tests wait on this before they write).
    document.body.dataset.live = "ready";
    liveButton().title = liveTitle();
  } catch (error) {
    // A collector that went away: say so on the toggle, try again on the next tick.
    liveButton().title = `live updates failed: ${error.message}`;
  } finally {
    live.busy = false;
  }
}

async function liveRedraw(draw) {
  const y = window.scrollY;
  await draw();
  window.scrollTo(0, y);
  live.updates += 1;
  document.body.dataset.liveUpdates = String(live.updates);
}

function liveButton() {
  let button = document.getElementById("live-toggle");
  if (!button) {
    button = el("button", { type: "button", id: "live-toggle", className: "live-toggle" });
    button.addEventListener("click", () => {
      try {
        localStorage.setItem(LIVE_KEY, liveOn() ? "off" : "on");
      } catch {
        // No storage (a private window's policy): the toggle lasts for this page only.
      }
      paintLive();
      // Resumed: catch up with what came while paused (a cursor that matches nothing).
      if (liveOn()) {
        live.cursor ??= "";
        livePoll();
      }
    });
    document.querySelector("header.top").appendChild(button);
  }
  return button;
}

function paintLive() {
  const button = liveButton();
  const on = liveOn();
  button.textContent = on ? "● live" : "❚❚ paused";
  button.classList.toggle("on", on);
  button.setAttribute("aria-pressed", on ? "true" : "false");
  button.title = liveTitle();
}

function liveTitle() {
  return liveOn() ? "new spans show as they arrive; click to pause" : "paused: click to show new spans as they arrive";
}

function startLive() {
  if (!livePage()) return;
  const touched = (e) => { if (e.target instanceof Element && e.target.closest("form.filters")) live.formTouched = true; };
  document.addEventListener("input", touched);
  document.addEventListener("change", touched);
  paintLive();
  if (live.timer === null) live.timer = setInterval(livePoll, LIVE_INTERVAL_MS);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) livePoll(); });
  livePoll();
}

document.addEventListener("DOMContentLoaded", () => {
  // After the page's first drawing: the first poll takes the cursor and, on a trace's page,
  // catches spans that arrived while the page was loading.
  const wait = () => (document.body.dataset.ready === "1" ? startLive() : setTimeout(wait, 50));
  wait();
});
