//! A job's history: its events, each a kind with a typed detail, and why a
//! queued job waits. On the wire an event is `{at, at_ms, attempt, kind,
//! detail}`; `detail`'s fields depend on `kind`, and a field that does not
//! apply (or is not known) is absent. Every field reads with a default, so
//! that an event stored by an earlier version, which wrote fewer fields,
//! reads back.

use ebb_core::{bytes_text, count, Span};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Drill, NodeGpus};

/// One entry of a job's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    pub at: String,
    pub at_ms: u64,
    pub attempt: u32,
    /// `kind` and its `detail`.
    #[serde(flatten)]
    pub event: Event,
    /// The detail in a line for people, as `ebb show` prints it (in a
    /// job's view; not stored).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
}

impl JobEvent {
    pub fn kind(&self) -> EventKind {
        self.event.kind()
    }
}

/// An event's detail alone, as it serialises (`Event::detail`).
pub struct Detail<'a>(&'a Event);

impl Serialize for Detail<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_detail(serializer)
    }
}

/// Declares `Event`, one variant per `EventKind` with its detail, and
/// what is said of each variant once: its kind, its detail alone as JSON
/// (as the store keeps it), and its detail's defaults.
macro_rules! events {
    ($($kind:ident($detail:ty),)*) => {
        /// What happened, with what is known of it.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
        #[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
        pub enum Event {
            $($kind($detail),)*
        }

        impl Event {
            pub fn kind(&self) -> EventKind {
                match self {
                    $(Event::$kind(_) => EventKind::$kind,)*
                }
            }

            /// The detail alone, to serialise in place (in a webhook's
            /// body) without writing it out and reading it back.
            pub fn detail(&self) -> Detail<'_> {
                Detail(self)
            }

            /// The detail alone, as JSON.
            pub fn detail_json(&self) -> String {
                serde_json::to_string(&self.detail()).expect("an event's detail is plain data")
            }

            fn serialize_detail<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(Event::$kind(detail) => detail.serialize(serializer),)*
                }
            }

            /// An event of `kind` whose detail says nothing: what a stored
            /// detail that cannot be read is taken as.
            pub fn unknown(kind: EventKind) -> Event {
                match kind {
                    $(EventKind::$kind => Event::$kind(<$detail>::default()),)*
                }
            }
        }
    };
}

events! {
    Submitted(SubmittedDetail),
    Admitted(AdmittedDetail),
    Placed(PlacedDetail),
    Started(StartedDetail),
    Checkpoint(CheckpointDetail),
    Warning(WarningDetail),
    DrainNotice(DrainNoticeDetail),
    Preempting(PreemptingDetail),
    Exited(ExitedDetail),
    Requeued(RequeuedDetail),
    Succeeded(SucceededDetail),
    Failed(FailedDetail),
    Cancelled(CancelledDetail),
    CancelRequested(CancelRequestedDetail),
    Drill(DrillDetail),
    Resumed(ResumedDetail),
    Restored(RestoredDetail),
    Promoted(PromotedDetail),
    GangStopped(GangStoppedDetail),
    Pulling(PullingDetail),
    Pulled(PulledDetail),
    Shrinking(ShrinkingDetail),
    Shrunk(ShrunkDetail),
    Grown(GrownDetail),
}

/// The detail alone, as JSON.
impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail_json())
    }
}

impl Event {
    /// An event as the store keeps it: its kind's name and its detail as
    /// JSON; beside it, why the detail did not read as its kind's (a store
    /// edited by hand), in which case the event has its kind's empty
    /// detail, so that it is never lost from the history.
    pub fn from_stored(kind: EventKind, detail: &str) -> (Event, Option<String>) {
        let whole = format!(r#"{{"kind":"{}","detail":{detail}}}"#, kind.as_str());
        match serde_json::from_str(&whole) {
            Ok(event) => (event, None),
            Err(e) => (Event::unknown(kind), Some(format!("{kind} detail {detail}: {e}"))),
        }
    }
}

/// Accepted: its tier and GPUs, and the task of an array or sweep.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SubmittedDetail {
    pub tier: String,
    pub gpus: u32,
    /// An elastic job's most GPUs (`gpus` its fewest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    /// An array's or sweep's task index (null for a single job).
    pub task: Option<u64>,
}

