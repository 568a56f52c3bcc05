// Refreshes the overview's charts from the same origin, every few seconds.
(function () {
  "use strict";
  var box = document.getElementById("charts");
  if (!box || !window.fetch || !window.DOMParser) { return; }
  var every = (parseInt(box.getAttribute("data-refresh"), 10) || 5) * 1000;
  var url = location.pathname.replace(/\/?$/, "/") + "charts";
  setInterval(function () {
    fetch(url, { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) { return; }
      var doc = new DOMParser().parseFromString("<div>" + html + "</div>", "text/html");
      var div = doc.body.firstElementChild;
      if (!div) { return; }
      box.replaceChildren.apply(box, Array.prototype.slice.call(div.childNodes).map(function (n) {
        return document.importNode(n, true);
      }));
    }).catch(function () {});
  }, every);
})();
