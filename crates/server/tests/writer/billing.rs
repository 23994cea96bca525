//! The billing property: for any sequence of submissions, preemptions,
//! exits, failures, node crashes, agent restarts and server crashes (between
//! batches or in the middle of one), with the server restarted from its
//! store each time (its SQLite file; and, in fewer cases, a PostgreSQL
//! database on a throwaway server), the invoices add up to the usage records, which
//! add up to what the processes actually ran × their rate, to the
//! micro-dollar: every attempt that ran is billed once, none twice; and
//! the invoices count exactly the attempts that were preempted, and those
//! of jobs preempted before.
//!
//! The writer (`Engine`) is driven directly, one batch at a time, at
//! explicit instants; the agents are modelled here, speaking the agent
//! protocol (register, poll, report) as `ebb agent` does, and keeping the
//! truth: when each process really started and ended.

use crate::harness::{Open, TestEnv, T0};
use crate::pg;
use ebb_core::TenantId;

use std::collections::BTreeMap;

use ebb_api::{Action, AgentEvent, AttemptRef, JobSubmission, Register, Report};
use ebb_core::Span;
use ebb_server::billing::Pricing;
use ebb_server::engine::{EngineConfig, Msg};
use ebb_server::store::{Scope, SqliteStore, Store};
use ebb_server::Principal;
use proptest::prelude::*;
use tokio::sync::oneshot;

const MODEL: &str = "H100";
const NODES: usize = 2;
const GPUS: u8 = 4;
/// $2.50 per GPU-hour on demand; preemptible is half.
const ON_DEMAND: i64 = 2_500_000;
const DRAIN_WINDOW_MS: u64 = 3_000;
/// A job preempted before is spared as a victim this long after it resumes.
const MIN_RUNTIME_MS: u64 = 2_000;
/// How long a drained job takes to save and exit.
const SAVE_MS: u64 = 700;

#[derive(Clone, Debug)]
enum Op {
    Submit { on_demand: bool, gpus: u32, acme: bool },
    Advance { ms: u64 },
    Finish { node: usize, pick: usize, ok: bool },
    NodeCrash { node: usize },
    NodeBoot { node: usize },
    AgentRestart { node: usize },
    ServerCrash { mid_batch: bool, down_ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 1u32..=4, any::<bool>()).prop_map(|(on_demand, gpus, acme)| Op::Submit { on_demand, gpus, acme }),
        4 => (100u64..2_500).prop_map(|ms| Op::Advance { ms }),
        3 => (0..NODES, any::<usize>(), prop::bool::weighted(0.8)).prop_map(|(node, pick, ok)| Op::Finish { node, pick, ok }),
        1 => (0..NODES).prop_map(|node| Op::NodeCrash { node }),
        1 => (0..NODES).prop_map(|node| Op::NodeBoot { node }),
        1 => (0..NODES).prop_map(|node| Op::AgentRestart { node }),
        1 => (any::<bool>(), 0u64..4_000).prop_map(|(mid_batch, down_ms)| Op::ServerCrash { mid_batch, down_ms }),
    ]
}

/// A process the modelled agent runs.
struct Proc {
    started: u64,
    gpus: u32,
    tier: String,
    /// Set by a drain: when the job will have saved and exited.
    exit_at: Option<u64>,
}

impl Proc {
    /// Its life, ended at `ended`: a preemption if it exited on its own in
    /// a drain; `gave_up` if it exited on its own, unfinished.
    fn ran(self, attempt: AttemptRef, ended: u64, preempted: bool, gave_up: bool) -> Ran {
        Ran { attempt, tier: self.tier, gpus: self.gpus, started: self.started, ended, preempted, gave_up }
    }
}

/// One process's life: what the bill must come to.
#[derive(Debug)]
struct Ran {
    attempt: AttemptRef,
    tier: String,
    gpus: u32,
    started: u64,
    ended: u64,
    /// It exited on its own during a drain: a preemption.
    preempted: bool,
    /// It exited on its own without reporting completion (neither killed
    /// nor finished): if the server had already given it notice, that
    /// is a preemption too, though the notice had not reached it yet.
    gave_up: bool,
}

