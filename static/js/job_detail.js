/* A bulk job's page: each decision asks for confirmation in a dialog that says what it does, and
   while the job runs its counts, progress bar and rate follow a JSON poll of its progress. When
   the job stops running (finished, paused, aborted) the page reloads once to show the items. */
(() => {
  const dialog = document.getElementById("job-dialog");
  const summary = document.getElementById("job-dialog-summary");
  let pending = null;
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (form.dataset.confirmed || !form.reportValidity()) return;
      event.preventDefault();
      pending = form;
      summary.textContent = form.dataset.confirm;
      dialog.showModal();
    });
  });
  document.getElementById("job-dialog-confirm").addEventListener("click", () => {
    if (!pending) return;
    pending.dataset.confirmed = "yes";
    document.getElementById("job-dialog-confirm").disabled = true;
    pending.requestSubmit();
  });
  dialog.addEventListener("click", (event) => {
    if (event.target.closest("[data-close]") || event.target === dialog) dialog.close();
  });

  const panel = document.getElementById("job-summary");
  if (panel.dataset.status !== "running") return;
  const set = (id, value) => {
    const element = document.getElementById(id);
    if (element.textContent !== String(value)) element.textContent = value;
  };
  const poll = async () => {
    let progress;
    try {
      const response = await fetch(panel.dataset.progressUrl, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(String(response.status));
      progress = await response.json();
    } catch (error) {
      setTimeout(poll, 5000);  // the server is away for a moment: try again, slower
      return;
    }
    for (const name of ["done", "skipped", "failed", "pending"]) set(`count-${name}`, progress[name]);
    set("job-percent", `${progress.percent} %`);
    set("job-rate", progress.rate === null ? "–" : progress.rate);
    document.getElementById("job-progress-fill").style.width = `${progress.percent}%`;
    document.getElementById("tile-failed").classList.toggle("alert", progress.failed > 0);
    if (progress.status !== "running") {
      window.location.reload();
      return;
    }
    setTimeout(poll, 1000);
  };
  setTimeout(poll, 1000);
})();
