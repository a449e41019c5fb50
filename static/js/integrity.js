/* Integrity: seals over time, "verify one task" inline, and the progress of runs in the worker. */
(function () {
  "use strict";
  const seals = JSON.parse(document.getElementById("seal-data").textContent);
  const chart = document.getElementById("seal-chart");
  if (seals.sizes.length) {
    Plotly.react(chart, [{
      type: "scatter", mode: "lines+markers", x: seals.times.map(BP.plotlyLocal), y: seals.sizes,
      line: { shape: "hv", color: "#2f5bd3" }, marker: { size: 4 }, hovertemplate: "%{y} leaves<extra>%{x}</extra>",
    }], {
      margin: { l: 60, r: 16, t: 8, b: 36 }, xaxis: { type: "date" }, yaxis: { title: { text: "tree size" },
      rangemode: "tozero" },
    }, { displaylogo: false, responsive: true });
  } else {
    chart.innerHTML = '<p class="muted">No signed tree head yet: the sealer runs every 10 s in the worker.</p>';
  }

  // --- one task, inline (the task page's own endpoint) -----------------------------------------
  document.getElementById("verify-one").addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = document.getElementById("verify-task").value.trim();
    const out = document.getElementById("verify-one-result");
    out.textContent = "verifying…";
    try {
      const result = await BP.postJSON(`/tasks/${encodeURIComponent(id)}/verify/`);
      out.innerHTML = result.valid
        ? `<span class="chain-mark" data-chain="verified">✓</span> intact through seq ${result.verified_seq} (${result.checked_events} events, ${result.seconds} s)`
        : `<span class="chain-mark" data-chain="broken">✕</span> broken at seq ${result.broken_seq}: ${result.problem || "see the task"}`;
      out.insertAdjacentHTML("beforeend", ` · <a href="/tasks/${encodeURIComponent(id)}/">open the task</a>`);
    } catch (error) {
      out.textContent = error.message.startsWith("404") ? "no such task" : `failed: ${error.message}`;
    }
  });

  // --- every task, in the worker ----------------------------------------------------------------
  const holder = document.getElementById("run-progress");
  function bar(run) {
    let el = holder.querySelector(`.progress[data-run="${run.id}"]`);
    if (!el) {
      el = document.createElement("div");
      el.className = "progress";
      el.dataset.run = run.id;
      el.innerHTML = `<div class="progress-label">${run.mode} run ${run.id}: <span class="progress-text"></span></div>` +
        '<div class="bar"><div class="fill"></div></div>';
      holder.prepend(el);
    }
    const total = run.tasks_total == null ? "?" : run.tasks_total;
    let text = `${run.tasks_checked} of ${total} tasks, ${run.events_checked} events`;
    if (run.finished_at) text += run.failures ? ` — ${run.failures} broken` : " — every chain intact";
    else if (!run.tasks_checked) text += " — waiting for the worker";
    el.querySelector(".progress-text").textContent = text;
    el.querySelector(".fill").style.width = `${run.percent}%`;
    el.classList.toggle("done", !!run.finished_at && !run.failures);
    el.classList.toggle("failed", !!run.finished_at && run.failures > 0);
  }
  function follow(run) {
    bar(run);
    if (run.finished_at) return;
    setTimeout(async () => {
      try { follow(await BP.getJSON(`/integrity/runs/${run.id}/`)); } catch (error) { setTimeout(() => follow(run), 3000); }
    }, 1000);
  }
  JSON.parse(document.getElementById("running-runs").textContent).forEach(follow);
  // Operators only: a viewer's page has no such form.
  document.getElementById("verify-all")?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = event.target.querySelector("button");
    button.disabled = true;
    try {
      const response = await fetch(event.target.action, {
        method: "POST", credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": BP.csrfToken() },
      });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      follow(await response.json());
    } catch (error) {
      holder.insertAdjacentHTML("afterbegin", `<div class="notice error">Could not start: ${error.message}</div>`);
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById("proof-form").addEventListener("input", (event) => {
    const form = event.currentTarget;
    const task = form.task_id.value.trim() || "TASK";
    const seq = form.seq.value.trim() || "SEQ";
    const command = document.getElementById("proof-command");
    command.textContent = command.textContent.replace(/proof-\S+\.json/, `proof-${task}-${seq}.json`);
  });
})();
