//! The batch loop: messages in, one transaction, then replies and wake-ups.

use super::*;

/// The most messages one transaction takes.
const BATCH_MESSAGES: usize = 1024;

/// Why a batch did not commit: nothing of it was answered or sent.
#[derive(Debug, thiserror::Error)]
pub enum BatchFailed {
    #[error("cannot begin a transaction: {0}")]
    Begin(StoreError),
    #[error("a write failed, nothing committed: {0}")]
    Write(StoreError),
    #[error("commit failed: {0}")]
    Commit(StoreError),
}

impl<S: Store> Engine<S> {
    /// Committed changes are counted on `feed` from now on.
    pub fn feed(&mut self, feed: Feed) {
        self.outbox.feed = Some(feed);
    }

    /// Runs the writer loop until every sender is gone (`None`), or until
    /// a batch fails: then nothing of it was acknowledged, memory is ahead
    /// of the store, and the engine is dropped with the reason returned.
    /// A batch that stopped scheduling at its bound is followed at once by
    /// the next, with whatever messages came meanwhile, until the core
    /// settles.
    pub fn run(mut self, mut rx: tokio::sync::mpsc::Receiver<Msg>) -> Option<BatchFailed> {
        // One buffer for every batch: grown anew each time, it was a
        // fiftieth of the writer's time in a fleet's fill.
        let mut batch = Vec::with_capacity(BATCH_MESSAGES);
        loop {
            if !self.unsettled {
                batch.push(rx.blocking_recv()?);
            }
            while batch.len() < BATCH_MESSAGES {
                match rx.try_recv() {
                    Ok(msg) => batch.push(msg),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.batch(batch.drain(..), now_ms()) {
                // Callers see the error as a dropped reply.
                return Some(e);
            }
            if cfg!(debug_assertions) {
                self.debug_check();
            }
        }
    }

    /// A debug build's server checks its writer whole (`sanity_check`)
    /// after batches, and stops at the first inconsistency: after every
    /// batch while it holds up to a thousand jobs, then after one in every
    /// thousandth of its jobs, so that a test fleet of 100,000 spends
    /// about as long checking as a small one.
    fn debug_check(&mut self) {
        self.unchecked += 1;
        if self.unchecked >= (self.jobs.len() as u64 / 1_000).max(1) {
            self.unchecked = 0;
            if let Err(e) = self.sanity_check() {
                panic!("the writer's state is inconsistent after a batch: {e}");
            }
        }
    }

    /// Handles one batch of messages at `now` as one store transaction:
    /// apply them, schedule until settled, commit, then answer and wake.
    /// If any store write fails, or the commit does, the transaction is
    /// rolled back, nothing of the batch is answered or sent to an agent,
    /// and the engine must not be used again.
    pub fn batch(&mut self, batch: impl IntoIterator<Item = Msg>, now: u64) -> Result<(), BatchFailed> {
        self.now = now;
        self.store.begin().map_err(BatchFailed::Begin)?;
        let applied = self.apply(batch, now).map_err(BatchFailed::Write);
        let committed = applied.and_then(|()| self.store.commit().map_err(BatchFailed::Commit));
        match committed {
            Ok(()) => {
                self.counters.batches += 1;
                self.outbox.deliver();
                Ok(())
            }
            Err(e) => {
                self.outbox.discard();
                let _ = self.store.rollback();
                Err(e)
            }
        }
    }

    /// Every message of the batch, then the core's plans until it settles.
    fn apply(&mut self, batch: impl IntoIterator<Item = Msg>, now: u64) -> Written {
        for msg in batch {
            self.handle(msg, now)?;
        }
        self.schedule(now)?;
        self.withdraw_gone_holds()?;
        self.prune_finished(now);
        self.prune_output(now)
    }

    /// The invariants of what the writer holds, checked whole: the core's
    /// (`State::sanity_check`); the job table against the core; and every
    /// sum the writer keeps as it goes (the tally, the fleet's sums,
    /// tenants' loads) and every timer set (back-offs, deadlines, gang
    /// graces, finished records), recomputed from the records they sum.
    /// Tests call it after every batch, and debug builds' servers after
    /// batches (`debug_check`).
    pub fn sanity_check(&self) -> Result<(), String> {
        self.core.sanity_check()?;
        self.check_jobs_against_core()?;
        self.check_tally()?;
        self.check_tenant_loads()?;
        self.check_fleet_sums()?;
        self.check_gates()?;
        self.check_staged()?;
        self.check_timer_sets()
    }

    fn check_jobs_against_core(&self) -> Result<(), String> {
        for (id, job) in &self.jobs {
            let in_core = self.core.job(*id).is_some();
            let belongs = !job.state.is_final() && (job.state != JobState::Queued || job.waiting.is_none());
            if in_core != belongs {
                let waiting = job.waiting.map(|w| w.code().as_str());
                return Err(format!(
                    "job {id}: {} (waiting {waiting:?}) in its record, {} the core",
                    job.state.as_str(),
                    if in_core { "in" } else { "not in" }
                ));
            }
        }
        Ok(())
    }

    /// Each record is counted as it is; the counts of unfinished jobs (all
    /// of which are in memory) are the records' sums. Finished jobs are
    /// counted from the store too, so their counts are at least memory's.
    fn check_tally(&self) -> Result<(), String> {
        let mut jobs: BTreeMap<(Tier, JobState), u64> = BTreeMap::new();
        let mut gpus: BTreeMap<(Tier, JobState), u64> = BTreeMap::new();
        let mut waiting: BTreeMap<(Tier, ebb_api::PendingReason), u64> = BTreeMap::new();
        for (id, job) in &self.jobs {
            let reason = match (job.state, job.waiting) {
                (JobState::Queued, Some(w)) => Some(w.code()),
                _ => None,
            };
            let is = (job.tier, job.state, job.tallied_gpus(), reason);
            if job.counted != Some(is) {
                return Err(format!("job {id}: counted as {:?}, is {is:?}", job.counted));
            }
            *jobs.entry((job.tier, job.state)).or_default() += 1;
            *gpus.entry((job.tier, job.state)).or_default() += u64::from(is.2);
            if let Some(reason) = reason {
                *waiting.entry((job.tier, reason)).or_default() += 1;
            }
        }
        for (what, kept, summed) in
            [("jobs", &self.jobs.tally.jobs, &jobs), ("GPUs", &self.jobs.tally.gpus, &gpus)]
        {
            for tier in [Tier::OnDemand, Tier::Preemptible] {
                for state in JobState::ALL {
                    let (kept, summed) = (
                        kept.get(&(tier, state)).copied().unwrap_or(0),
                        summed.get(&(tier, state)).copied().unwrap_or(0),
                    );
                    let agrees = if state.is_final() { kept >= summed } else { kept == summed };
                    if !agrees {
                        return Err(format!(
                            "tally: {kept} {what} {tier} {} counted, the records say {summed}",
                            state.as_str()
                        ));
                    }
                }
            }
        }
        let kept: BTreeMap<_, _> =
            self.jobs.tally.waiting.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (*k, *n)).collect();
        if kept != waiting {
            return Err(format!("tally: waiting counted {kept:?}, the records say {waiting:?}"));
        }
        Ok(())
    }

    /// A tenant's load is its unfinished jobs (and the bytes of finished
    /// ones still kept in memory).
    fn check_tenant_loads(&self) -> Result<(), String> {
        let kept_finished: BTreeSet<JobId> =
            self.jobs.finished.iter().filter(|(at, _)| *at != 0).map(|(_, id)| id).collect();
        let mut load: BTreeMap<TenantId, (u64, u64, u64, BTreeSet<JobId>)> = BTreeMap::new();
        for (id, job) in &self.jobs {
            let entry = load.entry(job.tenant).or_default();
            if job.state.is_final() {
                if kept_finished.contains(id) {
                    entry.1 += job.spec.stored_bytes();
                }
                continue;
            }
            entry.0 += 1;
            entry.1 += job.spec.stored_bytes();
            match job.waiting {
                Some(Waiting::TenantLimit) => {
                    entry.3.insert(*id);
                }
                Some(Waiting::Dependency | Waiting::ArrayLimit) => {}
                _ => entry.2 += 1,
            }
        }
        let tenants: BTreeSet<TenantId> = load.keys().chain(self.admission.load.keys()).copied().collect();
        for tenant in tenants {
            let summed = load.remove(&tenant).unwrap_or_default();
            let kept = self.admission.load.get(&tenant).cloned().unwrap_or_default();
            let kept = (kept.jobs, kept.bytes, kept.admitted, kept.waiting);
            if kept != summed {
                return Err(format!(
                    "tenant {tenant}: load (jobs, bytes, admitted, waiting) {kept:?}, the records say {summed:?}"
                ));
            }
        }
        Ok(())
    }

    /// The fleet's sums by model are its node rows' sums.
    fn check_fleet_sums(&self) -> Result<(), String> {
        let mut registered: BTreeMap<String, (u64, u32)> = BTreeMap::new();
        let mut exposure: BTreeMap<String, (u64, u128, u64)> = BTreeMap::new();
        for row in self.fleet.nodes.values() {
            if !row.removed {
                let entry = registered.entry(row.gpu_model.clone()).or_default();
                entry.0 += u64::from(row.gpus);
                entry.1 += 1;
            }
            let entry = exposure.entry(row.gpu_model.clone()).or_default();
            entry.0 += 1;
            entry.1 += u128::from(row.joined_ms);
            entry.2 += row.interruptions;
        }
        let kept: BTreeMap<String, (u64, u32)> = self
            .fleet
            .registered
            .iter()
            .filter(|(_, n)| **n != (0, 0))
            .map(|(m, n)| (m.clone(), *n))
            .collect();
        if kept != registered {
            return Err(format!("fleet: registered (GPUs, nodes) {kept:?}, the rows say {registered:?}"));
        }
        let kept: BTreeMap<String, (u64, u128, u64)> = self
            .fleet
            .exposure
            .iter()
            .map(|(m, e)| (m.clone(), (e.nodes, e.joined_ms, e.interruptions)))
            .filter(|(_, e)| *e != (0, 0, 0))
            .collect();
        if kept != exposure {
            return Err(format!("fleet: exposure {kept:?}, the rows say {exposure:?}"));
        }
        Ok(())
    }

    /// Back-offs are exactly the jobs backing off; every deadline not yet
    /// judged for good, every gang's grace and every finished record kept
    /// has its entry (deadlines and graces are dropped lazily, when due).
    fn check_timer_sets(&self) -> Result<(), String> {
        let mut backing_off = Due::default();
        for (id, job) in &self.jobs {
            if let (JobState::Queued, Some(Waiting::Backoff { until_ms })) = (job.state, job.waiting) {
                backing_off.insert(until_ms, *id);
            }
        }
        if backing_off != self.jobs.backoff {
            return Err(format!("back-off set {:?}, the records say {backing_off:?}", self.jobs.backoff));
        }
        let judged: BTreeSet<JobId> = self.jobs.deadlines.iter().map(|(_, id)| id).collect();
        let graced: BTreeSet<(JobId, u64)> = self.jobs.gang_graces.iter().map(|(at, id)| (id, at)).collect();
        let finished: BTreeSet<JobId> = self.jobs.finished.iter().map(|(_, id)| id).collect();
        for (id, job) in &self.jobs {
            if let Some(at_ms) = super::exits::unstarted_due(job).filter(|at| *at > self.now) {
                if !self.jobs.unstarted.contains(at_ms, (job.id, job.attempt)) {
                    return Err(format!(
                        "job {id}: not started by its deadline, and not due to be ended at {at_ms}"
                    ));
                }
            }
        }
        for (id, job) in &self.jobs {
            let open = job.deadline.as_ref().is_some_and(|d| d.promoted.is_none());
            if open && !job.state.is_final() && job.tier == Tier::Preemptible && !judged.contains(id) {
                return Err(format!("job {id}: a deadline not yet met, and no time to judge it"));
            }
            // Once due, the entry is gone: the gang was stopped, or had ended.
            if let Some(until_ms) = job.gang_grace_until.filter(|t| job.state.is_live() && *t > self.now) {
                if !graced.contains(&(*id, until_ms)) {
                    return Err(format!("job {id}: a gang grace until {until_ms} not in the set"));
                }
            }
            if job.state.is_final() != finished.contains(id) {
                return Err(format!(
                    "job {id}: {} in memory, finished set {}",
                    job.state.as_str(),
                    finished.contains(id)
                ));
            }
        }
        Ok(())
    }

    /// Handles a batch but dies before committing it, as a `kill -9` in
    /// the middle of a batch would: nothing of it reaches the store or any
    /// caller. For tests of crash safety.
    pub fn crash_during(mut self, batch: Vec<Msg>, now: u64) {
        self.now = now;
        if self.store.begin().is_ok() {
            let _ = self.apply(batch, now);
        }
        self.outbox.discard();
        drop(self);
    }

    /// Answers `tx` with `result` after the commit, unless the store
    /// failed: then the batch is abandoned and nobody is answered.
    pub(super) fn answer<T: Send + 'static, E: Into<Fail>>(
        &mut self,
        tx: oneshot::Sender<Result<T, Refusal>>,
        result: Result<T, E>,
    ) -> Written {
        match result.map_err(Into::into) {
            Ok(value) => self.outbox.reply(tx, Ok(value)),
            Err(Fail::Refused(e)) => self.outbox.reply(tx, Err(e)),
            Err(Fail::Store(e)) => return Err(e),
        }
        Ok(())
    }
}
