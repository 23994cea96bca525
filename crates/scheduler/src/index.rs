//! Indices that keep one scheduling decision from scanning the cluster.
//!
//! Per GPU model, two ordered indices over schedulable (`Up`) nodes:
//!
//! * `by_free[f]`: the nodes with exactly `f` free GPUs (neither used nor
//!   held). Best fit for a job of `g` GPUs is the first node of the first
//!   non-empty bucket `f >= g`.
//! * `by_reclaimable[f][p]`: the same nodes keyed also by `p`, the GPUs used
//!   by preemptible jobs that are not already draining, ordered by the
//!   latest instant up to which their work is saved (`t_max`, newest
//!   first). A node can host a `g`-GPU preemptor only if `f + p >= g`, and
//!   evicting enough to free `g - f` GPUs there loses at least
//!   `(g - f) * (now - t_max)` GPU-time, which lets the victim search stop
//!   early (see `schedule::victims`).
//!
//! Both are updated in O(log n) whenever a node's numbers change.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use ebb_core::{NodeId, Time};

/// Where a node currently sits in its model's indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexKey {
    pub free: u8,
    pub reclaimable: u8,
    pub saved_at: Time,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ModelIndex {
    pub by_free: Vec<BTreeSet<NodeId>>,
    pub by_reclaimable: Vec<Vec<BTreeSet<(Reverse<Time>, NodeId)>>>,
}

impl ModelIndex {
    pub fn new(gpus_per_node: u8) -> ModelIndex {
        let n = gpus_per_node as usize + 1;
        ModelIndex {
            by_free: vec![BTreeSet::new(); n],
            by_reclaimable: vec![vec![BTreeSet::new(); n]; n],
        }
    }

    pub fn insert(&mut self, node: NodeId, key: IndexKey) {
        self.by_free[key.free as usize].insert(node);
        self.by_reclaimable[key.free as usize][key.reclaimable as usize]
            .insert((Reverse(key.saved_at), node));
    }

    pub fn remove(&mut self, node: NodeId, key: IndexKey) {
        let removed = self.by_free[key.free as usize].remove(&node)
            & self.by_reclaimable[key.free as usize][key.reclaimable as usize]
                .remove(&(Reverse(key.saved_at), node));
        debug_assert!(removed, "index out of step for {node}");
    }

    pub fn len(&self) -> usize {
        self.by_free.iter().map(BTreeSet::len).sum()
    }
}