struct Node {
    name: String,
    up: bool,
    epoch: Option<u64>,
    after: u64,
    running: BTreeMap<AttemptRef, Proc>,
    /// Events the server has not accepted yet, in order.
    unreported: Vec<AgentEvent>,
    /// The server issued this node its credential: it registers as itself
    /// from then on, no longer with the join token.
    credential: bool,
}

/// The harness's writer (down while its engine is `None`), the modelled
/// nodes and what truly ran on them.
struct World<S: Store> {
    env: TestEnv<S>,
    nodes: Vec<Node>,
    ran: Vec<Ran>,
    acme: Principal,
}

fn config(dir: &std::path::Path) -> EngineConfig {
    EngineConfig {
        drain_window: Span(DRAIN_WINDOW_MS),
        min_runtime: Span(MIN_RUNTIME_MS),
        heartbeat_timeout: Span(2_000),
        pricing: Pricing {
            prices: vec![(MODEL.to_string(), ON_DEMAND, None)],
            default_price: ON_DEMAND,
            discount_bps: 5_000,
        },
        ..EngineConfig::for_tests(dir)
    }
}

/// The server's state in SQLite, a file in the case's directory.
fn sqlite(dir: &std::path::Path) -> Open<SqliteStore> {
    let path = dir.join("ebb.db");
    Box::new(move || SqliteStore::open_unsynced(&path).unwrap())
}

impl<S: Store> World<S> {
    fn new(case: u64, open_store: impl FnOnce(&std::path::Path) -> Open<S>) -> World<S> {
        let mut env = TestEnv::with_store(&format!("billing-{case}"), open_store);
        env.config = config(&env.dir);
        let nodes = (0..NODES)
            .map(|i| Node {
                name: format!("node-{i}"),
                up: true,
                epoch: None,
                after: 0,
                running: BTreeMap::new(),
                unreported: Vec::new(),
                credential: false,
            })
            .collect();
        let acme = Principal::tenant(Scope::Tenant, TenantId(2), "acme");
        let mut world = World { env, nodes, ran: Vec::new(), acme };
        world.open();
        let created = world.call(|reply| Msg::CreateTenant { name: "acme".into(), reply }).unwrap();
        assert!(created.is_ok());
        for i in 0..NODES {
            world.sync(i);
        }
        world
    }

    fn open(&mut self) {
        self.env.restart();
        for node in &mut self.nodes {
            node.epoch = None; // a new server life: register again
        }
    }

    /// One message as its own batch; None while the server is down.
    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Option<T> {
        self.env.engine.as_ref()?;
        self.env.ask(make)
    }

    /// One message that answers nobody, as its own batch.
    fn call_quiet(&mut self, msg: Msg) {
        if self.env.engine.is_some() {
            self.env.call_quiet(msg);
        }
    }

    fn exit(
        &mut self,
        i: usize,
        attempt: AttemptRef,
        code: Option<i32>,
        signal: Option<i32>,
        completed: bool,
    ) {
        let node = &mut self.nodes[i];
        let Some(p) = node.running.remove(&attempt) else { return };
        let preempted = p.exit_at.is_some() && signal.is_none();
        self.ran.push(p.ran(attempt, self.env.now, preempted, signal.is_none() && !completed));
        node.unreported.push(AgentEvent::Exited {
            attempt,
            code,
            signal,
            completed,
            at_ms: self.env.now,
            peak_memory_bytes: None,
            start_error: None,
            port_in_use: None,
            ended_by: None,
        });
    }

    /// Every process of node `i` dies now (a crash, or killed by a new agent).
    fn kill_all(&mut self, i: usize) {
        let attempts: Vec<AttemptRef> = self.nodes[i].running.keys().copied().collect();
        for a in attempts {
            let p = self.nodes[i].running.remove(&a).unwrap();
            self.ran.push(p.ran(a, self.env.now, false, false));
        }
    }

