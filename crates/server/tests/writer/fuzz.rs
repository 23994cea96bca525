//! The writer under any input. Arbitrary sequences of API and agent
//! messages, with any value each field's type admits (as the HTTP layer
//! hands them over once a request has parsed), are driven through one
//! `Engine` on a real SQLite file, with restarts in between. Required of
//! every batch: no panic (one request must never stop the server), a
//! commit (a write that fails stops the server too, so no input may make
//! one fail), and the writer's invariants (`Engine::sanity_check`: the
//! core's, and the records against the core) after it; of every restart,
//! that the store loads.
//!
//! The agents' messages speak of attempts the writer really started (the
//! starts polled so far) as well as of made-up ones, so that exits,
//! checkpoints and progress with extreme values reach the handlers behind
//! the fences. `PROPTEST_CASES` sets how many sequences (default 256).

use crate::harness::TestEnv;
use ebb_core::{Attempt, JobId, TenantId};
use std::collections::{BTreeMap, HashMap};

use ebb_api::{
    Action, AgentEvent, AttemptRef, CancelRequest, JobSubmission, PriceUpdate, ReclaimRelease,
    ReclaimRequest, Register, Report, ReportId, ReservationRequest, SweepParam, TenantLimits,
};
use ebb_core::time::LAST_WRITABLE_MS;
use ebb_core::Span;
use ebb_server::engine::{EngineConfig, JobQuery, Msg};
use ebb_server::store::Scope;
use ebb_server::Principal;
use proptest::prelude::*;
use tokio::sync::oneshot;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

mod inputs;
use inputs::*;

/// The writer and what the fuzzer knows of it.
struct World {
    env: TestEnv,
    alice: Principal,
    /// Each node's epoch and the last command seen, once registered.
    agents: HashMap<&'static str, (u64, u64)>,
    /// Nodes that have a credential.
    joined: std::collections::BTreeSet<&'static str>,
    /// Attempts the writer told a node to start, and where.
    started: Vec<(&'static str, AttemptRef)>,
    batches: u64,
    /// Changes of an elastic job's nodes its nodes were told (shrinks
    /// and grows reached).
    changes_of_nodes: u64,
}

fn config(dir: &std::path::Path) -> EngineConfig {
    EngineConfig { min_runtime: Span(2_000), heartbeat_timeout: Span(20_000), ..EngineConfig::for_tests(dir) }
}

impl World {
    fn new(case: u64) -> World {
        let mut env = TestEnv::new(&format!("fuzz-{case}"));
        env.config = config(&env.dir);
        env.restart();
        let mut world = World {
            env,
            alice: Principal::tenant(Scope::Tenant, TenantId(2), "alice"),
            agents: HashMap::new(),
            joined: Default::default(),
            started: Vec::new(),
            batches: 0,
            changes_of_nodes: 0,
        };
        world.restart();
        world.call(|reply| Msg::CreateTenant { name: "alice".into(), reply }).unwrap();
        world
    }

    fn restart(&mut self) {
        self.env.restart();
        // Every agent must register again.
        self.agents.clear();
    }

    /// One batch of `msgs`: it must commit and leave the writer sane.
    fn batch(&mut self, msgs: Vec<Msg>) {
        self.env.batch(msgs);
        self.batches += 1;
    }

    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        let (tx, mut rx) = oneshot::channel();
        self.batch(vec![make(tx)]);
        rx.try_recv().expect("answered after the commit")
    }

    fn attempt(&self, which: Which, node: &str) -> AttemptRef {
        match which {
            Which::Any(attempt) => attempt,
            Which::Started(_) if self.started.is_empty() => AttemptRef { job: JobId(1), attempt: Attempt(1) },
            Which::Started(n) => {
                // Prefer this node's own attempts: those pass the fence.
                let own: Vec<AttemptRef> =
                    self.started.iter().filter(|(s, _)| *s == node).map(|(_, a)| *a).collect();
                match own.is_empty() {
                    true => self.started[n % self.started.len()].1,
                    false => own[n % own.len()],
                }
            }
        }
    }

