// Ebb's dashboard. The server decides what a token may see; the page only
// follows: it reads the REST API with the token from sessionStorage (never a
// URL) and re-reads what it shows after each event of /v1/stream, the
// writer's committed changes. Money is shown exactly as the API formats it.

const TOKEN_KEY = "ebb.token";
const app = document.getElementById("app");
const live = document.getElementById("live");

let session = null; // { token, operator }
let streamAbort = null;
let refreshTimer = null;
let renderSeq = 0;
let charts = []; // the uPlot instances on the page, destroyed on each render

// ---- the API ---------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/// The API leaves out empty lists (a job's `usage`, `events`, `placement`
/// before there are any): give them back, so every view can read them.
function withLists(job) {
  for (const key of ["usage", "events", "placement"]) job[key] = job[key] || [];
  return job;
}

async function getJob(id) {
  return withLists(await api(`/v1/jobs/${id}`));
}

async function api(path, token = session && session.token) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) {
    let message = `${response.status}`;
    try {
      message = (await response.json()).error || message;
    } catch (_) {
      // Not a JSON error body: the status says enough.
    }
    throw new ApiError(response.status, message);
  }
  return response.json();
}

// ---- small DOM helpers -------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A table in a box that scrolls sideways on a narrow screen. */
function table(caption, headers, rows) {
  return el(
    "div",
    { class: "scroll" },
    el(
      "table",
      {},
      el("caption", { text: caption }),
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows),
    ),
  );
}

function jobLink(id) {
  return el("a", { href: `#/jobs/${id}`, text: `${id}` });
}

/// m:ss until a deadline (never negative).
function countdown(deadlineMs) {
  const left = Math.max(0, Math.ceil((deadlineMs - Date.now()) / 1000));
  return `${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}`;
}