    /// A node crash or an agent restart: only with the server up, right
    /// after a round and the server's tick that writes the contact, so the
    /// node's last word to the server, as stored, is at the instant its
    /// processes die. Whether it happened.
    fn round_then_kill_all(&mut self, i: usize) -> bool {
        if !self.nodes[i].up || self.env.engine.is_none() {
            return false;
        }
        self.sync(i);
        if !self.nodes[i].unreported.is_empty() {
            return false;
        }
        self.call_quiet(Msg::Tick);
        self.kill_all(i);
        true
    }

    /// Drained jobs whose save is done exit (the server need not be up).
    fn exits_due(&mut self, i: usize) {
        let due: Vec<AttemptRef> = self.nodes[i]
            .running
            .iter()
            .filter(|(_, p)| p.exit_at.is_some_and(|t| t <= self.env.now))
            .map(|(a, _)| *a)
            .collect();
        for a in due {
            self.exit(i, a, Some(0), None, false);
        }
    }

    /// What `ebb agent` does in one round: register if it must, deliver
    /// what is unreported, follow its command stream.
    fn sync(&mut self, i: usize) {
        if !self.nodes[i].up || self.env.engine.is_none() {
            return;
        }
        self.exits_due(i);
        if self.nodes[i].epoch.is_none() {
            let node = &self.nodes[i];
            let reg = Register {
                node: node.name.clone(),
                gpu_model: MODEL.into(),
                gpus: GPUS,
                labels: BTreeMap::new(),
                running: node.running.keys().copied().collect(),
                address: Some("127.0.0.1".into()),
                unreported: node.unreported.clone(),
                starts_when_free: false,
                waiting: Vec::new(),
                cpus: None,
                memory_mib: None,
            };
            let principal = if node.credential { Principal::node(&node.name) } else { Principal::join() };
            let Some(Ok(registered)) = self.call(|reply| Msg::Register { principal, reg, reply }) else {
                return;
            };
            let node = &mut self.nodes[i];
            node.credential |= registered.credential.is_some();
            node.epoch = Some(registered.epoch);
            node.after = registered.next_seq;
            node.unreported.clear();
            for a in registered.kill {
                // Never expected here: every process this model runs is one
                // the server knows of. If it were, it ran until now.
                let p = node.running.remove(&a).unwrap();
                self.ran.push(p.ran(a, self.env.now, false, false));
            }
        }
        self.deliver(i);
        let (name, epoch, after) = {
            let n = &self.nodes[i];
            (n.name.clone(), n.epoch.unwrap(), n.after)
        };
        let Some(polled) =
            self.call(|reply| Msg::Poll { node: name, epoch, after, health: Some(None), reply })
        else {
            return;
        };
        let Ok(poll) = polled else {
            self.nodes[i].epoch = None; // the server restarted or lost us: register again
            return;
        };
        for command in poll.commands.into_iter().map(std::sync::Arc::unwrap_or_clone) {
            if std::env::var_os("EBB_BILLING_TRACE").is_some() {
                eprintln!("{} {} <- {:?}", self.env.now - T0, self.nodes[i].name, command.action);
            }
            self.nodes[i].after = command.seq;
            match command.action {
                Action::Start(s) => {
                    let node = &mut self.nodes[i];
                    if node.running.contains_key(&s.attempt) {
                        continue;
                    }
                    let p = Proc {
                        started: self.env.now,
                        gpus: s.gpus.len() as u32,
                        tier: s.tier.clone(),
                        exit_at: None,
                    };
                    node.running.insert(s.attempt, p);
                    node.unreported.push(AgentEvent::Started {
                        attempt: s.attempt,
                        pid: 1,
                        at_ms: self.env.now,
                    });
                }
                Action::Drain(d) => {
                    if let Some(p) = self.nodes[i].running.get_mut(&d.attempt) {
                        p.exit_at.get_or_insert((self.env.now + SAVE_MS).min(d.deadline_ms));
                    } else if let Some(ran) =
                        self.ran.iter_mut().rev().find(|r| r.attempt == d.attempt && r.gave_up)
                    {
                        // It gave up after the server gave it notice, before
                        // the notice arrived: an exit in the drain is a
                        // preemption, whoever knew of it.
                        ran.preempted = true;
                    }
                }
                Action::Stop { attempt, .. } => self.exit(i, attempt, None, Some(15), false),
                Action::Signal { .. } | Action::Members(_) => {}
            }
        }
        self.exits_due(i);
        self.deliver(i);
    }

