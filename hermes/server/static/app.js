// The Hermes dashboard: plain JavaScript over the REST API, with vendored uPlot and ECharts.
// Each view polls with the cursors the API hands back, so it fetches only what is new, and
// updates its tables and charts in place, so sorting, paging, zoom and selection survive updates.
"use strict";

const POLL_MS = 2000;
const PAGE_ROWS = 50;
const state = { token: localStorage.getItem("hermesToken"), view: null, answeredAt: null };
// What a token is made of (hermes_ and URL-safe base64): anything else, such as a pasted "…", the browser cannot
// even send in a header, and the server would refuse it anyway.
const TOKEN = /^[A-Za-z0-9_-]+$/;
const NOT_A_TOKEN = "That is no token: a token holds only ASCII letters, digits, _ and -.";

// ------------------------------------------------------------------ plumbing
// A refusal of the API: its status, and its message in words (``detail``: a string, or a 422's list of problems).
class ApiError extends Error {
  constructor(status, body) {
    let detail = body;
    try { detail = JSON.parse(body).detail ?? body; } catch { /* not JSON: the text as it came */ }
    if (Array.isArray(detail)) detail = detail.map((problem) => problem.msg ?? JSON.stringify(problem)).join("; ");
    super(`${status} ${detail}`);
    this.status = status;
    this.detail = String(detail);
  }
}

// No answer from the server (it is down or restarting, or the proxy in front of it says so): the notice under the
// header says since when the page shows nothing new, and the polls go on until it answers.
class Unreachable extends Error {}

// The token was refused (revoked, or the server forgot it): the sign-in form says so, and a poll just stops.
class Refused extends Error {}

async function api(path, options = {}) {
  let response;
  try {
    response = await fetch("api" + path, {
      ...options,
      headers: { "Authorization": "Bearer " + state.token, "Content-Type": "application/json" },
    });
  } catch (error) {
    throw unreachable(error.message);
  }
  if ([502, 503, 504].includes(response.status)) throw unreachable(`${response.status} ${response.statusText}`);
  answered();
  if (response.status === 401) { showLogin("Your token was refused."); throw new Refused("unauthorised"); }
  if (!response.ok) throw new ApiError(response.status, await response.text());
  return response.json();
}

// Show the notice (the time of the last answer, if any) and make the error a poll gives up on till the next.
function unreachable(reason) {
  const notice = document.getElementById("connection");
  notice.textContent = state.answeredAt === null ? "server unreachable, retrying" :
    `connection lost — last updated ${state.answeredAt.toTimeString().slice(0, 8)}, retrying`;
  notice.hidden = false;
  return new Unreachable(reason);
}

// The server answered: what the page shows is current again.
function answered() {
  state.answeredAt = new Date();
  document.getElementById("connection").hidden = true;
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

const fmt = (v, digits = 4) => v === null || v === undefined ? "-" :
  typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(digits)) : String(v);
// An axis label with the digits that tell apart ticks between ``low`` and ``high``: three past the first digit they
// differ in, so 0.99966 to 0.99993 reads 0.99965, 0.9997, ... (not 1, 1, 1), and 0.2 to 0.9 reads 0.2, 0.3, ...
const tickLabel = (low, high) => {
  const magnitude = Math.max(Math.abs(low), Math.abs(high)), span = Math.abs(high - low);
  const digits = span > 0 ? Math.min(15, Math.max(3, Math.ceil(Math.log10(magnitude / span)) + 3)) : 3;
  return (v) => +Number(v).toPrecision(digits);
};
// A time on the pool's clock, in seconds as the timeline's axis and the scheduler's reasons give it.
const clock = (v) => v === null || v === undefined ? "-" : v.toFixed(1) + "s";
// Step labels for an axis of uPlot, short however large the steps (1.5M, not 1500000), with the significant digits
// that tell its ticks apart.
const stepLabels = (u, splits) => {
  const increment = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
  const magnitude = Math.max(...splits.map(Math.abs));
  const digits = Math.min(21, Math.max(1, Math.ceil(Math.log10(magnitude / increment)) + 2));
  const format = new Intl.NumberFormat("en", { notation: "compact", maximumSignificantDigits: digits });
  return splits.map((v) => format.format(v));
};
const seconds = (v) => v === null || v === undefined ? "-" : v < 60 ? v.toFixed(1) + "s" :
  v < 3600 ? (v / 60).toFixed(1) + "m" : (v / 3600).toFixed(2) + "h";
const scrolling = (table) => el("div", { class: "scroll" }, table);  // a wide table scrolls in its box, not the page
const trialColour = (index) => `hsl(${(index * 137.508) % 360}, 65%, 45%)`;
const firstLine = (text, length = 80) => {
  const line = String(text).trim().split("\n")[0];
  return line.length > length ? line.slice(0, length - 1) + "…" : line;
};
// Seconds from a trial's submission to its first report: both are on the experiment's clock, which in a pool
// is the pool's (it counts from the pool's start, so first_report_at alone says nothing of the trial).
const toFirstReport = (t) => t.first_report_at === null || t.first_report_at === undefined ||
  t.submitted_at === null || t.submitted_at === undefined ? null : t.first_report_at - t.submitted_at;

function every(ms, tick) {
  let timer = null, stopped = false;
  const run = async () => {
    try {
      await tick();
    } catch (error) {
      // the notice under the header says the one, the sign-in form the other
      if (!(error instanceof Unreachable || error instanceof Refused)) console.error(error);
    }
    if (!stopped) timer = setTimeout(run, ms);
  };
  run();
  return () => { stopped = true; clearTimeout(timer); };
}

function showLogin(message = "") {
  state.view?.stop();  // its polls would go on, with the next token, beside the view built after signing in
  state.view = null;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  document.getElementById("view").replaceChildren();
  document.getElementById("who").textContent = "";  // nobody is signed in: no name, nothing to sign out of
  document.getElementById("logout").hidden = true;
}

