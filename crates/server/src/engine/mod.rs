//! The server's single writer: one thread owns the scheduling core, the
//! store and the agents' command streams, and handles messages in batches.
//!
//! A batch is one store transaction: every message in it is applied to the
//! core and the store, the core is asked for plans until it has nothing more
//! to do, the transaction commits, and only then are callers answered and
//! agents woken. So an acknowledged submission is durable, and what agents
//! are told to do is always something the store already says. A store
//! write that fails abandons the whole batch (`Fail::Store`): it is rolled
//! back, nobody is answered, and the server exits to restart from the last
//! commit.
//!
//! The writer by responsibility:
//!
//! * `batch`: the loop, one transaction per batch; `dispatch`: each
//!   message to its handler, every reply held in the `Outbox`.
//! * `recovery`: the core rebuilt from the store at start.
//! * `jobs`: submission (`expand`: arrays and sweeps, pure), cancel,
//!   tenants' limits and admission; `credentials`: tokens.
//! * `agents`: the agent protocol (register, poll, report) and the events
//!   it carries; `fleet`: operator actions on nodes, and lost nodes.
//! * `exits` and `ending`: an attempt's end, as one pure transition.
//! * `drill`: fire drills of the drain, and their verdicts.
//! * `plan`: what a scheduling pass decided, as records and commands;
//!   `launch`: what a start carries (rates, interval, gang variables).
//! * `money`: prices, reservations, bills; `views`: what the API shows.
//! * `write`: the store writes of a batch (records, events, output);
//!   `job`: the record itself.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use ebb_api::events::*;
use ebb_api::{
    Action, AgentEvent, AttemptRef, Command, DrainAttempt, JobSubmission, Register, Registered, ReportReply,
    StartAttempt,
};
use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Span, TenantId, Tier, Time};
use ebb_scheduler::{DrainReason, ExitEffect, ExitKind, JobSpec, NodeSpec, NodeStatus, Notice, State};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use crate::store::{NodeRow, PriceRow, ReservationRow, Scope, Store, StoreError, TenantRow, TokenRow};
use crate::{hash_token, new_token, rfc3339, Principal, Refusal, TokenMap, TokenState};

mod admission;
mod agents;
mod batch;
mod checkpoints;
mod config;
mod credentials;
mod deadline;
mod dispatch;
mod drill;
mod due;
mod effects;
mod ending;
mod exits;
mod fleet;
mod gates;
mod health;
mod job;
mod jobs;
mod launch;
mod lines;
mod money;
mod pending;
mod plan;
mod recovery;
mod reports;
mod spec;
mod staged;
mod table;
mod tenants;
mod views;
mod webhooks;
mod write;

use admission::Admission;
pub use batch::BatchFailed;
pub use checkpoints::{CheckpointStats, SavedCheckpoint};
pub use config::{check_policy, check_times, ConfigError, EngineConfig, MAX_KEEP_FINISHED};
use credentials::write_secret;
pub use deadline::{Deadline, Progress, Promotion, RESTART_ALLOWANCE_MS};
pub use drill::{DrillExit, DrillRecord, NextAttempt, Resume, LOST_WORK_TOLERANCE};
use due::Due;
use effects::{Effects, Parts};
pub use ending::{EndedBy, STOP_GRACE_MS};
pub use exits::UNSTARTED_GRACE_MS;
pub use job::{
    restart_backoff_ms, ArrayTask, DrainNotice, Drained, ElasticRun, JobRecord, JobState, LeavingPart,
    LeftPart, Part, Waiting, QUICK_EXIT_MS,
};
use job::{Change, TenantLoad};
use launch::Launch;
pub use lines::{Lines, QuietPoll};
pub use plan::BATCH_STARTS;
use recovery::gpu_indices;
pub use recovery::{OpenError, RestoreError};
pub use spec::{PinnedImage, Restart, SlurmOptions, StoredSpec};
use table::JobTable;
use tenants::Tenants;
pub use views::JobQuery;

pub fn now_ms() -> u64 {
    ebb_core::time::unix_ms(SystemTime::now())
}

