//! Choosing victims: the cheapest set of preemptible work whose GPUs make
//! room for a preemptor, by a lower bound on the work each node would
//! lose, never a scan of the fleet.

use super::*;

impl<'a> Pass<'a> {
    /// The victims for a preemptor of `gpus` GPUs that may use `models`: the
    /// cheapest set without a settling job, or, only when no such set
    /// exists, the cheapest set of all, so that the rule never makes a
    /// reserved or on-demand job wait. The second search runs only when
    /// the first passed over a settling job.
    pub(super) fn choose_victims(&mut self, models: &[GpuModelId], gpus: u32) -> Option<VictimSet> {
        self.sparing_settling = self.config.min_runtime > Span::ZERO;
        self.passed_over_settling.set(false);
        let sparing = self.cheapest_victims(models, gpus);
        self.sparing_settling = false;
        if sparing.is_some() || !self.passed_over_settling.get() {
            return sparing;
        }
        self.cheapest_victims(models, gpus)
    }

    /// The cheapest victim set over every model the preemptor may use.
    pub(super) fn cheapest_victims(&mut self, models: &[GpuModelId], gpus: u32) -> Option<VictimSet> {
        let mut best: Option<VictimSet> = None;
        for &model in models {
            if let Some(set) = self.find_victims(model, gpus) {
                let better = best.as_ref().is_none_or(|b| (set.cost, set.len()) < (b.cost, b.len()));
                if better {
                    best = Some(set);
                }
            }
        }
        best
    }

    /// Whether the search under way passes over `job` because it is
    /// settling (and notes that it did).
    fn spared(&self, job: &Job) -> bool {
        match self.victim_filter {
            Some(VictimFilter::Tenant(tenant)) => {
                let run = job.run.as_ref().expect("victims run");
                let young = self.now.saturating_since(run.started_at) < self.config.min_runtime
                    && !job.requeued_itself;
                return job.spec.tenant != tenant || young;
            }
            Some(VictimFilter::Borrowers(tier, model)) => {
                return job.spec.tier != tier || !self.borrows(job, model);
            }
            None => {}
        }
        let spared = self.sparing_settling && job.settling(self.now, self.config.min_runtime);
        if spared {
            self.passed_over_settling.set(true);
        }
        spared
    }

    /// The policy's cost of evicting one job now: the GPUs it runs on
    /// (an elastic job's leaving nodes are gone already). Stopping an
    /// elastic job also costs the restart of each of its GPUs, as
    /// shrinking it costs those that stay: a stop is never cheaper than a
    /// shrink of the same job, which loses less and waits for nothing.
    pub(super) fn victim_cost(&self, job: &Job) -> u128 {
        let run = job.run.as_ref().expect("victims run");
        let gpus = run.active_gpus() as u128;
        match self.config.victim_policy {
            VictimPolicy::LostWork => {
                let restart = if job.spec.is_elastic() { self.config.restart_cost.0 as u128 } else { 0 };
                gpus * (self.now.saturating_since(run.progress_saved_at()).0 as u128 + restart)
            }
            VictimPolicy::Youngest => self.now.saturating_since(run.started_at).0 as u128,
            VictimPolicy::Oldest => run.started_at.0 as u128,
            VictimPolicy::FewestGpus => gpus,
            VictimPolicy::Random { seed } => {
                splitmix64(seed ^ splitmix64(job.spec.id.0 ^ ((run.attempt.0 as u64) << 48))) as u128
            }
        }
    }

    /// The cheapest set of preemptible jobs whose leaving lets a job of
    /// `gpus` GPUs fit on `model`, or `None` if no set does.
    fn find_victims(&mut self, model: GpuModelId, gpus: u32) -> Option<VictimSet> {
        let per_node = self.state.models[model.0 as usize].gpus_per_node;
        if gpus <= per_node as u32 {
            self.victims_on_one_node(model, gpus as u8)
        } else {
            self.victims_on_whole_nodes(model, (gpus / per_node as u32) as usize)
        }
    }