// Why ``token`` cannot sign in, or null once the server accepted it: asked before the token is kept, so that a
// mistyped or mangled one is said at the form, not stored to fail every request after.
async function refusal(token) {
  if (!TOKEN.test(token)) return NOT_A_TOKEN;
  let response;
  try {
    response = await fetch("api/me", { headers: { "Authorization": "Bearer " + token } });
  } catch {
    return "The server did not answer: try again.";
  }
  return response.ok ? null : response.status === 401 ? "Your token was refused." :
    `The server answered ${response.status} ${response.statusText}: try again.`;
}

function forgetToken() {
  localStorage.removeItem("hermesToken");
  state.token = null;
}

// ------------------------------------------------------------------ the experiment list
function listView(root) {
  const body = el("tbody");
  const table = el("table", { id: "experiments" },
    el("thead", {}, el("tr", {}, ...["id", "name", "owner", "status", "trials", "best", "metric", "weight", "submitted"]
      .map((h) => el("th", {}, h)))), body);
  root.append(el("h2", {}, "Experiments"), scrolling(table), el("p", { class: "muted" },
    "Submit with: hermes submit spec.yaml --server " + location.origin + location.pathname.replace(/\/$/, "")));
  const rows = new Map();
  return every(POLL_MS, async () => {
    for (const e of await api("/experiments")) {
      let row = rows.get(e.id);
      if (!row) {
        row = el("tr", { "data-id": e.id, onclick: () => { location.hash = `#/experiments/${e.id}`; } });
        rows.set(e.id, row);
        body.append(row);
      }
      const status = el("td", {}, statusBadge(e.status),
        e.error ? el("span", { class: "error reason", title: e.error }, firstLine(e.error)) : "",
        e.damaged ? damagedMark(e.damaged) : "");
      row.replaceChildren(...[e.id, e.name, e.owner ?? "-", status, fmt(e.trials), fmt(e.best),
        `${e.metric} (${e.mode})`, e.weight, new Date(e.created_at * 1000).toLocaleString()]
        .map((v) => v instanceof HTMLTableCellElement ? v : el("td", {}, v)));
    }
  });
}

function statusBadge(status) { return el("span", { class: "status " + status }, status); }

// An experiment with a damaged record in the store: the API sends it without its trials and best, and ``damaged``
// names the record and what its administrator can do. Marked in the list (whole on hover), whole in its header.
function damagedMark(damaged) {
  return el("span", { class: "damaged", title: damaged }, el("span", { class: "status" }, "damaged record"),
    el("span", { class: "error reason" }, firstLine(damaged)));
}