/// A message for the writer thread.
pub enum Msg {
    Submit {
        principal: Principal,
        spec: Box<JobSubmission>,
        reply: oneshot::Sender<Result<Vec<JobId>, Refusal>>,
    },
    /// Several submissions in one transaction, all or none.
    SubmitBatch {
        principal: Principal,
        specs: Vec<JobSubmission>,
        reply: oneshot::Sender<Result<Vec<Vec<JobId>>, Refusal>>,
    },
    Jobs {
        principal: Principal,
        query: JobQuery,
        reply: oneshot::Sender<Result<ebb_api::JobPage, Refusal>>,
    },
    Job {
        principal: Principal,
        id: JobId,
        reply: oneshot::Sender<Result<ebb_api::Job, Refusal>>,
    },
    Cancel {
        principal: Principal,
        id: JobId,
        req: ebb_api::CancelRequest,
        reply: oneshot::Sender<Result<ebb_api::Job, Refusal>>,
    },
    /// A signal for a running job's processes.
    Signal {
        principal: Principal,
        id: JobId,
        signal: i32,
        /// (the batch shell alone, everything: steps, shell, its children).
        to: (bool, bool),
        reply: oneshot::Sender<Result<ebb_api::Job, Refusal>>,
    },
    /// How the job's tenant reaches its running Slurm job's steps.
    Steps {
        principal: Principal,
        id: JobId,
        reply: oneshot::Sender<Result<ebb_api::StepAccess, Refusal>>,
    },
    Partitions {
        reply: oneshot::Sender<Vec<ebb_api::Partition>>,
    },
    /// A fire drill of a running preemptible job's drain.
    Drill {
        principal: Principal,
        id: JobId,
        reply: oneshot::Sender<Result<ebb_api::Job, Refusal>>,
    },
    LogFile {
        principal: Principal,
        id: JobId,
        /// Where the reader is in the log.
        offset: u64,
        /// With which node of a gang wrote each piece (`LogFile::sources`).
        sources: bool,
        reply: oneshot::Sender<Result<LogFile, Refusal>>,
    },
    Nodes {
        reply: oneshot::Sender<Vec<ebb_api::Node>>,
    },
    Capacity {
        principal: Principal,
        reply: oneshot::Sender<ebb_api::Capacity>,
    },
    DrainNode {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::Node, Refusal>>,
    },
    Reclaim {
        req: ebb_api::ReclaimRequest,
        reply: oneshot::Sender<Result<ebb_api::ReclaimReply, Refusal>>,
    },
    ReleaseReclaim {
        req: ebb_api::ReclaimRelease,
        reply: oneshot::Sender<Result<ebb_api::ReclaimReleased, Refusal>>,
    },
    UndrainNode {
        name: String,
        gpu: Option<u8>,
        reply: oneshot::Sender<Result<ebb_api::Node, Refusal>>,
    },
    CreateTenant {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::TenantCreated, Refusal>>,
    },
    /// Every tenant, with what it holds (admin).
    Tenants {
        reply: oneshot::Sender<Vec<ebb_api::TenantSummary>>,
    },
    /// A tenant's limits and usage; with `set`, first replaces its limits.
    TenantLimits {
        principal: Principal,
        tenant: String,
        set: Option<ebb_api::TenantLimits>,
        reply: oneshot::Sender<Result<ebb_api::TenantUsage, Refusal>>,
    },
    /// A tenant's registry logins: with `set`, first gives (`Some`) or
    /// removes (`None`) its login for `registry`. Answers the registries.
    RegistryLogins {
        principal: Principal,
        tenant: String,
        set: Option<(String, Option<ebb_api::RegistryLogin>)>,
        reply: oneshot::Sender<Result<Vec<ebb_api::RegistryLoginInfo>, Refusal>>,
    },
    /// The login of the principal's tenant for `registry`, to resolve an
    /// image at submit.
    RegistryLoginFor {
        tenant: TenantId,
        registry: String,
        reply: oneshot::Sender<Option<ebb_api::RegistryLogin>>,
    },
    /// What the server needs to pin the image of a step of `attempt`,
    /// which a poll of `node` asks for: refused unless the attempt runs
    /// there.
    StepImage {
        node: String,
        attempt: ebb_api::AttemptRef,
        registry: String,
        reference: String,
        reply: oneshot::Sender<Result<StepImageGrant, Refusal>>,
    },
    /// The digest `reference` resolved to for `attempt`'s steps; the
    /// reply is the attempt's pin, the first one made.
    PinStepImage {
        attempt: ebb_api::AttemptRef,
        reference: String,
        digest: String,
        reply: oneshot::Sender<String>,
    },
    /// `principal` is the join token, or the node's own credential.
    Register {
        principal: Principal,
        reg: Register,
        reply: oneshot::Sender<Result<Registered, Refusal>>,
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
        reply: oneshot::Sender<Result<Poll, Refusal>>,
    },
    /// `report.node` is the one the caller's credential speaks for.
    Report {
        report: ebb_api::Report,
        reply: oneshot::Sender<Result<ReportReply, Refusal>>,
    },
    Metrics {
        reply: oneshot::Sender<crate::metrics::Snapshot>,
    },
    CreateWebhook {
        principal: Principal,
        req: ebb_api::WebhookRequest,
        reply: oneshot::Sender<Result<ebb_api::Webhook, Refusal>>,
    },
    Webhooks {
        principal: Principal,
        tenant: Option<String>,
        reply: oneshot::Sender<Result<Vec<ebb_api::Webhook>, Refusal>>,
    },
    DeleteWebhook {
        principal: Principal,
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::Webhook, Refusal>>,
    },
    WebhookLog {
        principal: Principal,
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::WebhookLog, Refusal>>,
    },
    /// The deliverer tried a delivery (`crate::webhooks`).
    WebhookTried {
        delivery: u64,
        attempt: u32,
        tried: crate::webhooks::Tried,
        at_ms: u64,
    },
    RemoveNode {
        name: String,
        reply: oneshot::Sender<Result<ebb_api::NodeRemoved, Refusal>>,
    },
    RotateJoinToken {
        reply: oneshot::Sender<Result<ebb_api::JoinToken, Refusal>>,
    },
    TenantTokens {
        name: String,
        /// A new token (rotate) or none (revoke); every older one goes.
        issue: bool,
        reply: oneshot::Sender<Result<ebb_api::TenantTokens, Refusal>>,
    },
    Prices {
        reply: oneshot::Sender<ebb_api::PriceBook>,
    },
    SetPrice {
        model: String,
        update: ebb_api::PriceUpdate,
        reply: oneshot::Sender<Result<ebb_api::Price, Refusal>>,
    },
    CreateReservation {
        req: ebb_api::ReservationRequest,
        reply: oneshot::Sender<Result<ebb_api::Reservation, Refusal>>,
    },
    Reservations {
        principal: Principal,
        reply: oneshot::Sender<Vec<ebb_api::Reservation>>,
    },
    DeleteReservation {
        id: u64,
        reply: oneshot::Sender<Result<ebb_api::Reservation, Refusal>>,
    },
    Bill {
        principal: Principal,
        tenant: Option<String>,
        from: String,
        to: String,
        reply: oneshot::Sender<Result<ebb_api::Invoice, Refusal>>,
    },
    OperatorReport {
        from: String,
        to: String,
        reply: oneshot::Sender<Result<ebb_api::OperatorReport, Refusal>>,
    },
    OperatorReportSeries {
        from: String,
        to: String,
        step: String,
        reply: oneshot::Sender<Result<ebb_api::ReportSeries, Refusal>>,
    },
    Tick,
}

