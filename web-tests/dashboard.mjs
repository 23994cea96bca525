// Browser tests of the dashboard: headless Chromium (Debian's chromium,
// driven by playwright-core) against a real `ebb up` on loopback, in a
// temporary directory. Exits non-zero, naming the check, on any failure.
//
//   node web-tests/dashboard.mjs
//
// EBB: the ebb binary (default target/debug/ebb). EBB_CHROMIUM: the browser
// (default /usr/bin/chromium). EBB_SCREENSHOTS=DIR: also save every view
// into DIR, 1280x800 unless said: the operator's (dashboard-operator.png,
// and at 390 px dashboard-phone.png), its charts and reservations
// (dashboard-charts.png, dashboard-reservations.png), a preempted job's page
// (dashboard-job.png), a GPU out of service (dashboard-gpu-out.png), a
// tenant's jobs and bill (dashboard-user.png, dashboard-bill.png) and the
// sign-in page (dashboard-sign-in.png).

import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.dirname(here);
const EBB = process.env.EBB || path.join(root, "target/debug/ebb");
const CHROMIUM = process.env.EBB_CHROMIUM || "/usr/bin/chromium";
const SCREENSHOTS = process.env.EBB_SCREENSHOTS;
const DRAIN_WINDOW_S = 10;
const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

function fail(message) {
  console.error(`dashboard: FAIL: ${message}`);
  process.exitCode = 1;
  throw new Error(message);
}

function check(ok, message) {
  if (!ok) fail(message);
  console.log(`dashboard: ok: ${message}`);
}

if (!existsSync(CHROMIUM)) {
  console.error(`dashboard: no Chromium at ${CHROMIUM}: install Debian's chromium (apt-get install chromium) or set EBB_CHROMIUM`);
  process.exit(1);
}
if (!existsSync(EBB)) {
  console.error(`dashboard: no ebb binary at ${EBB}: cargo build -p ebb, or set EBB`);
  process.exit(1);
}

// ---- the cluster -------------------------------------------------------------

const dataDir = mkdtempSync(path.join(tmpdir(), "ebb-dashboard-"));
let up = null;

async function startCluster() {
  up = spawn(EBB, ["up", "--nodes", "2", "--gpus-per-node", "8", "--port", "0",
    "--drain-window", `${DRAIN_WINDOW_S}s`, "--heartbeat-timeout", "4s", "--data-dir", path.join(dataDir, "cluster")],
    { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  up.stderr.on("data", (chunk) => { output += chunk; });
  const line = await new Promise((resolve, reject) => {
    let buffered = "";
    up.stdout.on("data", (chunk) => {
      buffered += chunk;
      const match = buffered.match(/EBB_SERVER=(\S+) EBB_TOKEN=(\S+)/);
      if (match) resolve(match);
    });
    up.on("exit", (code) => reject(new Error(`ebb up exited (${code}): ${buffered}${output}`)));
  });
  return { url: line[1], admin: line[2] };
}

function stopCluster() {
  if (up && up.exitCode === null) {
    const exited = new Promise((resolve) => up.on("exit", resolve));
    up.kill("SIGTERM");
    return Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 20000))]).then(() => {
      if (up.exitCode === null) up.kill("SIGKILL");
    });
  }
  return Promise.resolve();
}

function cli(server, token, args) {
  const [command, ...rest] = args;
  const sub = command === "tenant" ? [command, rest.shift()] : [command];
  return execFileSync(EBB, [...sub, "--server", server, "--token", token, ...rest], { encoding: "utf8" });
}

async function get(server, token, route) {
  const response = await fetch(server + route, { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) throw new Error(`GET ${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

async function until(what, probe, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function jobState(server, token, id) {
  return get(server, token, `/v1/jobs/${id}`).then((job) => job.state);
}

// ---- the browser ---------------------------------------------------------------

async function newPage(browser, problems, viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport });
  // Also said on the console, as a failure, whatever Chromium itself logs.
  await context.addInitScript(() => document.addEventListener("securitypolicyviolation", (e) => {
    console.error(`content security policy violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline"}`);
  }));
  const page = await context.newPage();
  // A script or style the content security policy blocks, or any script
  // error, is a failure of the page. An API's 403 or 404 is an answer the
  // page expects (who is signed in; another tenant's job), not an error.
  page.on("console", (message) => {
    const text = message.text();
    if (message.type() === "error" && !/^Failed to load resource: .* status of 40[34]/.test(text)) {
      problems.push(`console: ${text}`);
    }
  });
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  return page;
}

async function signIn(page, server, token) {
  await page.goto(server + "/");
  const hint = await page.locator("#where-token").textContent();
  check(hint.includes("admin.token") && hint.includes("ebb tenant create"), "the signed-out page says where a token is");
  // By keyboard: the field is labelled "Token"; Enter submits.
  await page.getByLabel("Token").fill(token);
  await page.getByLabel("Token").press("Enter");
  await page.getByRole("button", { name: "Sign out" }).waitFor();
  check(!page.url().includes(token), "the token is not in the page's URL");
}

/// One part of the page, as it is now, when screenshots are asked for.
/// The page re-renders on every change, so the part is found again each try
/// and taken as a clip of the page, not as an element that may be replaced.
async function screenshotOf(locator, name) {
  if (!SCREENSHOTS) return;
  for (let tries = 0; ; tries++) {
    try {
      await locator.scrollIntoViewIfNeeded();
      const box = await locator.boundingBox();
      await locator.page().screenshot({ path: path.join(SCREENSHOTS, name), fullPage: true,
        clip: { ...box, y: box.y + (await locator.page().evaluate(() => window.scrollY)) } });
      return;
    } catch (error) {
      if (tries === 5) throw error;
    }
  }
}