/// Let into the scheduler once its tenant was under its running limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AdmittedDetail {
    pub reason: String,
}

/// Placed on nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PlacedDetail {
    pub placement: Vec<NodeGpus>,
    /// On the GPUs held for it while its victims drained.
    pub from_hold: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval: Option<CheckpointInterval>,
}

/// The checkpoint interval Ebb recommended to the attempt, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CheckpointInterval {
    pub seconds: u64,
    pub why: String,
}

/// A node started its part.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct StartedDetail {
    pub node: String,
    pub pid: u32,
    /// By the node's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// The job reported a completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CheckpointDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// How long the save took.
    pub seconds: f64,
}

/// Something the job's owner should fix.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct WarningDetail {
    pub message: String,
    /// A checkpoint that took longer than the drain window: how long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_window_seconds: Option<u64>,
}

/// The drain notice: why, when, and when the kill comes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DrainNoticeDetail {
    /// In words: `preempted by job 7`, `node a drained by the operator`,
    /// `preemptible capacity reclaimed by the operator`, a drill.
    pub reason: String,
    pub notice_at: String,
    pub deadline: String,
    /// The same, for programs.
    pub detail: DrainCause,
}

/// An elastic job's nodes told to leave: the attempt goes on on the
/// others.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ShrinkingDetail {
    pub nodes: Vec<String>,
    /// In words, as a drain notice's.
    pub reason: String,
    pub notice_at: String,
    pub deadline: String,
    /// The same, for programs.
    pub detail: DrainCause,
}

/// An elastic job's node left: what it ran there, and what it runs on now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ShrunkDetail {
    pub node: String,
    /// GPUs it had there, and their GPU-seconds from the node's join to
    /// its part's exit.
    pub gpus: u32,
    pub gpu_seconds: f64,
    /// GPUs it runs on now.
    pub now_gpus: u32,
}

/// An elastic job grew onto more nodes: the same attempt, more parts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct GrownDetail {
    pub nodes: Vec<String>,
    /// GPUs it runs on now.
    pub now_gpus: u32,
}

/// What drained a job: the preemptor (`by`), the node an operator drained
/// (`node`), or neither (a reclaim, a drill).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DrainCause {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Preemptible jobs are being drained for this one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PreemptingDetail {
    pub victims: Vec<u64>,
    /// Elastic jobs that each lose one node to it, and go on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shrinking: Vec<PartOf>,
    /// The victims' work since their last checkpoints, in GPU-seconds,
    /// and each elastic job's restart of the GPUs that stay.
    pub lost_gpu_seconds: f64,
}

/// One node's part of a job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PartOf {
    pub job: u64,
    pub node: String,
}

/// A node's processes ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ExitedDetail {
    pub node: String,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The SDK's completion marker was written.
    pub completed_marker: bool,
    /// The node came back without the attempt's processes.
    pub vanished: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Why the attempt could not start, in the agent's words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// The gang's rendezvous port another program held on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_in_use: Option<u16>,
}

/// Back in the queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct RequeuedDetail {
    /// `preempted`, `lost`, `failed, retrying`, `drill`, `restart always`,
    /// or the words of what made a gang's attempt fail.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Work since the last checkpoint, in GPU-seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_gpu_seconds: Option<f64>,
    /// A lost attempt: its node, and why it was lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// A restarted job: how its attempt exited, its quick exits in a row
    /// and the back-off before the next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quick_exits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SucceededDetail {
    /// From placement to the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ran_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FailedDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why, when it was not its own exit: `preempted more than
    /// max_preemptions`, a gang's part that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_gpu_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CancelledDetail {
    /// `queued` when it never ran.
    #[serde(rename = "while", skip_serializing_if = "Option::is_none")]
    pub while_: Option<String>,
}

/// Cancelled while running: SIGTERM now, SIGKILL at `deadline`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CancelRequestedDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<f64>,
}

/// A fire drill: its notice, then its verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum DrillDetail {
    /// The drill began: the attempt given the notice, and its window.
    Notice(DrillNotice),
    /// The drill concluded: the report, as `GET /v1/jobs/{id}/drill`.
    Verdict(Box<Drill>),
}

