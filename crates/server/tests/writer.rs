//! The writer's durability contract, driven directly: a `TestEnv` owns an
//! `Engine` over a store that can be told to fail one write, and speaks for
//! fake agents (register, poll, report) as `ebb agent` does. Each test
//! drives batches at explicit instants and reopens the store as a
//! restarted server would.

mod pg;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ebb_api::{
    Action, AgentEvent, AttemptRef, CancelRequest, EventKind, JobEvent, JobSubmission, Register, Report,
    ReportId, StartAttempt, StopNotice,
};
use ebb_server::engine::{Engine, EngineConfig, Msg};
use ebb_server::store::{
    FinishedCount, JobColumns, JobPageQuery, LogState, NodeRow, PriceRow, ReservationRow, Scope, Snapshot,
    SqliteStore, Store, StoreError, TaskRow, TenantRow, TokenRow, UsageRow,
};
use ebb_server::Principal;
use serde::Serialize;
use tokio::sync::oneshot;

/// An instant far from the wall clock of any machine running this.
const T0: u64 = 1_900_000_000_000;

/// A store that fails the `n`-th call (from 1) of one write once armed.
struct Faulty<S: Store> {
    inner: S,
    armed: Arc<Mutex<Option<(&'static str, u32)>>>,
}

impl<S: Store> Faulty<S> {
    fn trip(&self, op: &'static str) -> Result<(), StoreError> {
        let mut armed = self.armed.lock().unwrap();
        match &mut *armed {
            Some((name, n)) if *name == op => {
                *n -= 1;
                if *n == 0 {
                    *armed = None;
                    return Err(StoreError(format!("injected failure of {op}")));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl<S: Store> Store for Faulty<S> {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.inner.begin()
    }
    fn commit(&mut self) -> Result<(), StoreError> {
        self.trip("commit")?;
        self.inner.commit()
    }
    fn rollback(&mut self) -> Result<(), StoreError> {
        self.inner.rollback()
    }
    fn load<J: ebb_server::store::JobRow>(&mut self) -> Result<Snapshot<J>, StoreError> {
        self.inner.load()
    }
    fn put_tenant(&mut self, tenant: &TenantRow) -> Result<(), StoreError> {
        self.trip("put_tenant")?;
        self.inner.put_tenant(tenant)
    }
    fn put_token(&mut self, token: &TokenRow) -> Result<(), StoreError> {
        self.trip("put_token")?;
        self.inner.put_token(token)
    }
    fn delete_token(&mut self, hash: &str) -> Result<(), StoreError> {
        self.trip("delete_token")?;
        self.inner.delete_token(hash)
    }
    fn put_node(&mut self, node: &NodeRow) -> Result<(), StoreError> {
        self.trip("put_node")?;
        self.inner.put_node(node)
    }
    fn put_job<J: Serialize>(&mut self, id: u64, columns: &JobColumns, job: &J) -> Result<(), StoreError> {
        self.trip("put_job")?;
        self.inner.put_job(id, columns, job)
    }
    fn job<J: ebb_server::store::JobRow>(&mut self, id: u64) -> Result<Option<J>, StoreError> {
        self.inner.job(id)
    }
    fn job_page<J: ebb_server::store::JobRow>(
        &mut self,
        query: &JobPageQuery,
    ) -> Result<ebb_server::store::JobRows<J>, StoreError> {
        self.inner.job_page(query)
    }
    fn array_states(&mut self, array: u64) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.array_states(array)
    }
    fn array_tasks(&mut self, array: u64) -> Result<Vec<TaskRow>, StoreError> {
        self.inner.array_tasks(array)
    }
    fn finished_counts(&mut self) -> Result<Vec<FinishedCount>, StoreError> {
        self.inner.finished_counts()
    }
    fn add_event(&mut self, job: u64, event: &JobEvent) -> Result<(), StoreError> {
        self.trip("add_event")?;
        self.inner.add_event(job, event)
    }
    fn events(&mut self, job: u64) -> Result<Vec<JobEvent>, StoreError> {
        self.inner.events(job)
    }
    fn max_job_id(&mut self) -> Result<u64, StoreError> {
        self.inner.max_job_id()
    }
    fn heard(&mut self, node: &str, at_ms: u64) -> Result<(), StoreError> {
        self.trip("heard")?;
        self.inner.heard(node, at_ms)
    }
    fn put_price(&mut self, price: &PriceRow) -> Result<(), StoreError> {
        self.trip("put_price")?;
        self.inner.put_price(price)
    }
    fn put_reservation(&mut self, reservation: &ReservationRow) -> Result<(), StoreError> {
        self.trip("put_reservation")?;
        self.inner.put_reservation(reservation)
    }
    fn delete_reservation(&mut self, id: u64) -> Result<(), StoreError> {
        self.trip("delete_reservation")?;
        self.inner.delete_reservation(id)
    }
    fn add_usage(&mut self, usage: &UsageRow) -> Result<(), StoreError> {
        self.trip("add_usage")?;
        self.inner.add_usage(usage)
    }
    fn usage(&mut self, tenant: Option<u32>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>, StoreError> {
        self.inner.usage(tenant, from_ms, to_ms)
    }
    fn job_usage(&mut self, job: u64) -> Result<Vec<UsageRow>, StoreError> {
        self.inner.job_usage(job)
    }
    fn put_tenant_limits(&mut self, tenant: u32, limits: &ebb_api::TenantLimits) -> Result<(), StoreError> {
        self.trip("put_tenant_limits")?;
        self.inner.put_tenant_limits(tenant, limits)
    }
    fn put_registry_login(
        &mut self,
        tenant: u32,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<(), StoreError> {
        self.trip("put_registry_login")?;
        self.inner.put_registry_login(tenant, registry, login)
    }
    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Result<(), StoreError> {
        self.trip("put_reclaim")?;
        self.inner.put_reclaim(model, limit)
    }
    fn last_report(&mut self, node: &str) -> Result<Option<ReportId>, StoreError> {
        self.inner.last_report(node)
    }
    fn put_last_report(&mut self, node: &str, id: ReportId) -> Result<(), StoreError> {
        self.trip("put_last_report")?;
        self.inner.put_last_report(node, id)
    }
    fn log_state(&mut self, job: u64) -> Result<Option<LogState>, StoreError> {
        self.inner.log_state(job)
    }
    fn put_log_state(&mut self, job: u64, state: &LogState) -> Result<(), StoreError> {
        self.trip("put_log_state")?;
        self.inner.put_log_state(job, state)
    }
    fn put_output(
        &mut self,
        job: u64,
        offset: u64,
        data: &[u8],
        node: Option<&str>,
    ) -> Result<(), StoreError> {
        self.trip("put_output")?;
        self.inner.put_output(job, offset, data, node)
    }
    fn output_sources(&mut self, job: u64, from: u64, to: u64) -> Result<Vec<(u64, String)>, StoreError> {
        self.inner.output_sources(job, from, to)
    }
    fn output(&mut self, job: u64, from: u64, to: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.output(job, from, to)
    }
    fn output_len(&mut self, job: u64) -> Result<u64, StoreError> {
        self.inner.output_len(job)
    }
}

/// One fake agent's view of its command stream.
struct Agent {
    epoch: u64,
    after: u64,
}

/// The writer, its store's directory and the fake agents.
/// Where the writer keeps its state: opened afresh at every (re)start.
type Open<S> = Box<dyn Fn() -> S>;

struct TestEnv<S: Store = SqliteStore> {
    dir: PathBuf,
    open_store: Open<S>,
    engine: Option<Engine<Faulty<S>>>,
    armed: Arc<Mutex<Option<(&'static str, u32)>>>,
    agents: BTreeMap<String, Agent>,
    admin: Principal,
    now: u64,
    /// The operator's rules for images, at the next (re)start.
    images: ebb_server::Images,
}

fn config(dir: &Path) -> EngineConfig {
    EngineConfig::for_tests(dir)
}

impl TestEnv<SqliteStore> {
    /// A writer on SQLite, a file in the test's directory.
    fn new(name: &str) -> TestEnv<SqliteStore> {
        TestEnv::with_store(name, |dir| {
            let path = dir.join("ebb.db");
            Box::new(move || SqliteStore::open(&path).unwrap())
        })
    }
}

impl<S: Store> TestEnv<S> {
    fn with_store(name: &str, open_store: impl FnOnce(&Path) -> Open<S>) -> TestEnv<S> {
        let dir = std::env::temp_dir().join(format!("ebb-writer-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let open_store = open_store(&dir);
        let mut env = TestEnv {
            dir,
            open_store,
            engine: None,
            armed: Arc::new(Mutex::new(None)),
            agents: BTreeMap::new(),
            admin: Principal::tenant(Scope::Admin, 1, "default"),
            now: T0,
            images: Default::default(),
        };
        env.restart();
        env
    }

    /// A fresh writer over the same database, as after `kill -9`: the
    /// agents must register again.
    fn restart(&mut self) {
        self.engine = None;
        let inner = (self.open_store)();
        let store = Faulty { inner, armed: self.armed.clone() };
        let tokens = Arc::new(RwLock::new(HashMap::new()));
        let config = EngineConfig { images: self.images.clone(), ..config(&self.dir) };
        let (engine, _) = Engine::open(store, config, tokens, self.now).map_err(|e| e.message).unwrap();
        self.engine = Some(engine);
    }

    fn engine(&mut self) -> &mut Engine<Faulty<S>> {
        self.engine.as_mut().expect("running")
    }

    /// Fails the `n`-th `op` from now on.
    fn fail(&self, op: &'static str, n: u32) {
        *self.armed.lock().unwrap() = Some((op, n));
    }

    /// One batch of one message, answered.
    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        let (tx, mut rx) = oneshot::channel();
        let now = self.now;
        self.engine().batch(vec![make(tx)], now).unwrap();
        self.engine().sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
        rx.try_recv().expect("answered after the commit")
    }

    fn register(&mut self, node: &str, running: Vec<AttemptRef>, unreported: Vec<AgentEvent>) {
        let reg = Register {
            node: node.into(),
            gpu_model: "H100".into(),
            gpus: 8,
            labels: BTreeMap::new(),
            running,
            address: None,
            unreported,
        };
        // The join token the first time; the node's own credential after.
        let principal = match self.agents.contains_key(node) {
            true => Principal::node(node),
            false => Principal::join(),
        };
        let registered = self.call(|reply| Msg::Register { principal, reg, reply }).unwrap();
        self.agents.insert(node.into(), Agent { epoch: registered.epoch, after: registered.next_seq });
    }

    /// One poll of `node`'s stream: the attempts it is told to start.
    fn poll(&mut self, node: &str) -> Vec<AttemptRef> {
        let actions = self.commands(node);
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(s) => Some(s.attempt),
                _ => None,
            })
            .collect()
    }

    /// One poll of `node`'s stream: every command it is given.
    fn commands(&mut self, node: &str) -> Vec<Action> {
        let agent = &self.agents[node];
        let (epoch, after) = (agent.epoch, agent.after);
        let node_name = node.to_string();
        let poll = self
            .call(|reply| Msg::Poll { node: node_name, epoch, after, health: None, reply })
            .expect("polled");
        let mut actions = Vec::new();
        for command in poll.commands.into_iter().map(std::sync::Arc::unwrap_or_clone) {
            self.agents.get_mut(node).unwrap().after = command.seq;
            actions.push(command.action);
        }
        actions
    }

    fn cancel(&mut self, id: u64, grace_ms: Option<u64>) -> Result<ebb_api::Job, ebb_server::ApiError> {
        let principal = self.admin.clone();
        let req = CancelRequest { grace_ms };
        self.call(|reply| Msg::Cancel { principal, id, req, reply })
    }

    fn drill(&mut self, id: u64) -> Result<ebb_api::Job, ebb_server::ApiError> {
        let principal = self.admin.clone();
        self.call(|reply| Msg::Drill { principal, id, reply })
    }

    fn report_msg(
        node: &str,
        events: Vec<AgentEvent>,
    ) -> (Msg, oneshot::Receiver<Result<ebb_api::ReportReply, ebb_server::ApiError>>) {
        let (reply, rx) = oneshot::channel();
        (Msg::Report { report: Report { node: node.into(), events, id: None }, reply }, rx)
    }

    fn report(&mut self, node: &str, events: Vec<AgentEvent>) {
        self.report_as(node, events, None);
    }

    fn report_as(&mut self, node: &str, events: Vec<AgentEvent>, id: Option<ReportId>) {
        let report = Report { node: node.into(), events, id };
        self.call(|reply| Msg::Report { report, reply }).expect("report taken");
    }

    fn submit_msg(&self, gpus: u32) -> (Msg, oneshot::Receiver<Result<Vec<u64>, ebb_server::ApiError>>) {
        let (reply, rx) = oneshot::channel();
        let spec = JobSubmission { gpus: Some(gpus), argv: vec!["work".into()], ..Default::default() };
        (Msg::Submit { principal: self.admin.clone(), spec, reply }, rx)
    }

    fn submit(&mut self, gpus: u32) -> u64 {
        let (msg, mut rx) = self.submit_msg(gpus);
        let now = self.now;
        self.engine().batch(vec![msg], now).unwrap();
        self.engine().sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
        rx.try_recv().unwrap().unwrap()[0]
    }

    fn job(&mut self, id: u64) -> Result<ebb_api::Job, ebb_server::ApiError> {
        let principal = self.admin.clone();
        self.call(|reply| Msg::Job { principal, id, reply })
    }

    fn jobs(&mut self) -> Vec<u64> {
        let principal = self.admin.clone();
        let page = self
            .call(|reply| Msg::Jobs {
                principal,
                query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 1000, ..Default::default() },
                reply,
            })
            .unwrap();
        page.jobs.iter().map(|j| j.id).collect()
    }

    /// A job submitted, placed on `node` and reported started at `now`.
    fn running(&mut self, node: &str) -> AttemptRef {
        let id = self.submit(2);
        let starts = self.poll(node);
        let attempt = *starts.iter().find(|a| a.job == id).expect("placed");
        let at_ms = self.now;
        self.report(node, vec![AgentEvent::Started { attempt, pid: 4242, at_ms }]);
        attempt
    }

    /// Job `id`'s output, as the store has it committed.
    fn log(&self, id: u64) -> String {
        let bytes = (self.open_store)().output(id, 0, i64::MAX as u64).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    fn usage(&self, id: u64) -> Vec<UsageRow> {
        (self.open_store)().job_usage(id).unwrap()
    }
}

/// An event's detail as the wire has it.
fn detail(event: &JobEvent) -> serde_json::Value {
    serde_json::from_str(&event.event.detail_json()).expect("a detail is JSON")
}

fn exited(attempt: AttemptRef, code: i32, at_ms: u64) -> AgentEvent {
    AgentEvent::Exited {
        attempt,
        code: Some(code),
        signal: None,
        completed: false,
        at_ms,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
    }
}

/// Every write the writer makes, each failed in turn inside a batch that
/// makes it: the batch commits nothing, answers nobody, and the restarted
/// writer holds exactly what the last commit held; the agent's retry then
/// goes through whole.
#[test]
fn a_store_error_mid_batch_commits_and_answers_nothing_and_the_restarted_server_is_consistent() {
    store_errors_mid_batch(TestEnv::new);
}

/// The same on PostgreSQL: a database of its own per write failed, on a
/// throwaway server.
#[test]
fn on_postgres_a_store_error_mid_batch_commits_and_answers_nothing() {
    let server = pg::Postgres::start("writer");
    let mut admin = postgres::Client::connect(&server.url(), postgres::NoTls).unwrap();
    store_errors_mid_batch(|name| {
        let db = name.replace('-', "_");
        admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let url = server.url_for(&db);
        TestEnv::with_store(&format!("pg-{name}"), move |_| {
            Box::new(move || ebb_server::store::pg::PgStore::open(&url).unwrap())
        })
    });
}

fn store_errors_mid_batch<S: Store>(mut env_for: impl FnMut(&str) -> TestEnv<S>) {
    for (op, n) in [("put_job", 2), ("add_event", 2), ("heard", 1), ("add_usage", 1), ("put_output", 1)] {
        let mut env = env_for(&format!("fail-{op}"));
        env.register("a", Vec::new(), Vec::new());
        let attempt = env.running("a");
        env.now += 60_000;

        // One batch: a submission, a read, and the report of the running
        // job's exit with its output.
        let (submit, mut submitted) = env.submit_msg(1);
        let (read_tx, mut read) = oneshot::channel();
        let jobs = Msg::Jobs {
            principal: env.admin.clone(),
            query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
            reply: read_tx,
        };
        let events = vec![AgentEvent::Output { attempt, data: "done\n".into() }, exited(attempt, 0, env.now)];
        let (report, mut reported) = TestEnv::<S>::report_msg("a", events.clone());
        env.fail(op, n);
        let now = env.now;
        let result = env.engine().batch(vec![submit, jobs, report], now);
        assert!(result.is_err(), "{op}: a failed write must fail the batch");
        assert!(submitted.try_recv().is_err(), "{op}: a submission was acknowledged");
        assert!(read.try_recv().is_err(), "{op}: a read was answered");
        assert!(reported.try_recv().is_err(), "{op}: a report was acknowledged");

        // The restarted writer has what the last commit had: one running job.
        env.restart();
        assert_eq!(env.jobs(), vec![attempt.job], "{op}");
        assert_eq!(env.job(attempt.job).unwrap().state, "running", "{op}");
        assert!(env.usage(attempt.job).is_empty(), "{op}: usage of an abandoned batch");
        assert_eq!(env.log(attempt.job), "", "{op}: output of an abandoned batch");

        // The agent registers again and delivers what it still holds.
        env.register("a", vec![attempt], Vec::new());
        env.report("a", events);
        assert_eq!(env.job(attempt.job).unwrap().state, "succeeded", "{op}");
        assert_eq!(env.usage(attempt.job).len(), 1, "{op}");
        assert_eq!(env.log(attempt.job), "done\n", "{op}");
    }
}

/// A read in the same batch as a submission sees it, and is answered only
/// once it is committed: when the batch dies before its commit, the read
/// is never answered.
#[test]
fn a_read_issued_in_the_batch_of_a_submission_is_answered_only_after_its_commit() {
    let mut env = TestEnv::new("read");
    let (submit, mut submitted) = env.submit_msg(1);
    let (tx, mut read) = oneshot::channel();
    let jobs = Msg::Jobs {
        principal: env.admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
        reply: tx,
    };
    let (tx, mut one) = oneshot::channel();
    let job = Msg::Job { principal: env.admin.clone(), id: 1, reply: tx };
    let now = env.now;
    env.engine.take().unwrap().crash_during(vec![submit, jobs, job], now);
    assert!(submitted.try_recv().is_err());
    assert!(read.try_recv().is_err(), "a read showed a job that was never committed");
    assert!(one.try_recv().is_err(), "a read showed a job that was never committed");

    env.restart();
    assert!(env.jobs().is_empty());
    let (submit, mut submitted) = env.submit_msg(1);
    let (tx, mut read) = oneshot::channel();
    let jobs = Msg::Jobs {
        principal: env.admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
        reply: tx,
    };
    env.engine().batch(vec![submit, jobs], now).unwrap();
    let id = submitted.try_recv().unwrap().unwrap()[0];
    assert_eq!(read.try_recv().unwrap().unwrap().jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
}

/// A backlog larger than a batch may start is placed a batch's worth at a
/// time: each piece is committed and at its nodes before the next is
/// placed, and the next batch goes on with no message to start it.
#[test]
fn a_backlog_is_placed_a_batch_at_a_time() {
    let mut env = TestEnv::new("pieces");
    let bound = ebb_server::engine::BATCH_STARTS;
    let nodes: Vec<String> = (0..bound.div_ceil(8) + 16).map(|i| format!("n{i:04}")).collect();
    for node in &nodes {
        env.register(node, Vec::new(), Vec::new());
    }
    let backlog = bound + 100;
    let (msgs, mut replies): (Vec<Msg>, Vec<_>) = (0..backlog).map(|_| env.submit_msg(1)).unzip();
    let now = env.now;
    env.engine().batch(msgs, now).unwrap();
    assert!(replies.iter_mut().all(|r| r.try_recv().is_ok_and(|r| r.is_ok())), "every job accepted");
    // Read beside the writer: any message to it is a batch that schedules.
    let db = rusqlite::Connection::open(env.dir.join("ebb.db")).unwrap();
    let placed = || -> usize {
        db.query_row("SELECT COUNT(*) FROM jobs WHERE state = 'starting'", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(placed(), bound, "the first batch starts as many as a batch may");
    env.engine().batch(Vec::new(), now).unwrap();
    assert_eq!(placed(), backlog, "the next, with no message, the rest");
    let starts: usize = nodes.iter().map(|n| env.poll(n).len()).sum();
    assert_eq!(starts, backlog, "every start reached its node once");
}

/// Every event written in a batch carries the batch's instant, never the
/// wall clock.
#[test]
fn every_event_of_a_batch_is_stamped_with_the_batchs_instant() {
    let mut env = TestEnv::new("clock");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    env.now += 1_234;
    let at = env.now;
    env.report("a", vec![exited(attempt, 0, at)]);
    let events = env.job(attempt.job).unwrap().events;
    let stamps: Vec<(EventKind, u64)> = events.iter().map(|e| (e.kind(), e.at_ms)).collect();
    assert_eq!(
        stamps,
        vec![
            (EventKind::Submitted, T0),
            (EventKind::Placed, T0),
            (EventKind::Started, T0),
            (EventKind::Exited, at),
            (EventKind::Succeeded, at),
        ]
    );
}

/// A restarted server that cannot put a live attempt back (its node is
/// gone from the store) ends it as lost, and meters it to the node's last
/// contact, as any attempt lost with its node is.
#[test]
fn recovery_meters_the_attempts_it_ends() {
    let mut env = TestEnv::new("recovery");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    env.now += 30_000;
    env.poll("a"); // last contact
    let heard = env.now;
    env.engine = None;
    let db = rusqlite::Connection::open(env.dir.join("ebb.db")).unwrap();
    db.execute("DELETE FROM nodes WHERE name = 'a'", []).unwrap();
    drop(db);
    env.now += 600_000;
    env.restart();

    let job = env.job(attempt.job).unwrap();
    assert_eq!(job.state, "queued");
    let usage = env.usage(attempt.job);
    assert_eq!(usage.len(), 1, "the attempt recovery ended was not metered");
    assert_eq!((usage[0].started_ms, usage[0].ended_ms), (T0, heard));
    assert_eq!(usage[0].outcome, "lost");
    let requeued = job.events.iter().find(|e| e.kind() == EventKind::Requeued).expect("requeued");
    assert!(detail(requeued)["why"].as_str().unwrap().starts_with("server restart"), "{}", detail(requeued));
    assert_eq!(requeued.at_ms, env.now);
}

/// A cancel was SIGTERM and SIGKILL 10 s later, whatever the drain window,
/// with no notice for the job's trap; `--grace` did not exist.
#[test]
fn a_cancel_sends_its_notice_and_grace_keeps_its_deadline_and_is_sent_again_after_a_restart() {
    let mut env = TestEnv::new("cancel-grace");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let id = attempt.job;

    // The drain window here is 3 s: a longer grace is refused, and
    // nothing is cancelled.
    let refused = env.cancel(id, Some(3_001)).unwrap_err();
    assert_eq!(refused.status, 422);
    assert_eq!(refused.message, "grace_ms: a cancel's grace may be at most the drain window, 3s; got 3.001s");
    assert!(env.commands("a").is_empty());
    assert_eq!(env.job(id).unwrap().state, "running");

    // No grace asked: 10 s, or the drain window if shorter.
    env.now += 100;
    let asked = env.now;
    assert_eq!(env.cancel(id, None).unwrap().state, "running");
    let notice = StopNotice { notice_at_ms: asked, deadline_ms: asked + 3_000 };
    assert_eq!(env.commands("a"), vec![Action::Stop { attempt, grace_ms: 3_000, notice: Some(notice) }]);
    let event =
        env.job(id).unwrap().events.into_iter().find(|e| e.kind() == EventKind::CancelRequested).unwrap();
    assert_eq!(detail(&event)["grace_seconds"], 3.0);

    // Again with more time: nothing changes; with less: the deadline
    // comes sooner.
    env.now += 100;
    env.cancel(id, Some(3_000)).unwrap();
    assert!(env.commands("a").is_empty(), "a second cancel gave more time");
    let sooner = StopNotice { notice_at_ms: env.now, deadline_ms: env.now + 1_000 };
    env.cancel(id, Some(1_000)).unwrap();
    assert_eq!(
        env.commands("a"),
        vec![Action::Stop { attempt, grace_ms: 1_000, notice: Some(sooner.clone()) }]
    );

    // A restarted server tells the agent again, with the same deadline.
    env.now += 400;
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(env.commands("a"), vec![Action::Stop { attempt, grace_ms: 600, notice: Some(sooner) }]);

    env.report("a", vec![exited(attempt, 143, env.now)]);
    assert_eq!(env.job(id).unwrap().state, "cancelled");
}

/// A drill is kept with the job: a server restarted while the drilled
/// attempt saves tells its node the notice again, takes its exit as the
/// drill's (requeued at once, not a preemption, billed as run time), and
/// concludes the drill when the next attempt reports its resume.
#[test]
fn a_drill_survives_a_restart_and_its_exit_requeues_the_job_as_a_drill() {
    let mut env = TestEnv::new("drill");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let id = attempt.job;
    env.now += 5_000;
    let notice_at = env.now;
    let job = env.drill(id).unwrap();
    assert_eq!(job.state, "draining");
    let drill = job.drill.expect("the drill, in the answer");
    assert_eq!((drill.attempt, drill.notice_at_ms, drill.deadline_ms), (1, notice_at, notice_at + 3_000));
    assert_eq!((drill.verdict, drill.nodes), (None, vec!["a".to_string()]));
    let drains = |actions: Vec<Action>| -> Vec<ebb_api::DrainAttempt> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Drain(d) => Some(d),
                _ => None,
            })
            .collect()
    };
    let sent = drains(env.commands("a"));
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].attempt, sent[0].deadline_ms), (attempt, notice_at + 3_000));
    assert!(sent[0].reason.starts_with("drill: "), "{}", sent[0].reason);
    let again = env.drill(id).unwrap_err();
    assert_eq!(
        (again.status, again.message.as_str()),
        (409, format!("job {id}: already draining ({})", sent[0].reason).as_str())
    );

    env.now += 500;
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(drains(env.commands("a")), sent, "the notice is sent again, as it was");
    env.now += 300;
    let at_ms = env.now;
    let save = AgentEvent::Checkpoint { attempt, step: Some(8), bytes: None, duration_ms: 200, at_ms };
    env.report("a", vec![save, exited(attempt, 0, at_ms + 50)]);
    let job = env.job(id).unwrap();
    // Requeued and placed again in the same batch.
    assert_eq!((job.state.as_str(), job.attempt), ("starting", 2));
    assert_eq!((job.preemptions, job.retries, job.lost_gpu_seconds), (0, 0, 0.0));
    let usage = env.usage(id);
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (usage[0].outcome.as_str(), usage[0].drain_gpu_seconds, usage[0].lost_gpu_seconds),
        ("drill", 0, 0)
    );
    let drill = job.drill.unwrap();
    assert_eq!(
        (drill.exit.as_deref(), drill.fit_window, drill.requeued),
        (Some("exited with code 0"), Some(true), true)
    );
    assert_eq!(drill.checkpoint.as_ref().and_then(|c| c.step), Some(8));
    assert!(drill.verdict.is_none(), "waiting for the resume");

    // Placed again at once; the new attempt resumes from step 8.
    let next = *env.poll("a").first().expect("placed again");
    assert_eq!(next, AttemptRef { job: id, attempt: 2 });
    let at_ms = env.now;
    env.report("a", vec![AgentEvent::Started { attempt: next, pid: 4343, at_ms }]);
    env.report("a", vec![AgentEvent::Resumed { attempt: next, step: Some(8), at_ms }]);
    let job = env.job(id).unwrap();
    let drill = job.drill.unwrap();
    assert_eq!((drill.verdict.as_deref(), drill.failures.len()), (Some("ready"), 0));
    assert_eq!(
        (drill.next_attempt, drill.next_node.as_deref(), drill.resumed_step),
        (Some(2), Some("a"), Some(8))
    );
    let kinds: Vec<EventKind> = job.events.iter().map(|e| e.kind()).collect();
    let drills: Vec<&JobEvent> = job.events.iter().filter(|e| e.kind() == EventKind::Drill).collect();
    assert_eq!(drills.len(), 2, "{kinds:?}");
    assert_eq!(
        (detail(drills[0])["phase"].as_str(), detail(drills[1])["phase"].as_str()),
        (Some("notice"), Some("verdict"))
    );
    assert_eq!(detail(drills[1])["verdict"], "ready");
    assert!(kinds.contains(&EventKind::Resumed) && kinds.contains(&EventKind::DrainNotice), "{kinds:?}");
    let requeued = job.events.iter().find(|e| e.kind() == EventKind::Requeued).unwrap();
    assert_eq!(detail(requeued)["reason"], "drill");
}

/// The checkpoint a node restored from the checkpoint store before an
/// attempt started is in the job's timeline, before the start; the same
/// report from a node the attempt is not on is stale, and no event.
#[test]
fn a_restored_checkpoint_is_in_the_timeline_before_the_start_and_only_from_the_attempts_node() {
    let mut env = TestEnv::new("restored");
    env.register("a", Vec::new(), Vec::new());
    let id = env.submit(8);
    let attempt = *env.poll("a").first().expect("placed");
    env.register("b", Vec::new(), Vec::new());
    let restored = |at_ms| AgentEvent::Restored {
        attempt,
        from_attempt: 1,
        upload: 3,
        step: Some(1200),
        files: 2,
        bytes: 4096,
        duration_ms: 250,
        at_ms,
    };
    let at_ms = env.now;
    let reply = env.call(|reply| Msg::Report {
        report: Report { node: "b".into(), events: vec![restored(at_ms)], id: None },
        reply,
    });
    assert_eq!(reply.unwrap().stale, vec![attempt], "b does not run it");
    env.now += 100;
    env.report("a", vec![restored(at_ms), AgentEvent::Started { attempt, pid: 7, at_ms: at_ms + 100 }]);
    let job = env.job(id).unwrap();
    let kinds: Vec<EventKind> = job.events.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, [EventKind::Submitted, EventKind::Placed, EventKind::Restored, EventKind::Started]);
    let detail = &detail(&job.events[2]);
    assert_eq!(
        (&detail["node"], &detail["from_attempt"], &detail["upload"], &detail["step"]),
        (&serde_json::json!("a"), &serde_json::json!(1), &serde_json::json!(3), &serde_json::json!(1200))
    );
    assert_eq!(
        (&detail["files"], &detail["bytes"], &detail["seconds"]),
        (&serde_json::json!(2), &serde_json::json!(4096), &serde_json::json!(0.25))
    );
    assert_eq!(detail["at"], ebb_server::rfc3339(at_ms));
}

/// A report sent again because its reply was lost (the server committed
/// it) is applied once: its output is in the log once and its checkpoint
/// counts once, also after a restart of the server. A new session of the
/// agent numbers its reports afresh.
#[test]
fn a_report_sent_again_adds_its_output_and_checkpoint_once() {
    let mut env = TestEnv::new("resend");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let at_ms = env.now;
    let events = vec![
        AgentEvent::Output { attempt, data: "step 1\n".into() },
        AgentEvent::Checkpoint { attempt, step: Some(1), bytes: Some(10), duration_ms: 100, at_ms },
    ];
    let first = ReportId { session: 77, seq: 1 };
    env.report_as("a", events.clone(), Some(first));
    env.report_as("a", events.clone(), Some(first));
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    env.report_as("a", events.clone(), Some(first));
    assert_eq!(env.log(attempt.job), "step 1\n");
    let checkpoints =
        env.job(attempt.job).unwrap().events.iter().filter(|e| e.kind() == EventKind::Checkpoint).count();
    assert_eq!(checkpoints, 1);

    let next = vec![AgentEvent::Output { attempt, data: "step 2\n".into() }];
    env.report_as("a", next, Some(ReportId { session: 77, seq: 2 }));
    // The agent restarted: a new session starts again from 1.
    let again = vec![AgentEvent::Output { attempt, data: "step 3\n".into() }];
    env.report_as("a", again, Some(ReportId { session: 78, seq: 1 }));
    assert_eq!(env.log(attempt.job), "step 1\nstep 2\nstep 3\n");
}

/// One step of a random run.
#[derive(Clone, Debug)]
enum Step {
    /// `always`: `--restart always`, which quick exits put in back-off.
    Submit {
        tier: usize,
        gpus: u32,
        always: bool,
    },
    /// The tenant's `max_running_jobs`, or none.
    Limit {
        running: Option<u64>,
    },
    /// Node `node` polls and reports every attempt it is told to start as started.
    Poll {
        node: usize,
    },
    /// The `k`-th running attempt (mod their count) exits with `code`.
    Exit {
        k: usize,
        code: i32,
    },
    Cancel {
        k: usize,
    },
    Drain {
        node: usize,
    },
    /// A fire drill of the `k`-th job (mod their count), refused unless
    /// it is a running preemptible one.
    Drill {
        k: usize,
    },
    Later {
        ms: u64,
    },
    Restart,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..3usize, 1..=8u32, proptest::bool::weighted(0.3))
            .prop_map(|(tier, gpus, always)| Step::Submit { tier, gpus, always }),
        1 => proptest::option::of(1..4u64).prop_map(|running| Step::Limit { running }),
        4 => (0..2usize).prop_map(|node| Step::Poll { node }),
        3 => (0..16usize, 0..2i32).prop_map(|(k, code)| Step::Exit { k, code }),
        1 => (0..16usize).prop_map(|k| Step::Cancel { k }),
        1 => (0..2usize).prop_map(|node| Step::Drain { node }),
        1 => (0..16usize).prop_map(|k| Step::Drill { k }),
        2 => (100..5_000u64).prop_map(|ms| Step::Later { ms }),
        1 => Just(Step::Restart),
    ]
}