async function screenshot(page, name) {
  if (!SCREENSHOTS) return;
  await page.evaluate(() => window.scrollTo(0, 0)); // axe-core scrolls as it checks contrast
  await page.screenshot({ path: path.join(SCREENSHOTS, name) });
}

async function axe(page, what) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  for (const v of bad) {
    console.error(`dashboard: axe: ${v.id} (${v.impact}): ${v.help}: ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
  }
  check(bad.length === 0, `axe-core finds no serious or critical violations on ${what}`);
}

/// The "Over time" section's tables, and /v1/report/series for the period
/// the section says it shows.
async function seriesOnPage(page, server, admin) {
  const section = page.locator("section[aria-labelledby=\"over-time-heading\"]");
  const [from, to, step] = await Promise.all(["data-from", "data-to", "data-step"].map((a) => section.getAttribute(a)));
  const series = await get(server, admin, `/v1/report/series?${new URLSearchParams({ from, to, step })}`);
  const shown = await page.evaluate(() => {
    const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)].map((tr) => ({
      start: Number(tr.dataset.startMs),
      cells: Object.fromEntries([...tr.querySelectorAll("td[data-tier]")].map((td) => [td.dataset.tier, td.textContent])),
    }));
    return { use: rows("use-table"), revenue: rows("revenue-table") };
  });
  return { series, shown };
}

/// Whether the tables show the API's numbers: each tier's GPU-hours to the
/// hundredth, and every amount to the cent. (Shares of capacity
/// change as time passes; GPU-hours of ended attempts do not.)
function tablesMatch({ series, shown }) {
  const buckets = series.buckets;
  return shown.use.length === buckets.length && shown.revenue.length === buckets.length && buckets.every((b, i) => {
    const [use, revenue] = [shown.use[i], shown.revenue[i]];
    return use.start === b.start_ms && revenue.start === b.start_ms
      && b.tiers.every((t) => use.cells[t.tier].split(" ")[0] === t.gpu_hours.toFixed(2) && revenue.cells[t.tier] === cents(t.revenue_micro_usd))
      && revenue.cells.reservations === cents(b.reservation_revenue_micro_usd) && revenue.cells.total === cents(b.total_revenue_micro_usd);
  });
}

/// Micro-dollars to the cent, rounded half up, as the CLI prints them;
/// worked out here on its own rather than with the page's code.
function cents(micro) {
  return (Math.round(micro / 10000) / 100).toFixed(2);
}

/// The row of a CLI table that starts with `first`, as its fields.
function cliRow(text, first) {
  const line = text.split("\n").find((l) => l.trim().split(/\s+/)[0] === first);
  if (!line) fail(`no row ${first} in:\n${text}`);
  return line.trim().split(/\s+/);
}

/// Text with its runs of white space as one space, for comparing what a
/// page shows with what a terminal shows.
function words(text) {
  return text.trim().split(/\s+/).join(" ");
}

function thisMonth() {
  const now = new Date();
  const from = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));
  const to = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1));
  return [from.toISOString().slice(0, 10), to.toISOString().slice(0, 10)];
}

// ---- the checks ------------------------------------------------------------------

async function operatorSeesPreemption(browser, server, admin, problems) {
  const page = await newPage(browser, problems);
  await signIn(page, server, admin);
  await page.getByRole("heading", { level: 1, name: "Cluster" }).waitFor();
  check(await page.getByRole("navigation", { name: "Views" }).isVisible(), "the operator has the views' navigation");
  for (const [id, what] of [["chart-use", "Utilisation by tier"], ["chart-tenants", "Use by tenant"], ["chart-revenue", "Revenue by tier"]]) {
    const chart = page.locator(`#${id}[role="img"]`);
    await chart.locator("canvas").first().waitFor();
    check((await chart.getAttribute("aria-label")).startsWith(`${what}, 24 buckets of 1h from `),
      `the chart "${what}" is drawn and described to screen readers`);
  }
  await until("both nodes up", async () => (await get(server, admin, "/v1/nodes")).filter((n) => n.status === "up").length === 2);

  const submit = (...args) => JSON.parse(cli(server, admin, ["submit", "--json", ...args])).id;
  // Both nodes busy: an on-demand job on one, a preemptible one on the other
  // that ignores the drain notice's SIGTERM, so it drains for the whole window.
  const filler = submit("--tier", "on-demand", "--gpus", "8", "--name", "filler", "--", "sleep", "600");
  await until("the on-demand filler running", async () => (await jobState(server, admin, filler)) === "running");
  const victim = submit("--gpus", "8", "--name", "victim", "--", "sh", "-c", "trap '' TERM; sleep 600");
  await until("the preemptible victim running", async () => (await jobState(server, admin, victim)) === "running");
  const cells = (job, state) => page.locator(`li.gpu[data-job="${job}"][data-state="${state}"]`);
  await until("the victim's 8 preemptible cells", async () => (await cells(victim, "preemptible").count()) === 8, 5000);
  check(true, "the page shows the victim's 8 GPUs as preemptible without a reload");

  await page.evaluate(() => { window.notReloaded = true; });
  const preemptor = submit("--tier", "on-demand", "--gpus", "8", "--name", "preemptor", "--", "sleep", "600");
  await until("the victim's cells draining", async () => (await cells(victim, "draining").count()) === 8, 5000);
  const first = await cells(victim, "draining").first().locator(".countdown").textContent();
  check(/^\d+:\d\d$/.test(first), `a draining cell counts down m:ss to its deadline (${first})`);
  const queued = page.locator(`tr[data-job="${preemptor}"]`);
  await queued.waitFor({ timeout: 5000 });
  check((await queued.textContent()).includes("victims_draining"), "the queue shows the preemptor waiting for the victims to drain");
  await page.waitForTimeout(2100);
  const later = await cells(victim, "draining").first().locator(".countdown").textContent();
  const seconds = (t) => Number(t.split(":")[0]) * 60 + Number(t.split(":")[1]);
  check(seconds(later) < seconds(first), `the countdown goes down (${first} then ${later})`);
  await axe(page, "the operator's view");
  const overlaps = await page.evaluate(() => {
    const live = document.getElementById("live").getBoundingClientRect();
    return [...document.querySelectorAll("main table, main h2")].filter((e) => {
      const r = e.getBoundingClientRect();
      return live.width > 0 && r.left < live.right && live.left < r.right && r.top < live.bottom && live.top < r.bottom;
    }).length;
  });
  check(overlaps === 0, "at 1280x800 the status line covers no table or heading");
  check(!/\b1 GPUs\b/.test(await page.textContent("body")), "one GPU is never \"1 GPUs\"");
  await screenshot(page, "dashboard-operator.png");

  await until("the preemptor's 8 on-demand cells", async () => (await cells(preemptor, "on-demand").count()) === 8,
    (DRAIN_WINDOW_S + 20) * 1000);
  check(await page.evaluate(() => window.notReloaded === true), "the preemptor appears on the victim's GPUs without a reload");
  check((await cells(victim, "draining").count()) === 0, "no cell is left draining");
  const preemption = page.locator(`tr[data-victim="${victim}"][data-preemptor="${preemptor}"]`);
  await until("the preemption's row with the preemptor's start",
    async () => (await preemption.count()) === 1 && / after the exit$/.test(await preemption.locator(".started").textContent()), 5000);
  check(/ after the notice$/.test(await preemption.locator(".exited").textContent()),
    "the preemption timeline shows the notice, the victim's exit and the preemptor's start");

  // A running job's page: no attempt has ended yet; the victim's shows its notice.
  await page.getByRole("link", { name: `${preemptor}`, exact: true }).first().click();
  await page.getByRole("heading", { level: 1, name: `Job ${preemptor} (preemptor)` }).waitFor();
  await page.getByText("No attempt has ended yet.").waitFor();
  check(true, "a running job's page opens from the timeline's link");
  await page.goto(`${server}/#/jobs/${victim}`);
  await page.getByRole("heading", { level: 1, name: `Job ${victim} (victim)` }).waitFor();
  check((await page.locator(".timeline li", { hasText: "drain_notice" }).count()) === 1, "the victim's timeline has its drain notice");
  const shown = cli(server, admin, ["show", `${victim}`]).split("events:\n")[1].split("\n").filter((l) => l.trim());
  const timeline = (await page.locator(".timeline li").allTextContents()).map(words);
  check(JSON.stringify(timeline) === JSON.stringify(shown.map(words)),
    `the timeline is ebb show's, sentence for sentence (${timeline.length} events, e.g. "${timeline[timeline.length - 1]}")`);
  // Its attempts' lost work in ebb show's words, not the bill's whole seconds.
  const lostShown = shown.find((l) => / requeued /.test(l)).split("; lost ")[1];
  const lostCell = await page.locator('tr[data-attempt="1"] td.lost').textContent();
  check(lostCell === lostShown, `an attempt's lost work is ebb show's (${lostCell})`);
  await screenshot(page, "dashboard-job.png");
  await page.goto(`${server}/#/cluster`);
  await page.getByRole("heading", { level: 1, name: "Cluster" }).waitFor();

  // Phone width: nothing wider than the screen, the charts included.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  check(overflow <= 390, `the operator's view fits 390 px (${overflow})`);
  const chartWidths = () => page.evaluate(() => [...document.querySelectorAll(".chart canvas")].map((c) => c.getBoundingClientRect().right));
  await until("the charts redrawn at 390 px", async () => (await chartWidths()).every((right) => right <= 390), 5000);
  check((await chartWidths()).length === 3, "the three charts are redrawn within 390 px");
  await screenshot(page, "dashboard-phone.png");
  await page.context().close();
  for (const job of [filler, victim, preemptor]) cli(server, admin, ["cancel", `${job}`]);
  for (const job of [filler, victim, preemptor]) {
    await until(`job ${job} cancelled`, async () => (await jobState(server, admin, job)) === "cancelled");
  }

  // The month's revenue by tier, live, as `ebb report` gives it.
  const report = cli(server, admin, ["report"]);
  const page2 = await newPage(browser, problems);
  await signIn(page2, server, admin);
  const revenue = (key) => page2.locator(`[data-revenue="${key}"]`).textContent();
  for (const tier of ["on-demand", "preemptible", "reserved"]) {
    const [, hours, , usd] = cliRow(report, tier);
    await until(`${tier} revenue on the page`, async () => (await revenue(tier)) === usd, 5000);
    const shownHours = await page2.locator(`tr[data-tier="${tier}"] td`).first().textContent();
    check(shownHours === hours, `${tier}: ${hours} GPU-hours and $${usd}, as ebb report prints them`);
  }
  const total = cliRow(report, "total")[1];
  check((await revenue("total")) === total, `the month's revenue is ebb report's, to the cent ($${total})`);
  const long = (await page2.locator("main").innerText()).match(/.{0,30}\d\.\d{5,}.{0,10}/);
  check(!long, `no figure on the cluster view has more than four decimals${long ? `: ${long[0]}` : ""}`);

  // The charts' tables say what /v1/report/series says, bucket by bucket.
  let seen = await until("the charts' tables as /v1/report/series gives them", async () => {
    const both = await seriesOnPage(page2, server, admin);
    return tablesMatch(both) && both;
  }, 5000);
  const preemptibleHours = seen.series.buckets.map((b) => b.tiers.find((t) => t.tier === "preemptible").gpu_hours);
  check(preemptibleHours[preemptibleHours.length - 1] > 0 || preemptibleHours[preemptibleHours.length - 2] > 0,
    `the victim's preemptible GPU-hours are in the last hour's bucket (${preemptibleHours.slice(-2).join(", ")})`);
  check(seen.series.buckets.some((b) => b.tiers.find((t) => t.tier === "preemptible").revenue_micro_usd > 0),
    "and its revenue in the bucket it ended in");
  check(true, `every bucket's GPU-hours and revenue on the page are /v1/report/series's (${seen.series.buckets.length} of ${seen.series.step})`);
  check((await page2.locator(".uplot").count()) === 3, "the page holds the three charts, however often it was redrawn");
  // Use by tenant: the table's cells are the series' GPU-hours and shares.
  const last = seen.series.buckets[seen.series.buckets.length - 1];
  for (const use of last.tenants) {
    const cell = page2.locator(`#tenant-table tbody tr[data-start-ms="${last.start_ms}"] td[data-tenant="${use.tenant}"]`);
    const text = await cell.textContent();
    check(text.startsWith(use.gpu_hours.toFixed(2)), `${use.tenant}'s use in the last bucket is the series' (${text})`);
  }
  check(last.tenants.length > 0, `the last bucket's use is by tenant (${last.tenants.map((t) => t.tenant).join(", ")})`);
  await page2.getByLabel("Period").selectOption({ label: "last 7 days / 6 h" });
  seen = await until("the week's charts by 6 h", async () => {
    const both = await seriesOnPage(page2, server, admin);
    return both.series.step === "6h" && tablesMatch(both) && both;
  }, 5000);
  check(seen.shown.revenue.length === 28, "the last 7 days by 6 h: 28 buckets, as /v1/report/series gives them");
  await page2.getByText("Revenue as a table").click();
  check(await page2.locator("#revenue-table table").isVisible(), "the revenue's table opens for a sighted reader");
  await axe(page2, "the operator's charts and their tables");
  await page2.context().close();
}