impl Default for DrillDetail {
    fn default() -> DrillDetail {
        DrillDetail::Notice(DrillNotice::default())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DrillNotice {
    pub attempt: u32,
    pub nodes: Vec<String>,
    pub notice_at: String,
    pub deadline: String,
    pub window_seconds: f64,
}

/// An attempt reported resuming from a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ResumedDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// Before the attempt started, its node put the job's latest checkpoint
/// from the cluster's checkpoint store in its checkpoint directory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct RestoredDetail {
    pub node: String,
    /// Which upload it was: of attempt `from_attempt`, its `upload`th.
    pub from_attempt: u32,
    pub upload: u32,
    /// None: the state an attempt left at its exit.
    pub step: Option<u64>,
    pub files: u64,
    pub bytes: u64,
    pub seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// A deadline job moved to on-demand, where it runs (billed at the
/// on-demand rate from now) or in the queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PromotedDetail {
    pub running: bool,
    pub fraction_done: Option<f64>,
    pub needed_seconds: Option<u64>,
    pub margin_seconds: u64,
    pub left_seconds: u64,
    pub reason: String,
}

/// Ebb stopped a gang's parts still running: a part failed, or they
/// outran the gang exit grace after a part exited 0. The attempt fails.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct GangStoppedDetail {
    pub reason: String,
}

/// A node began pulling the job's image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PullingDetail {
    pub node: String,
    pub digest: Option<String>,
    pub total_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// A node has the job's image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PulledDetail {
    pub node: String,
    /// 0: it was in the node's cache.
    pub downloaded_bytes: u64,
    pub seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// Why a queued job waits, as a stable code; `pending_detail` says it as
/// a sentence with the numbers. The names are an interface: scripts match
/// on them, and `/metrics` labels `ebb_jobs_queued` with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PendingReason {
    /// Not enough free GPUs of its model.
    Resources,
    /// Behind earlier work that waits for the same GPUs.
    Priority,
    /// A gang short of whole free nodes.
    WholeNodes,
    /// On-demand work may not use reserved GPUs.
    ReservationCap,
    /// Its tenant's reservation is in use.
    ReservationFull,
    /// Its tenant's reservation has not started.
    ReservationNotStarted,
    /// The operator's reclaim limit on preemptible work.
    Reclaimed,
    /// Not that many GPUs of its model in service.
    NoCapacity,
    /// Other tenants' work, further below their shares of the tier, waits
    /// for the same GPUs ahead of it.
    FairShare,
    /// Fair-share preemption drains jobs of the tenant furthest above its
    /// share for it.
    ReclaimingShare,
    /// Its tenant's quota (its borrowing limit, others' quotas it would
    /// borrow from) keeps it waiting.
    Quota,
    /// Its tenant is under its quota: borrowers give GPUs back.
    ReclaimingQuota,
    /// GPUs are held for it while preemptible jobs drain.
    VictimsDraining,
    /// A restart back-off after quick exits.
    Backoff,
    /// Its tenant has as many jobs admitted as its limit.
    TenantLimit,
    /// Jobs it depends on (`after`) have not ended as it needs.
    Dependency,
    /// Its array has as many tasks running as its limit (`array_limit`).
    ArrayLimit,
    /// Not yet looked at by the scheduler.
    Scheduling,
}

impl PendingReason {
    /// Every reason, in the order the documentation lists them.
    pub const ALL: [PendingReason; 18] = [
        PendingReason::Resources,
        PendingReason::Priority,
        PendingReason::WholeNodes,
        PendingReason::ReservationCap,
        PendingReason::ReservationFull,
        PendingReason::ReservationNotStarted,
        PendingReason::Reclaimed,
        PendingReason::NoCapacity,
        PendingReason::FairShare,
        PendingReason::ReclaimingShare,
        PendingReason::Quota,
        PendingReason::ReclaimingQuota,
        PendingReason::VictimsDraining,
        PendingReason::Backoff,
        PendingReason::TenantLimit,
        PendingReason::Dependency,
        PendingReason::ArrayLimit,
        PendingReason::Scheduling,
    ];

