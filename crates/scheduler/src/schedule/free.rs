//! Where a job fits: free GPUs by bucket of free count on each model,
//! the nodes kept (earmarked) for the job a tier's order waits for, and
//! the pass's record of the nodes it changed. The small helpers are
//! `#[inline]`: the pass in `schedule.rs` calls them for every candidate
//! node, and a module of their own may land in another codegen unit.

use super::*;

impl<'a> Pass<'a> {
    /// Free GPUs for a job of `gpus` on `model`: for one node, the best
    /// fit, and among nodes that fit equally well the one it last ran on
    /// (`last`: its image is in that node's cache).
    pub(super) fn find_free(
        &mut self,
        model: GpuModelId,
        gpus: u32,
        last: Option<NodeId>,
    ) -> Option<Vec<(NodeId, u64)>> {
        let per_node = self.state.models[model.0 as usize].gpus_per_node;
        if gpus <= per_node as u32 {
            // Best fit: the fullest node that still fits keeps whole nodes free.
            for free in gpus as usize..=per_node as usize {
                if let Some(node) = last.filter(|n| self.in_bucket(model, free, *n)) {
                    let mask = lowest_bits(self.free_mask(node), gpus);
                    return Some(vec![(node, mask)]);
                }
                if let Some(node) = self.bucket_first(model, free) {
                    let mask = lowest_bits(self.free_mask(node), gpus);
                    return Some(vec![(node, mask)]);
                }
            }
            None
        } else {
            let k = gpus / per_node as u32;
            let nodes = self.bucket_nodes(model, per_node as usize, k as usize);
            (nodes.len() == k as usize).then(|| nodes.into_iter().map(|n| (n, full_mask(per_node))).collect())
        }
    }

    /// Keeps the nodes closest to fitting a blocked job free of later work,
    /// so a large job is never starved by smaller ones behind it.
    /// Returns the nodes it earmarked for a gang over whole nodes (what its
    /// reason shows; a job within one node needs no list).
    pub(super) fn earmark_for(&mut self, job: JobId, model: GpuModelId, gpus: u32) -> Vec<NodeId> {
        let per_node = self.state.models[model.0 as usize].gpus_per_node;
        let mut wanted = if gpus <= per_node as u32 { 1 } else { (gpus / per_node as u32) as usize };
        let spec = &self.state.jobs[&job].spec;
        let (class, tenant) = (QueueClass::of(spec), spec.tenant);
        let before: Vec<NodeId> = match self.state.earmarks.is_empty() {
            true => Vec::new(),
            false => self
                .state
                .earmarks
                .iter()
                .filter(|(_, j)| {
                    self.state
                        .jobs
                        .get(j)
                        .is_some_and(|o| o.spec.tenant == tenant && QueueClass::of(&o.spec) == class)
                })
                .map(|(n, _)| *n)
                .collect(),
        };
        let whole = gpus > per_node as u32;
        let mut kept = Vec::new();
        for free in (0..=per_node as usize).rev() {
            if wanted == 0 {
                break;
            }
            // Of nodes equally close, those kept for it before first (once
            // kept, a node is no longer among the bucket's usable ones).
            for &node in &before {
                if wanted > 0 && self.in_bucket(model, free, node) {
                    self.keep_for(node, job);
                    if whole {
                        kept.push(node);
                    }
                    wanted -= 1;
                }
            }
            if wanted == 0 {
                break;
            }
            // One node (the usual case) is found without building a list.
            if wanted == 1 {
                if let Some(node) = self.bucket_first(model, free) {
                    self.keep_for(node, job);
                    if whole {
                        kept.push(node);
                    }
                    wanted = 0;
                }
                continue;
            }
            for node in self.bucket_nodes(model, free, wanted) {
                self.keep_for(node, job);
                if whole {
                    kept.push(node);
                }
                wanted -= 1;
            }
        }
        kept
    }

    #[inline]
    pub(super) fn keep_for(&mut self, node: NodeId, job: JobId) {
        self.earmarked.insert(node, job);
        self.untouch_bucket(node);
    }

