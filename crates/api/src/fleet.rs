//! The fleet and its tenants, as operators manage them: nodes and their
//! GPUs, reclaims, cancels, tenants, their limits, usage and tokens.

use super::*;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeGpus {
    pub node: String,
    pub gpus: Vec<u8>,
}

/// How `Node::drained_for` begins when the node drains because its agent
/// was told to stop (SIGTERM): that drain ends when the agent registers
/// again, unlike the operator's or a health finding's.
pub const DRAINED_FOR_AGENT_STOP: &str = "its agent is stopping (SIGTERM)";

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
    /// Which job is on which of its GPUs, in the same read as the rest of
    /// the node (the operator's; a tenant sees none): a view drawn from it
    /// never shows a GPU's job from before a change and its hold from
    /// after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<NodeJob>,
    /// Why it drains or was drained, when its health or its agent's stop
    /// drained it (absent when the operator did, or it is not drained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_for: Option<String>,
    /// Its GPUs out of service, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus_out: Vec<GpuOutOfService>,
    /// What its agent finds wrong that changes nothing (a GPU at its
    /// thermal limit, an application's Xid): shown, counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Where the other nodes and the login hosts reach it, its CPUs and
    /// its memory (MiB), as its agent said (absent: it did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

/// A GPU out of service: the scheduler places nothing on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuOutOfService {
    pub gpu: u8,
    /// What its agent found: "GPU 3: Xid 79 (fallen off the bus)".
    pub reason: String,
    pub since: String,
    /// It faulted twice in a day: it stays out until `ebb undrain NODE
    /// --gpu N`, whatever its agent finds later. Otherwise it returns by
    /// itself once its fault clears (a reset, a check that passes).
    pub until_returned: bool,
}

/// `GET /v1/capacity`: what the cluster has and what a job could get now,
/// per GPU model, for anyone with a token (`ebb capacity`; what `sinfo`
/// tells a Slurm user, and which tier would start a job at once). Counts
/// only: no other tenant's jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Capacity {
    pub models: Vec<ModelCapacity>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelCapacity {
    pub gpu_model: String,
    /// Nodes of this model that take work, and their GPUs.
    pub nodes: u32,
    pub gpus: u32,
    /// Nodes drained, unhealthy or lost, and their GPUs; and GPUs out of
    /// service for a fault on nodes that take work.
    pub nodes_out_of_service: u32,
    pub gpus_out_of_service: u32,
    /// Of `gpus_out_of_service`, those out for a fault on nodes that take
    /// work.
    #[serde(default)]
    pub gpus_faulted: u32,
    /// GPUs that take work and do nothing now: neither running an attempt
    /// nor held for a job waiting for its victims.
    pub idle: u32,
    /// The most idle GPUs on one node: the largest job that could start
    /// now on one node.
    pub idle_on_one_node: u32,
    /// GPUs running or held, by the tier of their job: reserved and
    /// on-demand GPUs running or held for a waiting job, preemptible GPUs
    /// running and not draining.
    pub in_use: TierGpus,
    /// GPUs in a drain window or held for a waiting job, not counted above.
    pub draining: u32,
    /// GPUs of every reservation in force: on-demand work may not use them,
    /// preemptible work borrows them while they are idle.
    pub reserved: u32,
    /// GPUs of the caller's own reservations in force (0 for an operator).
    pub reserved_for_you: u32,
    /// What one job of each tier could be given now, at most: preemptible
    /// the idle GPUs (within an operator's reclaim); on-demand those and
    /// the GPUs preemptible work runs on (it is drained for it), outside
    /// the reservations; reserved the caller's reservations' GPUs.
    pub available: TierGpus,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TierGpus {
    pub reserved: u32,
    pub on_demand: u32,
    pub preemptible: u32,
}

/// A job's GPUs on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeJob {
    pub job: u64,
    pub gpus: Vec<u8>,
    pub tier: String,
    /// starting, running or draining.
    pub state: String,
    /// A draining job's deadline: when what is left of it is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
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
    /// Its fair-share weight within each tier (default 1): a tenant of
    /// weight 2 is given twice the GPU time of one of weight 1 when both
    /// have work waiting.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000)]
    pub weight: Option<u32>,
    /// Its quotas per tier and GPU model (replacing any before).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub quotas: Option<Vec<TenantQuota>>,
}

