/* Saved searches: each search's count of matching tasks follows the fleet live (a fetch of the
   counts after every notice, and twice a minute anyway); everything else on the page is a form. */
(function () {
  "use strict";
  const table = document.getElementById("search-table");
  const refresh = BP.serial(async () => {
    const data = await BP.getJSON("/searches/?partial=counts");
    Object.entries(data.counts).forEach(([slug, count]) => {
      const cell = table.querySelector(`tr[data-search="${CSS.escape(slug)}"] [data-field=count]`);
      if (!cell || count === null || cell.textContent === String(count)) return;
      cell.textContent = String(count);
      cell.closest("tr").classList.add("fresh");
    });
  });
  BP.connect("/ws/fleet/", { onNotice: () => refresh(), catchUp: () => refresh() });
  setInterval(() => refresh(), 30000);
})();
