/* Task page: the timeline (Plotly), the event table with chain marks, live appends without
   duplicates, "verify chain now", the recovery context, and "fork from here" (an event row's
   link or a click on the timeline opens the fork dialog at that event). */
(function () {
  "use strict";
  const page = document.getElementById("task-page");
  const taskId = page.dataset.taskId;
  const isLatest = page.dataset.latest === "true";
  let lastSeq = Number(page.dataset.lastSeq || 0);
  const timelineEl = document.getElementById("timeline");
  const tbody = document.querySelector("#event-table tbody");
  let timeline = JSON.parse(document.getElementById("timeline-data").textContent);

  // --- timeline -------------------------------------------------------------------------------
  // The server sends what happened (dashboard/selectors/task_detail.py: points and spans, each
  // with its label); how it is drawn is decided here.
  const POINTS = {  // kind: legend name, symbol, colour
    reasoning: ["reasoning steps", "circle", "#1f77b4"],
    model_call: ["model calls", "hexagon", "#e377c2"],
    claim: ["claims", "triangle-right", "#7f7f7f"],
    recovery: ["recoveries", "triangle-up", "#17becf"],
  };
  // The points of kind "marker", by event type: one entry per type of MARKED_EVENTS on the server.
  // A legend entry is drawn in the colour of its first event (a task ends once).
  const MARKERS = {
    TaskStalled: ["stall", "x", "#d62728"],
    TaskDeadLettered: ["dead-letter decision", "square", "#444444"],
    DeadLetterRequeued: ["dead-letter decision", "square", "#444444"],
    DeadLetterDiscarded: ["dead-letter decision", "square", "#444444"],
    CompensationStarted: ["compensation", "diamond", "#9467bd"],
    CompensationRequested: ["compensation", "diamond", "#9467bd"],
    CompensationCompleted: ["compensation", "diamond", "#9467bd"],
    TaskCompensated: ["compensation", "diamond", "#9467bd"],
    TaskCompleted: ["end", "star", "#2ca02c"],
    TaskFailed: ["end", "star", "#d62728"],
  };
  const CLEAR = "rgba(0,0,0,0)";
  // Spans as bars: finished ones filled, open ones (still in flight) an outline only.
  const BARS = [
    { kind: "tool_call", open: false, name: "tool calls", width: 0.6,
      fill: (span) => (span.status === "succeeded" ? "#2ca02c" : "#d62728") },
    { kind: "tool_call", open: true, name: "tool calls in flight", width: 0.6, fill: () => CLEAR, line: "#ff7f0e" },
    { kind: "subtask", open: false, name: "sub-agents", width: 0.25, fill: () => "rgba(31,119,180,0.35)",
      line: "#1f77b4" },
    { kind: "subtask", open: true, name: "sub-agents running", width: 0.25, fill: () => CLEAR, line: "#1f77b4" },
  ];
  const msOf = (time) => new Date(time).getTime();

  /* Plotly's traces: bars on a date axis (``base`` where a bar starts, ``x`` its length in ms,
     ``meta.seqs`` the seq "fork from here" on each bar continues after), then the points; a
     trace with nothing in it is left out. */
  function timelineTraces(data) {
    const now = msOf(data.now);
    // A call that took milliseconds on a timeline of minutes would be drawn narrower than a
    // pixel: every bar is at least 0.4 % of the span wide (its label gives the real duration).
    const minBarMs = Math.max(1, data.since ? (now - msOf(data.since)) * 0.004 : 0);
    const bars = BARS.map((bar) => {
      const spans = data.spans.filter((span) => span.kind === bar.kind && (span.end === null) === bar.open);
      return {
        type: "bar",
        orientation: "h",
        name: bar.name,
        meta: { kind: bar.kind, state: bar.open ? "in_flight" : "done", seqs: spans.map((span) => span.last_seq) },
        base: spans.map((span) => span.start),
        x: spans.map((span) => Math.max(minBarMs, (span.end === null ? now : msOf(span.end)) - msOf(span.start))),
        y: spans.map((span) => span.lane),
        customdata: spans.map((span) => span.key),
        text: spans.map((span) => span.label),
        width: bar.width,
        marker: { color: spans.map(bar.fill), line: { color: bar.line || "rgba(0,0,0,0.4)", width: bar.line ? 2 : 0.5 } },
      };
    });
    // By meta.kind: the four kinds first, then a trace per marker legend name as first met.
    const points = new Map();
    const pointTrace = (kind, [name, symbol, colour]) => ({
      type: "scatter", mode: "markers", name, meta: { kind }, x: [], y: [], text: [], customdata: [],
      marker: { symbol, color: colour, size: 10 },
    });
    Object.entries(POINTS).forEach(([kind, style]) => points.set(kind, pointTrace(kind, style)));
    data.points.forEach((point) => {
      let kind = point.kind;
      if (kind === "marker") {
        const style = MARKERS[point.type];
        kind = style[0];
        if (!points.has(kind)) points.set(kind, pointTrace(kind, style));
      }
      const trace = points.get(kind);
      trace.x.push(point.at);
      trace.y.push(point.lane);
      trace.text.push(point.label);
      trace.customdata.push(point.seq);
    });
    return [...bars, ...points.values()].filter((trace) => trace.x.length);
  }
  let traces = timelineTraces(timeline);

  function plotted(trace) {
    const copy = Object.assign({}, trace);
    copy.x = trace.type === "bar" ? trace.x.slice() : trace.x.map(BP.plotlyLocal);
    if (trace.base) copy.base = trace.base.map(BP.plotlyLocal);
    copy.hovertemplate = "%{text}<extra>%{fullData.name}</extra>";
    copy.textposition = "none";
    return copy;
  }
  function drawTimeline() {
    const lanes = timeline.lanes.length ? timeline.lanes : ["backplane"];
    // Nothing drawn yet (a new task, a fork before its agent's first step): the last minutes up
    // to now, and a word, rather than an axis Plotly makes up.
    const empty = !traces.length;
    const now = new Date(timeline.now).getTime();
    Plotly.react(timelineEl, traces.map(plotted), {
      barmode: "overlay",
      height: Math.max(220, 110 + 46 * lanes.length),
      margin: { l: 120, r: 20, t: 36, b: 36 },
      xaxis: empty ? { type: "date", range: [BP.plotlyLocal(new Date(now - 5 * 60000).toISOString()),
                                              BP.plotlyLocal(timeline.now)] } : { type: "date" },
      annotations: empty ? [{ text: "Nothing to draw yet: reasoning steps, tool calls and claims appear here as they are recorded.",
                              xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
                              font: { color: "#667085" } }] : [],
      yaxis: { type: "category", categoryorder: "array", categoryarray: lanes, autorange: "reversed" },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      hovermode: "closest",
    }, { displaylogo: false, responsive: true });
  }
  /* Open bars (tool calls still in flight) grow with their age, every second. */
  function ageOpenBars() {
    const now = Date.now();
    let changed = false;
    traces.forEach((trace) => {
      if (!trace.meta || trace.meta.state !== "in_flight") return;
      trace.x = trace.base.map((b) => Math.max(1, now - new Date(b).getTime()));
      trace.text = trace.text.map((t, i) => `${t.replace(/ · in flight.*$/, " · in flight")} ${BP.age(trace.x[i])}`);
      changed = true;
    });
    // Plotly.react, not restyle: restyling x makes Plotly guess the axis type again (linear).
    if (changed) drawTimeline();
  }
  drawTimeline();
  timelineEl.on("plotly_click", (event) => {
    const point = event.points && event.points[0];
    if (!point) return;
    const value = point.customdata;
    const row = typeof value === "number" ? document.getElementById(`seq-${value}`)
      : tbody.querySelector(`tr[data-key="${value}"]`);
    if (row) {
      // Behind the fork dialog the click opens: closing it shows the event's row.
      tbody.querySelectorAll("tr.targeted").forEach((tr) => tr.classList.remove("targeted"));
      row.classList.add("targeted");
      row.scrollIntoView({ block: "center" });
    }
    // Points carry their event's seq; a bar (a call, a sub-agent) its last event's, in meta.seqs.
    const seqs = point.data.meta && point.data.meta.seqs;
    const seq = typeof value === "number" ? value : seqs ? seqs[point.pointIndex] : null;
    if (seq) openFork(seq, String(point.text || "").replace(/ \(seq \d+\)$/, ""));
  });
  setInterval(ageOpenBars, 1000);

  // --- chain marks ------------------------------------------------------------------------------
  const MARKS = { verified: ["✓", "verified up to and including this event"], unverified: ["○", "not verified yet"],
                  broken: ["✕", "the chain is broken here"] };
  function markRows(verifiedSeq, brokenSeq) {
    tbody.querySelectorAll("tr[data-seq]").forEach((tr) => {
      const seq = Number(tr.dataset.seq);
      let state = seq <= verifiedSeq ? "verified" : "unverified";
      // The run that found a break checked every event before it.
      if (brokenSeq) state = seq < brokenSeq ? "verified" : seq === brokenSeq ? "broken" : "unverified";
      const mark = tr.querySelector(".chain-mark");
      mark.dataset.chain = state;
      mark.textContent = MARKS[state][0];
      mark.title = MARKS[state][1];
      tr.classList.toggle("chain-broken", state === "broken");
    });
  }

  // --- live -------------------------------------------------------------------------------------
  const catchUp = BP.serial(async () => {
    for (let round = 0; round < 20; round += 1) {
      const data = await BP.getJSON(`/tasks/${taskId}/live/?after_seq=${lastSeq}`);
      document.getElementById("task-header").innerHTML = data.header;
      document.getElementById("task-tree").innerHTML = data.family;
      BP.renderTimes(document.getElementById("task-header"));
      timeline = data.timeline;
      traces = timelineTraces(timeline);
      drawTimeline();
      if (isLatest) {
        const fresh = BP.fragment(data.rows, true);
        fresh.querySelectorAll("tr[data-seq]").forEach((tr) => {
          const seq = Number(tr.dataset.seq);
          // Rows arrive in seq order; a row already shown (a notice and a reconnect racing) is skipped.
          if (seq <= lastSeq || document.getElementById(`seq-${seq}`)) return;
          tr.classList.add("fresh");
          tbody.appendChild(tr);
          BP.renderTimes(tr);
        });
      }
      lastSeq = Math.max(lastSeq, Number(data.last_seq || 0));
      markRows(data.chain.verified_seq, data.chain.broken_seq);
      refreshRecovery();
      if (!isLatest || lastSeq >= data.task_last_seq) break;
    }
  });
  BP.connect(`/ws/tasks/${taskId}/`, { onNotice: () => catchUp(), catchUp: () => catchUp() });

  // --- verify chain now ---------------------------------------------------------------------------
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("#verify-chain");
    if (!button) return;
    button.disabled = true;
    button.textContent = "Verifying…";
    try {
      const result = await BP.postJSON(`/tasks/${taskId}/verify/`);
      markRows(result.verified_seq, result.broken_seq);
      button.textContent = result.valid ? `✓ intact through seq ${result.verified_seq}` : `✕ broken at seq ${result.broken_seq}`;
      catchUp();
    } catch (error) {
      button.textContent = `Verification failed: ${error.message}`;
    } finally {
      button.disabled = false;
    }
  });

  // --- recovery context -----------------------------------------------------------------------------
  const recovery = document.getElementById("recovery-context");
  async function loadRecovery() {
    const body = recovery.querySelector(".recovery-body");
    try {
      const response = await fetch(recovery.dataset.src, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      body.innerHTML = await response.text();
      body.classList.remove("muted");
    } catch (error) {
      body.textContent = `Could not load the recovery context: ${error.message}`;
    }
  }
  if (recovery.open) loadRecovery();
  recovery.addEventListener("toggle", () => { if (recovery.open) loadRecovery(); });
  /* After live appends the context moves on too: reload it (at most every 2 s) while it is open. */
  let recoveryTimer = null;
  function refreshRecovery() {
    if (!recovery.open || recoveryTimer) return;
    recoveryTimer = setTimeout(() => { recoveryTimer = null; loadRecovery(); }, 2000);
  }

  // --- fork from here ---------------------------------------------------------------------------
  const forkDialog = document.getElementById("fork-dialog");
  const forkForm = document.getElementById("fork-form");
  const atSeq = forkForm.querySelector("input[name=at_seq]");
  const atType = document.getElementById("fork-at-type");
  function describeAt() {
    const row = document.getElementById(`seq-${atSeq.value}`);
    atType.textContent = row ? `· ${row.dataset.type}` : "";
  }
  function openFork(seq, what) {
    atSeq.value = String(seq);
    describeAt();
    if (what && !document.getElementById(`seq-${seq}`)) atType.textContent = `· ${what}`;
    forkForm.querySelector("#fork-error")?.remove();
    if (forkDialog.open) forkDialog.close();
    forkDialog.showModal();
    forkForm.querySelector("input[name=reason]").focus();
  }
  atSeq.addEventListener("input", describeAt);
  tbody.addEventListener("click", (event) => {
    const link = event.target.closest("a.fork-here");
    if (!link) return;
    event.preventDefault();
    openFork(Number(link.dataset.seq));
  });
  forkDialog.addEventListener("click", (event) => {
    // The close buttons, and a click on the backdrop (outside the form).
    if (event.target.closest("[data-close]") || event.target === forkDialog) forkDialog.close();
  });
  forkForm.addEventListener("submit", () => {
    // One click, one request (the form's fork_id makes a second one find the same fork anyway).
    setTimeout(() => { document.getElementById("fork-submit").disabled = true; }, 0);
  });
  if (forkDialog.dataset.open === "true") {
    // Rendered open (a refused fork, or ?fork_at=N): shown as the modal it is when opened here.
    forkDialog.close();
    describeAt();
    forkDialog.showModal();
    forkForm.querySelector("input[name=reason]").focus();
  }

  // --- cancel ------------------------------------------------------------------------------------
  // The button lives in the header, which live updates re-render: listen on the document.
  const cancelDialog = document.getElementById("cancel-dialog");
  document.addEventListener("click", (event) => {
    if (!event.target.closest("#cancel-task")) return;
    cancelDialog.showModal();
    document.getElementById("cancel-reason").focus();
  });
  cancelDialog.addEventListener("click", (event) => {
    if (event.target.closest("[data-close]") || event.target === cancelDialog) cancelDialog.close();
  });
  document.getElementById("cancel-form").addEventListener("submit", () => {
    setTimeout(() => { document.getElementById("cancel-submit").disabled = true; }, 0);
  });

  if (window.location.hash) document.querySelector(window.location.hash)?.classList.add("targeted");
})();
