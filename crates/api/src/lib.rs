//! Ebb's wire formats: the REST API that users and the CLI speak, and the
//! protocol between the server and its agents. JSON over HTTP; times are
//! RFC 3339 strings for people and milliseconds since the Unix epoch
//! (`*_ms`) for programs. This crate is an API boundary: change it only in
//! ways old clients can read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
use utoipa::ToSchema;

pub mod events;
pub use events::{Event, EventKind, JobEvent, PendingReason};

/// The largest request body the server reads, in bytes; larger ones are
/// refused with 413. Named here so that agents size their reports under it.
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// The largest report body an agent sends: half the server's limit, so
/// that an estimate a little off never meets a 413.
pub const MAX_REPORT_BYTES: usize = MAX_REQUEST_BYTES / 2;

// ---- limits the server enforces, as the API document states them ----------

/// A time given by a person: RFC 3339 (`2026-12-01T08:00:00Z`, `Z` or
/// `+00:00` optional, `T` or a space) or a date (`2026-12-01`, midnight
/// UTC), from 1970. Days past the 28th are valid but not stated here.
pub const TIME_PATTERN: &str = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$";
/// Dollars as a decimal string, at most six decimals (micro-dollars).
pub const USD_PATTERN: &str = r"^[0-9]{1,12}(\.[0-9]{0,6})?$";
/// A series' step: a whole number of seconds, minutes, hours or days
/// (`15m`, `1h`, `1d`). The server takes any `humantime` duration
/// (`1h 30m`); this is the form every client can rely on.
pub const STEP_PATTERN: &str = r"^[0-9]{1,6}(s|m|h|d)$";
/// A string without NUL bytes (arguments, environment values).
const NO_NUL_PATTERN: &str = r"^[^\u0000]*$";
/// An environment variable a job may set: not Ebb's own (`EBB_*`,
/// `CUDA_VISIBLE_DEVICES`).
const ENV_NAME_PATTERN: &str = r"^(?!EBB_)(?!CUDA_VISIBLE_DEVICES$)[A-Za-z_][A-Za-z0-9_]*$";

fn no_nul_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(NO_NUL_PATTERN))
}

/// `argv`: a program and its arguments, none with a NUL byte.
fn argv_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(no_nul_string())
        .min_items(Some(1))
        .description(Some("Program and arguments, run directly (never through a shell)."))
}

/// `env`: variable names and values.
fn env_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(ObjectBuilder::new().schema_type(Type::String).pattern(Some(ENV_NAME_PATTERN))))
        .additional_properties(Some(no_nul_string()))
        .description(Some("Environment of the job, on top of what Ebb sets (EBB_*, CUDA_VISIBLE_DEVICES)."))
}

/// A sweep parameter's values: at least one, each at most 4096 characters.
fn sweep_values_schema() -> ArrayBuilder {
    ArrayBuilder::new().items(no_nul_string().max_length(Some(4096))).min_items(Some(1))
}