    fn event(&self, event: &Event, node: &str) -> AgentEvent {
        let now = self.env.now;
        match event.clone() {
            Event::Started { which, pid, at } => {
                AgentEvent::Started { attempt: self.attempt(which, node), pid, at_ms: at.resolve(now) }
            }
            Event::Exited { which, code, signal, completed, at, peak, error, port, ended_by } => {
                AgentEvent::Exited {
                    attempt: self.attempt(which, node),
                    code,
                    signal,
                    completed,
                    at_ms: at.resolve(now),
                    peak_memory_bytes: peak,
                    start_error: error,
                    port_in_use: port,
                    ended_by,
                }
            }
            Event::Checkpoint { which, step, bytes, duration_ms, at } => AgentEvent::Checkpoint {
                attempt: self.attempt(which, node),
                step,
                bytes,
                duration_ms,
                at_ms: at.resolve(now),
            },
            Event::Resumed { which, step, at } => {
                AgentEvent::Resumed { attempt: self.attempt(which, node), step, at_ms: at.resolve(now) }
            }
            Event::Restored { which, from_attempt, upload, step, files, bytes, duration_ms, at } => {
                AgentEvent::Restored {
                    attempt: self.attempt(which, node),
                    from_attempt,
                    upload,
                    step,
                    files,
                    bytes,
                    duration_ms,
                    at_ms: at.resolve(now),
                }
            }
            Event::Progress { which, fraction, at } => {
                AgentEvent::Progress { attempt: self.attempt(which, node), fraction, at_ms: at.resolve(now) }
            }
            Event::Output { which, data } => AgentEvent::Output { attempt: self.attempt(which, node), data },
            Event::Pulling { which, done, total, at } => AgentEvent::Pulling {
                attempt: self.attempt(which, node),
                done_bytes: done,
                total_bytes: total,
                at_ms: at.resolve(now),
            },
            Event::Pulled { which, downloaded, duration_ms, at } => AgentEvent::Pulled {
                attempt: self.attempt(which, node),
                downloaded_bytes: downloaded,
                duration_ms,
                at_ms: at.resolve(now),
            },
            Event::Health { findings, at } => AgentEvent::Health { findings, at_ms: at.resolve(now) },
            Event::Stopping { timeout_ms, at } => {
                AgentEvent::Stopping { stop_timeout_ms: timeout_ms, at_ms: at.resolve(now) }
            }
        }
    }

    fn who(&self, alice: bool) -> Principal {
        if alice {
            self.alice.clone()
        } else {
            self.env.admin.clone()
        }
    }