    /// Candidate nodes for a `gpus`-GPU preemptor in best-first order of a
    /// lower bound on what evicting there loses (exact order for the
    /// lost-work policy's bound; every candidate for the others). `whole`
    /// asks for nodes that can be emptied entirely.
    fn candidate_nodes(&self, model: GpuModelId, gpus: u8, whole: bool) -> CandidateNodes<'a> {
        let state = self.state;
        let per_node = state.models[model.0 as usize].gpus_per_node;
        let index = &state.index[model.0 as usize];
        let mut buckets = Vec::new();
        for free in 0..gpus.min(per_node + 1) {
            let needed = gpus - free;
            let reclaimable =
                if whole { per_node - free..=per_node - free } else { needed..=per_node - free };
            for p in reclaimable {
                let bucket = &index.by_reclaimable[free as usize][p as usize][needed as usize];
                if !bucket.is_empty() {
                    buckets.push((needed as u128, bucket.iter()));
                }
            }
        }
        CandidateNodes::new(buckets, self.now)
    }

    fn victims_on_one_node(&mut self, model: GpuModelId, gpus: u8) -> Option<VictimSet> {
        let exhaustive = self.config.victim_policy != VictimPolicy::LostWork;
        let mut best: Option<(u128, usize, NodeId, OnNode)> = None;
        if !exhaustive {
            // The best single victim is exact for one-victim sets and bounds
            // the node search: only nodes that might do better are visited.
            best = self.best_single_victim(model, gpus).map(|(cost, node, job)| {
                (cost, 1, node, OnNode { cost, victims: vec![job], parts: Vec::new() })
            });
        }
        let mut candidates = self.candidate_nodes(model, gpus, false);
        while let Some((bound, node)) = candidates.next() {
            if let (false, Some((cost, n, _, _))) = (exhaustive, &best) {
                // Nothing further can be cheaper (nor equal with fewer victims).
                if bound > *cost || (bound == *cost && *n == 1) {
                    break;
                }
            }
            if self.earmarked.contains_key(&node) || self.dead.contains(&node) {
                continue;
            }
            let Some(found) = self.cheapest_on_node(node, gpus) else { continue };
            let better = best.as_ref().is_none_or(|(c, n, id, _)| {
                let key = (found.cost, found.len());
                key < (*c, *n) || (exhaustive && key == (*c, *n) && node < *id)
            });
            if better {
                best = Some((found.cost, found.len(), node, found));
            }
        }
        let (cost, _, node, found) = best?;
        let free = self.free_mask(node);
        let victim_gpus =
            found.victims.iter().chain(&found.parts).fold(0, |acc, v| acc | self.mask_on(*v, node));
        let mut hold = lowest_bits(free, gpus as u32);
        hold |= lowest_bits(victim_gpus, gpus as u32 - hold.count_ones());
        let parts = found.parts.iter().map(|&job| (job, node)).collect();
        Some(VictimSet { model, hold: vec![(node, hold)], victims: found.victims, parts, cost })
    }

    /// The cheapest single running preemptible job whose leaving makes room
    /// for `gpus` GPUs on its node, under the lost-work policy:
    /// (lost GPU-ms, node, job).
    fn best_single_victim(&mut self, model: GpuModelId, gpus: u8) -> Option<(u128, NodeId, JobId)> {
        let state = self.state;
        let per_node = state.models[model.0 as usize].gpus_per_node;
        let index = &state.index[model.0 as usize];
        let mut best: Option<(u128, NodeId, JobId)> = None;
        for free in 0..gpus {
            for size in gpus - free..=per_node - free {
                let bucket = &index.singles[free as usize][size as usize];
                let from = match self.single_cursor.get(&(model, free, size)) {
                    Some(last) => Bound::Excluded(*last),
                    None => Bound::Unbounded,
                };
                // A settling job passed over may be wanted by a search that
                // does not spare it: the cursor stops before it.
                let mut advance = true;
                for entry in bucket.range((from, Bound::Unbounded)) {
                    let &(Reverse(saved_at), node, job) = entry;
                    if self.spared(&state.jobs[&job]) {
                        advance = false;
                        continue;
                    }
                    let usable = !self.victims.contains(&job)
                        && !self.earmarked.contains_key(&node)
                        && !self.dead.contains(&node)
                        && self.free_mask(node).count_ones() + size as u32 >= gpus as u32;
                    if usable {
                        let cost = size as u128 * self.now.saturating_since(saved_at).0 as u128;
                        if best.is_none_or(|b| (cost, node, job) < b) {
                            best = Some((cost, node, job));
                        }
                        break;
                    }
                    // Unusable for the rest of the pass: free GPUs only shrink.
                    if advance {
                        self.single_cursor.insert((model, free, size), *entry);
                    }
                }
            }
        }
        best
    }

    fn victims_on_whole_nodes(&self, model: GpuModelId, k: usize) -> Option<VictimSet> {
        let per_node = self.state.models[model.0 as usize].gpus_per_node;
        let exhaustive = self.config.victim_policy != VictimPolicy::LostWork;
        // (cost, node, what leaves), kept sorted; free nodes cost nothing.
        let mut chosen: Vec<(u128, NodeId, OnNode)> = Vec::new();
        let mut candidates = self.candidate_nodes(model, per_node, true);
        // Entirely free nodes cost nothing; fewer than k exist (or the gang
        // would have been placed), so this takes at most k of them.
        let free_nodes: BTreeSet<NodeId> = self.state.index[model.0 as usize].by_free[per_node as usize]
            .iter()
            .chain(self.touched_by_free[model.0 as usize][per_node as usize].iter())
            .filter(|n| !self.earmarked.contains_key(n) && !self.dead.contains(n))
            .filter(|n| self.free_mask(**n).count_ones() == per_node as u32)
            .take(k)
            .copied()
            .collect();
        for node in free_nodes.into_iter().take(k) {
            chosen.push((0, node, OnNode::default()));
        }
        while let Some((bound, node)) = candidates.next() {
            if !exhaustive && chosen.len() >= k && bound > chosen[k - 1].0 {
                break;
            }
            if self.earmarked.contains_key(&node)
                || self.dead.contains(&node)
                || chosen.iter().any(|c| c.1 == node)
            {
                continue;
            }
            let Some(found) = self.cheapest_on_node(node, per_node) else { continue };
            chosen.push((found.cost, node, found));
            chosen.sort_by_key(|(cost, node, found)| (*cost, found.len(), *node));
            chosen.truncate(k);
        }
        if chosen.len() < k {
            return None;
        }
        let mut victims: Vec<JobId> = chosen.iter().flat_map(|c| c.2.victims.iter().copied()).collect();
        victims.sort_unstable();
        victims.dedup();
        let mut parts: Vec<(JobId, NodeId)> =
            chosen.iter().flat_map(|(_, node, found)| found.parts.iter().map(|&job| (job, *node))).collect();
        if !self.settle_parts(&mut victims, &mut parts) {
            return None;
        }
        let mut cost: u128 = victims.iter().map(|v| self.victim_cost(&self.state.jobs[v])).sum();
        for group in parts.chunk_by(|a, b| a.0 == b.0) {
            cost += self.shrink_cost(&self.state.jobs[&group[0].0], group.iter().map(|p| p.1));
        }
        let mut hold: Vec<(NodeId, u64)> = chosen.iter().map(|c| (c.1, full_mask(per_node))).collect();
        hold.sort_unstable();
        Some(VictimSet { model, hold, victims, parts, cost })
    }

    /// Nodes chosen one by one may take parts of one elastic job past
    /// what it can spare, or a part of a job drained whole besides: such
    /// a job leaves whole instead (it frees every node it was chosen
    /// for), unless parts of it were taken earlier in the pass, when the
    /// set is not to be had (false). Leaves the victims and the parts
    /// sorted.
    fn settle_parts(&self, victims: &mut Vec<JobId>, parts: &mut Vec<(JobId, NodeId)>) -> bool {
        parts.retain(|(job, _)| victims.binary_search(job).is_err());
        parts.sort_unstable();
        let mut whole = Vec::new();
        for group in parts.chunk_by(|a, b| a.0 == b.0) {
            let job = &self.state.jobs[&group[0].0];
            if !self.parts_may_leave(job, group.iter().map(|p| p.1)) {
                if self.shrunk.contains_key(&job.spec.id) {
                    return false;
                }
                whole.push(job.spec.id);
            }
        }
        parts.retain(|(job, _)| !whole.contains(job));
        victims.extend(whole);
        victims.sort_unstable();
        true
    }

    /// The cheapest set of evictable jobs on `node` that frees room for
    /// `gpus` GPUs there, fewest victims among equals. An elastic job that
    /// can spare the node may leave it alone (a shrink) where that costs
    /// less than stopping it.
    fn cheapest_on_node(&self, node: NodeId, gpus: u8) -> Option<OnNode> {
        let free = self.free_mask(node).count_ones();
        if free >= gpus as u32 {
            return None; // placeable without preemption; best fit saw it
        }
        let need = gpus as u32 - free;
        // (cost, GPUs freed here, job, whether only its part here leaves)
        let mut options: Vec<(u128, u32, JobId, bool)> = self.state.nodes[node.0 as usize]
            .jobs
            .iter()
            .filter(|(job, _)| !self.victims.contains(job))
            .filter_map(|&(job, mask)| {
                let j = &self.state.jobs[&job];
                if j.spec.tier != Tier::Preemptible || j.phase != Phase::Running || self.spared(j) {
                    return None;
                }
                if j.spec.is_elastic() {
                    let run = j.run.as_ref().expect("running");
                    if run.is_leaving(node) || self.shrunk_parts.contains(&(job, node)) {
                        return None;
                    }
                    // One that can spare the node loses only its part here:
                    // stopping it would lose what the shrink does and more.
                    if self.part_may_leave(j, node) {
                        return Some((self.shrink_cost(j, [node]), mask.count_ones(), job, true));
                    }
                    if self.shrunk.contains_key(&job) {
                        return None;
                    }
                }
                Some((self.victim_cost(j), mask.count_ones(), job, false))
            })
            .collect();
        if options.iter().map(|o| o.1).sum::<u32>() < need {
            return None;
        }
        options.sort_unstable();
        const EXACT_UP_TO: usize = 12;
        let pick: Vec<usize> = if options.len() <= EXACT_UP_TO {
            let mut best: Option<(u128, u32, u32)> = None; // (cost, victims, subset)
            for subset in 1u32..(1 << options.len()) {
                let (mut cost, mut freed) = (0u128, 0u32);
                for (i, option) in options.iter().enumerate() {
                    if subset & (1 << i) != 0 {
                        cost += option.0;
                        freed += option.1;
                    }
                }
                let key = (cost, subset.count_ones(), subset);
                if freed >= need && best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
            let subset = best.expect("enough GPUs were checked above").2;
            (0..options.len()).filter(|i| subset & (1 << i) != 0).collect()
        } else {
            // Many small jobs on a big node: cheapest per GPU first.
            let mut order: Vec<usize> = (0..options.len()).collect();
            order.sort_by_key(|&i| (options[i].0 / options[i].1 as u128, options[i].2));
            let mut freed = 0;
            order
                .into_iter()
                .take_while(|&i| {
                    let take = freed < need;
                    freed += options[i].1;
                    take
                })
                .collect()
        };
        let cost = pick.iter().map(|&i| options[i].0).sum();
        let mut found = OnNode { cost, ..OnNode::default() };
        for &i in &pick {
            match options[i].3 {
                true => found.parts.push(options[i].2),
                false => found.victims.push(options[i].2),
            }
        }
        found.victims.sort_unstable();
        found.parts.sort_unstable();
        Some(found)
    }

    fn mask_on(&self, job: JobId, node: NodeId) -> u64 {
        self.state.nodes[node.0 as usize].jobs.iter().find(|(j, _)| *j == job).map_or(0, |(_, mask)| *mask)
    }
}