// ------------------------------------------------------------------ one experiment
function experimentView(root, id, selectedTrial) {
  const s = {
    trials: new Map(), order: [], position: new Map(), curves: new Map(), runs: [], gpus: [], now: 0,
    trialVersion: 0, runVersion: 0, curveCursor: 0, sort: { key: "best", desc: true }, page: 0,
    experiment: null, selected: selectedTrial, steps: new Set(), xs: [],
  };
  const header = el("div");
  const board = el("table", { id: "leaderboard" });
  const pager = el("div", { class: "pager" });
  const curvesBox = el("div", { id: "curves", class: "chart" });
  const parallelBox = el("div", { id: "parallel", class: "chart" });
  const timelineBox = el("div", { id: "timeline", class: "chart" });
  const firstBox = el("div", { id: "first-report", class: "chart" });
  const trialBox = el("div", { id: "trial" });
  const controlError = el("span", { class: "error", id: "control-error" });  // kept while the header is redrawn
  const grid = el("div", { class: "grid" },
      el("div", { class: "panel wide" }, el("h3", {}, "Leaderboard"), pager, scrolling(board)),
      el("div", { class: "panel" }, el("h3", {}, "Learning curves"), curvesBox),
      el("div", { class: "panel" }, el("h3", {}, "Hyper-parameters against the metric"), parallelBox),
      el("div", { class: "panel wide" }, el("h3", {}, "GPU timeline"), el("p", { class: "muted" },
        "A bar per run, coloured by trial; ▲ resume, ◆ migration, | suspension, ✕ stop or failure. " +
        "Hover for the reason of each decision; scroll or drag below to zoom."), timelineBox),
      el("div", { class: "panel" }, el("h3", {}, "Time to first report"), firstBox),
      el("div", { class: "panel" }, trialBox));
  root.append(header, grid);
  const timeline = timelineChart(timelineBox);
  const charts = { timeline: timeline.chart, parallel: echarts.init(parallelBox),
                   first: echarts.init(firstBox), curves: null, curveCount: -1 };
  const resize = () => {
    charts.timeline.resize(); charts.parallel.resize(); charts.first.resize();
    charts.curves?.setSize({ width: curvesBox.clientWidth || 500, height: 300 });
  };
  window.addEventListener("resize", resize);
  window.hermesDashboard = { state: s, charts };
  let alive = true;  // a poll under way when the view is stopped draws nothing after

  const stopPolling = every(POLL_MS, async () => {
    try {
      await poll();
    } catch (error) {
      if (error.status !== 404) throw error;
      // no such experiment, or another user's: say so once, instead of asking again every 2 s
      stopPolling(); stopTrial();
      grid.hidden = true;
      header.replaceChildren(el("h2", {}, "Experiment " + id),
        el("p", { class: "error", id: "not-found" }, error.detail));
    }
  });

  async function poll() {
    s.experiment = await api(`/experiments/${id}`);
    if (s.experiment.damaged) {  // its trials, curves and timeline would each answer a 500 naming the record
      if (alive) { grid.hidden = true; renderHeader(); }
      return;
    }
    if (grid.hidden) { grid.hidden = false; resize(); }  // mended: shown from now on
    let trialsChanged = 0, runsChanged = 0, more = true;
    while (more) {
      const trials = await api(`/experiments/${id}/trials?since=${s.trialVersion}`);
      const arrived = trials.trials.some((t) => !s.trials.has(t.trial));
      for (const t of trials.trials) s.trials.set(t.trial, t);
      if (arrived) inSubmissionOrder();
      trialsChanged += trials.trials.length;
      s.trialVersion = trials.version;
      s.now = Math.max(s.now, trials.now);
      more = trials.more;
    }
    more = true;
    while (more) {
      const c = await api(`/experiments/${id}/curves?after=${s.curveCursor}`);
      for (let i = 0; i < c.trial.length; i++) {
        if (!s.curves.has(c.trial[i])) s.curves.set(c.trial[i], new Map());
        if (c.value[i] !== null) { s.curves.get(c.trial[i]).set(c.step[i], c.value[i]); s.steps.add(c.step[i]); }
      }
      s.curveCursor = c.cursor;
      more = c.more;
    }
    more = true;
    while (more) {
      const timeline = await api(`/experiments/${id}/timeline?since=${s.runVersion}`);
      for (const run of timeline.runs) s.runs[run.index] = run;
      runsChanged += timeline.runs.length;
      s.gpus = timeline.gpus;
      s.runVersion = timeline.version;
      s.now = Math.max(s.now, timeline.now);
      more = timeline.more;
    }
    if (!alive) return;
    renderHeader();
    renderBoard();
    if (trialsChanged || !charts.curves) { renderCurves(); renderParallel(); renderFirstReports(); }
    const running = s.runs.some((r) => r && r.ended_at === null);  // its bar grows with the clock
    if (runsChanged || !charts.timelineDrawn || (running && s.now !== charts.timelineNow)) renderTimeline();
    window.hermesDashboard.updates = (window.hermesDashboard.updates || 0) + 1;
  }
  const stopTrial = trialPanel(trialBox, id, () => s.selected, s);

  // Trials in the order they were submitted (ties by id): the x axis of the first reports, and each trial's colour,
  // the same at every visit (the API sends trials in the order they last changed).
  function inSubmissionOrder() {
    const submitted = (t) => s.trials.get(t).submitted_at ?? Infinity;
    s.order = [...s.trials.keys()].sort((a, b) =>
      submitted(a) - submitted(b) || a.localeCompare(b, undefined, { numeric: true }));
    s.order.forEach((t, i) => s.position.set(t, i));
  }

  // The header's title and controls are drawn again only when what they offer changes (the experiment ended, say);
  // its figures change in place, and the weight field is one element for the view's life: a weight being typed
  // keeps its value and its focus across polls, and takes the experiment's weight only while it was not edited.
  const title = el("div"), summary = el("span"), controls = el("div", { class: "controls" });
  const weight = el("input", { type: "number", min: "0.01", step: "0.5", size: 4, id: "weight" });
  const weightLabel = el("label", {}, "weight ", weight);
  let weightShown = null;  // the experiment's weight as the field last took it
  const weightText = el("span", { id: "weight" });
  // a refusal shows the API's reason beside the controls, and the field the weight the experiment keeps
  const refused = (error) => { controlError.textContent = error.message; weight.value = s.experiment.weight; };
  const setWeight = el("button", { onclick: async () => {
    controlError.textContent = "";
    await api(`/experiments/${id}/weight`, { method: "PUT", body: JSON.stringify({ weight: +weight.value }) })
      .catch(refused);
  } }, "Set weight");
  const cancel = el("button", { id: "cancel", onclick: async () => {
    if (confirm(`Cancel ${s.experiment.name}? Its trials are stopped.`)) {
      controlError.textContent = "";
      await api(`/experiments/${id}/cancel`, { method: "POST" }).catch(refused);
    }
  } }, "Cancel");
  const notPooled = el("span", { class: "reason", id: "not-pooled" },
    "run by `hermes run` in this store, not by the pool: stop that process to cancel it");

  function renderHeader() {
    const e = s.experiment;
    const counts = Object.entries(e.by_state).map(([k, v]) => `${v} ${k}`).join(", ");
    summary.textContent = `owner ${e.owner ?? "-"} · ${e.metric} (${e.mode}) · ` + (e.damaged ? "trials not shown" :
      `${e.trials} trials: ${counts || "none yet"}` +
      ` · best ${fmt(e.best)}${e.best_trial ? " (trial " + e.best_trial + ")" : ""}`);
    if (weightShown === null || (weight.value !== "" && +weight.value === weightShown)) weight.value = e.weight;
    weightShown = e.weight;
    weightText.textContent = `weight ${fmt(e.weight)}`;
    const titleKey = JSON.stringify([e.status, e.error, e.damaged]);
    if (title.dataset.key !== titleKey) {
      title.dataset.key = titleKey;
      title.replaceChildren(
        el("h2", {}, `${e.name} `, statusBadge(e.status)),
        e.error ? el("p", { class: "error reason", id: "experiment-error" }, e.error) : "",
        e.damaged ? el("p", { class: "error reason damaged", id: "experiment-damaged" },
          el("span", { class: "status" }, "damaged record"), " ", e.damaged) : "");
    }
    // an ended experiment keeps the weight it ran with, and one that `hermes run` runs in this store (no owner)
    // has no share of the pool: the API refuses a change of either (409)
    const ended = ["finished", "failed", "cancelled"].includes(e.status), pooled = e.owner != null;
    const weighed = pooled && !ended, cancellable = pooled && ["running", "queued"].includes(e.status);
    const unpooled = !pooled && e.status === "running";
    const controlsKey = JSON.stringify([weighed, cancellable, unpooled]);
    if (controls.dataset.key !== controlsKey) {
      controls.dataset.key = controlsKey;
      controls.replaceChildren(summary, ...(weighed ? [weightLabel, setWeight] : [weightText]),
        cancellable ? cancel : "", unpooled ? notPooled : "", controlError);
    }
    if (header.firstChild !== title) header.replaceChildren(title, controls);
  }

  // ---------------------------------------------------------------- leaderboard
  function columns() {
    const params = Object.keys(s.experiment?.spec?.search?.space ?? {});
    return [
      ["rank", "#", null], ["trial", "trial", (t) => t.trial], ["state", "state", (t) => t.state],
      ["best", "best", (t) => t.best], ["best_step", "at step", (t) => t.best_step], ["last", "last", (t) => t.last],
      ["step", "steps", (t) => t.step], ["first_report", "first report", toFirstReport],
      ["gpu", "GPU", (t) => t.gpu], ...params.map((p) => ["param:" + p, p, (t) => t.params[p]]),
    ];
  }

  function ranked() {
    const sign = s.experiment.mode === "min" ? -1 : 1;
    const byBest = [...s.trials.values()].sort((a, b) =>  // failed trials last: their best is no result
      (a.state === "failed") - (b.state === "failed") || (a.best === null) - (b.best === null) ||
      sign * ((b.best ?? 0) - (a.best ?? 0)));
    byBest.forEach((t, i) => { t.rank = i + 1; });
    const column = columns().find((c) => c[0] === s.sort.key);
    if (s.sort.key === "best" || !column?.[2]) return s.sort.desc ? byBest : byBest.slice().reverse();
    const get = column[2];
    return byBest.slice().sort((a, b) => {
      const x = get(a), y = get(b);
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y),
        undefined, { numeric: true });
      return s.sort.desc ? -order : order;
    });
  }

  function renderBoard() {
    const cols = columns();
    const all = ranked();
    const pages = Math.max(1, Math.ceil(all.length / PAGE_ROWS));
    s.page = Math.min(s.page, pages - 1);
    const head = el("tr", {}, ...cols.map(([key, label]) => el("th", {
      class: "sortable" + (s.sort.key === key || (key === "rank" && s.sort.key === "best") ? " sorted" : "") +
             (!s.sort.desc ? " asc" : ""),
      onclick: () => {
        const k = key === "rank" ? "best" : key;
        s.sort = { key: k, desc: s.sort.key === k ? !s.sort.desc : k === "best" };
        renderBoard();
      },
    }, label)));
    const rows = all.slice(s.page * PAGE_ROWS, (s.page + 1) * PAGE_ROWS).map((t) => el("tr", {
      "data-trial": t.trial, class: t.trial === s.selected ? "selected" : undefined,
      onclick: () => { location.hash = `#/experiments/${id}/trials/${encodeURIComponent(t.trial)}`; },
    }, ...cols.map(([key, , get]) => {
      const v = key === "rank" ? t.rank : key === "first_report" ? seconds(toFirstReport(t)) : get(t);
      return el("td", { class: typeof v === "number" ? "num" : undefined }, fmt(v));
    })));
    board.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    pager.replaceChildren(
      el("button", { onclick: () => { s.page = Math.max(0, s.page - 1); renderBoard(); } }, "‹ prev"),
      el("span", {}, `page ${s.page + 1} of ${pages} (${all.length} trials)`),
      el("button", { onclick: () => { s.page = Math.min(pages - 1, s.page + 1); renderBoard(); } }, "next ›"));
  }

  // ---------------------------------------------------------------- curves (uPlot: one series per trial)
  // The x values are the steps some trial reported, not every step up to the last: steps may count iterations, in
  // millions, and the chart's cost follows the reports. A trial's line joins its reports across the others' steps.
  function renderCurves() {
    const ids = s.order.filter((t) => s.curves.has(t));
    if (s.xs.length !== s.steps.size) s.xs = [...s.steps].sort((a, b) => a - b);
    const xs = s.xs, at = new Map(xs.map((x, i) => [x, i]));
    const data = [xs, ...ids.map((t) => {
      const column = new Array(xs.length).fill(null);
      for (const [step, value] of s.curves.get(t)) column[at.get(step)] = value;
      return column;
    })];
    // a series of one report draws no line: it shows as a point (its index in data is its series' in the plot)
    charts.curveSingles = data.map((column, i) => i > 0 && column.filter((v) => v !== null).length === 1);
    if (!charts.curves || charts.curveCount !== ids.length) {
      const scales = charts.curves && charts.curvesZoomed ?
        { x: { ...charts.curves.scales.x }, y: { ...charts.curves.scales.y } } : null;
      charts.curves?.destroy();
      const width = curvesBox.clientWidth || 500;
      charts.curves = new uPlot({
        width, height: 300, legend: { show: false }, cursor: { drag: { x: true, y: true } },
        scales: { x: { time: false } },
        axes: [{ label: "step", values: stepLabels }, { label: s.experiment.metric }],
        series: [{}, ...ids.map((t) => ({ label: "trial " + t, stroke: trialColour(s.position.get(t)),
                                         width: 1, spanGaps: true,
                                         points: { show: (u, i) => charts.curveSingles[i] === true, size: 7,
                                                   fill: trialColour(s.position.get(t)) } }))],
        hooks: { setSelect: [() => { charts.curvesZoomed = true; }] },
      }, data, curvesBox);
      charts.curveCount = ids.length;
      if (scales) { charts.curves.setScale("x", scales.x); charts.curves.setScale("y", scales.y); }
    } else {
      charts.curves.setData(data, !charts.curvesZoomed);
    }
  }

  // ---------------------------------------------------------------- parallel coordinates (ECharts)
  function renderParallel() {
    const space = s.experiment.spec.search.space;
    const names = Object.keys(space);
    // the values of a parameter drawn as categories: a choice's, a grid's, or a fixed text's (the API gives a fixed
    // parameter as its bare value); null for a number
    const categories = (p) => p.type === "choice" || p.type === "grid" ? p.values :
      typeof p === "string" || typeof p === "boolean" ? [p] : null;
    const axes = names.map((name, dim) => {
      const p = space[name];
      if (categories(p)) return { dim, name, type: "category", data: categories(p).map(String) };
      return { dim, name, type: p.type === "loguniform" ? "log" : "value", min: p.low, max: p.high,
               axisLabel: { formatter: tickLabel(p.low, p.high) } };
    });
    const rows = [...s.trials.values()].filter((t) => t.best !== null).map((t) =>
      [...names.map((n) => categories(space[n]) ? String(t.params[n]) : t.params[n]), t.best]);
    const values = rows.map((r) => r[names.length]);
    // the colours spread over the values the trials reached, however close (0.99966 to 0.99993 as much as 0 to 1)
    const [low, high] = values.length ? [Math.min(...values), Math.max(...values)] : [0, 1];
    axes.push({ dim: names.length, name: s.experiment.metric, type: "value", scale: true,
                axisLabel: { formatter: tickLabel(low, high) } });
    charts.parallel.setOption({
      parallelAxis: axes,
      parallel: { left: 40, right: 60, top: 40, bottom: 30 },
      visualMap: { show: false, dimension: names.length, min: low, max: high,
                   inRange: { color: s.experiment.mode === "max" ? ["#ccd", "#c22"] : ["#c22", "#ccd"] } },
      series: [{ type: "parallel", lineStyle: { width: 1, opacity: 0.5 }, data: rows, progressive: 1000 }],
    });
  }

  // ---------------------------------------------------------------- time to first report
  function renderFirstReports() {
    const points = s.order.map((t) => s.trials.get(t)).filter((t) => toFirstReport(t) !== null)
      .map((t) => [s.position.get(t.trial), toFirstReport(t), t.trial, t.first_report_at]);
    charts.first.setOption({
      grid: { left: 50, right: 20, top: 30, bottom: 40 },
      tooltip: { formatter: (p) => `trial ${p.data[2]}: first report ${seconds(p.data[1])} after its submission` +
                 ` (at ${seconds(p.data[3])} on the experiment's clock)` },
      xAxis: { name: "trial (submission order)", nameLocation: "middle", nameGap: 25, type: "value", minInterval: 1,
               min: (extent) => extent.min - 1, max: (extent) => extent.max + 1 },  // no point on the frame
      yAxis: { name: "seconds after submission", type: "value" },
      series: [{ type: "scatter", symbolSize: 5, data: points,
                 itemStyle: { color: (p) => trialColour(p.data[0]) } }],
    });
  }

  // ---------------------------------------------------------------- the GPU timeline
  function renderTimeline() {
    timeline.draw(s.gpus, s.now, s.runs.filter(Boolean), (r) => trialColour(s.position.get(r.trial)), describeRun);
    charts.timelineDrawn = true;
    charts.timelineNow = s.now;
  }

  return () => {
    if (!alive) return;
    alive = false;
    stopPolling(); stopTrial();
    window.removeEventListener("resize", resize);
    charts.timeline.dispose(); charts.parallel.dispose(); charts.first.dispose(); charts.curves?.destroy();
  };
}