    fn run(&mut self, step: &Step) {
        match step.clone() {
            Step::Submit { alice, spec } => {
                let principal = self.who(alice);
                let _ = self.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply });
            }
            Step::SubmitBatch { specs } => {
                let principal = self.env.admin.clone();
                let _ = self.call(|reply| Msg::SubmitBatch { principal, specs, reply });
            }
            Step::Cancel { id, grace_ms, alice } => {
                let principal = self.who(alice);
                let _ = self.call(|reply| Msg::Cancel {
                    principal,
                    id: JobId(id),
                    req: CancelRequest { grace_ms },
                    reply,
                });
            }
            Step::Drill { id, alice } => {
                let principal = self.who(alice);
                let _ = self.call(|reply| Msg::Drill { principal, id: JobId(id), reply });
            }
            Step::Signal { id, signal, batch_only, alice } => {
                let principal = self.who(alice);
                let _ = self.call(|reply| Msg::Signal {
                    principal,
                    id: JobId(id),
                    signal,
                    to: (batch_only, false),
                    reply,
                });
            }
            Step::Show { id } => {
                let principal = self.env.admin.clone();
                let _ = self.call(|reply| Msg::Job { principal, id: JobId(id), reply });
            }
            Step::List => {
                let principal = self.alice.clone();
                let query = JobQuery {
                    cursor: None,
                    limit: 100,
                    desc: true,
                    states: None,
                    tier: None,
                    name: None,
                    collapse: true,
                };
                let _ = self.call(|reply| Msg::Jobs { principal, query, reply });
            }
            Step::Log { id, offset } => {
                let principal = self.env.admin.clone();
                let _ = self.call(|reply| Msg::LogFile {
                    principal,
                    id: JobId(id),
                    offset,
                    sources: offset % 2 == 0,
                    reply,
                });
            }
            Step::Register {
                node,
                join,
                gpus,
                model,
                running,
                unreported,
                starts_when_free,
                waiting,
                host,
            } => {
                let name = NODES[node];
                let join = join.unwrap_or(!self.joined.contains(name));
                let principal = if join { Principal::join() } else { Principal::node(name) };
                let reg = Register {
                    node: name.into(),
                    gpu_model: model,
                    gpus,
                    labels: BTreeMap::new(),
                    running: running.iter().map(|w| self.attempt(*w, name)).collect(),
                    address: Some("127.0.0.1".into()),
                    unreported: unreported.iter().map(|e| self.event(e, name)).collect(),
                    starts_when_free,
                    waiting: waiting.iter().map(|w| self.attempt(*w, name)).collect(),
                    cpus: host.0,
                    memory_mib: host.1,
                };
                if let Ok(registered) = self.call(|reply| Msg::Register { principal, reg, reply }) {
                    self.agents.insert(name, (registered.epoch, registered.next_seq));
                    self.joined.insert(name);
                }
            }
            Step::Poll { node, epoch, after, failing } => {
                let name = NODES[node];
                let (known_epoch, known_after) = self.agents.get(name).copied().unwrap_or((0, 0));
                let (epoch, after) = (epoch.unwrap_or(known_epoch), after.unwrap_or(known_after));
                let polled =
                    self.call(|reply| Msg::Poll { node: name.into(), epoch, after, health: failing, reply });
                let poll = match polled {
                    Ok(poll) => poll,
                    // As an agent does: told to register again (the server
                    // restarted, or the node was lost), it does.
                    Err(e) if ebb_server::http::status(e.kind) == 409 => {
                        let running = Vec::new();
                        return self.run(&Step::Register {
                            node,
                            join: None,
                            gpus: 8,
                            model: "H100".into(),
                            running,
                            unreported: vec![],
                            starts_when_free: true,
                            waiting: vec![],
                            host: (Some(64), Some(1 << 19)),
                        });
                    }
                    Err(_) => return,
                };
                {
                    for command in poll.commands {
                        match &command.action {
                            Action::Start(start) => self.started.push((name, start.attempt)),
                            Action::Members(_) => self.changes_of_nodes += 1,
                            _ => {}
                        }
                        if let Some(agent) = self.agents.get_mut(name) {
                            agent.1 = agent.1.max(command.seq);
                        }
                    }
                }
            }
            Step::Report { node, events, id } => {
                let name = NODES[node];
                let events = events.iter().map(|e| self.event(e, name)).collect();
                let id = id.map(|(session, seq)| ReportId { session, seq });
                let report = Report { node: name.into(), events, id };
                let _ = self.call(|reply| Msg::Report { report, reply });
            }
            Step::Node { node, op, gpu } => {
                let name = NODES[node].to_string();
                match op {
                    0 => drop(self.call(|reply| Msg::DrainNode { name, reply })),
                    1 => drop(self.call(|reply| Msg::UndrainNode { name, gpu, reply })),
                    _ => drop(self.call(|reply| Msg::RemoveNode { name, reply })),
                }
            }
            Step::Reclaim { gpus, model, release } => match release {
                false => drop(
                    self.call(|reply| Msg::Reclaim { req: ReclaimRequest { gpus, gpu_model: model }, reply }),
                ),
                true => {
                    drop(self.call(|reply| Msg::ReleaseReclaim {
                        req: ReclaimRelease { gpu_model: model },
                        reply,
                    }))
                }
            },
            Step::Tenant { name, limits, tokens } => {
                let _ = self.call(|reply| Msg::CreateTenant { name: name.clone(), reply });
                let principal = self.env.admin.clone();
                let tenant = name.clone();
                let _ = self.call(|reply| Msg::TenantLimits { principal, tenant, set: Some(limits), reply });
                if let Some(issue) = tokens {
                    let _ = self.call(|reply| Msg::TenantTokens { name, issue, reply });
                }
            }
            Step::RegistryLogin { alice, tenant, registry, login } => {
                let principal = self.who(alice);
                let login = login.map(|(username, password)| ebb_api::RegistryLogin { username, password });
                let set = Some((registry.clone(), login));
                let _ = self.call(|reply| Msg::RegistryLogins { principal, tenant, set, reply });
                let _ = self.call(|reply| Msg::RegistryLoginFor { tenant: TenantId(2), registry, reply });
            }
            Step::Price { model, on_demand, reserved } => {
                let update = PriceUpdate { on_demand_usd: on_demand, reserved_usd: reserved };
                let _ = self.call(|reply| Msg::SetPrice { model, update, reply });
            }
            Step::Reserve { gpus, backdate, start, end, rate, delete } => {
                let req = ReservationRequest {
                    tenant: "alice".into(),
                    gpu_model: "H100".into(),
                    gpus,
                    start,
                    end,
                    rate_usd: rate,
                    backdate,
                };
                let _ = self.call(|reply| Msg::CreateReservation { req, reply });
                if let Some(id) = delete {
                    let _ = self.call(|reply| Msg::DeleteReservation { id, reply });
                }
            }
            Step::Money { from, to, step } => {
                let principal = self.alice.clone();
                let (f, t) = (from.clone(), to.clone());
                let _ = self.call(|reply| Msg::Bill { principal, tenant: None, from: f, to: t, reply });
                let (f, t) = (from.clone(), to.clone());
                let _ = self.call(|reply| Msg::OperatorReport { from: f, to: t, reply });
                let _ = self.call(|reply| Msg::OperatorReportSeries { from, to, step, reply });
            }
            Step::Metrics => {
                let _ = self.call(|reply| Msg::Metrics { reply });
            }
            Step::Webhook { alice, op, req, id, tried } => {
                let principal = self.who(alice);
                match op {
                    0 => drop(self.call(|reply| Msg::CreateWebhook { principal, req, reply })),
                    1 => drop(self.call(|reply| Msg::DeleteWebhook { principal, id, reply })),
                    2 => drop(self.call(|reply| Msg::WebhookLog { principal, id, reply })),
                    _ => {
                        // A delivery id the writer gave out lately, or none.
                        let delivery = self.env.now.saturating_mul(1024).saturating_sub(id % 64);
                        let tried = match tried {
                            0 => ebb_server::webhooks::Tried::Delivered { status: 204 },
                            1 => {
                                ebb_server::webhooks::Tried::Failed { status: Some(500), error: "500".into() }
                            }
                            _ => {
                                ebb_server::webhooks::Tried::GaveUp { status: None, error: "timeout".into() }
                            }
                        };
                        let msg = Msg::WebhookTried { delivery, attempt: 1, tried, at_ms: self.env.now };
                        self.batch(vec![msg]);
                    }
                }
            }
            Step::Advance { ms } => {
                self.env.now = self.env.now.saturating_add(ms);
                self.batch(vec![Msg::Tick]);
            }
            Step::Restart => {
                // The agents come back, as real ones do.
                self.restart();
                for node in 0..NODES.len() {
                    let running: Vec<Which> = Vec::new();
                    self.run(&Step::Register {
                        node,
                        join: None,
                        gpus: 8,
                        model: "H100".into(),
                        running,
                        unreported: vec![],
                        starts_when_free: true,
                        waiting: vec![],
                        host: (Some(64), Some(1 << 19)),
                    });
                }
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256)
}

