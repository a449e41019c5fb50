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
    const empty = !timeline.traces.length;
    const now = new Date(timeline.now).getTime();
    Plotly.react(timelineEl, timeline.traces.map(plotted), {
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
    timeline.traces.forEach((trace) => {
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
