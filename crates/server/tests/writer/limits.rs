//! What one tenant may ask of the writer: its limits on jobs and running
//! jobs, the restart back-off, paging. The writer (`Engine`) is driven
//! directly at explicit instants, with one modelled node speaking the agent
//! protocol, so every figure here is exact.

use ebb_api::{Action, AgentEvent, AttemptRef, JobSubmission, PendingReason, StartAttempt};
use ebb_core::{Attempt, JobId, Span, TenantId};
use ebb_server::billing::Pricing;
use ebb_server::engine::{EngineConfig, JobQuery, JobState, Msg};
use ebb_server::store::Scope;
use ebb_server::{Limits, Principal};
use tokio::sync::oneshot;

use crate::harness::{exited, TestEnv};

/// One tenant's writer: the harness's, configured for these tests, with
/// the node `node-0` modelled and the attempts it runs.
struct World {
    env: TestEnv,
    tenant: Principal,
    /// Attempts the modelled node runs.
    running: Vec<AttemptRef>,
}

impl World {
    fn new(name: &str, limits: Limits) -> World {
        World::keeping(name, limits, Span(0))
    }

    /// As `new`, finished jobs' records kept in memory `keep_finished`.
    fn keeping(name: &str, limits: Limits, keep_finished: Span) -> World {
        let mut env = TestEnv::new(&format!("limits-{name}"));
        env.config = EngineConfig {
            drain_window: Span(30_000),
            heartbeat_timeout: Span(3_600_000),
            keep_finished,
            pricing: Pricing { prices: Vec::new(), default_price: 2_000_000, discount_bps: 5_000 },
            limits,
            ..env.config.clone()
        };
        env.restart();
        let tenant = Principal::tenant(Scope::Tenant, TenantId(2), "acme");
        let mut world = World { env, tenant, running: Vec::new() };
        let created = world.call(|reply| Msg::CreateTenant { name: "acme".into(), reply });
        assert!(created.is_ok());
        world.register();
        world
    }

    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        self.env.call(make)
    }

    /// `node-0` (re)registers, saying what it runs.
    fn register(&mut self) {
        let running = self.running.clone();
        self.env.register("node-0", running, Vec::new());
    }

    /// A server restart from the same file.
    fn restart(&mut self) {
        self.env.restart();
        self.register();
    }

    /// The ids a submission made, as the API gives them.
    fn submit(&mut self, spec: JobSubmission) -> Result<Vec<u64>, ebb_server::Refusal> {
        let principal = self.tenant.clone();
        let ids = self.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply })?;
        Ok(ids.into_iter().map(|id| id.0).collect())
    }

    /// The starts the node is told of now.
    fn starts(&mut self) -> Vec<StartAttempt> {
        let commands = self.env.commands("node-0");
        commands
            .into_iter()
            .filter_map(|action| match action {
                Action::Start(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    fn report(&mut self, events: Vec<AgentEvent>) {
        self.env.report("node-0", events);
    }

    fn started(&mut self, attempt: AttemptRef) {
        self.running.push(attempt);
        let at_ms = self.env.now;
        self.report(vec![AgentEvent::Started { attempt, pid: 1, at_ms }]);
    }

    /// The attempt runs for `ms` (if it has not started yet, from now) and
    /// exits with `code`.
    fn run(&mut self, attempt: AttemptRef, ms: u64, code: i32) {
        if !self.running.contains(&attempt) {
            self.started(attempt);
        }
        self.running.retain(|a| *a != attempt);
        self.env.now += ms;
        let at_ms = self.env.now;
        self.report(vec![exited(attempt, code, at_ms)]);
    }

    fn job(&mut self, id: u64) -> ebb_api::Job {
        let principal = self.tenant.clone();
        self.call(|reply| Msg::Job { principal, id: JobId(id), reply }).unwrap()
    }

    /// Moves time on in ticks until the node is told to start something.
    fn next_start(&mut self, limit_ms: u64) -> (StartAttempt, u64) {
        let from = self.env.now;
        loop {
            let starts = self.starts();
            if let Some(s) = starts.into_iter().next() {
                return (s, self.env.now - from);
            }
            assert!(self.env.now - from < limit_ms, "nothing started within {limit_ms} ms");
            self.env.now += 100;
            self.env.call_quiet(Msg::Tick);
        }
    }
}

fn job(argv: &[&str]) -> JobSubmission {
    JobSubmission { argv: argv.iter().map(|a| a.to_string()).collect(), ..JobSubmission::default() }
}

/// `--restart always -- true` looped at 140 attempts a second for ever: now
/// each quick exit in a row doubles the wait (1 s, 2 s, 4 s, ...), the job
/// says why it waits, a server restart keeps the back-off, and a run of
/// ten seconds or more starts the count again.
#[test]
fn a_service_that_keeps_exiting_quickly_backs_off_exponentially() {
    let mut w = World::new("backoff", Limits::default());
    let id = w.submit(JobSubmission { restart: Some("always".into()), ..job(&["true"]) }).unwrap()[0];
    let (mut start, waited) = w.next_start(1_000);
    assert_eq!(waited, 0, "the first run starts at once");
    let mut waits = Vec::new();
    for run in 1..=5 {
        w.run(start.attempt, 50, 0);
        if run == 3 {
            let shown = w.job(id);
            assert_eq!(shown.state, "queued");
            assert_eq!(shown.pending_reason, Some(PendingReason::Backoff));
            let why = shown.pending_detail.expect("a waiting reason");
            assert!(why.starts_with("restart back-off until") && why.contains("3 quick exits"), "{why}");
            w.restart();
        }
        let (next, waited) = w.next_start(600_000);
        waits.push(waited);
        start = next;
    }
    assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000]);
    // A run of ten seconds or more: the next restart is immediate.
    w.run(start.attempt, 10_000, 1);
    let (start, waited) = w.next_start(1_000);
    assert_eq!(waited, 0);
    assert_eq!(start.attempt.attempt, Attempt(7));
    let job = w.job(id);
    assert_eq!((job.retries, job.preemptions), (0, 0), "back-off counts as neither");
}

#[test]
fn a_tenant_at_its_running_limit_waits_its_turn_in_submission_order() {
    let limits = Limits { max_running_jobs: 2, ..Limits::default() };
    let mut w = World::new("running", limits);
    let ids: Vec<u64> = (0..4).map(|i| w.submit(job(&["sleep", &i.to_string()])).unwrap()[0]).collect();
    let started: Vec<AttemptRef> = w.starts().iter().map(|s| s.attempt).collect();
    assert_eq!(
        started.iter().map(|a| a.job.0).collect::<Vec<_>>(),
        ids[..2],
        "8 GPUs free, but only 2 jobs admitted"
    );
    for attempt in started {
        w.started(attempt);
    }
    let waiting = w.job(ids[2]);
    assert_eq!(waiting.state, "queued");
    assert_eq!(waiting.pending_reason, Some(PendingReason::TenantLimit));
    assert!(waiting.pending_detail.unwrap().contains("has 2 jobs admitted, its limit (ebb tenant limits"));
    // The limit survives a restart; an ended job admits the oldest waiting one.
    w.restart();
    assert!(w.starts().is_empty());
    w.run(AttemptRef { job: JobId(ids[0]), attempt: Attempt(1) }, 1_000, 0);
    let started: Vec<u64> = w.starts().iter().map(|s| s.attempt.job.0).collect();
    assert_eq!(started, [ids[2]]);
    assert!(w.job(ids[2]).pending_reason.is_none());
    // Cancelling a waiting job frees nothing and loses nothing.
    let principal = w.tenant.clone();
    let cancelled =
        w.call(|reply| Msg::Cancel { principal, id: JobId(ids[3]), req: Default::default(), reply }).unwrap();
    assert_eq!(cancelled.state, "cancelled");
    w.run(AttemptRef { job: JobId(ids[1]), attempt: Attempt(1) }, 1_000, 0);
    assert!(w.starts().is_empty());
}

#[test]
fn a_tenant_over_its_job_or_byte_limits_is_refused_and_nothing_is_stored() {
    let limits = Limits { max_jobs: 5, max_stored_bytes: 4_000, ..Limits::default() };
    let mut w = World::new("jobs", limits);
    let array = JobSubmission { array: Some("0-3".into()), ..job(&["true"]) };
    assert_eq!(w.submit(array.clone()).unwrap().len(), 4);
    let err = w.submit(array).unwrap_err();
    assert_eq!(ebb_server::http::status(err.kind), 429);
    assert!(
        err.message.contains("4 unfinished jobs, and this submission adds 4: over the limit of 5"),
        "{}",
        err.message
    );
    let big = job(&["echo", &"x".repeat(5_000)]);
    let err = w.submit(big).unwrap_err();
    assert_eq!(ebb_server::http::status(err.kind), 429);
    assert!(err.message.contains("--max-stored-bytes-per-tenant"), "{}", err.message);
    let principal = w.tenant.clone();
    let page = w
        .call(|reply| Msg::Jobs {
            principal,
            query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
            reply,
        })
        .unwrap();
    assert_eq!(page.jobs.len(), 4, "the refused submissions left nothing behind");
}

#[test]
fn jobs_are_listed_a_page_at_a_time() {
    let mut w = World::new("paging", Limits::default());
    let ids = w.submit(JobSubmission { array: Some("0-6".into()), ..job(&["true"]) }).unwrap();
    let mut seen = Vec::new();
    let mut cursor = 0;
    loop {
        let principal = w.tenant.clone();
        let page = w
            .call(|reply| Msg::Jobs {
                principal,
                query: ebb_server::engine::JobQuery { cursor: Some(cursor), limit: 3, ..Default::default() },
                reply,
            })
            .unwrap();
        assert!(page.jobs.len() <= 3);
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next_cursor {
            Some(next) => cursor = next,
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[test]
fn newest_first_pages_with_filters_and_collapsed_arrays_list_each_entry_once() {
    let mut w = World::new("paging-filters", Limits::default());
    let single = w.submit(JobSubmission { name: Some("alpha".into()), ..job(&["true"]) }).unwrap();
    let array =
        w.submit(JobSubmission { array: Some("0-4".into()), name: Some("sweep".into()), ..job(&["true"]) });
    let array = array.unwrap();
    let on_demand = w.submit(JobSubmission { tier: Some("on-demand".into()), ..job(&["true"]) }).unwrap();
    // The node's 8 GPUs are taken: this one waits.
    let waiting = w.submit(JobSubmission { gpus: Some(8), ..job(&["true"]) }).unwrap();
    let page = |w: &mut World, query: JobQuery| -> Vec<ebb_api::Job> {
        let mut all = Vec::new();
        let mut query = JobQuery { limit: 2, ..query };
        loop {
            let principal = w.tenant.clone();
            let q = query.clone();
            let page = w.call(|reply| Msg::Jobs { principal, query: q, reply }).unwrap();
            assert!(page.jobs.len() <= 2);
            all.extend(page.jobs);
            match page.next_cursor {
                Some(next) => query.cursor = Some(next),
                None => return all,
            }
        }
    };
    // Newest first, an array as one entry with its progress.
    let collapsed = page(&mut w, JobQuery { desc: true, collapse: true, ..Default::default() });
    let ids: Vec<u64> = collapsed.iter().map(|j| j.id).collect();
    assert_eq!(ids, [waiting[0], on_demand[0], array[0], single[0]]);
    let progress = collapsed[2].progress.as_ref().expect("a collapsed array has its progress");
    assert_eq!((progress.done, progress.total), (0, 5));
    assert!(progress.tasks.is_empty(), "a listing does not carry every task");
    // Expanded, every job once, newest first.
    let expanded = page(&mut w, JobQuery { desc: true, ..Default::default() });
    let mut want: Vec<u64> = single.iter().chain(&array).chain(&on_demand).chain(&waiting).copied().collect();
    want.reverse();
    assert_eq!(expanded.iter().map(|j| j.id).collect::<Vec<_>>(), want);
    // Filters: tier, name, state.
    let tier = page(&mut w, JobQuery { tier: Some(ebb_core::Tier::OnDemand), ..Default::default() });
    assert_eq!(tier.iter().map(|j| j.id).collect::<Vec<_>>(), on_demand);
    let named = page(&mut w, JobQuery { name: Some("swe".into()), collapse: true, ..Default::default() });
    assert_eq!(named.iter().map(|j| j.id).collect::<Vec<_>>(), [array[0]]);
    for state in JobState::ALL {
        let listed = page(&mut w, JobQuery { states: Some(vec![state]), ..Default::default() });
        let want: Vec<u64> =
            expanded.iter().rev().filter(|j| j.state == state.as_str()).map(|j| j.id).collect();
        assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), want, "{}", state.as_str());
    }
    let states: Vec<&str> = expanded.iter().map(|j| j.state.as_str()).collect();
    assert!(states.contains(&"queued") && states.contains(&"starting"), "{states:?}");
}

#[test]
fn an_operator_sets_one_tenants_limits_and_raising_them_admits_at_once() {
    let mut w = World::new("tenant-limits", Limits::default());
    let admin = Principal::tenant(Scope::Admin, TenantId(1), "default");
    let set = |w: &mut World, who: &Principal, limits: ebb_api::TenantLimits| {
        let principal = who.clone();
        w.call(|reply| Msg::TenantLimits { principal, tenant: "acme".into(), set: Some(limits), reply })
    };
    let one = ebb_api::TenantLimits { max_running_jobs: Some(1), ..Default::default() };
    let tenant = w.tenant.clone();
    assert_eq!(
        set(&mut w, &tenant, one.clone()).unwrap_err().kind,
        ebb_server::Refused::Forbidden,
        "a tenant cannot raise its own"
    );
    let usage = set(&mut w, &admin, one).unwrap();
    assert_eq!((usage.max_running_jobs, usage.max_jobs), (1, Limits::default().max_jobs));
    let ids: Vec<u64> = (0..3).map(|_| w.submit(job(&["true"])).unwrap()[0]).collect();
    assert_eq!(w.starts().len(), 1);
    let principal = w.tenant.clone();
    let usage =
        w.call(|reply| Msg::TenantLimits { principal, tenant: "acme".into(), set: None, reply }).unwrap();
    assert_eq!((usage.jobs, usage.admitted, usage.waiting), (3, 1, 2));
    // Kept across a restart; raised, the waiting jobs start at once.
    w.restart();
    assert_eq!(w.job(ids[1]).pending_reason, Some(PendingReason::TenantLimit));
    let three = ebb_api::TenantLimits { max_running_jobs: Some(3), ..Default::default() };
    set(&mut w, &admin, three).unwrap();
    let started: Vec<u64> = w.starts().iter().map(|s| s.attempt.job.0).collect();
    assert!(started.contains(&ids[1]) && started.contains(&ids[2]), "{started:?}");
    let zero = ebb_api::TenantLimits { max_jobs: Some(0), ..Default::default() };
    assert_eq!(set(&mut w, &admin, zero).unwrap_err().message, "max_jobs: must be at least 1, got 0");
}

/// `argv = ["true"] + [""] * 480000` was counted as 480 KB and cost the
/// server ~14.5 MB; 80 such jobs took it from 28 MB to 1.16 GB, and one
/// `GET /v1/jobs?limit=500` answered 115 MB. Now that command is over
/// `--max-command-bytes` (it is 4.3 MB at `execve`, each argument's
/// pointer counted), an argument costs the tenant what the server keeps
/// of it, and a page of jobs stops at its byte bound with a cursor for
/// the rest.
#[test]
fn many_small_arguments_cost_what_is_kept_of_them_and_a_page_is_bounded_in_bytes() {
    let many = |n: usize| JobSubmission {
        argv: std::iter::once("true".to_string()).chain(std::iter::repeat_n(String::new(), n)).collect(),
        ..JobSubmission::default()
    };
    let mut w = World::new("argv", Limits::default());
    let err = w.submit(many(480_000)).unwrap_err();
    assert_eq!(ebb_server::http::status(err.kind), 422, "{}", err.message);
    assert!(err.message.contains("--max-command-bytes"), "{}", err.message);

    // 100,000 empty arguments fit a command (900 KB at execve) and cost
    // 4.8 MB to keep: a tenant allowed 16 MiB keeps three such jobs.
    let limits = Limits { max_stored_bytes: 16 << 20, ..Limits::default() };
    let mut w = World::new("argv-stored", limits);
    let mut kept = 0;
    let err = loop {
        match w.submit(many(100_000)) {
            Ok(_) => kept += 1,
            Err(e) => break e,
        }
        assert!(kept <= 10, "counted as their bytes alone");
    };
    assert_eq!((kept, ebb_server::http::status(err.kind)), (3, 429), "{}", err.message);
    assert!(err.message.contains("--max-stored-bytes-per-tenant"), "{}", err.message);

    // A job that has ended still costs its bytes while the server keeps
    // its record (`--keep-finished`): jobs that fail at once cannot fill
    // memory the limit does not see.
    let limits = Limits { max_stored_bytes: 16 << 20, ..Limits::default() };
    let mut w = World::keeping("argv-finished", limits, Span(60_000));
    for _ in 0..3 {
        w.submit(many(100_000)).unwrap();
    }
    for start in w.starts() {
        w.run(start.attempt, 10, 1);
    }
    assert_eq!(
        w.submit(many(100_000)).unwrap_err().kind,
        ebb_server::Refused::OverLimit,
        "the failed jobs' records are still held"
    );
    w.env.now += 61_000;
    w.env.call_quiet(Msg::Tick);
    w.register();
    assert!(w.submit(many(100_000)).is_ok(), "their records left memory, and their bytes with them");

    // A hundred jobs of 100 KB each: no page is more than its bound.
    let mut w = World::new("argv-page", Limits::default());
    let big = "x".repeat(100_000);
    let ids: Vec<u64> = (0..100).map(|_| w.submit(job(&["echo", &big])).unwrap()[0]).collect();
    let (mut seen, mut pages, mut cursor) = (Vec::new(), 0, 0);
    loop {
        let principal = w.tenant.clone();
        let query = JobQuery { cursor: Some(cursor), limit: 500, ..Default::default() };
        let page = w.call(|reply| Msg::Jobs { principal, query, reply }).unwrap();
        let bytes = serde_json::to_vec(&page).unwrap().len();
        assert!(bytes < 10 << 20, "a page of {bytes} bytes");
        pages += 1;
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next_cursor {
            Some(next) => cursor = next,
            None => break,
        }
    }
    assert_eq!(seen, ids, "every job once, in order");
    assert!(pages >= 2, "one page held all of them");
}
