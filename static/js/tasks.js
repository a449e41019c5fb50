/* Task list: the first page follows new and changed tasks live; the filter form's local times
   are sent with the viewer's UTC offset; the bulk bar (reviewers only) makes a draft
   fork-from-failure job of the checked tasks, or all matching the filter, shown on its page. */
(function () {
  "use strict";
  const form = document.getElementById("task-filters");
  const tz = form.querySelector("input[name=tz]");
  if (tz) tz.value = String(new Date().getTimezoneOffset());
  form.addEventListener("submit", () => {
    // Leave empty fields out of the URL, so links stay short and shareable.
    form.querySelectorAll("input, select").forEach((field) => {
      if (!field.value || (field.name === "recovering" && field.value === "False")) field.disabled = true;
    });
    if (tz && !Array.from(form.querySelectorAll("input[type=datetime-local]")).some((f) => f.value)) tz.disabled = true;
  });

  const table = document.getElementById("task-table");
  const body = table.querySelector("tbody");

  // --- the bulk bar: fork from failure, as a job (reviewers only) ---------------------------------
  const bulkForm = document.getElementById("fork-bulk-form");
  const picked = new Set();
  const allMatching = document.getElementById("all-matching");
  const reason = document.getElementById("bulk-reason");
  const preview = document.getElementById("bulk-preview");
  const pageBox = document.getElementById("pick-page");
  function syncBulk() {
    if (!bulkForm) return;
    const all = allMatching.checked;
    const count = document.getElementById("selected-count");
    body.querySelectorAll("input[name=ids]").forEach((box) => { box.disabled = all; });
    count.textContent = all ? "all matching the filter" : picked.size ? `${picked.size} selected` : "none selected";
    count.classList.toggle("muted", !all && !picked.size);
    const why = reason.value.trim();
    preview.disabled = !(all || picked.size) || !why;
    preview.title = !(all || picked.size) ? "Select tasks first" : !why ? "Write a reason first" : "";
    const boxes = Array.from(body.querySelectorAll("input[name=ids]"));
    pageBox.disabled = all || !boxes.length;
    pageBox.checked = boxes.length > 0 && boxes.every((box) => box.checked);
  }
  if (bulkForm) {
    body.addEventListener("change", (event) => {
      const box = event.target.closest("input[name=ids]");
      if (!box) return;
      if (box.checked) picked.add(box.value); else picked.delete(box.value);
      syncBulk();
    });
    pageBox.addEventListener("change", () => {
      body.querySelectorAll("input[name=ids]").forEach((box) => {
        box.checked = pageBox.checked;
        if (box.checked) picked.add(box.value); else picked.delete(box.value);
      });
      syncBulk();
    });
    allMatching.addEventListener("change", syncBulk);
    reason.addEventListener("input", syncBulk);
    bulkForm.addEventListener("submit", (event) => {
      if (preview.disabled) { event.preventDefault(); return; }
      // "All matching" forks by the filter: the checked rows are not sent with it.
      if (allMatching.checked) body.querySelectorAll("input[name=ids]").forEach((box) => { box.disabled = true; });
    });
    syncBulk();
  }

  if (table.dataset.live !== "first-page") {
    BP.setLiveState("off", "Live updates follow the first page only");
    return;
  }
  const query = table.dataset.query;
  const refresh = BP.serial(async () => {
    const data = await BP.getJSON(`/tasks/?${query ? query + "&" : ""}partial=rows`);
    const seen = {};
    body.querySelectorAll("tr[data-task-id]").forEach((tr) => { seen[tr.dataset.taskId] = tr.dataset.updated; });
    const fresh = BP.fragment(data.rows, true);
    fresh.querySelectorAll("tr[data-task-id]").forEach((tr) => {
      if (seen[tr.dataset.taskId] !== tr.dataset.updated) tr.classList.add("fresh");
      const box = tr.querySelector("input[name=ids]");
      if (box && picked.has(box.value)) box.checked = true;
    });
    body.replaceChildren(...fresh.children);
    syncBulk();
    BP.renderTimes(body);
    const next = document.getElementById("next-page");
    if (next && !data.next_cursor) next.remove();
    if (next && data.next_cursor) next.href = `?${query ? query + "&" : ""}cursor=${data.next_cursor}`;
  });
  BP.connect("/ws/fleet/", { onNotice: () => refresh(), catchUp: () => refresh() });
})();
