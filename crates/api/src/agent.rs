//! The protocol between the server and its agents: register, the command
//! stream a node polls, and the reports of what its attempts did.

use super::*;

/// An attempt of a job: what the agent and the server fence on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub struct AttemptRef {
    #[schema(value_type = u64)]
    pub job: ebb_core::JobId,
    #[schema(value_type = u32)]
    pub attempt: ebb_core::Attempt,
}

/// `POST /v1/agent/register`: a node joins, or rejoins after a restart or
/// a partition, saying what it is running.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Register {
    /// The node's name: 1 to 253 characters, no control characters, no `/`.
    #[schema(min_length = 1, max_length = 253, pattern = r"^[^\u0000-\u001f\u007f/]+$")]
    pub node: String,
    /// 1 to 64 characters, no control characters.
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
    /// The agent holds a start back until its GPUs are free when the
    /// start says so ([`StartAttempt::when_gpus_free`]): the server sends
    /// such starts only to agents that say they can.
    #[serde(default)]
    pub starts_when_free: bool,
    /// The node's CPUs and memory (MiB), as Slurm's `sinfo %c %m` and
    /// `scontrol show node` give them to the tools that read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1048576)]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1099511627776_u64)]
    pub memory_mib: Option<u64>,
    /// Starts the agent holds back until their GPUs are free, not yet
    /// running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<AttemptRef>,
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
    /// An elastic job's nodes change: told to the nodes that stay, which
    /// go on running (no signal).
    Members(Membership),
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
    /// A signal the job's owner sent (`scancel --signal`): to a Slurm
    /// job's steps' tasks or, with `batch_only`, its batch shell; to every
    /// process of any other job.
    Signal {
        attempt: AttemptRef,
        signal: i32,
        #[serde(default)]
        batch_only: bool,
        /// Steps, batch shell and its children (`scancel --full`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        full: bool,
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
    /// The job's time limit on this attempt's run (`time_limit_s`): the
    /// agent ends an attempt that outruns it and says so in its exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// A Slurm batch job: the agent runs its script through Ebb's batch
    /// step (`argv` is the script's command line) and puts the Slurm
    /// commands on its `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<crate::SlurmBatch>,
    /// A start sent while its GPUs are still held by attempts draining
    /// for it: the agent prepares it at once and starts its process the
    /// moment no other attempt on this node holds any of `gpus` (their
    /// exits reported first), without asking the server again. A stop
    /// for it before then withdraws it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub when_gpus_free: bool,
}

/// An agent's request for an image a running attempt's step names (Pyxis'
/// `srun --container-image`): the server pins it as at submit, with the
/// tenant's login and the operator's registries, once per attempt, so
/// that every node of the step runs the same digest. The answer is a
/// [`StartImage`] whose `root` is always false: a step's container is
/// the job's user's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepImage {
    pub node: String,
    pub attempt: AttemptRef,
    #[schema(max_length = 512)]
    pub reference: String,
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

/// A change of an elastic job's nodes, as the nodes that stay are told
/// it: on a shrink before the leaving nodes' deadline, so that the job
/// saves once for all of them while every rank is still there; on a grow
/// as the new nodes start, so that it knows its ranks re-form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Membership {
    pub attempt: AttemptRef,
    pub change: MembershipChange,
    /// When the change was decided: a later one replaces it.
    pub at_ms: u64,
    /// A shrink's: when the leaving nodes are killed if still running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The attempt's nodes once the change is done, its first node first.
    pub nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<String>,
    /// The GPUs it holds once the change is done.
    pub gpus: u32,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MembershipChange {
    Shrink,
    Grow,
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
        /// What ended it besides its own exit, where the agent did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ended_by: Option<EndedBy>,
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
    /// What the node's health readings find wrong now, all of them: sent
    /// when that changes and with every registration. A finding absent
    /// from the next report has cleared. At most `MAX_HEALTH_FINDINGS`.
    Health {
        #[schema(max_items = 512)]
        findings: Vec<GpuFinding>,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
    /// The agent was told to stop (SIGTERM): the node drains, preemptible
    /// work with its window, and whatever still runs `stop_timeout_ms`
    /// after `at_ms` the agent ends itself (those exits say
    /// `ended_by: node_stopping`, and are requeued). The node takes work
    /// again when its agent registers anew. The timeout is the agent's
    /// own setting, taken whatever it is: what the server shows of it is
    /// clamped to the year 9999.
    Stopping {
        stop_timeout_ms: u64,
        #[schema(maximum = 253402300799999.0)]
        at_ms: u64,
    },
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

/// What ended an attempt besides its own exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The job asked to be requeued (`scontrol requeue` in it, or
    /// `POST /ebb/v1/requeue` at its endpoint): the attempt was ended and
    /// the job goes back to the queue, as a preemption does, not a failure.
    Requeue,
    /// It ran past its time limit and was ended.
    TimeLimit,
    /// Its node's agent was stopped (SIGTERM) and the attempt still ran
    /// at the agent's stop timeout: it was ended, and is requeued (not the
    /// job's failure).
    NodeStopping,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportReply {
    /// Attempts the report spoke of that are stale: kill them.
    pub stale: Vec<AttemptRef>,
}