/// `POST /v1/jobs`: a job as the user describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    /// A name for people; need not be unique. One line.
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\n\u0000]*$")]
    pub name: Option<String>,
    /// `preemptible` (default), `on-demand` or `reserved`.
    #[serde(default)]
    #[schema(pattern = r"^(preemptible|on-demand|ondemand|on_demand|reserved)$")]
    pub tier: Option<String>,
    /// Whole GPUs (default 1). More than one node's worth is a gang.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 4096)]
    pub gpus: Option<u32>,
    /// GPU model; any model when absent (reserved jobs: their reservation's).
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Program and arguments, run directly (never through a shell).
    #[schema(schema_with = argv_schema)]
    pub argv: Vec<String>,
    #[serde(default)]
    #[schema(schema_with = env_schema)]
    pub env: BTreeMap<String, String>,
    /// Working directory on the node; a fresh per-job directory by default.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Signal sent at drain notice, like Slurm's `--signal` (default `TERM`):
    /// a name, with or without `SIG`, or a number from 1 to 64.
    #[serde(default)]
    #[schema(
        pattern = r"^(([Ss][Ii][Gg])?([Hh][Uu][Pp]|[Ii][Nn][Tt]|[Qq][Uu][Ii][Tt]|[Kk][Ii][Ll][Ll]|[Uu][Ss][Rr][12]|[Tt][Ee][Rr][Mm]|[Cc][Oo][Nn][Tt]|[Ss][Tt][Oo][Pp]|[Tt][Ss][Tt][Pp]|[Ww][Ii][Nn][Cc][Hh])|\+?0*([1-9]|[1-5][0-9]|6[0-4]))$"
    )]
    pub signal: Option<String>,
    /// Give up after this many preemptions (default: never).
    #[serde(default)]
    pub max_preemptions: Option<u32>,
    /// Retries after failures (default 0). Preemption is not a failure.
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Treat exit code 0 during a drain as success even without the SDK's
    /// completion marker.
    #[serde(default)]
    pub exit_on_drain_is_success: bool,
    /// `A-B` (A <= B, at most 10000 tasks) or one index `N`: one task per
    /// index, each its own job with `EBB_TASK_INDEX`.
    #[serde(default)]
    #[schema(pattern = r"^0*[0-9]{1,19}(-0*[0-9]{1,19})?$")]
    pub array: Option<String>,
    /// `never` (default) or `always`: run again after every exit but a
    /// cancel, as a service does; such restarts are not failures.
    #[serde(default)]
    #[schema(pattern = r"^(never|always)$")]
    pub restart: Option<String>,
    /// A parameter grid: one task per combination, in order (the last
    /// parameter varies fastest), each with its values in the environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<SweepParam>,
    /// When a preemptible job must be done (RFC 3339, after now): it runs
    /// preemptible while its reported progress says the rest fits before
    /// then with a margin, and on-demand (billed at that rate from then
    /// on) once it would not. Only for preemptible jobs.
    #[serde(default)]
    #[schema(
        pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$"
    )]
    pub deadline: Option<String>,
    /// An OCI image to run the job in: `HOST[:PORT]/NAME:TAG` or
    /// `HOST[:PORT]/NAME@sha256:DIGEST`. The server resolves a tag to its
    /// digest now; every attempt runs that digest. `argv` runs inside it.
    #[serde(default)]
    #[schema(max_length = 512, pattern = r"^[^\s\u0000]+$")]
    pub image: Option<String>,
    /// The digest the server resolved `image` to (set by the server, never
    /// read from a request).
    #[serde(skip)]
    pub image_digest: Option<String>,
}

/// One parameter of a sweep: `--sweep lr=1e-3,3e-4`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepParam {
    /// Letters, digits and `_`, not starting with a digit.
    #[schema(max_length = 64, pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")]
    pub name: String,
    #[schema(schema_with = sweep_values_schema)]
    pub values: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The job, or an array's first task.
    pub id: u64,
    /// Every task of an array, in index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<u64>,
}

/// `POST /v1/jobs/batch`: several submissions in one request and one
/// transaction, all accepted or none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobBatch {
    /// At most 10,000 jobs in all (arrays' tasks counted), in 2 MiB.
    pub jobs: Vec<JobSubmission>,
}

/// What a batch made: each submission's ids, in the batch's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchSubmitted {
    pub jobs: Vec<Submitted>,
}

/// A job as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: u64,
    pub tenant: String,
    pub name: Option<String>,
    pub tier: String,
    pub gpus: u32,
    pub gpu_model: Option<String>,
    pub argv: Vec<String>,
    /// queued, starting, running, draining, succeeded, failed, cancelled.
    pub state: String,
    /// The latest attempt (0 before the first start).
    pub attempt: u32,
    pub preemptions: u32,
    pub retries: u32,
    pub submitted_at: String,
    /// Node and GPU indices of the live attempt.
    #[serde(default)]
    pub placement: Vec<NodeGpus>,
    pub exit_code: Option<i32>,
    /// The latest checkpoint any attempt reported.
    #[serde(default)]
    pub last_checkpoint: Option<Checkpoint>,
    /// The periodic checkpoint interval recommended to the latest attempt
    /// (`EBB_CHECKPOINT_INTERVAL_S`), and why.
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    #[serde(default)]
    pub checkpoint_interval_why: Option<String>,
    /// GPU-seconds of work lost to preemptions and lost nodes: from each
    /// ended attempt's last checkpoint (or its start) to its exit.
    #[serde(default)]
    pub lost_gpu_seconds: f64,
    /// The array (or sweep) this job is a task of.
    #[serde(default)]
    pub array: Option<ArrayTask>,
    /// The whole array's progress (only in `GET /v1/jobs/{id}` of a task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ArrayProgress>,
    /// What each ended attempt was metered and charged (only in
    /// `GET /v1/jobs/{id}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<Usage>,
    /// Why a queued job waits, as a stable code (`PendingReason`). Absent
    /// unless the job is queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<PendingReason>,
    /// The reason as a sentence, with the numbers (which jobs, until when).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_detail: Option<String>,
    /// Its working directory on the node; absent: a fresh directory per job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The environment it was submitted with: the submitter's exported
    /// variables and its own (only in `GET /v1/jobs/{id}`, which only its
    /// tenant and an operator may read).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The event history, oldest first (only in `GET /v1/jobs/{id}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<JobEvent>,
    /// The job's latest fire drill (`POST /v1/jobs/{id}/drill`), as it
    /// stands (only in `GET /v1/jobs/{id}` and the drill's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<Drill>,
    /// Where a job with a deadline stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DeadlineStatus>,
    /// The image it runs in: as submitted, and the digest every attempt runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<JobImage>,
    /// The live attempt's image pull, while its node pulls it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulling: Option<PullProgress>,
}