    fn deliver(&mut self, i: usize) {
        if self.nodes[i].unreported.is_empty() {
            return;
        }
        let report =
            Report { node: self.nodes[i].name.clone(), events: self.nodes[i].unreported.clone(), id: None };
        let sent = report.events.len();
        match self.call(|reply| Msg::Report { report, reply }) {
            Some(Ok(reply)) => {
                self.nodes[i].unreported.drain(..sent);
                assert!(
                    reply.stale.is_empty(),
                    "the server fenced an attempt the model ran: {:?}",
                    reply.stale
                );
            }
            Some(Err(_)) => self.nodes[i].epoch = None,
            None => {}
        }
    }

    fn advance(&mut self, ms: u64) {
        let end = self.env.now + ms;
        while self.env.now < end {
            self.env.now = (self.env.now + 400).min(end);
            for i in 0..NODES {
                self.exits_due(i);
                self.sync(i);
            }
            // Time passes for the scheduler too (heartbeat timeouts).
            let _ = self.call(|_: oneshot::Sender<()>| Msg::Tick);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Submit { on_demand, gpus, acme } => {
                let spec = JobSubmission {
                    tier: Some(if on_demand { "on-demand" } else { "preemptible" }.into()),
                    gpus: Some(gpus),
                    argv: vec!["work".into()],
                    ..Default::default()
                };
                let principal = if acme { self.acme.clone() } else { self.env.admin.clone() };
                let _ = self.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply });
                for i in 0..NODES {
                    self.sync(i);
                }
            }
            Op::Advance { ms } => self.advance(ms),
            Op::Finish { node, pick, ok } => {
                let candidates: Vec<AttemptRef> = self.nodes[node]
                    .running
                    .iter()
                    .filter(|(_, p)| p.exit_at.is_none())
                    .map(|(a, _)| *a)
                    .collect();
                if !candidates.is_empty() {
                    let a = candidates[pick % candidates.len()];
                    self.exit(node, a, Some(if ok { 0 } else { 1 }), None, ok);
                    self.sync(node);
                }
            }
            Op::NodeCrash { node } => {
                if self.round_then_kill_all(node) {
                    self.nodes[node].up = false;
                    self.nodes[node].epoch = None;
                }
            }
            Op::NodeBoot { node } => {
                if !self.nodes[node].up {
                    self.nodes[node].up = true;
                    self.sync(node);
                }
            }
            Op::AgentRestart { node } => {
                // The new agent kills what the old one left running.
                if self.round_then_kill_all(node) {
                    self.nodes[node].epoch = None;
                    self.sync(node);
                }
            }
            Op::ServerCrash { mid_batch, down_ms } => {
                let Some(engine) = self.env.engine.take() else { return };
                if mid_batch {
                    // It dies while handling a node's report: nothing of that
                    // batch is stored, and the agent keeps the events.
                    let i = self.env.now as usize % NODES;
                    let (tx, _rx) = oneshot::channel();
                    let report = Report {
                        node: self.nodes[i].name.clone(),
                        events: self.nodes[i].unreported.clone(),
                        id: None,
                    };
                    engine.crash_during(vec![Msg::Report { report, reply: tx }], self.env.now);
                } else {
                    drop(engine);
                }
                // While it is down, jobs go on; drained ones exit.
                let end = self.env.now + down_ms;
                while self.env.now < end {
                    self.env.now = (self.env.now + 400).min(end);
                    for i in 0..NODES {
                        if self.nodes[i].up {
                            self.exits_due(i);
                        }
                    }
                }
                self.open();
                for i in 0..NODES {
                    self.sync(i);
                }
            }
        }
    }

    /// Lets everything that runs finish, and the server notice lost nodes.
    fn settle(&mut self) {
        if self.env.engine.is_none() {
            self.open();
        }
        for _ in 0..200 {
            for i in 0..NODES {
                let attempts: Vec<AttemptRef> = self.nodes[i].running.keys().copied().collect();
                for a in attempts {
                    if self.nodes[i].running[&a].exit_at.is_none() {
                        self.exit(i, a, Some(0), None, true);
                    }
                }
            }
            self.advance(500);
            let principal = self.env.admin.clone();
            let live = self
                .call(|reply| Msg::Jobs {
                    principal,
                    query: ebb_server::engine::JobQuery {
                        cursor: Some(0),
                        limit: usize::MAX,
                        ..Default::default()
                    },
                    reply,
                })
                .unwrap()
                .unwrap()
                .jobs
                .iter()
                .any(|j| matches!(j.state.as_str(), "starting" | "running" | "draining"));
            if !live && self.nodes.iter().all(|n| n.running.is_empty() && n.unreported.is_empty()) {
                return;
            }
        }
        panic!("the cluster did not settle");
    }
}

