// dsactor dashboard: polls /api/deployment and redraws the page. No framework, no CDN.
"use strict";
(function () {
  const query = location.search.includes("token=") ? location.search : "";
  const PHASES = [  // stacked in this order (bands()); forward/backward/optimizer less their waits
    ["fetch wait", "#d69e2e"], ["forward", "#3182ce"], ["reduce", "#e53e3e"], ["backward", "#805ad5"],
    ["push", "#dd6b20"], ["commit", "#38a169"], ["optimizer", "#718096"]];

  const el = (tag, attrs, ...kids) => {
    const e = document.createElementNS(
      ["svg", "polyline", "rect", "text", "line", "title"].includes(tag) ? "http://www.w3.org/2000/svg"
                                                                : "http://www.w3.org/1999/xhtml", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) e.append(k);
    return e;
  };
  const fmt = (v) => v === null || v === undefined || Number.isNaN(v) ? "–"
    : Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : +v.toPrecision(5) + "";
  const bytes = (v) => { const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; } return v.toFixed(1) + " " + u[i]; };
  const series = (st, name) => (st.metrics && st.metrics[name] ? st.metrics[name].series : []);
  const value = (st, name, labels) => {
    for (const s of series(st, name))
      if (Object.entries(labels || {}).every(([k, v]) => s.labels[k] === v)) return s.value ?? s.sum;
    return null;
  };

  function chart(id, title, points) {  // points: [[x, y]]
    const W = 300, H = 110, P = 24;
    const svg = el("svg", { id: id, width: W, height: H, "data-points": points.length });
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]).filter(Number.isFinite);
    if (points.length && ys.length) {
      const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
      const y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
      const sx = (x) => P + (x - x0) / (x1 - x0) * (W - P - 6), sy = (y) => H - 14 - (y - y0) / (y1 - y0) * (H - 24);
      svg.append(el("polyline", { fill: "none", stroke: "#3182ce", "stroke-width": 1.5,
        points: points.filter((p) => Number.isFinite(p[1])).map((p) => sx(p[0]) + "," + sy(p[1])).join(" ") }));
      svg.append(el("text", { x: 2, y: 10 }, fmt(y1)), el("text", { x: 2, y: H - 14 }, fmt(y0)),
        el("text", { x: P, y: H - 2 }, "step " + x0), el("text", { x: W - 60, y: H - 2 }, "step " + x1));
    }
    return el("div", { class: "panel" }, el("h4", {}, title), svg);
  }

  // A step's bands in PHASES order: each wait as measured, and forward, backward and optimizer
  // less the waits inside them (where StepResult says each lies; what a wait has beyond its
  // first phase, as ZeRO's last reduce-scatter in optimizer, comes off the next), so a bar is
  // the step's time.
  function bands(p) {
    const left = { forward: p.forward || 0, backward: p.backward || 0, optimizer: p.optimizer || 0 };
    const take = (wait, homes) => { let rest = wait || 0;
      for (const h of homes) { const d = Math.min(rest, left[h]); left[h] -= d; rest -= d; }
      return (wait || 0) - rest; };
    const commit = take(p.commit, ["optimizer"]), push = take(p.push, ["optimizer", "backward"]);
    const fetch = take(p.fetch, ["forward", "optimizer"]), reduce = take(p.reduce, ["backward", "optimizer"]);
    return [fetch, left.forward, reduce, left.backward, push, commit, left.optimizer];
  }

  function timeline(trainers) {  // the last steps of every rank, stacked by phase
    const box = el("div", { class: "panel" }, el("h4", {}, "Step timeline by phase (seconds, last steps per rank)"));
    const legend = el("div", { class: "legend" });
    for (const [name, color] of PHASES) legend.append(el("span", {}, el("i", { style: "background:" + color }), name));
    box.append(legend);
    for (const t of trainers) {
      const steps = t.history.slice(-40), W = 620, H = 70;
      const total = (h) => (h.phases.forward || 0) + (h.phases.backward || 0) + (h.phases.optimizer || 0);
      const max = Math.max(1e-9, ...steps.map(total)), bw = W / Math.max(steps.length, 1);
      const svg = el("svg", { width: W, height: H + 12, class: "timeline", "data-role": t.name });
      steps.forEach((h, i) => {
        const parts = bands(h.phases);
        let y = H;
        parts.forEach((s, k) => { const hgt = s / max * H; y -= hgt;
          svg.append(el("rect", { x: i * bw, y: y, width: Math.max(1, bw - 1), height: hgt, fill: PHASES[k][1] },
            el("title", {}, "step " + h.step + " " + PHASES[k][0] + " " + fmt(s) + " s"))); });
      });
      svg.append(el("text", { x: 0, y: H + 11 }, t.name + " (max " + fmt(max) + " s)"));
      box.append(svg);
    }
    return box;
  }

  function gauge(label, used, limit) {
    const pct = limit > 0 ? Math.min(100, used / limit * 100) : 0;
    return el("div", {}, label + ": " + bytes(used) + (limit > 0 ? " of " + bytes(limit) : ""),
      el("div", { class: "gauge" }, el("div", { style: "width:" + pct + "%" })));
  }

  function tiers(roles) {
    const box = el("div", { class: "panel" }, el("h4", {}, "Tiers"));
    for (const r of roles) {
      const st = r.state;
      if (r.kind === "trainer" && value(st, "dsactor_train_param_bytes") !== null)
        box.append(gauge(r.name + " resident parameters (peak)", value(st, "dsactor_train_peak_resident_param_bytes"),
          value(st, "dsactor_train_param_bytes")));
      if (r.kind === "offload" && value(st, "dsactor_offload_ram_limit_bytes") !== null) {
        box.append(gauge(r.name + " RAM", value(st, "dsactor_offload_ram_bytes"), value(st, "dsactor_offload_ram_limit_bytes")));
        box.append(el("div", {}, r.name + " NVMe: " + bytes(value(st, "dsactor_offload_nvme_bytes") || 0)));
      }
    }
    return box;
  }

  function links(roles) {  // the dashboard's rates, over its last polls (metrics/link_rates.h)
    const table = el("table", { class: "figures" }, el("tr", {}, el("th", {}, "process"), el("th", {}, "link"), el("th", {}, "rate")));
    for (const r of roles) for (const l of r.links || [])
      table.append(el("tr", { "data-link": r.name + "|" + l.link }, el("td", {}, r.name), el("td", {}, l.link),
        el("td", { class: "num" }, l.bytes_per_second === null ? "–" : bytes(l.bytes_per_second) + "/s")));
    return el("div", { class: "panel" }, el("h4", {}, "Link rates"), table);
  }

  function roleSection(r) {
    const st = r.state || {};
    const sec = el("section", { class: "role", "data-role": r.name, "data-kind": r.kind, "data-up": r.up });
    sec.append(el("h3", {}, r.name + " ", el("small", {}, r.kind)),
      el("p", { class: "status" }, (r.up ? "up" : "down: " + r.error) + " · " + r.url));
    const actors = new Map();
    for (const a of (st.process && st.process.actors) || []) actors.set(a, []);
    for (const [name, fam] of Object.entries(st.metrics || {}))
      for (const s of fam.series) if (s.labels.actor) {
        if (!actors.has(s.labels.actor)) actors.set(s.labels.actor, []);
        actors.get(s.labels.actor).push([name.replace(/^dsactor_actor_/, ""), s.value ?? s.sum]);
      }
    const lastError = new Map(((st.texts || {}).dsactor_actor_last_error || [])
      .filter((t) => t.text).map((t) => [t.labels.actor, t.text]));
    const ul = el("ul", { class: "actors" });
    for (const [a, figs] of actors)
      ul.append(el("li", { class: "actor", "data-actor": a }, a,
        ...figs.map(([n, v]) => el("span", { class: "fig" }, n + " " + fmt(v))),
        ...(lastError.has(a) ? [el("span", { class: "fig last-error" }, "last error: " + lastError.get(a))] : [])));
    sec.append(ul);
    const table = el("table", { class: "figures" });
    for (const [name, fam] of Object.entries(st.metrics || {}))
      for (const s of fam.series)
        table.append(el("tr", {}, el("td", {}, name),
          el("td", {}, Object.entries(s.labels).map(([k, v]) => k + "=" + v).join(", ")),
          el("td", { class: "num" }, s.value !== undefined ? fmt(s.value) : "sum " + fmt(s.sum) + ", count " + fmt(s.count))));
    sec.append(el("details", {}, el("summary", {}, "all figures"), table));
    return sec;
  }

  function draw(d) {
    const trainers = d.roles.filter((r) => r.kind === "trainer");
    const charts = el("div", { class: "panel-row" });
    for (const [id, title, key] of [["loss-chart", "loss", "loss"], ["lr-chart", "learning rate", "lr"],
      ["tokens-chart", "tokens/s", "tokens_per_second"]]) {
      const pts = trainers.length ? trainers[0].history.map((h) => [h.step, h[key]]) : [];
      charts.append(chart(id, title + (trainers.length ? " (" + trainers[0].name + ")" : ""), pts));
    }
    document.getElementById("charts").replaceChildren(charts);
    document.getElementById("timeline").replaceChildren(timeline(trainers));
    document.getElementById("tiers").replaceChildren(el("div", { class: "panel-row" }, tiers(d.roles), links(d.roles)));
    document.getElementById("links").replaceChildren();
    document.getElementById("topology").replaceChildren(...d.roles.map(roleSection));
    document.getElementById("updated").textContent = d.roles.length + " role(s), updated " + new Date(d.updated_unix_ms).toLocaleTimeString();
  }

  async function poll() {
    try {
      const res = await fetch("/api/deployment" + query, { cache: "no-store" });
      if (res.ok) draw(await res.json());
      else document.getElementById("updated").textContent = "dashboard answered HTTP " + res.status;
    } catch (e) {
      document.getElementById("updated").textContent = "dashboard unreachable: " + e;
    }
    setTimeout(poll, 500);
  }
  poll();
})();