function age(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function announce(text) {
  live.textContent = text;
}

// ---- sign in and out ---------------------------------------------------------

async function signIn(token) {
  // Who is signed in: an operator may list the tenants, a tenant may not
  // (and is named by its own bill).
  let operator;
  let tenant = null;
  try {
    await api("/v1/tenants", token);
    operator = true;
  } catch (e) {
    if (e.status === 403) operator = false;
    else throw e;
  }
  if (!operator) {
    const [from, to] = thisMonth();
    tenant = (await api(`/v1/bill?from=${from}&to=${to}`, token)).tenant;
  }
  session = { token, operator };
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("nav").hidden = false;
  document.getElementById("nav-cluster").hidden = !operator;
  document.getElementById("sign-out").hidden = false;
  const who = document.getElementById("who");
  who.hidden = false;
  who.textContent = operator ? "Signed in as operator" : `Signed in as tenant ${tenant}`;
  follow();
  if (!location.hash || location.hash === "#") location.hash = operator ? "#/cluster" : "#/jobs";
  else render();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  session = null;
  if (streamAbort) streamAbort.abort();
  streamAbort = null;
  location.hash = "";
  location.reload();
}

// ---- live: the stream of committed changes -----------------------------------

/// Reads /v1/stream (fetch, so the token goes in a header) and re-reads the
/// page after each event, at most once per 100 ms. Reconnects after a second
/// when the stream ends.
async function follow() {
  if (streamAbort) streamAbort.abort();
  const abort = new AbortController();
  streamAbort = abort;
  while (!abort.signal.aborted && session) {
    try {
      const response = await fetch("/v1/stream", {
        headers: { Authorization: `Bearer ${session.token}` },
        signal: abort.signal,
      });
      if (response.status === 401) return signOut();
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        const events = buffered.split("\n\n");
        buffered = events.pop();
        if (events.some((e) => e.split("\n").some((line) => line.startsWith("data:")))) scheduleRefresh();
      }
    } catch (_) {
      if (abort.signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function scheduleRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => render({ quiet: true }), 100);
}

// The only timer: re-renders the drain countdowns from deadlines already known.
setInterval(() => {
  for (const span of document.querySelectorAll("[data-deadline]")) {
    span.textContent = countdown(Number(span.dataset.deadline));
  }
}, 1000);

// ---- views -------------------------------------------------------------------

async function render({ quiet = false } = {}) {
  if (!session) return;
  const seq = ++renderSeq;
  const hash = location.hash || "#/jobs";
  let view;
  try {
    const job = hash.match(/^#\/jobs\/(\d+)$/);
    if (job) view = await jobView(Number(job[1]));
    else if (hash.startsWith("#/cluster") && session.operator) view = await clusterView();
    else if (hash.startsWith("#/bill")) view = await billView();
    else view = await jobsView();
  } catch (e) {
    if (e.status === 401) return signOut();
    view = [el("h1", { text: "Error" }), el("p", { class: "error", role: "alert", text: e.message })];
  }
  if (seq !== renderSeq) return; // a later render started meanwhile
  const focused = document.activeElement && document.activeElement.id;
  // A live refresh redraws the same view: what the reader has chosen or
  // typed in its fields and not yet applied stays, not the view's own.
  const chosen = quiet
    ? [...app.querySelectorAll("input[id], select[id], textarea[id]")].map((field) => [field.id, field.tagName, field.value])
    : [];
  app.replaceChildren(...view.flat(Infinity));
  for (const [id, tag, value] of chosen) {
    const again = document.getElementById(id);
    if (again && again.tagName === tag && again.value !== value) again.value = value;
  }
  drawCharts();
  if (focused) {
    const again = document.getElementById(focused);
    if (again) again.focus();
  }
  for (const link of document.querySelectorAll("#nav a")) {
    if (hash.startsWith(link.getAttribute("href"))) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!quiet) app.focus();
}

/// Every page of a listing.
async function allJobs(query) {
  const jobs = [];
  let cursor = null;
  do {
    const page = await api(`/v1/jobs?${query}${cursor ? `&cursor=${cursor}` : ""}`);
    jobs.push(...page.jobs.map(withLists));
    cursor = page.next_cursor;
  } while (cursor);
  return jobs;
}

async function clusterView() {
  const [nodes, active, recent, reservations, report, series] = await Promise.all([
    api("/v1/nodes"),
    allJobs("state=active&limit=500"),
    api("/v1/jobs?order=desc&limit=200"),
    api("/v1/reservations"),
    api(`/v1/report?from=${thisMonth()[0]}&to=${thisMonth()[1]}`),
    api(`/v1/report/series?${new URLSearchParams(seriesPeriod())}`),
  ]);
  const preemptions = await preemptionTimeline(recent.jobs.map(withLists));
  const rows = nodes.map((node) => {
    // Which job is on each GPU, from the node's own row: its jobs, holds
    // and faults come from one read, so a GPU never shows its job from
    // before a change and its hold from after it.
    const jobs = new Map();
    for (const p of node.placements || []) {
      const job = { id: p.job, tier: p.tier, state: p.state, deadline: p.deadline ? Date.parse(p.deadline) : null };
      for (const gpu of p.gpus) jobs.set(gpu, job);
    }
    // GPU index -> the waiting job it is held for.
    const heldFor = new Map();
    for (const h of node.held || []) for (const gpu of h.gpus) heldFor.set(gpu, h.job);
    // GPU index -> why it is out of service.
    const outFor = new Map((node.gpus_out || []).map((o) => [o.gpu, o.reason]));
    const cells = [];
    for (let gpu = 0; gpu < node.gpus; gpu++) {
      const job = jobs.get(gpu);
      const waiting = heldFor.get(gpu);
      const forWaiting = waiting === undefined ? "" : `, held for job ${waiting}`;
      let state, label, extra = null;
      if (job && job.state === "draining") {
        state = "draining";
        const deadline = job.deadline;
        label = `GPU ${gpu}: job ${job.id}, ${job.tier}, draining${forWaiting}`;
        if (deadline) extra = el("span", { class: "countdown", "data-deadline": deadline, text: countdown(deadline) });
      } else if (job) {
        state = job.tier;
        label = `GPU ${gpu}: job ${job.id}, ${job.tier}, ${job.state}${forWaiting}`;
      } else if (waiting !== undefined) {
        state = "held";
        label = `GPU ${gpu}: held for job ${waiting}`;
      } else if (outFor.has(gpu)) {
        state = "out";
        label = `GPU ${gpu}: out of service: ${outFor.get(gpu)}`;
      } else {
        state = "idle";
        label = `GPU ${gpu}: idle`;
      }
      cells.push(
        el(
          "li",
          {
            class: `gpu gpu-${state}`,
            "data-state": state,
            "data-job": job ? job.id : null,
            "data-held-for": waiting,
            title: label,
          },
          el("span", { class: "visually-hidden", text: label }),
          el("span", {
            "aria-hidden": "true",
            text: job ? `${job.id}` : waiting !== undefined ? `H${waiting}` : state === "out" ? "✕" : "·",
          }),
          extra,
        ),
      );
    }
    const status = node.status === "draining" ? "drained" : node.status;
    return el(
      "tr",
      { "data-node": node.name },
      el("th", { scope: "row" }, node.name, el("br"), el("small", { text: node.gpu_model })),
      el(
        "td",
        {},
        el("span", { class: `node-${status}`, text: status + (node.unhealthy ? `: ${node.unhealthy}` : "") }),
        nodeHealth(node),
      ),
      el("td", {}, el("ul", { class: "gpus", "aria-label": `GPUs of ${node.name}` }, cells)),
    );
  });
  const queued = active.filter((j) => j.state === "queued");
  const drainingNow = active.filter((j) => j.state === "draining").length;
  announce(`${nodes.length} nodes, ${active.length - queued.length} jobs placed, ${drainingNow} draining, ${queued.length} queued`);
  return [
    el("h1", { text: "Cluster" }),
    el(
      "section",
      { "aria-labelledby": "nodes-heading" },
      el("h2", { id: "nodes-heading", text: "Nodes" }),
      legend(),
      table("Each node's GPUs, by tier and state", ["Node", "State", "GPUs"], rows),
    ),
    el(
      "section",
      { "aria-labelledby": "queue-heading" },
      el("h2", { id: "queue-heading", text: "Queue" }),
      queued.length === 0
        ? el("p", { text: "No job is waiting." })
        : table(
              "Waiting jobs and why",
              ["Job", "Tenant", "Tier", "GPUs", "Reason", "Detail"],
              queued.map((j) =>
                el(
                  "tr",
                  { "data-job": j.id },
                  el("td", {}, jobLink(j.id), j.name ? ` ${j.name}` : ""),
                  el("td", { text: j.tenant }),
                  el("td", { text: j.tier }),
                  el("td", { text: gpuRange(j) }),
                  el("td", { text: j.pending_reason || "" }),
                  el("td", { text: j.pending_detail || "" }),
                ),
              ),
            ),
    ),
    el(
      "section",
      { "aria-labelledby": "preemptions-heading" },
      el("h2", { id: "preemptions-heading", text: "Preemptions" }),
      preemptions.length === 0
        ? el("p", { text: "No recent preemption." })
        : table(
              "The latest preemptions: notice, the victim's exit, the preemptor's start, and the work lost",
              ["Victim", "Preemptor", "Notice", "Victim exited", "Preemptor started", "Lost work"],
              preemptions.map((p) =>
                el(
                  "tr",
                  { "data-victim": p.victim, "data-preemptor": p.preemptor },
                  el("td", {}, jobLink(p.victim), ` attempt ${p.attempt}`),
                  el("td", {}, p.preemptor ? jobLink(p.preemptor) : "none"),
                  el("td", {}, el("time", { datetime: p.noticeAt, text: p.noticeAt })),
                  el("td", { class: "exited", text: p.exitedMs ? `${seconds(p.exitedMs - p.noticeMs)} after the notice` : "draining" }),
                  el("td", { class: "started", text: p.startedMs ? `${seconds(p.startedMs - (p.exitedMs || p.noticeMs))} after the exit` : "not yet" }),
                  el("td", { text: p.lost === null ? "" : p.lost }),
                ),
              ),
            ),
    ),
    el(
      "section",
      { "aria-labelledby": "report-heading" },
      el("h2", { id: "report-heading", text: "This month by tier" }),
      table(
          `Utilisation and revenue from ${report.from} to ${report.to}`,
          ["Tier", "GPU-hours", "Utilisation", "Revenue (USD)"],
          [
            ...report.tiers.map((t) =>
              el(
                "tr",
                { "data-tier": t.tier },
                el("th", { scope: "row", text: t.tier }),
                el("td", { text: t.gpu_hours.toFixed(2) }),
                el("td", { text: percent(t.utilisation) }),
                el("td", { class: "money", "data-revenue": t.tier, text: amount(t.revenue_micro_usd) }),
              ),
            ),
            el(
              "tr",
              {},
              el("th", { scope: "row", text: "reservations" }),
              el("td", {}),
              el("td", {}),
              el("td", { class: "money", "data-revenue": "reservations", text: amount(report.reservation_revenue_micro_usd) }),
            ),
            el(
              "tr",
              {},
              el("th", { scope: "row", text: "all" }),
              el("td", { text: report.used_gpu_hours.toFixed(2) }),
              el("td", { text: percent(report.utilisation) }),
              el("td", { class: "money", "data-revenue": "total", text: amount(report.total_revenue_micro_usd) }),
            ),
          ],
        ),
    ),
    overTime(series),
    el(
      "section",
      { "aria-labelledby": "reservations-heading" },
      el("h2", { id: "reservations-heading", text: "Reservations" }),
      reservations.length === 0
        ? el("p", { text: "No reservation." })
        : table(
              "Reserved capacity by tenant: what its tenant uses now, and the idle GPUs lent to preemptible jobs",
              ["Reservation", "Tenant", "GPU model", "GPUs", "In use", "Lent", "Borrowers", "Start", "End", "Rate (USD/GPU-hour)"],
              reservations.map((r) =>
                el(
                  "tr",
                  { "data-reservation": r.id },
                  el("td", { text: r.id }),
                  el("td", { text: r.tenant }),
                  el("td", { text: r.gpu_model }),
                  el("td", { text: r.gpus }),
                  el("td", { class: "in-use", text: r.active ? r.in_use : "not in force" }),
                  el("td", { class: "lent", text: r.active ? r.lent : "" }),
                  el(
                    "td",
                    { class: "borrowers" },
                    (r.borrowers || []).map((b, i) => [i ? ", " : "", jobLink(b.job), ` (${b.tenant}, ${gpus(b.gpus)})`]),
                  ),
                  el("td", { text: r.start }),
                  el("td", { text: r.end }),
                  el("td", { class: "money", text: rate(r.rate_micro_usd) }),
                ),
              ),
            ),
    ),
  ];
}

// ---- charts: utilisation and revenue by tier over time ----------------------

/// The periods the "Over time" section offers: each ends with the bucket
/// that holds now, so a fresh cluster's work shows at once.
const PERIODS = [
  { key: "day", text: "last 24 hours / 1 h", step: "1h", stepMs: 3600e3, spanMs: 24 * 3600e3 },
  { key: "week", text: "last 7 days / 6 h", step: "6h", stepMs: 6 * 3600e3, spanMs: 7 * 24 * 3600e3 },
  { key: "month", text: "this month / 1 d", step: "1d" },
];
let periodKey = "day";
const CHART_HEIGHT = 220;
// The tables under the charts that were left open, kept open across renders.
const openTables = new Set();

/// The chosen period as `/v1/report/series` takes it, buckets aligned to
/// the step in UTC.
function seriesPeriod() {
  const period = PERIODS.find((p) => p.key === periodKey);
  if (!period.stepMs) {
    const [from, to] = thisMonth();
    return { from, to, step: period.step };
  }
  const to = (Math.floor(Date.now() / period.stepMs) + 1) * period.stepMs;
  const iso = (ms) => new Date(ms).toISOString().replace(".000Z", "Z");
  return { from: iso(to - period.spanMs), to: iso(to), step: period.step };
}

/// Tenants' colours in the "Use by tenant" chart, by name order; past
/// these, the same again dashed.
const TENANT_COLOURS = ["#3b6fb6", "#c05a1e", "#2e8b57", "#8e44ad", "#b8860b", "#008b8b", "#c71585", "#556b2f"];

/// A tier's colour: the one its GPU cells have (app.css).
function tierColour(tier) {
  return getComputedStyle(document.documentElement).getPropertyValue(`--${tier}`).trim();
}

/// Bucket starts for people: the API's UTC time to the minute.
function bucketTime(rfc3339) {
  return rfc3339.slice(0, 16).replace("T", " ");
}

function overTime(series) {
  const buckets = series.buckets;
  const tiers = buckets.length ? buckets[0].tiers.map((t) => t.tier) : [];
  // Each bucket is drawn flat from its start to its end: the last one needs
  // its end as a point too.
  const times = [...buckets.map((b) => b.start_ms / 1000), series.to_ms / 1000];
  const held = (values) => [...values, values[values.length - 1]];
  const span = `${buckets.length} buckets of ${series.step} from ${bucketTime(series.from)} to ${bucketTime(series.to)} UTC`;
  const peak = (tier) => Math.max(0, ...buckets.map((b) => b.tiers.find((t) => t.tier === tier).utilisation));
  const richest = buckets.reduce((best, b) => (!best || b.total_revenue_micro_usd > best.total_revenue_micro_usd ? b : best), null);
  const select = el(
    "select",
    {
      id: "period",
      onchange: (event) => {
        periodKey = event.target.value;
        render({ quiet: true });
      },
    },
    PERIODS.map((p) => el("option", { value: p.key, text: p.text, selected: p.key === periodKey })),
  );
  const useChart = chart({
    id: "chart-use",
    label: `Utilisation by tier, ${span}: ${tiers.map((t) => `${t} peaks at ${percent(peak(t))}`).join(", ")}.`,
    yLabel: "% of capacity",
    format: (v, decimals = 1) => `${v.toFixed(decimals)}%`,
    minDecimals: 0,
    times,
    lines: tiers.map((tier) => ({
      label: tier,
      colour: tierColour(tier),
      values: held(buckets.map((b) => b.tiers.find((t) => t.tier === tier).utilisation * 100)),
    })),
  });
  const revenueChart = chart({
    id: "chart-revenue",
    label: `Revenue by tier, ${span}, in USD: ${
      richest && richest.total_revenue_micro_usd > 0
        ? `the bucket from ${bucketTime(richest.start)} earned the most, $${amount(richest.total_revenue_micro_usd)} in all`
        : "nothing earned"
    }.`,
    yLabel: "USD",
    format: (v, decimals) => `$${decimals === undefined ? dollars(v) : v.toFixed(decimals)}`,
    minDecimals: 2,
    times,
    lines: [
      ...tiers.map((tier) => ({
        label: tier,
        colour: tierColour(tier),
        values: held(buckets.map((b) => b.tiers.find((t) => t.tier === tier).revenue_micro_usd / 1e6)),
      })),
      {
        label: "reservations",
        colour: tierColour("reserved"),
        dash: [6, 4],
        values: held(buckets.map((b) => b.reservation_revenue_micro_usd / 1e6)),
      },
    ],
  });
  // Fair share over time: each tenant's share of the GPU-hours used.
  const tenants = [...new Set(buckets.flatMap((b) => b.tenants.map((t) => t.tenant)))].sort();
  const shareOf = (b, tenant) => b.tenants.find((t) => t.tenant === tenant)?.share ?? 0;
  const shareChart = chart({
    id: "chart-tenants",
    label: `Use by tenant, ${span}: ${
      tenants.length
        ? tenants.map((t) => `${t} had ${percent(Math.max(0, ...buckets.map((b) => shareOf(b, t))))} at most`).join(", ")
        : "no GPU was used"
    }.`,
    yLabel: "% of GPU-hours used",
    format: (v, decimals = 1) => `${v.toFixed(decimals)}%`,
    minDecimals: 0,
    times,
    lines: tenants.map((tenant, i) => ({
      label: tenant,
      colour: TENANT_COLOURS[i % TENANT_COLOURS.length],
      dash: i >= TENANT_COLOURS.length ? [4, 3] : undefined,
      values: held(buckets.map((b) => shareOf(b, tenant) * 100)),
    })),
  });
  const tenantRows = buckets.map((b) =>
    el(
      "tr",
      { "data-start-ms": b.start_ms },
      el("th", { scope: "row", text: bucketTime(b.start) }),
      tenants.map((tenant) => {
        const use = b.tenants.find((t) => t.tenant === tenant);
        return el("td", { "data-tenant": tenant, text: use ? `${use.gpu_hours.toFixed(2)} (${percent(use.share)})` : "–" });
      }),
    ),
  );
  const useRows = buckets.map((b) =>
    el(
      "tr",
      { "data-start-ms": b.start_ms },
      el("th", { scope: "row", text: bucketTime(b.start) }),
      el("td", { text: b.capacity_gpu_hours.toFixed(2) }),
      b.tiers.map((t) => el("td", { "data-tier": t.tier, text: `${t.gpu_hours.toFixed(2)} (${percent(t.utilisation)})` })),
      el("td", { text: percent(b.utilisation) }),
    ),
  );
  const revenueRows = buckets.map((b) =>
    el(
      "tr",
      { "data-start-ms": b.start_ms },
      el("th", { scope: "row", text: bucketTime(b.start) }),
      b.tiers.map((t) => el("td", { class: "money", "data-tier": t.tier, text: amount(t.revenue_micro_usd) })),
      el("td", { class: "money", "data-tier": "reservations", text: amount(b.reservation_revenue_micro_usd) }),
      el("td", { class: "money", "data-tier": "total", text: amount(b.total_revenue_micro_usd) }),
    ),
  );
  return el(
    "section",
    { "aria-labelledby": "over-time-heading", "data-from": series.from, "data-to": series.to, "data-step": series.step },
    el("h2", { id: "over-time-heading", text: "Over time" }),
    el("div", { class: "filters" }, el("label", { for: "period", text: "Period" }), select),
    el("h3", { text: "Utilisation by tier" }),
    useChart,
    asTable(
      "use-table",
      "Utilisation as a table",
      table(
        `GPU-hours and share of capacity by tier, ${span}`,
        ["Bucket (UTC)", "Capacity (GPU-hours)", ...tiers.map((t) => `${t} GPU-hours (share)`), "Utilisation"],
        useRows,
      ),
    ),
    el("h3", { text: "Use by tenant" }),
    shareChart,
    asTable(
      "tenant-table",
      "Use by tenant as a table",
      table(`GPU-hours and share of those used, by tenant, ${span}`, ["Bucket (UTC)", ...tenants], tenantRows),
    ),
    el("h3", { text: "Revenue by tier" }),
    revenueChart,
    asTable(
      "revenue-table",
      "Revenue as a table",
      table(
        `Revenue in USD by tier, ${span}; an attempt counts in the bucket in which it ended`,
        ["Bucket (UTC)", ...tiers.map((t) => `${t} (USD)`), "reservations (USD)", "Total (USD)"],
        revenueRows,
      ),
    ),
  );
}

/// A chart's numbers behind a disclosure, left as the reader left it.
function asTable(id, summary, content) {
  return el(
    "details",
    {
      id,
      open: openTables.has(id),
      ontoggle: (event) => (event.target.open ? openTables.add(id) : openTables.delete(id)),
    },
    el("summary", { text: summary }),
    content,
  );
}

// How to draw each chart box of the view being built, once it is on the page.
const chartSpecs = new WeakMap();

/// A box for a line chart (one line per entry of `lines`, over `times` in
/// seconds), described to screen readers by `label`; uPlot draws it at the
/// box's width once it is on the page (`drawCharts`).
function chart(spec) {
  const box = el("div", { id: spec.id, class: "chart", role: "img", "aria-label": spec.label });
  chartSpecs.set(box, spec);
  return box;
}

/// A chart's dollars for the legend: as many decimals as the amount needs,
/// at least two (as the API writes them).
function dollars(v) {
  return v.toFixed(6).replace(/(\.\d\d\d*?)0+$/, "$1");
}

function chartOptions(spec, width) {
  const value = (_, v) => (v == null ? "–" : spec.format(v));
  // Enough decimals on the axis that no two ticks read the same.
  const decimals = (step) => Math.min(6, Math.max(spec.minDecimals, Math.ceil(-Math.log10(step))));
  return {
    width,
    height: CHART_HEIGHT,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    scales: { x: { time: true }, y: { range: (_, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    axes: [
      {},
      {
        label: spec.yLabel,
        size: 64,
        values: (_, ticks, _axis, _space, step) => ticks.map((t) => spec.format(t, decimals(step))),
      },
    ],
    series: [
      { label: "Bucket (UTC)" },
      ...spec.lines.map((line) => ({
        label: line.label,
        stroke: line.colour,
        width: 2,
        dash: line.dash,
        value,
        paths: uPlot.paths.stepped({ align: 1 }),
        points: { show: false },
      })),
    ],
  };
}

/// Destroys the charts of the view just replaced and draws the new view's.
function drawCharts() {
  for (const old of charts) old.destroy();
  charts = [];
  for (const box of app.querySelectorAll(".chart")) {
    const spec = chartSpecs.get(box);
    if (!spec) continue;
    const data = [spec.times, ...spec.lines.map((line) => line.values)];
    charts.push(new uPlot(chartOptions(spec, box.clientWidth || 300), data, box));
  }
}

window.addEventListener("resize", () => {
  for (const c of charts) c.setSize({ width: c.root.parentElement.clientWidth || 300, height: CHART_HEIGHT });
});

/// Micro-dollars for people, as the CLI writes them (ebb_core's MicroUsd):
/// rounded half up to `places` decimals, exactly (BigInt).
function microText(micro, places) {
  const m = BigInt(micro);
  const abs = m < 0n ? -m : m;
  const unit = 10n ** BigInt(6 - places);
  const rounded = (abs + unit / 2n) / unit;
  const scale = 10n ** BigInt(places);
  const sign = m < 0n && rounded > 0n ? "-" : "";
  return `${sign}${rounded / scale}.${String(rounded % scale).padStart(places, "0")}`;
}

/// An amount to the cent (`0.71`), as `ebb bill` prints it.
function amount(micro) {
  return microText(micro, 2);
}

/// A rate per GPU-hour to the hundredth of a cent (`1.8000`).
function rate(micro) {
  return microText(micro, 4);
}

/// GPU-hours to two decimals, as the CLI prints them.
function gpuHours(hours) {
  return hours.toFixed(2);
}

/// A length of time as `ebb` writes it (ebb_core's Span::human): `41ms`,
/// `3.0s`, `5m 01s`, `1h 40m`, `7d 0h`.
function span(ms) {
  ms = Math.max(0, Math.floor(ms));
  const [second, minute, hour, day] = [1000, 60000, 3600000, 86400000];
  const pad = (n) => String(n).padStart(2, "0");
  if (ms < second) return `${ms}ms`;
  if (ms < minute) return `${Math.floor(ms / second)}.${Math.floor((ms % second) / 100)}s`;
  if (ms < hour) return `${Math.floor(ms / minute)}m ${pad(Math.floor((ms % minute) / second))}s`;
  if (ms < day) return `${Math.floor(ms / hour)}h ${pad(Math.floor((ms % hour) / minute))}m`;
  return `${Math.floor(ms / day)}d ${Math.floor((ms % day) / hour)}h`;
}

/// Lost work as `ebb show` gives it: `0.67 GPU-hours (8 GPUs x 5m 01s)`.
// An attempt's lost work as its timeline and `ebb show` say it (the
// requeue's exact figure; the usage record's is in whole seconds, for
// billing), or nothing where it lost none.
function attemptLost(job, u) {
  const requeued = job.events.find((e) => e.kind === "requeued" && e.attempt === u.attempt);
  const seconds = requeued && requeued.detail ? requeued.detail.lost_gpu_seconds : null;
  if (seconds === null || seconds === undefined) return u.lost_gpu_seconds > 0 ? `${u.lost_gpu_seconds} GPU-s` : "none";
  return seconds > 0 ? lostWork(seconds, job.gpus) : "none";
}

function lostWork(gpuSeconds, n) {
  const hours = `${gpuHours(gpuSeconds / 3600)} GPU-hours`;
  return n > 0 ? `${hours} (${gpus(n)} x ${span((gpuSeconds / n) * 1000)})` : hours;
}

/// `1 GPU`, `8 GPUs`.
// A job's GPUs in a table: its count, or an elastic job's range.
function gpuRange(j) {
  return j.max_gpus ? `${j.gpus}:${j.max_gpus}` : j.gpus;
}

// A job's GPUs on its page: an elastic job's range, and what it runs on now.
function elasticGpus(job) {
  if (!job.max_gpus) return gpus(job.gpus);
  const now = job.placement.reduce((n, p) => n + p.gpus.length, 0);
  return `${job.gpus} to ${job.max_gpus}, elastic${now ? `, on ${now} now` : ""}`;
}

function gpus(n) {
  return `${n} ${n === 1 ? "GPU" : "GPUs"}`;
}

function percent(share) {
  return `${(share * 100).toFixed(1)}%`;
}

function seconds(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

/// The latest preemptions (at most 10 victims'), from the victims' drain
/// notices and exits, and their preemptors' starts.
async function preemptionTimeline(recentJobs) {
  const victims = await Promise.all(
    recentJobs.filter((j) => j.preemptions > 0 || j.state === "draining").slice(0, 10).map((j) => getJob(j.id)),
  );
  const found = [];
  for (const victim of victims) {
    for (const notice of victim.events.filter((e) => e.kind === "drain_notice")) {
      const by = notice.detail.detail && notice.detail.detail.by;
      if (by === undefined) continue; // a node drain or a reclaim
      const exited = victim.events.find((e) => e.kind === "exited" && e.attempt === notice.attempt && e.at_ms >= notice.at_ms);
      const usage = victim.usage.find((u) => u.attempt === notice.attempt);
      found.push({
        victim: victim.id,
        attempt: notice.attempt,
        preemptor: by,
        noticeAt: notice.at,
        noticeMs: notice.at_ms,
        exitedMs: exited ? exited.at_ms : null,
        startedMs: null,
        lost: usage ? attemptLost(victim, usage) : null,
      });
    }
  }
  const preemptors = new Map();
  await Promise.all(
    [...new Set(found.map((p) => p.preemptor))].map(async (id) => {
      try {
        preemptors.set(id, await getJob(id));
      } catch (_) {
        // Another tenant's job, or gone: shown by its id alone.
      }
    }),
  );
  for (const p of found) {
    const preemptor = preemptors.get(p.preemptor);
    const started = preemptor && preemptor.events.find((e) => e.kind === "started" && e.at_ms >= p.noticeMs);
    if (started) p.startedMs = started.at_ms;
  }
  return found.sort((a, b) => b.noticeMs - a.noticeMs).slice(0, 10);
}

/// What a node's health drained, took out or warns of, under its state.
function nodeHealth(node) {
  const lines = [];
  if (node.drained_for) lines.push(`drained for its health: ${node.drained_for}`);
  for (const o of node.gpus_out || []) {
    const until = o.until_returned ? "faulted twice in a day: out until an operator returns it" : `since ${o.since}`;
    lines.push(`${o.reason} (${until})`);
  }
  for (const w of node.warnings || []) lines.push(`warning: ${w}`);
  if (lines.length === 0) return null;
  return el("ul", { class: "health" }, lines.map((text) => el("li", { text })));
}

function legend() {
  const states = [
    ["idle", "idle"],
    ["reserved", "reserved"],
    ["on-demand", "on-demand"],
    ["preemptible", "preemptible"],
    ["draining", "draining (time left)"],
    ["held", "held for a waiting job"],
    ["out", "out of service (a fault)"],
  ];
  return el(
    "ul",
    { class: "legend", "aria-label": "Legend" },
    states.map(([state, text]) => el("li", {}, el("span", { class: `swatch gpu-${state}`, "aria-hidden": "true" }), text)),
  );
}

const STATES = ["active", "queued", "starting", "running", "draining", "succeeded", "failed", "cancelled"];
const TIERS = ["reserved", "on-demand", "preemptible"];
const PAGE = 50;

/// The jobs list's filters and page, from the hash: `#/jobs?state=&tier=
/// &name=` and `before=ID` (older than ID) or `after=ID` (newer than ID).
function jobsParams() {
  const params = new URLSearchParams((location.hash.split("?")[1]) || "");
  const id = (key) => (/^\d+$/.test(params.get(key) || "") ? params.get(key) : "");
  return {
    state: STATES.includes(params.get("state")) ? params.get("state") : "",
    tier: TIERS.includes(params.get("tier")) ? params.get("tier") : "",
    name: (params.get("name") || "").slice(0, 200),
    before: id("before"),
    after: id("after"),
  };
}

function jobsHash(filters, page = {}) {
  const params = new URLSearchParams();
  for (const key of ["state", "tier", "name"]) if (filters[key]) params.set(key, filters[key]);
  for (const [key, value] of Object.entries(page)) params.set(key, value);
  const query = params.toString();
  return query ? `#/jobs?${query}` : "#/jobs";
}

/// One page of jobs, newest first, keyset-paged by id: older pages read
/// down from the last id shown, newer ones up from the first.
async function jobsView() {
  const f = jobsParams();
  const filter = new URLSearchParams({ arrays: "collapse", limit: PAGE });
  for (const key of ["state", "tier", "name"]) if (f[key]) filter.set(key, f[key]);
  let jobs, older, newer;
  if (f.after) {
    const page = await api(`/v1/jobs?${filter}&order=asc&cursor=${f.after}`);
    jobs = page.jobs.reverse();
    newer = Boolean(page.next_cursor);
    older = jobs.length > 0;
  } else {
    const page = await api(`/v1/jobs?${filter}&order=desc${f.before ? `&cursor=${f.before}` : ""}`);
    jobs = page.jobs;
    older = Boolean(page.next_cursor);
    newer = Boolean(f.before) && jobs.length > 0;
  }
  const form = el(
    "form",
    {
      class: "filters",
      role: "search",
      "aria-label": "Filter jobs",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(event.target);
        location.hash = jobsHash({ state: data.get("state"), tier: data.get("tier"), name: data.get("name").trim() });
      },
    },
    el("label", { for: "state-filter", text: "State" }),
    el(
      "select",
      { id: "state-filter", name: "state" },
      el("option", { value: "", text: "all" }),
      STATES.map((s) => el("option", { value: s, text: s, selected: s === f.state })),
    ),
    el("label", { for: "tier-filter", text: "Tier" }),
    el(
      "select",
      { id: "tier-filter", name: "tier" },
      el("option", { value: "", text: "all" }),
      TIERS.map((t) => el("option", { value: t, text: t, selected: t === f.tier })),
    ),
    el("label", { for: "name-filter", text: "Name contains" }),
    el("input", { id: "name-filter", name: "name", type: "search", value: f.name, maxlength: "200" }),
    el("button", { type: "submit", text: "Filter" }),
  );
  const rows = jobs.map((j) =>
    el(
      "tr",
      { "data-job": j.id },
      el("td", {}, jobLink(j.id)),
      // A job without a name reads as its command, and an array as its
      // name without its first task's "[0]", as `ebb jobs` shows them.
      j.name
        ? el("td", { class: "name", text: j.array && j.progress ? j.name.replace(/\[[^\]]*\]$/, "") : j.name })
        : el("td", { class: "name command", text: j.argv.join(" ") }),
      session.operator ? el("td", { class: "tenant", text: j.tenant }) : null,
      el("td", { text: j.tier }),
      el("td", { text: gpuRange(j) }),
      el("td", { class: `state-${j.state}`, text: j.state }),
      el("td", {}, progress(j)),
      el("td", { text: j.submitted_at }),
    ),
  );
  const pager = el(
    "nav",
    { class: "pager", "aria-label": "Pages of jobs" },
    newer ? el("a", { id: "newer", href: jobsHash(f, { after: jobs[0].id }), text: "← Newer" }) : null,
    f.before || f.after ? el("a", { id: "newest", href: jobsHash(f), text: "Newest" }) : null,
    older ? el("a", { id: "older", href: jobsHash(f, { before: jobs[jobs.length - 1].id }), text: "Older →" }) : null,
  );
  const first = jobs.length ? jobs[0].id : null;
  const last = jobs.length ? jobs[jobs.length - 1].id : null;
  return [
    el("h1", { text: session.operator ? "Jobs" : "My jobs" }),
    form,
    jobs.length === 0
      ? el("p", { text: f.state || f.tier || f.name ? "No job matches." : "No jobs." })
      : table(
          `Jobs ${first} to ${last}, newest first`,
          ["Job", "Name or command", ...(session.operator ? ["Tenant"] : []), "Tier", "GPUs", "State", "Array", "Submitted"],
          rows,
        ),
    pager,
  ];
}

/// An array's progress as `ebb show` gives it: `37/100 done`, then the
/// tasks by state (`60 running, 3 queued`); a bar unless nothing was done
/// and nothing is left to run (a cancelled array is not an empty bar: it
/// says `10 cancelled`).
function progress(job) {
  if (!job.array) return "";
  const p = job.progress;
  if (!p) return `task ${job.array.index} of ${job.array.tasks}`;
  const others = Object.entries(p.states || {})
    .filter(([state, n]) => state !== "succeeded" && n > 0)
    .map(([state, n]) => `${n} ${state}`);
  const ended = Object.entries(p.states || {})
    .filter(([state]) => ["succeeded", "failed", "cancelled"].includes(state))
    .reduce((sum, [, n]) => sum + n, 0);
  const text = ` ${p.done}/${p.total} done${others.length ? `, ${others.join(", ")}` : ""}`;
  const bar = ended < p.total || p.done > 0
    ? el("progress", { max: p.total, value: p.done, "aria-label": `array ${job.array.id}: ${p.done} of ${p.total} done` })
    : null;
  return el("span", { class: "array-progress" }, bar, text);
}

async function jobView(id) {
  let job;
  try {
    job = await getJob(id);
  } catch (e) {
    if (e.status === 404) {
      announce(`job ${id} not found`);
      return [el("h1", { text: `Job ${id}` }), el("p", { class: "error", role: "alert", text: "Job not found." })];
    }
    throw e;
  }
  followLogs(id);
  announce(`job ${id} ${job.state}`);
  const facts = [
    ["State", job.state],
    ["Tenant", job.tenant],
    ["Tier", job.tier],
    ["GPUs", `${elasticGpus(job)}${job.gpu_model ? ` of ${job.gpu_model}` : ""}`],
    ["Command", job.argv.join(" ")],
    ["Attempt", `${job.attempt} (preempted ${job.preemptions}, retried ${job.retries})`],
    ...(job.run_id ? [["Run", `${job.run_id} (every attempt's EBB_RUN_ID: one run in a tracker)`]] : []),
    ["Placement", job.placement.map((p) => `${p.node}: ${p.gpus.length === 1 ? "GPU" : "GPUs"} ${p.gpus.join(",")}`).join("; ") || "none"],
  ];
  if (job.preemptions > 0 || job.lost_gpu_seconds > 0) {
    facts.push(["Lost work", `${lostWork(job.lost_gpu_seconds, job.gpus)} over ${job.preemptions} ${job.preemptions === 1 ? "preemption" : "preemptions"}`]);
  }
  if (job.pending_reason) facts.push(["Waiting", `${job.pending_reason}: ${job.pending_detail || ""}`]);
  const checkpoint = [];
  if (job.last_checkpoint) {
    const c = job.last_checkpoint;
    checkpoint.push(["Last checkpoint", `${age(c.at_ms)} ago (attempt ${c.attempt}${c.step != null ? `, step ${c.step}` : ""}, took ${span(c.seconds * 1000)})`]);
  }
  if (job.checkpoint_interval_s != null) {
    checkpoint.push(["Recommended interval", `every ${span(job.checkpoint_interval_s * 1000)}${job.checkpoint_interval_why ? `: ${job.checkpoint_interval_why}` : ""}`]);
  }
  const dl = (pairs) => el("dl", {}, pairs.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  return [
    el("h1", { text: `Job ${id}${job.name ? ` (${job.name})` : ""}` }),
    dl(facts),
    el("h2", { text: "Checkpoints" }),
    checkpoint.length ? dl(checkpoint) : el("p", { text: "No checkpoint reported." }),
    job.drill ? [el("h2", { text: "Drill" }), el("div", { class: "drill", "data-verdict": job.drill.verdict || "pending" }, dl(drillFacts(job.drill)))] : [],
    el("h2", { text: "Timeline" }),
    el(
      "ol",
      { class: "timeline" },
      // The server's sentence for each event, the one `ebb show` prints.
      job.events.map((e) =>
        el("li", { "data-kind": e.kind }, el("time", { datetime: e.at, text: e.at }), ` #${e.attempt} `, el("strong", { text: e.kind }), e.text ? ` ${e.text}` : ""),
      ),
    ),
    el("h2", { text: "Attempts" }),
    job.usage.length === 0
      ? el("p", { text: "No attempt has ended yet." })
      : table(
            "Each ended attempt and its charge",
            ["Attempt", "Outcome", "Started", "Ended", "GPU-seconds", "Lost work", "Charge (USD)"],
            job.usage.map((u) =>
              el(
                "tr",
                { "data-attempt": u.attempt },
                el("td", { text: u.attempt }),
                el("td", { text: u.outcome }),
                el("td", { text: u.started_at }),
                el("td", { text: u.ended_at }),
                el("td", { text: u.gpu_seconds }),
                el("td", { class: "lost", text: attemptLost(job, u) }),
                el("td", { class: "money", text: amount(u.amount_micro_usd) }),
              ),
            ),
          ),
    el("h2", { text: "Logs" }),
    el("pre", { id: "logs", class: "logs", role: "log", tabindex: "0", "aria-label": "Job output" }, logs.id === id ? logs.text : ""),
  ];
}

/// The latest drill (`ebb drill`), step by step, as `ebb show` tells it:
/// times are from the notice.
function drillFacts(d) {
  const after = (ms) => `+${((ms - d.notice_at_ms) / 1000).toFixed(1)} s`;
  const facts = [["Notice", `attempt ${d.attempt} on ${d.nodes.join(", ")} at ${d.notice_at}, SIGKILL at +${d.window_seconds} s`]];
  if (d.checkpoint) {
    const what = d.checkpoint.step != null ? `step ${d.checkpoint.step}` : "reported";
    facts.push(["Checkpoint", `${what} at ${after(d.checkpoint.at_ms)} (attempt ${d.checkpoint.attempt})`]);
  }
  if (d.exited_ms != null) {
    const margin = d.fit_window ? `${d.margin_seconds.toFixed(1)} s before the deadline` : "past the window";
    facts.push(["Exit", `${d.exit} at ${after(d.exited_ms)} (${margin}, lost ${d.lost_seconds.toFixed(1)} s)`]);
  }
  if (d.next_attempt != null) {
    let next = `attempt ${d.next_attempt} on ${d.next_node}`;
    if (d.next_started_ms != null) next += ` started at ${after(d.next_started_ms)}`;
    if (d.resumed_ms != null) next += `, resumed${d.resumed_step != null ? ` from step ${d.resumed_step}` : ""} at ${after(d.resumed_ms)}`;
    facts.push(["Next attempt", next]);
  }
  const failures = (d.failures || []).join("; ");
  facts.push(["Verdict", d.verdict ? `${d.verdict}${failures ? `: ${failures}` : ""}` : "pending"]);
  return facts;
}

// A job's output as far as it has been read, and the one follower reading it:
// a long poll (`follow`), which answers as soon as there is more.
const logs = { id: null, text: "", offset: 0, finished: false, follower: null };

async function followLogs(id) {
  if (logs.id !== id) Object.assign(logs, { id, text: "", offset: 0, finished: false });
  if (logs.finished || logs.follower === id) return;
  logs.follower = id;
  try {
    while (session && logs.id === id && location.hash === `#/jobs/${id}`) {
      const chunk = await api(`/v1/jobs/${id}/logs?offset=${logs.offset}&follow=true&wait_ms=20000`);
      if (logs.id !== id) break;
      logs.text += chunk.data;
      logs.offset = chunk.next_offset;
      logs.finished = chunk.finished;
      const pre = document.getElementById("logs");
      if (pre && chunk.data) pre.textContent = logs.text;
      if (chunk.finished) break;
    }
  } catch (_) {
    // No output kept, or signed out: the page shows what was read.
  } finally {
    if (logs.follower === id) logs.follower = null;
  }
}

/// This month, UTC, as [from, to) dates.
function thisMonth() {
  const now = new Date();
  const from = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));
  const to = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1));
  return [from.toISOString().slice(0, 10), to.toISOString().slice(0, 10)];
}

async function billView() {
  const params = new URLSearchParams((location.hash.split("?")[1]) || "");
  const [defaultFrom, defaultTo] = thisMonth();
  const date = /^\d{4}-\d{2}-\d{2}$/;
  const from = date.test(params.get("from") || "") ? params.get("from") : defaultFrom;
  const to = date.test(params.get("to") || "") ? params.get("to") : defaultTo;
  const bill = await api(`/v1/bill?from=${from}&to=${to}`);
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(event.target);
        location.hash = `#/bill?from=${data.get("from")}&to=${data.get("to")}`;
      },
    },
    el("label", { for: "bill-from", text: "From" }),
    el("input", { id: "bill-from", name: "from", type: "date", value: from, required: true }),
    el("label", { for: "bill-to", text: "To (exclusive)" }),
    el("input", { id: "bill-to", name: "to", type: "date", value: to, required: true }),
    el("button", { type: "submit", text: "Show" }),
  );
  const totals = [
    ["Total", amount(bill.total_micro_usd), "total"],
    ["On-demand equivalent", amount(bill.on_demand_equivalent_micro_usd), "on-demand-equivalent"],
    ["Saved by preemptible", amount(bill.preemptible_savings_micro_usd), "savings"],
  ];
  return [
    el("h1", { text: `Bill for ${bill.tenant}` }),
    form,
    el("p", {
      class: "bill-counts",
      text: `From ${bill.from} to ${bill.to}: ${bill.attempts} ${bill.attempts === 1 ? "attempt" : "attempts"}, ${bill.preemptions} preempted`
        + (bill.repeat_preemptions > 0
          ? ` (${bill.repeat_preemptions} again after an earlier preemption, ${bill.preemptions_within_min_runtime} of them within the minimum run time)`
          : "")
        + `; ${gpuHours(bill.drain_gpu_hours)} GPU-hours in drain windows, ${gpuHours(bill.lost_gpu_hours)} GPU-hours of work lost.`,
    }),
    el(
      "dl",
      { class: "totals" },
      totals.map(([k, v, key]) => [el("dt", { text: k }), el("dd", { class: "money", "data-amount": key, text: `$${v}` })]),
    ),
    el("h2", { text: "Lines" }),
    bill.lines.length === 0
      ? el("p", { text: "No usage in this period." })
      : table(
            "Usage by tier and GPU model",
            ["Tier", "GPU model", "GPU-hours", "Rate (USD/GPU-hour)", "Amount (USD)"],
            bill.lines.map((l) =>
              el(
                "tr",
                { "data-line": `${l.tier}/${l.gpu_model}` },
                el("td", { text: l.tier }),
                el("td", { text: l.gpu_model }),
                el("td", { class: "money", text: gpuHours(l.gpu_hours) }),
                el("td", { class: "money", text: l.tier === "reserved" ? "reservation" : rate(l.rate_micro_usd) }),
                el("td", { class: "money", "data-amount": "line", text: amount(l.amount_micro_usd) }),
              ),
            ),
          ),
    el("h2", { text: "Reservations" }),
    bill.reservations.length === 0
      ? el("p", { text: "No reservation in this period." })
      : table(
            "Reservation charges",
            ["Reservation", "GPU model", "GPUs", "From", "To", "Amount (USD)"],
            bill.reservations.map((r) =>
              el(
                "tr",
                {},
                el("td", { text: r.reservation }),
                el("td", { text: r.gpu_model }),
                el("td", { text: r.gpus }),
                el("td", { text: r.from }),
                el("td", { text: r.to }),
                el("td", { class: "money", text: amount(r.amount_micro_usd) }),
              ),
            ),
          ),
    el("p", {
      class: "note",
      text: "GPU-hours here are what was billed: each attempt that ended in the period, per started second from its start to its exit; an attempt still running is billed when it ends.",
    }),
  ];
}

// ---- start -------------------------------------------------------------------

document.getElementById("sign-in").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  const error = document.getElementById("sign-in-error");
  error.textContent = "";
  try {
    await signIn(input.value.trim());
  } catch (e) {
    error.textContent = e.status === 401 ? "That token is not valid." : `Cannot sign in: ${e.message}`;
  }
});
document.getElementById("sign-out").addEventListener("click", signOut);
window.addEventListener("hashchange", () => render());

const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) {
  signIn(saved).catch(() => {
    sessionStorage.removeItem(TOKEN_KEY);
  });
}