/// `/metrics`' jobs, GPUs and queue as a walk over every job gives them.
fn recount(env: &mut TestEnv<SqliteStore>) -> ebb_server::metrics::Snapshot {
    let principal = env.admin.clone();
    let page = env
        .call(|reply| Msg::Jobs {
            principal,
            query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100_000, ..Default::default() },
            reply,
        })
        .unwrap();
    let name = |s: &str| -> &'static str {
        ebb_server::metrics::JOB_STATES
            .iter()
            .chain(ebb_server::metrics::TIERS.iter())
            .find(|n| **n == s)
            .copied()
            .unwrap_or_else(|| panic!("unknown name {s}"))
    };
    let mut counted = ebb_server::metrics::Snapshot::default();
    for job in page.jobs {
        let (tier, state) = (name(&job.tier), name(&job.state));
        *counted.jobs.entry((tier, state)).or_insert(0) += 1;
        let gpu_state = match state {
            "starting" | "running" => "running",
            "draining" => "draining",
            "queued" => {
                let reason = job.pending_reason.unwrap_or(ebb_api::PendingReason::Scheduling);
                *counted.queued.entry(ebb_server::metrics::QueueKey { tier, reason }).or_insert(0) += 1;
                continue;
            }
            _ => continue,
        };
        *counted.gpus.entry((tier, gpu_state)).or_insert(0) += u64::from(job.gpus);
    }
    counted
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// The tallies `/metrics` keeps as jobs change agree with a walk over
    /// every job after any run, a restart included.
    #[test]
    fn metrics_agree_with_a_recount_after_a_random_run(steps in proptest::collection::vec(step(), 1..60)) {
        let mut env = TestEnv::new("metrics-recount");
        let nodes = ["a", "b"];
        for node in nodes {
            env.register(node, Vec::new(), Vec::new());
        }
        let mut running: Vec<(String, AttemptRef)> = Vec::new();
        for step in steps {
            match step {
                Step::Submit { tier, gpus, always } => {
                    let tier = ["reserved", "on-demand", "preemptible"][tier];
                    let (reply, _rx) = oneshot::channel();
                    let spec = JobSubmission {
                        gpus: Some(gpus),
                        tier: Some(tier.into()),
                        argv: vec!["work".into()],
                        restart: always.then(|| "always".into()),
                        ..Default::default()
                    };
                    let now = env.now;
                    let principal = env.admin.clone();
                    env.engine().batch(vec![Msg::Submit { principal, spec, reply }], now).unwrap();
                }
                Step::Limit { running } => {
                    let principal = env.admin.clone();
                    let set = ebb_api::TenantLimits { max_running_jobs: running, ..Default::default() };
                    let tenant = "default".into();
                    env.call(|reply| Msg::TenantLimits { principal, tenant, set: Some(set), reply }).unwrap();
                }
                Step::Poll { node } => {
                    let node = nodes[node];
                    for action in env.commands(node) {
                        let at_ms = env.now;
                        match action {
                            Action::Start(s) => {
                                env.report(node, vec![AgentEvent::Started { attempt: s.attempt, pid: 4242, at_ms }]);
                                running.push((node.to_string(), s.attempt));
                            }
                            // A stop (a cancel) ends the attempt; a drained one
                            // runs on until a later step ends it.
                            Action::Stop { attempt, .. } => {
                                if running.iter().any(|(_, a)| *a == attempt) {
                                    env.report(node, vec![exited(attempt, 143, at_ms)]);
                                    running.retain(|(_, a)| *a != attempt);
                                }
                            }
                            Action::Drain(_) => {}
                        }
                    }
                }
                Step::Exit { k, code } => {
                    if !running.is_empty() {
                        let (node, attempt) = running.remove(k % running.len());
                        let at_ms = env.now;
                        env.report(&node, vec![exited(attempt, code, at_ms)]);
                    }
                }
                Step::Cancel { k } => {
                    let jobs = env.jobs();
                    if !jobs.is_empty() {
                        let _ = env.cancel(jobs[k % jobs.len()], None);
                    }
                }
                Step::Drain { node } => {
                    let name = nodes[node].to_string();
                    let _ = env.call(|reply| Msg::DrainNode { name, reply });
                }
                Step::Drill { k } => {
                    let jobs = env.jobs();
                    if !jobs.is_empty() {
                        let _ = env.drill(jobs[k % jobs.len()]);
                    }
                }
                Step::Later { ms } => {
                    env.now += ms;
                    let now = env.now;
                    env.engine().batch(vec![Msg::Tick], now).unwrap();
                }
                Step::Restart => {
                    env.restart();
                    for node in nodes {
                        let mine: Vec<AttemptRef> =
                            running.iter().filter(|(n, _)| n == node).map(|(_, a)| *a).collect();
                        env.register(node, mine, Vec::new());
                    }
                }
            }
            let kept = env.call(|reply| Msg::Metrics { reply });
            let counted = recount(&mut env);
            proptest::prop_assert_eq!(&kept.jobs.into_iter().filter(|(_, n)| *n > 0).collect::<BTreeMap<_, _>>(), &counted.jobs);
            proptest::prop_assert_eq!(&kept.gpus.into_iter().filter(|(k, n)| *n > 0 && k.1 != "held").collect::<BTreeMap<_, _>>(), &counted.gpus);
            proptest::prop_assert_eq!(&kept.queued, &counted.queued);
        }
    }
}

