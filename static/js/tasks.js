/* Task list: the first page follows new and changed tasks live; the filter form's local times
   are sent with the viewer's UTC offset. */
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
  if (table.dataset.live !== "first-page") {
    BP.setLiveState("off", "Live updates follow the first page only");
    return;
  }
  const query = table.dataset.query;
  const body = table.querySelector("tbody");
  const refresh = BP.serial(async () => {
    const data = await BP.getJSON(`/tasks/?${query ? query + "&" : ""}partial=rows`);
    const seen = {};
    body.querySelectorAll("tr[data-task-id]").forEach((tr) => { seen[tr.dataset.taskId] = tr.dataset.updated; });
    const fresh = BP.fragment(data.rows, true);
    fresh.querySelectorAll("tr[data-task-id]").forEach((tr) => {
      if (seen[tr.dataset.taskId] !== tr.dataset.updated) tr.classList.add("fresh");
    });
    body.replaceChildren(...fresh.children);
    BP.renderTimes(body);
    const next = document.getElementById("next-page");
    if (next && !data.next_cursor) next.remove();
    if (next && data.next_cursor) next.href = `?${query ? query + "&" : ""}cursor=${data.next_cursor}`;
  });
  BP.connect("/ws/fleet/", { onNotice: () => refresh(), catchUp: () => refresh() });
})();