/// A tenant's quota in one tier on one GPU model, as Kueue's cohorts: the
/// GPUs of the model in the tier are shared by every tenant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    /// `on-demand` or `preemptible` (reserved work has reservations).
    #[schema(pattern = r"^(preemptible|on-demand|ondemand|on_demand)$")]
    pub tier: String,
    pub gpu_model: String,
    /// GPUs it is owed: while it uses fewer and has work waiting, nobody
    /// borrows them, and borrowers give them back (drained in the
    /// preemptible tier, awaited in the on-demand tier).
    #[schema(maximum = 1000000)]
    pub nominal: u32,
    /// How far past `nominal` it may go while others leave GPUs idle;
    /// absent: no limit.
    #[serde(default)]
    #[schema(maximum = 1000000)]
    pub borrowing_limit: Option<u32>,
    /// How much of its unused quota others may borrow (at most
    /// `nominal`); absent: all of it.
    #[serde(default)]
    #[schema(maximum = 1000000)]
    pub lending_limit: Option<u32>,
}

/// A quota and what its tenant uses against it now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUsage {
    #[serde(flatten)]
    pub quota: TenantQuota,
    /// GPUs running (a preemptible job no longer once it drains) or held.
    pub used: u32,
}

/// A tenant's limits in force and what it holds against them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    pub tenant: String,
    /// Its fair-share weight.
    pub weight: u32,
    /// What the operator set for it (the rest are the server's defaults).
    pub own: TenantLimits,
    /// Its quotas, with what it uses against each.
    pub quotas: Vec<QuotaUsage>,
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
    /// Its fair-share weight.
    pub weight: u32,
    /// Where it stands in each tier where it has work or usage.
    pub shares: Vec<TierShare>,
    /// Its quotas, with what it uses against each.
    #[serde(default)]
    pub quotas: Vec<QuotaUsage>,
}

/// A tenant's standing in one tier, by which fair share orders the
/// tenants' work there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TierShare {
    /// `reserved`, `on-demand` or `preemptible`.
    pub tier: String,
    /// Its decayed usage over the tier's, percent.
    pub share_percent: f64,
    /// Its weight over the weights of the tier's tenants, percent.
    pub weight_percent: f64,
    /// Its decayed usage, GPU time valued at on-demand prices, dollars.
    pub usage_usd: String,
    /// Tenants with queued work in the tier ahead of it, when it has some.
    pub ahead: Option<u32>,
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

/// `POST /v1/jobs/{id}/signal`: a signal for a running job's processes
/// (Slurm's `scancel --signal`). A Slurm batch job's steps' tasks get it
/// (with `batch_only`, its batch shell alone); any other job's every
/// process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A name, with or without `SIG`, or a number from 1 to 64.
    #[schema(
        pattern = r"^(([Ss][Ii][Gg])?([Hh][Uu][Pp]|[Ii][Nn][Tt]|[Qq][Uu][Ii][Tt]|[Kk][Ii][Ll][Ll]|[Uu][Ss][Rr][12]|[Tt][Ee][Rr][Mm]|[Cc][Oo][Nn][Tt]|[Ss][Tt][Oo][Pp]|[Tt][Ss][Tt][Pp]|[Ww][Ii][Nn][Cc][Hh])|\+?0*([1-9]|[1-5][0-9]|6[0-4]))$"
    )]
    pub signal: String,
    /// The batch shell alone (Slurm's `scancel -b`).
    #[serde(default)]
    pub batch_only: bool,
    /// The steps' tasks and the batch shell with its children too
    /// (Slurm's `scancel -f`); `batch_only` wins over it.
    #[serde(default)]
    pub full: bool,
}

/// `GET /v1/jobs/{id}/steps`: how the job's tenant reaches the steps of
/// its running Slurm job from outside it (`srun --jobid`, as from a login
/// node): its first node's step directory, the key every step presents,
/// and the variables Slurm gives each of its processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepAccess {
    /// `HOST:PORT` of the first node's step directory.
    pub hub: String,
    /// The attempt's step key (secret: the job's own processes hold it).
    pub key: String,
    /// `SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, `SLURM_NTASKS`, ...
    pub env: std::collections::BTreeMap<String, String>,
}

/// A Slurm partition (`sbatch --partition`): the tier its jobs run in, as
/// the operator maps it (`ebb server --partition-map`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Partition {
    pub name: String,
    pub tier: String,
    /// Jobs that name no partition run in this one.
    pub default: bool,
}