/// Where a job's log is and how much of it may be read: what is committed.
pub struct LogFile {
    pub path: PathBuf,
    pub committed: u64,
    /// Up to 1 MiB from the offset asked, from the store; none for a log
    /// written before the store kept output, which is the file `path`.
    pub stored: Option<Vec<u8>>,
    /// The job has ended: no more output will come.
    pub finished: bool,
    /// Where each piece of `stored` a gang's node wrote starts in the log,
    /// and which node, when asked for.
    pub sources: Vec<(u64, String)>,
    /// When the job's output was removed (`keep_output`), if it was.
    pub removed_ms: Option<u64>,
}

pub struct Poll {
    /// Shared with the node's stream: a poll answered again (a node's
    /// commands stay until it says it has them) costs the writer no copy.
    pub commands: Vec<Arc<Command>>,
    pub next_seq: u64,
    pub changed: watch::Receiver<Delivered>,
}

/// A node's stream as the last commit that added to it left it: what a
/// poll woken by that commit answers with, without asking the writer
/// again.
#[derive(Clone, Default)]
pub struct Delivered {
    /// The stream's next sequence number (0 until something is delivered).
    pub next_seq: u64,
    /// The commands the node had not yet said it has, oldest first.
    pub commands: Arc<[Arc<Command>]>,
}

impl Delivered {
    /// The commands after sequence number `after`.
    pub fn after(&self, after: u64) -> Vec<Arc<Command>> {
        self.commands.iter().filter(|c| c.seq > after).cloned().collect()
    }
}

