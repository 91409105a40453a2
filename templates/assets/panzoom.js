/* dml2comm drawings: pan, zoom and tooltips for inline Graphviz SVGs.
 * Written for this project (no third-party code, nothing loaded from the network).
 * - Buttons +, -, fit; Ctrl/Cmd + wheel zooms around the cursor; dragging pans when zoomed.
 * - Tooltips: each node's <title> (written by dml2comm, plain text) becomes data-tip and is
 *   shown in a styled box; textContent only, never HTML.  Graphviz groups (g.node, g.edge,
 *   g.cluster) and the generated charts' groups (g.d2c-item) work the same way.
 */
(function () {
  "use strict";
  var tip = null;

  function tipBox() {
    if (!tip) {
      tip = document.createElement("div");
      tip.className = "d2c-tip";
      tip.setAttribute("role", "tooltip");
      document.body.appendChild(tip);
    }
    return tip;
  }

  function placeTip(ev) {
    var box = tipBox();
    var pad = 14;
    var x = ev.clientX + pad, y = ev.clientY + pad;
    var w = box.offsetWidth, h = box.offsetHeight;
    if (x + w > window.innerWidth - 8) x = Math.max(8, ev.clientX - w - pad);
    if (y + h > window.innerHeight - 8) y = Math.max(8, ev.clientY - h - pad);
    box.style.left = x + "px";
    box.style.top = y + "px";
  }

  function initTips(svg) {
    var groups = svg.querySelectorAll("g.node, g.edge, g.cluster, g.d2c-item");
    groups.forEach(function (g) {
      var title = null;
      for (var i = 0; i < g.children.length; i++) {
        if (g.children[i].tagName.toLowerCase() === "title") { title = g.children[i]; break; }
      }
      if (!title) return;
      g.setAttribute("data-tip", title.textContent);
      title.parentNode.removeChild(title);
      g.addEventListener("mouseenter", function (ev) {
        var box = tipBox();
        box.textContent = g.getAttribute("data-tip");
        box.classList.add("d2c-tip-on");
        placeTip(ev);
      });
      g.addEventListener("mousemove", placeTip);
      g.addEventListener("mouseleave", function () { tipBox().classList.remove("d2c-tip-on"); });
    });
  }

  function initPanZoom(root) {
    var svg = root.querySelector(".d2c-viewport svg");
    if (!svg || svg.getAttribute("data-d2c-ready")) return;
    svg.setAttribute("data-d2c-ready", "1");
    initTips(svg);
    var vb = svg.getAttribute("viewBox").split(/[\s,]+/).map(Number);
    var full = { x: vb[0], y: vb[1], w: vb[2], h: vb[3] };
    var view = { x: full.x, y: full.y, w: full.w, h: full.h };
    var zoomed = false;
    // tall drawings (a layer's operators: thousands of px) open at their own scale, where an
    // operator's text is readable (fitted into the window it was about 4 px); "fit" shows the
    // whole graph in the window and pressed again goes back; - / Ctrl + wheel zoom out
    var tall = full.h > 1200 && full.h > 1.5 * full.w;
    if (tall) root.classList.add("d2c-tall");

    function apply() {
      svg.setAttribute("viewBox", [view.x, view.y, view.w, view.h].join(" "));
      root.classList.toggle("d2c-zoomed", zoomed);
    }

    function freeze() {
      // keep the frame the size it has now, so zooming changes the content, not the page
      if (!zoomed) {
        var r = svg.getBoundingClientRect();
        svg.style.width = r.width + "px";
        svg.style.height = r.height + "px";
        svg.style.maxWidth = "100%";
      }
      zoomed = true;
    }

    function zoom(factor, cx, cy) {
      freeze();
      var r = svg.getBoundingClientRect();
      var fx = cx === undefined ? 0.5 : (cx - r.left) / r.width;
      var fy = cy === undefined ? 0.5 : (cy - r.top) / r.height;
      var nw = Math.min(full.w * 1.5, Math.max(full.w / 40, view.w / factor));
      var nh = nw * (view.h / view.w);
      view.x += (view.w - nw) * fx;
      view.y += (view.h - nh) * fy;
      view.w = nw;
      view.h = nh;
      apply();
    }

    function reset() {
      if (tall && !zoomed) root.classList.toggle("d2c-fit-window");
      view = { x: full.x, y: full.y, w: full.w, h: full.h };
      zoomed = false;
      svg.style.width = "";
      svg.style.height = "";
      svg.style.maxWidth = "";
      apply();
    }

    root.querySelectorAll("[data-zoom]").forEach(function (b) {
      b.addEventListener("click", function () {
        var what = b.getAttribute("data-zoom");
        if (what === "in") zoom(1.4);
        else if (what === "out") zoom(1 / 1.4);
        else reset();
      });
    });

    svg.addEventListener("wheel", function (ev) {
      if (!(ev.ctrlKey || ev.metaKey)) return;
      ev.preventDefault();
      zoom(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX, ev.clientY);
    }, { passive: false });

    var drag = null;
    svg.addEventListener("pointerdown", function (ev) {
      if (!zoomed || ev.button !== 0) return;
      drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false };
    });
    window.addEventListener("pointermove", function (ev) {
      if (!drag) return;
      var r = svg.getBoundingClientRect();
      var dx = (ev.clientX - drag.x) * view.w / r.width;
      var dy = (ev.clientY - drag.y) * view.h / r.height;
      if (Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 4) drag.moved = true;
      if (drag.moved) {
        view.x = drag.vx - dx;
        view.y = drag.vy - dy;
        apply();
        root.classList.add("d2c-dragging");
      }
    });
    window.addEventListener("pointerup", function () {
      if (drag && drag.moved) {
        // swallow the click that ends a drag so that panning never follows a link
        svg.addEventListener("click", function stop(e) { e.preventDefault(); e.stopPropagation(); svg.removeEventListener("click", stop, true); }, true);
      }
      drag = null;
      root.classList.remove("d2c-dragging");
    });
  }

  function init() {
    document.querySelectorAll("[data-d2c-panzoom]").forEach(initPanZoom);
  }

  if (window.document$ && typeof window.document$.subscribe === "function") {
    window.document$.subscribe(init); // Material's instant navigation, when enabled
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