/// An idle node's heartbeat is not a write each time: its contact is
/// written again only after 5 minutes; a node that runs an attempt is
/// written at every contact, so that work lost with it is metered to the
/// last one.
#[test]
fn an_idle_nodes_heartbeats_write_its_contact_only_now_and_then() {
    let mut env = TestEnv::new("idle-heartbeats");
    env.register("a", Vec::new(), Vec::new());
    env.fail("heard", 1);
    env.now += 200_000;
    env.commands("a"); // idle, 200 s after the last write: nothing written
    env.now += 100_001;
    let (agent_epoch, after) = (env.agents["a"].epoch, env.agents["a"].after);
    let (reply, _rx) = oneshot::channel();
    let poll = Msg::Poll { node: "a".into(), epoch: agent_epoch, after, health: None, reply };
    let now = env.now;
    assert!(env.engine().batch(vec![poll], now).is_err(), "5 minutes on, the contact is written (and fails)");
    env.restart();
    env.register("a", Vec::new(), Vec::new());
    env.running("a");
    env.fail("heard", 1);
    env.now += 100;
    let (reply, _rx) = oneshot::channel();
    let (agent_epoch, after) = (env.agents["a"].epoch, env.agents["a"].after);
    let poll = Msg::Poll { node: "a".into(), epoch: agent_epoch, after, health: None, reply };
    let now = env.now;
    assert!(env.engine().batch(vec![poll], now).is_err(), "a busy node's contact is written at every poll");
}

