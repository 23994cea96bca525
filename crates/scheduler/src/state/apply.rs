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
            let (model, gpus, tenant) = (run.model, run.active_gpus(), job.spec.tenant);
            let elastic = job.spec.is_elastic();
            changed.extend(run.alloc.iter().map(|(n, _)| *n));
            self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
            if elastic {
                self.growable.remove(&drain.job);
            }
            if let DrainReason::NodeDrain { node } = drain.reason {
                self.pending_node_drains.remove(&node);
            }
            match drain.reason {
                DrainReason::FairShare { .. } => self.fair_share_draining += 1,
                DrainReason::Quota { .. } => self.quota_draining += 1,
                _ => {}
            }
        }
        for shrink in &plan.shrinks {
            let job = self.jobs.get_mut(&shrink.job).expect("checked");
            let (tenant, notice) = (
                job.spec.tenant,
                Notice { notice_at: shrink.notice_at, deadline: shrink.deadline, reason: shrink.reason },
            );
            let run = job.run.as_mut().expect("checked");
            let mut gpus = 0;
            for &node in &shrink.nodes {
                gpus += run.alloc.iter().find(|(n, _)| *n == node).expect("checked").1.count_ones();
                run.resized_mut().leaving.push((node, notice));
                changed.push(node);
            }
            run.resized_mut().at = plan.now;
            let model = run.model;
            self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
            self.growable.remove(&shrink.job);
        }
        // A drained node is done once none of its preemptible jobs runs on
        // there without a notice (one with no such jobs is done at once).
        let pending = std::mem::take(&mut self.pending_node_drains);
        self.pending_node_drains = pending
            .into_iter()
            .filter(|&n| {
                self.nodes[n.0 as usize].jobs().any(|j| {
                    let job = &self.jobs[&j];
                    job.spec.tier == Tier::Preemptible
                        && job.phase == Phase::Running
                        && !job.run.as_ref().is_some_and(|r| r.is_leaving(n))
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
            for &part in &p.parts {
                self.part_victim_of.insert(part, p.preemptor);
            }
            let waiting_on: BTreeSet<JobId> = p.victims.iter().copied().collect();
            let waiting_parts: BTreeSet<(JobId, NodeId)> = p.parts.iter().copied().collect();
            if waiting_on.is_empty() && waiting_parts.is_empty() {
                self.ready_holds.insert(p.preemptor);
            }
            self.holds.insert(
                p.preemptor,
                Hold {
                    job: p.preemptor,
                    model: p.model,
                    alloc: p.hold.clone(),
                    waiting_on,
                    waiting_parts,
                    staged: None,
                },
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
            let run = Run {
                attempt: p.attempt,
                model: p.model,
                alloc: p.alloc.clone(),
                started_at: now,
                last_checkpoint_at: None,
                gpu_rate: self.models[p.model.0 as usize].rate,
                resized: None,
            };
            let gpus: u32 = p.alloc.iter().map(|(_, m)| m.count_ones()).sum();
            let (tier, tenant, rate) =
                (job.spec.tier, job.spec.tenant, run.gpu_rate.saturating_mul(gpus as u64));
            let elastic = job.spec.is_elastic();
            job.run = Some(run);
            if elastic {
                self.regrow(p.job);
            }
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
        for g in &plan.grows {
            let job = self.jobs.get_mut(&g.job).expect("checked");
            let (tier, tenant) = (job.spec.tier, job.spec.tenant);
            let run = job.run.as_mut().expect("checked");
            let mut gpus = 0;
            for &(node, mask) in &g.alloc {
                run.alloc.push((node, mask));
                run.resized_mut().joined.push((node, now));
                gpus += mask.count_ones();
                let n = &mut self.nodes[node.0 as usize];
                n.used |= mask;
                n.jobs.push((g.job, mask));
                changed.push(node);
            }
            run.resized_mut().at = now;
            let (model, rate) = (run.model, run.gpu_rate.saturating_mul(gpus as u64));
            self.adjust_usage(tier, tenant, model, gpus as i64);
            *started.entry((tier, tenant)).or_insert(0) += rate;
            self.regrow(g.job);
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
            if self.unchecked >= (self.jobs.len() as u64 / 50).max(1) {
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
            *caps.preemptible.entry(run.model).or_insert(0) -= run.active_gpus() as i64;
        }
        let shrunk = self.check_shrinks(plan, &lost, &drained, &mut caps)?;
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
            for (victim, node) in &p.parts {
                let ok = plan.shrinks.iter().any(|s| {
                    s.job == *victim
                        && s.nodes.contains(node)
                        && s.reason == DrainReason::Preempted { by: p.preemptor }
                });
                if !ok {
                    return Err(ApplyError::Invariant(format!(
                        "part of {victim} on {node} without its shrink"
                    )));
                }
            }
            let victim_mask = |node: NodeId| -> u64 {
                let whole = p
                    .victims
                    .iter()
                    .flat_map(|v| self.jobs[v].run.as_ref().unwrap().alloc.iter())
                    .filter(|(n, _)| *n == node)
                    .fold(0, |acc, (_, m)| acc | m);
                let parts = p
                    .parts
                    .iter()
                    .filter(|(_, n)| *n == node)
                    .flat_map(|(v, _)| self.jobs[v].run.as_ref().unwrap().alloc.iter())
                    .filter(|(n, _)| *n == node)
                    .fold(0, |acc, (_, m)| acc | m);
                whole | parts
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
            let size_ok = match job.spec.max_gpus {
                None => total == job.spec.gpus,
                Some(max) => (job.spec.gpus..=max).contains(&total) && whole_nodes,
            };
            if !size_ok || (p.alloc.len() > 1 && !whole_nodes) || p.alloc.is_empty() {
                return Err(ApplyError::Invariant(format!("{}: placement has the wrong shape", p.job)));
            }
            if !p.from_hold {
                caps.check_gpus(self, &job.spec, p.model, total, plan.now)?;
            }
        }
        self.check_grows(plan, &lost, &drained, &shrunk, &mut claim, &mut caps)?;
        Ok(())
    }

    /// Shrinks: each of a running elastic job's nodes but its first, not
    /// leaving already, and what stays no fewer than its fewest GPUs.
    /// Returns the jobs shrunk.
    fn check_shrinks(
        &self,
        plan: &Plan,
        lost: &BTreeSet<NodeId>,
        drained: &BTreeSet<JobId>,
        caps: &mut CapCheck,
    ) -> Result<BTreeSet<JobId>, ApplyError> {
        // GPUs each job gives up over the plan's shrinks, and the nodes.
        let mut shrunk: BTreeMap<JobId, (u32, BTreeSet<NodeId>)> = BTreeMap::new();
        for s in &plan.shrinks {
            let job = self.live_run(s.job, s.attempt)?;
            let run = job.run.as_ref().expect("fenced");
            if job.phase != Phase::Running || drained.contains(&s.job) {
                return Err(ApplyError::Stale(format!("{} is draining", s.job)));
            }
            if !job.spec.is_elastic() || job.spec.tier != Tier::Preemptible {
                return Err(ApplyError::Invariant(format!("shrink of {}, which is not elastic", s.job)));
            }
            if run.alloc.iter().any(|(n, _)| lost.contains(n)) || s.deadline < s.notice_at {
                return Err(ApplyError::Invariant(format!(
                    "shrink of {}: on a lost node, or its deadline first",
                    s.job
                )));
            }
            let (taken, nodes) = shrunk.entry(s.job).or_default();
            let mut gpus = 0;
            for node in &s.nodes {
                let Some((_, mask)) = run.alloc.iter().find(|(n, _)| n == node) else {
                    return Err(ApplyError::Stale(format!("shrink of {}: not on {node}", s.job)));
                };
                if *node == run.first_node() || run.is_leaving(*node) || !nodes.insert(*node) {
                    return Err(ApplyError::Invariant(format!(
                        "shrink of {}: its first node never leaves alone, nor a node twice ({node})",
                        s.job
                    )));
                }
                gpus += mask.count_ones();
            }
            *taken += gpus;
            if s.nodes.is_empty() || run.active_gpus() - *taken < job.spec.gpus {
                return Err(ApplyError::Invariant(format!("shrink of {} below its fewest GPUs", s.job)));
            }
            *caps.preemptible.entry(run.model).or_insert(0) -= gpus as i64;
        }
        Ok(shrunk.into_keys().collect())
    }

    /// Grows: a running elastic job, not shrinking, onto whole free nodes
    /// of its model, to at most its most GPUs, within the caps.
    fn check_grows(
        &self,
        plan: &Plan,
        lost: &BTreeSet<NodeId>,
        drained: &BTreeSet<JobId>,
        shrunk: &BTreeSet<JobId>,
        claim: &mut impl FnMut(NodeId, u64, JobId) -> Result<(), ApplyError>,
        caps: &mut CapCheck,
    ) -> Result<(), ApplyError> {
        let mut grown = BTreeSet::new();
        for g in &plan.grows {
            let job = self.live_run(g.job, g.attempt)?;
            let run = job.run.as_ref().expect("fenced");
            let Some(max) = job.spec.max_gpus else {
                return Err(ApplyError::Invariant(format!("grow of {}, which is not elastic", g.job)));
            };
            if job.phase != Phase::Running
                || !run.leaving().is_empty()
                || drained.contains(&g.job)
                || shrunk.contains(&g.job)
                || !grown.insert(g.job)
            {
                return Err(ApplyError::Stale(format!(
                    "grow of {}: draining, shrinking, or grown twice",
                    g.job
                )));
            }
            let per_node = self.models[run.model.0 as usize].gpus_per_node as u32;
            let mut total = 0;
            for &(node, mask) in &g.alloc {
                let n = self.usable_node(node, run.model, lost)?;
                if mask != n.full_mask() || n.free_mask() != mask || run.alloc.iter().any(|(a, _)| *a == node)
                {
                    return Err(ApplyError::Invariant(format!(
                        "grow of {}: {node} is not a whole free node",
                        g.job
                    )));
                }
                claim(node, mask, g.job)?;
                total += per_node;
            }
            if g.alloc.is_empty() || run.gpus() + total > max {
                return Err(ApplyError::Invariant(format!("grow of {} past its most GPUs", g.job)));
            }
            caps.check_gpus(self, &job.spec, run.model, total, plan.now)?;
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
        self.check_gpus(state, spec, model, spec.gpus, now)
    }

    /// A job of `spec` takes `gpus` more GPUs of `model`.
    fn check_gpus(
        &mut self,
        state: &State,
        spec: &JobSpec,
        model: GpuModelId,
        gpus: u32,
        now: Time,
    ) -> Result<(), ApplyError> {
        let m = &state.models[model.0 as usize];
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
