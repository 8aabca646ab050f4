// shoal dashboard: polls the service's JSON API and draws the cluster, the jobs, one job's
// detail and the recent events. No dependencies; every value is inserted as text.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(250, Number(params.get("interval")) || 2000);
  const EVENTS_KEPT = 60;
  const TERMINAL = new Set(["finished", "failed"]);

  const state = {
    jobs: [],
    cluster: null,
    events: [],
    lastEventId: 0,
    selected: decodeURIComponent((location.hash.match(/^#job=(.+)$/) || [])[1] || "") || null,
    order: new Map(), // job name -> index of first sight, for stable colours
    polls: 0,
  };

  // ----- small helpers -----
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") Object.assign(node.style, value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  async function getJSON(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  function colour(name) {
    if (!state.order.has(name)) state.order.set(name, state.order.size);
    const hue = (state.order.get(name) * 137.508 + 210) % 360; // golden angle: far-apart hues
    return `hsl(${hue.toFixed(0)}, 62%, 48%)`;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
    const s = Math.max(0, seconds);
    if (s < 120) return `${s.toFixed(0)}s`;
    if (s < 7200) return `${(s / 60).toFixed(1)}m`;
    return `${(s / 3600).toFixed(1)}h`;
  }

  function clock(t) {
    if (t === null || t === undefined) return "—";
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }

  function number(value, digits = 0) {
    return value === null || value === undefined || !isFinite(value) ? "—"
      : Number(value).toFixed(digits);
  }

  function nodesOf(alloc) {
    return [...new Set(alloc.nodes || [])].sort((a, b) => a - b);
  }

  function allocationText(alloc) {
    if (!alloc || !alloc.replicas) return "—";
    const nodes = nodesOf(alloc);
    return `${alloc.replicas} × ${alloc.device_type} on node${nodes.length > 1 ? "s" : ""} ` +
      nodes.join(", ");
  }

  function stateBadge(value) {
    return el("span", { class: `state state-${value}` }, value);
  }

  function jobChip(name) {
    return el("span", { class: "chip" },
      el("span", { class: "swatch", style: { background: colour(name) } }), name);
  }

  function progressBar(fraction) {
    const pct = Math.max(0, Math.min(1, Number(fraction) || 0)) * 100;
    return el("span", { class: "bar", title: `${pct.toFixed(1)}%` },
      el("span", { style: { width: `${pct}%` } }), el("b", {}, `${pct.toFixed(0)}%`));
  }

  function select(name) {
    state.selected = name;
    history.replaceState(null, "", name ? `#job=${encodeURIComponent(name)}` : "#");
    render();
    if (name) refreshDetail();
  }

  // ----- cluster -----
  function renderCluster() {
    const cluster = state.cluster;
    if (!cluster) return;
    document.getElementById("cluster-info").textContent =
      `${cluster.pool} · policy ${cluster.policy} · a round every ${cluster.interval_s}s · ` +
      `${cluster.rounds} round(s) so far`;
    const holders = new Set();
    const cards = cluster.nodes.map((node) => {
      const held = node.jobs || []; // one entry per replica on this node
      const cells = [];
      for (let i = 0; i < node.capacity; i++) {
        const job = held[i];
        if (job) holders.add(job);
        cells.push(el("div", {
          class: `device${job ? " held" : ""}${job && job === state.selected ? " selected" : ""}`,
          title: job ? `node ${node.node_id}, device ${i}: ${job}`
            : `node ${node.node_id}, device ${i}: free`,
          style: job ? { background: colour(job) } : null,
          dataset: job ? { job, device: i } : { device: i },
        }, String(i)));
      }
      return el("div", { class: "node", dataset: { node: node.node_id } },
        el("div", { class: "node-head" },
          el("strong", {}, `node ${node.node_id}`),
          el("span", { class: "type" }, node.device_type),
          el("span", { class: "muted" }, `${held.length}/${node.capacity} in use`)),
        el("div", { class: "devices" }, cells));
    });
    const legend = el("div", { class: "legend" },
      holders.size ? [...holders].map((name) => jobChip(name))
        : el("span", { class: "muted" }, "all devices free"));
    document.getElementById("nodes").replaceChildren(...cards, legend);
  }

  // ----- services: what a serve or stream job measures instead of training progress -----
  function isService(job) {
    return job.kind === "serve" || job.kind === "stream";
  }

  function serviceLine(job) {
    const svc = job.service || {};
    if (job.kind === "stream") {
      const lag = svc.lag_s === null || svc.lag_s === undefined ? "—" : `${svc.lag_s.toFixed(1)} s`;
      return `${number(svc.input_rate, 1)} samples/s · lag ${lag}`;
    }
    const slo = svc.slo_attainment === null || svc.slo_attainment === undefined ? "—"
      : `${(svc.slo_attainment * 100).toFixed(1)}%`;
    return `${number(svc.arrival_rate, 1)} req/s · SLO ${slo}`;
  }

  function serviceFacts(job) {
    const svc = job.service || {};
    const seconds = (v) => (v === null || v === undefined ? null : `${v.toFixed(2)} s`);
    const common = [["URL", svc.url || "—"], ["replicas ready", svc.replicas ?? 0]];
    if (job.kind === "stream") {
      return common.concat([
        ["input rate", `${number(svc.input_rate, 1)} samples/s`],
        ["processed", svc.processed ?? 0],
        ["backlog", svc.backlog === null || svc.backlog === undefined ? null
          : `${number(svc.backlog)} samples`],
        ["lag", seconds(svc.lag_s)],
        ["largest lag", seconds(svc.max_lag_s)],
        ["lag bound", seconds(svc.lag_bound_s)],
        ["device speed", svc.device_speed === null || svc.device_speed === undefined ? null
          : `${number(svc.device_speed, 1)} samples/s on ${svc.device_type}`],
      ]);
    }
    return common.concat([
      ["arrival rate", `${number(svc.arrival_rate, 1)} req/s`],
      ["requests answered", svc.requests ?? 0],
      ["SLO", seconds(svc.slo_s)],
      ["SLO attainment", svc.slo_attainment === null || svc.slo_attainment === undefined ? null
        : `${(svc.slo_attainment * 100).toFixed(2)}%`],
      ["p99 latency", seconds(svc.p99_latency_s)],
    ]);
  }

  // ----- jobs -----
  function renderJobs() {
    const tbody = document.querySelector("#jobs tbody");
    document.getElementById("no-jobs").hidden = state.jobs.length > 0;
    const rows = state.jobs.map((job) => {
      const done = TERMINAL.has(job.state);
      const goodput = number(job.goodput);
      const throughput = number(job.samples_per_second);
      return el("tr", {
        dataset: { job: job.name, state: job.state },
        class: job.name === state.selected ? "selected" : null,
      },
      el("td", { class: "name" }, jobChip(job.name)),
      el("td", {}, job.tenant || "—"),
      el("td", { class: "state-cell" }, stateBadge(job.state)),
      el("td", { class: "allocation" }, allocationText(job.allocation)),
      el("td", { class: "num" }, isService(job) ? "—" : job.batch_size ?? "—"),
      el("td", {}, isService(job) ? el("span", { class: "service-line" }, serviceLine(job))
        : progressBar(job.progress)),
      el("td", { class: "num" }, isService(job) ? "—" : `${goodput} / ${throughput}`),
      el("td", { class: "num" }, done || isService(job) ? "—" : duration(job.eta_seconds)),
      el("td", { class: "num" }, job.num_restarts ?? 0));
    });
    tbody.replaceChildren(...rows);
  }

  // ----- one job -----
  let detailEvents = { name: null, events: [] };

  async function refreshDetail() {
    const name = state.selected;
    if (!name) return;
    try {
      const events = await getJSON(`/api/events?job=${encodeURIComponent(name)}&last=300`);
      if (state.selected === name) {
        detailEvents = { name, events };
        renderDetail();
      }
    } catch (err) {
      console.warn(err);
    }
  }

  // One line per parallel plan, as shoal.perf.planned.describe_plan writes it.
  function planText(plan) {
    const layout = [`dp ${plan.dp}`];
    if (plan.tp > 1) layout.push(`tp ${plan.tp}`);
    if (plan.pp > 1) {
      layout.push(`pp ${plan.pp}` + (plan.virtual_stages > 1 ? ` (${plan.virtual_stages} virtual)` : ""));
    }
    const parts = [layout.join(" x "), plan.zero_stage ? `ZeRO-${plan.zero_stage}` : "no sharding"];
    if (plan.offload) parts.push("offload");
    parts.push(`micro-batch ${plan.micro_batch} x ${plan.accumulation}`);
    if (plan.recompute === "none") parts.push("no recompute");
    else {
      parts.push(`${plan.recompute} recompute` + (plan.recompute_fraction < 1
        ? ` on ${Math.round(plan.recompute_fraction * 100)}% of layers` : ""));
    }
    if (plan.memory_gib !== undefined && plan.memory_gib !== null) {
      parts.push((plan.memory_gib >= 1 ? `${plan.memory_gib.toFixed(1)} GiB`
        : `${(plan.memory_gib * 1024).toFixed(1)} MiB`) + " per device");
    }
    if (plan.step_time_s !== undefined && plan.step_time_s !== null) {
      const t = plan.step_time_s;
      const shown = t >= 1 ? `${t.toFixed(1)} s` : t >= 1e-3 ? `${(t * 1e3).toFixed(1)} ms`
        : `${(t * 1e6).toFixed(1)} µs`;
      parts.push(`${shown} per step (predicted)`);
    }
    return parts.join(" · ");
  }

  function kv(pairs) {
    return el("dl", { class: "kv" },
      pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
        .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function renderDetail() {
    const panel = document.getElementById("detail-panel");
    const job = state.jobs.find((j) => j.name === state.selected);
    if (!job) {
      panel.hidden = true;
      return;
    }
    panel.hidden = false;
    document.getElementById("detail-name").replaceChildren(jobChip(job.name), " ",
      stateBadge(job.state));
    const events = detailEvents.name === job.name ? detailEvents.events : [];
    const decisions = events.filter((e) => e.kind === "decision");
    const latest = job.decision ? job.decision.reason
      : (decisions.length ? decisions[decisions.length - 1].detail : null);
    const elapsed = job.jct ?? (Date.now() / 1000 - job.submit_time);
    const parts = [];
    if (job.failure) parts.push(el("div", { class: "failure" }, job.failure));
    parts.push(el("h3", {}, "Why it holds what it holds"),
      el("div", { class: "why", id: "detail-why" },
        latest || "no scheduling decision recorded for this job yet"));
    if (isService(job)) {
      parts.push(el("h3", {}, job.kind === "stream" ? "Stream" : "Serving"),
        el("div", { id: "detail-service" }, kv(serviceFacts(job))));
    }
    parts.push(el("h3", {}, "Now"), kv([
      ["allocation", allocationText(job.allocation)],
      ["application", job.application],
      ["tenant", job.tenant],
      ["submitted", clock(job.submit_time)],
      ["started", clock(job.start_time)],
      ["finished", job.finish_time ? clock(job.finish_time) : null],
      [job.jct !== null && job.jct !== undefined ? "completion time" : "elapsed",
        duration(elapsed)],
      ["queued", job.queued_seconds === null || job.queued_seconds === undefined ? null
        : el("span", { id: "detail-queued" },
          `${number(job.queued_seconds, 1)} s without devices`)],
      ["progress", `${((job.progress || 0) * 100).toFixed(1)}%` +
        (job.epoch !== undefined ? ` · epoch ${job.epoch}` : "") +
        (job.steps !== undefined ? ` · ${job.steps} steps` : "")],
      ["batch size", job.batch_size ?? "—"],
      ["parallel plan", job.plan ? el("span", { id: "detail-plan" }, planText(job.plan)) : null],
      ["goodput", job.goodput ? `${number(job.goodput)} samples/s` : "—"],
      ["throughput", job.samples_per_second ? `${number(job.samples_per_second)} samples/s`
        : "—"],
      ["noise scale", job.noise_scale ? number(job.noise_scale, 1) : null],
      ["ETA", TERMINAL.has(job.state) ? null : duration(job.eta_seconds)],
      ["restarts", job.num_restarts ?? 0],
      ["restart cost", job.restart_seconds === null || job.restart_seconds === undefined ? null
        : el("span", { id: "detail-restart" }, `${number(job.restart_seconds, 1)} s per restart`)],
      ["device time", `${number(job.device_seconds, 0)} device-s`],
      ["attempt", job.attempt ?? null],
      ["replica pids", (job.replica_pids || []).join(", ") || null],
      ["log", el("a", { href: `/api/jobs/${encodeURIComponent(job.name)}/logs?rank=0`,
        target: "_blank" }, "rank 0")],
    ]));
    parts.push(el("h3", {}, "Allocation history"), historyTable(job, decisions));
    const runs = job.run_details || [];
    if (runs.length) {
      parts.push(el("h3", {}, "Runs (replicas actually started)"), el("table", { class: "small" },
        el("thead", {}, el("tr", {}, el("th", {}, "time"), el("th", {}, "kind"),
          el("th", { class: "num" }, "replicas"), el("th", { class: "num" }, "first step after"))),
        el("tbody", {}, runs.map((r) => el("tr", {},
          el("td", {}, clock(r.time)), el("td", {}, r.kind), el("td", { class: "num" }, r.replicas),
          el("td", { class: "num" }, r.first_step ? duration(r.first_step - r.requested) : "—"))))));
    }
    parts.push(el("h3", {}, "Events"), el("ol", { class: "events" },
      events.slice().reverse().map(eventItem)));
    const detail = document.getElementById("detail");
    detail.dataset.job = job.name;
    detail.replaceChildren(...parts);
  }

  function historyTable(job, decisions) {
    const history = job.history || [];
    if (!history.length) return el("p", { class: "muted", id: "history-empty" }, "never placed");
    const rows = history.map((h, i) => {
      const next = i + 1 < history.length ? history[i + 1].time : Infinity;
      const why = decisions.find((d) => d.time >= h.time && d.time < next);
      return el("tr", { dataset: { replicas: h.replicas } },
        el("td", {}, clock(h.time)),
        el("td", { class: "num" }, `+${duration(h.time - job.submit_time)}`),
        el("td", {}, h.replicas ? `${h.replicas} × ${h.device_type}` : "none (preempted)"),
        el("td", { class: "muted" }, why ? why.detail : ""));
    });
    return el("table", { class: "small", id: "history" },
      el("thead", {}, el("tr", {}, ["time", "since submit", "devices", "why"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.reverse()));
  }

  // ----- events -----
  function eventItem(e) {
    return el("li", { dataset: { id: e.id, kind: e.kind, job: e.job } },
      el("span", { class: "time" }, clock(e.time)),
      jobChip(e.job),
      el("span", { class: "kind" }, e.kind),
      el("span", { class: "detail" }, e.detail || ""));
  }

  function renderEvents() {
    document.getElementById("events").replaceChildren(
      ...state.events.slice().reverse().map(eventItem));
  }

  // ----- the loop -----
  function render() {
    const active = state.jobs.filter((j) => !TERMINAL.has(j.state));
    const training = active.filter((j) => j.state !== "pending"); // a resize keeps training
    const goodput = training.reduce((sum, j) => sum + (j.goodput || 0), 0);
    document.getElementById("summary").textContent =
      `${active.length} active / ${state.jobs.length} job(s) · total goodput ` +
      `${goodput.toFixed(0)} samples/s`;
    renderCluster();
    renderJobs();
    renderDetail();
    renderEvents();
  }

  async function poll() {
    const status = document.getElementById("status");
    try {
      const eventsPath = state.lastEventId ? `/api/events?after=${state.lastEventId}`
        : `/api/events?last=${EVENTS_KEPT}`;
      const [cluster, jobs, events] = await Promise.all(
        [getJSON("/api/cluster"), getJSON("/api/jobs"), getJSON(eventsPath)]);
      state.cluster = cluster;
      state.jobs = jobs;
      jobs.forEach((j) => colour(j.name));
      if (events.length) {
        state.events = state.events.concat(events).slice(-EVENTS_KEPT);
        state.lastEventId = events[events.length - 1].id;
      }
      state.polls += 1;
      if (state.selected) await refreshDetail();
      render();
      status.dataset.ok = "true";
      status.dataset.polls = String(state.polls);
      status.textContent = `live · updated ${clock(Date.now() / 1000)}`;
    } catch (err) {
      status.dataset.ok = "false";
      status.textContent = `service unreachable (${err.message}); retrying`;
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  document.querySelector("#jobs tbody").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-job]");
    if (row) select(row.dataset.job);
  });
  document.getElementById("nodes").addEventListener("click", (event) => {
    const cell = event.target.closest(".device[data-job]");
    if (cell) select(cell.dataset.job);
  });
  document.getElementById("detail-close").addEventListener("click", () => select(null));
  poll();
})();