/// `PUT /v1/tenants/{name}/registry-logins/{registry}`: what the tenant's
/// pulls from `registry` (`HOST[:PORT]`) log in with. Kept by the server
/// and sent to a node only with a start of that tenant's image; never
/// shown again.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryLogin {
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f:]+$")]
    pub username: String,
    #[schema(min_length = 1, max_length = 4096, pattern = r"^[^\u0000]+$")]
    pub password: String,
}

impl std::fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryLogin({}, <password>)", self.username)
    }
}

/// A registry a tenant has a login for: the host and the user name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegistryLoginInfo {
    pub registry: String,
    pub username: String,
}

/// A job's image: `reference` as submitted, `digest` resolved at submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobImage {
    pub reference: String,
    pub digest: String,
}

/// How far a node has come pulling an attempt's image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullProgress {
    pub node: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// A deadline job's standing: `state` is `no_progress` (nothing reported
/// yet), `on_track`, `promoted` (moved to on-demand: `promoted_at`,
/// `promoted_why`), `met` or `missed`; `summary` says it for people.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeadlineStatus {
    pub deadline: String,
    pub deadline_ms: u64,
    pub state: String,
    pub summary: String,
    /// The latest fraction done the job reported (0 to 1).
    pub fraction_done: Option<f64>,
    /// Run time the estimate says the rest needs, seconds.
    pub needed_seconds: Option<u64>,
    /// Seconds from now to the deadline (0 once it has passed).
    pub left_seconds: u64,
    pub promoted_at: Option<String>,
    pub promoted_why: Option<String>,
}

/// A fire drill of the drain: a running preemptible job was given a real
/// drain notice with the cluster's drain window, then requeued at once;
/// this is what it did, and whether its next attempt resumed from what it
/// saved. Times are RFC 3339 and milliseconds since the epoch; durations
/// in seconds from the notice. Fields stay absent until what they tell
/// has happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Drill {
    /// The attempt given the notice, and the nodes it ran on.
    pub attempt: u32,
    pub nodes: Vec<String>,
    pub notice_at: String,
    pub notice_at_ms: u64,
    /// SIGKILL: the notice plus the cluster's drain window.
    pub deadline: String,
    pub deadline_ms: u64,
    pub window_seconds: f64,
    /// What the next attempt should resume from: the newest checkpoint
    /// reported up to the drilled attempt's exit, by any attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<DrillCheckpoint>,
    /// When the drilled attempt's last process exited, and how: `exited
    /// with code 0`, `killed at the deadline`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_after_notice_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
    /// The exit came before the deadline, without SIGKILL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit_window: Option<bool>,
    /// Seconds from the exit to the deadline (negative past it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_seconds: Option<f64>,
    /// Seconds of work the drilled attempt had done since its last
    /// checkpoint (or its start) when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_seconds: Option<f64>,
    /// The drilled attempt was requeued (it exited without finishing).
    #[serde(default)]
    pub requeued: bool,
    /// The attempt after it: its number, first node, and when it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_started_ms: Option<u64>,
    /// The next attempt reported resuming (`POST /ebb/v1/resumed` on its
    /// endpoint): when, and from which step, if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_step: Option<u64>,
    /// `ready`, or `failed` with the `failures`; absent while the drill
    /// goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// What failed, each beginning with what it is: `no checkpoint`,
    /// `exceeded the window`, `did not resume`, `lost 12s`, `not
    /// requeued`; then, after a colon, the particulars.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concluded_at: Option<String>,
}

/// The checkpoint a drill expects the next attempt to resume from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DrillCheckpoint {
    pub at: String,
    pub at_ms: u64,
    /// The attempt that reported it.
    pub attempt: u32,
    pub step: Option<u64>,
    /// Seconds from the notice to the report (negative: before the notice).
    pub after_notice_seconds: f64,
}

/// One page of `GET /v1/jobs`, in id order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<u64>,
}