    /// The code, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingReason::Resources => "resources",
            PendingReason::Priority => "priority",
            PendingReason::WholeNodes => "whole_nodes",
            PendingReason::ReservationCap => "reservation_cap",
            PendingReason::ReservationFull => "reservation_full",
            PendingReason::ReservationNotStarted => "reservation_not_started",
            PendingReason::Reclaimed => "reclaimed",
            PendingReason::NoCapacity => "no_capacity",
            PendingReason::FairShare => "fair_share",
            PendingReason::ReclaimingShare => "reclaiming_share",
            PendingReason::Quota => "quota",
            PendingReason::ReclaimingQuota => "reclaiming_quota",
            PendingReason::VictimsDraining => "victims_draining",
            PendingReason::Backoff => "backoff",
            PendingReason::TenantLimit => "tenant_limit",
            PendingReason::Dependency => "dependency",
            PendingReason::ArrayLimit => "array_limit",
            PendingReason::Scheduling => "scheduling",
        }
    }
}

impl std::fmt::Display for PendingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a job. The names are an interface: scripts match on
/// them in `ebb show --json` and `GET /v1/jobs/{id}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Accepted; `task` names an array's or sweep's task.
    Submitted,
    /// Let into the scheduler once its tenant was under its running limit.
    Admitted,
    /// Placed on nodes: `placement`, `from_hold`, `checkpoint_interval`.
    Placed,
    /// A node started its part: `node`, `pid`, `at`.
    Started,
    /// The job reported a completed checkpoint: `step`, `bytes`, `seconds`.
    Checkpoint,
    /// Something the job's owner should fix: `message`.
    Warning,
    /// The drain notice: `reason`, `notice_at`, `deadline`.
    DrainNotice,
    /// Preemptible jobs are being drained for this one: `victims`.
    Preempting,
    /// A node's processes ended: `node`, `code`, `signal`, `vanished`.
    Exited,
    /// Back in the queue: `reason` (preempted, lost, retrying, restart).
    Requeued,
    Succeeded,
    Failed,
    Cancelled,
    /// Cancelled while running: its processes are being stopped.
    CancelRequested,
    /// A fire drill: `phase` `notice` when it began (`deadline`), then
    /// `phase` `verdict` with the report (`verdict`, `failures`, ...).
    Drill,
    /// An attempt reported resuming from a checkpoint: `step`.
    Resumed,
    /// Before the attempt started, its node put the job's latest checkpoint
    /// from the cluster's checkpoint store in its checkpoint directory:
    /// `node`, `from_attempt` and `upload` (which upload it was), `step`
    /// (none: the state an attempt left at its exit), `files`, `bytes`,
    /// `seconds`.
    Restored,
    /// A deadline job moved to on-demand: `running` (in place, billed at
    /// the on-demand rate from now) or queued, `fraction_done`,
    /// `needed_seconds`, `margin_seconds`, `left_seconds`, `reason`.
    Promoted,
    /// Ebb stopped a gang's parts still running: `reason` (a part failed,
    /// or they outran the gang exit grace after a part exited 0). The
    /// attempt fails.
    GangStopped,
    /// A node began pulling the job's image: `node`, `digest`,
    /// `total_bytes`.
    Pulling,
    /// A node has the job's image: `node`, `downloaded_bytes` (0: it was
    /// in the node's cache), `seconds`.
    Pulled,
    /// An elastic job's `nodes` told to leave (`reason`, `deadline`); the
    /// attempt goes on on its other nodes.
    Shrinking,
    /// An elastic job's part on `node` left: its `gpus`, `gpu_seconds`,
    /// and `now_gpus`, what the job runs on now.
    Shrunk,
    /// An elastic job grew onto `nodes`: it runs on `now_gpus`.
    Grown,
}

