/* Dead-letter queue: the filter form (local times sent with the viewer's UTC offset), the bulk
   bar (checked rows or "all matching this filter" make a draft job, shown on its page), and the first
   page following new and decided dead letters live. */
(function () {
  "use strict";
  const filters = document.getElementById("dead-letter-filters");
  const tz = filters.querySelector("input[name=tz]");
  if (tz) tz.value = String(new Date().getTimezoneOffset());
  filters.addEventListener("submit", () => {
    // Leave empty fields out of the URL, so links stay short and shareable.
    filters.querySelectorAll("input, select").forEach((field) => { if (!field.value) field.disabled = true; });
    const olderThan = filters.querySelector("input[name=older_than]");
    if (olderThan && !olderThan.value) filters.querySelector("select[name=older_unit]").disabled = true;
    const typed = Array.from(filters.querySelectorAll("input[type=datetime-local]")).some((f) => f.value);
    if (tz && !typed) tz.disabled = true;
  });

  const table = document.getElementById("dead-letter-table");
  const body = table.querySelector("tbody");

  // --- the bulk bar (reviewers only) ----------------------------------------------------------
  const bulk = document.getElementById("bulk-form");
  const picked = new Set();
  function syncBulk() {
    if (!bulk) return;
    const all = document.getElementById("all-matching").checked;
    const count = document.getElementById("selected-count");
    const reason = document.getElementById("bulk-reason").value.trim();
    body.querySelectorAll("input[name=ids]").forEach((box) => { box.disabled = all; });
    count.textContent = all ? "all pending matching the filter" : picked.size ? `${picked.size} selected` : "none selected";
    count.classList.toggle("muted", !all && !picked.size);
    const button = document.getElementById("bulk-preview");
    button.disabled = !(all || picked.size) || !reason;
    button.title = !(all || picked.size) ? "Select dead letters first" : !reason ? "Write a reason first" : "";
    const pageBox = document.getElementById("pick-page");
    const boxes = Array.from(body.querySelectorAll("input[name=ids]"));
    pageBox.disabled = all || !boxes.length;
    pageBox.checked = boxes.length > 0 && boxes.every((box) => box.checked);
  }
  if (bulk) {
    body.addEventListener("change", (event) => {
      const box = event.target.closest("input[name=ids]");
      if (!box) return;
      if (box.checked) picked.add(box.value); else picked.delete(box.value);
      syncBulk();
    });
    document.getElementById("pick-page").addEventListener("change", (event) => {
      body.querySelectorAll("input[name=ids]").forEach((box) => {
        box.checked = event.target.checked;
        if (box.checked) picked.add(box.value); else picked.delete(box.value);
      });
      syncBulk();
    });
    document.getElementById("all-matching").addEventListener("change", syncBulk);
    document.getElementById("bulk-reason").addEventListener("input", syncBulk);
    bulk.addEventListener("submit", (event) => {
      if (document.getElementById("bulk-preview").disabled) { event.preventDefault(); return; }
      // "All matching" decides by the filter: the checked rows are not sent with it.
      if (document.getElementById("all-matching").checked) {
        body.querySelectorAll("input[name=ids]").forEach((box) => { box.disabled = true; });
      }
    });
    syncBulk();
  }

  // --- live ------------------------------------------------------------------------------------
  if (table.dataset.live !== "first-page") {
    BP.setLiveState("off", "Live updates follow the first page only");
    return;
  }
  const query = table.dataset.query;
  /* Rows that arrived live stay marked for a while (across the refreshes that follow a burst
     of notices); any row that changed flashes once. */
  const NEW_FOR_MS = 10000;
  const newUntil = new Map();
  setInterval(() => {
    const now = Date.now();
    newUntil.forEach((until, id) => {
      if (until > now) return;
      newUntil.delete(id);
      body.querySelector(`tr[data-id="${id}"]`)?.classList.remove("dl-new");
    });
  }, 1000);
  const refresh = BP.serial(async () => {
    const data = await BP.getJSON(`/dead-letters/?${query ? query + "&" : ""}partial=rows`);
    const seen = {};
    body.querySelectorAll("tr[data-id]").forEach((tr) => { seen[tr.dataset.id] = tr.dataset.state; });
    const fresh = BP.fragment(data.rows, true);
    const now = Date.now();
    fresh.querySelectorAll("tr[data-id]").forEach((tr) => {
      const id = tr.dataset.id;
      if (!(id in seen)) newUntil.set(id, now + NEW_FOR_MS);
      if (seen[id] !== tr.dataset.state) tr.classList.add("fresh");
      if ((newUntil.get(id) || 0) > now) tr.classList.add("dl-new");
      const box = tr.querySelector("input[name=ids]");
      if (box && picked.has(box.value)) box.checked = true;
    });
    // A checked row decided by someone else drops out of the selection with its checkbox.
    const boxes = new Set(Array.from(fresh.querySelectorAll("input[name=ids]")).map((box) => box.value));
    picked.forEach((id) => { if (!boxes.has(id)) picked.delete(id); });
    body.replaceChildren(...fresh.children);
    BP.renderTimes(body);
    const next = document.getElementById("next-page");
    if (next && !data.next_cursor) next.remove();
    if (next && data.next_cursor) next.href = `?${query ? query + "&" : ""}cursor=${data.next_cursor}`;
    syncBulk();
  });

  /* Dead letters change with a new one (the notice's count), a resync, or a task notice whose
     last event is about them; other task notices are frequent and say nothing about this
     list, but a coalesced notice can hide a decision behind a later event, so they still
     refresh it, at most every few seconds. */
  const DEAD_LETTER_EVENTS = new Set(["TaskDeadLettered", "DeadLetterRequeued", "DeadLetterDiscarded"]);
  let quietTimer = null;
  function onNotice(notice) {
    const relevant = notice.resync || notice.dead_letters > 0 || (notice.tasks || []).some(
      (task) => DEAD_LETTER_EVENTS.has(task.type) || task.status === "dead_lettered");
    if (relevant) { refresh(); return; }
    if ((notice.tasks || []).length && !quietTimer) {
      quietTimer = setTimeout(() => { quietTimer = null; refresh(); }, 5000);
    }
  }
  BP.connect("/ws/fleet/", { onNotice, catchUp: () => refresh() });
})();