/// A checkpoint as the job reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Checkpoint {
    pub at: String,
    pub at_ms: u64,
    pub attempt: u32,
    pub step: Option<u64>,
    pub bytes: Option<u64>,
    /// How long taking it took.
    pub seconds: f64,
}

/// Which array a task belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArrayTask {
    /// The array's id: its first task's job id.
    pub id: u64,
    /// `EBB_TASK_INDEX` of this task.
    pub index: u64,
    pub tasks: u64,
    /// A sweep task's parameters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

/// How far an array has got: finished tasks over all, and each task's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArrayProgress {
    pub done: u64,
    pub total: u64,
    /// Tasks by state.
    pub states: BTreeMap<String, u64>,
    /// Each task (absent in a listing's collapsed array).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskState>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskState {
    pub id: u64,
    pub index: u64,
    pub state: String,
    pub attempt: u32,
    pub preemptions: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeGpus {
    pub node: String,
    pub gpus: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub name: String,
    pub gpu_model: String,
    pub gpus: u8,
    /// up, draining (cordoned), unhealthy (takes no new work: its agent
    /// cannot deliver its reports), lost.
    pub status: String,
    /// Why the node is unhealthy, as its agent says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
    pub gpus_used: u32,
    pub gpus_held: u32,
    /// Which GPUs are held, and for which waiting job: a reserved or
    /// on-demand job that starts on them once their preemptible jobs have
    /// drained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldGpus>,
    pub last_heartbeat: String,
    pub jobs: Vec<u64>,
}

/// GPUs of one node held for a waiting job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HeldGpus {
    pub job: u64,
    pub gpus: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReclaimRequest {
    #[schema(minimum = 1)]
    pub gpus: u32,
    /// Which model's preemptible capacity (default: the only model).
    #[serde(default)]
    pub gpu_model: Option<String>,
}

/// `POST /v1/jobs/{id}/cancel`: how a running job is stopped. The body
/// may be empty or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Milliseconds between the notice and SIGTERM and the SIGKILL of
    /// whatever is left: 10000 by default (or the drain window, if it is
    /// shorter), at most the cluster's drain window (a larger one is a
    /// 422). A second cancel may shorten it, never lengthen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
}

/// `POST /v1/reclaim/release`: lift a reclaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReclaimRelease {
    /// Which model's reclaim (default: the only model).
    #[serde(default)]
    pub gpu_model: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReclaimReleased {
    pub gpu_model: String,
    /// The limit that was lifted; none if there was no reclaim.
    pub released_limit: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReclaimReply {
    pub gpu_model: String,
    /// Preemptible work of that model may now hold at most this many GPUs.
    pub preemptible_limit: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantRequest {
    /// 1 to 64 letters, digits, `-` or `_`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantCreated {
    pub tenant: String,
    /// Shown once; only its hash is stored.
    pub token: String,
}

/// An operator's limits for one tenant; an absent one is the server's
/// default (`ebb server --max-jobs-per-tenant`, ...).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantLimits {
    /// Unfinished jobs (queued, waiting or running).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_jobs: Option<u64>,
    /// Jobs admitted to the scheduler at once; the rest wait their turn.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_running_jobs: Option<u64>,
    /// Bytes the unfinished jobs' arguments and environments may take.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_stored_bytes: Option<u64>,
}

/// A tenant's limits in force and what it holds against them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    pub tenant: String,
    pub max_jobs: u64,
    pub max_running_jobs: u64,
    pub max_stored_bytes: u64,
    /// Unfinished jobs, and of them those admitted and those waiting.
    pub jobs: u64,
    pub admitted: u64,
    pub waiting: u64,
    pub stored_bytes: u64,
}

/// `GET /v1/tenants`: one tenant, by name, with what it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantSummary {
    pub tenant: String,
    /// Its tokens that work now (0 once revoked).
    pub tokens: u32,
    /// Unfinished jobs, and of them those admitted and those waiting.
    pub jobs: u64,
    pub admitted: u64,
    pub waiting: u64,
    /// Its reservations in force or to come.
    pub reservations: u32,
}

/// `DELETE /v1/nodes/{name}`: the node's credential is revoked and its
/// live attempts requeued as lost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeRemoved {
    pub node: String,
    /// Jobs whose attempts on the node were requeued.
    pub requeued: Vec<u64>,
    /// Whether the node had a credential to revoke.
    pub credential_revoked: bool,
}

/// `POST /v1/agent/join-token`: the new join token (shown once; also
/// written to the server's `join.token`). The old one is refused from now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JoinToken {
    pub token: String,
    /// Where the server wrote it (mode 0600).
    pub path: String,
    /// Join tokens revoked by this rotation.
    pub revoked: u32,
}

