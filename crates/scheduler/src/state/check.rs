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
                        .queues
                        .get(&QueueClass::of(&job.spec))
                        .is_some_and(|q| q.contains(&(job.spec.submitted_at, *id)));
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
                    if run.gpus() != job.spec.gpus {
                        return Err(format!("{id} holds {} GPUs, wants {}", run.gpus(), job.spec.gpus));
                    }
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
                        Tier::Preemptible if job.phase == Phase::Running => u.2 += run.gpus(),
                        Tier::Preemptible => {}
                    }
                }
            }
        }
        if queued != self.queued_by_tier {
            return Err(format!("queued counts {:?} != {:?}", self.queued_by_tier, queued));
        }
        let queue_len: usize = self.queues.values().map(BTreeSet::len).sum();
        let queued_phase = self.jobs.values().filter(|j| j.phase == Phase::Queued).count();
        if queue_len != queued_phase || self.queues.values().any(BTreeSet::is_empty) {
            return Err("queues hold jobs that are not queued".into());
        }
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
                    if omask & mask != 0 && !hold.waiting_on.contains(&other) {
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
            if hold.waiting_on.is_empty() != self.ready_holds.contains(id) {
                return Err(format!("hold for {id}: readiness out of step"));
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
                .map(|n| n.gpus as u32)
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
            let singles: usize =
                self.nodes.iter().filter(|n| n.model.0 as usize == i).map(|n| n.single_keys.len()).sum();
            if self.index[i].singles_len() != singles {
                return Err(format!("{} single-victim index has stale entries", m.name));
            }
        }
        let reserved_use_nonzero: BTreeMap<_, _> =
            self.reserved_used.iter().filter(|(_, v)| **v > 0).map(|(k, v)| (*k, *v)).collect();
        if reserved_use_nonzero != reserved_use {
            return Err("reserved usage out of step".into());
        }
        Ok(())
    }
}