// ------------------------------------------------------------------ a GPU timeline (ECharts custom series)
const TIMELINE_ROW_PX = 20;  // a GPU's row: its label legible and its bars apart, however many GPUs there are

// The GPU timeline in ``box``, shared by an experiment's view and the pool's: ``draw`` shows runs on GPUs at ``now``.
// The box grows with the GPUs, a row each; a zoom stays on the seconds the user chose while the axis grows with
// the clock (a window kept in percent of the axis, ECharts' own, would slide along it).
function timelineChart(box) {
  const chart = echarts.init(box);
  let axis = [0, 1], zoom = null;  // the seconds of the axis drawn; those the user zoomed to (null: all of them)
  chart.on("datazoom", (event) => {
    const range = event.batch?.[0] ?? event;  // in percent: the wheel or a drag sends a batch, the slider itself
    const at = (percent) => axis[0] + (axis[1] - axis[0]) * percent / 100;
    zoom = range.start > 0 || range.end < 100 ? [at(range.start), at(range.end)] : null;
  });
  const draw = (gpus, now, runs, colour, describe) => {
    const option = timelineOption(gpus, now, runs, colour, describe, zoom);
    const height = `${Math.max(320, gpus.length * TIMELINE_ROW_PX + 70)}px`;  // 70: the grid's margins
    if (box.style.height !== height) { box.style.height = height; chart.resize(); }
    axis = [option.xAxis.min, option.xAxis.max];
    chart.setOption(option);
  };
  return { chart, draw };
}