    /// Whether `node` is a usable node of `model` with exactly `free` free
    /// GPUs after this pass's decisions (one of [`Self::bucket_nodes`]'s).
    #[inline]
    pub(super) fn in_bucket(&self, model: GpuModelId, free: usize, node: NodeId) -> bool {
        if self.earmarked.contains_key(&node) || self.dead.contains(&node) {
            return false;
        }
        match self.touched.contains_key(&node) {
            true => self.touched_by_free[model.0 as usize][free].contains(&node),
            false => self.state.index[model.0 as usize].by_free[free].contains(&node),
        }
    }

    /// The first of [`Self::bucket_nodes`], found without building a list.
    #[inline]
    pub(super) fn bucket_first(&mut self, model: GpuModelId, free: usize) -> Option<NodeId> {
        let base = &self.state.index[model.0 as usize].by_free[free];
        if base.is_empty() {
            // Most buckets of a full cluster: nothing to skip over.
            return self.touched_by_free[model.0 as usize][free].first().copied();
        }
        let cursor = &mut self.cursor[model.0 as usize][free];
        let mut found = None;
        for node in base.range(NodeId(*cursor)..) {
            if !self.touched.contains_key(node)
                && !self.earmarked.contains_key(node)
                && !self.dead.contains(node)
            {
                found = Some(*node);
                break;
            }
            *cursor = node.0 + 1;
        }
        let touched = self.touched_by_free[model.0 as usize][free].first().copied();
        match (found, touched) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Up to `limit` usable nodes of `model` with exactly `free` free GPUs
    /// after this pass's decisions, lowest id first.
    pub(super) fn bucket_nodes(&mut self, model: GpuModelId, free: usize, limit: usize) -> Vec<NodeId> {
        let base = &self.state.index[model.0 as usize].by_free[free];
        let cursor = &mut self.cursor[model.0 as usize][free];
        let usable = |n: &NodeId| {
            !self.touched.contains_key(n) && !self.earmarked.contains_key(n) && !self.dead.contains(n)
        };
        // Often empty: allocated only once a node is found.
        let mut from_base = Vec::new();
        let mut prefix = true;
        for node in base.range(NodeId(*cursor)..) {
            if usable(node) {
                prefix = false;
                from_base.push(*node);
                if from_base.len() == limit {
                    break;
                }
            } else if prefix {
                *cursor = node.0 + 1;
            }
        }
        let touched = &self.touched_by_free[model.0 as usize][free];
        if touched.is_empty() {
            return from_base;
        }
        let mut merged: Vec<NodeId> =
            from_base.into_iter().chain(touched.iter().take(limit).copied()).collect();
        merged.sort_unstable();
        merged.truncate(limit);
        merged
    }

    #[inline]
    pub(super) fn masks(&self, node: NodeId) -> Touched {
        self.touched.get(&node).copied().unwrap_or_else(|| {
            let n = &self.state.nodes[node.0 as usize];
            Touched { used: n.used_mask(), held: n.held_mask() }
        })
    }

    #[inline]
    pub(super) fn free_mask(&self, node: NodeId) -> u64 {
        let t = self.masks(node);
        let n = &self.state.nodes[node.0 as usize];
        full_mask(n.gpus) & !t.used & !t.held & !n.out_mask()
    }

    #[inline]
    pub(super) fn touch(&mut self, node: NodeId, after: Touched) {
        self.untouch_bucket(node);
        self.touched.insert(node, after);
        let n = &self.state.nodes[node.0 as usize];
        if n.status == NodeStatus::Up && !self.earmarked.contains_key(&node) && !self.dead.contains(&node) {
            let free = self.free_mask(node).count_ones() as usize;
            self.touched_by_free[n.model.0 as usize][free].insert(node);
        }
    }

    #[inline]
    pub(super) fn untouch_bucket(&mut self, node: NodeId) {
        if self.touched.contains_key(&node) {
            let model = self.state.nodes[node.0 as usize].model;
            let free = self.free_mask(node).count_ones() as usize;
            self.touched_by_free[model.0 as usize][free].remove(&node);
        }
    }
}

/// The lowest `n` set bits of `mask`.
#[inline]
pub(super) fn lowest_bits(mut mask: u64, n: u32) -> u64 {
    let mut out = 0;
    for _ in 0..n {
        if mask == 0 {
            break;
        }
        let bit = mask & mask.wrapping_neg();
        out |= bit;
        mask &= !bit;
    }
    out
}
