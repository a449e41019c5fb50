/* What every dashboard page shares: times in the viewer's timezone, copy buttons, JSON reads,
   and the live socket (reconnect with backoff; the page catches up by seq or position on every
   (re)connect, so a dropped socket loses nothing and shows nothing twice). */
(function () {
  "use strict";
  const BP = (window.BP = {});

  // --- times --------------------------------------------------------------------------------
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  BP.localStamp = function (date) {
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  };
  /* Plotly ignores time zones, so charts get local wall-clock strings. */
  BP.plotlyLocal = function (iso) {
    const d = new Date(iso);
    return BP.localStamp(d) + "." + pad(d.getMilliseconds(), 3);
  };
  BP.age = function (ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${pad(s % 60)} s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h} h ${pad(m % 60)} min`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  };
  BP.relative = function (date) {
    const ms = Date.now() - date.getTime();
    if (Math.abs(ms) < 1500) return "just now";
    return ms >= 0 ? `${BP.age(ms)} ago` : `in ${BP.age(-ms)}`;
  };
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  BP.renderTimes = function (root) {
    (root || document).querySelectorAll("time[datetime]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      if (el.hasAttribute("data-relative")) {
        el.textContent = BP.relative(date);
        el.title = `${BP.localStamp(date)} (${zone})`;
      } else if (el.hasAttribute("data-short") && date.toDateString() === new Date().toDateString()) {
        el.textContent = BP.localStamp(date).slice(11);
        el.title = `${BP.localStamp(date)} (${zone})`;
      } else {
        el.textContent = BP.localStamp(date);
        el.title = `${el.getAttribute("datetime")} · shown in ${zone}`;
      }
    });
  };
  setInterval(() => {
    document.querySelectorAll("time[data-relative]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (!isNaN(date)) el.textContent = BP.relative(date);
    });
  }, 1000);

  /* A count axis: whole numbers only (below 6 every one of them, or Plotly ticks 0.2 steps). */
  BP.countAxis = function (values, extra) {
    const top = Math.max(0, ...values.filter((v) => typeof v === "number"));
    return Object.assign({ rangemode: "tozero", tickformat: "d" }, top < 6 ? { dtick: 1 } : {}, extra || {});
  };

  // --- copy buttons -----------------------------------------------------------------------------
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.copy");
    if (!button) return;
    event.preventDefault();
    const text = button.dataset.copy;
    const done = () => {
      button.classList.add("copied");
      button.title = "copied";
      setTimeout(() => { button.classList.remove("copied"); button.title = "copy"; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
    } else {
      fallbackCopy(text, done);
    }
  });
  function fallbackCopy(text, done) {
    const area = document.createElement("textarea");
    area.value = text;
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } finally { area.remove(); }
  }

  // --- reads and writes -------------------------------------------------------------------------
  BP.csrfToken = function () {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  };
  async function request(url, options) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, ...options });
    if (response.redirected && new URL(response.url).pathname.startsWith("/login/")) {
      window.location.href = response.url; // the session ended: log in again
      throw new Error("logged out");
    }
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    return response.json();
  }
  BP.getJSON = (url) => request(url, { method: "GET" });
  BP.postJSON = (url) => request(url, {
    method: "POST", headers: { Accept: "application/json", "X-CSRFToken": BP.csrfToken() },
  });
  BP.fragment = function (html, wrapper) {
    const template = document.createElement("template");
    template.innerHTML = wrapper ? `<table><tbody>${html}</tbody></table>` : html;
    return wrapper ? template.content.querySelector("tbody") : template.content;
  };

  // --- the live indicator ---------------------------------------------------------------------
  const labels = { off: "not live", connecting: "connecting…", connected: "live", reconnecting: "reconnecting…",
                   error: "update failed" };
  BP.setLiveState = function (state, detail) {
    const el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = labels[state] || state;
    el.title = detail || "Live updates";
  };

  /* Runs ``fn`` (an async catch-up) one at a time; a call while it runs schedules one more run,
     so bursts of notices become at most one fetch in flight and one queued. A failure shows on
     the live indicator and is retried. */
  BP.serial = function (fn) {
    let running = false;
    let again = false;
    async function run() {
      if (running) { again = true; return; }
      running = true;
      try {
        await fn();
        if (BP.socketOpen()) BP.setLiveState("connected");
      } catch (error) {
        BP.setLiveState("error", `Could not fetch updates: ${error.message}; retrying`);
        again = true;
        await new Promise((resolve) => setTimeout(resolve, 2000));
      } finally {
        running = false;
        if (again) { again = false; run(); }
      }
    }
    return run;
  };

  let currentSocket = null;
  BP.socketOpen = () => !!currentSocket && currentSocket.readyState === WebSocket.OPEN;

  /* Opens ``path`` and keeps it open: on every open (the first and each reconnect) calls
     ``catchUp``; on every message calls ``onNotice``. Backoff 0.5 s doubling to 10 s, jittered. */
  BP.connect = function (path, { onNotice, catchUp }) {
    let attempt = 0;
    let opened = false;
    function open() {
      BP.setLiveState(opened ? "reconnecting" : "connecting");
      const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      const socket = new WebSocket(scheme + window.location.host + path);
      currentSocket = socket;
      socket.onopen = () => {
        attempt = 0;
        opened = true;
        BP.setLiveState("connected");
        catchUp();
      };
      socket.onmessage = (message) => {
        let notice;
        try { notice = JSON.parse(message.data); } catch (error) { return; }
        onNotice(notice);
      };
      socket.onclose = () => {
        if (currentSocket !== socket) return;
        BP.setLiveState("reconnecting");
        const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() / 2);
        attempt += 1;
        setTimeout(open, delay);
      };
    }
    open();
    return { get socket() { return currentSocket; } };
  };

  document.addEventListener("DOMContentLoaded", () => BP.renderTimes(document));
  if (document.readyState !== "loading") BP.renderTimes(document);
})();