// A bar per run on its GPU's row (GPUs in natural order: cpu2 before cpu10), from its start to its end (or now);
// marks where a run resumed, migrated, was suspended or stopped; ``describe`` writes a run's tooltip; ``zoom``: the
// seconds shown, or null for all.
function timelineOption(gpus, now, runs, colour, describe, zoom) {
  const rows = [...gpus].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const gpuIndex = new Map(rows.map((g, i) => [g, i]));
  const bars = runs.map((r, i) => ({
    value: [gpuIndex.get(r.gpu) ?? 0, r.started_at, r.ended_at ?? now, i],
    itemStyle: { color: colour(r) },
  }));
  const mark = (name, symbol, color, filter, at, size = 9) => ({
    name, type: "scatter", symbol, symbolSize: size, itemStyle: { color }, z: 5,
    data: runs.flatMap((r, i) => filter(r) ? [{ value: [at(r), gpuIndex.get(r.gpu) ?? 0, i] }] : []),
    tooltip: { formatter: (p) => describe(runs[p.data.value[2]]) },
  });
  const shown = zoom ? { startValue: zoom[0], endValue: zoom[1] } : { start: 0, end: 100 };
  return {
    animation: false,
    grid: { left: 90, right: 30, top: 10, bottom: 60 },
    tooltip: { trigger: "item", confine: true },
    dataZoom: [{ type: "inside", xAxisIndex: 0, filterMode: "weakFilter", ...shown },
               { type: "slider", xAxisIndex: 0, filterMode: "weakFilter", height: 18, bottom: 8, ...shown }],
    xAxis: { type: "value", name: "seconds", min: Math.floor(runs.reduce((m, r) => Math.min(m, r.started_at), now)),
             max: Math.ceil(Math.max(now, 1)) },
    yAxis: { type: "category", data: rows, inverse: true, axisLabel: { interval: 0 } },  // every GPU named
    series: [
      { name: "runs", type: "custom", encode: { x: [1, 2], y: 0 }, data: bars, progressive: 5000,
        renderItem: (params, api) => {
          const start = api.coord([api.value(1), api.value(0)]);
          const end = api.coord([api.value(2), api.value(0)]);
          const height = api.size([0, 1])[1] * 0.6;
          const area = params.coordSys;
          const shape = echarts.graphic.clipRectByRect(
            { x: start[0], y: start[1] - height / 2, width: Math.max(end[0] - start[0], 1), height },
            { x: area.x, y: area.y, width: area.width, height: area.height });
          return shape && { type: "rect", shape, style: api.style() };
        },
        tooltip: { formatter: (p) => describe(runs[p.data.value[3]]) } },
      mark("resume", "triangle", "#222", (r) => r.resumed && !r.migrated, (r) => r.started_at),
      mark("migration", "diamond", "#d62728", (r) => r.migrated, (r) => r.started_at, 11),
      mark("suspension", "rect", "#222", (r) => r.ended_by === "suspended", (r) => r.ended_at, [3, 14]),
      // a filled cross: ECharts fills a symbol's path and never strokes it, so a path of lines alone is invisible
      mark("stop", "path://M0,2L2,0L5,3L8,0L10,2L7,5L10,8L8,10L5,7L2,10L0,8L3,5Z", "#b00020",
           (r) => ["stopped", "failed", "lost"].includes(r.ended_by), (r) => r.ended_at, 11),
    ],
  };
}

