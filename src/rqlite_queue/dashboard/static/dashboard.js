// Forms with data-confirm ask first (a script file, not inline handlers: the pages' Content
// Security Policy runs no inline script).
document.addEventListener("submit", function (event) {
  var message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
}, true);