impl EventKind {
    pub const ALL: [EventKind; 24] = [
        EventKind::Submitted,
        EventKind::Admitted,
        EventKind::Placed,
        EventKind::Started,
        EventKind::Checkpoint,
        EventKind::Warning,
        EventKind::DrainNotice,
        EventKind::Preempting,
        EventKind::Exited,
        EventKind::Requeued,
        EventKind::Succeeded,
        EventKind::Failed,
        EventKind::Cancelled,
        EventKind::CancelRequested,
        EventKind::Drill,
        EventKind::Resumed,
        EventKind::Restored,
        EventKind::Promoted,
        EventKind::GangStopped,
        EventKind::Pulling,
        EventKind::Pulled,
        EventKind::Shrinking,
        EventKind::Shrunk,
        EventKind::Grown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Submitted => "submitted",
            EventKind::Admitted => "admitted",
            EventKind::Placed => "placed",
            EventKind::Started => "started",
            EventKind::Checkpoint => "checkpoint",
            EventKind::Warning => "warning",
            EventKind::DrainNotice => "drain_notice",
            EventKind::Preempting => "preempting",
            EventKind::Exited => "exited",
            EventKind::Requeued => "requeued",
            EventKind::Succeeded => "succeeded",
            EventKind::Failed => "failed",
            EventKind::Cancelled => "cancelled",
            EventKind::CancelRequested => "cancel_requested",
            EventKind::Drill => "drill",
            EventKind::Resumed => "resumed",
            EventKind::Restored => "restored",
            EventKind::Promoted => "promoted",
            EventKind::GangStopped => "gang_stopped",
            EventKind::Pulling => "pulling",
            EventKind::Pulled => "pulled",
            EventKind::Shrinking => "shrinking",
            EventKind::Shrunk => "shrunk",
            EventKind::Grown => "grown",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;

    fn from_str(text: &str) -> Result<EventKind, String> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| format!("unknown event kind {text:?}"))
    }
}

// ---- for people ------------------------------------------------------------

/// `node-0: GPU 3`, `node-1: GPUs 0,1,2,3`.
pub fn on_gpus(node: &str, gpus: &[u8]) -> String {
    let list = gpus.iter().map(u8::to_string).collect::<Vec<_>>().join(",");
    format!("{node}: {} {list}", if gpus.len() == 1 { "GPU" } else { "GPUs" })
}

/// GPU-seconds of work for people, in GPU-hours as bills count them and,
/// for one job, as the product a reader can check: `0.67 GPU-hours (8
/// GPUs x 5m 01s)`, `0.00 GPU-hours (1 GPU x 41ms)`.
pub fn gpu_time(gpu_seconds: f64, gpus: Option<u32>) -> String {
    let hours = format!("{:.2} GPU-hours", gpu_seconds / 3600.0);
    match gpus.filter(|&g| g > 0) {
        Some(g) => format!(
            "{hours} ({} x {})",
            count(u64::from(g), "GPU"),
            Span::from_secs_f64(gpu_seconds / f64::from(g)).human()
        ),
        None => hours,
    }
}

impl Event {
    /// The event's details in a line for people, as `ebb show` and the
    /// dashboard's timeline give them (`JobEvent::text`); `gpus`: the
    /// job's, for lost work as its product.
    pub fn describe(&self, gpus: u32) -> String {
        describe(self, gpus)
    }
}

