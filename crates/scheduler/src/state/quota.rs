//! Quotas per tenant, tier and GPU model, with borrowing and lending, as
//! Kueue's cohorts (`README.md`, "Quotas"). The GPUs of one model in one
//! tier are the cohort; a tenant without a quota there has a nominal quota
//! of 0 and may borrow without limit.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use ebb_core::{GpuModelId, TenantId, Tier};

use crate::error::StateError;

/// One tenant's quota in one tier on one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// GPUs it is owed: while it uses fewer and has work waiting, nobody
    /// else borrows there, and borrowers are drained (preemptible) or
    /// awaited (on-demand) to give them back.
    pub nominal: u32,
    /// How far past `nominal` it may go while others leave GPUs idle;
    /// `None`: no limit.
    pub borrowing_limit: Option<u32>,
    /// How much of its unused nominal quota others may borrow; `None`: all
    /// of it. The rest is kept idle for it.
    pub lending_limit: Option<u32>,
}

impl Quota {
    /// The GPUs of its unused nominal quota kept from others when it uses
    /// `used`.
    pub fn kept(&self, used: u32) -> u32 {
        match self.lending_limit {
            Some(lend) => self.nominal.saturating_sub(lend).saturating_sub(used),
            None => 0,
        }
    }
}

/// Quotas and what each tenant uses against them (GPUs running, not
/// draining, or held for it), per tier and model.
#[derive(Clone, Debug, Default)]
pub(crate) struct Quotas {
    pub set: BTreeMap<(Tier, GpuModelId, TenantId), Quota>,
    /// Looked up on every start and end, so hashed.
    pub used: FxHashMap<(Tier, GpuModelId, TenantId), u32>,
}

impl Quotas {
    pub fn quota(&self, tier: Tier, model: GpuModelId, tenant: TenantId) -> Quota {
        self.set.get(&(tier, model, tenant)).copied().unwrap_or_default()
    }

    /// Whether any tenant has a quota in the cohort: without one, none of
    /// the rules apply.
    pub fn governs(&self, tier: Tier, model: GpuModelId) -> bool {
        self.set.range((tier, model, TenantId(0))..=(tier, model, TenantId(u32::MAX))).next().is_some()
    }

    /// The quotas of the cohort, with what each tenant uses.
    pub fn cohort(&self, tier: Tier, model: GpuModelId) -> impl Iterator<Item = (TenantId, Quota, u32)> + '_ {
        self.set
            .range((tier, model, TenantId(0))..=(tier, model, TenantId(u32::MAX)))
            .map(move |(&(_, _, t), &q)| (t, q, self.used.get(&(tier, model, t)).copied().unwrap_or(0)))
    }

    pub fn adjust(&mut self, tier: Tier, model: GpuModelId, tenant: TenantId, delta: i64) {
        let used = self.used.entry((tier, model, tenant)).or_insert(0);
        *used = (*used as i64 + delta) as u32;
        if *used == 0 {
            self.used.remove(&(tier, model, tenant));
        }
    }
}

impl super::State {
    // ---- quotas ------------------------------------------------------------

    /// Sets (or with `None` removes) `tenant`'s quota in `tier` on `model`.
    /// Reserved work has its reservations instead. Nothing running is
    /// stopped: a tenant over a new quota runs on and starts no more until
    /// under it.
    pub fn set_quota(
        &mut self,
        tenant: TenantId,
        tier: Tier,
        model: GpuModelId,
        quota: Option<Quota>,
    ) -> Result<(), StateError> {
        if tier == Tier::Reserved {
            return Err(StateError::Invalid("quotas are for on-demand and preemptible work".into()));
        }
        if self.model(model).is_none() {
            return Err(StateError::NotFound(format!("gpu model {model}")));
        }
        if let Some(q) = quota {
            if q.lending_limit.is_some_and(|l| l > q.nominal) {
                return Err(StateError::Invalid(format!(
                    "lending limit {} exceeds the nominal quota {}",
                    q.lending_limit.unwrap_or(0),
                    q.nominal
                )));
            }
        }
        match quota {
            Some(q) => self.quotas.set.insert((tier, model, tenant), q),
            None => self.quotas.set.remove(&(tier, model, tenant)),
        };
        Ok(())
    }

    /// `tenant`'s quota in `tier` on `model`, if it has one.
    pub fn quota(&self, tenant: TenantId, tier: Tier, model: GpuModelId) -> Option<Quota> {
        self.quotas.set.get(&(tier, model, tenant)).copied()
    }

    /// The GPUs `tenant` uses against quotas in `tier` on `model`: running
    /// (a preemptible job no longer once it drains) or held for it.
    pub fn quota_used(&self, tenant: TenantId, tier: Tier, model: GpuModelId) -> u32 {
        self.quotas.used.get(&(tier, model, tenant)).copied().unwrap_or(0)
    }

    /// Every quota set: (tenant, tier, model, quota).
    pub fn quotas(&self) -> impl Iterator<Item = (TenantId, Tier, GpuModelId, Quota)> + '_ {
        self.quotas.set.iter().map(|(&(tier, model, tenant), &q)| (tenant, tier, model, q))
    }
}