/// `POST` (rotate) or `DELETE` (revoke) `/v1/tenants/{name}/tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantTokens {
    pub tenant: String,
    /// The tenant's new token after a rotation (shown once); none after a
    /// revocation.
    pub token: Option<String>,
    /// The tenant's tokens revoked.
    pub revoked: u32,
}

/// A chunk of a job's output. `next_offset` continues from here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogChunk {
    pub offset: u64,
    pub next_offset: u64,
    pub data: String,
    /// The job has ended: no more output will come.
    pub finished: bool,
    /// With `label`: where in the log each piece of `data` a gang's node
    /// wrote starts, and which node (a gang's pieces are whole lines of
    /// one node's), by offset. Empty for a job on one node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<LogSource>,
}

/// Where a gang's node's output starts in its log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogSource {
    pub offset: u64,
    pub node: String,
}

/// Every error body: one message that names what was wrong.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

// ---- agent protocol ------------------------------------------------------

/// An attempt of a job: what the agent and the server fence on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub struct AttemptRef {
    pub job: u64,
    pub attempt: u32,
}

/// `POST /v1/agent/register`: a node joins, or rejoins after a restart or
/// a partition, saying what it is running.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Register {
    /// The node's name: 1 to 253 bytes, no control characters, no `/`.
    #[schema(min_length = 1, max_length = 253, pattern = r"^[^\u0000-\u001f\u007f/]+$")]
    pub node: String,
    /// 1 to 64 bytes, no control characters.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[^\u0000-\u001f\u007f]+$")]
    pub gpu_model: String,
    #[schema(minimum = 1, maximum = 64)]
    pub gpus: u8,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub running: Vec<AttemptRef>,
    /// Where other nodes reach this one (a gang's `MASTER_ADDR`).
    #[serde(default)]
    pub address: Option<String>,
    /// Events the server has not accepted yet (starts, checkpoints, exits;
    /// not output), in order: a restarted server accounts them as they
    /// happened rather than treating the attempts as lost.
    #[serde(default)]
    pub unreported: Vec<AgentEvent>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Registered {
    pub heartbeat_interval_ms: u64,
    /// Attempts the agent runs that the server no longer holds as running:
    /// kill them.
    pub kill: Vec<AttemptRef>,
    /// Where the command stream continues from.
    pub next_seq: u64,
    /// The server's life: polls name it, and a restarted server (new epoch)
    /// tells the agent to register again.
    pub epoch: u64,
    /// The node's own credential, issued when it registers with the join
    /// token and shown only then: the agent keeps it and sends it on every
    /// later call. Absent when the agent registered with its credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Where jobs' checkpoints are kept between attempts (`ebb server
    /// --checkpoint-store`); absent: in each node's checkpoint root, which
    /// the operator shares between nodes. Credentials are never sent: each
    /// agent has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_store: Option<CheckpointStoreLocation>,
}

/// Where a checkpoint store is: a URL (`s3://BUCKET/PREFIX` or
/// `file:///PATH`) and, for S3, the service's endpoint and region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointStoreLocation {
    #[schema(max_length = 1024)]
    pub url: String,
    /// An S3-compatible service's URL; absent: AWS's own for the region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 64)]
    pub region: Option<String>,
}

/// What the server asks of an agent, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Command {
    pub seq: u64,
    pub action: Action,
}

// A start is most of what a node is sent; a command stream holds a few
// at a time, so boxing it would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Action {
    Start(StartAttempt),
    Drain(DrainAttempt),
    /// Stop now (cancelled, or the rest of a gang): SIGTERM, then SIGKILL
    /// after `grace_ms`. A cancel carries its notice: the agent posts it
    /// and writes the notice file before the signal, and kills at its
    /// deadline.
    Stop {
        attempt: AttemptRef,
        grace_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<StopNotice>,
    },
}

/// A cancel's notice, as a drain's (`action` `cancel`, `reason` `cancel`
/// in the notice file): when it was given and when SIGKILL comes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StopNotice {
    pub notice_at_ms: u64,
    pub deadline_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StartAttempt {
    pub attempt: AttemptRef,
    pub tier: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// GPU indices on this node.
    pub gpus: Vec<u8>,
    /// Signal number sent at drain notice.
    pub signal: i32,
    /// The Unix user the attempt runs as, where the operator mapped its
    /// tenant to one (`ebb server --run-as`); a root agent never runs a
    /// job as root unless told to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
    /// The job's tenant: its checkpoint directory lives under the tenant's.
    #[serde(default)]
    pub tenant: String,
    /// On a gang's first node: the rendezvous port (`MASTER_PORT`) its
    /// processes will listen on. The agent checks it is free before the
    /// start, and reports an exit with `port_in_use` if it is not: the
    /// server requeues the gang with another port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_port: Option<u16>,
    /// The tenant's number. A root agent runs a job without `run_as` as a
    /// uid of the tenant's own: its `--tenant-uids` range's first plus this
    /// number, the same on every node.
    #[serde(default)]
    pub tenant_id: u32,
    /// The image to run it in, where the job names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<StartImage>,
}