fn describe(event: &Event, gpus: u32) -> String {
    use Event as E;
    let took = |seconds: f64| Span::from_secs_f64(seconds).human();
    let exit = |code: Option<i32>, signal: Option<i32>| match (code, signal) {
        (_, Some(signal)) => Some(format!("by signal {signal}")),
        (Some(code), _) => Some(format!("with code {code}")),
        _ => None,
    };
    match event {
        E::Submitted(d) => {
            let task = d.task.map(|t| format!(", task {t}")).unwrap_or_default();
            match d.max_gpus {
                Some(max) => format!("{}, {} to {max} GPUs, elastic{task}", d.tier, d.gpus),
                None => format!("{}, {} {}{task}", d.tier, d.gpus, if d.gpus == 1 { "GPU" } else { "GPUs" }),
            }
        }
        E::Admitted(d) => d.reason.clone(),
        E::Placed(d) => d.placement.iter().map(|p| on_gpus(&p.node, &p.gpus)).collect::<Vec<_>>().join("; "),
        E::Started(d) => format!("on {} (pid {})", d.node, d.pid),
        E::DrainNotice(d) => format!("{}; kill at {}", d.reason, d.deadline),
        E::Shrinking(d) => {
            format!(
                "{} to leave: {}; kill there at {}; the job goes on",
                d.nodes.join(", "),
                d.reason,
                d.deadline
            )
        }
        E::Shrunk(d) => format!(
            "{} left ({} GPUs, {:.0} GPU-seconds); it runs on {} GPUs",
            d.node, d.gpus, d.gpu_seconds, d.now_gpus
        ),
        E::Grown(d) => format!("grew onto {}; it runs on {} GPUs", d.nodes.join(", "), d.now_gpus),
        E::Exited(d) => {
            let how = match exit(d.code, d.signal) {
                Some(how) => format!("on {} {how}", d.node),
                None => format!("on {} ({})", d.node, if d.vanished { "vanished" } else { "unknown status" }),
            };
            let how = match d.peak_memory_bytes {
                Some(peak) => format!("{how}, peak memory {}", bytes_text(peak)),
                None => how,
            };
            // A start that failed: the agent's words, here and not only in the log.
            match &d.start_error {
                Some(why) => format!("{how}: {why}"),
                None => how,
            }
        }
        E::Requeued(d) => {
            let why = d.why.as_ref().map(|why| format!(": {why}")).unwrap_or_default();
            match d.lost_gpu_seconds {
                Some(lost) => format!("{}{why}; lost {}", d.reason, gpu_time(lost, Some(gpus))),
                None => format!("{}{why}", d.reason),
            }
        }
        E::Checkpoint(d) => {
            let step = d.step.map(|n| format!("step {n}, ")).unwrap_or_default();
            let bytes = d.bytes.map(|b| format!("{}, ", bytes_text(b))).unwrap_or_default();
            format!("{step}{bytes}took {}", took(d.seconds))
        }
        E::Warning(d) => d.message.clone(),
        E::Pulling(d) => {
            format!(
                "{} on {} ({})",
                bytes_text(d.total_bytes),
                d.node,
                d.digest.as_deref().unwrap_or("no digest")
            )
        }
        E::Pulled(d) => match d.downloaded_bytes {
            0 => format!("on {}: in its cache", d.node),
            n => format!("on {}: {} in {}", d.node, bytes_text(n), took(d.seconds)),
        },
        E::GangStopped(d) => d.reason.clone(),
        E::Preempting(d) => {
            let mut victims: Vec<String> = d.victims.iter().map(u64::to_string).collect();
            victims.extend(d.shrinking.iter().map(|p| format!("{}'s node {}", p.job, p.node)));
            format!("victims {}; they lose {}", victims.join(", "), gpu_time(d.lost_gpu_seconds, None))
        }
        E::Succeeded(d) => d.ran_ms.map(|ms| format!("ran {}", Span(ms).human())).unwrap_or_default(),
        E::Failed(d) => {
            let how = d.reason.clone().or_else(|| exit(d.code, d.signal)).unwrap_or_default();
            match d.lost_gpu_seconds {
                Some(lost) => format!("{how}; lost {}", gpu_time(lost, Some(gpus))),
                None => how,
            }
        }
        E::Cancelled(d) => d.while_.as_ref().map(|w| format!("while {w}")).unwrap_or_default(),
        E::CancelRequested(d) => match (&d.deadline, d.grace_seconds) {
            (Some(deadline), Some(grace)) => format!("SIGTERM, kill at {deadline} (grace {})", took(grace)),
            _ => String::new(),
        },
        E::Drill(DrillDetail::Notice(d)) => format!(
            "notice sent to attempt {}; kill at {} (window {})",
            d.attempt,
            d.deadline,
            took(d.window_seconds)
        ),
        E::Drill(DrillDetail::Verdict(d)) => {
            let verdict = d.verdict.as_deref().unwrap_or("none");
            match d.failures.is_empty() {
                true => format!("verdict: {verdict}"),
                false => format!("verdict: {verdict}: {}", d.failures.join("; ")),
            }
        }
        E::Promoted(d) => format!(
            "to on-demand{}: {}",
            if d.running { " where it runs" } else { " in the queue" },
            d.reason
        ),
        E::Resumed(d) => match d.step {
            Some(step) => format!("from step {step}"),
            None => "from its latest checkpoint".into(),
        },
        E::Restored(d) => {
            let what = match d.step {
                Some(step) => format!("step {step}"),
                None => "the state at exit".into(),
            };
            format!(
                "{what} (attempt {}, upload {}) from the checkpoint store on {}: {} {}, {}, took {}",
                d.from_attempt,
                d.upload,
                d.node,
                d.files,
                if d.files == 1 { "file" } else { "files" },
                bytes_text(d.bytes),
                took(d.seconds)
            )
        }
    }
}

#[cfg(test)]
mod tests;
