//! Applying a plan: every part checked against the live state first
//! (fencing, free GPUs, the tier caps over the whole plan), then all of
//! it committed, or none.

use std::collections::{BTreeMap, BTreeSet};

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, TenantId, Tier, Time};

use rustc_hash::FxHashMap;

use crate::error::ApplyError;
use crate::plan::{Plan, RequeueReason};

use super::*;

impl State {
    // ---- applying a plan ----------------------------------------------

    /// Checks `plan` against the live state, then commits all of it, or
    /// nothing if any part is no longer valid.
    pub fn apply(&mut self, plan: &Plan) -> Result<(), ApplyError> {
        self.check_plan(plan)?;
        let now = plan.now;
        self.fair_tick(now);
        for &node in &plan.lost_nodes {
            let _ = self.lose_node(node);
        }
        // Nodes whose GPUs change, indexed again once at the end (a pass
        // often places several jobs on one node).
        let mut changed: Vec<NodeId> = Vec::with_capacity(plan.placements.len());
        for drain in &plan.drains {
            let job = self.jobs.get_mut(&drain.job).expect("checked");
            job.phase = Phase::Draining;
            job.notice =
                Some(Notice { notice_at: drain.notice_at, deadline: drain.deadline, reason: drain.reason });
            let run = job.run.as_ref().expect("checked");
            let (model, gpus, tenant) = (run.model, run.gpus(), job.spec.tenant);
            changed.extend(run.alloc.iter().map(|(n, _)| *n));
            self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
            if let DrainReason::NodeDrain { node } = drain.reason {
                self.pending_node_drains.remove(&node);
            }
            match drain.reason {
                DrainReason::FairShare { .. } => self.fair_share_draining += 1,
                DrainReason::Quota { .. } => self.quota_draining += 1,
                _ => {}
            }
        }
        // A drained node is done once none of its preemptible jobs runs on
        // without a notice (one with no such jobs is done at once).
        let pending = std::mem::take(&mut self.pending_node_drains);
        self.pending_node_drains = pending
            .into_iter()
            .filter(|&n| {
                self.nodes[n.0 as usize].jobs().any(|j| {
                    let job = &self.jobs[&j];
                    job.spec.tier == Tier::Preemptible && job.phase == Phase::Running
                })
            })
            .collect();
        // The jobs that leave the queue, taken out together after the loops.
        let mut leaving = Vec::with_capacity(plan.preemptions.len() + plan.placements.len());
        for p in &plan.preemptions {
            let job = self.jobs.get_mut(&p.preemptor).expect("checked");
            leaving.push(queue_place(&job.spec));
            job.phase = Phase::Holding;
            let (tier, tenant, gpus) = (job.spec.tier, job.spec.tenant, job.spec.gpus);
            // Held GPUs count against the tier's caps from now on.
            self.adjust_usage(tier, tenant, p.model, gpus as i64);
            for &(node, mask) in &p.hold {
                self.nodes[node.0 as usize].held |= mask;
                changed.push(node);
            }
            for &victim in &p.victims {
                self.victim_of.insert(victim, p.preemptor);
            }
            let waiting_on: BTreeSet<JobId> = p.victims.iter().copied().collect();
            if waiting_on.is_empty() {
                self.ready_holds.insert(p.preemptor);
            }
            self.holds.insert(
                p.preemptor,
                Hold { job: p.preemptor, model: p.model, alloc: p.hold.clone(), waiting_on, staged: None },
            );
        }
        // What each tenant started, µ$ per hour: its usage moves once, after
        // every start.
        let mut started: FxHashMap<(Tier, TenantId), u64> = FxHashMap::default();
        for p in &plan.placements {
            if p.from_hold {
                let hold = self.holds.remove(&p.job).expect("checked");
                self.ready_holds.remove(&p.job);
                for &(node, mask) in &hold.alloc {
                    self.nodes[node.0 as usize].held &= !mask;
                }
            }
            let job = self.jobs.get_mut(&p.job).expect("checked");
            if !p.from_hold {
                leaving.push(queue_place(&job.spec));
            }
            job.phase = Phase::Running;
            job.attempt = p.attempt;
            let rate = self.models[p.model.0 as usize].rate.saturating_mul(job.spec.gpus as u64);
            job.run = Some(Run {
                attempt: p.attempt,
                model: p.model,
                alloc: p.alloc.clone(),
                started_at: now,
                last_checkpoint_at: None,
                rate,
            });
            let (tier, tenant, gpus) = (job.spec.tier, job.spec.tenant, job.spec.gpus);
            *started.entry((tier, tenant)).or_insert(0) += rate;
            self.queued_by_tier[tier.rank() as usize] -= 1;
            if !p.from_hold {
                self.adjust_usage(tier, tenant, p.model, gpus as i64);
            }
            for &(node, mask) in &p.alloc {
                let n = &mut self.nodes[node.0 as usize];
                n.used |= mask;
                n.jobs.push((p.job, mask));
                changed.push(node);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        for node in changed {
            self.reindex(node);
        }
        self.queue_remove_all(&mut leaving);
        for ((tier, tenant), rate) in started {
            // Usage moves now (the scale was made safe for `now` above).
            self.fair.start(tier, tenant, rate, now);
            self.rekey(tier, tenant);
        }
        self.keep_earmarks(plan);
        if cfg!(debug_assertions) {
            self.unchecked += 1;
            if self.unchecked >= (self.jobs.len() as u64 / 1_000).max(1) {
                self.unchecked = 0;
                debug_assert!(self.sanity_check().is_ok(), "{:?}", self.sanity_check());
            }
        }
        Ok(())
    }

    pub(super) fn check_plan(&self, plan: &Plan) -> Result<(), ApplyError> {
        let lost: BTreeSet<NodeId> = plan.lost_nodes.iter().copied().collect();
        for &node in &lost {
            match self.node(node) {
                Some(n) if n.status != NodeStatus::Lost => {}
                _ => return Err(ApplyError::Stale(format!("node {node} cannot be lost"))),
            }
        }
        for r in &plan.requeues {
            let RequeueReason::NodeLost(node) = r.reason;
            let job = self.live_run(r.job, r.attempt)?;
            if !lost.contains(&node) || !job.run.as_ref().unwrap().alloc.iter().any(|(n, _)| *n == node) {
                return Err(ApplyError::Stale(format!("requeue of {} not on a lost node", r.job)));
            }
        }
        let mut drained = BTreeSet::new();
        for d in &plan.drains {
            let job = self.live_run(d.job, d.attempt)?;
            if job.spec.tier != Tier::Preemptible {
                return Err(ApplyError::Invariant(format!(
                    "drain of {} which is {}, not preemptible",
                    d.job, job.spec.tier
                )));
            }
            if job.phase != Phase::Running || !drained.insert(d.job) {
                return Err(ApplyError::Stale(format!("{} is already draining", d.job)));
            }
            if job.run.as_ref().expect("fenced").alloc.iter().any(|(n, _)| lost.contains(n)) {
                return Err(ApplyError::Invariant(format!("drain of {} on a node this plan loses", d.job)));
            }
            if d.deadline < d.notice_at {
                return Err(ApplyError::Invariant(format!("drain of {}: deadline before notice", d.job)));
            }
        }
        // GPUs each node gives away in this plan; any overlap is a double booking.
        let mut claimed: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut claim = |node: NodeId, mask: u64, what: JobId| -> Result<(), ApplyError> {
            let c = claimed.entry(node).or_insert(0);
            if *c & mask != 0 {
                return Err(ApplyError::Invariant(format!("GPUs on {node} given twice (to {what})")));
            }
            *c |= mask;
            Ok(())
        };
        let mut caps = CapCheck::default();
        for d in &plan.drains {
            // Drained GPUs no longer count against the reclaim limit.
            let run = self.jobs[&d.job].run.as_ref().expect("checked");
            *caps.preemptible.entry(run.model).or_insert(0) -= run.gpus() as i64;
        }
        for p in &plan.preemptions {
            let job = self.job_checked(p.preemptor).map_err(|e| ApplyError::Stale(e.to_string()))?;
            if job.phase != Phase::Queued || job.spec.tier == Tier::Preemptible {
                return Err(ApplyError::Invariant(format!("{} cannot preempt", p.preemptor)));
            }
            for victim in &p.victims {
                let ok = plan
                    .drains
                    .iter()
                    .any(|d| d.job == *victim && d.reason == DrainReason::Preempted { by: p.preemptor });
                if !ok {
                    return Err(ApplyError::Invariant(format!("victim {victim} without its drain")));
                }
            }
            let victim_mask = |node: NodeId| -> u64 {
                p.victims
                    .iter()
                    .flat_map(|v| self.jobs[v].run.as_ref().unwrap().alloc.iter())
                    .filter(|(n, _)| *n == node)
                    .fold(0, |acc, (_, m)| acc | m)
            };
            let mut total = 0;
            for &(node, mask) in &p.hold {
                let n = self.usable_node(node, p.model, &lost)?;
                if n.held & mask != 0 {
                    return Err(ApplyError::Invariant(format!("hold on {node} overlaps another hold")));
                }
                if mask & !n.full_mask() != 0 || mask & n.used & !victim_mask(node) != 0 {
                    return Err(ApplyError::Invariant(format!("hold on {node} takes GPUs of a non-victim")));
                }
                if mask & n.out != 0 {
                    return Err(ApplyError::Invariant(format!("hold on {node} takes GPUs out of service")));
                }
                claim(node, mask, p.preemptor)?;
                total += mask.count_ones();
            }
            if total != job.spec.gpus {
                return Err(ApplyError::Invariant(format!("hold for {} has {total} GPUs", p.preemptor)));
            }
            caps.check(self, &job.spec, p.model, plan.now)?;
        }
        for p in &plan.placements {
            let job = self.job_checked(p.job).map_err(|e| ApplyError::Stale(e.to_string()))?;
            if p.attempt.0 != job.attempt.0 + 1 {
                return Err(ApplyError::Stale(format!("{}: attempt {} is not next", p.job, p.attempt)));
            }
            match (job.phase, p.from_hold) {
                (Phase::Queued, false) => {}
                (Phase::Holding, true) => {
                    let hold = &self.holds[&p.job];
                    if !self.ready_holds.contains(&p.job) || hold.alloc != p.alloc {
                        return Err(ApplyError::Stale(format!("{}: hold not ready", p.job)));
                    }
                }
                _ => return Err(ApplyError::Stale(format!("{} is not waiting to start", p.job))),
            }
            if job.spec.gpu_model.is_some_and(|m| m != p.model) {
                return Err(ApplyError::Invariant(format!("{} placed on the wrong gpu model", p.job)));
            }
            let per_node = self.models[p.model.0 as usize].gpus_per_node;
            let mut total = 0;
            for &(node, mask) in &p.alloc {
                let n = self.usable_node(node, p.model, &lost)?;
                let own_hold = if p.from_hold { mask } else { 0 };
                if mask & !n.full_mask() != 0
                    || n.used & mask != 0
                    || n.held & mask & !own_hold != 0
                    || n.out & mask != 0
                {
                    return Err(ApplyError::Invariant(format!("{}: GPUs on {node} are not free", p.job)));
                }
                if !p.from_hold {
                    claim(node, mask, p.job)?;
                }
                total += mask.count_ones();
            }
            let whole_nodes = p.alloc.iter().all(|(_, m)| m.count_ones() == per_node as u32);
            if total != job.spec.gpus || (p.alloc.len() > 1 && !whole_nodes) || p.alloc.is_empty() {
                return Err(ApplyError::Invariant(format!("{}: placement has the wrong shape", p.job)));
            }
            if !p.from_hold {
                caps.check(self, &job.spec, p.model, plan.now)?;
            }
        }
        Ok(())
    }

    pub(super) fn live_run(&self, id: JobId, attempt: Attempt) -> Result<&Job, ApplyError> {
        self.fence(id, attempt).map_err(|e| ApplyError::Stale(e.to_string()))?;
        Ok(&self.jobs[&id])
    }

    pub(super) fn usable_node(
        &self,
        node: NodeId,
        model: GpuModelId,
        lost: &BTreeSet<NodeId>,
    ) -> Result<&Node, ApplyError> {
        match self.node(node) {
            Some(n) if n.status == NodeStatus::Up && n.model == model && !lost.contains(&node) => Ok(n),
            _ => Err(ApplyError::Stale(format!("node {node} cannot take work"))),
        }
    }
}

/// The tier caps, checked over a whole plan: what it starts or holds adds
/// up before it is compared with the limits.
#[derive(Default)]
struct CapCheck {
    on_demand: BTreeMap<GpuModelId, u32>,
    reserved: BTreeMap<(TenantId, GpuModelId), u32>,
    preemptible: BTreeMap<GpuModelId, i64>,
}

impl CapCheck {
    fn check(
        &mut self,
        state: &State,
        spec: &JobSpec,
        model: GpuModelId,
        now: Time,
    ) -> Result<(), ApplyError> {
        let m = &state.models[model.0 as usize];
        let gpus = spec.gpus;
        match spec.tier {
            Tier::OnDemand => {
                let d = self.on_demand.entry(model).or_insert(0);
                *d += gpus;
                let cap = m.capacity.saturating_sub(state.reserved_total(model, now));
                if m.on_demand_used + *d > cap {
                    return Err(ApplyError::Invariant(format!(
                        "{}: on-demand would use GPUs reserved for others",
                        spec.id
                    )));
                }
            }
            Tier::Reserved => {
                let key = (spec.tenant, model);
                let d = self.reserved.entry(key).or_insert(0);
                *d += gpus;
                if state.reserved_used(key.0, key.1) + *d > state.reserved_capacity(key.0, key.1, now) {
                    return Err(ApplyError::Invariant(format!(
                        "{}: reserved usage would exceed the reservation",
                        spec.id
                    )));
                }
            }
            Tier::Preemptible => {
                let d = self.preemptible.entry(model).or_insert(0);
                *d += gpus as i64;
                if m.preemptible_limit.is_some_and(|limit| m.preemptible_active as i64 + *d > limit as i64) {
                    return Err(ApplyError::Invariant(format!(
                        "{}: preemptible usage would exceed the reclaim limit",
                        spec.id
                    )));
                }
            }
        }
        Ok(())
    }
}