/// Every page of the listing, `limit` at a time, with `between` run
/// after each page: the ids listed, in order.
fn all_pages(
    env: &mut TestEnv<SqliteStore>,
    query: ebb_server::engine::JobQuery,
    mut between: impl FnMut(&mut TestEnv<SqliteStore>),
) -> Vec<ebb_api::Job> {
    let mut all = Vec::new();
    let mut query = query;
    loop {
        let principal = env.admin.clone();
        let q = query.clone();
        let page = env.call(|reply| Msg::Jobs { principal, query: q, reply }).unwrap();
        all.extend(page.jobs);
        between(env);
        match page.next_cursor {
            Some(next) => query.cursor = Some(next),
            None => return all,
        }
    }
}

/// What a user sees of a finished job (here, with `keep_finished` 0, out
/// of the writer's memory as soon as its batch ends): show with events,
/// usage and its array's progress, its log, the listing, `/metrics`, a
/// refused cancel and drill, another tenant's 404; and all of it again
/// after a restart, which loads only the unfinished jobs.
#[test]
fn a_finished_job_out_of_memory_is_still_listed_shown_logged_and_counted() {
    let mut env = TestEnv::new("pruned");
    env.register("a", Vec::new(), Vec::new());
    let single = env.running("a");
    let (reply, mut rx) = oneshot::channel();
    let spec = JobSubmission {
        gpus: Some(1),
        argv: vec!["work".into()],
        array: Some("0-2".into()),
        name: Some("sweep".into()),
        ..Default::default()
    };
    let principal = env.admin.clone();
    let now = env.now;
    env.engine().batch(vec![Msg::Submit { principal, spec, reply }], now).unwrap();
    let tasks = rx.try_recv().unwrap().unwrap();
    assert_eq!(tasks.len(), 3);
    let started: Vec<AttemptRef> = env.poll("a").into_iter().filter(|a| tasks.contains(&a.job)).collect();
    assert_eq!(started.len(), 3);
    let at_ms = env.now;
    let starts = started.iter().map(|&attempt| AgentEvent::Started { attempt, pid: 1, at_ms }).collect();
    env.report("a", starts);

    // The single job and the first task succeed, the second is cancelled,
    // the third runs on; the listing is read a page at a time while they end.
    let mut step = 0;
    let ending = |env: &mut TestEnv<SqliteStore>| {
        step += 1;
        env.now += 1_000;
        let at_ms = env.now;
        match step {
            1 => env.report(
                "a",
                vec![
                    AgentEvent::Output { attempt: single, data: "hello\n".into() },
                    exited(single, 0, at_ms),
                ],
            ),
            2 => env.report("a", vec![exited(started[0], 0, at_ms)]),
            3 => {
                env.cancel(started[1].job, None).unwrap();
                env.report("a", vec![exited(started[1], 143, at_ms)]);
            }
            _ => {}
        }
    };
    let query = ebb_server::engine::JobQuery { cursor: Some(0), limit: 1, ..Default::default() };
    let listed: Vec<u64> = all_pages(&mut env, query, ending).iter().map(|j| j.id).collect();
    assert_eq!(listed, vec![single.job, tasks[0], tasks[1], tasks[2]], "each job exactly once");

    for life in ["before a restart", "after a restart"] {
        let shown = env.job(single.job).unwrap();
        assert_eq!(shown.state, "succeeded", "{life}");
        assert!(shown.events.iter().any(|e| e.kind() == EventKind::Exited), "{life}");
        assert_eq!(shown.usage.len(), 1, "{life}: its usage");
        let principal = env.admin.clone();
        let log = env
            .call(|reply| Msg::LogFile { principal, id: single.job, offset: 0, sources: false, reply })
            .unwrap();
        assert_eq!((log.stored.as_deref(), log.finished), (Some(&b"hello\n"[..]), true), "{life}");
        let refused = env.cancel(single.job, None).unwrap_err();
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (409, "job 1: already succeeded; there is nothing to cancel")
        );
        let refused = env.drill(single.job).unwrap_err();
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (409, "job 1: succeeded; only a running job can be drilled")
        );
        let other = Principal::tenant(Scope::Tenant, 2, "acme");
        let hidden = env.call(|reply| Msg::Job { principal: other, id: single.job, reply }).unwrap_err();
        assert_eq!(hidden.status, 404, "{life}: another tenant's finished job");

        // The array counts its finished tasks by state, shown and listed.
        let head = env.job(tasks[0]).unwrap();
        let progress = head.progress.expect("an array's progress");
        let states: Vec<(&str, u64)> = progress.states.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        assert_eq!(states, vec![("cancelled", 1), ("running", 1), ("succeeded", 1)], "{life}");
        assert_eq!((progress.done, progress.total, progress.tasks.len()), (1, 3, 3), "{life}");
        let query = ebb_server::engine::JobQuery {
            cursor: Some(0),
            limit: 10,
            collapse: true,
            states: Some(vec![ebb_server::engine::JobState::Cancelled]),
            ..Default::default()
        };
        let collapsed = all_pages(&mut env, query, |_| {});
        assert_eq!(collapsed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![tasks[0]], "{life}");
        assert_eq!(collapsed[0].progress.as_ref().map(|p| (p.done, p.total)), Some((1, 3)), "{life}");
        let query = ebb_server::engine::JobQuery { cursor: Some(0), limit: 2, ..Default::default() };
        let listed: Vec<(u64, String)> =
            all_pages(&mut env, query, |_| {}).into_iter().map(|j| (j.id, j.state)).collect();
        assert_eq!(
            listed,
            vec![
                (single.job, "succeeded".to_string()),
                (tasks[0], "succeeded".into()),
                (tasks[1], "cancelled".into()),
                (tasks[2], "running".into())
            ],
            "{life}"
        );

        let metrics = env.call(|reply| Msg::Metrics { reply });
        let count = |state: &str| -> u64 {
            metrics.jobs.iter().filter(|((_, s), _)| *s == state).map(|(_, n)| n).sum()
        };
        assert_eq!((count("succeeded"), count("cancelled"), count("running")), (2, 1, 1), "{life}");
        env.restart();
        env.register("a", vec![started[2]], Vec::new());
    }
    // Ids go on past every job, finished ones included.
    assert_eq!(env.submit(1), tasks[2] + 1);
}

