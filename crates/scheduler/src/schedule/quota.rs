//! Quotas in the pass (`README.md`, "Quotas"): whether a tenant's job may
//! take GPUs of a model, and giving GPUs back to a tenant under its quota.
//! Each check costs O(quotas of the cohort), which operators set by hand.

use super::*;
use crate::state::Quota;

impl<'a> Pass<'a> {
    /// GPUs `tenant` uses against quotas in `tier` on `model` after this
    /// pass's decisions.
    pub(super) fn quota_used_now(&self, tier: Tier, model: GpuModelId, tenant: TenantId) -> u32 {
        self.quota_used
            .get(&(tier, model, tenant))
            .copied()
            .unwrap_or_else(|| self.state.quota_used(tenant, tier, model))
    }

    /// Why the quotas keep a job of `spec` off `model`, if they do.
    pub(super) fn quota_blocks(&self, spec: &JobSpec, model: GpuModelId) -> Option<Pending> {
        let (tier, tenant, gpus) = (spec.tier, spec.tenant, spec.gpus);
        let quotas = &self.state.quotas;
        if tier == Tier::Reserved || !quotas.governs(tier, model) {
            return None;
        }
        let own = quotas.quota(tier, model, tenant);
        let used = self.quota_used_now(tier, model, tenant);
        if own.borrowing_limit.is_some_and(|b| used + gpus > own.nominal.saturating_add(b)) {
            return Some(Pending::Quota {
                model,
                used,
                nominal: own.nominal,
                borrowing: own.borrowing_limit,
            });
        }
        // What others' quotas keep from it: the unused part of a lending
        // limit always; to a borrower, all the unused quota of a tenant
        // whose waiting work it covers (what nobody's quota covers stays
        // open to all).
        let borrowing = used + gpus > own.nominal;
        let (mut kept, mut owed, mut owner) = (0, 0, None);
        for (other, quota, _) in quotas.cohort(tier, model) {
            if other == tenant {
                continue;
            }
            let theirs = self.quota_used_now(tier, model, other);
            if borrowing && self.owed(tier, model, other, quota, theirs) {
                owed += quota.nominal - theirs;
                owner.get_or_insert(other);
            } else {
                kept += quota.kept(theirs);
            }
        }
        let i = model.0 as usize;
        let m = &self.state.models[i];
        let (in_use, cohort) = match tier {
            Tier::OnDemand => (self.on_demand_used[i], m.capacity.saturating_sub(self.reserved_total[i])),
            _ => (self.preemptible_active[i], m.capacity),
        };
        // Short of GPUs whatever the quotas say: that is not their doing.
        if in_use + gpus > cohort || in_use + gpus + kept + owed <= cohort {
            return None;
        }
        Some(match owner {
            Some(owner) => Pending::QuotaOwed { model, owner },
            None => Pending::QuotaKept { model, kept },
        })
    }

    /// Whether `owner`, using `used` of its quota on `model`, waits for a
    /// job that its quota covers there: then nobody borrows its unused
    /// quota.
    fn owed(&self, tier: Tier, model: GpuModelId, owner: TenantId, quota: Quota, used: u32) -> bool {
        used < quota.nominal
            && self.state.tenant_queues.get(&(tier, owner)).is_some_and(|q| {
                q.classes.keys().any(|c| c.model.is_none_or(|m| m == model) && used + c.gpus <= quota.nominal)
            })
    }

    /// A job of `spec` within its tenant's quota waits for GPUs of
    /// `models`: borrowers give them back. In the preemptible tier the
    /// cheapest of their jobs that make room get their drain notice (at
    /// most one reclaim a pass, none while one drains); in the on-demand
    /// tier, never preempted, it waits for their jobs to end.
    pub(super) fn reclaim_quota(&mut self, job: JobId, models: &[GpuModelId]) -> Option<Pending> {
        let state = self.state;
        let spec = &state.jobs[&job].spec;
        let (tier, tenant) = (spec.tier, spec.tenant);
        let &model = models.iter().find(|&&m| {
            state.quotas.governs(tier, m)
                && self.quota_used_now(tier, m, tenant) + spec.gpus
                    <= state.quotas.quota(tier, m, tenant).nominal
        })?;
        match tier {
            Tier::OnDemand => {
                // Someone borrows on-demand GPUs of the model: it waits for them.
                let used: u32 = self.on_demand_used[model.0 as usize];
                let entitled: u32 = state.quotas.cohort(tier, model).map(|(_, q, u)| u.min(q.nominal)).sum();
                (used > entitled).then_some(Pending::ReclaimingQuota { model, victims: 0 })
            }
            Tier::Preemptible => {
                if self.reclaimed_quota || state.quota_draining > 0 {
                    return None;
                }
                let set = self.victims_for(job, VictimFilter::Borrowers(tier, model), &[model])?;
                self.reclaimed_quota = true;
                for &v in &set.victims {
                    self.drain(v, DrainReason::Quota { tenant });
                }
                Some(Pending::ReclaimingQuota { model, victims: set.victims.len() as u32 })
            }
            Tier::Reserved => None,
        }
    }

    /// Whether `job`'s tenant borrows past its quota in its tier on
    /// `model` (tenants without one borrow all they use).
    pub(super) fn borrows(&self, job: &Job, model: GpuModelId) -> bool {
        let (tier, tenant) = (job.spec.tier, job.spec.tenant);
        self.state.quota_used(tenant, tier, model) > self.state.quotas.quota(tier, model, tenant).nominal
    }
}
