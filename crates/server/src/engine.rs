//! The server's single writer: one thread owns the scheduling core, the
//! store and the agents' command streams, and handles messages in batches.
//!
//! A batch is one store transaction: every message in it is applied to the
//! core and the store, the core is asked for plans until it has nothing more
//! to do, the transaction commits, and only then are callers answered and
//! agents woken. So an acknowledged submission is durable, and what agents
//! are told to do is always something the store already says.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use ebb_api::{
    Action, AgentEvent, AttemptRef, Command, DrainAttempt, JobEvent, JobSubmission, Register, Registered,
    ReportReply, StartAttempt,
};
use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Span, TenantId, Tier, Time};
use ebb_scheduler::{DrainReason, ExitEffect, ExitKind, JobSpec, NodeSpec, NodeStatus, Notice, Phase, State};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{oneshot, watch};

use crate::store::{NodeRow, PriceRow, ReservationRow, Scope, Store, TenantRow, TokenRow};
use crate::{hash_token, new_token, rfc3339, ApiError, Principal, TokenMap, TokenState};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Draining,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Draining => "draining",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn is_live(self) -> bool {
        matches!(self, JobState::Starting | JobState::Running | JobState::Draining)
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

/// The server's record of a job: what the store keeps.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: u64,
    pub tenant: u32,
    pub spec: JobSubmission,
    #[serde(with = "tier_name")]
    pub tier: Tier,
    pub gpus: u32,
    pub signal: i32,
    pub state: JobState,
    pub attempt: u32,
    pub preemptions: u32,
    pub retries: u32,
    pub submitted_ms: u64,
    /// Live attempt: GPUs by node, when it started, nodes still running it.
    pub placement: Vec<(String, Vec<u8>)>,
    pub started_ms: u64,
    pub running_on: Vec<String>,
    pub notice: Option<(u64, u64, String)>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub cancel_requested: bool,
    /// A node lost track of the live attempt.
    pub vanished: bool,
    /// GPUs held for this queued job while `waiting_for` drain.
    #[serde(default)]
    pub held: Vec<(String, Vec<u8>)>,
    #[serde(default)]
    pub waiting_for: Vec<u64>,
    /// The array or sweep this job is a task of.
    #[serde(default)]
    pub array: Option<ebb_api::ArrayTask>,
    #[serde(default)]
    pub checkpoints: CheckpointStats,
    /// The live attempt, by the agents' clocks: when its first process
    /// started, the nodes that have started it, when its last checkpoint
    /// completed, and when its last process exited.
    #[serde(default)]
    pub run_started_ms: Option<u64>,
    #[serde(default)]
    pub started_on: Vec<String>,
    #[serde(default)]
    pub attempt_checkpoint_ms: Option<u64>,
    #[serde(default)]
    pub exited_ms: u64,
    /// Work lost over all attempts, GPU-milliseconds.
    #[serde(default)]
    pub lost_gpu_ms: u64,
    /// The interval recommended to the latest attempt, seconds, and why.
    #[serde(default)]
    pub interval: Option<(u64, String)>,
    /// A live gang's rendezvous (`MASTER_ADDR`, `MASTER_PORT`).
    #[serde(default)]
    pub rendezvous: Option<(String, u16)>,
    /// The live attempt's GPU model and rates per GPU-hour (its tier's, and
    /// on-demand's), fixed when it was placed.
    #[serde(default)]
    pub billing: Option<(String, i64, i64)>,
    /// A queued job kept out of the scheduler for now, and why.
    #[serde(default)]
    pub waiting: Option<Waiting>,
    /// Quick exits in a row of a `--restart always` job: its back-off.
    #[serde(default)]
    pub quick_exits: u32,
}

/// Why a queued job is not in the scheduling core yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// A `--restart always` job that keeps exiting quickly runs again
    /// only after `until_ms`, as Kubernetes' CrashLoopBackOff.
    Backoff { until_ms: u64 },
    /// Its tenant has `max_running_jobs` admitted; it is admitted when
    /// one of them finishes, in submission order.
    TenantLimit,
}

/// A `--restart always` run shorter than this counts as a quick exit.
pub const QUICK_EXIT_MS: u64 = 10_000;
/// The back-off after the n-th quick exit in a row: 1 s, doubling, at most 5 min.
pub fn restart_backoff_ms(quick_exits: u32) -> u64 {
    match quick_exits {
        0 => 0,
        n => (1_000u64 << (n - 1).min(20)).min(300_000),
    }
}

/// What one tenant has in the server, against its limits.
#[derive(Clone, Debug, Default)]
struct TenantLoad {
    /// Jobs not finished, and the bytes of their arguments and environments.
    jobs: u64,
    bytes: u64,
    /// Jobs admitted to the scheduling core (queued there, running, or in
    /// a restart back-off).
    admitted: u64,
    /// Jobs waiting for admission, by id: submission order.
    waiting: BTreeSet<u64>,
}

/// What a job's checkpoint reports have shown.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckpointStats {
    pub last: Option<ebb_api::Checkpoint>,
    pub count: u64,
    /// How long the latest few took, milliseconds: δ is their mean.
    pub recent_ms: Vec<u64>,
    /// The job was warned that a checkpoint does not fit the drain window.
    pub warned: bool,
}

impl CheckpointStats {
    const RECENT: usize = 5;

    fn record(&mut self, checkpoint: ebb_api::Checkpoint, duration_ms: u64) {
        self.last = Some(checkpoint);
        self.count += 1;
        self.recent_ms.push(duration_ms);
        if self.recent_ms.len() > Self::RECENT {
            self.recent_ms.remove(0);
        }
    }

    /// δ: the mean of the recent checkpoint times, once there are any.
    fn checkpoint_time(&self) -> Option<Span> {
        let n = self.recent_ms.len() as u64;
        (n > 0).then(|| Span(self.recent_ms.iter().sum::<u64>() / n))
    }
}

mod tier_name {
    use ebb_core::Tier;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(tier: &Tier, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tier.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A message for the writer thread.
pub enum Msg {
    Submit {
        principal: Principal,
        spec: JobSubmission,
        reply: oneshot::Sender<Result<Vec<u64>, ApiError>>,
    },
    Jobs {
        principal: Principal,
        /// Jobs with ids above this.
        after: u64,
        limit: usize,
        reply: oneshot::Sender<ebb_api::JobPage>,
    },
    Job {
        principal: Principal,
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::Job, ApiError>>,
    },
    Cancel {
        principal: Principal,
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::Job, ApiError>>,
    },
    LogFile {
        principal: Principal,
        id: u64,
        reply: oneshot::Sender<Result<(PathBuf, bool), ApiError>>,
    },
    Nodes {
        reply: oneshot::Sender<Vec<ebb_api::Node>>,
    },
    DrainNode {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::Node, ApiError>>,
    },
    Reclaim {
        req: ebb_api::ReclaimRequest,
        reply: oneshot::Sender<Result<ebb_api::ReclaimReply, ApiError>>,
    },
    CreateTenant {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::TenantCreated, ApiError>>,
    },
    /// A tenant's limits and usage; with `set`, first replaces its limits.
    TenantLimits {
        principal: Principal,
        tenant: String,
        set: Option<ebb_api::TenantLimits>,
        reply: oneshot::Sender<Result<ebb_api::TenantUsage, ApiError>>,
    },
    /// `principal` is the join token, or the node's own credential.
    Register {
        principal: Principal,
        reg: Register,
        reply: oneshot::Sender<Result<Registered, ApiError>>,
    },
    /// `node` is the one the caller's credential speaks for.
    Poll {
        node: String,
        epoch: u64,
        after: u64,
        /// What the poll says of the node's health: `Some(Some(why))` its
        /// reports keep failing (it is unhealthy), `Some(None)` they do
        /// not; `None` says nothing (a long poll asking again).
        health: Option<Option<String>>,
        reply: oneshot::Sender<Result<Poll, ApiError>>,
    },
    /// `report.node` is the one the caller's credential speaks for.
    Report {
        report: ebb_api::Report,
        reply: oneshot::Sender<Result<ReportReply, ApiError>>,
    },
    Metrics {
        reply: oneshot::Sender<crate::metrics::Snapshot>,
    },
    RemoveNode {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::NodeRemoved, ApiError>>,
    },
    RotateJoinToken {
        reply: oneshot::Sender<Result<ebb_api::JoinToken, ApiError>>,
    },
    TenantTokens {
        name: String,
        /// A new token (rotate) or none (revoke); every older one goes.
        issue: bool,
        reply: oneshot::Sender<Result<ebb_api::TenantTokens, ApiError>>,
    },
    Prices {
        reply: oneshot::Sender<ebb_api::PriceBook>,
    },
    SetPrice {
        model: String,
        update: ebb_api::PriceUpdate,
        reply: oneshot::Sender<Result<ebb_api::Price, ApiError>>,
    },
    CreateReservation {
        req: ebb_api::ReservationRequest,
        reply: oneshot::Sender<Result<ebb_api::Reservation, ApiError>>,
    },
    Reservations {
        principal: Principal,
        reply: oneshot::Sender<Vec<ebb_api::Reservation>>,
    },
    DeleteReservation {
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::Reservation, ApiError>>,
    },
    Bill {
        principal: Principal,
        tenant: Option<String>,
        from: String,
        to: String,
        reply: oneshot::Sender<Result<ebb_api::Invoice, ApiError>>,
    },
    OperatorReport {
        from: String,
        to: String,
        reply: oneshot::Sender<Result<ebb_api::OperatorReport, ApiError>>,
    },
    Tick,
}

pub struct Poll {
    pub commands: Vec<Command>,
    pub next_seq: u64,
    pub changed: watch::Receiver<u64>,
}

/// One node's command stream.
struct Channel {
    commands: VecDeque<Command>,
    next_seq: u64,
    notify: watch::Sender<u64>,
}

impl Channel {
    fn new() -> Channel {
        Channel { commands: VecDeque::new(), next_seq: 1, notify: watch::channel(0).0 }
    }

    fn push(&mut self, action: Action) {
        self.commands.push_back(Command { seq: self.next_seq, action });
        self.next_seq += 1;
    }
}

/// How one part of an attempt ended, as its agent reported it (or
/// `vanished` when its node was lost).
struct PartExit {
    code: Option<i32>,
    signal: Option<i32>,
    completed: bool,
    vanished: bool,
    peak_memory_bytes: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub drain_window: Span,
    pub heartbeat_timeout: Span,
    pub heartbeat_interval: Span,
    /// How far ahead of the server's clock an event time from a node may
    /// be before the report is refused.
    pub max_clock_skew: Span,
    pub pricing: crate::billing::Pricing,
    pub limits: crate::validate::Limits,
    pub run_as: RunAs,
}

/// Which Unix user runs each tenant's jobs on the nodes: the operator's
/// mapping, and a default for tenants it does not name. A root agent
/// never runs a tenant's job as root unless it was told it may.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub by_tenant: BTreeMap<String, String>,
    pub default: String,
}

impl Default for RunAs {
    fn default() -> Self {
        RunAs { by_tenant: BTreeMap::new(), default: "nobody".into() }
    }
}

impl RunAs {
    pub fn user(&self, tenant: &str) -> &str {
        self.by_tenant.get(tenant).unwrap_or(&self.default)
    }
}

pub struct Engine<S: Store> {
    store: S,
    config: EngineConfig,
    sched: ebb_scheduler::Config,
    core: State,
    jobs: BTreeMap<u64, JobRecord>,
    tenants: BTreeMap<u32, String>,
    tokens: TokenMap,
    /// Each node's credential, by node name: its hash.
    node_credentials: BTreeMap<String, String>,
    nodes: BTreeMap<String, NodeRow>,
    channels: HashMap<String, Channel>,
    next_job: u64,
    /// Changes with every server start, so agents notice a restart.
    epoch: u64,
    counters: crate::metrics::Counters,
    /// Replies and wake-ups held until the batch commits.
    after_commit: Vec<Box<dyn FnOnce() + Send>>,
    woken: BTreeSet<String>,
    /// Each array's tasks, by the array's id (its first task's).
    arrays: BTreeMap<u64, Vec<u64>>,
    prices: BTreeMap<String, PriceRow>,
    reservations: BTreeMap<u64, ReservationRow>,
    /// When each node was last heard from before this server started, and
    /// the nodes heard from since.
    heard_before: HashMap<String, u64>,
    heard_since_start: BTreeSet<String>,
    /// Per tenant, what its unfinished jobs hold against its limits, and
    /// the limits the operator set for it alone.
    load: BTreeMap<u32, TenantLoad>,
    tenant_limits: BTreeMap<u32, ebb_api::TenantLimits>,
    /// Jobs in a restart back-off, by when they may run again.
    backoff: BTreeSet<(u64, u64)>,
    /// Nodes whose agents say their reports keep failing, and why.
    unhealthy: HashMap<String, String>,
}

/// What the writer thread answers with when the store fails.
fn storage_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("storage: {e}"))
}