/// One node's command stream.
struct Channel {
    commands: VecDeque<Arc<Command>>,
    next_seq: u64,
    notify: watch::Sender<Delivered>,
}

impl Channel {
    fn new() -> Channel {
        Channel { commands: VecDeque::new(), next_seq: 1, notify: watch::channel(Delivered::default()).0 }
    }

    fn push(&mut self, action: Action) {
        self.commands.push_back(Arc::new(Command { seq: self.next_seq, action }));
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
    /// It never ran: why its start failed, as the agent says it.
    start_error: Option<String>,
    /// It never ran: the gang's rendezvous port was taken on the node.
    port_in_use: Option<u16>,
    /// The agent ended it: the job asked to be requeued, or it ran past
    /// its time limit.
    ended_by: Option<EndedBy>,
}

impl PartExit {
    /// A part that is gone without a word of its end (`why`, if known).
    fn vanished(why: Option<String>) -> PartExit {
        PartExit {
            code: None,
            signal: None,
            completed: false,
            vanished: true,
            peak_memory_bytes: None,
            start_error: why,
            port_in_use: None,
            ended_by: None,
        }
    }
}

/// The operator's rules for container images.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Images {
    /// Tenants whose jobs must name an image (`--require-image`).
    pub required: Required,
    /// Tenants whose jobs may run as root inside their image
    /// (`--image-root`); everyone else's run as the tenant's user.
    pub root: BTreeSet<String>,
}

/// Who must run in an image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Required {
    #[default]
    Nobody,
    Everyone,
    Tenants(BTreeSet<String>),
}

impl Images {
    pub fn required_for(&self, tenant: &str) -> bool {
        match &self.required {
            Required::Nobody => false,
            Required::Everyone => true,
            Required::Tenants(t) => t.contains(tenant),
        }
    }
}

/// Which Unix user runs each tenant's jobs on the nodes: the operator's
/// mapping, and optionally a default for tenants it does not name. A
/// tenant without either runs as a uid of its own, which each root agent
/// allocates from its range by the tenant's number. A root agent never
/// runs a tenant's job as root unless it was told it may.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunAs {
    pub by_tenant: BTreeMap<String, String>,
    /// The user of every tenant `by_tenant` does not name: those tenants
    /// share it, and so each other's files and processes.
    pub default: Option<String>,
}

impl RunAs {
    pub fn user(&self, tenant: &str) -> Option<&str> {
        self.by_tenant.get(tenant).or(self.default.as_ref()).map(String::as_str)
    }

    /// Tenants this mapping makes share a Unix user, for the operator's
    /// warning at start: each shared user with the tenants named to it
    /// (`*` for every tenant the mapping does not name).
    pub fn shared(&self) -> Vec<(String, Vec<String>)> {
        let mut by_user: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (tenant, user) in &self.by_tenant {
            by_user.entry(user).or_default().push(tenant.clone());
        }
        if let Some(user) = &self.default {
            by_user.entry(user).or_default().push("*".into());
        }
        by_user
            .into_iter()
            .filter(|(_, tenants)| tenants.len() > 1 || tenants.iter().any(|t| t == "*"))
            .map(|(user, tenants)| (user.to_string(), tenants))
            .collect()
    }
}

/// The writer. Its state is grouped by what each part of it serves, so
/// that a handler's borrows show what it touches.
/// What pinning a step's image needs of the writer: the tenant's login
/// for the registry (and whether it may go to nodes), and the attempt's
/// pin of the reference if it has one.
#[derive(Debug)]
pub struct StepImageGrant {
    pub login: Option<ebb_api::RegistryLogin>,
    pub login_to_node: bool,
    pub pinned: Option<String>,
}

pub struct Engine<S: Store> {
    store: S,
    config: EngineConfig,
    sched: ebb_scheduler::Config,
    core: State,
    /// The batch's instant: every time written in a batch is this one.
    now: u64,
    /// The job table, with what falls due for its jobs.
    jobs: JobTable,
    /// When finished jobs' output was last pruned (`keep_output`).
    output_pruned_ms: u64,
    /// What lets queued jobs into the core.
    admission: Admission,
    tenants: Tenants,
    access: Access,
    fleet: Fleet,
    money: Money,
    webhooks: webhooks::Webhooks,
    outbox: Outbox,
    /// Changes with every server start, so agents notice a restart.
    epoch: u64,
    /// Quiet nodes' polls, answered without the writer.
    lines: Arc<Lines>,
    counters: crate::metrics::Counters,
    /// The latest pass's reason for each job first in line that waits.
    pending: HashMap<JobId, ebb_scheduler::Pending>,
    /// The last batch stopped scheduling at its bound with more to start:
    /// the next batch comes at once, with or without messages.
    unsettled: bool,
    /// Batches since the last whole check of a debug build's writer.
    unchecked: u64,
    /// The last checkpoint recommendation a placement made, and its text.
    why: launch::WhyText,
    /// The images live attempts' steps run, by reference: their digests,
    /// pinned at the first step that named each.
    step_images: HashMap<ebb_api::AttemptRef, BTreeMap<String, String>>,
}