async function tenantSeesOnlyItsOwn(browser, server, admin, problems) {
  const tenant = (name) => JSON.parse(cli(server, admin, ["tenant", "create", name, "--json"])).token;
  const alice = tenant("alice");
  const bob = tenant("bob");
  const submit = (token, ...args) => JSON.parse(cli(server, token, ["submit", "--json", ...args])).id;
  const secret = submit(bob, "--name", "bobs-job", "--", "sleep", "600");
  const mine = submit(alice, "--name", "hello", "--", "sh", "-c", "echo hello from alice");
  const onDemand = submit(alice, "--tier", "on-demand", "--name", "quick", "--", "true");
  for (const job of [mine, onDemand]) {
    await until(`alice's job ${job} succeeded`, async () => (await jobState(server, alice, job)) === "succeeded");
  }

  const page = await newPage(browser, problems);
  await signIn(page, server, alice);
  await page.getByRole("heading", { level: 1, name: "My jobs" }).waitFor();
  check(await page.getByRole("link", { name: "Cluster" }).count() === 0, "a tenant has no cluster view");
  const who = await page.locator("#who").textContent();
  check(who === "Signed in as tenant alice", `the page names the tenant signed in (${who})`);
  await page.locator(`tr[data-job="${mine}"]`).waitFor();
  check((await page.locator(`tr[data-job="${onDemand}"]`).count()) === 1, "alice's jobs are on her page");
  check((await page.locator(`tr[data-job="${secret}"]`).count()) === 0, "bob's job is not on alice's page");
  check(!(await page.textContent("main")).includes("bobs-job"), "bob's job's name is nowhere on alice's page");
  await axe(page, "a tenant's jobs");
  await screenshot(page, "dashboard-user.png");

  await page.getByLabel("State").selectOption("succeeded");
  // A change to alice's jobs redraws the page live; the filter she chose
  // and has not applied yet stays chosen.
  const later = submit(alice, "--name", "later", "--", "sleep", "600");
  await page.locator(`tr[data-job="${later}"]`).waitFor();
  check((await page.getByLabel("State").inputValue()) === "succeeded", "a filter chosen but not applied stays through a live redraw");
  cli(server, alice, ["cancel", `${later}`]);
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/state=succeeded/);
  // The unfiltered rows stay until the filtered list has come: the
  // cancelled job's row going is that list drawn.
  await page.locator(`tr[data-job="${later}"]`).waitFor({ state: "detached" });
  await page.locator(`tr[data-job="${mine}"]`).waitFor();
  const shown = await page.locator("tbody tr").count();
  check(shown === 2, `the state filter shows alice's two succeeded jobs (${shown} rows)`);

  await page.goto(`${server}/#/jobs/${mine}`);
  await page.getByRole("heading", { level: 1, name: `Job ${mine} (hello)` }).waitFor();
  const output = page.getByLabel("Job output");
  await output.waitFor();
  await until("the job's output on its page", async () => (await output.textContent()) === "hello from alice\n", 5000);
  check(true, "a job's page shows its output");
  check((await page.getByRole("heading", { name: "Timeline" }).count()) === 1, "a job's page has its timeline");
  await page.getByRole("cell", { name: "completed" }).waitFor();
  check(true, "a job's page lists its attempts with their charges");
  await axe(page, "a tenant's job page");

  await page.goto(`${server}/#/jobs/${secret}`);
  await page.getByText("Job not found.").waitFor();
  check(true, "bob's job's URL shows \"not found\" to alice");

  // A drill of a job that saves nothing: its page tells the drill, step by step.
  const drilled = submit(alice, "--name", "drilled", "--", "sleep", "600");
  await until(`alice's job ${drilled} running`, async () => (await jobState(server, alice, drilled)) === "running");
  await post(server, alice, `/v1/jobs/${drilled}/drill`, {});
  await until("the drill's verdict", async () => (await get(server, alice, `/v1/jobs/${drilled}`)).drill?.verdict === "failed", 30000);
  await page.goto(`${server}/#/jobs/${drilled}`);
  await page.getByRole("heading", { level: 2, name: "Drill" }).waitFor();
  const told = await page.locator('.drill[data-verdict="failed"]').textContent();
  check(/Noticeattempt 1 on node-\d/.test(told) && told.includes("SIGKILL at +10 s"), `the drill's notice on the job's page (${told})`);
  check(/Next attemptattempt 2 on node-\d started at \+/.test(told), "the drill's next attempt on the job's page");
  check(/Verdictfailed: no checkpoint/.test(told), "the drill's verdict on the job's page");
  await axe(page, "a drilled job's page");
  cli(server, alice, ["cancel", `${drilled}`]);
  await until(`alice's job ${drilled} cancelled`, async () => (await jobState(server, alice, drilled)) === "cancelled");

  // ebb bill with no period is this month's, as the page's is.
  const said = cli(server, alice, ["bill"]);
  const invoice = JSON.parse(cli(server, alice, ["bill", "--json"]));
  check(invoice.lines.length > 0, "alice has a bill this month");
  await page.goto(`${server}/#/bill`);
  await page.getByRole("heading", { level: 1, name: "Bill for alice" }).waitFor();
  const amount = (key) => page.locator(`[data-amount="${key}"]`).allTextContents();
  const figure = (label) => said.split("\n").find((l) => l.startsWith(label)).trim().split(/\s+/).pop();
  for (const [key, label] of [["total", "total"], ["on-demand-equivalent", "at on-demand prices"], ["savings", "saved by running preemptible"]]) {
    check((await amount(key))[0] === `$${figure(label)}`, `the bill's ${key} is ebb bill's, to the cent ($${figure(label)})`);
  }
  const rows = await page.locator("tr[data-line]").evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  for (const row of rows) {
    const printed = said.split("\n").find((l) => l.startsWith(`${row[0]} `) && l.includes(` ${row[1]} `));
    check(printed && words(printed) === row.join(" "), `the ${row[0]} line reads as ebb bill prints it (${row.join(" ")})`);
  }
  const counts = await page.locator(".bill-counts").textContent();
  const cliCounts = said.split("\n").find((l) => / attempts?, \d+ preempted/.test(l));
  check(counts.includes(cliCounts), `the bill counts attempts, preemptions and lost work as ebb bill does (${cliCounts})`);
  await axe(page, "a tenant's bill");
  await screenshot(page, "dashboard-bill.png");
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  check(overflow <= 390, `the bill fits 390 px (${overflow})`);
  await page.setViewportSize({ width: 1280, height: 800 });

  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("Token").waitFor();
  check(await page.evaluate(() => sessionStorage.length === 0), "signing out forgets the token");
  await screenshot(page, "dashboard-sign-in.png");
  await page.context().close();
}