/// A deadline job on track stays preemptible; once its progress says it
/// would be late it is promoted where it runs, stays promoted across a
/// restart, and its one usage record is split at the promotion.
#[test]
fn a_deadline_job_is_promoted_in_place_and_its_attempt_is_billed_at_both_rates() {
    let mut env = TestEnv::new("deadline");
    env.register("a", Vec::new(), Vec::new());
    let (reply, mut rx) = oneshot::channel();
    let spec = JobSubmission {
        gpus: Some(2),
        argv: vec!["work".into()],
        deadline: Some(ebb_server::rfc3339(env.now + 600_000)),
        ..Default::default()
    };
    let (now, principal) = (env.now, env.admin.clone());
    env.engine().batch(vec![Msg::Submit { principal, spec, reply }], now).unwrap();
    let id = rx.try_recv().unwrap().unwrap()[0];
    let attempt = *env.poll("a").iter().find(|a| a.job == id).expect("placed");
    let started = env.now;
    env.report("a", vec![AgentEvent::Started { attempt, pid: 1, at_ms: started }]);
    assert_eq!(env.job(id).unwrap().deadline.unwrap().state, "no_progress");

    // 10% in 10 s: 90 s more and a 72 s margin fit in the 590 s left.
    env.now += 10_000;
    env.report("a", vec![AgentEvent::Progress { attempt, fraction: 0.1, at_ms: env.now }]);
    let job = env.job(id).unwrap();
    assert_eq!((job.tier.as_str(), job.deadline.unwrap().state.as_str()), ("preemptible", "on_track"));
    // 40% in 300 s: 450 s more and a 108 s margin do not fit in 300 s.
    env.now = started + 300_000;
    env.report("a", vec![AgentEvent::Progress { attempt, fraction: 0.4, at_ms: env.now }]);
    let job = env.job(id).unwrap();
    assert_eq!((job.tier.as_str(), job.state.as_str(), job.attempt), ("on-demand", "running", 1));
    assert_eq!(job.deadline.as_ref().unwrap().state, "promoted");
    let promoted = job.events.iter().find(|e| e.kind() == EventKind::Promoted).expect("a promoted event");
    assert_eq!((promoted.at_ms, &detail(promoted)["running"]), (env.now, &serde_json::json!(true)));

    // A restarted server keeps it on-demand and still splits its bill.
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(env.job(id).unwrap().tier, "on-demand");
    env.now += 100_000;
    env.report("a", vec![exited(attempt, 0, env.now)]);
    let usage = env.usage(id);
    assert_eq!(usage.len(), 1);
    let parts: Vec<_> =
        usage[0].parts().iter().map(|p| (p.tier.clone(), p.seconds, p.rate, p.amount)).collect();
    assert_eq!(
        parts,
        vec![
            ("preemptible".to_string(), 300, 1_800_000, 300_000),
            ("on-demand".to_string(), 100, 3_600_000, 200_000),
        ]
    );
    assert_eq!((usage[0].seconds, usage[0].amount), (400, 500_000));
    assert_eq!(env.job(id).unwrap().deadline.unwrap().state, "met");
    // `/metrics` counts its revenue as the record's parts, each under its
    // tier (the counter starts at the restart, before the attempt ended).
    let metrics = env.call(|reply| Msg::Metrics { reply });
    let revenue: Vec<_> = metrics.counters.revenue_micro_usd.into_iter().collect();
    assert_eq!(revenue, [("on-demand", 200_000), ("preemptible", 300_000), ("reserved", 0)]);
}

