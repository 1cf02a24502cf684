// The dashboard's one script, loaded with the page's nonce. Everything works
// without it; it adds small conveniences only.
"use strict";
(function () {
  // Purge: the button is enabled once the queue's name is typed (the server
  // checks it again).
  document.querySelectorAll("input[data-must-equal]").forEach(function (input) {
    var form = input.form;
    var button = form && form.querySelector("button[type=submit]");
    if (!button) {
      return;
    }
    var update = function () {
      button.disabled = input.value !== input.dataset.mustEqual;
    };
    input.addEventListener("input", update);
    update();
  });

  // Refresh every few seconds while the box is ticked (remembered for the
  // tab), so that the depth charts keep sampling.
  var box = document.getElementById("auto-refresh");
  var every = Number(document.body.dataset.refresh || 0);
  if (box && every > 0) {
    var key = "asyncplatform-dashboard-refresh";
    box.checked = sessionStorage.getItem(key) === "1";
    var timer = null;
    var arm = function () {
      clearTimeout(timer);
      if (box.checked) {
        timer = setTimeout(function () { location.reload(); }, every * 1000);
      }
    };
    box.addEventListener("change", function () {
      sessionStorage.setItem(key, box.checked ? "1" : "0");
      arm();
    });
    arm();
  }

  // A form submitted once cannot be submitted again while the answer is on
  // its way (no double redrive).
  document.querySelectorAll("form[method=post]").forEach(function (form) {
    form.addEventListener("submit", function () {
      setTimeout(function () {
        form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
      }, 0);
    });
  });
})();
