/* The pauses page: pausing asks for confirmation in a dialog that says what will be held back. */
(() => {
  const form = document.getElementById("pause-form");
  if (!form) return;  // operators only: a viewer's page has no such form
  const dialog = document.getElementById("pause-dialog");
  const summary = document.getElementById("pause-summary");
  let confirmed = false;
  form.addEventListener("submit", (event) => {
    if (confirmed || !form.reportValidity()) return;
    event.preventDefault();
    const namespace = form.elements.namespace.value.trim();
    const kind = form.elements.kind.value.trim();
    summary.textContent = kind
      ? `Every pending ${kind} task of ${namespace} will wait. Reason: ${form.elements.reason.value.trim()}`
      : `Every pending task of ${namespace}, of any kind, will wait. Reason: ${form.elements.reason.value.trim()}`;
    dialog.showModal();
  });
  document.getElementById("pause-confirm").addEventListener("click", () => {
    confirmed = true;
    document.getElementById("pause-confirm").disabled = true;
    form.requestSubmit();
  });
  dialog.addEventListener("click", (event) => {
    if (event.target.closest("[data-close]") || event.target === dialog) dialog.close();
  });
})();