/// Who may call: the token map the HTTP handlers authenticate against,
/// and each node's credential, by node name (its hash).
struct Access {
    tokens: TokenMap,
    node_credentials: BTreeMap<String, String>,
}

/// The nodes as the server knows them beyond the core.
#[derive(Default)]
struct Fleet {
    nodes: BTreeMap<String, NodeRow>,
    /// When each node was last heard from before this server started, and
    /// the nodes heard from since.
    heard_before: HashMap<String, u64>,
    heard_since_start: BTreeSet<String>,
    /// When each node's contact was last written to the store, or is to
    /// be on the next tick (`contact_due`).
    heard_stored: HashMap<String, u64>,
    /// Busy nodes' contacts not yet written: the tick writes them.
    contact_due: HashMap<String, u64>,
    /// Nodes whose agents say their reports keep failing, and why.
    unhealthy: HashMap<String, String>,
    /// The last report applied from each node, once one came.
    reports: HashMap<String, ebb_api::ReportId>,
    /// GPUs and nodes of each model that have joined and not been removed
    /// (lost ones may come back): the most a job of that model could get.
    registered: BTreeMap<String, (u64, u32)>,
    /// Every node row of each model, removed ones too, summed for the
    /// checkpoint advice: how many, when they joined, how often they were
    /// interrupted. Kept as rows change, so a placement does not walk the
    /// fleet.
    exposure: HashMap<String, Exposure>,
    /// Rendezvous ports agents found taken by other programs, by the
    /// node's address (the most recent [`BUSY_PORTS_KEPT`]): no gang is
    /// given them there again. Memory only: after a restart an agent says
    /// so again, once.
    busy_ports: HashMap<String, VecDeque<u16>>,
    /// Nodes whose agents, as they registered with this server, hold a
    /// start back until its GPUs are free (`staged`).
    starts_when_free: BTreeSet<String>,
}

/// How many taken rendezvous ports are remembered per address.
pub(super) const BUSY_PORTS_KEPT: usize = 64;

/// Sums over the node rows of one model.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Exposure {
    pub nodes: u64,
    pub joined_ms: u128,
    pub interruptions: u64,
}

impl Fleet {
    /// `row` is the node's now: stored, summed, and shown to watchers.
    fn write(&mut self, row: NodeRow, fx: &mut impl Effects) -> Written {
        fx.put_node(&row)?;
        self.put(row);
        Ok(())
    }

    /// `node` was interrupted without notice: counted for the checkpoint
    /// advice of its model.
    fn interrupted(&mut self, node: &str, fx: &mut impl Effects) -> Written {
        match self.nodes.get(node) {
            Some(row) => {
                let row = NodeRow { interruptions: row.interruptions + 1, ..row.clone() };
                self.write(row, fx)
            }
            None => Ok(()),
        }
    }

    /// `row` replaces what the fleet had under its name.
    fn put(&mut self, row: NodeRow) {
        if let Some(old) = self.nodes.get(&row.name) {
            let sums = self.exposure.entry(old.gpu_model.clone()).or_default();
            sums.nodes -= 1;
            sums.joined_ms -= u128::from(old.joined_ms);
            sums.interruptions -= old.interruptions;
            if !old.removed {
                let entry = self.registered.entry(old.gpu_model.clone()).or_default();
                entry.0 = entry.0.saturating_sub(u64::from(old.gpus));
                entry.1 = entry.1.saturating_sub(1);
            }
        }
        if !row.removed {
            let entry = self.registered.entry(row.gpu_model.clone()).or_default();
            entry.0 += u64::from(row.gpus);
            entry.1 += 1;
        }
        let sums = self.exposure.entry(row.gpu_model.clone()).or_default();
        sums.nodes += 1;
        sums.joined_ms += u128::from(row.joined_ms);
        sums.interruptions += row.interruptions;
        self.nodes.insert(row.name.clone(), row);
    }
}