/// What leaves one node to make room there: jobs drained whole, and
/// elastic jobs that leave only this node.
#[derive(Default)]
struct OnNode {
    cost: u128,
    victims: Vec<JobId>,
    parts: Vec<JobId>,
}

impl OnNode {
    fn len(&self) -> usize {
        self.victims.len() + self.parts.len()
    }
}

/// Best-first merge of the victim index's buckets: yields nodes by a lower
/// bound on what evicting `k` GPUs there loses, `k * now - T_k`.
struct CandidateNodes<'a> {
    now: Time,
    buckets: Vec<(u128, btree_set::Iter<'a, Reclaimable>)>,
    heap: BinaryHeap<Reverse<(u128, NodeId, usize)>>,
}

impl<'a> CandidateNodes<'a> {
    fn new(buckets: Vec<(u128, btree_set::Iter<'a, Reclaimable>)>, now: Time) -> Self {
        let mut this = CandidateNodes { now, buckets, heap: BinaryHeap::new() };
        for i in 0..this.buckets.len() {
            this.advance(i);
        }
        this
    }

    fn advance(&mut self, i: usize) {
        let (needed, iter) = &mut self.buckets[i];
        if let Some(&(Reverse(top_sum), node)) = iter.next() {
            let bound = (*needed * self.now.0 as u128).saturating_sub(top_sum as u128);
            self.heap.push(Reverse((bound, node, i)));
        }
    }

    fn next(&mut self) -> Option<(u128, NodeId)> {
        let Reverse((bound, node, i)) = self.heap.pop()?;
        self.advance(i);
        Some((bound, node))
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