/// An attempt's image: the reference (for its registry and name), the
/// digest to run, the tenant's login for that registry if it gave one,
/// and whether the operator lets the tenant be root inside.
#[derive(Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StartImage {
    #[schema(max_length = 512)]
    pub reference: String,
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default)]
    pub root: bool,
}

impl std::fmt::Debug for StartImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password: commands are logged.
        f.debug_struct("StartImage")
            .field("reference", &self.reference)
            .field("digest", &self.digest)
            .field("username", &self.username)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DrainAttempt {
    pub attempt: AttemptRef,
    pub notice_at_ms: u64,
    pub deadline_ms: u64,
    pub reason: String,
}

/// `GET /v1/agent/commands?node=N&epoch=E&after=SEQ[&failing=WHY]`:
/// commands after `after`, waiting up to a heartbeat interval for one to
/// appear. The poll is the agent's heartbeat; `failing` says its reports
/// have not got through for a while (and why): the node is shown
/// unhealthy and takes no new work until a poll comes without it or a
/// report gets through.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Commands {
    pub commands: Vec<Command>,
    pub next_seq: u64,
}

/// `POST /v1/agent/report`: what happened on the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Report {
    pub node: String,
    pub events: Vec<AgentEvent>,
    /// Which report this is, so that one sent again (its reply was lost)
    /// is applied once. Reports without it are applied as they come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<ReportId>,
}

/// A report's identity: the agent's session (random, new each time the
/// agent starts) and the report's number in it, from 1, each new report
/// numbered above the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReportId {
    pub session: u64,
    pub seq: u64,
}

/// The longest `start_error` an exit carries, in characters.
pub const MAX_START_ERROR_CHARS: usize = 4096;