/// The starts nodes `a` and `b` are told of, by rank.
fn gang_starts(env: &mut TestEnv) -> Vec<(String, StartAttempt)> {
    let mut starts = Vec::new();
    for node in ["a", "b"] {
        for action in env.commands(node) {
            if let Action::Start(start) = action {
                starts.push((node.to_string(), start));
            }
        }
    }
    starts.sort_by_key(|(_, s)| s.env["NODE_RANK"].clone());
    starts
}

/// A gang of two 8-GPU nodes placed and started: its attempt, and where
/// each rank runs (rank 0 first).
fn gang(env: &mut TestEnv) -> (AttemptRef, Vec<(String, StartAttempt)>) {
    let id = env.submit(16);
    let starts = gang_starts(env);
    assert_eq!(starts.len(), 2, "a gang over both nodes");
    let attempt = starts[0].1.attempt;
    assert_eq!(attempt.job, id);
    for (node, _) in &starts {
        let at_ms = env.now;
        env.report(node, vec![AgentEvent::Started { attempt, pid: 1, at_ms }]);
    }
    (attempt, starts)
}

fn stops(actions: &[Action]) -> usize {
    actions.iter().filter(|a| matches!(a, Action::Stop { .. })).count()
}

fn two_nodes(name: &str) -> TestEnv {
    let mut env = TestEnv::new(name);
    env.register("a", Vec::new(), Vec::new());
    env.register("b", Vec::new(), Vec::new());
    env
}