impl<S: Store> Engine<S> {
    /// Loads the store (creating the first tenant and tokens on first
    /// start) and rebuilds the core from it.
    pub fn open(
        mut store: S,
        config: EngineConfig,
        tokens: TokenMap,
        now: u64,
    ) -> Result<(Engine<S>, Vec<String>), ApiError> {
        let mut snapshot = store.load::<JobRecord>().map_err(storage_error)?;
        let sched = ebb_scheduler::Config {
            drain_window: config.drain_window,
            victim_policy: ebb_scheduler::VictimPolicy::LostWork,
            heartbeat_timeout: Some(config.heartbeat_timeout),
        };
        let mut engine = Engine {
            store,
            config,
            sched,
            core: State::new(),
            jobs: BTreeMap::new(),
            tenants: BTreeMap::new(),
            tokens,
            node_credentials: BTreeMap::new(),
            nodes: BTreeMap::new(),
            channels: HashMap::new(),
            next_job: 1,
            epoch: {
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(e.to_string()))?;
                u64::from_le_bytes(bytes) >> 1
            },
            counters: Default::default(),
            after_commit: Vec::new(),
            woken: BTreeSet::new(),
            arrays: BTreeMap::new(),
            prices: BTreeMap::new(),
            reservations: BTreeMap::new(),
            heard_before: HashMap::new(),
            heard_since_start: BTreeSet::new(),
            load: BTreeMap::new(),
            tenant_limits: BTreeMap::new(),
            backoff: BTreeSet::new(),
            unhealthy: HashMap::new(),
        };
        let mut notes = Vec::new();
        if snapshot.tenants.is_empty() {
            notes = engine.bootstrap()?;
            snapshot = engine.store.load::<JobRecord>().map_err(storage_error)?;
        }
        for t in &snapshot.tenants {
            engine.tenants.insert(t.id, t.name.clone());
        }
        engine.tenant_limits = std::mem::take(&mut snapshot.tenant_limits).into_iter().collect();
        {
            let mut map = engine.tokens.write().expect("token map");
            for t in &snapshot.tokens {
                let tenant = t.tenant.and_then(|id| engine.tenants.get(&id).map(|n| (id, n.clone())));
                let principal = Principal { scope: t.scope, tenant, node: t.node.clone() };
                map.insert(t.hash.clone(), TokenState::Valid(principal));
                if let (Scope::Node, Some(node)) = (t.scope, &t.node) {
                    engine.node_credentials.insert(node.clone(), t.hash.clone());
                }
            }
        }
        for mut node in snapshot.nodes {
            if node.joined_ms == 0 {
                node.joined_ms = now;
            }
            let spec = NodeSpec {
                name: node.name.clone(),
                gpu_model: node.gpu_model.clone(),
                gpus: node.gpus,
                labels: node.labels.clone(),
            };
            let id = engine.core.add_node(spec, Time(now)).map_err(|e| ApiError::internal(e.to_string()))?;
            if node.drained {
                let _ = engine.core.drain_node(id);
            }
            if node.removed {
                let _ = engine.core.lose_node(id);
            }
            engine.channels.insert(node.name.clone(), Channel::new());
            engine.nodes.insert(node.name.clone(), node);
        }
        let mut requeued = Vec::new();
        for job in snapshot.jobs {
            engine.next_job = engine.next_job.max(job.id + 1);
            let id = job.id;
            let state = job.state;
            if let Some(array) = &job.array {
                engine.arrays.entry(array.id).or_default().push(id);
            }
            let waiting = job.waiting;
            if !state.is_final() {
                let load = engine.load.entry(job.tenant).or_default();
                load.jobs += 1;
                load.bytes += crate::validate::command_bytes(&job.spec);
                match waiting {
                    Some(Waiting::TenantLimit) => {
                        load.waiting.insert(id);
                    }
                    _ => load.admitted += 1,
                }
            }
            engine.jobs.insert(id, job);
            match (state, waiting) {
                (JobState::Queued, Some(Waiting::Backoff { until_ms })) => {
                    engine.backoff.insert((until_ms, id));
                }
                (JobState::Queued, Some(Waiting::TenantLimit)) => {}
                (JobState::Queued, None) => engine.restore_queued(id)?,
                (s, _) if s.is_live() => {
                    if let Err(e) = engine.restore(id) {
                        requeued.push((id, e));
                    }
                }
                _ => {}
            }
        }
        engine.store.begin().map_err(storage_error)?;
        engine.heard_before = snapshot.heard.into_iter().collect();
        for price in snapshot.prices {
            engine.prices.insert(price.gpu_model.clone(), price);
        }
        for (model, on_demand, reserved) in engine.config.pricing.prices.clone() {
            let row =
                PriceRow { gpu_model: model.clone(), on_demand, reserved: reserved.unwrap_or(on_demand) };
            engine.store.put_price(&row).map_err(storage_error)?;
            engine.prices.insert(model, row);
        }
        let models: Vec<String> = engine.nodes.values().map(|n| n.gpu_model.clone()).collect();
        for model in models {
            engine.price_for(&model);
        }
        for r in snapshot.reservations {
            if let Err(e) = engine.core.add_reservation(engine.core_reservation(&r)?) {
                tracing::error!(reservation = r.id, "not restored: {e}");
            }
            engine.reservations.insert(r.id, r);
        }
        for (id, why) in requeued {
            let job = engine.jobs.get_mut(&id).expect("loaded");
            job.state = JobState::Queued;
            job.placement.clear();
            job.running_on.clear();
            job.notice = None;
            engine.restore_queued(id)?;
            engine.event(id, "requeued", json!({ "reason": format!("server restart: {why}") }));
            engine.save(id);
        }
        // Holds last: their victims must be back first.
        let holders: Vec<u64> = engine
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued && !j.held.is_empty())
            .map(|j| j.id)
            .collect();
        for id in holders {
            if let Err(why) = engine.restore_hold(id) {
                tracing::warn!(job = id, "hold not restored: {why}");
                let job = engine.jobs.get_mut(&id).expect("loaded");
                job.held.clear();
                job.waiting_for.clear();
                engine.save(id);
            }
        }
        // The limits may have been raised since.
        let tenants: Vec<u32> = engine.load.keys().copied().collect();
        for tenant in tenants {
            engine.admit_waiting(tenant);
        }
        engine.store.commit().map_err(storage_error)?;
        engine.after_commit.clear();
        Ok((engine, notes))
    }

    /// First start: the default tenant, an admin token and a join token,
    /// written under the data dir (0600).
    fn bootstrap(&mut self) -> Result<Vec<String>, ApiError> {
        self.store.begin().map_err(storage_error)?;
        let tenant = TenantRow { id: 1, name: "default".into() };
        self.store.put_tenant(&tenant).map_err(storage_error)?;
        let mut notes = Vec::new();
        for (file, scope) in [("admin.token", Scope::Admin), ("join.token", Scope::Agent)] {
            let token = new_token();
            let tenant = (scope == Scope::Admin).then_some(1);
            self.store
                .put_token(&TokenRow { hash: hash_token(&token), tenant, scope, node: None })
                .map_err(storage_error)?;
            let path = self.config.data_dir.join(file);
            write_secret(&path, &token)
                .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
            notes.push(path.display().to_string());
        }
        self.store.commit().map_err(storage_error)?;
        Ok(notes)
    }

    /// The model's prices, adding the default price for a model first seen.
    fn price_for(&mut self, model: &str) -> PriceRow {
        if let Some(row) = self.prices.get(model) {
            return row.clone();
        }
        let price = self.config.pricing.default_price;
        let row = PriceRow { gpu_model: model.to_string(), on_demand: price, reserved: price };
        if let Err(e) = self.store.put_price(&row) {
            tracing::error!("cannot store the price of {model}: {e}");
        }
        tracing::info!(gpu_model = model, on_demand = %crate::billing::usd(price), "priced at the default");
        self.prices.insert(model.to_string(), row.clone());
        row
    }

    fn core_reservation(&self, r: &ReservationRow) -> Result<ebb_scheduler::Reservation, ApiError> {
        let model = self
            .core
            .model_by_name(&r.gpu_model)
            .ok_or_else(|| ApiError::bad_request(format!("gpu_model: unknown model {:?}", r.gpu_model)))?;
        Ok(ebb_scheduler::Reservation {
            id: ebb_core::ReservationId(r.id as u32),
            tenant: TenantId(r.tenant),
            gpu_model: model,
            gpus: r.gpus,
            start: Time(r.start_ms),
            end: Time(r.end_ms),
        })
    }

    fn spec_of(&self, id: u64) -> JobSpec {
        let job = &self.jobs[&id];
        JobSpec {
            id: JobId(id),
            tenant: TenantId(job.tenant),
            tier: job.tier,
            gpus: job.gpus,
            gpu_model: job.spec.gpu_model.as_deref().and_then(|m| self.core.model_by_name(m)),
            submitted_at: Time(job.submitted_ms),
            max_preemptions: job.spec.max_preemptions,
        }
    }

    /// Puts a queued job back into the core, with the attempts it has had.
    fn restore_queued(&mut self, id: u64) -> Result<(), ApiError> {
        let (attempt, preemptions) = (self.jobs[&id].attempt, self.jobs[&id].preemptions);
        self.core
            .restore_queued(self.spec_of(id), Attempt(attempt), preemptions)
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Puts a job that was running before a restart back into the core.
    fn restore(&mut self, id: u64) -> Result<(), String> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.placement)?;
        let notice = job.notice.as_ref().map(|(at, deadline, _)| Notice {
            notice_at: Time(*at),
            deadline: Time(*deadline),
            reason: DrainReason::Reclaim,
        });
        let (attempt, preemptions, started) = (job.attempt, job.preemptions, job.started_ms);
        let checkpoint = job.attempt_checkpoint_ms.map(Time);
        self.core
            .restore_run(
                self.spec_of(id),
                Attempt(attempt),
                preemptions,
                alloc,
                Time(started),
                checkpoint,
                notice,
            )
            .map_err(|e| e.to_string())
    }

    /// GPUs by node as the core has them (ids, bit masks) to GPUs by node
    /// as records and agents have them (names, indices), and back.
    fn named(&self, alloc: &[(NodeId, u64)]) -> Vec<(String, Vec<u8>)> {
        alloc
            .iter()
            .map(|(node, mask)| {
                let name = self.core.node(*node).expect("known node").name.clone();
                (name, (0..64u8).filter(|g| mask & (1 << g) != 0).collect())
            })
            .collect()
    }

    fn masks(&self, named: &[(String, Vec<u8>)]) -> Result<Vec<(NodeId, u64)>, String> {
        named
            .iter()
            .map(|(node, gpus)| {
                let id = self.core.node_by_name(node).ok_or_else(|| format!("node {node} is gone"))?;
                Ok((id, gpus.iter().fold(0u64, |m, g| m | (1 << g))))
            })
            .collect()
    }

    fn restore_hold(&mut self, id: u64) -> Result<(), String> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.held)?;
        let victims: Vec<JobId> = job.waiting_for.iter().map(|v| JobId(*v)).collect();
        self.core.restore_hold(JobId(id), alloc, &victims).map_err(|e| e.to_string())
    }

    /// Runs the writer loop until every sender is gone.
    pub fn run(mut self, mut rx: tokio::sync::mpsc::Receiver<Msg>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(msg) => batch.push(msg),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.batch(batch, now_ms()) {
                // Nothing of this batch is acknowledged; callers see the error
                // as a dropped reply. Memory is ahead of the store now, so stop
                // rather than serve state the store does not have.
                tracing::error!("{e}; stopping");
                std::process::exit(70);
            }
        }
    }

    /// Handles one batch of messages at `now` as one store transaction:
    /// apply them, schedule until settled, commit, then answer and wake.
    /// On a failed commit nothing of the batch is answered and the engine
    /// must not be used again.
    pub fn batch(&mut self, batch: Vec<Msg>, now: u64) -> Result<(), String> {
        self.store.begin().map_err(|e| format!("cannot begin a transaction: {e}"))?;
        for msg in batch {
            self.handle(msg, now);
        }
        self.schedule(now);
        match self.store.commit() {
            Ok(()) => {
                for reply in self.after_commit.drain(..) {
                    reply();
                }
                for node in std::mem::take(&mut self.woken) {
                    if let Some(ch) = self.channels.get(&node) {
                        ch.notify.send_replace(ch.next_seq);
                    }
                }
                Ok(())
            }
            Err(e) => {
                self.after_commit.clear();
                let _ = self.store.rollback();
                Err(format!("commit failed: {e}"))
            }
        }
    }

    /// Handles a batch but dies before committing it, as a `kill -9` in
    /// the middle of a batch would: nothing of it reaches the store or any
    /// caller. For tests of crash safety.
    pub fn crash_during(mut self, batch: Vec<Msg>, now: u64) {
        if self.store.begin().is_ok() {
            for msg in batch {
                self.handle(msg, now);
            }
            self.schedule(now);
        }
        self.after_commit.clear();
        drop(self);
    }

    fn reply<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.after_commit.push(Box::new(move || {
            let _ = tx.send(value);
        }));
    }

    fn handle(&mut self, msg: Msg, now: u64) {
        match msg {
            Msg::Submit { principal, spec, reply } => {
                let result = self.submit(&principal, spec, now);
                self.reply(reply, result);
            }
            Msg::Jobs { principal, after, limit, reply } => {
                let mut visible = self
                    .jobs
                    .range(after.saturating_add(1)..)
                    .map(|(_, j)| j)
                    .filter(|j| principal.may_see(j.tenant));
                let jobs: Vec<ebb_api::Job> =
                    visible.by_ref().take(limit).map(|j| self.view(j, Vec::new())).collect();
                let next_cursor = match visible.next() {
                    Some(_) => jobs.last().map(|j| j.id),
                    None => None,
                };
                let _ = reply.send(ebb_api::JobPage { jobs, next_cursor });
            }
            Msg::Job { principal, id, reply } => {
                let result = self.visible(&principal, id).and_then(|()| {
                    let events = self.store.events(id).map_err(storage_error)?;
                    let usage = self.store.job_usage(id).map_err(storage_error)?;
                    let mut view = self.view(&self.jobs[&id], events);
                    view.progress = self.jobs[&id].array.as_ref().map(|a| self.progress(a.id));
                    view.usage = usage.iter().map(|u| u.view(&view.tenant)).collect();
                    Ok(view)
                });
                let _ = reply.send(result);
            }
            Msg::Cancel { principal, id, reply } => {
                let result = self.visible(&principal, id).and_then(|()| self.cancel(id, now));
                self.reply(reply, result);
            }
            Msg::LogFile { principal, id, reply } => {
                let result = self
                    .visible(&principal, id)
                    .map(|()| (self.log_path(id), self.jobs[&id].state.is_final()));
                let _ = reply.send(result);
            }
            Msg::Nodes { reply } => {
                let nodes = self.nodes.keys().cloned().collect::<Vec<_>>();
                let views = nodes.iter().map(|n| self.node_view(n)).collect();
                let _ = reply.send(views);
            }
            Msg::DrainNode { name, reply } => {
                let result = self.drain_node(&name);
                self.reply(reply, result);
            }
            Msg::Reclaim { req, reply } => {
                let result = self.reclaim(req);
                self.reply(reply, result);
            }
            Msg::CreateTenant { name, reply } => {
                let result = self.create_tenant(name);
                self.reply(reply, result);
            }
            Msg::TenantLimits { principal, tenant, set, reply } => {
                let result = self.tenant_limits(&principal, &tenant, set);
                self.reply(reply, result);
            }
            Msg::Register { principal, reg, reply } => {
                let result = self.register(&principal, reg, now);
                self.reply(reply, result);
            }
            Msg::Poll { node, epoch, after, health, reply } => {
                // After the commit, like every command: an agent never acts
                // on something the store does not say yet.
                let result = self.poll(&node, epoch, after, health, now);
                self.reply(reply, result);
            }
            Msg::Report { report, reply } => {
                let result = self.report(report, now);
                self.reply(reply, result);
            }
            Msg::Metrics { reply } => {
                let _ = reply.send(self.metrics_snapshot());
            }
            Msg::RemoveNode { name, reply } => {
                let result = self.remove_node(&name, now);
                self.reply(reply, result);
            }
            Msg::RotateJoinToken { reply } => {
                let result = self.rotate_join_token();
                self.reply(reply, result);
            }
            Msg::TenantTokens { name, issue, reply } => {
                let result = self.tenant_tokens(&name, issue);
                self.reply(reply, result);
            }
            Msg::Prices { reply } => {
                let _ = reply.send(self.price_book());
            }
            Msg::SetPrice { model, update, reply } => {
                let result = self.set_price(&model, &update);
                self.reply(reply, result);
            }
            Msg::CreateReservation { req, reply } => {
                let result = self.create_reservation(&req);
                self.reply(reply, result);
            }
            Msg::Reservations { principal, reply } => {
                let list = self
                    .reservations
                    .values()
                    .filter(|r| principal.may_see(r.tenant))
                    .map(|r| crate::billing::reservation_view(r, &self.tenant_name(r.tenant)))
                    .collect();
                let _ = reply.send(list);
            }
            Msg::DeleteReservation { id, reply } => {
                let result = self.delete_reservation(id);
                self.reply(reply, result);
            }
            Msg::Bill { principal, tenant, from, to, reply } => {
                let _ = reply.send(self.bill(&principal, tenant.as_deref(), &from, &to));
            }
            Msg::OperatorReport { from, to, reply } => {
                let _ = reply.send(self.report_for(&from, &to, now));
            }
            Msg::Tick => {}
        }
    }

    fn visible(&self, principal: &Principal, id: u64) -> Result<(), ApiError> {
        match self.jobs.get(&id) {
            Some(job) if principal.may_see(job.tenant) => Ok(()),
            // Another tenant's job is as good as absent: 404, never 403.
            _ => Err(ApiError::not_found(format!("job {id}: not found"))),
        }
    }

    // ---- writes ------------------------------------------------------

    fn event(&mut self, id: u64, kind: &str, detail: serde_json::Value) {
        let at_ms = now_ms();
        let attempt = self.jobs.get(&id).map_or(0, |j| j.attempt);
        let event = JobEvent { at: rfc3339(at_ms), at_ms, kind: kind.into(), attempt, detail };
        if let Err(e) = self.store.add_event(id, &event) {
            tracing::error!("job {id}: cannot record {kind}: {e}");
        }
        tracing::info!(job = id, attempt, kind, "{}", event.detail);
    }

    fn save(&mut self, id: u64) {
        let job = &self.jobs[&id];
        if let Err(e) = self.store.put_job(id, job.tenant, job) {
            tracing::error!("job {id}: cannot store: {e}");
        }
    }

    fn submit(&mut self, principal: &Principal, spec: JobSubmission, now: u64) -> Result<Vec<u64>, ApiError> {
        let (tenant, _) =
            principal.tenant.clone().ok_or_else(|| ApiError::forbidden("this token cannot submit jobs"))?;
        let mut spec = spec;
        let limits = self.limits_of(tenant);
        let checked = crate::validate::submission(&spec, &self.core, &limits)?;
        if checked.tier == Tier::Reserved {
            let wanted = spec.gpu_model.as_deref();
            let models: BTreeSet<&str> = self
                .reservations
                .values()
                .filter(|r| r.tenant == tenant && r.end_ms > now && wanted.is_none_or(|m| m == r.gpu_model))
                .map(|r| r.gpu_model.as_str())
                .collect();
            let model = match models.len() {
                0 => {
                    return Err(ApiError::unprocessable(format!(
                    "tier: reserved jobs draw on a reservation, and tenant {} has none{} that has not ended",
                    self.tenant_name(tenant),
                    wanted.map(|m| format!(" of {m}")).unwrap_or_default()
                )))
                }
                1 => models.first().expect("one").to_string(),
                _ => {
                    return Err(ApiError::unprocessable(format!(
                        "gpu_model: tenant {} has reservations of {}; say which",
                        self.tenant_name(tenant),
                        models.into_iter().collect::<Vec<_>>().join(", ")
                    )))
                }
            };
            // A reserved job runs on its reservation's model.
            spec.gpu_model = Some(model);
        }
        let array_id = self.next_job;
        let count = checked.tasks.len() as u64;
        let jobs = count.max(1);
        let bytes = crate::validate::command_bytes(&spec).saturating_mul(jobs);
        let load = self.load.get(&tenant).cloned().unwrap_or_default();
        if load.jobs.saturating_add(jobs) > limits.max_jobs {
            return Err(ApiError::too_many(format!(
                "tenant {}: {} unfinished jobs, and this submission adds {jobs}: over the limit of {} \
                 (ebb server --max-jobs-per-tenant)",
                self.tenant_name(tenant),
                load.jobs,
                limits.max_jobs
            )));
        }
        if load.bytes.saturating_add(bytes) > limits.max_stored_bytes {
            return Err(ApiError::too_many(format!(
                "tenant {}: unfinished jobs' arguments and environments take {} bytes, and this submission \
                 adds {bytes}: over the limit of {} (ebb server --max-stored-bytes-per-tenant)",
                self.tenant_name(tenant),
                load.bytes,
                limits.max_stored_bytes
            )));
        }
        let tasks: Vec<Option<crate::validate::Task>> = match checked.tasks.is_empty() {
            true => vec![None],
            false => checked.tasks.into_iter().map(Some).collect(),
        };
        let mut ids = Vec::with_capacity(tasks.len());
        for task in tasks {
            let mut spec = spec.clone();
            let mut array = None;
            if let Some(task) = &task {
                // Set by ebb, so not subject to the user-variable rules.
                let index = task.index;
                spec.env.insert("EBB_TASK_INDEX".into(), index.to_string());
                spec.env.insert("EBB_TASK_COUNT".into(), count.to_string());
                spec.env.insert("EBB_ARRAY_ID".into(), array_id.to_string());
                let base = spec
                    .name
                    .clone()
                    .unwrap_or_else(|| if task.params.is_empty() { "array" } else { "sweep" }.into());
                if task.params.is_empty() {
                    spec.name = Some(format!("{base}[{index}]"));
                } else {
                    for (name, value) in &task.params {
                        spec.env.insert(format!("EBB_PARAM_{}", name.to_ascii_uppercase()), value.clone());
                    }
                    let params: serde_json::Map<String, serde_json::Value> =
                        task.params.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                    spec.env.insert("EBB_PARAMS".into(), serde_json::Value::Object(params).to_string());
                    let shown: Vec<String> = task.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    spec.name = Some(format!("{base}[{}]", shown.join(",")));
                }
                array = Some(ebb_api::ArrayTask {
                    id: array_id,
                    index,
                    tasks: count,
                    params: task.params.iter().cloned().collect(),
                });
            }
            let id = self.next_job;
            self.next_job += 1;
            let record = JobRecord {
                id,
                tenant,
                tier: checked.tier,
                gpus: checked.gpus,
                signal: checked.signal,
                spec,
                state: JobState::Queued,
                attempt: 0,
                preemptions: 0,
                retries: 0,
                submitted_ms: now,
                placement: Vec::new(),
                started_ms: 0,
                running_on: Vec::new(),
                notice: None,
                exit_code: None,
                exit_signal: None,
                cancel_requested: false,
                vanished: false,
                held: Vec::new(),
                waiting_for: Vec::new(),
                array,
                checkpoints: CheckpointStats::default(),
                run_started_ms: None,
                started_on: Vec::new(),
                attempt_checkpoint_ms: None,
                exited_ms: 0,
                lost_gpu_ms: 0,
                interval: None,
                rendezvous: None,
                billing: None,
                waiting: None,
                quick_exits: 0,
            };
            let stored = crate::validate::command_bytes(&record.spec);
            self.jobs.insert(id, record);
            let admitted = self.load.get(&tenant).map_or(0, |l| l.admitted);
            if admitted < limits.max_running_jobs {
                if let Err(e) = self.core.submit(self.spec_of(id)) {
                    self.jobs.remove(&id);
                    return Err(ApiError::unprocessable(e.to_string()));
                }
                self.load.entry(tenant).or_default().admitted += 1;
            } else {
                self.load.entry(tenant).or_default().waiting.insert(id);
                self.jobs.get_mut(&id).expect("just inserted").waiting = Some(Waiting::TenantLimit);
            }
            let load = self.load.entry(tenant).or_default();
            load.jobs += 1;
            load.bytes += stored;
            if task.is_some() {
                self.arrays.entry(array_id).or_default().push(id);
            }
            self.save(id);
            let index = task.map(|t| t.index);
            let detail = json!({ "tier": checked.tier.as_str(), "gpus": checked.gpus, "task": index });
            self.event(id, "submitted", detail);
            self.counters.submitted += 1;
            ids.push(id);
        }
        Ok(ids)
    }

    fn cancel(&mut self, id: u64, now: u64) -> Result<ebb_api::Job, ApiError> {
        let state = self.jobs[&id].state;
        match state {
            s if s.is_final() => {}
            JobState::Queued => {
                match self.jobs[&id].waiting {
                    Some(Waiting::Backoff { until_ms }) => {
                        self.backoff.remove(&(until_ms, id));
                    }
                    Some(Waiting::TenantLimit) => {}
                    None => self.core.cancel(JobId(id)).map_err(|e| ApiError::internal(e.to_string()))?,
                }
                let job = self.jobs.get_mut(&id).expect("visible");
                job.state = JobState::Cancelled;
                self.finished(id);
                self.event(id, "cancelled", json!({ "while": "queued" }));
                self.save(id);
            }
            _ => {
                let job = self.jobs.get_mut(&id).expect("visible");
                if !job.cancel_requested {
                    job.cancel_requested = true;
                    let attempt = AttemptRef { job: id, attempt: job.attempt };
                    for node in job.running_on.clone() {
                        self.push(&node, Action::Stop { attempt, grace_ms: 10_000 });
                    }
                    self.event(id, "cancel_requested", json!({ "at": rfc3339(now) }));
                    self.save(id);
                }
            }
        }
        Ok(self.view(&self.jobs[&id], Vec::new()))
    }

    fn push(&mut self, node: &str, action: Action) {
        self.channels.entry(node.to_string()).or_insert_with(Channel::new).push(action);
        self.woken.insert(node.to_string());
    }

    /// The core released every hold on `node` (lost or drained): so does
    /// the record.
    fn forget_holds_on(&mut self, node: &str) {
        let holders: Vec<u64> =
            self.jobs.values().filter(|j| j.held.iter().any(|(n, _)| n == node)).map(|j| j.id).collect();
        for id in holders {
            let job = self.jobs.get_mut(&id).expect("known job");
            job.held.clear();
            job.waiting_for.clear();
            self.save(id);
        }
    }

    fn drain_node(&mut self, name: &str) -> Result<ebb_api::Node, ApiError> {
        let id = self
            .core
            .node_by_name(name)
            .ok_or_else(|| ApiError::not_found(format!("node {name}: not found")))?;
        self.core.drain_node(id).map_err(|e| ApiError::conflict(e.to_string()))?;
        self.forget_holds_on(name);
        let row = self.nodes.get_mut(name).expect("known node");
        row.drained = true;
        let row = row.clone();
        self.store.put_node(&row).map_err(storage_error)?;
        tracing::info!(node = name, "drained by the operator");
        Ok(self.node_view(name))
    }

    fn reclaim(&mut self, req: ebb_api::ReclaimRequest) -> Result<ebb_api::ReclaimReply, ApiError> {
        if req.gpus == 0 {
            return Err(ApiError::bad_request("gpus: must be at least 1".into()));
        }
        let model = match &req.gpu_model {
            Some(name) => self
                .core
                .model_by_name(name)
                .ok_or_else(|| ApiError::unprocessable(format!("gpu_model: unknown model {name:?}")))?,
            None => {
                let models: Vec<GpuModelId> = self.core.models().map(|(id, _)| id).collect();
                match models.as_slice() {
                    [only] => *only,
                    [] => return Err(ApiError::conflict("no nodes have joined".into())),
                    _ => {
                        return Err(ApiError::unprocessable(
                            "gpu_model: required when nodes have several models".into(),
                        ))
                    }
                }
            }
        };
        let limit = self.core.reclaim(model, req.gpus).map_err(|e| ApiError::unprocessable(e.to_string()))?;
        let name = self.core.model(model).expect("known model").name.clone();
        tracing::info!(gpu_model = name, gpus = req.gpus, limit, "preemptible capacity reclaimed");
        Ok(ebb_api::ReclaimReply { gpu_model: name, preemptible_limit: limit })
    }

    fn create_tenant(&mut self, name: String) -> Result<ebb_api::TenantCreated, ApiError> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(ApiError::bad_request(format!(
                "name: must be 1-64 letters, digits, '-' or '_', got {name:?}"
            )));
        }
        if self.tenants.values().any(|n| *n == name) {
            return Err(ApiError::conflict(format!("tenant {name}: already exists")));
        }
        let id = self.tenants.keys().max().map_or(1, |m| m + 1);
        self.store.put_tenant(&TenantRow { id, name: name.clone() }).map_err(storage_error)?;
        self.tenants.insert(id, name.clone());
        let token = self.grant(Principal::tenant(Scope::Tenant, id, &name))?;
        Ok(ebb_api::TenantCreated { tenant: name, token })
    }

    // ---- credentials ---------------------------------------------------

    /// A fresh token for `principal`, stored hashed in this batch. It goes
    /// into the map at once, so that a revocation later in the same batch
    /// finds it; no one can use it before the batch commits, since no one
    /// has it until the reply (and if the commit fails, the server exits).
    fn grant(&mut self, principal: Principal) -> Result<String, ApiError> {
        let token = new_token();
        let hash = hash_token(&token);
        let row = TokenRow {
            hash: hash.clone(),
            tenant: principal.tenant.as_ref().map(|(id, _)| *id),
            scope: principal.scope,
            node: principal.node.clone(),
        };
        self.store.put_token(&row).map_err(storage_error)?;
        if let (Scope::Node, Some(node)) = (principal.scope, &principal.node) {
            self.node_credentials.insert(node.clone(), hash.clone());
        }
        self.tokens.write().expect("token map").insert(hash, TokenState::Valid(principal));
        Ok(token)
    }

    /// Revokes every token `which` picks, at once: the next request
    /// carrying one is refused with `why`, even before this batch commits
    /// (if the commit fails, the server exits). Returns how many.
    fn revoke(&mut self, which: impl Fn(&Principal) -> bool, why: &str) -> Result<u32, ApiError> {
        let hashes: Vec<String> = self
            .tokens
            .read()
            .expect("token map")
            .iter()
            .filter(|(_, state)| matches!(state, TokenState::Valid(p) if which(p)))
            .map(|(hash, _)| hash.clone())
            .collect();
        for hash in &hashes {
            self.store.delete_token(hash).map_err(storage_error)?;
        }
        let mut map = self.tokens.write().expect("token map");
        for hash in &hashes {
            map.insert(hash.clone(), TokenState::Revoked(why.to_string()));
        }
        self.node_credentials.retain(|_, hash| !hashes.contains(hash));
        Ok(hashes.len() as u32)
    }

    /// `ebb tenant token rotate|revoke NAME`: the tenant's tokens are all
    /// revoked, and with `issue` one new token is made. The admin token,
    /// though it acts for the default tenant, is not a tenant token.
    fn tenant_tokens(&mut self, name: &str, issue: bool) -> Result<ebb_api::TenantTokens, ApiError> {
        let id = self
            .tenants
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| ApiError::not_found(format!("tenant {name}: not found")))?;
        let why = format!(
            "this token of tenant {name} was {} by the operator",
            if issue { "replaced (rotated)" } else { "revoked" }
        );
        let revoked = self
            .revoke(|p| p.scope == Scope::Tenant && p.tenant.as_ref().is_some_and(|(t, _)| *t == id), &why)?;
        let token = if issue { Some(self.grant(Principal::tenant(Scope::Tenant, id, name))?) } else { None };
        tracing::info!(tenant = name, revoked, issued = issue, "tenant tokens changed by the operator");
        Ok(ebb_api::TenantTokens { tenant: name.to_string(), token, revoked })
    }

    /// A new join token, written to `join.token` (0600) before it is
    /// stored; the old one is refused from now. Nodes keep their own
    /// credentials.
    fn rotate_join_token(&mut self) -> Result<ebb_api::JoinToken, ApiError> {
        let path = self.config.data_dir.join("join.token");
        let token = new_token();
        write_secret(&path, &token).map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
        let revoked = self.revoke(
            |p| p.scope == Scope::Agent,
            "this join token was replaced (rotated) by the operator: use the new one in the server's join.token",
        )?;
        let hash = hash_token(&token);
        self.store
            .put_token(&TokenRow { hash: hash.clone(), tenant: None, scope: Scope::Agent, node: None })
            .map_err(storage_error)?;
        self.tokens.write().expect("token map").insert(hash, TokenState::Valid(Principal::join()));
        tracing::info!(path = %path.display(), revoked, "join token rotated by the operator");
        Ok(ebb_api::JoinToken { token, path: path.display().to_string(), revoked })
    }

    /// `ebb nodes remove NAME`: the node's credential is revoked at once
    /// and the node is taken out as a lost node is (its live attempts
    /// requeued as lost, metered to its last contact). It may join again
    /// with the join token, and gets a fresh credential then.
    fn remove_node(&mut self, name: &str, now: u64) -> Result<ebb_api::NodeRemoved, ApiError> {
        let id = self
            .core
            .node_by_name(name)
            .ok_or_else(|| ApiError::not_found(format!("node {name}: not found")))?;
        let why = format!(
            "node {name}'s credential was revoked by the operator (ebb nodes remove {name}); to rejoin, \
             delete the agent's node.credential and restart it with the join token"
        );
        let revoked = self.revoke(|p| p.scope == Scope::Node && p.node.as_deref() == Some(name), &why)?;
        let requeued: Vec<u64> = self
            .core
            .lose_node(id)
            .map_err(|e| ApiError::internal(e.to_string()))?
            .into_iter()
            .map(|j| j.0)
            .collect();
        self.node_gone(name, &requeued, "removed by the operator", now);
        if let Some(row) = self.nodes.get_mut(name) {
            row.removed = true;
            let row = row.clone();
            self.store.put_node(&row).map_err(storage_error)?;
        }
        if let Some(channel) = self.channels.get_mut(name) {
            channel.commands.clear();
        }
        tracing::warn!(node = name, ?requeued, "node removed by the operator; its credential is revoked");
        Ok(ebb_api::NodeRemoved { node: name.to_string(), requeued, credential_revoked: revoked > 0 })
    }

    /// Whether `principal` may register node `node`: its own credential,
    /// or the join token for a node that has none. Returns whether the
    /// node is to be issued a credential (once the rest of the
    /// registration has passed).
    fn may_register(&self, principal: &Principal, node: &str) -> Result<bool, ApiError> {
        match principal.scope {
            Scope::Node if principal.node.as_deref() == Some(node) => {
                self.credential_valid(node)?;
                Ok(false)
            }
            Scope::Node => Err(ApiError::forbidden(&format!(
                "this credential is node {}'s; it cannot register node {node}",
                principal.node.as_deref().unwrap_or("?")
            ))),
            Scope::Agent if self.node_credentials.contains_key(node) => Err(ApiError::forbidden(&format!(
                "node {node}: already has its own credential, so the join token cannot register it; the agent \
                 registers with its node.credential, or the operator runs `ebb nodes remove {node}` first"
            ))),
            Scope::Agent => Ok(true),
            _ => Err(ApiError::forbidden("registering needs the join token or the node's credential")),
        }
    }

    /// The node's credential has not been revoked since the request was
    /// authenticated.
    fn credential_valid(&self, node: &str) -> Result<(), ApiError> {
        if self.node_credentials.contains_key(node) {
            return Ok(());
        }
        Err(ApiError::unauthorized(&format!(
            "node {node}'s credential was revoked by the operator (ebb nodes remove {node}); to rejoin, delete \
             the agent's node.credential and restart it with the join token"
        )))
    }

    // ---- agents ------------------------------------------------------

    fn register(
        &mut self,
        principal: &Principal,
        mut reg: Register,
        now: u64,
    ) -> Result<Registered, ApiError> {
        let issue_credential = self.may_register(principal, &reg.node)?;
        // Checked before anything of the registration is applied.
        self.check_event_times("unreported", &reg.unreported, now)?;
        // Attempts the agent comes back without ended after this, the last
        // time the node was heard from, and no later than now.
        let last_contact = self.last_contact(&reg.node).unwrap_or(now).min(now);
        let spec = NodeSpec {
            name: reg.node.clone(),
            gpu_model: reg.gpu_model.clone(),
            gpus: reg.gpus,
            labels: reg.labels.clone(),
        };
        match self.core.node_by_name(&reg.node) {
            Some(id) if self.core.node(id).expect("known").status != NodeStatus::Lost => {
                let n = self.core.node(id).expect("known");
                let model = &self.core.model(n.model).expect("known").name;
                if n.gpus != reg.gpus || *model != reg.gpu_model {
                    return Err(ApiError::conflict(format!(
                        "node {}: joined before with {} x {model}, now reports {} x {}",
                        reg.node, n.gpus, reg.gpus, reg.gpu_model
                    )));
                }
                self.core.heartbeat(id, Time(now)).map_err(|e| ApiError::conflict(e.to_string()))?;
                self.heard(&reg.node, now);
                let row = self.nodes.get_mut(&reg.node).expect("known node");
                if reg.address.is_some() && row.address != reg.address {
                    row.address = reg.address.clone();
                    let row = row.clone();
                    self.store.put_node(&row).map_err(storage_error)?;
                }
            }
            _ => {
                self.core.add_node(spec, Time(now)).map_err(|e| ApiError::bad_request(e.to_string()))?;
                // A node back after being lost keeps its history.
                let known = self.nodes.get(&reg.node);
                let row = NodeRow {
                    name: reg.node.clone(),
                    gpu_model: reg.gpu_model.clone(),
                    gpus: reg.gpus,
                    labels: reg.labels.clone(),
                    drained: false,
                    address: reg.address.clone(),
                    joined_ms: known.map_or(now, |n| n.joined_ms),
                    interruptions: known.map_or(0, |n| n.interruptions),
                    removed: false,
                };
                self.store.put_node(&row).map_err(storage_error)?;
                self.nodes.insert(reg.node.clone(), row);
                self.price_for(&reg.gpu_model);
                self.heard(&reg.node, now);
                tracing::info!(node = reg.node, gpus = reg.gpus, gpu_model = reg.gpu_model, "node joined");
            }
        }
        // A fresh stream: whatever was queued for the old session is
        // re-derived below from what the store says.
        let channel = self.channels.entry(reg.node.clone()).or_insert_with(Channel::new);
        channel.commands.clear();
        // The agent follows from here: what is re-derived below reaches it.
        let next_seq = channel.next_seq - 1;
        // What happened while the server could not be told (it restarted):
        // starts, checkpoints and exits, accounted as they happened.
        let unreported = std::mem::take(&mut reg.unreported);
        self.apply_events(&reg.node, unreported, now);
        let running: BTreeSet<AttemptRef> = reg.running.iter().copied().collect();
        let held: Vec<AttemptRef> = self
            .jobs
            .values()
            .filter(|j| j.state.is_live() && j.running_on.contains(&reg.node))
            .map(|j| AttemptRef { job: j.id, attempt: j.attempt })
            .collect();
        let held_set: BTreeSet<AttemptRef> = held.iter().copied().collect();
        let kill: Vec<AttemptRef> = running.difference(&held_set).copied().collect();
        if held_set.difference(&running).next().is_some() {
            // The agent came back without attempts it was running: an
            // interruption without notice.
            self.interrupted(&reg.node);
        }
        for attempt in held {
            if running.contains(&attempt) {
                let job = &self.jobs[&attempt.job];
                let (state, notice, cancel_requested) = (job.state, job.notice.clone(), job.cancel_requested);
                if let (JobState::Draining, Some((at, deadline, reason))) = (state, notice) {
                    let drain = DrainAttempt { attempt, notice_at_ms: at, deadline_ms: deadline, reason };
                    self.push(&reg.node, Action::Drain(drain));
                }
                if cancel_requested {
                    self.push(&reg.node, Action::Stop { attempt, grace_ms: 10_000 });
                }
            } else {
                // The node does not run what we think it does: that part of
                // the attempt is gone.
                let exit = PartExit {
                    code: None,
                    signal: None,
                    completed: false,
                    vanished: true,
                    peak_memory_bytes: None,
                };
                self.part_exited(&reg.node, attempt, exit, last_contact, now);
            }
        }
        if !kill.is_empty() {
            tracing::warn!(node = reg.node, ?kill, "agent runs stale attempts; told to kill them");
        }
        let credential = match issue_credential {
            true => {
                tracing::info!(node = reg.node, "node credential issued");
                Some(self.grant(Principal::node(&reg.node))?)
            }
            false => None,
        };
        Ok(Registered {
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis(),
            kill,
            next_seq,
            epoch: self.epoch,
            credential,
        })
    }

    fn poll(
        &mut self,
        node: &str,
        epoch: u64,
        after: u64,
        health: Option<Option<String>>,
        now: u64,
    ) -> Result<Poll, ApiError> {
        self.credential_valid(node)?;
        let Some(id) = self.core.node_by_name(node) else {
            return Err(ApiError::conflict(format!("node {node}: not registered")));
        };
        if epoch != self.epoch {
            return Err(ApiError::conflict("the server restarted: register again".into()));
        }
        self.core.heartbeat(id, Time(now)).map_err(|e| ApiError::conflict(e.to_string()))?;
        self.heard(node, now);
        if let Some(failing) = health {
            self.set_health(node, failing);
        }
        let channel = self.channels.entry(node.to_string()).or_insert_with(Channel::new);
        while channel.commands.front().is_some_and(|c| c.seq <= after) {
            channel.commands.pop_front();
        }
        Ok(Poll {
            commands: channel.commands.iter().cloned().collect(),
            next_seq: channel.next_seq,
            changed: channel.notify.subscribe(),
        })
    }

    /// Is `attempt` the job's live attempt on `node`?
    fn live_on(&self, attempt: AttemptRef, node: &str) -> bool {
        self.jobs.get(&attempt.job).is_some_and(|j| {
            j.attempt == attempt.attempt && j.state.is_live() && j.running_on.iter().any(|n| n == node)
        })
    }

    fn report(&mut self, report: ebb_api::Report, now: u64) -> Result<ReportReply, ApiError> {
        let node = report.node.clone();
        self.credential_valid(&node)?;
        self.check_event_times("events", &report.events, now)?;
        let id = self
            .core
            .node_by_name(&node)
            .ok_or_else(|| ApiError::conflict(format!("node {node}: not registered")))?;
        let _ = self.core.heartbeat(id, Time(now));
        self.heard(&node, now);
        // A report got through: whatever failed before does no longer.
        self.set_health(&node, None);
        let stale = self.apply_events(&node, report.events, now);
        Ok(ReportReply { stale: stale.into_iter().collect() })
    }

    /// Refuses, whole, events stamped later than the server's clock plus
    /// the allowed skew: a node's clock that far ahead is wrong, and
    /// nothing it says about time can be taken. `field` names where the
    /// events came from in the request.
    fn check_event_times(&self, field: &str, events: &[AgentEvent], now: u64) -> Result<(), ApiError> {
        let bound = now.saturating_add(self.config.max_clock_skew.as_millis());
        for (i, event) in events.iter().enumerate() {
            let (kind, attempt, at_ms) = match event {
                AgentEvent::Started { attempt, at_ms, .. } => ("started", attempt, *at_ms),
                AgentEvent::Exited { attempt, at_ms, .. } => ("exited", attempt, *at_ms),
                AgentEvent::Checkpoint { attempt, at_ms, .. } => ("checkpoint", attempt, *at_ms),
                AgentEvent::Output { .. } => continue,
            };
            if at_ms > bound {
                return Err(ApiError::bad_request(format!(
                    "{field}[{i}].at_ms: the {kind} event of job {} attempt {} is stamped {} ({at_ms}), later \
                     than the server's clock plus the allowed skew of {} ({bound}); nothing of this request \
                     was applied: check the node's clock",
                    attempt.job,
                    attempt.attempt,
                    rfc3339(at_ms),
                    ebb_core::checkpoint::human(self.config.max_clock_skew),
                )));
            }
        }
        Ok(())
    }

    /// An event time of a live attempt, clamped to what the server can
    /// know: not before the attempt was placed, not after now.
    fn known_time(&self, attempt: AttemptRef, at_ms: u64, now: u64) -> u64 {
        let placed = self.jobs.get(&attempt.job).map_or(0, |j| j.started_ms);
        at_ms.clamp(placed.min(now), now)
    }

    /// What a node's agent reports, in order; returns the stale attempts
    /// it spoke of. An event delivered twice (once with a registration,
    /// once in a report) counts once.
    fn apply_events(&mut self, node: &str, events: Vec<AgentEvent>, now: u64) -> BTreeSet<AttemptRef> {
        let node = node.to_string();
        let mut stale = BTreeSet::new();
        for event in events {
            match event {
                AgentEvent::Started { attempt, pid, at_ms } => {
                    if !self.live_on(attempt, &node) {
                        stale.insert(attempt);
                        continue;
                    }
                    let at_ms = self.known_time(attempt, at_ms, now);
                    let job = self.jobs.get_mut(&attempt.job).expect("live");
                    if job.started_on.contains(&node) {
                        continue;
                    }
                    // A gang runs once every node has started its part.
                    job.started_on.push(node.clone());
                    job.run_started_ms = Some(job.run_started_ms.map_or(at_ms, |t| t.min(at_ms)));
                    if job.state == JobState::Starting && job.started_on.len() == job.placement.len() {
                        job.state = JobState::Running;
                    }
                    self.event(
                        attempt.job,
                        "started",
                        json!({ "node": node, "pid": pid, "at": rfc3339(at_ms) }),
                    );
                    self.save(attempt.job);
                }
                AgentEvent::Exited { attempt, code, signal, completed, at_ms, peak_memory_bytes } => {
                    if !self.live_on(attempt, &node) {
                        continue; // already accounted for (lost or fenced)
                    }
                    // Not before the attempt's start, as the record has it.
                    let started = self.jobs[&attempt.job].run_started_ms.unwrap_or(0);
                    let at_ms = self.known_time(attempt, at_ms.max(started), now);
                    let exit = PartExit { code, signal, completed, vanished: false, peak_memory_bytes };
                    self.part_exited(&node, attempt, exit, at_ms, now);
                }
                AgentEvent::Checkpoint { attempt, step, bytes, duration_ms, at_ms } => {
                    if !self.live_on(attempt, &node) {
                        stale.insert(attempt);
                        continue;
                    }
                    let at_ms = self.known_time(attempt, at_ms, now);
                    self.checkpointed(attempt, step, bytes, duration_ms, at_ms, now);
                }
                AgentEvent::Output { attempt, data } => {
                    // Only the node the attempt was placed on writes its log.
                    if self.live_on(attempt, &node) {
                        self.append_log(attempt.job, &data);
                    } else {
                        stale.insert(attempt);
                    }
                }
            }
        }
        stale
    }

    /// The live attempt reported a completed checkpoint: the core picks
    /// victims by it, the record shows it, and a checkpoint that would not
    /// fit in the drain window earns the job a warning.
    fn checkpointed(
        &mut self,
        attempt: AttemptRef,
        step: Option<u64>,
        bytes: Option<u64>,
        duration_ms: u64,
        at_ms: u64,
        now: u64,
    ) {
        let id = attempt.job;
        if let Err(e) = self.core.checkpointed(JobId(id), Attempt(attempt.attempt), Time(now)) {
            tracing::warn!(job = id, "checkpoint not taken: {e}");
            return;
        }
        self.counters.checkpoints += 1;
        let window = self.config.drain_window;
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let checkpoint = ebb_api::Checkpoint {
            at: rfc3339(at_ms),
            at_ms,
            attempt: attempt.attempt,
            step,
            bytes,
            seconds: duration_ms as f64 / 1000.0,
        };
        job.checkpoints.record(checkpoint, duration_ms);
        job.attempt_checkpoint_ms = Some(job.attempt_checkpoint_ms.map_or(at_ms, |t| t.max(at_ms)));
        let warn = duration_ms > window.as_millis() && !job.checkpoints.warned;
        job.checkpoints.warned |= warn;
        self.event(
            id,
            "checkpoint",
            json!({ "step": step, "bytes": bytes, "seconds": duration_ms as f64 / 1000.0 }),
        );
        if warn {
            let message = format!(
                "a checkpoint took {}, longer than the {} drain window: a save started at notice will not \
                 finish before the kill; checkpoint periodically (EBB_CHECKPOINT_INTERVAL_S) or make the \
                 save faster",
                ebb_core::checkpoint::human(Span(duration_ms)),
                ebb_core::checkpoint::human(window),
            );
            tracing::warn!(job = id, "{message}");
            let detail = json!({
                "message": message,
                "checkpoint_seconds": duration_ms as f64 / 1000.0,
                "drain_window_seconds": window.as_secs(),
            });
            self.event(id, "warning", detail);
        }
        self.save(id);
    }

    /// Marks `node` unhealthy (it takes no new work) while its agent says
    /// its reports keep failing, and healthy again once they get through.
    /// Not stored: after a restart the agent's next poll says it again.
    fn set_health(&mut self, node: &str, failing: Option<String>) {
        let Some(id) = self.core.node_by_name(node) else { return };
        let healthy = failing.is_none();
        let was = self.unhealthy.contains_key(node);
        match failing {
            Some(why) => {
                if !was {
                    tracing::warn!(
                        node,
                        why,
                        "node unhealthy: its reports keep failing; it takes no new work"
                    );
                }
                self.unhealthy.insert(node.to_string(), why);
            }
            None if was => {
                tracing::info!(node, "node healthy again: its reports get through");
                self.unhealthy.remove(node);
            }
            None => return,
        }
        let _ = self.core.set_healthy(id, healthy);
    }

    /// When `node` was last heard from: by this server, or else by the
    /// one before it.
    fn last_contact(&self, node: &str) -> Option<u64> {
        if self.heard_since_start.contains(node) {
            let id = self.core.node_by_name(node)?;
            return Some(self.core.node(id)?.last_heartbeat.0);
        }
        self.heard_before.get(node).copied()
    }

    /// Records contact with `node`: durable, so that a restarted server
    /// meters work on a node that never comes back only up to here.
    fn heard(&mut self, node: &str, now: u64) {
        self.heard_since_start.insert(node.to_string());
        if let Err(e) = self.store.heard(node, now) {
            tracing::error!("node {node}: cannot record contact: {e}");
        }
    }

    /// The node was interrupted without notice.
    fn interrupted(&mut self, node: &str) {
        if let Some(row) = self.nodes.get_mut(node) {
            row.interruptions += 1;
            let row = row.clone();
            if let Err(e) = self.store.put_node(&row) {
                tracing::error!("node {node}: cannot store: {e}");
            }
        }
    }

    /// GPU-milliseconds of the live attempt's work since its last
    /// checkpoint (or its start), if it ended at `end_ms`.
    fn lost_work(job: &JobRecord, end_ms: u64) -> u64 {
        let started = job.run_started_ms.unwrap_or(job.started_ms);
        let saved = job.attempt_checkpoint_ms.map_or(started, |c| c.max(started));
        end_ms.saturating_sub(saved) * job.gpus as u64
    }

    /// One node's processes of an attempt are gone (at `at_ms` by the
    /// agent's clock); when the last node's are, the attempt has ended.
    #[allow(clippy::too_many_arguments)]
    fn part_exited(&mut self, node: &str, attempt: AttemptRef, exit: PartExit, at_ms: u64, now: u64) {
        let PartExit { code, signal, completed, vanished, peak_memory_bytes } = exit;
        let id = attempt.job;
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.running_on.retain(|n| n != node);
        job.exited_ms = job.exited_ms.max(at_ms);
        job.vanished |= vanished;
        if job.exit_code.is_none() || code.is_some_and(|c| c != 0) {
            job.exit_code = code;
            job.exit_signal = signal;
        }
        let mut detail = json!({
            "node": node, "code": code, "signal": signal, "completed_marker": completed, "vanished": vanished,
        });
        if let Some(peak) = peak_memory_bytes {
            detail["peak_memory_bytes"] = json!(peak);
        }
        self.event(id, "exited", detail);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        if !job.running_on.is_empty() {
            // A gang ends as a whole. Being drained, the other parts already
            // have their notice and deadline: they finish their own save.
            // Otherwise they are stopped as a cancel stops them: the signal,
            // then SIGKILL after a grace.
            if job.state != JobState::Draining {
                let rest = job.running_on.clone();
                for n in rest {
                    self.push(&n, Action::Stop { attempt, grace_ms: 10_000 });
                }
            }
            self.save(id);
            return;
        }
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let draining = job.state == JobState::Draining;
        let success = job.exit_code == Some(0) && !job.vanished;
        let kind = if job.cancel_requested {
            ExitKind::Cancelled
        } else if job.vanished {
            ExitKind::Lost
        } else if draining {
            if success && (completed || job.spec.exit_on_drain_is_success) {
                ExitKind::Completed
            } else {
                ExitKind::Failed { requeue: false }
            }
        } else if job.spec.restart.as_deref() == Some("always") {
            ExitKind::Restart
        } else if success {
            ExitKind::Completed
        } else {
            ExitKind::Failed { requeue: job.retries < job.spec.max_retries.unwrap_or(0) }
        };
        let effect = match self.core.exited(JobId(id), Attempt(attempt.attempt), kind) {
            Ok(effect) => effect,
            Err(e) => {
                tracing::error!(job = id, "core refused the exit: {e}");
                return;
            }
        };
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let ran_ms = now.saturating_sub(job.started_ms);
        let lost_ms = match effect {
            ExitEffect::Requeued { preempted: true }
            | ExitEffect::RequeuedLost
            | ExitEffect::PreemptionLimitReached => Self::lost_work(job, job.exited_ms),
            _ => 0,
        };
        job.lost_gpu_ms += lost_ms;
        self.counters.lost_gpu_seconds += lost_ms as f64 / 1000.0;
        let lost = lost_ms as f64 / 1000.0;
        let outcome = match effect {
            ExitEffect::Finished => "completed",
            ExitEffect::Failed | ExitEffect::Requeued { preempted: false } => "failed",
            ExitEffect::Cancelled => "cancelled",
            ExitEffect::PreemptionLimitReached | ExitEffect::Requeued { preempted: true } => "preempted",
            ExitEffect::RequeuedLost => "lost",
            ExitEffect::Restarted if success => "completed",
            ExitEffect::Restarted => "failed",
        };
        let end = self.jobs[&id].exited_ms;
        self.meter(id, attempt.attempt, end, outcome, lost_ms);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.placement.clear();
        job.notice = None;
        job.vanished = false;
        job.rendezvous = None;
        let (state, kind, detail) = match effect {
            ExitEffect::Finished => (JobState::Succeeded, "succeeded", json!({ "ran_ms": ran_ms })),
            ExitEffect::Failed => {
                (JobState::Failed, "failed", json!({ "code": job.exit_code, "signal": job.exit_signal }))
            }
            ExitEffect::Cancelled => (JobState::Cancelled, "cancelled", json!({})),
            ExitEffect::PreemptionLimitReached => {
                job.preemptions += 1;
                (
                    JobState::Failed,
                    "failed",
                    json!({ "reason": "preempted more than max_preemptions", "lost_gpu_seconds": lost }),
                )
            }
            ExitEffect::Requeued { preempted: true } => {
                job.preemptions += 1;
                self.counters.preempted += 1;
                (
                    JobState::Queued,
                    "requeued",
                    json!({ "reason": "preempted", "preemptions": job.preemptions, "lost_gpu_seconds": lost }),
                )
            }
            ExitEffect::Requeued { preempted: false } => {
                job.retries += 1;
                (
                    JobState::Queued,
                    "requeued",
                    json!({ "reason": "failed, retrying", "retries": job.retries }),
                )
            }
            ExitEffect::RequeuedLost => {
                (JobState::Queued, "requeued", json!({ "reason": "lost", "lost_gpu_seconds": lost }))
            }
            ExitEffect::Restarted => {
                let ran_ms = job.exited_ms.saturating_sub(job.run_started_ms.unwrap_or(job.exited_ms));
                job.quick_exits = if ran_ms < QUICK_EXIT_MS { job.quick_exits.saturating_add(1) } else { 0 };
                let backoff_ms = restart_backoff_ms(job.quick_exits);
                (
                    JobState::Queued,
                    "requeued",
                    json!({
                        "reason": "restart always", "code": job.exit_code, "signal": job.exit_signal,
                        "quick_exits": job.quick_exits, "backoff_seconds": backoff_ms as f64 / 1000.0,
                    }),
                )
            }
        };
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.state = state;
        if state == JobState::Queued {
            job.exit_code = None;
            job.exit_signal = None;
        }
        let backoff_ms = match effect {
            ExitEffect::Restarted => restart_backoff_ms(job.quick_exits),
            _ => 0,
        };
        if backoff_ms > 0 {
            // Out of the core's queue until the back-off is over.
            match self.core.cancel(JobId(id)) {
                Ok(()) => {
                    let until_ms = now.saturating_add(backoff_ms);
                    self.jobs.get_mut(&id).expect("live attempt").waiting =
                        Some(Waiting::Backoff { until_ms });
                    self.backoff.insert((until_ms, id));
                }
                Err(e) => tracing::error!(job = id, "restart back-off not applied: {e}"),
            }
        }
        if state.is_final() {
            self.finished(id);
        }
        self.event(id, kind, detail);
        self.save(id);
    }

    /// Job `id` reached a final state: its tenant's load shrinks, and the
    /// tenant's next waiting job may be admitted.
    fn finished(&mut self, id: u64) {
        let job = self.jobs.get_mut(&id).expect("known job");
        let was_waiting = job.waiting == Some(Waiting::TenantLimit);
        job.waiting = None;
        let (tenant, bytes) = (job.tenant, crate::validate::command_bytes(&job.spec));
        let load = self.load.entry(tenant).or_default();
        load.jobs = load.jobs.saturating_sub(1);
        load.bytes = load.bytes.saturating_sub(bytes);
        if was_waiting {
            load.waiting.remove(&id);
        } else {
            load.admitted = load.admitted.saturating_sub(1);
        }
        self.admit_waiting(tenant);
    }

    /// Admits the tenant's waiting jobs, oldest first, while it is under
    /// its limit of running jobs.
    fn admit_waiting(&mut self, tenant: u32) {
        let max = self.limits_of(tenant).max_running_jobs;
        loop {
            let Some(load) = self.load.get_mut(&tenant) else { return };
            if load.admitted >= max {
                return;
            }
            let Some(id) = load.waiting.pop_first() else { return };
            load.admitted += 1;
            self.jobs.get_mut(&id).expect("waiting job").waiting = None;
            if let Err(e) = self.restore_queued(id) {
                tracing::error!(job = id, "not admitted: {}", e.message);
                continue;
            }
            self.event(id, "admitted", json!({ "reason": "its tenant is under its limit of running jobs" }));
            self.save(id);
        }
    }

    /// The server's limits with the tenant's own in place of the defaults.
    fn limits_of(&self, tenant: u32) -> crate::validate::Limits {
        let mut limits = self.config.limits.clone();
        if let Some(own) = self.tenant_limits.get(&tenant) {
            limits.max_jobs = own.max_jobs.unwrap_or(limits.max_jobs);
            limits.max_running_jobs = own.max_running_jobs.unwrap_or(limits.max_running_jobs);
            limits.max_stored_bytes = own.max_stored_bytes.unwrap_or(limits.max_stored_bytes);
        }
        limits
    }

    /// A tenant's limits and usage (the tenant itself or an admin); with
    /// `set` (admin), its own limits first. Raising the running limit
    /// admits waiting jobs at once; lowering any refuses nothing already
    /// accepted.
    fn tenant_limits(
        &mut self,
        principal: &Principal,
        name: &str,
        set: Option<ebb_api::TenantLimits>,
    ) -> Result<ebb_api::TenantUsage, ApiError> {
        let tenant = self
            .tenant_by_name(name)
            .map_err(|_| ApiError::not_found(format!("tenant {name}: not found")))?;
        if !principal.may_see(tenant) {
            return Err(ApiError::not_found(format!("tenant {name}: not found")));
        }
        if let Some(set) = set {
            if principal.scope != Scope::Admin {
                return Err(ApiError::forbidden("this call needs an admin token"));
            }
            for (field, value) in [
                ("max_jobs", set.max_jobs),
                ("max_running_jobs", set.max_running_jobs),
                ("max_stored_bytes", set.max_stored_bytes),
            ] {
                if value == Some(0) {
                    return Err(ApiError::unprocessable(format!("{field}: must be at least 1, got 0")));
                }
            }
            self.store.put_tenant_limits(tenant, &set).map_err(storage_error)?;
            tracing::info!(tenant = name, ?set, "tenant limits set");
            self.tenant_limits.insert(tenant, set);
            self.admit_waiting(tenant);
        }
        let limits = self.limits_of(tenant);
        let load = self.load.get(&tenant).cloned().unwrap_or_default();
        Ok(ebb_api::TenantUsage {
            tenant: name.to_string(),
            max_jobs: limits.max_jobs,
            max_running_jobs: limits.max_running_jobs,
            max_stored_bytes: limits.max_stored_bytes,
            jobs: load.jobs,
            admitted: load.admitted,
            waiting: load.waiting.len() as u64,
            stored_bytes: load.bytes,
        })
    }

    /// Jobs whose restart back-off is over go back to the scheduler.
    fn end_backoffs(&mut self, now: u64) {
        while let Some(&(until_ms, id)) = self.backoff.first() {
            if until_ms > now {
                return;
            }
            self.backoff.pop_first();
            self.jobs.get_mut(&id).expect("backed-off job").waiting = None;
            if let Err(e) = self.restore_queued(id) {
                tracing::error!(job = id, "back-off over, but not requeued: {}", e.message);
            }
            self.save(id);
        }
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.config.data_dir.join("logs").join(format!("{id}.log"))
    }

    fn append_log(&mut self, id: u64, data: &str) {
        use std::io::Write;
        let path = self.log_path(id);
        let result = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(data.as_bytes()));
        if let Err(e) = result {
            tracing::error!("job {id}: cannot append output to {}: {e}", path.display());
        }
    }

    // ---- scheduling -----------------------------------------------------

    /// Plans and applies until the core has nothing more to do.
    fn schedule(&mut self, now: u64) {
        self.end_backoffs(now);
        for _ in 0..1000 {
            let started = std::time::Instant::now();
            let plan = ebb_scheduler::schedule(&self.core, Time(now), &self.sched);
            if plan.is_empty() {
                return;
            }
            if let Err(e) = self.core.apply(&plan) {
                tracing::error!("plan refused: {e}");
                return;
            }
            self.counters.passes += 1;
            self.counters.pass_seconds += started.elapsed().as_secs_f64();
            for &node in &plan.lost_nodes {
                let name = self.core.node(node).expect("known").name.clone();
                let requeued: Vec<u64> = plan
                    .requeues
                    .iter()
                    .filter(|r| matches!(r.reason, ebb_scheduler::RequeueReason::NodeLost(n) if n == node))
                    .map(|r| r.job.0)
                    .collect();
                self.node_gone(&name, &requeued, "no heartbeat within the timeout", now);
            }
            for d in &plan.drains {
                let id = d.job.0;
                let (reason, detail) = match d.reason {
                    DrainReason::Preempted { by } => {
                        (format!("preempted by job {}", by.0), json!({ "by": by.0 }))
                    }
                    DrainReason::NodeDrain { node } => {
                        let name = self.core.node(node).expect("known").name.clone();
                        (format!("node {name} drained by the operator"), json!({ "node": name }))
                    }
                    DrainReason::Reclaim => {
                        ("preemptible capacity reclaimed by the operator".into(), json!({}))
                    }
                };
                let job = self.jobs.get_mut(&id).expect("known job");
                job.state = JobState::Draining;
                job.notice = Some((d.notice_at.0, d.deadline.0, reason.clone()));
                let attempt = AttemptRef { job: id, attempt: d.attempt.0 };
                let drain = DrainAttempt {
                    attempt,
                    notice_at_ms: d.notice_at.0,
                    deadline_ms: d.deadline.0,
                    reason: reason.clone(),
                };
                for node in job.running_on.clone() {
                    self.push(&node, Action::Drain(drain.clone()));
                }
                self.event(
                    id,
                    "drain_notice",
                    json!({ "reason": reason, "notice_at": rfc3339(d.notice_at.0), "deadline": rfc3339(d.deadline.0), "detail": detail }),
                );
                self.save(id);
            }
            for p in &plan.preemptions {
                let victims: Vec<u64> = p.victims.iter().map(|v| v.0).collect();
                let held = self.named(&p.hold);
                let job = self.jobs.get_mut(&p.preemptor.0).expect("known job");
                job.held = held;
                job.waiting_for = victims.clone();
                self.save(p.preemptor.0);
                let lost = p.lost_gpu_ms as f64 / 1000.0;
                self.event(
                    p.preemptor.0,
                    "preempting",
                    json!({ "victims": victims, "lost_gpu_seconds": lost }),
                );
            }
            for p in &plan.placements {
                let id = p.job.0;
                let placement = self.named(&p.alloc);
                let recommendation = self.recommend(id, &placement, now);
                let rendezvous = (placement.len() > 1).then(|| self.rendezvous(&placement[0].0));
                let model = self.nodes[&placement[0].0].gpu_model.clone();
                let price = self.price_for(&model);
                let tier = self.jobs[&id].tier;
                let rate = match tier {
                    Tier::OnDemand => price.on_demand,
                    Tier::Preemptible => {
                        crate::billing::preemptible_rate(price.on_demand, self.config.pricing.discount_bps)
                    }
                    Tier::Reserved => 0,
                };
                let job = self.jobs.get_mut(&id).expect("known job");
                job.billing = Some((model, rate, price.on_demand));
                job.interval = Some((recommendation.interval.as_secs(), recommendation.to_string()));
                job.rendezvous = rendezvous.clone();
                job.run_started_ms = None;
                job.started_on.clear();
                job.attempt_checkpoint_ms = None;
                job.exited_ms = 0;
                job.state = JobState::Starting;
                job.attempt = p.attempt.0;
                job.placement = placement.clone();
                job.running_on = placement.iter().map(|(n, _)| n.clone()).collect();
                job.started_ms = now;
                job.notice = None;
                job.held.clear();
                job.waiting_for.clear();
                job.exit_code = None;
                job.exit_signal = None;
                let interval = recommendation.interval.as_secs().to_string();
                let nodes = placement.len();
                let tenant = self.tenants.get(&job.tenant).cloned().unwrap_or_default();
                let run_as = self.config.run_as.user(&tenant).to_string();
                let start = |rank: usize, gpus: &Vec<u8>, job: &JobRecord| {
                    let mut env = job.spec.env.clone();
                    env.insert("EBB_CHECKPOINT_INTERVAL_S".into(), interval.clone());
                    if let Some((addr, port)) = &job.rendezvous {
                        env.extend(gang_env(addr, *port, rank, nodes, gpus.len(), job.gpus));
                    }
                    StartAttempt {
                        attempt: AttemptRef { job: id, attempt: p.attempt.0 },
                        tier: job.tier.as_str().into(),
                        argv: job.spec.argv.clone(),
                        env,
                        workdir: job.spec.workdir.clone(),
                        gpus: gpus.clone(),
                        signal: job.signal,
                        run_as: Some(run_as.clone()),
                        tenant: tenant.clone(),
                    }
                };
                let starts: Vec<(String, StartAttempt)> = placement
                    .iter()
                    .enumerate()
                    .map(|(rank, (node, gpus))| (node.clone(), start(rank, gpus, job)))
                    .collect();
                for (node, start) in starts {
                    self.push(&node, Action::Start(start));
                }
                let shown: Vec<serde_json::Value> =
                    placement.iter().map(|(n, g)| json!({ "node": n, "gpus": g })).collect();
                let interval = json!({ "seconds": recommendation.interval.as_secs(), "why": recommendation.to_string() });
                self.event(
                    id,
                    "placed",
                    json!({ "placement": shown, "from_hold": p.from_hold, "checkpoint_interval": interval }),
                );
                self.save(id);
            }
        }
        tracing::error!("the scheduler did not settle in 1000 passes");
    }

    /// Node `name` is gone (no heartbeat within the timeout, or removed by
    /// the operator) and the core has requeued the jobs `requeued` had on
    /// it: their records follow. The node's processes are taken to have
    /// run until it was last heard from (before this server started, if
    /// not since), and are metered to there.
    fn node_gone(&mut self, name: &str, requeued: &[u64], why: &str, now: u64) {
        tracing::warn!(node = name, "node lost: {why}");
        self.forget_holds_on(name);
        self.interrupted(name);
        let heard = self.last_contact(name).unwrap_or(now);
        for &id in requeued {
            let lost_ms = Self::lost_work(&self.jobs[&id], heard);
            self.meter(id, self.jobs[&id].attempt, heard, "lost", lost_ms);
            let job = self.jobs.get_mut(&id).expect("known job");
            job.lost_gpu_ms += lost_ms;
            job.state = JobState::Queued;
            job.placement.clear();
            job.running_on.clear();
            job.notice = None;
            job.rendezvous = None;
            self.counters.lost_gpu_seconds += lost_ms as f64 / 1000.0;
            let lost = lost_ms as f64 / 1000.0;
            self.event(
                id,
                "requeued",
                json!({ "reason": "lost", "node": name, "why": why, "lost_gpu_seconds": lost }),
            );
            self.save(id);
        }
    }

    /// The usage record of job `id`'s attempt, ended at `end_ms`: written
    /// in this batch's transaction, with the state change that ended it.
    fn meter(&mut self, id: u64, attempt: u32, end_ms: u64, outcome: &str, lost_gpu_ms: u64) {
        let job = &self.jobs[&id];
        let (Some(started_ms), Some((model, rate, on_demand_rate))) = (job.run_started_ms, &job.billing)
        else {
            return; // never reported started: nothing is known to have run
        };
        let usage = crate::billing::meter(crate::billing::Ended {
            job: id,
            attempt,
            tenant: job.tenant,
            tier: job.tier.as_str(),
            gpu_model: model,
            gpus: job.gpus,
            started_ms,
            ended_ms: end_ms,
            notice_at_ms: job.notice.as_ref().map(|n| n.0),
            rate: *rate,
            on_demand_rate: *on_demand_rate,
            lost_gpu_ms,
            outcome,
        });
        if let Err(e) = self.store.add_usage(&usage) {
            tracing::error!(job = id, attempt, "usage not recorded: {e}");
        }
    }

    fn tenant_name(&self, id: u32) -> String {
        self.tenants.get(&id).cloned().unwrap_or_default()
    }

    fn tenant_by_name(&self, name: &str) -> Result<u32, ApiError> {
        self.tenants
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| ApiError::unprocessable(format!("tenant: unknown tenant {name:?}")))
    }

    fn known_model(&self, field: &str, model: &str) -> Result<(), ApiError> {
        if self.core.model_by_name(model).is_some() || self.prices.contains_key(model) {
            return Ok(());
        }
        let known: Vec<&str> = self.prices.keys().map(String::as_str).collect();
        Err(ApiError::unprocessable(format!(
            "{field}: unknown GPU model {model:?} (known: {})",
            if known.is_empty() { "none yet".to_string() } else { known.join(", ") }
        )))
    }

    fn price_book(&self) -> ebb_api::PriceBook {
        let bps = self.config.pricing.discount_bps;
        ebb_api::PriceBook {
            preemptible_discount_percent: f64::from(bps) / 100.0,
            prices: self.prices.values().map(|p| crate::billing::price_view(p, bps)).collect(),
        }
    }

    fn set_price(&mut self, model: &str, update: &ebb_api::PriceUpdate) -> Result<ebb_api::Price, ApiError> {
        self.known_model("gpu_model", model)?;
        let bps = self.config.pricing.discount_bps;
        let on_demand = crate::billing::parse_price("on_demand_usd", &update.on_demand_usd, bps)?;
        let reserved = match &update.reserved_usd {
            Some(text) => crate::billing::parse_price("reserved_usd", text, bps)?,
            None => self.prices.get(model).map_or(on_demand, |p| p.reserved),
        };
        let row = PriceRow { gpu_model: model.to_string(), on_demand, reserved };
        self.store.put_price(&row).map_err(storage_error)?;
        tracing::info!(gpu_model = model, on_demand = %crate::billing::usd(on_demand), "price set");
        self.prices.insert(model.to_string(), row.clone());
        Ok(crate::billing::price_view(&row, bps))
    }

    fn create_reservation(
        &mut self,
        req: &ebb_api::ReservationRequest,
    ) -> Result<ebb_api::Reservation, ApiError> {
        let tenant = self.tenant_by_name(&req.tenant)?;
        self.known_model("gpu_model", &req.gpu_model)?;
        let model = self.core.model_by_name(&req.gpu_model).ok_or_else(|| {
            ApiError::unprocessable(format!("gpu_model: no node of {} has joined yet", req.gpu_model))
        })?;
        let capacity = self.core.model(model).expect("known").capacity;
        if req.gpus == 0 || req.gpus > capacity {
            return Err(ApiError::unprocessable(format!(
                "gpus: must be between 1 and the {capacity} GPUs of {}, got {}",
                req.gpu_model, req.gpus
            )));
        }
        let start = crate::billing::parse_time("start", &req.start)?;
        let end = crate::billing::parse_time("end", &req.end)?;
        if start >= end {
            return Err(ApiError::unprocessable(format!(
                "end: {} is not after start: {}",
                req.end, req.start
            )));
        }
        let overlapping: Vec<&ReservationRow> = self
            .reservations
            .values()
            .filter(|r| r.gpu_model == req.gpu_model && r.start_ms < end && start < r.end_ms)
            .collect();
        if let Some(r) = overlapping.iter().find(|r| r.tenant == tenant) {
            return Err(ApiError::conflict(format!(
                "the period overlaps reservation {} of {} ({} to {}); change that one instead",
                r.id,
                req.tenant,
                rfc3339(r.start_ms),
                rfc3339(r.end_ms)
            )));
        }
        let reserved: u32 = overlapping.iter().map(|r| r.gpus).sum();
        if reserved + req.gpus > capacity {
            return Err(ApiError::conflict(format!(
                "gpus: {} of the {capacity} {} GPUs are already reserved in that period; {} are left",
                reserved,
                req.gpu_model,
                capacity - reserved
            )));
        }
        let rate = match &req.rate_usd {
            Some(text) => crate::billing::parse_price("rate_usd", text, self.config.pricing.discount_bps)?,
            None => self.price_for(&req.gpu_model).reserved,
        };
        let id = self.reservations.keys().max().map_or(1, |m| m + 1);
        let row = ReservationRow {
            id,
            tenant,
            gpu_model: req.gpu_model.clone(),
            gpus: req.gpus,
            start_ms: start,
            end_ms: end,
            rate,
        };
        self.core
            .add_reservation(self.core_reservation(&row)?)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Err(e) = self.store.put_reservation(&row) {
            let _ = self.core.remove_reservation(ebb_core::ReservationId(id as u32));
            return Err(storage_error(e));
        }
        tracing::info!(reservation = id, tenant = req.tenant, gpus = req.gpus, "reservation created");
        self.reservations.insert(id, row.clone());
        Ok(crate::billing::reservation_view(&row, &req.tenant))
    }

    fn delete_reservation(&mut self, id: u64) -> Result<ebb_api::Reservation, ApiError> {
        let row = self
            .reservations
            .get(&id)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("reservation {id}: not found")))?;
        let live: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.tier == Tier::Reserved && j.tenant == row.tenant && j.state.is_live())
            .filter(|j| j.billing.as_ref().is_some_and(|(m, _, _)| *m == row.gpu_model))
            .map(|j| j.id)
            .collect();
        if !live.is_empty() {
            return Err(ApiError::conflict(format!(
                "reservation {id}: reserved jobs {live:?} are running on it; cancel them first"
            )));
        }
        self.core
            .remove_reservation(ebb_core::ReservationId(id as u32))
            .map_err(|e| ApiError::internal(e.to_string()))?;
        self.store.delete_reservation(id).map_err(storage_error)?;
        self.reservations.remove(&id);
        Ok(crate::billing::reservation_view(&row, &self.tenant_name(row.tenant)))
    }

    fn bill(
        &mut self,
        principal: &Principal,
        tenant: Option<&str>,
        from: &str,
        to: &str,
    ) -> Result<ebb_api::Invoice, ApiError> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        let tenant = match (tenant, &principal.tenant) {
            (Some(name), _) if principal.scope == crate::store::Scope::Admin => self.tenant_by_name(name)?,
            (Some(name), Some((id, own))) if name == own => *id,
            (Some(_), _) => return Err(ApiError::forbidden("only an operator may bill another tenant")),
            (None, Some((id, _))) => *id,
            (None, None) => return Err(ApiError::unprocessable("tenant: required for this token".into())),
        };
        let usage = self.store.usage(Some(tenant), from_ms, to_ms).map_err(storage_error)?;
        let reservations: Vec<ReservationRow> =
            self.reservations.values().filter(|r| r.tenant == tenant).cloned().collect();
        Ok(crate::billing::invoice(&self.tenant_name(tenant), &usage, &reservations, from_ms, to_ms))
    }

    fn report_for(&mut self, from: &str, to: &str, now: u64) -> Result<ebb_api::OperatorReport, ApiError> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        // Attempts that started before the period and ended in or after it
        // count for the hours they ran inside it.
        let usage = self.store.usage(None, from_ms, u64::MAX).map_err(storage_error)?;
        let live: Vec<crate::billing::Live> = self
            .jobs
            .values()
            .filter(|j| j.state.is_live())
            .filter_map(|j| {
                Some(crate::billing::Live {
                    tier: j.tier.as_str().into(),
                    gpus: j.gpus,
                    started_ms: j.run_started_ms?,
                })
            })
            .collect();
        let nodes: Vec<(u64, u32)> = self.nodes.values().map(|n| (n.joined_ms, u32::from(n.gpus))).collect();
        let reservations: Vec<ReservationRow> = self.reservations.values().cloned().collect();
        Ok(crate::billing::report(&usage, &live, &reservations, &nodes, now, from_ms, to_ms))
    }

    /// Young/Daly for job `id` about to run on `placement`: δ from its own
    /// checkpoints, M from the interruptions seen on nodes of that model.
    fn recommend(
        &self,
        id: u64,
        placement: &[(String, Vec<u8>)],
        now: u64,
    ) -> ebb_core::checkpoint::Recommendation {
        let model = placement.first().and_then(|(n, _)| self.nodes.get(n)).map(|n| n.gpu_model.clone());
        let mut exposure = ebb_core::checkpoint::Exposure::default();
        for row in self.nodes.values().filter(|n| Some(&n.gpu_model) == model.as_ref()) {
            exposure.node_time = exposure.node_time + Span(now.saturating_sub(row.joined_ms));
            exposure.interruptions += row.interruptions;
        }
        let delta = self.jobs[&id].checkpoints.checkpoint_time();
        ebb_core::checkpoint::recommend(delta, exposure, placement.len() as u32)
    }

    /// Where a gang led by `leader` meets: the leader's address and the
    /// lowest port from 29500 that no live gang there uses.
    fn rendezvous(&self, leader: &str) -> (String, u16) {
        let addr =
            self.nodes.get(leader).and_then(|n| n.address.clone()).unwrap_or_else(|| leader.to_string());
        let taken: BTreeSet<u16> = self
            .jobs
            .values()
            .filter(|j| j.state.is_live())
            .filter_map(|j| j.rendezvous.as_ref())
            .filter(|(a, _)| *a == addr)
            .map(|(_, port)| *port)
            .collect();
        let port = (29500..u16::MAX).find(|p| !taken.contains(p)).unwrap_or(29500);
        (addr, port)
    }

    // ---- views ----------------------------------------------------------

    fn view(&self, job: &JobRecord, events: Vec<JobEvent>) -> ebb_api::Job {
        ebb_api::Job {
            id: job.id,
            tenant: self.tenants.get(&job.tenant).cloned().unwrap_or_default(),
            name: job.spec.name.clone(),
            tier: job.tier.as_str().into(),
            gpus: job.gpus,
            gpu_model: job.spec.gpu_model.clone(),
            argv: job.spec.argv.clone(),
            state: job.state.as_str().into(),
            attempt: job.attempt,
            preemptions: job.preemptions,
            retries: job.retries,
            submitted_at: rfc3339(job.submitted_ms),
            placement: job
                .placement
                .iter()
                .map(|(node, gpus)| ebb_api::NodeGpus { node: node.clone(), gpus: gpus.clone() })
                .collect(),
            exit_code: job.exit_code,
            usage: Vec::new(),
            last_checkpoint: job.checkpoints.last.clone(),
            checkpoint_interval_s: job.interval.as_ref().map(|(s, _)| *s),
            checkpoint_interval_why: job.interval.as_ref().map(|(_, why)| why.clone()),
            lost_gpu_seconds: job.lost_gpu_ms as f64 / 1000.0,
            array: job.array.clone(),
            progress: None,
            waiting: job.waiting.map(|w| match w {
                Waiting::Backoff { until_ms } => format!(
                    "restart back-off until {}: {} quick exits in a row (runs under {} s)",
                    rfc3339(until_ms),
                    job.quick_exits,
                    QUICK_EXIT_MS / 1000
                ),
                Waiting::TenantLimit => format!(
                    "tenant {} has {} jobs admitted, its limit (ebb tenant limits, ebb server --max-running-jobs)",
                    self.tenant_name(job.tenant),
                    self.limits_of(job.tenant).max_running_jobs
                ),
            }),
            events,
        }
    }

    /// An array's finished tasks over all, and each task's state.
    fn progress(&self, array: u64) -> ebb_api::ArrayProgress {
        let mut progress =
            ebb_api::ArrayProgress { done: 0, total: 0, states: BTreeMap::new(), tasks: Vec::new() };
        for id in self.arrays.get(&array).map(Vec::as_slice).unwrap_or_default() {
            let job = &self.jobs[id];
            progress.total += 1;
            progress.done += u64::from(job.state == JobState::Succeeded);
            *progress.states.entry(job.state.as_str().to_string()).or_insert(0) += 1;
            progress.tasks.push(ebb_api::TaskState {
                id: *id,
                index: job.array.as_ref().map_or(0, |a| a.index),
                state: job.state.as_str().into(),
                attempt: job.attempt,
                preemptions: job.preemptions,
            });
        }
        progress
    }

    fn node_view(&self, name: &str) -> ebb_api::Node {
        let id: NodeId = self.core.node_by_name(name).expect("known node");
        let n = self.core.node(id).expect("known node");
        let status = status_name(n.status);
        let unhealthy = match n.status {
            NodeStatus::Unhealthy => self.unhealthy.get(name).cloned(),
            _ => None,
        };
        ebb_api::Node {
            name: n.name.clone(),
            gpu_model: self.core.model(n.model).expect("known").name.clone(),
            gpus: n.gpus,
            status: status.into(),
            unhealthy,
            gpus_used: n.used_mask().count_ones(),
            gpus_held: n.held_mask().count_ones(),
            last_heartbeat: rfc3339(n.last_heartbeat.0),
            jobs: n.jobs().map(|j| j.0).collect(),
        }
    }

    fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut snapshot = crate::metrics::Snapshot { counters: self.counters.clone(), ..Default::default() };
        for job in self.jobs.values() {
            *snapshot.jobs.entry((job.tier.as_str(), job.state.as_str())).or_insert(0) += 1;
            if job.state.is_live() {
                *snapshot.gpus_in_use.entry(job.tier.as_str()).or_insert(0) += job.gpus as u64;
            }
        }
        for (_, m) in self.core.models() {
            snapshot.gpus_total += m.capacity as u64;
        }
        for node in self.core.nodes() {
            let status = status_name(node.status);
            *snapshot.nodes.entry(status).or_insert(0) += 1;
        }
        snapshot.queued =
            self.core.jobs().filter(|j| matches!(j.phase, Phase::Queued | Phase::Holding)).count() as u64;
        snapshot
    }
}