/// What a process's life costs: per started second, at its tier's rate.
fn truth_amount(r: &Ran) -> i64 {
    let rate = match r.tier.as_str() {
        "on-demand" => ON_DEMAND,
        "preemptible" => ON_DEMAND / 2,
        other => panic!("unexpected tier {other}"),
    };
    let gpu_seconds = (r.ended - r.started).div_ceil(1000) * u64::from(r.gpus);
    (i128::from(rate) * i128::from(gpu_seconds) * 1000 / 3_600_000) as i64
}

fn check(ops: &[Op], case: u64) -> Result<(), TestCaseError> {
    check_on(ops, case, sqlite)
}

fn check_on<S: Store>(
    ops: &[Op],
    case: u64,
    open_store: impl FnOnce(&std::path::Path) -> Open<S>,
) -> Result<(), TestCaseError> {
    let mut world = World::new(case, open_store);
    for op in ops {
        if std::env::var_os("EBB_BILLING_TRACE").is_some() {
            eprintln!("{} {op:?}", world.env.now - T0);
        }
        world.apply(op);
    }
    world.settle();

    let records = (world.env.open_store)().usage(None, 0, u64::MAX).unwrap();
    let (mut invoiced, mut preemptions, mut repeat_preemptions, mut within_min_runtime) = (0, 0, 0, 0);
    for tenant in ["default", "acme"] {
        let principal = world.env.admin.clone();
        let invoice = world
            .call(|reply| Msg::Bill {
                principal,
                tenant: Some(tenant.into()),
                from: "2000-01-01".into(),
                to: "2200-01-01".into(),
                reply,
            })
            .unwrap()
            .unwrap();
        let lines: i64 = invoice.lines.iter().map(|l| l.amount_micro_usd).sum();
        prop_assert_eq!(lines, invoice.total_micro_usd);
        invoiced += lines;
        preemptions += invoice.preemptions;
        repeat_preemptions += invoice.repeat_preemptions;
        within_min_runtime += invoice.preemptions_within_min_runtime;
    }
    let recorded: i64 = records.iter().map(|r| r.amount).sum();
    let truth: i64 = world.ran.iter().map(truth_amount).sum();
    prop_assert_eq!(invoiced, recorded, "invoices vs usage records");
    // One record per process that ran, metered over its real life.
    let mut by_attempt: BTreeMap<(u64, u32), &ebb_server::store::UsageRow> = BTreeMap::new();
    for r in &records {
        prop_assert!(by_attempt.insert((r.job.0, r.attempt.0), r).is_none(), "attempt billed twice");
    }
    prop_assert_eq!(records.len(), world.ran.len(), "records vs processes that ran: {:?}", world.ran);
    for ran in &world.ran {
        let r = by_attempt.get(&(ran.attempt.job.0, ran.attempt.attempt.0));
        prop_assert!(r.is_some(), "{:?} ran but was not billed", ran);
        let r = r.unwrap();
        prop_assert_eq!((r.started_ms, r.ended_ms, r.gpus), (ran.started, ran.ended, ran.gpus), "{:?}", ran);
        prop_assert_eq!(&r.tier, &ran.tier);
    }
    prop_assert_eq!(recorded, truth, "usage records vs what ran x rate");
    // Preemptions: every process that exited on its own in a drain, and of
    // those every one after its job's first.
    let mut preempted_by_job: BTreeMap<u64, u64> = BTreeMap::new();
    for ran in world.ran.iter().filter(|r| r.preempted) {
        *preempted_by_job.entry(ran.attempt.job.0).or_default() += 1;
    }
    let truth_preemptions: u64 = preempted_by_job.values().sum();
    let truth_repeats: u64 = preempted_by_job.values().map(|n| n - 1).sum();
    prop_assert_eq!((preemptions, repeat_preemptions), (truth_preemptions, truth_repeats), "{:?}", world.ran);
    prop_assert!(within_min_runtime <= repeat_preemptions);
    if std::env::var_os("EBB_BILLING_TRACE").is_some() {
        let outcomes: BTreeMap<&str, usize> = records.iter().fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r.outcome.as_str()).or_insert(0) += 1;
            m
        });
        eprintln!(
            "case {case}: {} ops, {} attempts billed {outcomes:?}, {recorded} micro-USD",
            ops.len(),
            records.len()
        );
    }
    // The default book: preemptible is exactly half of on-demand.
    let book = world.call(|reply| Msg::Prices { reply }).unwrap();
    for p in &book.prices {
        prop_assert_eq!(p.preemptible_micro_usd * 2, p.on_demand_micro_usd);
    }
    drop(world.env.engine.take());
    let _ = std::fs::remove_dir_all(&world.env.dir);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invoices_equal_usage_records_equal_what_ran_times_the_rate(ops in prop::collection::vec(op(), 1..60)) {
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        check(&ops, CASE.fetch_add(1, std::sync::atomic::Ordering::SeqCst))?;
    }
}