/// When one node's part exited 0 the server stopped the other at once, and
/// torchrun's other node was killed in its own shutdown; the job then
/// succeeded though a part had been killed. A gang ends when all its
/// parts have: one that exits 0 leaves the others the grace to finish.
#[test]
fn a_gang_waits_for_its_last_part_and_succeeds_only_if_every_part_did() {
    let mut env = two_nodes("gang-waits");
    let (attempt, starts) = gang(&mut env);
    let (rank0, rank1) = (starts[0].0.clone(), starts[1].0.clone());
    env.now += 1_000;
    let at = env.now;
    env.report(&rank1, vec![exited(attempt, 0, at)]);
    assert_eq!(stops(&env.commands(&rank0)), 0, "rank 0 was stopped while saving its weights");
    assert_eq!(env.job(attempt.job).unwrap().state, "running");
    env.now += 3_000;
    let at = env.now;
    env.report(&rank0, vec![exited(attempt, 0, at)]);
    assert_eq!(env.job(attempt.job).unwrap().state, "succeeded");

    // A part killed by a signal after another exited 0 is a failure.
    let (attempt, starts) = gang(&mut env);
    let at = env.now;
    env.report(&starts[1].0, vec![exited(attempt, 0, at)]);
    let killed = AgentEvent::Exited {
        attempt,
        code: None,
        signal: Some(15),
        completed: false,
        at_ms: at,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
    };
    env.report(&starts[0].0, vec![killed]);
    assert_eq!(env.job(attempt.job).unwrap().state, "failed", "rank 0 was killed: no success");
}

/// The parts left running past the gang exit grace are stopped, and the
/// attempt fails saying why, whatever they exit with; so does a gang one
/// of whose parts failed, at once.
#[test]
fn a_gang_whose_parts_outrun_the_grace_or_whose_part_failed_is_stopped_and_fails() {
    let mut env = two_nodes("gang-grace");
    let (attempt, starts) = gang(&mut env);
    let (rank0, rank1) = (starts[0].0.clone(), starts[1].0.clone());
    let at = env.now;
    env.report(&rank1, vec![exited(attempt, 0, at)]);
    // The nodes keep polling (their heartbeat) while the grace runs.
    let mut rank0_stops = 0;
    for _ in 0..20 {
        env.now += 29_900;
        rank0_stops += stops(&env.commands(&rank0));
        env.commands(&rank1);
    }
    assert_eq!(rank0_stops, 0, "within the grace");
    // A restart keeps the grace's end.
    env.restart();
    for node in ["a", "b"] {
        let running = if rank0.as_str() == node { vec![attempt] } else { vec![] };
        env.register(node, running, Vec::new());
    }
    env.now += 3_000;
    let now = env.now;
    env.engine().batch(vec![Msg::Tick], now).unwrap();
    assert_eq!(stops(&env.commands(&rank0)), 1, "past the grace: stopped");
    let at = env.now;
    env.report(&rank0, vec![exited(attempt, 0, at)]);
    let job = env.job(attempt.job).unwrap();
    assert_eq!(job.state, "failed", "a part Ebb stopped is no success, even one that exited 0");
    let failed = job.events.iter().find(|e| e.kind() == EventKind::Failed).unwrap();
    let why = detail(failed)["reason"].as_str().unwrap().to_string();
    assert!(why.contains("had not exited within the gang exit grace of 10m"), "{why}");
    assert!(job.events.iter().any(|e| e.kind() == EventKind::GangStopped));

    let (attempt, starts) = gang(&mut env);
    let at = env.now;
    env.report(&starts[1].0, vec![exited(attempt, 3, at)]);
    assert_eq!(stops(&env.commands(&starts[0].0)), 1, "a failed part stops the others at once");
    let at = env.now + 500;
    env.report(&starts[0].0, vec![exited(attempt, 0, at)]);
    let job = env.job(attempt.job).unwrap();
    assert_eq!(job.state, "failed");
    let failed = job.events.iter().find(|e| e.kind() == EventKind::Failed).unwrap();
    assert!(detail(failed)["reason"].as_str().unwrap().contains("exited with code 3"), "{failed:?}");
}