async function post(server, token, route, body) {
  const response = await fetch(server + route, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`POST ${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

/// The pid of `ebb up`'s agent for `node`, from /proc.
function agentPid(node) {
  const dir = path.join(dataDir, "cluster", "agents", node);
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let args;
    try {
      args = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
    } catch (_) {
      continue;
    }
    if (args[1] === "agent" && args.includes(dir)) return Number(entry);
  }
  fail(`no agent process for ${node}`);
}

/// Reservations and who borrows them, GPUs held for a waiting job and
/// reserved cells, node states, arrays, checkpoint age and live output.
async function operatorSeesEverything(browser, server, admin, problems) {
  // Every GPU free: what earlier checks left running is cancelled.
  const left = (await get(server, admin, "/v1/jobs?state=active&limit=500")).jobs.map((j) => j.id);
  for (const job of left) cli(server, admin, ["cancel", `${job}`]);
  for (const job of left) await until(`job ${job} cancelled`, async () => (await jobState(server, admin, job)) === "cancelled");
  const nodes = await get(server, admin, "/v1/nodes");
  const model = nodes[0].gpu_model;
  const owner = JSON.parse(cli(server, admin, ["tenant", "create", "owner", "--json"])).token;
  const hour = 3600 * 1000;
  const reservation = JSON.parse(cli(server, admin, ["reservation", "create", "--tenant", "owner", "--gpu-model", model,
    "--gpus", "8", "--backdate", "--start", new Date(Date.now() - hour).toISOString(), "--end", new Date(Date.now() + hour).toISOString(),
    "--json"])).id;
  const submit = (token, ...args) => JSON.parse(cli(server, token, ["submit", "--json", ...args])).id;
  const stubborn = ["--gpus", "8", "--", "sh", "-c", "trap '' TERM; sleep 600"];
  const first = submit(admin, "--name", "lender-1", ...stubborn);
  await until("the first preemptible job running", async () => (await jobState(server, admin, first)) === "running");
  const second = submit(admin, "--name", "lender-2", ...stubborn);
  await until("the second preemptible job running", async () => (await jobState(server, admin, second)) === "running");

  const page = await newPage(browser, problems);
  await signIn(page, server, admin);
  await page.getByRole("heading", { level: 1, name: "Cluster" }).waitFor();
  // 16 GPUs, 8 reserved and idle: the 8 unreserved ones hold one job, the
  // other job uses the reservation's, lent; the job that started last.
  const row = page.locator(`tr[data-reservation="${reservation}"]`);
  await until("the reservation's lent GPUs", async () => (await row.locator(".lent").textContent()) === "8", 5000);
  const [listed] = await get(server, admin, "/v1/reservations");
  check(listed.lent === 8 && listed.borrowers.length === 1 && listed.borrowers[0].job === second,
    `the API puts the lent GPUs down to the job that started last (${JSON.stringify(listed.borrowers)})`);
  check((await row.locator(".borrowers a").textContent()) === `${second}`, "the reservation's row names its borrower");
  check((await row.locator(".in-use").textContent()) === "0", "the owner uses none of it yet");
  await screenshotOf(page.locator('section[aria-labelledby="over-time-heading"]'), "dashboard-charts.png");
  await screenshotOf(page.locator('section[aria-labelledby="reservations-heading"]'), "dashboard-reservations.png");

  // The owner wants its GPUs: the borrower drains, its GPUs held for the
  // owner's job, which then runs on them as reserved.
  const own = submit(owner, "--tier", "reserved", "--gpus", "8", "--name", "owners", "--", "sleep", "600");
  const heldFor = page.locator(`li.gpu[data-held-for="${own}"]`);
  await until("the borrower's GPUs held for the owner's job", async () => (await heldFor.count()) === 8, 5000);
  // Each cell comes from its node's one record: a GPU held for the owner
  // is never shown with its borrower still running (the drain and the
  // hold are one commit). Its borrower may already have left it (held,
  // no job) before the page shows it draining, so that is waited for.
  check((await page.locator(`li.gpu[data-held-for="${own}"][data-state="preemptible"]`).count()) === 0,
    "no GPU held for the owner's job is shown with its borrower running");
  const drainingHeld = async () => (await heldFor.first().getAttribute("data-state")) === "draining" &&
    (await heldFor.first().getAttribute("title")).endsWith(`held for job ${own}`);
  await until("the held GPUs shown draining, held for the owner's job", drainingHeld, 5000);
  check(true, "the draining GPUs say which waiting job they are held for");
  const reserved = page.locator(`li.gpu[data-job="${own}"][data-state="reserved"]`);
  await until("the owner's job on 8 reserved cells", async () => (await reserved.count()) === 8, (DRAIN_WINDOW_S + 20) * 1000);
  const colour = (state) => page.locator(`.legend .gpu-${state}`).evaluate((e) => getComputedStyle(e).backgroundColor);
  check((await reserved.first().evaluate((e) => getComputedStyle(e).backgroundColor)) === (await colour("reserved")),
    "reserved cells have the legend's reserved colour");
  await until("the owner's use on the reservation's row", async () => (await row.locator(".in-use").textContent()) === "8", 5000);
  check((await row.locator(".lent").textContent()) === "0", "nothing of a reservation in use is lent");
  for (const job of [first, second, own]) cli(server, admin, ["cancel", `${job}`]);
  for (const job of [first, second, own]) {
    await until(`job ${job} cancelled`, async () => (await jobState(server, admin, job)) === "cancelled");
  }

  // Node states: drained by the operator, then lost while its agent is stopped.
  const nodeState = page.locator('tr[data-node="node-1"] td > span').first();
  cli(server, admin, ["drain", "node-1"]);
  await until("node-1 drained on the page", async () => (await nodeState.textContent()) === "drained", 5000);
  cli(server, admin, ["undrain", "node-1"]);
  await until("node-1 up again", async () => (await nodeState.textContent()) === "up", 5000);
  const agent = agentPid("node-1");
  process.kill(agent, "SIGSTOP");
  try {
    await until("node-1 lost on the page", async () => (await nodeState.textContent()) === "lost", 30000);
    check(await nodeState.evaluate((e) => e.classList.contains("node-lost")), "a lost node is marked as lost");
  } finally {
    process.kill(agent, "SIGCONT");
  }
  await until("node-1 back", async () => (await nodeState.textContent()) === "up", 30000);
  check(true, "node states show drained, lost and up again, live");
  await axe(page, "the operator's view with a reservation");

  // A GPU that falls off the bus, and one at its thermal limit: ebb up's
  // agents read their simulated GPUs' faults from ebb-data/faults/NODE.
  const faults = path.join(dataDir, "cluster", "faults", "node-0");
  writeFileSync(faults, '{"gpu":2,"kind":"xid","code":79}\n{"gpu":5,"kind":"throttled","reason":"thermal"}\n');
  const out = page.locator('tr[data-node="node-0"] li.gpu').nth(2);
  await until("GPU 2 of node-0 out of service", async () => (await out.getAttribute("data-state")) === "out", 15000);
  check((await out.getAttribute("title")) === "GPU 2: out of service: GPU 2: Xid 79 (fallen off the bus)",
    "a GPU out of service says why");
  const health = page.locator('tr[data-node="node-0"] .health li');
  await until("node-0's warning", async () => (await health.count()) === 2, 5000);
  const shown = (await health.allTextContents()).map(words);
  const said = cli(server, admin, ["nodes"]).split("\n").filter((l) => l.startsWith("  node-0: ")).map(words);
  check(shown[0].startsWith("GPU 2: Xid 79 (fallen off the bus) (since ") && said[0].includes("GPU 2: Xid 79 (fallen off the bus)"),
    `the GPU out and why, as ebb nodes says it (${shown[0]})`);
  check(shown[1] === "warning: GPU 5: throttled at its thermal limit" && said[1] === `node-0: ${shown[1]}`,
    `the warning, as ebb nodes says it (${said[1]})`);
  check((await page.locator('tr[data-node="node-0"] li.gpu[data-state="idle"]').count()) === 7, "the other GPUs stay idle");
  await axe(page, "the operator's view with a GPU out of service");
  await screenshotOf(page.locator('section[aria-labelledby="nodes-heading"]'), "dashboard-gpu-out.png");
  writeFileSync(faults, "");
  await until("GPU 2 back once its fault cleared", async () => (await out.getAttribute("data-state")) === "idle", 15000);
  check((await health.count()) === 0, "nothing is left on node-0's health once it cleared");

  // An array collapsed to one row with its progress.
  const array = JSON.parse(cli(server, admin, ["submit", "--json", "--array", "0-3", "--name", "quad", "--", "true"]));
  await page.goto(`${server}/#/jobs`);
  const bar = page.locator(`tr[data-job="${array.id}"] progress`);
  await until("the array's progress, all done", async () =>
    (await bar.count()) === 1 && (await bar.getAttribute("aria-label")) === `array ${array.id}: 4 of 4 done`, 20000);
  check((await page.locator("tbody tr", { hasText: "quad" }).count()) === 1, "an array is one row, with its progress");
  // A cancelled array says so, rather than showing an empty bar; a job
  // without a name shows its command; an operator sees whose jobs they are.
  const stopped = JSON.parse(cli(server, admin, ["submit", "--json", "--array", "0-9", "--", "sleep", "600"]));
  cli(server, admin, ["cancel", "--array", `${stopped.id}`]);
  const stoppedRow = page.locator(`tr[data-job="${stopped.id}"]`);
  await until("the cancelled array's row", async () => (await stoppedRow.count()) === 1 && (await stoppedRow.textContent()).includes("0/10 done, 10 cancelled"), 20000);
  check((await stoppedRow.locator("progress").count()) === 0, "a cancelled array reads \"0/10 done, 10 cancelled\", with no empty bar");
  const unnamed = submit(admin, "--", "sleep", "600");
  const unnamedRow = page.locator(`tr[data-job="${unnamed}"]`);
  await until("the unnamed job's row", async () => (await unnamedRow.count()) === 1, 5000);
  const jobsTable = cli(server, admin, ["jobs"]);
  const cliArray = cliRow(jobsTable, `${stopped.id}-${stopped.id + 9}`);
  check((await stoppedRow.locator("td.name").textContent()) === cliArray[1], `an array is named as ebb jobs names it (${cliArray[1]})`);
  check((await unnamedRow.locator("td.command").textContent()) === "sleep 600"
    && cliRow(jobsTable, `${unnamed}`).slice(1, 3).join(" ") === "sleep 600", "a job without a name shows its command, as ebb jobs does");
  check((await page.locator("thead th").allTextContents()).includes("Tenant") && (await unnamedRow.locator("td.tenant").textContent()) === "default",
    "an operator's jobs page has each job's tenant");
  cli(server, admin, ["cancel", `${unnamed}`]);
  await page.setViewportSize({ width: 390, height: 844 });
  check((await page.evaluate(() => document.documentElement.scrollWidth)) <= 390, "the jobs page fits 390 px");
  await page.setViewportSize({ width: 1280, height: 800 });

  // A job's checkpoint age, and output arriving while the page is open.
  const script = `${JSON.stringify(process.execPath)} -e 'fetch(process.env.EBB_METADATA_URL + "/ebb/v1/checkpoint",` +
    ` {method: "POST", body: JSON.stringify({step: 7, seconds: 1.5})}).then((r) => process.exit(r.ok ? 0 : 1))'` +
    " && echo first; sleep 3; echo second; sleep 600";
  const talker = submit(admin, "--name", "talker", "--", "sh", "-c", script);
  await page.goto(`${server}/#/jobs/${talker}`);
  await page.getByRole("heading", { level: 1, name: `Job ${talker} (talker)` }).waitFor();
  const output = page.getByLabel("Job output");
  await until("the first line of output", async () => (await output.textContent()) === "first\n", 15000);
  await page.evaluate(() => { window.notReloaded = true; });
  await until("the second line, followed", async () => (await output.textContent()) === "first\nsecond\n", 10000);
  check(await page.evaluate(() => window.notReloaded === true), "output arrives on an open job page as the job writes it");
  await until("the checkpoint's age", async () =>
    /^\d+ s ago \(attempt 1, step 7, took 1.5s\)$/.test(await page.locator("dt:text-is('Last checkpoint') + dd").textContent().catch(() => "")), 5000);
  check(true, "a job's page shows its last checkpoint's age and step");
  check(await page.locator("dt:text-is('Recommended interval')").count() === 1, "and the recommended checkpoint interval");
  const run = JSON.parse(cli(server, admin, ["show", `${talker}`, "--json"])).run_id;
  check(/^ebb-\d+-[0-9a-z]+-[0-9a-z]+$/.test(run) &&
    (await page.locator("dt:text-is('Run') + dd").textContent()).startsWith(`${run} (`), "and its run id, as the CLI gives it");
  await page.setViewportSize({ width: 390, height: 844 });
  check((await page.evaluate(() => document.documentElement.scrollWidth)) <= 390, "a job's page fits 390 px");
  cli(server, admin, ["cancel", `${talker}`]);
  await page.context().close();
}

/// A tenant's jobs page by page, filtered by name and tier, and its bill for
/// another period.
async function tenantPagesAndFilters(browser, server, admin, problems) {
  const token = JSON.parse(cli(server, admin, ["tenant", "create", "pager", "--json"])).token;
  const ids = [];
  for (let i = 0; i < 60; i++) {
    const tier = i % 10 === 0 ? "on-demand" : "preemptible";
    const name = i % 2 === 0 ? `batch-${i}` : `other-${i}`;
    ids.push((await post(server, token, "/v1/jobs", { argv: ["true"], name, tier })).id);
  }
  // Paged once they have all ended: a job that starts or ends redraws the
  // list live, and a click on "Older →" as the list is redrawn beneath it
  // can find no link there.
  await until("the pager's jobs to end", async () =>
    (await get(server, token, "/v1/jobs?state=active&limit=1")).jobs.length === 0, 60000);
  const page = await newPage(browser, problems);
  await signIn(page, server, token);
  await page.getByRole("heading", { level: 1, name: "My jobs" }).waitFor();
  const shown = () => page.locator("tbody tr").evaluateAll((rows) => rows.map((r) => Number(r.dataset.job)));
  const newest = [...ids].reverse();
  await until("the first page", async () => JSON.stringify(await shown()) === JSON.stringify(newest.slice(0, 50)), 5000);
  check(true, "the first page is the newest 50 jobs");
  await page.getByRole("link", { name: "Older →" }).click();
  await until("the second page", async () => JSON.stringify(await shown()) === JSON.stringify(newest.slice(50)), 5000);
  check((await page.getByRole("link", { name: "Older →" }).count()) === 0, "the last page has no older page");
  await page.getByRole("link", { name: "← Newer" }).click();
  await until("the first page again", async () => JSON.stringify(await shown()) === JSON.stringify(newest.slice(0, 50)), 5000);
  check(true, "paging older and back newer shows every job once, in order");

  await page.getByLabel("Name contains").fill("batch");
  await page.getByRole("button", { name: "Filter" }).click();
  const batch = newest.filter((_, i) => (59 - i) % 2 === 0);
  await until("the name filter", async () => JSON.stringify(await shown()) === JSON.stringify(batch), 5000);
  check(true, `the name filter shows the ${batch.length} jobs whose names contain "batch"`);
  await page.getByLabel("Name contains").fill("");
  await page.getByLabel("Tier").selectOption("on-demand");
  await page.getByRole("button", { name: "Filter" }).click();
  const onDemand = newest.filter((_, i) => (59 - i) % 10 === 0);
  await until("the tier filter", async () => JSON.stringify(await shown()) === JSON.stringify(onDemand), 5000);
  check(true, `the tier filter shows the ${onDemand.length} on-demand jobs`);
  await axe(page, "a filtered jobs page");

  // The bill for a period chosen in its fields.
  await page.goto(`${server}/#/bill`);
  await page.getByRole("heading", { level: 1, name: "Bill for pager" }).waitFor();
  await page.getByLabel("From").fill("2025-03-01");
  await page.getByLabel("To (exclusive)").fill("2025-04-01");
  await page.getByRole("button", { name: "Show" }).click();
  await page.waitForURL(/from=2025-03-01&to=2025-04-01/);
  await page.getByText("No usage in this period.").waitFor();
  const invoice = JSON.parse(cli(server, token, ["bill", "--json", "--from", "2025-03-01", "--to", "2025-04-01"]));
  check((await page.locator('[data-amount="total"]').textContent()) === `$${cents(invoice.total_micro_usd)}`,
    `the bill for a chosen period is ebb bill's ($${cents(invoice.total_micro_usd)})`);
  await page.context().close();
}

let browser = null;
try {
  const { url, admin } = await startCluster();
  console.log(`dashboard: cluster at ${url}`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  const problems = [];
  await operatorSeesPreemption(browser, url, admin, problems);
  await tenantSeesOnlyItsOwn(browser, url, admin, problems);
  await operatorSeesEverything(browser, url, admin, problems);
  await tenantPagesAndFilters(browser, url, admin, problems);
  for (const p of problems) console.error(`dashboard: ${p}`);
  check(problems.length === 0, "no script errors or content security policy violations");
  console.log("dashboard: all checks passed");
} catch (error) {
  process.exitCode = 1;
  console.error(`dashboard: ${error.stack || error}`);
} finally {
  if (browser) await browser.close();
  await stopCluster();
  if (process.exitCode) console.error(`dashboard: kept ${dataDir} (cluster logs)`);
  else rmSync(dataDir, { recursive: true, force: true });
}
