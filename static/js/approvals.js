/* The Approvals page: the waiting requests and signals follow the log live. A request written,
   decided, escalated or expired, a signal waited for, received or timed out, is an event of its
   task; a notice of one (or a resync) refreshes both lists, keeping what is being typed in a form
   that is still there. */
(function () {
  "use strict";
  const list = document.getElementById("approvals-waiting");
  const signalList = document.getElementById("signals-waiting");
  const APPROVAL_EVENTS = new Set(["ApprovalRequested", "ApprovalGranted", "ApprovalDenied", "ApprovalEscalated",
    "ApprovalExpired", "SignalAwaited", "SignalReceived", "SignalTimedOut"]);
  const refresh = BP.serial(async () => {
    const typed = {};
    list.querySelectorAll("section[data-id]").forEach((card) => {
      const reason = card.querySelector("input[name=reason]");
      if (reason && reason.value) typed[card.dataset.id] = reason.value;
    });
    const known = new Set(Array.from(list.querySelectorAll("section[data-id]")).map((card) => card.dataset.id));
    const data = await BP.getJSON("/approvals/?partial=waiting");
    const fresh = BP.fragment(data.waiting, false);
    fresh.querySelectorAll("section[data-id]").forEach((card) => {
      if (!known.has(card.dataset.id)) card.classList.add("fresh");
      const reason = card.querySelector("input[name=reason]");
      if (reason && typed[card.dataset.id]) reason.value = typed[card.dataset.id];
    });
    list.replaceChildren(...fresh.children);
    BP.renderTimes(list);
    const payloads = {};
    signalList.querySelectorAll("tr[data-signal]").forEach((row) => {
      const payload = row.querySelector("input[name=payload]");
      if (payload && payload.value !== "{}") payloads[row.dataset.signal] = payload.value;
    });
    const freshSignals = BP.fragment(data.signals, false);
    freshSignals.querySelectorAll("tr[data-signal]").forEach((row) => {
      const payload = row.querySelector("input[name=payload]");
      if (payload && payloads[row.dataset.signal]) payload.value = payloads[row.dataset.signal];
    });
    signalList.replaceChildren(...freshSignals.children);
    BP.renderTimes(signalList);
  });
  function onNotice(notice) {
    if (notice.resync || (notice.tasks || []).some((task) => APPROVAL_EVENTS.has(task.type))) refresh();
  }
  BP.connect("/ws/fleet/", { onNotice, catchUp: () => refresh() });
})();
