//! Jobs as users speak of them: a submission, what the server answers,
//! a job and its pages, arrays and sweeps, drills, checkpoints, output.

use super::*;

/// `POST /v1/jobs`: a job as the user describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    /// A name for people; need not be unique. One line.
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\n\u0000]*$")]
    pub name: Option<String>,
    /// `preemptible` (default; also `spot`), `on-demand` (also `ondemand`)
    /// or `reserved`, in any case.
    #[serde(default)]
    #[schema(pattern = r"^(preemptible|spot|on-demand|ondemand|on_demand|reserved)$")]
    pub tier: Option<String>,
    /// Whole GPUs (default 1). More than one node's worth is a gang.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 4096)]
    pub gpus: Option<u32>,
    /// An elastic job's most GPUs; `gpus` is then its fewest. It runs on
    /// any whole number of nodes between them: it starts on `gpus`, grows
    /// into what no queued job wants, and a preemption takes one of its
    /// nodes where it can rather than all of it. Only preemptible jobs over
    /// whole nodes (both counts multiples of the nodes' GPUs).
    #[serde(default)]
    #[schema(minimum = 2, maximum = 4096)]
    pub max_gpus: Option<u32>,
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
    /// The tenant's own order among its jobs of one tier: higher first
    /// (default 0). Never moves another tenant's jobs.
    #[serde(default)]
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: Option<i32>,
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
    /// A time limit on each attempt's run, in seconds, as Slurm's
    /// `--time`: an attempt still running when it is reached gets SIGTERM
    /// (and SIGKILL 30 s later) and the job fails with the reason `time
    /// limit`, unless it asked to be requeued first. A drain's window is
    /// not changed by it.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 31536000)]
    pub time_limit_s: Option<u64>,
    /// At most this many tasks of the array run at once (Slurm's
    /// `--array=A-B%N`); the others wait their turn in index order.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    pub array_limit: Option<u32>,
    /// Jobs this one waits for, as Slurm's `--dependency`: `afterok:ID`
    /// (each ID succeeded), `afterany:ID` (ended, however),
    /// `afternotok:ID` (failed or was cancelled), several IDs joined by
    /// `:` and conditions by `,` (all must hold); or `singleton` (no
    /// earlier job of the tenant with the same name is unfinished). A
    /// condition that can no longer hold fails the job, with the reason.
    #[serde(default)]
    #[schema(max_length = 4096, pattern = r"^[a-z0-9:,_]+$")]
    pub after: Option<String>,
    /// A Slurm batch job (`sbatch`): its script and what Slurm's options
    /// asked of it. The script is run on the job's first node by Ebb's
    /// batch step; `argv` is its command line (the script's path first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmBatch>,
}

/// The largest batch script `sbatch` takes, in bytes.
pub const MAX_SLURM_SCRIPT_BYTES: usize = 1024 * 1024;

