//! A plan is data: what one scheduling pass decided. The edge applies it to
//! the state with [`crate::State::apply`], which checks it first, and only
//! then tells agents what to do.

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Time};

use crate::model::DrainReason;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub now: Time,
    /// Nodes whose heartbeat timed out; their jobs are in `requeues`.
    pub lost_nodes: Vec<NodeId>,
    pub requeues: Vec<Requeue>,
    /// Drain notices, one per victim.
    pub drains: Vec<Drain>,
    /// GPUs to hold for a waiting job while its victims drain.
    pub preemptions: Vec<Preemption>,
    pub placements: Vec<Placement>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.lost_nodes.is_empty()
            && self.requeues.is_empty()
            && self.drains.is_empty()
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

/// `preemptor` will fit once `victims` leave; `hold` is reserved for it
/// from now until it starts, and no other job may take those GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub preemptor: JobId,
    pub model: GpuModelId,
    pub hold: Vec<(NodeId, u64)>,
    pub victims: Vec<JobId>,
    /// The victims' GPU-milliseconds since their last checkpoint, at notice.
    pub lost_gpu_ms: u128,
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