function describeRun(r) {
  if (!r) return "";
  const how = r.migrated ? "migrated here" : r.resumed ? "resumed" : "started";
  const lines = [`trial ${r.trial} on ${r.gpu}`,
    `${how} at ${clock(r.started_at)}` + (r.start_reason ? `: ${r.start_reason}` : ""),
    r.yield_requested_at !== null ?
      `asked to yield at ${clock(r.yield_requested_at)}: ${r.yield_reason ?? ""}` : "",
    r.ended_at !== null ? `${r.ended_by} at ${clock(r.ended_at)}: ${r.end_reason ?? ""}` : "still running"];
  const [first, ...rest] = lines.filter(Boolean).map(escape);
  return `<b>${first}</b><br>` + rest.join("<br>");
}

function escape(text) {
  return String(text).replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

// ------------------------------------------------------------------ one trial: config, metrics, log tail
function trialPanel(box, id, selected, s) {
  let shown = null, logOffset = null, stream = "stdout", metricsCursor = 0, reports = [], plot = null;
  let missing = null;  // a selected trial the API does not know: said once, not asked for again
  const title = el("h3", {}, "Trial");
  const hint = el("p", { class: "muted" }, "Click a trial in the leaderboard.");
  const config = el("table", { id: "trial-config" });
  const metricsTable = el("table", { id: "trial-metrics" });
  const plotBox = el("div");
  const log = el("pre", { class: "log", id: "trial-log" });
  const streamPick = el("select", {
    onchange: () => { stream = streamPick.value; logOffset = null; log.textContent = ""; },
  },
    el("option", { value: "stdout" }, "stdout"), el("option", { value: "stderr" }, "stderr"));
  const empty = () => {  // no trial selected (the user went back to the experiment): nothing shown, nothing asked
    shown = null; missing = null; plot?.destroy(); plot = null;
    title.textContent = "Trial";
    box.replaceChildren(title, hint);
  };
  empty();
  return every(POLL_MS, async () => {
    const trialId = selected();
    if (!trialId) { if (shown !== null) empty(); return; }
    if (s.experiment?.damaged) return;  // its trials cannot be read: the header says why
    if (trialId === missing) return;
    if (trialId !== shown) {
      shown = trialId; missing = null; logOffset = null; metricsCursor = 0; reports = []; plot?.destroy(); plot = null;
      box.replaceChildren(title, scrolling(config), el("h3", {}, "Metrics"), scrolling(metricsTable), plotBox,
        el("h3", {}, "Log ", streamPick), log);
      log.textContent = "";
    }
    let t;
    try {
      t = await api(`/experiments/${id}/trials/${encodeURIComponent(trialId)}`);
    } catch (error) {
      if (error.status !== 404) throw error;
      missing = trialId;
      title.textContent = "Trial";
      box.replaceChildren(title, el("p", { class: "error", id: "trial-missing" }, error.detail));
      return;
    }
    title.textContent = `Trial ${t.trial}: ${t.state}, step ${t.step}/${t.budget}`;
    config.replaceChildren(
      ...Object.entries(t.params).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, fmt(v)))),
      ...(t.error ? [el("tr", {}, el("th", {}, "error"), el("td", { class: "error" }, t.error))] : []));
    const page = await api(`/experiments/${id}/metrics?after=${metricsCursor}&trial=${encodeURIComponent(trialId)}`);
    metricsCursor = page.cursor;
    if (page.metrics.length) {
      reports.push(...page.metrics);
      const names = Object.keys(reports[reports.length - 1].values);
      const last = reports.slice(-5).reverse();
      metricsTable.replaceChildren(el("tr", {}, el("th", {}, "step"), ...names.map((n) => el("th", {}, n))),
        ...last.map((r) => el("tr", {}, el("td", {}, r.step),
          ...names.map((n) => el("td", { class: "num" }, fmt(r.values[n]))))));
      const data = [reports.map((r) => r.step), ...names.map((n) => reports.map((r) => Number(r.values[n])))];
      plot?.destroy();
      plot = new uPlot({ width: plotBox.clientWidth || 400, height: 180, scales: { x: { time: false } },
        axes: [{ values: stepLabels }, {}],
        series: [{ label: "step" }, ...names.map((n, i) => ({ label: n, stroke: trialColour(i + 3) }))],
      }, data, plotBox);
    }
    const chunk = await api(`/experiments/${id}/trials/${encodeURIComponent(trialId)}/log?stream=${stream}` +
                            (logOffset === null ? "" : `&offset=${logOffset}`));
    if (chunk.text) {
      log.textContent = (log.textContent + chunk.text).slice(-65536);
      log.scrollTop = log.scrollHeight;
    }
    logOffset = chunk.offset;
  });
}

