//! A plan is data: what one scheduling pass decided. The edge applies it to
//! the state with [`crate::State::apply`], which checks it first, and only
//! then tells agents what to do.

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, TenantId, Time};

use crate::model::DrainReason;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub now: Time,
    /// Nodes whose heartbeat timed out; their jobs are in `requeues`.
    pub lost_nodes: Vec<NodeId>,
    pub requeues: Vec<Requeue>,
    /// Drain notices, one per victim.
    pub drains: Vec<Drain>,
    /// Elastic jobs shrunk: notices to some of their nodes only.
    pub shrinks: Vec<Shrink>,
    /// GPUs to hold for a waiting job while its victims drain.
    pub preemptions: Vec<Preemption>,
    pub placements: Vec<Placement>,
    /// Running elastic jobs given more nodes.
    pub grows: Vec<Grow>,
    /// Why each job the pass looked at and could not start waits: the
    /// first of every queue class left waiting. The others of its class
    /// wait behind it ([`crate::State::first_in_line`]). Informational:
    /// [`crate::State::apply`] ignores it, and a plan of only this is
    /// empty.
    pub pending: Vec<(JobId, Pending)>,
    /// The nodes kept for the job each tier's order is reserved for (the
    /// first in the order that could not start; `README.md`, "Fair
    /// share"), when they differ from the last pass's
    /// ([`crate::State::earmarks`]). A plan of only this is empty; it is
    /// kept by [`crate::State::apply`], or by
    /// [`crate::State::keep_earmarks`] from an empty plan, so the next pass
    /// keeps the same nodes for the same tenant.
    pub earmarks: Option<Vec<(NodeId, JobId)>>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.lost_nodes.is_empty()
            && self.requeues.is_empty()
            && self.drains.is_empty()
            && self.shrinks.is_empty()
            && self.grows.is_empty()
            && self.preemptions.is_empty()
            && self.placements.is_empty()
    }
}

/// Start `job` as attempt `attempt` on these GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub job: JobId,
    pub attempt: Attempt,
    pub model: GpuModelId,
    /// One entry per node: bit mask of GPU indices.
    pub alloc: Vec<(NodeId, u64)>,
    /// The GPUs were held for this job through its victims' drain.
    pub from_hold: bool,
}

/// Give `job` its drain notice now; it is killed at `deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    pub job: JobId,
    pub attempt: Attempt,
    pub notice_at: Time,
    pub deadline: Time,
    pub reason: DrainReason,
}

/// Give the parts of elastic `job` on `nodes` their notice now: they
/// leave by `deadline`, and the attempt goes on on its other nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrink {
    pub job: JobId,
    pub attempt: Attempt,
    pub nodes: Vec<NodeId>,
    pub notice_at: Time,
    pub deadline: Time,
    pub reason: DrainReason,
}

/// Running elastic `job` grows onto `alloc` (whole free nodes); its
/// attempt goes on, the new parts joining it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grow {
    pub job: JobId,
    pub attempt: Attempt,
    pub alloc: Vec<(NodeId, u64)>,
}

/// `preemptor` will fit once `victims` leave; `hold` is reserved for it
/// from now until it starts, and no other job may take those GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub preemptor: JobId,
    pub model: GpuModelId,
    pub hold: Vec<(NodeId, u64)>,
    pub victims: Vec<JobId>,
    /// Parts of elastic jobs that leave for it (the jobs go on), each
    /// with its shrink in the plan.
    pub parts: Vec<(JobId, NodeId)>,
    /// The victims' GPU-milliseconds since their last checkpoint, at
    /// notice, and the restart each GPU of an elastic victim makes
    /// ([`crate::Config::restart_cost`]): every GPU of one stopped, those
    /// that stay on one shrunk (its leaving parts' GPUs count as a
    /// victim's).
    pub lost_gpu_ms: u128,
}

/// Why a queued job did not start in a pass, with the numbers that say so.
/// The edge keeps the latest per job and shows it to its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Not enough free GPUs of `model` on one node, and nothing may be
    /// drained for it (it is preemptible, or no preemptible work can make
    /// room). `largest_free`: the most any usable node has free.
    Resources { model: GpuModelId, largest_free: u32 },
    /// The GPUs it would fit on are kept for `behind`, an earlier job of
    /// higher precedence that waits for them (backfill never starves it).
    Priority { behind: JobId },
    /// A gang needs `nodes` whole free nodes of `model`; `free` are free
    /// now, and `earmarked` are kept for it as they empty.
    WholeNodes { model: GpuModelId, nodes: u32, free: u32, earmarked: Vec<NodeId> },
    /// On-demand work may use `capacity - reserved` GPUs of `model`, and
    /// `used` of those are in use by on-demand work already.
    ReservationCap { model: GpuModelId, capacity: u32, reserved: u32, used: u32 },
    /// A reserved job's tenant has `reserved` GPUs of `model` reserved
    /// now, `used` of them in use.
    ReservationFull { model: GpuModelId, reserved: u32, used: u32 },
    /// A reserved job's tenant has no active reservation of `model`; the
    /// next one starts at `starts` (none: there is no later one).
    ReservationNotStarted { model: GpuModelId, starts: Option<Time> },
    /// The operator reclaimed preemptible capacity of `model`: preemptible
    /// work may hold at most `limit` GPUs, and holds `used`.
    Reclaimed { model: GpuModelId, limit: u32, used: u32 },
    /// Jobs of `tenants_ahead` other tenants of its tier, further below
    /// their shares, wait for the same GPUs ahead of it (`README.md`,
    /// "Fair share"); the first of them waits for the reason it was given.
    FairShare { tenants_ahead: u32 },
    /// Fair-share preemption drained jobs of tenant `from`, furthest above
    /// its share, for this job's tenant; it starts when they have left,
    /// unless a tenant further below its share comes first.
    ReclaimingShare { from: TenantId, victims: u32 },
    /// Its tenant's quota on `model` in its tier does not allow it:
    /// `used` GPUs in use against a nominal quota of `nominal`, which it
    /// may pass by at most `borrowing`.
    Quota { model: GpuModelId, used: u32, nominal: u32, borrowing: Option<u32> },
    /// It would borrow on `model`, and `owner`, under its own quota there,
    /// waits: nobody borrows until it has its GPUs.
    QuotaOwed { model: GpuModelId, owner: TenantId },
    /// It would take GPUs of `model` that other tenants' lending limits
    /// keep idle for them (`kept` of them).
    QuotaKept { model: GpuModelId, kept: u32 },
    /// Its tenant is under its quota of `model`: borrowers give GPUs back,
    /// `victims` of their preemptible jobs drained for it (none in the
    /// on-demand tier, which waits for borrowers' jobs to end).
    ReclaimingQuota { model: GpuModelId, victims: u32 },
    /// No model it may run on has `gpus` GPUs in service now (nodes are
    /// drained, lost or gone). `model`: the one it asked for, if any.
    NoCapacity { model: Option<GpuModelId> },
}

impl Pending {
    /// Whether it is its tenant's quota that keeps it waiting (another
    /// tenant's job of the same size may start).
    pub fn is_quota(&self) -> bool {
        matches!(self, Pending::Quota { .. } | Pending::QuotaOwed { .. } | Pending::QuotaKept { .. })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requeue {
    pub job: JobId,
    pub attempt: Attempt,
    pub reason: RequeueReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueReason {
    NodeLost(NodeId),
}