/// Prices by model, and reservations by id.
#[derive(Default)]
struct Money {
    prices: BTreeMap<String, PriceRow>,
    reservations: BTreeMap<u64, ReservationRow>,
}

/// What leaves the writer, held until the batch commits: replies to
/// callers, commands in the nodes' streams with the nodes to wake, and the
/// batch's events for the log.
#[derive(Default)]
struct Outbox {
    replies: Vec<Box<dyn FnOnce() + Send>>,
    /// The log says what the store holds, and its lines are written after
    /// the batch's notices and answers are on their way, not before.
    log: Vec<Logged>,
    channels: HashMap<String, Channel>,
    woken: BTreeSet<String>,
    /// The batch changed what people watch: jobs, nodes, money.
    changed: bool,
    /// Counts the commits that changed something, for live pages.
    feed: Option<Feed>,
    /// Webhook deliveries (and forgotten webhooks) for the deliverer.
    webhook_sends: Vec<crate::webhooks::Command>,
    webhooks: Option<tokio::sync::mpsc::UnboundedSender<crate::webhooks::Command>>,
}

/// A job's event for the log.
struct Logged {
    job: JobId,
    attempt: Attempt,
    /// A step every job takes on its way: at debug.
    routine: bool,
    event: Event,
}

/// The count of committed batches that changed jobs, nodes or money; a
/// page following it reads again what it shows when it moves.
pub type Feed = std::sync::Arc<tokio::sync::watch::Sender<u64>>;

impl Outbox {
    fn reply<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.replies.push(Box::new(move || {
            let _ = tx.send(value);
        }));
    }

    /// Queues `action` in `node`'s stream; the node is woken after the commit.
    fn push(&mut self, node: &str, action: Action) {
        self.channels.entry(node.to_string()).or_insert_with(Channel::new).push(action);
        self.woken.insert(node.to_string());
    }

    /// The batch committed: wake the nodes with new commands, handing
    /// their waiting polls the commands, then answer. Nodes first: a
    /// preemption's notice is the batch's most urgent effect.
    fn deliver(&mut self) {
        for node in std::mem::take(&mut self.woken) {
            if let Some(ch) = self.channels.get(&node) {
                let commands = ch.commands.iter().cloned().collect();
                ch.notify.send_replace(Delivered { next_seq: ch.next_seq, commands });
            }
        }
        for reply in self.replies.drain(..) {
            reply();
        }
        if std::mem::take(&mut self.changed) {
            if let Some(feed) = &self.feed {
                feed.send_modify(|n| *n += 1);
            }
        }
        // Without a deliverer (in-process tests), the outbox's rows wait
        // for the next server.
        for command in self.webhook_sends.drain(..) {
            if let Some(deliverer) = &self.webhooks {
                let _ = deliverer.send(command);
            }
        }
        self.write_log();
    }

    /// The committed batch's events, in the log: an operator's at info,
    /// the steps every job takes on its way at debug.
    fn write_log(&mut self) {
        for Logged { job, attempt, routine, event } in self.log.drain(..) {
            let kind = event.kind().as_str();
            if routine {
                tracing::debug!(target: "ebb_server::engine::write", job = job.0, attempt = attempt.0, kind, "{event}");
            } else {
                tracing::info!(target: "ebb_server::engine::write", job = job.0, attempt = attempt.0, kind, "{event}");
            }
        }
    }

    /// The batch did not commit: nothing of it is answered. Commands it
    /// queued stay unseen (the server exits, and a restarted one derives
    /// every stream afresh from the store).
    fn discard(&mut self) {
        self.replies.clear();
        self.log.clear();
        self.woken.clear();
        self.changed = false;
        self.webhook_sends.clear();
    }
}

/// How a handler fails: the request is refused (the caller is answered
/// with the error and the batch goes on), or the store failed (the batch
/// is rolled back, nothing of it is answered, and the server exits).
#[derive(Debug)]
pub(crate) enum Fail {
    Refused(Refusal),
    Store(StoreError),
}

impl From<Refusal> for Fail {
    fn from(e: Refusal) -> Fail {
        Fail::Refused(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Fail {
        Fail::Store(e)
    }
}

/// A store write inside a batch: its error ends the batch.
type Written<T = ()> = Result<T, StoreError>;