// ------------------------------------------------------------------ the cluster
function clusterView(root) {
  const table = el("table", { id: "cluster" });
  const chartBox = el("div", { class: "chart", id: "cluster-chart" });
  const poolStopped = el("p", { class: "error", id: "pool-stopped", hidden: true });
  root.append(el("h2", {}, "Cluster"), el("p", { class: "muted" },
    "GPUs each user holds now against their fair share of the pool (by their weight, then their experiments')."),
    poolStopped, scrolling(table), el("div", { class: "panel" }, chartBox));
  const users = el("table", { id: "users" });
  const usersError = el("p", { class: "error", id: "users-error" });
  root.append(el("h3", {}, "Users"), el("p", { class: "muted" },
    "Each user's weight in the fair share of the pool; an admin may change it."), scrolling(users), usersError);
  // Read at every poll, and changed in place: a row is drawn again only when it offers other controls, and a weight
  // field takes the user's weight only while it was not edited, so a weight being typed keeps its value and focus.
  const rows = new Map();  // user: their row
  let asked = 0, drawn = 0;  // reads of the table asked for, and the latest drawn: a poll's and a Set's may cross
  users.append(el("tr", {}, ...["user", "admin", "weight", ""].map((h) => el("th", {}, h))));
  // A user's row, with a weight field and its button for an admin; ``weight``: the one the field last took.
  const userRow = (user, admin) => {
    const row = { admin, weight: null, input: el("input", { type: "number", min: "0.01", step: "0.5", size: 4 }),
                  cells: [el("td", {}, user), el("td"), el("td")] };
    const set = el("button", { onclick: async () => {
      usersError.textContent = "";
      users.setAttribute("aria-busy", "true");  // until the table is read again
      try {
        await api(`/users/${encodeURIComponent(user)}/weight`,
                  { method: "PUT", body: JSON.stringify({ weight: +row.input.value }) });
      } catch (error) {
        usersError.textContent = `${user}: ${error.message}`;
        row.input.value = row.weight;  // the weight the user keeps
      }
      try { await showUsers(); } finally { users.removeAttribute("aria-busy"); }
    } }, "Set weight");
    if (admin) row.cells[2].append(row.input);
    row.element = el("tr", { "data-user": user }, ...row.cells, el("td", {}, admin ? set : ""));
    return row;
  };
  const showUsers = async () => {
    const ticket = ++asked;
    const [me, list] = await Promise.all([api("/me"), api("/users")]);
    if (ticket < drawn) return;  // older than what the table shows
    drawn = ticket;
    for (const u of list) {
      let row = rows.get(u.user);
      if (row?.admin !== me.admin) {
        const fresh = userRow(u.user, me.admin);
        if (row) row.element.replaceWith(fresh.element); else users.append(fresh.element);
        rows.set(u.user, row = fresh);
      }
      row.cells[1].textContent = u.admin ? "yes" : "";
      if (!me.admin) row.cells[2].textContent = fmt(u.weight);
      else if (row.weight === null || (row.input.value !== "" && +row.input.value === row.weight)) {
        row.input.value = u.weight;
      }
      row.weight = u.weight;
    }
    const listed = new Set(list.map((u) => u.user));
    for (const [user, row] of rows) if (!listed.has(user)) { row.element.remove(); rows.delete(user); }
  };
  const stopUsers = every(POLL_MS, async () => {
    try {
      await showUsers();
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      usersError.textContent = error.message;
    }
  });
  const chart = echarts.init(chartBox);
  const poolBox = el("div", { class: "chart", id: "pool-timeline" });
  const legend = el("p", { id: "pool-legend" });
  root.append(el("h3", {}, "Pool timeline"), el("p", { class: "muted" },
    "Who ran where on the pool's GPUs: a bar per run, coloured by user; ▲ resume, ◆ migration, | suspension, " +
    "✕ stop or failure. Hover for the reasons; click one of your runs to open its trial."),
    el("div", { class: "panel" }, legend, poolBox));
  const leftOut = el("p", { class: "error", id: "pool-damaged", hidden: true });
  legend.after(leftOut);
  const pool = { runs: new Map(), cursor: "", gpus: [], now: 0, owners: new Map(), drawn: false };
  const poolTimeline = timelineChart(poolBox);
  const poolChart = poolTimeline.chart;
  const ownerColour = (owner) => owner === "(other users)" ? "#9e9e9e" : trialColour(pool.owners.get(owner) ?? 0);
  const describePoolRun = (r) => r.owner === "(other users)" ?
    `<b>another user's trial on ${escape(r.gpu)}</b><br>${clock(r.started_at)} to ` +
      (r.ended_at === null ? "now" : clock(r.ended_at)) :
    `<b>${escape(r.owner)}: ${escape(r.name)}</b><br>` + describeRun(r);
  let shownRuns = [];
  poolChart.on("click", (p) => {
    const r = shownRuns[p.data?.value?.[3] ?? p.data?.value?.[2]];
    if (r?.experiment) location.hash = `#/experiments/${r.experiment}/trials/${encodeURIComponent(r.trial)}`;
  });
  const resize = () => { chart.resize(); poolChart.resize(); };
  window.addEventListener("resize", resize);
  window.hermesDashboard = { state: pool, charts: { pool: poolChart } };
  const stopPool = every(POLL_MS, async () => {
    let changed = 0, more = true, damaged = [];
    while (more) {
      const t = await api(`/cluster/timeline?since=${pool.cursor}`);
      damaged = t.damaged ?? [];
      for (const r of t.runs) {
        if (!pool.owners.has(r.owner) && r.owner !== "(other users)") pool.owners.set(r.owner, pool.owners.size);
        pool.runs.set(r.key, r);
      }
      changed += t.runs.length;
      pool.cursor = t.cursor;
      pool.gpus = [...new Set([...pool.gpus, ...t.gpus])];
      pool.now = Math.max(pool.now, t.now);
      more = t.more;
    }
    // experiments whose damaged record leaves their runs out: each one's page says which record, and what to do
    leftOut.hidden = damaged.length === 0;
    leftOut.replaceChildren(...(damaged.length ? ["Left out, as a record of theirs is damaged: ",
      ...damaged.flatMap((experiment, i) => [i ? ", " : "",
        el("a", { href: `#/experiments/${experiment}` }, `experiment ${experiment}`)])] : []));
    const running = [...pool.runs.values()].some((r) => r.ended_at === null);  // its bar grows with the clock
    if (!changed && pool.drawn && !(running && pool.now !== pool.drawnNow)) return;
    shownRuns = [...pool.runs.values()];
    poolTimeline.draw(pool.gpus, pool.now, shownRuns, (r) => ownerColour(r.owner), describePoolRun);
    legend.replaceChildren(...[...pool.owners.keys(), ...(shownRuns.some((r) => r.owner === "(other users)") ?
      ["(other users)"] : [])].map((owner) => el("span", { class: "swatch", "data-owner": owner },
        el("i", { style: `background: ${ownerColour(owner)}` }), owner)));
    pool.drawn = true;
    pool.drawnNow = pool.now;
  });
  const stop = every(POLL_MS, async () => {
    const c = await api("/cluster");
    poolStopped.textContent = c.pool_stopped || "";  // why the pool runs nothing now, until it starts again
    poolStopped.hidden = !c.pool_stopped;
    const hours = (seconds) => (seconds / 3600).toFixed(2);
    table.replaceChildren(el("tr", {}, ...["user", "weight", "experiments", "GPUs now", "share (GPUs)",
      "GPU hours used", "GPU hours owed"].map((h) => el("th", {}, h))),
      ...c.users.map((u) => el("tr", {}, ...[u.user, u.weight === null ? "" : fmt(u.weight), u.experiments,
        u.gpus_now, u.share.toFixed(2), hours(u.gpu_seconds), hours(u.owed_gpu_seconds)]
        .map((v) => el("td", {}, v)))),
      ...(c.users.length ? [] : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No experiment is running."))]));
    chart.setOption({
      tooltip: {}, legend: { top: 4, right: 20 }, grid: { left: 60, right: 20, top: 40, bottom: 30 },
      xAxis: { type: "category", data: c.users.map((u) => u.user) },
      yAxis: { type: "value", max: c.gpus, name: `GPUs (of ${c.gpus})` },
      series: [{ name: "GPUs held now", type: "bar", data: c.users.map((u) => u.gpus_now) },
               { name: "share", type: "bar", data: c.users.map((u) => u.share) }],
    });
  });
  return () => {
    stop(); stopPool(); stopUsers();
    window.removeEventListener("resize", resize);
    chart.dispose(); poolChart.dispose();
  };
}

// ------------------------------------------------------------------ routing
let routing = 0;  // bumped by every navigation, so that only the latest one builds its view

async function route() {
  const generation = ++routing;
  const root = document.getElementById("view");
  const match = location.hash.match(/^#\/experiments\/(\d+)(?:\/trials\/(.+))?$/);
  if (match && state.view?.experiment === match[1]) {  // another trial of the same experiment: keep the page
    state.view.state.selected = match[2] ? decodeURIComponent(match[2]) : null;
    return;
  }
  state.view?.stop();
  state.view = null;
  root.replaceChildren();
  if (!state.token) { showLogin(); return; }
  if (!TOKEN.test(state.token)) { forgetToken(); showLogin(NOT_A_TOKEN); return; }  // kept by an older page
  document.getElementById("login").hidden = true;
  let me = null;
  while (me === null) {  // a server restarting answers in a moment: ask again, rather than leave the page blank
    try {
      me = await api("/me");
    } catch (error) {
      if (!(error instanceof Unreachable)) {  // refused: the sign-in form shows; any other answer, here
        if (error instanceof ApiError && generation === routing) {
          root.replaceChildren(el("p", { class: "error" }, error.message));
        }
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
    if (generation !== routing) return;  // a later navigation came while this one waited: it builds the view
  }
  document.getElementById("who").textContent = me.name + (me.admin ? " (admin)" : "");
  document.getElementById("logout").hidden = false;
  if (match) {
    const stop = experimentView(root, match[1], match[2] ? decodeURIComponent(match[2]) : null);
    state.view = { stop, experiment: match[1], state: window.hermesDashboard.state };
  } else if (location.hash === "#/cluster") {
    state.view = { stop: clusterView(root) };
  } else {
    state.view = { stop: listView(root) };
  }
}

document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value.trim();
  const refused = await refusal(token);
  if (refused) { document.getElementById("login-error").textContent = refused; return; }
  state.token = token;
  localStorage.setItem("hermesToken", state.token);
  state.view?.stop();
  state.view = null;  // built again, on the page the login form replaced
  route();
});
document.getElementById("logout").addEventListener("click", () => {
  forgetToken();
  state.view?.stop();
  state.view = null;
  route();
});
window.addEventListener("hashchange", route);
route();