/// What an agent tells the server about its attempts. Every `at_ms` is
/// the agent's clock, milliseconds since the Unix epoch, at most the last
/// millisecond of the year 9999; one later than the server's clock plus
/// its allowed skew refuses the whole request (422).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    Started {
        attempt: AttemptRef,
        pid: u32,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    Exited {
        attempt: AttemptRef,
        code: Option<i32>,
        signal: Option<i32>,
        /// The SDK's completion marker was present at exit.
        completed: bool,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
        /// The most memory the attempt's processes held together, where a
        /// cgroup accounts it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_memory_bytes: Option<u64>,
        /// The attempt never ran: why its start failed (`cannot start
        /// "x": No such file or directory`), for its timeline. Exit code
        /// 127, as a shell gives a command it cannot run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(max_length = 4096)]
        start_error: Option<String>,
        /// It never ran because the gang's rendezvous port was taken on
        /// this node by another program: the gang is requeued, not failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port_in_use: Option<u16>,
        // MAX_START_ERROR_CHARS, as the schema needs a literal.
    },
    /// The attempt reported a completed checkpoint to its endpoint.
    Checkpoint {
        attempt: AttemptRef,
        step: Option<u64>,
        bytes: Option<u64>,
        /// How long the checkpoint took.
        duration_ms: u64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// The attempt reported resuming from a checkpoint to its endpoint
    /// (`step`: the checkpoint's, if it said).
    Resumed {
        attempt: AttemptRef,
        step: Option<u64>,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// Before the attempt started, the agent restored the job's latest
    /// checkpoint from the cluster's checkpoint store into its checkpoint
    /// directory: the upload `upload` of attempt `from_attempt`, made
    /// after a checkpoint report of `step` (none: at that attempt's exit).
    Restored {
        attempt: AttemptRef,
        from_attempt: u32,
        upload: u32,
        step: Option<u64>,
        files: u64,
        bytes: u64,
        /// How long the restore took.
        duration_ms: u64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// The attempt reported how much of the job is done, a fraction from
    /// 0 to 1 (`POST /ebb/v1/progress`): deadlines are judged by it.
    Progress {
        attempt: AttemptRef,
        #[schema(minimum = 0.0, maximum = 1.0)]
        fraction: f64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// Output of the attempt, appended in order.
    Output { attempt: AttemptRef, data: String },
    /// The agent is pulling the attempt's image: `done_bytes` of
    /// `total_bytes` of its layers (the first report of a pull has
    /// `done_bytes` 0).
    Pulling {
        attempt: AttemptRef,
        done_bytes: u64,
        total_bytes: u64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// The attempt's image is on the node, `downloaded_bytes` of it pulled
    /// now (0: it was in the cache), after `duration_ms`.
    Pulled {
        attempt: AttemptRef,
        downloaded_bytes: u64,
        duration_ms: u64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportReply {
    /// Attempts the report spoke of that are stale: kill them.
    pub stale: Vec<AttemptRef>,
}

// ---- money ------------------------------------------------------------------
//
// Amounts are integers: micro-dollars (`*_micro_usd`, 1 USD = 1,000,000).
// The `*_usd` strings beside them are the same amounts for people.

/// One GPU model's prices, per GPU-hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Price {
    pub gpu_model: String,
    pub on_demand_micro_usd: i64,
    /// Always the on-demand price less the book's fixed discount.
    pub preemptible_micro_usd: i64,
    /// The contract rate a new reservation of this model gets by default.
    pub reserved_micro_usd: i64,
    pub on_demand_usd: String,
    pub preemptible_usd: String,
    pub reserved_usd: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PriceBook {
    /// The preemptible discount off on-demand, percent (fixed; never a bid).
    pub preemptible_discount_percent: f64,
    pub prices: Vec<Price>,
}

/// `PUT /v1/prices/{model}`: dollar amounts as decimal strings, e.g. `"2.50"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceUpdate {
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub on_demand_usd: String,
    #[serde(default)]
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub reserved_usd: Option<String>,
}

/// `POST /v1/reservations`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationRequest {
    pub tenant: String,
    pub gpu_model: String,
    #[schema(minimum = 1)]
    pub gpus: u32,
    /// RFC 3339 or a date (`2026-12-01`, midnight UTC).
    #[schema(
        pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$"
    )]
    pub start: String,
    #[schema(
        pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$"
    )]
    pub end: String,
    /// Contract rate per GPU-hour, dollars (default: the price book's).
    #[serde(default)]
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub rate_usd: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    pub id: u64,
    pub tenant: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub start: String,
    pub end: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub rate_micro_usd: i64,
    pub rate_usd: String,
    /// Active now (between its start and end).
    #[serde(default)]
    pub active: bool,
    /// GPUs its tenant's reserved jobs use now (a tenant's reservations of
    /// one model are drawn on in id order).
    #[serde(default)]
    pub in_use: u32,
    /// Of the GPUs it leaves idle, how many preemptible jobs use now: lent,
    /// and taken back with the drain window when its tenant needs them.
    /// Reserved capacity is a count, not fixed GPUs, so a model's
    /// preemptible GPUs beyond what the unreserved capacity leaves them
    /// are the lent ones, drawn on in reservation id order.
    #[serde(default)]
    pub lent: u32,
    /// Who borrows them: the preemptible jobs that started last on the
    /// model, until their GPUs make up `lent`. Only jobs the caller may
    /// see are named; a tenant sees how many of its GPUs are lent, not to
    /// whom.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub borrowers: Vec<Borrower>,
}

/// A preemptible job using GPUs a reservation leaves idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Borrower {
    pub job: u64,
    pub tenant: String,
    /// Of the reservation's idle GPUs, how many this job accounts for.
    pub gpus: u32,
}

/// What one attempt ran and cost: metered per second, from its process
/// start to its exit, at the rate its tier had when it started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub job: u64,
    pub attempt: u32,
    pub tenant: String,
    pub tier: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub started_at: String,
    pub ended_at: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// Whole seconds, a started second counting as one.
    pub seconds: u64,
    pub gpu_seconds: u64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub amount_usd: String,
    /// GPU-seconds after the drain notice, and of work lost (since the
    /// last checkpoint) when the attempt was preempted or lost.
    pub drain_gpu_seconds: u64,
    pub lost_gpu_seconds: u64,
    /// completed, failed, cancelled, preempted, lost, or drill (an attempt
    /// ended by a fire drill: run time, neither preempted nor failed).
    pub outcome: String,
    /// An attempt of a deadline job promoted while it ran: its parts at
    /// each rate (preemptible, then on-demand), which add up to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<UsageSegment>,
}

/// Part of an attempt's usage at one tier's rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSegment {
    pub tier: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub seconds: u64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
}

/// One invoice line: a tier and GPU model at one rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InvoiceLine {
    pub tier: String,
    pub gpu_model: String,
    pub gpu_seconds: u64,
    pub gpu_hours: f64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub rate_usd: String,
    pub amount_usd: String,
}

