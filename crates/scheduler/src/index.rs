//! Indices that keep one scheduling decision from scanning the cluster.
//!
//! Per GPU model, two ordered indices over schedulable (`Up`) nodes:
//!
//! * `by_free[f]`: the nodes with exactly `f` free GPUs (neither used nor
//!   held). Best fit for a job of `g` GPUs is the first node of the first
//!   non-empty bucket `f >= g`.
//! * `by_reclaimable[f][p][k]`: the same nodes keyed also by `p`, the GPUs
//!   used by preemptible jobs that are not already draining, once for each
//!   `k` in `1..=p`, ordered by `T_k`, the sum of the save instants of the
//!   `k` freshest of those GPUs (largest first). Freeing `k` GPUs on a node
//!   loses at least `k * now - T_k` GPU-time (each freed GPU loses at least
//!   what the k freshest do), so walking a bucket in order visits nodes by
//!   increasing lower bound, and the victim search can stop as soon as the
//!   bound passes the best set found (see `schedule::victims_on_one_node`).
//!   For a node that must be emptied the bound is exact.
//! * `singles[f][g]`: rigid single-node preemptible jobs of `g` GPUs that are
//!   running (not draining) on a node with `f` free GPUs, freshest save
//!   first. The cheapest single victim for a `G`-GPU preemptor is the head
//!   of one of the buckets with `f + g >= G`: an exact answer in
//!   O(buckets), and a tight bound that stops the node search early.
//!
//! All are updated in O(log n) per entry whenever a node's numbers change.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use ebb_core::{JobId, NodeId, Time};

/// Where a node currently sits in its model's indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IndexKey {
    pub free: u8,
    pub reclaimable: u8,
    /// `top_sums[k - 1]` = T_k in milliseconds, for k in 1..=reclaimable.
    pub top_sums: Vec<u64>,
}

/// An entry of `by_reclaimable`: T_k (largest first) and the node.
pub(crate) type Reclaimable = (Reverse<u64>, NodeId);

#[derive(Clone, Debug, Default)]
pub(crate) struct ModelIndex {
    pub by_free: Vec<BTreeSet<NodeId>>,
    pub by_reclaimable: Vec<Vec<Vec<BTreeSet<Reclaimable>>>>,
    pub singles: Vec<Vec<BTreeSet<SingleVictim>>>,
}

/// A single-node preemptible job as a candidate victim.
pub(crate) type SingleVictim = (Reverse<Time>, NodeId, JobId);

/// Where a job sits in `singles`: (free on its node, its GPUs, entry).
pub(crate) type SingleKey = (u8, u8, SingleVictim);

impl ModelIndex {
    pub fn new(gpus_per_node: u8) -> ModelIndex {
        let n = gpus_per_node as usize + 1;
        ModelIndex {
            by_free: vec![BTreeSet::new(); n],
            by_reclaimable: vec![vec![vec![BTreeSet::new(); n]; n]; n],
            singles: vec![vec![BTreeSet::new(); n]; n],
        }
    }

    pub fn insert(&mut self, node: NodeId, key: &IndexKey) {
        self.by_free[key.free as usize].insert(node);
        let buckets = &mut self.by_reclaimable[key.free as usize][key.reclaimable as usize];
        for (k, sum) in key.top_sums.iter().enumerate() {
            buckets[k + 1].insert((Reverse(*sum), node));
        }
    }

    pub fn remove(&mut self, node: NodeId, key: &IndexKey) {
        let mut removed = self.by_free[key.free as usize].remove(&node);
        let buckets = &mut self.by_reclaimable[key.free as usize][key.reclaimable as usize];
        for (k, sum) in key.top_sums.iter().enumerate() {
            removed &= buckets[k + 1].remove(&(Reverse(*sum), node));
        }
        debug_assert!(removed, "index out of step for {node}");
    }

    /// A node that stays in its bucket (the same free and reclaimable
    /// GPUs) whose save instants changed, now `slots` (freshest first):
    /// only the sums that changed move.
    pub fn move_sums(&mut self, node: NodeId, key: &mut IndexKey, slots: &[u64]) {
        debug_assert_eq!(key.top_sums.len(), slots.len());
        let buckets = &mut self.by_reclaimable[key.free as usize][key.reclaimable as usize];
        let mut sum = 0;
        for (k, (old, t)) in key.top_sums.iter_mut().zip(slots).enumerate() {
            sum += t;
            if *old != sum {
                let removed = buckets[k + 1].remove(&(Reverse(*old), node));
                debug_assert!(removed, "index out of step for {node}");
                buckets[k + 1].insert((Reverse(sum), node));
                *old = sum;
            }
        }
    }

    /// A node's single-victim entries go from `old` to `new` (both
    /// sorted): those in both stay.
    pub fn move_singles(&mut self, old: &[SingleKey], new: &[SingleKey]) {
        let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
        loop {
            match (o.peek(), n.peek()) {
                (Some(a), Some(b)) if a == b => {
                    o.next();
                    n.next();
                }
                (Some(&&a), Some(&&b)) if a < b => {
                    self.remove_single(a);
                    o.next();
                }
                (_, Some(&&b)) => {
                    self.insert_single(b);
                    n.next();
                }
                (Some(&&a), None) => {
                    self.remove_single(a);
                    o.next();
                }
                (None, None) => return,
            }
        }
    }

    pub fn insert_single(&mut self, (free, gpus, entry): SingleKey) {
        self.singles[free as usize][gpus as usize].insert(entry);
    }

    pub fn remove_single(&mut self, (free, gpus, entry): SingleKey) {
        let removed = self.singles[free as usize][gpus as usize].remove(&entry);
        debug_assert!(removed, "single-victim index out of step for {}", entry.2);
    }

    pub fn singles_len(&self) -> usize {
        self.singles.iter().flatten().map(BTreeSet::len).sum()
    }

    pub fn reclaimable_len(&self) -> usize {
        self.by_reclaimable.iter().flatten().flatten().map(BTreeSet::len).sum()
    }

    pub fn len(&self) -> usize {
        self.by_free.iter().map(BTreeSet::len).sum()
    }
}
