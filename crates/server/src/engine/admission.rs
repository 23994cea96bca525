//! Admission: what lets a queued job into the core. Its dependencies' and
//! its array's gates come first (`gates`), then its tenant's limit of
//! running jobs: a tenant at its limit has its jobs wait here, oldest
//! first, and each job that ends lets the next one in.

use super::effects::{self, Effects};
use super::table::JobTable;
use super::*;
use crate::validate::Limits;

/// What lets a queued job into the core, and what tenants hold against
/// their limits.
#[derive(Default)]
pub(super) struct Admission {
    /// Queued jobs at their dependencies' or their array's gate.
    pub gates: gates::Gates,
    /// What each tenant's unfinished jobs hold against its limits.
    pub load: BTreeMap<TenantId, TenantLoad>,
    /// The limits the operator set for single tenants.
    pub limits: BTreeMap<TenantId, ebb_api::TenantLimits>,
    /// The server's limits, for every tenant without its own.
    pub defaults: Limits,
}

impl Admission {
    pub fn new(defaults: Limits) -> Admission {
        Admission { defaults, ..Default::default() }
    }

    /// The server's limits with the tenant's own in place of the defaults.
    pub fn limits_of(&self, tenant: TenantId) -> Limits {
        let mut limits = self.defaults.clone();
        if let Some(own) = self.limits.get(&tenant) {
            limits.max_jobs = own.max_jobs.unwrap_or(limits.max_jobs);
            limits.max_running_jobs = own.max_running_jobs.unwrap_or(limits.max_running_jobs);
            limits.max_stored_bytes = own.max_stored_bytes.unwrap_or(limits.max_stored_bytes);
        }
        limits
    }

    /// `job` has ended and leaves its tenant's counts (`was`: where it
    /// waited). Its bytes stay counted while its record stays in memory
    /// (`--keep-finished`): `prune_finished` gives them back.
    pub fn release(&mut self, job: &JobRecord, was: Option<Waiting>) {
        let load = self.load.entry(job.tenant).or_default();
        load.jobs = load.jobs.saturating_sub(1);
        match was {
            Some(Waiting::TenantLimit) => {
                load.waiting.remove(&job.id);
            }
            Some(Waiting::Dependency | Waiting::ArrayLimit) => {}
            _ => load.admitted = load.admitted.saturating_sub(1),
        }
    }
}

/// Admits the tenant's waiting jobs into the core, oldest first, while it
/// is under its limit of running jobs.
pub(super) fn admit_waiting(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    fx: &mut impl Effects,
    tenant: TenantId,
) -> Written {
    let max = admission.limits_of(tenant).max_running_jobs;
    loop {
        let Some(load) = admission.load.get_mut(&tenant) else { return Ok(()) };
        if load.admitted >= max {
            return Ok(());
        }
        let Some(id) = load.waiting.pop_first() else { return Ok(()) };
        load.admitted += 1;
        let job = jobs.get_mut(&id).expect("waiting job");
        job.waiting = None;
        if let Err(e) = super::recovery::restore_queued(job, core) {
            tracing::error!(job = id.0, "not admitted: {e}");
            continue;
        }
        let reason = "its tenant is under its limit of running jobs".into();
        fx.event(job, Event::Admitted(AdmittedDetail { reason }))?;
        effects::save(jobs, fx, id)?;
    }
}