/// A reservation's charge for the part of its committed period inside the
/// invoice's, used or not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReservationCharge {
    pub reservation: u64,
    pub gpu_model: String,
    pub gpus: u32,
    pub from: String,
    pub to: String,
    pub gpu_seconds: u64,
    pub gpu_hours: f64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub amount_usd: String,
}

/// `GET /v1/bill`: a tenant's invoice for a period. An attempt belongs to
/// the period in which it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Invoice {
    pub tenant: String,
    pub from: String,
    pub to: String,
    pub lines: Vec<InvoiceLine>,
    pub reservations: Vec<ReservationCharge>,
    pub total_micro_usd: i64,
    pub total_usd: String,
    /// The same usage at on-demand prices (reserved usage included), plus
    /// nothing for reservations: what the work would have cost without them.
    pub on_demand_equivalent_micro_usd: i64,
    pub on_demand_equivalent_usd: String,
    /// What running preemptible instead of on-demand saved.
    pub preemptible_savings_micro_usd: i64,
    pub preemptible_savings_usd: String,
    pub attempts: u64,
    /// Attempts that ended preempted.
    pub preemptions: u64,
    /// Of those, attempts of jobs that had been preempted before.
    #[serde(default)]
    pub repeat_preemptions: u64,
    /// Of those, the ones whose notice came less than the server's
    /// `--min-runtime` after the job resumed: taken again so soon only
    /// because no other victim would do (or by an operator's drain or
    /// reclaim).
    #[serde(default)]
    pub preemptions_within_min_runtime: u64,
    pub drain_gpu_hours: f64,
    pub lost_gpu_hours: f64,
}

/// Per tier in the operator's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TierReport {
    pub tier: String,
    pub gpu_hours: f64,
    /// Share of the capacity's GPU-hours.
    pub utilisation: f64,
    pub revenue_micro_usd: i64,
    pub revenue_usd: String,
}

/// `GET /v1/report`: the cluster's use and revenue over a period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OperatorReport {
    pub from: String,
    pub to: String,
    /// GPU-hours of the nodes that had joined, over the period.
    pub capacity_gpu_hours: f64,
    pub used_gpu_hours: f64,
    pub idle_gpu_hours: f64,
    pub utilisation: f64,
    /// Utilisation without the preemptible tier: what the cluster would
    /// have sold without it.
    pub utilisation_without_preemptible: f64,
    pub tiers: Vec<TierReport>,
    /// Reservation charges (committed capacity, used or not).
    pub reservation_revenue_micro_usd: i64,
    pub reservation_revenue_usd: String,
    pub total_revenue_micro_usd: i64,
    pub total_revenue_usd: String,
    /// Preemptible work runs only on GPUs no reserved or on-demand job is
    /// using: all of it is otherwise idle capacity, sold.
    pub idle_capacity_sold_gpu_hours: f64,
    pub idle_capacity_sold_micro_usd: i64,
    pub idle_capacity_sold_usd: String,
}

/// One bucket of `GET /v1/report/series`: the report's figures for
/// `[start, end)` alone. GPU-hours are clipped to the bucket; an attempt's
/// revenue counts in the bucket in which it ended, as in the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportBucket {
    pub start: String,
    pub start_ms: u64,
    /// The next bucket's start; the period's end for the last bucket.
    pub end: String,
    pub end_ms: u64,
    pub capacity_gpu_hours: f64,
    pub used_gpu_hours: f64,
    pub utilisation: f64,
    /// Every tier, in the report's order, each with its share of this
    /// bucket's capacity.
    pub tiers: Vec<TierReport>,
    /// Reservation charges for the bucket's committed time. The buckets'
    /// charges add up to the period's exactly: each bucket's is rounded so
    /// that the running total is the period's so far, rounded down.
    pub reservation_revenue_micro_usd: i64,
    pub reservation_revenue_usd: String,
    pub total_revenue_micro_usd: i64,
    pub total_revenue_usd: String,
}

/// `GET /v1/report/series`: the operator's report over a period, bucket by
/// bucket. The buckets' GPU-hours add up to the report's for the same
/// period (to floating-point rounding), their revenue to the micro-dollar.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportSeries {
    pub from: String,
    pub to: String,
    pub from_ms: u64,
    pub to_ms: u64,
    /// The buckets' length, for people (`1h`).
    pub step: String,
    pub step_ms: u64,
    /// `[from, from + step)`, `[from + step, from + 2 step)` and so on, the
    /// last one ending at `to`.
    pub buckets: Vec<ReportBucket>,
}
