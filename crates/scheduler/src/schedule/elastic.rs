//! Elastic jobs in the pass (`README.md`, "Elastic jobs"): which of a
//! job's nodes may leave alone, what a shrink costs, and growing jobs
//! into whole free nodes no queued job could start on.

use super::*;

impl<'a> Pass<'a> {
    /// Whether elastic `job` may lose only its part on `node` to a
    /// preemptor or a drained node: as [`Self::parts_may_leave`], under
    /// the lost-work policy and outside reclaims by fair share or quota
    /// (those stop whole jobs, one reclaim at a time).
    pub(super) fn part_may_leave(&self, job: &Job, node: NodeId) -> bool {
        self.victim_filter.is_none()
            && self.config.victim_policy == VictimPolicy::LostWork
            && self.parts_may_leave(job, [node])
    }

    /// Whether running elastic `job` can do without its parts on `nodes`:
    /// none its first node (rank 0 never leaves alone), none leaving or
    /// taken in this pass already, and what stays at least its fewest
    /// GPUs.
    pub(super) fn parts_may_leave(&self, job: &Job, nodes: impl IntoIterator<Item = NodeId>) -> bool {
        let Some(run) = job.run.as_ref().filter(|_| job.spec.is_elastic() && job.phase == Phase::Running)
        else {
            return false;
        };
        let id = job.spec.id;
        if self.victims.contains(&id) {
            return false;
        }
        let mut leaving = self.shrunk.get(&id).copied().unwrap_or(0);
        for node in nodes {
            let Some((_, mask)) = run.alloc.iter().find(|(n, _)| *n == node) else { return false };
            if node == run.first_node() || run.is_leaving(node) || self.shrunk_parts.contains(&(id, node)) {
                return false;
            }
            leaving += mask.count_ones();
        }
        run.active_gpus().saturating_sub(leaving) >= job.spec.gpus
    }

    /// What taking elastic `job`'s parts on `nodes` loses, in GPU-ms: the
    /// leaving GPUs' work since the last save, as any victim's, and the
    /// restart every GPU that stays makes from that save
    /// ([`Config::restart_cost`]).
    pub(super) fn shrink_cost(&self, job: &Job, nodes: impl IntoIterator<Item = NodeId>) -> u128 {
        let run = job.run.as_ref().expect("a shrunk job runs");
        let leaving: u32 = nodes
            .into_iter()
            .filter_map(|node| run.alloc.iter().find(|(n, _)| *n == node))
            .map(|(_, mask)| mask.count_ones())
            .sum();
        let taken = self.shrunk.get(&job.spec.id).copied().unwrap_or(0);
        let staying = run.active_gpus().saturating_sub(taken + leaving);
        let since_save = self.now.saturating_since(run.progress_saved_at()).0 as u128;
        leaving as u128 * since_save + staying as u128 * self.config.restart_cost.0 as u128
    }

    /// Gives elastic `job`'s parts on `nodes` their notice: the job goes
    /// on on the rest.
    pub(super) fn shrink(&mut self, job: JobId, nodes: &[NodeId], reason: DrainReason) {
        let j = &self.state.jobs[&job];
        debug_assert!(self.parts_may_leave(j, nodes.iter().copied()), "{job} cannot spare {nodes:?}");
        let run = j.run.as_ref().expect("a shrunk job runs");
        let mut gpus = 0;
        for &node in nodes {
            gpus += run.alloc.iter().find(|(n, _)| *n == node).map_or(0, |(_, m)| m.count_ones());
            self.shrunk_parts.insert((job, node));
        }
        *self.shrunk.entry(job).or_insert(0) += gpus;
        self.preemptible_active[run.model.0 as usize] -= gpus;
        self.plan.shrinks.push(Shrink {
            job,
            attempt: run.attempt,
            nodes: nodes.to_vec(),
            notice_at: self.now,
            deadline: self.now + self.config.drain_window,
            reason,
        });
    }