/// A node's status as the API and metrics name it.
fn status_name(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Up => "up",
        NodeStatus::Cordoned => "draining",
        NodeStatus::Unhealthy => "unhealthy",
        NodeStatus::Lost => "lost",
    }
}

/// What `torchrun` and `torch.distributed` expect on each node of a gang,
/// including the `PET_*` defaults so that a bare `torchrun train.py` joins
/// the right rendezvous with one worker per GPU.
fn gang_env(
    addr: &str,
    port: u16,
    rank: usize,
    nodes: usize,
    local_gpus: usize,
    total_gpus: u32,
) -> Vec<(String, String)> {
    let pairs = [
        ("MASTER_ADDR", addr.to_string()),
        ("MASTER_PORT", port.to_string()),
        ("WORLD_SIZE", total_gpus.to_string()),
        ("NODE_RANK", rank.to_string()),
        ("GROUP_RANK", rank.to_string()),
        ("NNODES", nodes.to_string()),
        ("LOCAL_WORLD_SIZE", local_gpus.to_string()),
        ("PET_NNODES", nodes.to_string()),
        ("PET_NODE_RANK", rank.to_string()),
        ("PET_NPROC_PER_NODE", local_gpus.to_string()),
        ("PET_MASTER_ADDR", addr.to_string()),
        ("PET_MASTER_PORT", port.to_string()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn write_secret(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}
