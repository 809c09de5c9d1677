"use strict";
// Housekeeping from the viewer: a "Delete" button in the head of a trace's page and of an
// experiment's page. It sends DELETE /api/traces/<id> or /api/experiments/<id> (the token, when
// one is set, travels in the cookie like every request of the viewer), asks first, and goes to
// the list once the store has deleted it. Pages may be redrawn (live mode): the button is put
// back whenever the head is drawn again.

(function () {
  function target() {
    const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
    if (parts.length !== 2) return null;
    if (parts[0] === "traces") {
      return { what: "trace", api: `/api/traces/${encodeURIComponent(parts[1])}`, back: "/" };
    }
    if (parts[0] === "experiments") {
      return { what: "experiment", api: `/api/experiments/${encodeURIComponent(parts[1])}`, back: "/experiments" };
    }
    return null;
  }

  async function remove(t, button) {
    const question = t.what === "trace"
      ? "Delete this trace and all its spans from the store?"
      : "Delete this experiment and every trace of it from the store?";
    if (!window.confirm(question)) return;
    button.disabled = true;
    const response = await fetch(t.api, { method: "DELETE", headers: { accept: "application/json" } });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      button.disabled = false;
      button.title = body.error || `${response.status} ${response.statusText}`;
      button.textContent = `Delete failed: ${button.title}`;
      return;
    }
    location.assign(t.back);
  }

  function addButton() {
    const t = target();
    if (!t || document.body.dataset.ready !== "1") return;
    const head = document.querySelector("#main .trace-head");
    if (!head || head.querySelector("button[data-delete]")) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "danger";
    button.dataset.delete = t.what;
    button.textContent = t.what === "trace" ? "Delete trace" : "Delete experiment";
    button.addEventListener("click", () => { remove(t, button); });
    head.appendChild(button);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const main = document.getElementById("main");
    new MutationObserver(addButton).observe(main, { childList: true, subtree: true });
    new MutationObserver(addButton).observe(document.body, { attributes: true, attributeFilter: ["data-ready"] });
  });
})();