/// The same property with the server's state in PostgreSQL: a database of
/// its own per case, on one throwaway server. Fewer cases: each batch is
/// a round trip to another process.
#[test]
fn on_postgres_invoices_equal_usage_records_equal_what_ran_times_the_rate() {
    use proptest::test_runner::{Config, TestRunner};
    let server = pg::Postgres::start("billing");
    let admin = std::cell::RefCell::new(postgres::Client::connect(&server.url(), postgres::NoTls).unwrap());
    let case = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Config { cases: 48, ..Config::default() });
    let result = runner.run(&prop::collection::vec(op(), 1..60), |ops| {
        case.set(case.get() + 1);
        let name = format!("billing_{}", case.get());
        admin.borrow_mut().batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let url = server.url_for(&name);
        let outcome = check_on(&ops, 2_000_000 + case.get(), |_| {
            Box::new(move || ebb_server::store::pg::PgStore::open(&url).unwrap())
        });
        admin.borrow_mut().batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).unwrap();
        outcome
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn a_node_back_from_a_crash_before_a_server_restart() {
    let ops = [
        Op::NodeCrash { node: 0 },
        Op::Submit { on_demand: false, gpus: 3, acme: false },
        Op::Submit { on_demand: false, gpus: 2, acme: false },
        Op::Submit { on_demand: true, gpus: 3, acme: false },
        Op::NodeCrash { node: 1 },
        Op::Submit { on_demand: true, gpus: 3, acme: false },
        Op::NodeBoot { node: 1 },
        Op::ServerCrash { mid_batch: false, down_ms: 0 },
    ];
    check(&ops, 1_000_001).unwrap();
}

#[test]
fn a_crash_in_the_middle_of_a_report_loses_nothing_and_counts_nothing_twice() {
    let ops = [
        Op::Submit { on_demand: false, gpus: 4, acme: true },
        Op::Submit { on_demand: false, gpus: 4, acme: false },
        Op::Advance { ms: 1_500 },
        Op::Submit { on_demand: true, gpus: 4, acme: false },
        Op::Advance { ms: 300 },
        Op::ServerCrash { mid_batch: true, down_ms: 2_500 },
        Op::Finish { node: 0, pick: 0, ok: true },
        Op::NodeCrash { node: 1 },
        Op::Advance { ms: 3_000 },
        Op::NodeBoot { node: 1 },
        Op::AgentRestart { node: 0 },
        Op::Advance { ms: 1_000 },
    ];
    check(&ops, 1_000_000).unwrap();
}
