//! `State::sanity_check`: everything the indices and counters cache,
//! recomputed from the jobs and nodes, and the invariants checked.

use std::collections::{BTreeMap, BTreeSet};

use ebb_core::{GpuModelId, JobId, TenantId, Tier};

use super::*;

impl State {
    // ---- invariants ----------------------------------------------------

    /// Recomputes everything the indices and counters cache and checks the
    /// invariants. O(cluster); tests call it after every step.
    pub fn sanity_check(&self) -> Result<(), String> {
        let mut used = vec![0u64; self.nodes.len()];
        let mut held = vec![0u64; self.nodes.len()];
        let mut on_node: Vec<Vec<(JobId, u64)>> = vec![Vec::new(); self.nodes.len()];
        let mut model_use = vec![(0u32, 0u32, 0u32); self.models.len()];
        let mut reserved_use: BTreeMap<(TenantId, GpuModelId), u32> = BTreeMap::new();
        let mut queued = [0u32; 3];
        for (id, job) in &self.jobs {
            if job.spec.id != *id {
                return Err(format!("{id} stored under the wrong id"));
            }
            match job.phase {
                Phase::Queued | Phase::Holding => {
                    queued[job.spec.tier.rank() as usize] += 1;
                    if job.run.is_some() || job.notice.is_some() {
                        return Err(format!("queued {id} has a run"));
                    }
                    let in_queue = self
                        .tenant_queues
                        .get(&(job.spec.tier, job.spec.tenant))
                        .and_then(|q| q.classes.get(&QueueClass::of(&job.spec)))
                        .is_some_and(|q| q.contains(&queue_key(&job.spec)));
                    if in_queue != (job.phase == Phase::Queued) {
                        return Err(format!("{id} ({:?}) queue membership wrong", job.phase));
                    }
                    if self.holds.contains_key(id) != (job.phase == Phase::Holding) {
                        return Err(format!("{id} ({:?}) hold membership wrong", job.phase));
                    }
                }
                Phase::Running | Phase::Draining => {
                    let run = job.run.as_ref().ok_or_else(|| format!("running {id} has no run"))?;
                    if run.attempt != job.attempt {
                        return Err(format!("{id} runs attempt {} but is at {}", run.attempt, job.attempt));
                    }
                    if (job.phase == Phase::Draining) != job.notice.is_some() {
                        return Err(format!("{id} notice does not match its phase"));
                    }
                    if job.phase == Phase::Draining && job.spec.tier != Tier::Preemptible {
                        return Err(format!("{id} is {} and draining", job.spec.tier));
                    }
                    self.check_parts(job, run)?;
                    for &(node, mask) in &run.alloc {
                        let n = node.0 as usize;
                        if used[n] & mask != 0 {
                            return Err(format!("GPU on {node} held by two attempts ({id})"));
                        }
                        used[n] |= mask;
                        on_node[n].push((*id, mask));
                        if self.nodes[n].model != run.model {
                            return Err(format!("{id} runs on a node of another model"));
                        }
                    }
                    let u = &mut model_use[run.model.0 as usize];
                    match job.spec.tier {
                        Tier::Reserved => {
                            u.0 += run.gpus();
                            *reserved_use.entry((job.spec.tenant, run.model)).or_insert(0) += run.gpus();
                        }
                        Tier::OnDemand => u.1 += run.gpus(),
                        Tier::Preemptible if job.phase == Phase::Running => u.2 += run.active_gpus(),
                        Tier::Preemptible => {}
                    }
                }
            }
        }
        if queued != self.queued_by_tier {
            return Err(format!("queued counts {:?} != {:?}", self.queued_by_tier, queued));
        }
        let queues = || self.tenant_queues.values().flat_map(|q| q.classes.values());
        let queue_len: usize = queues().map(BTreeSet::len).sum();
        let queued_phase = self.jobs.values().filter(|j| j.phase == Phase::Queued).count();
        if queue_len != queued_phase || queues().any(BTreeSet::is_empty) {
            return Err("queues hold jobs that are not queued".into());
        }
        self.check_fair()?;
        for (id, hold) in &self.holds {
            let job = &self.jobs[id];
            let total: u32 = hold.alloc.iter().map(|(_, m)| m.count_ones()).sum();
            if total != job.spec.gpus {
                return Err(format!("hold for {id} has {total} GPUs"));
            }
            for &(node, mask) in &hold.alloc {
                let n = node.0 as usize;
                if held[n] & mask != 0 {
                    return Err(format!("GPU on {node} held for two jobs"));
                }
                held[n] |= mask;
                for &(other, omask) in &on_node[n] {
                    let waited =
                        hold.waiting_on.contains(&other) || hold.waiting_parts.contains(&(other, node));
                    if omask & mask != 0 && !waited {
                        return Err(format!("held GPU on {node} given to {other}, not {id}"));
                    }
                }
            }
            for victim in &hold.waiting_on {
                let v = self.jobs.get(victim).ok_or_else(|| format!("{id} waits on gone {victim}"))?;
                if v.phase != Phase::Draining || self.victim_of.get(victim) != Some(id) {
                    return Err(format!("{id} waits on {victim} which is not draining for it"));
                }
            }
            for part in &hold.waiting_parts {
                let leaving =
                    self.jobs.get(&part.0).and_then(|j| j.run.as_ref()).is_some_and(|r| r.is_leaving(part.1));
                if !leaving || self.part_victim_of.get(part) != Some(id) {
                    return Err(format!(
                        "{id} waits on {}'s part on {} which is not leaving for it",
                        part.0, part.1
                    ));
                }
            }
            if (hold.waiting_on.is_empty() && hold.waiting_parts.is_empty()) != self.ready_holds.contains(id)
            {
                return Err(format!("hold for {id}: readiness out of step"));
            }
            if hold.staged.is_some_and(|a| a.0 != job.attempt.0 + 1 || hold.alloc.len() != 1) {
                return Err(format!("hold for {id}: staged start is not its next attempt on one node"));
            }
            let u = &mut model_use[hold.model.0 as usize];
            match job.spec.tier {
                Tier::Reserved => {
                    u.0 += job.spec.gpus;
                    *reserved_use.entry((job.spec.tenant, hold.model)).or_insert(0) += job.spec.gpus;
                }
                Tier::OnDemand => u.1 += job.spec.gpus,
                Tier::Preemptible => return Err(format!("preemptible {id} holds GPUs")),
            }
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if node.used != used[i] || node.held != held[i] {
                return Err(format!("{} masks out of step", node.id));
            }
            let mut jobs = node.jobs.clone();
            jobs.sort();
            let mut expect = on_node[i].clone();
            expect.sort();
            if jobs != expect {
                return Err(format!("{} job list out of step", node.id));
            }
            let key = (node.status == NodeStatus::Up).then(|| self.index_key(node));
            if node.key != key {
                return Err(format!("{} index key out of step", node.id));
            }
            let singles = if key.is_some() { self.single_keys(node) } else { Vec::new() };
            if node.single_keys != singles {
                return Err(format!("{} single-victim keys out of step", node.id));
            }
            for (free, gpus, entry) in &singles {
                if !self.index[node.model.0 as usize].singles[*free as usize][*gpus as usize].contains(entry)
                {
                    return Err(format!("{} missing from the single-victim index", entry.2));
                }
            }
            if let Some(key) = &key {
                let index = &self.index[node.model.0 as usize];
                if !index.by_free[key.free as usize].contains(&node.id) {
                    return Err(format!("{} missing from the free index", node.id));
                }
                let buckets = &index.by_reclaimable[key.free as usize][key.reclaimable as usize];
                for (k, sum) in key.top_sums.iter().enumerate() {
                    if !buckets[k + 1].contains(&(Reverse(*sum), node.id)) {
                        return Err(format!("{} missing from the reclaimable index", node.id));
                    }
                }
            }
            if node.out & (node.used | node.held) != 0 {
                return Err(format!("{} runs or holds GPUs out of service", node.id));
            }
            if node.status == NodeStatus::Lost && (node.used != 0 || node.held != 0) {
                return Err(format!("lost {} still has work", node.id));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            let (r, od, pre) = model_use[i];
            if (m.reserved_used, m.on_demand_used, m.preemptible_active) != (r, od, pre) {
                return Err(format!("{} tier counters out of step", m.name));
            }
            let capacity: u32 = self
                .nodes
                .iter()
                .filter(|n| n.model.0 as usize == i && n.status == NodeStatus::Up)
                .map(|n| n.in_service())
                .sum();
            if capacity != m.capacity {
                return Err(format!("{} capacity out of step", m.name));
            }
            let indexed = self.index[i].len();
            let up =
                self.nodes.iter().filter(|n| n.model.0 as usize == i && n.status == NodeStatus::Up).count();
            if indexed != up {
                return Err(format!("{} index has {indexed} nodes, {up} are up", m.name));
            }
            let reclaimable: usize = self
                .nodes
                .iter()
                .filter_map(|n| n.key.as_ref().filter(|_| n.model.0 as usize == i))
                .map(|k| k.top_sums.len())
                .sum();
            if self.index[i].reclaimable_len() != reclaimable {
                return Err(format!("{} reclaimable index has stale entries", m.name));
            }
            let singles: usize =
                self.nodes.iter().filter(|n| n.model.0 as usize == i).map(|n| n.single_keys.len()).sum();
            if self.index[i].singles_len() != singles {
                return Err(format!("{} single-victim index has stale entries", m.name));
            }
        }
        if self.growable.iter().any(|id| self.jobs.get(id).is_none_or(|j| !j.spec.is_elastic())) {
            return Err("growable holds a job that is gone or rigid".into());
        }
        let parts_waited: usize = self.holds.values().map(|h| h.waiting_parts.len()).sum();
        if parts_waited != self.part_victim_of.len() {
            return Err("parts waited for out of step with their holds".into());
        }
        let reserved_use_nonzero: BTreeMap<_, _> =
            self.reserved_used.iter().filter(|(_, v)| **v > 0).map(|(k, v)| (*k, *v)).collect();
        if reserved_use_nonzero != reserved_use {
            return Err("reserved usage out of step".into());
        }
        Ok(())
    }

    /// A run's nodes against its job's range: a rigid job holds exactly
    /// its GPUs; an elastic one whole nodes within its range, its first
    /// node never leaving alone, and the nodes that stay never fewer
    /// than its fewest GPUs (unless it drains whole).
    fn check_parts(&self, job: &Job, run: &Run) -> Result<(), String> {
        let id = job.spec.id;
        let Some(max) = job.spec.max_gpus else {
            if run.gpus() != job.spec.gpus || run.resized.is_some() {
                return Err(format!("{id} holds {} GPUs, wants {}", run.gpus(), job.spec.gpus));
            }
            return Ok(());
        };
        if !(job.spec.gpus..=max).contains(&run.gpus()) {
            return Err(format!("{id} holds {} GPUs, wants {}:{max}", run.gpus(), job.spec.gpus));
        }
        let per_node = self.models[run.model.0 as usize].gpus_per_node as u32;
        if run.alloc.iter().any(|(_, m)| m.count_ones() != per_node) {
            return Err(format!("elastic {id} holds part of a node"));
        }
        let first = run.first_node();
        let others = |n: &NodeId| *n != first && run.alloc.iter().any(|(a, _)| a == n);
        if !run.leaving().iter().all(|(n, _)| others(n)) || !run.joined().iter().all(|(n, _)| others(n)) {
            return Err(format!("elastic {id}: its first node leaves or joined, or a part is not its own"));
        }
        if job.phase == Phase::Running && run.active_gpus() < job.spec.gpus {
            return Err(format!(
                "elastic {id} shrunk to {} GPUs, below its {}",
                run.active_gpus(),
                job.spec.gpus
            ));
        }
        if run.leaving().iter().any(|(_, notice)| notice.deadline < notice.notice_at) {
            return Err(format!("elastic {id}: a part's deadline is before its notice"));
        }
        let growable = job.phase == Phase::Running && run.leaving().is_empty() && run.gpus() < max;
        if growable != self.growable.contains(&id) {
            return Err(format!("elastic {id}: growable out of step"));
        }
        Ok(())
    }

    /// The queues' counts, the tiers' orders and the tenants' usage of what
    /// runs, recomputed.
    fn check_fair(&self) -> Result<(), String> {
        let mut class_jobs: FxHashMap<QueueClass, u32> = FxHashMap::default();
        for (&(tier, tenant), q) in &self.tenant_queues {
            let mut jobs = 0;
            for (class, queue) in &q.classes {
                let n = queue.len() as u32;
                jobs += n;
                *class_jobs.entry(*class).or_insert(0) += n;
                if class.tier != tier {
                    return Err(format!("{tier} queue of tenant {tenant} holds a {} class", class.tier));
                }
                for &(_, _, id) in queue {
                    if self
                        .jobs
                        .get(&id)
                        .is_none_or(|j| j.spec.tenant != tenant || QueueClass::of(&j.spec) != *class)
                    {
                        return Err(format!("{id} queued under another class or tenant"));
                    }
                }
            }
            if jobs != q.jobs || q.jobs == 0 {
                return Err(format!("{tier} queue of tenant {tenant} out of step"));
            }
        }
        if class_jobs != self.class_jobs {
            return Err("jobs per class out of step".into());
        }
        for tier in Tier::ALL {
            let classes = class_jobs.keys().filter(|c| c.tier == tier).count();
            if classes != self.classes_in_tier[tier.rank() as usize] {
                return Err(format!(
                    "{tier} classes counted {} of {classes}",
                    self.classes_in_tier[tier.rank() as usize]
                ));
            }
            let order: BTreeSet<(ShareKey, TenantId)> = self
                .tenant_queues
                .iter()
                .filter(|((t, _), _)| *t == tier)
                .map(|(&(_, tenant), q)| (q.key, tenant))
                .collect();
            if order != self.order[tier.rank() as usize] {
                return Err(format!("{tier} tenant order out of step"));
            }
        }
        for (&(tier, tenant), q) in &self.tenant_queues {
            if q.key != self.fair.key(tier, tenant, 0) {
                return Err(format!("{tier} key of tenant {tenant} not taken again after a change"));
            }
        }
        let mut running_order: BTreeSet<(ShareKey, TenantId)> = BTreeSet::new();
        for (&(tier, tenant), u) in &self.fair.usage {
            if self.keep_running && tier == Tier::Preemptible && u.rate > 0 {
                running_order.insert((self.fair.key(tier, tenant, 0), tenant));
            }
        }
        let keys: BTreeSet<(ShareKey, TenantId)> = self.running_keys.iter().map(|(&t, &k)| (k, t)).collect();
        if running_order != self.running_order || keys != running_order {
            return Err("the tenants running preemptible work out of step".into());
        }
        let draining = self
            .jobs
            .values()
            .filter(|j| j.notice.is_some_and(|n| matches!(n.reason, DrainReason::FairShare { .. })))
            .count() as u32;
        let quota_draining = self
            .jobs
            .values()
            .filter(|j| j.notice.is_some_and(|n| matches!(n.reason, DrainReason::Quota { .. })))
            .count() as u32;
        if quota_draining != self.quota_draining {
            return Err(format!("{quota_draining} draining for quotas, counted {}", self.quota_draining));
        }
        let mut used: FxHashMap<(Tier, GpuModelId, TenantId), u32> = FxHashMap::default();
        for job in self.jobs.values().filter(|j| j.spec.tier != Tier::Reserved) {
            let (model, gpus) = match (&job.run, job.phase) {
                (Some(run), Phase::Running) => (run.model, run.active_gpus()),
                (_, Phase::Holding) => (self.holds[&job.spec.id].model, job.spec.gpus),
                _ => continue,
            };
            *used.entry((job.spec.tier, model, job.spec.tenant)).or_insert(0) += gpus;
        }
        if used != self.quotas.used {
            return Err("GPUs used against quotas out of step".into());
        }
        if draining != self.fair_share_draining {
            return Err(format!(
                "{} draining for fair share, counted {}",
                draining, self.fair_share_draining
            ));
        }
        let mut running: BTreeMap<(Tier, TenantId), (u64, f64)> = BTreeMap::new();
        for job in self.jobs.values() {
            if let Some(run) = &job.run {
                let r = running.entry((job.spec.tier, job.spec.tenant)).or_default();
                for (rate, at) in run.segments() {
                    r.0 += rate;
                    r.1 += rate as f64 * self.fair.g(at);
                }
            }
        }
        for (key, u) in &self.fair.usage {
            let (rate, starts) = running.remove(key).unwrap_or_default();
            let close = (u.starts - starts).abs() <= 1e-9 * u.magnitude.max(1.0);
            if u.rate != rate || !close {
                return Err(format!(
                    "usage of tenant {} in {} out of step with its runs: rate {} of {rate}, starts {} of {starts}",
                    key.1, key.0, u.rate, u.starts
                ));
            }
        }
        if let Some((key, _)) = running.into_iter().find(|(_, (rate, _))| *rate > 0) {
            return Err(format!("tenant {} runs in {} with no usage kept", key.1, key.0));
        }
        Ok(())
    }
}
