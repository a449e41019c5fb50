/* Diff of two histories: the first divergence (or the row a link names) is brought to the
   middle of the screen and marked, below the sticky bar. */
(function () {
  "use strict";
  function target() {
    const hash = window.location.hash;
    if (hash && hash.length > 1) {
      const named = document.getElementById(decodeURIComponent(hash.slice(1)));
      if (named) return named.closest("tr") || named;
    }
    return document.querySelector("#diff-table tr.first-divergence");
  }
  function show() {
    const row = target();
    if (!row) return;
    document.querySelectorAll("#diff-table tr.targeted").forEach((tr) => tr.classList.remove("targeted"));
    if (!row.classList.contains("first-divergence")) row.classList.add("targeted");
    row.scrollIntoView({ block: "center" });
  }
  window.addEventListener("hashchange", show);
  show();
})();
