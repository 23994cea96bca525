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

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(id: JobId, waiting: Option<Waiting>) -> Box<JobRecord> {
        let spec = ebb_api::JobSubmission { argv: vec!["train".into()], ..Default::default() };
        let spec = StoredSpec::from(spec);
        let mut job = JobRecord::queued(id, TenantId(1), spec, Tier::Preemptible, 1, 15, 0);
        job.waiting = waiting;
        Box::new(job)
    }

    #[test]
    fn a_cancelled_job_lets_its_tenants_oldest_waiting_job_in_and_fails_its_dependents_over_the_parts() {
        // Tenant 1 may run one job: job 1 is admitted, 2 and 3 wait at the
        // limit, and 4 waits for job 1 to succeed.
        let mut owned = effects::Owned::new(JobId(5), 1_000);
        owned.admission = Admission::new(Limits { max_running_jobs: 1, ..Limits::default() });
        let jobs = &mut owned.jobs;
        jobs.insert(JobId(1), queued(JobId(1), None));
        jobs.insert(JobId(2), queued(JobId(2), Some(Waiting::TenantLimit)));
        jobs.insert(JobId(3), queued(JobId(3), Some(Waiting::TenantLimit)));
        let mut dependent = queued(JobId(4), Some(Waiting::Dependency));
        dependent.spec.after =
            Some(gates::After { on: vec![(gates::Condition::Ok, JobId(1))], singleton: false });
        jobs.insert(JobId(4), dependent);
        super::super::recovery::restore_queued(&jobs[&JobId(1)], &mut owned.core).unwrap();
        let load = owned.admission.load.entry(TenantId(1)).or_default();
        (load.jobs, load.admitted, load.waiting) = (4, 1, [JobId(2), JobId(3)].into());
        owned.admission.gates.dependents.insert(JobId(1), [JobId(4)].into());
        let mut p = owned.parts();
        super::super::jobs::cancel(&mut p, JobId(1), None).unwrap();

        // Job 4 can never run and fails; job 2, the oldest waiting, is in
        // the core; job 3 still waits. Nothing is sent to a node.
        let events: Vec<(JobId, &str)> = p.fx.events.iter().map(|(id, e)| (*id, e.kind().as_str())).collect();
        assert_eq!(events, [(JobId(4), "failed"), (JobId(2), "admitted"), (JobId(1), "cancelled")]);
        let saved: Vec<(JobId, JobState)> = p.fx.saved.iter().map(|j| (j.id, j.state)).collect();
        assert_eq!(
            saved,
            [(JobId(4), JobState::Failed), (JobId(2), JobState::Queued), (JobId(1), JobState::Cancelled)]
        );
        assert!(p.fx.sent.is_empty());
        assert!(
            p.core.job(JobId(2)).is_some()
                && p.core.job(JobId(1)).is_none()
                && p.core.job(JobId(3)).is_none()
        );
        assert_eq!(
            (p.jobs[&JobId(2)].waiting, p.jobs[&JobId(3)].waiting),
            (None, Some(Waiting::TenantLimit))
        );
        let load = &p.admission.load[&TenantId(1)];
        assert_eq!((load.jobs, load.admitted, load.waiting.len()), (2, 1, 1));
        assert!(p.admission.gates.dependents.is_empty());

        // A second cancel of job 1 is refused, naming it.
        let again = super::super::jobs::cancel(&mut p, JobId(1), None).unwrap_err();
        assert!(
            matches!(&again, Fail::Refused(r) if r.message.contains("job 1: already cancelled")),
            "{again:?}"
        );
    }
}