/// `MASTER_PORT` was the lowest port from 29500 that Ebb's own gangs did
/// not use, never checked free: with another program on it the gang
/// failed with EADDRINUSE. The first node's agent checks it now; a taken
/// port requeues the gang (no failure, no preemption) with another port.
#[test]
fn a_gang_whose_rendezvous_port_is_taken_is_requeued_with_another() {
    let mut env = two_nodes("gang-port");
    let id = env.submit(16);
    let starts = gang_starts(&mut env);
    let (rank0, start0) = starts[0].clone();
    let port = start0.rendezvous_port.expect("rank 0 is told to check its port");
    assert_eq!(start0.env["MASTER_PORT"], port.to_string());
    assert_eq!(starts[1].1.rendezvous_port, None, "only rank 0 listens");
    let attempt = start0.attempt;
    let at = env.now;
    env.report(&starts[1].0, vec![AgentEvent::Started { attempt, pid: 1, at_ms: at }]);
    let taken = AgentEvent::Exited {
        attempt,
        code: None,
        signal: None,
        completed: false,
        at_ms: at,
        peak_memory_bytes: None,
        start_error: Some(format!("port {port} in use")),
        port_in_use: Some(port),
    };
    env.report(&rank0, vec![taken]);
    assert_eq!(stops(&env.commands(&starts[1].0)), 1, "the other rank is stopped at once");
    let at = env.now + 200;
    env.report(&starts[1].0, vec![exited(attempt, 1, at)]);
    let job = env.job(id).unwrap();
    assert_eq!((job.attempt, job.retries, job.preemptions), (2, 0, 0), "neither a failure nor a preemption");
    let requeued = job.events.iter().rfind(|e| e.kind() == EventKind::Requeued).unwrap();
    assert!(detail(requeued)["reason"].as_str().unwrap().contains("rendezvous port"), "{requeued:?}");
    // The next attempt meets on another port.
    let again: Vec<StartAttempt> = gang_starts(&mut env).into_iter().map(|(_, s)| s).collect();
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|s| s.attempt.attempt == 2 && s.env["MASTER_PORT"] != port.to_string()),
        "{again:?}"
    );
}

/// Registry logins are a tenant's own, survive a restart, and reach a
/// node only in the start of that tenant's job from that registry; a
/// tenant the operator requires images of is refused without one.
#[test]
fn registry_logins_are_the_tenants_own_and_ride_only_with_its_starts() {
    let mut env = TestEnv::new("registry-logins");
    env.images = ebb_server::Images {
        required: ebb_server::Required::Tenants(["alice".to_string()].into()),
        root: ["alice".to_string()].into(),
    };
    env.restart();
    env.call(|reply| Msg::CreateTenant { name: "alice".into(), reply }).unwrap();
    env.call(|reply| Msg::CreateTenant { name: "bob".into(), reply }).unwrap();
    let alice = Principal::tenant(Scope::Tenant, 2, "alice");
    let bob = Principal::tenant(Scope::Tenant, 3, "bob");
    let submit = |env: &mut TestEnv, who: &Principal, spec: JobSubmission| {
        let principal = who.clone();
        env.call(|reply| Msg::Submit { principal, spec, reply })
    };
    let bare = JobSubmission { argv: vec!["train".into()], ..Default::default() };
    let refused = submit(&mut env, &alice, bare.clone()).unwrap_err();
    assert_eq!(refused.status, 422);
    assert!(refused.message.contains("tenant alice's jobs must name an image"), "{}", refused.message);
    submit(&mut env, &bob, bare.clone()).expect("bob is not required to");

    let login =
        |username: &str| ebb_api::RegistryLogin { username: username.into(), password: "s3cret".into() };
    let set = |env: &mut TestEnv,
               who: &Principal,
               tenant: &str,
               registry: &str,
               l: Option<ebb_api::RegistryLogin>| {
        let (principal, tenant, set) = (who.clone(), tenant.to_string(), Some((registry.to_string(), l)));
        env.call(|reply| Msg::RegistryLogins { principal, tenant, set, reply })
    };
    let listed = set(&mut env, &alice, "alice", "127.0.0.1:5000", Some(login("alice"))).unwrap();
    assert_eq!(
        listed,
        vec![ebb_api::RegistryLoginInfo { registry: "127.0.0.1:5000".into(), username: "alice".into() }]
    );
    let e = set(&mut env, &bob, "alice", "127.0.0.1:5000", Some(login("bob"))).unwrap_err();
    assert_eq!(e.status, 404, "another tenant's logins are as good as absent");
    for (registry, l, field) in [
        ("not a host", Some(login("a")), "registry"),
        ("127.0.0.1:5000/path", Some(login("a")), "registry"),
        ("127.0.0.1:5000", Some(login("a:b")), "username"),
        (
            "127.0.0.1:5000",
            Some(ebb_api::RegistryLogin { username: "a".into(), password: "x".repeat(4097) }),
            "password",
        ),
    ] {
        let e = set(&mut env, &alice, "alice", registry, l).unwrap_err();
        assert_eq!(e.status, 422, "{registry}");
        assert!(e.message.starts_with(field), "{}", e.message);
    }
    env.restart();
    let kept =
        env.call(|reply| Msg::RegistryLoginFor { tenant: 2, registry: "127.0.0.1:5000".into(), reply });
    assert_eq!(kept.map(|l| l.username), Some("alice".to_string()), "kept across a restart");
    assert!(env
        .call(|reply| Msg::RegistryLoginFor { tenant: 3, registry: "127.0.0.1:5000".into(), reply })
        .is_none());

    // Alice's job in an image from that registry starts with her login and
    // as root inside (the operator allowed it); bob's from the same
    // registry carries no login.
    let digest = format!("sha256:{}", "ab".repeat(32));
    let in_image = JobSubmission {
        image: Some("127.0.0.1:5000/train:v1".into()),
        image_digest: Some(digest.clone()),
        ..bare.clone()
    };
    let hers = submit(&mut env, &alice, in_image.clone()).unwrap()[0];
    let his = submit(&mut env, &bob, in_image.clone()).unwrap()[0];
    let unresolved = JobSubmission { image_digest: None, ..in_image };
    assert_eq!(submit(&mut env, &alice, unresolved).unwrap_err().status, 422);
    env.register("n1", Vec::new(), Vec::new());
    let starts: Vec<ebb_api::StartAttempt> = env
        .commands("n1")
        .into_iter()
        .filter_map(|a| match a {
            Action::Start(s) => Some(s),
            _ => None,
        })
        .collect();
    let image_of =
        |id: u64| starts.iter().find(|s| s.attempt.job == id).and_then(|s| s.image.clone()).unwrap();
    let (h, b) = (image_of(hers), image_of(his));
    assert_eq!(
        (h.digest.as_str(), h.username.as_deref(), h.password.as_deref(), h.root),
        (digest.as_str(), Some("alice"), Some("s3cret"), true)
    );
    assert_eq!((b.username, b.password, b.root), (None, None, false));
    assert!(!format!("{h:?}").contains("s3cret"), "a start's Debug never shows the password");
    let shown = env.job(hers).unwrap();
    assert_eq!(shown.image.unwrap().digest, digest);

    // Removed: gone, and after a restart too.
    assert!(set(&mut env, &alice, "alice", "127.0.0.1:5000", None).unwrap().is_empty());
    env.restart();
    assert!(env
        .call(|reply| Msg::RegistryLoginFor { tenant: 2, registry: "127.0.0.1:5000".into(), reply })
        .is_none());
}
