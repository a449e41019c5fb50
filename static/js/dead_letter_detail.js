/* One dead letter: the edit-and-requeue editor (JSON checked as you type, submit only when it
   parses to an object that differs from the original, a line diff against the original shown
   before submitting), the diff of an edit already requeued, and one submit per decision. */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("dead-letter-data").textContent);

  /* Pretty JSON with sorted keys, as the server shows payloads, so a diff shows changes, not
     re-orderings. */
  function sorted(value) {
    if (Array.isArray(value)) return value.map(sorted);
    if (value && typeof value === "object") {
      const out = {};
      Object.keys(value).sort().forEach((key) => { out[key] = sorted(value[key]); });
      return out;
    }
    return value;
  }
  const pretty = (value) => JSON.stringify(sorted(value), null, 2);

  /* A line diff (longest common subsequence); payloads are small, and beyond a bound the diff
     says so instead of freezing the page. */
  const MAX_CELLS = 4000000;
  function diffLines(before, after) {
    const a = before.split("\n");
    const b = after.split("\n");
    if (a.length * b.length > MAX_CELLS) return null;
    const n = a.length;
    const m = b.length;
    const width = m + 1;
    const lcs = new Uint32Array((n + 1) * width);
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i * width + j] = a[i] === b[j] ? lcs[(i + 1) * width + j + 1] + 1
          : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
      }
    }
    const out = [];
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push([" ", a[i]]); i += 1; j += 1; }
      else if (lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) { out.push(["-", a[i]]); i += 1; }
      else { out.push(["+", b[j]]); j += 1; }
    }
    while (i < n) { out.push(["-", a[i]]); i += 1; }
    while (j < m) { out.push(["+", b[j]]); j += 1; }
    return out;
  }

  /* Changed lines with up to 2 lines of context around them; long unchanged runs folded.
     Returns [lines removed, lines added], or null when too large to diff. */
  function renderDiff(target, lines) {
    target.replaceChildren();
    if (lines === null) {
      target.textContent = "Too large to diff here; the server keeps the original either way.";
      return null;
    }
    const changed = lines.map((line) => line[0] !== " ");
    const near = (index) => changed.slice(Math.max(0, index - 2), index + 3).some(Boolean);
    let folded = 0;
    const counts = [0, 0];
    const flush = () => {
      if (!folded) return;
      const span = document.createElement("span");
      span.className = "fold";
      span.textContent = `  … ${folded} unchanged line${folded === 1 ? "" : "s"}\n`;
      target.appendChild(span);
      folded = 0;
    };
    lines.forEach(([mark, text], index) => {
      if (mark === " " && !near(index)) { folded += 1; return; }
      flush();
      const span = document.createElement("span");
      span.className = mark === "+" ? "add" : mark === "-" ? "del" : "same";
      span.textContent = `${mark} ${text}\n`;
      target.appendChild(span);
      if (mark !== " ") counts[mark === "-" ? 0 : 1] += 1;
    });
    flush();
    if (!counts[0] && !counts[1]) {
      target.replaceChildren();
      const none = document.createElement("span");
      none.className = "muted";
      none.textContent = "No changes.";
      target.appendChild(none);
    }
    return counts;
  }

  // --- an edit already requeued: what changed --------------------------------------------------
  const decidedDiff = document.getElementById("decided-diff");
  if (decidedDiff && data.original) renderDiff(decidedDiff, diffLines(pretty(data.original), pretty(data.payload)));

  // --- the editor ------------------------------------------------------------------------------
  const form = document.getElementById("edit-form");
  if (form) {
    const area = document.getElementById("edit_payload");
    const status = document.getElementById("json-status");
    const submit = document.getElementById("edit-submit");
    const diff = document.getElementById("edit-diff");
    const reason = document.getElementById("edit_reason");
    const original = pretty(data.payload);

    /* Where JSON.parse stopped, as line and column (browsers say "at position N", or name the
       line and column themselves). */
    function where(message) {
      const match = /position (\d+)/.exec(message);
      if (!match || /line \d+/.test(message)) return "";
      const before = area.value.slice(0, Number(match[1]));
      const line = before.split("\n").length;
      return ` (line ${line}, column ${before.length - before.lastIndexOf("\n")})`;
    }

    let valid = false;
    function check() {
      let parsed;
      try {
        parsed = JSON.parse(area.value);
      } catch (error) {
        valid = false;
        status.className = "json-status bad";
        status.textContent = `Not valid JSON: ${error.message}${where(error.message)}`;
        area.setAttribute("aria-invalid", "true");
        diff.replaceChildren();
        const hint = document.createElement("span");
        hint.className = "muted";
        hint.textContent = "The diff appears once the JSON is valid.";
        diff.appendChild(hint);
        return sync();
      }
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
        valid = false;
        status.className = "json-status bad";
        status.textContent = "The payload must be a JSON object ({…}).";
        area.setAttribute("aria-invalid", "true");
        return sync();
      }
      area.removeAttribute("aria-invalid");
      const counts = renderDiff(diff, diffLines(original, pretty(parsed)));
      // Too large to diff: compare the normalized texts instead.
      const changed = counts ? counts[0] + counts[1] > 0 : pretty(parsed) !== original;
      valid = changed;
      status.className = valid ? "json-status good" : "json-status";
      const summary = counts ? ` · ${counts[0]} line${counts[0] === 1 ? "" : "s"} removed, ${counts[1]} added` : "";
      status.textContent = valid ? `Valid JSON object${summary}`
        : "Valid JSON, identical to the original: use “Requeue as it is” above, or change something.";
      return sync();
    }
    function sync() {
      const hasReason = reason.value.trim() !== "";
      submit.disabled = !valid || !hasReason;
      submit.title = !valid ? "Fix the JSON (or change something) first" : !hasReason ? "Write a reason first" : "";
    }
    area.addEventListener("input", () => {
      // The server's verdict was on the text it got; once that text changes, the page's own check speaks.
      area.parentElement.querySelectorAll(".errorlist").forEach((list) => list.remove());
      check();
    });
    reason.addEventListener("input", sync);
    document.getElementById("format-json").addEventListener("click", () => {
      try { area.value = pretty(JSON.parse(area.value)); } catch (error) { /* the status already says why */ }
      check();
    });
    document.getElementById("reset-json").addEventListener("click", () => { area.value = original; check(); });
    form.addEventListener("submit", (event) => {
      check();
      if (submit.disabled) event.preventDefault();
    });
    check();
  }

  // --- one submit per decision -----------------------------------------------------------------
  document.querySelectorAll("form.decide, #edit-form").forEach((decision) => {
    decision.addEventListener("submit", (event) => {
      if (event.defaultPrevented) return;
      decision.querySelectorAll("button[type=submit]").forEach((button) => { button.disabled = true; });
    });
  });
})();