/// What `sbatch` sends beside the job: the script as it was read at
/// submit (tools delete it right after), and the Slurm options the batch
/// step and the Slurm commands need.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmBatch {
    /// The batch script; its first line is `#!` and an interpreter. Absent
    /// from a job's view (the script is the tenant's; the view carries the
    /// options).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(min_length = 3, max_length = 1048576, pattern = r"^#![^\u0000]*$")]
    pub script: String,
    /// `--output`: where the script's standard output goes, with Slurm's
    /// `%` patterns (`%j`, `%A`, `%a`, `%x`, ...); relative to the job's
    /// working directory. Default `slurm-%j.out` (`slurm-%A_%a.out` in an
    /// array).
    #[serde(default)]
    #[schema(max_length = 4096, pattern = r"^[^\u0000]+$")]
    pub output: Option<String>,
    /// `--error`: standard error's file; the output's when absent.
    #[serde(default)]
    #[schema(max_length = 4096, pattern = r"^[^\u0000]+$")]
    pub error: Option<String>,
    /// `--open-mode=append`: append to the files instead of truncating
    /// them (a requeued attempt's output follows the last one's).
    #[serde(default)]
    pub append: bool,
    /// `--signal=B:...`: the drain signal goes to the batch shell only,
    /// not to the steps' tasks.
    #[serde(default)]
    pub signal_batch_only: bool,
    /// The job's `signal` is sbatch's `--signal`: the batch step routes it
    /// at a drain (to the batch shell with `B:`, else to the steps' tasks).
    /// Without it, a drain sends SIGTERM to every process, as Slurm's
    /// preemption does.
    #[serde(default)]
    pub routed_signal: bool,
    /// `--signal=SIG@SECS`: the signal comes this long before the time
    /// limit (60 s when absent).
    #[serde(default)]
    #[schema(maximum = 65535)]
    pub signal_before_s: Option<u32>,
    /// `--nodes`, `--ntasks`, `--ntasks-per-node`, `--cpus-per-task`:
    /// what `srun` in the script starts by default, and what the job's
    /// `SLURM_*` variables say.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 4096)]
    pub nodes: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub ntasks: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub ntasks_per_node: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub cpus_per_task: Option<u32>,
    /// `--partition`, `--qos`, `--account`: recorded and shown by
    /// `squeue` and `sacct` (the partition already chose the tier).
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\s\u0085\u0000]*$")]
    pub partition: Option<String>,
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\s\u0085\u0000]*$")]
    pub qos: Option<String>,
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\s\u0085\u0000]*$")]
    pub account: Option<String>,
    /// The directory `sbatch` ran in (`SLURM_SUBMIT_DIR`).
    #[serde(default)]
    #[schema(max_length = 4096, pattern = r"^[^\u0000]*$")]
    pub submit_dir: Option<String>,
    /// A heterogeneous job's components (`#SBATCH hetjob`, `sbatch A :
    /// B`), in order: one gang whose nodes they take in turn, whole nodes
    /// each. Empty for any other job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 16)]
    pub components: Vec<SlurmComponent>,
    /// `--exclusive` with no GPU count: the job takes every GPU of its
    /// `nodes`, whatever their size (`gpus` left out; the server fills it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_nodes: bool,
}

/// One component of a heterogeneous job: its nodes, GPUs a node, and what
/// `srun --het-group` starts there by default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmComponent {
    #[schema(minimum = 1, maximum = 4096)]
    pub nodes: u32,
    #[schema(minimum = 1, maximum = 64)]
    pub gpus_per_node: u32,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub ntasks: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub ntasks_per_node: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 65536)]
    pub cpus_per_task: Option<u32>,
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

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A job as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: u64,
    pub tenant: String,
    pub name: Option<String>,
    pub tier: String,
    /// Its GPUs; an elastic job's fewest.
    pub gpus: u32,
    /// An elastic job's most GPUs; what it runs on now is its placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    pub gpu_model: Option<String>,
    pub argv: Vec<String>,
    /// queued, starting, running, draining, succeeded, failed, cancelled.
    pub state: String,
    /// The latest attempt (0 before the first start).
    pub attempt: u32,
    pub preemptions: u32,
    pub retries: u32,
    pub submitted_at: String,
    /// The one run every attempt of the job is part of, for experiment
    /// trackers: each attempt's `EBB_RUN_ID` (and `WANDB_RUN_ID`, unless
    /// the submission set its own).
    #[serde(default)]
    pub run_id: String,
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
    /// Its time limit per attempt, seconds (`time_limit_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_s: Option<u64>,
    /// A Slurm batch job's options, as submitted, without its script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmBatch>,
    /// It failed because an attempt ran past its time limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Its place among its tenant's own jobs of its tier, as submitted
    /// (`priority`; absent: 0): higher first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// When its latest attempt started (placed, until its node says it
    /// started), and when a finished job's last process exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
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
    /// When the job's output was removed, as the server keeps a finished
    /// job's output for `ebb server --keep-output` (RFC 3339); absent while
    /// it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<String>,
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