static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// What all cases together did: batches, attempts started, and each
/// step's kind, printed at the end (`--nocapture`).
static TOTALS: std::sync::Mutex<(u64, u64, BTreeMap<&'static str, u64>, u64)> =
    std::sync::Mutex::new((0, 0, BTreeMap::new(), 0));

fn kind(step: &Step) -> &'static str {
    match step {
        Step::Submit { .. } => "submit",
        Step::SubmitBatch { .. } => "submit_batch",
        Step::Cancel { .. } => "cancel",
        Step::Drill { .. } => "drill",
        Step::Signal { .. } => "signal",
        Step::Show { .. } => "show",
        Step::List => "list",
        Step::Log { .. } => "log",
        Step::Register { .. } => "register",
        Step::Poll { .. } => "poll",
        Step::Report { .. } => "report",
        Step::Node { .. } => "drain/undrain/remove node",
        Step::Reclaim { .. } => "reclaim",
        Step::Tenant { .. } => "tenant",
        Step::Price { .. } => "price",
        Step::RegistryLogin { .. } => "registry login",
        Step::Reserve { .. } => "reservation",
        Step::Money { .. } => "bill/report",
        Step::Metrics => "metrics",
        Step::Webhook { .. } => "webhook",
        Step::Advance { .. } => "advance the clock",
        Step::Restart => "restart",
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_of_messages_panics_the_writer_or_breaks_its_invariants(
        steps in proptest::collection::vec(step(), 1..100)
    ) {
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut world = World::new(case);
        // The nodes join first, most of the time, so that jobs run.
        for node in 0..NODES.len() {
            world.run(&Step::Register { node, join: None, gpus: 8, model: "H100".into(), running: vec![], unreported: vec![], starts_when_free: true, waiting: vec![], host: (None, None) });
        }
        for step in &steps {
            world.run(step);
            *TOTALS.lock().unwrap().2.entry(kind(step)).or_default() += 1;
        }
        // Whatever was left running ends; the writer settles.
        world.env.now = world.env.now.saturating_add(120_000);
        world.batch(vec![Msg::Tick]);
        world.restart();
        world.batch(vec![Msg::Tick]);
        let mut totals = TOTALS.lock().unwrap();
        totals.0 += world.batches;
        totals.1 += world.started.len() as u64;
        totals.3 += world.changes_of_nodes;
        if case + 1 == u64::from(cases()) {
            eprintln!("writer fuzz: {} cases, {} batches, {} attempts started, {} changes of nodes told; steps: {:?}", case + 1, totals.0, totals.1, totals.3, totals.2);
        }
    }
}