    /// After a walk that looked at every queued job (each started, or
    /// found unable to), elastic jobs below their most GPUs take whole
    /// free nodes: none kept for a waiting job, none held, within the
    /// caps. So a grow never takes capacity a queued job of any tier could
    /// start on. Jobs placed in this pass grow at once; a running job
    /// only `min_runtime` after its nodes last changed, so it is not grown
    /// into capacity an on-demand job is about to take, nor restarted
    /// every pass. Between jobs, fair share: the tenant with the lowest
    /// key takes the next node.
    pub(super) fn grow_elastic(&mut self) {
        let state = self.state;
        if state.growable.is_empty() && self.placed_elastic.is_empty() {
            return;
        }
        // No whole free node of any model: nothing to grow into, and no
        // look at the jobs that want one (a full cluster's every pass).
        if !state.models().any(|(m, model)| self.bucket_first(m, model.gpus_per_node as usize).is_some()) {
            return;
        }
        let tier = Tier::Preemptible;
        // Jobs placed in this pass, by their placement; then running jobs.
        let mut wanting: BinaryHeap<Reverse<(ShareKey, QueueKey, Option<usize>)>> = BinaryHeap::new();
        for &i in &self.placed_elastic {
            let spec = &state.jobs[&self.plan.placements[i].job].spec;
            let key = state.fair.key(tier, spec.tenant, self.extra_rate(tier, spec.tenant));
            wanting.push(Reverse((key, crate::state::queue_key(spec), Some(i))));
        }
        for id in &state.growable {
            let job = &state.jobs[id];
            let run = job.run.as_ref().expect("growable jobs run");
            let settled = self.now.saturating_since(run.resized_at()) >= self.config.min_runtime;
            if settled && !self.victims.contains(id) && !self.shrunk.contains_key(id) {
                let key = state.fair.key(tier, job.spec.tenant, self.extra_rate(tier, job.spec.tenant));
                wanting.push(Reverse((key, crate::state::queue_key(&job.spec), None)));
            }
        }
        let mut grown: BTreeMap<JobId, Vec<(NodeId, u64)>> = BTreeMap::new();
        while let Some(Reverse((_, (_, _, id), placed))) = wanting.pop() {
            let job = &state.jobs[&id];
            let (model, held) = match placed {
                Some(i) => {
                    let p = &self.plan.placements[i];
                    (p.model, p.alloc.iter().map(|(_, m)| m.count_ones()).sum::<u32>())
                }
                None => {
                    let run = job.run.as_ref().expect("growable jobs run");
                    (run.model, run.gpus())
                }
            };
            let per_node = state.models[model.0 as usize].gpus_per_node;
            let more: u32 = grown.get(&id).map_or(0, |g| g.len() as u32 * per_node as u32);
            if held + more + per_node as u32 > job.spec.most_gpus() {
                continue;
            }
            let unit = JobSpec { gpus: per_node as u32, max_gpus: None, ..job.spec.clone() };
            if !self.cap_allows(&unit, model) {
                continue;
            }
            let Some(node) = self.bucket_first(model, per_node as usize) else { continue };
            let mask = full_mask(per_node);
            let t = self.masks(node);
            self.touch(node, Touched { used: t.used | mask, held: t.held });
            self.count(&unit, model);
            grown.entry(id).or_default().push((node, mask));
            if held + more + 2 * per_node as u32 <= job.spec.most_gpus() {
                let key = state.fair.key(tier, job.spec.tenant, self.extra_rate(tier, job.spec.tenant));
                wanting.push(Reverse((key, crate::state::queue_key(&job.spec), placed)));
            }
        }
        for (id, alloc) in grown {
            match self.placed_elastic.iter().find(|&&i| self.plan.placements[i].job == id) {
                Some(&i) => self.plan.placements[i].alloc.extend(alloc),
                None => {
                    let attempt = state.jobs[&id].run.as_ref().expect("growable jobs run").attempt;
                    self.plan.grows.push(Grow { job: id, attempt, alloc });
                }
            }
        }
    }
}
