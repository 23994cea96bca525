//! The events of a job's life, as the edge reports them: submitted,
//! restored at start-up, cancelled, drilled, promoted, exited,
//! checkpointed; and the queue and hold bookkeeping they share.

use std::collections::BTreeSet;

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Span, TenantId, Tier, Time};

use crate::error::StateError;
use crate::plan::{Drain, Plan};

use super::*;

impl State {
    // ---- jobs ----------------------------------------------------------

    pub fn submit(&mut self, spec: JobSpec) -> Result<(), StateError> {
        if spec.gpus == 0 {
            return Err(StateError::Invalid(format!("job {}: gpus must be at least 1, got 0", spec.id)));
        }
        if self.jobs.contains_key(&spec.id) {
            return Err(StateError::Conflict(format!("job {}: already submitted", spec.id)));
        }
        if let Some(max) = spec.max_gpus {
            if max <= spec.gpus {
                return Err(StateError::Invalid(format!(
                    "job {}: an elastic job's most gpus must be above its fewest, got {}:{max}",
                    spec.id, spec.gpus
                )));
            }
            if spec.tier != Tier::Preemptible {
                return Err(StateError::Invalid(format!(
                    "job {}: only preemptible jobs are elastic, this one is {}",
                    spec.id, spec.tier
                )));
            }
        }
        if let Some(model) = spec.gpu_model {
            let m = self
                .model(model)
                .ok_or_else(|| StateError::NotFound(format!("job {}: gpu model {model}", spec.id)))?;
            if spec.is_elastic() && !spec_fits(&spec, m.gpus_per_node) {
                return Err(StateError::Invalid(format!(
                    "job {}: an elastic job runs on whole {} nodes, so its range must be multiples of {}, got {}:{}",
                    spec.id,
                    m.name,
                    m.gpus_per_node,
                    spec.gpus,
                    spec.most_gpus()
                )));
            }
            if !shape_fits(spec.gpus, m.gpus_per_node) {
                return Err(StateError::Invalid(format!(
                    "job {}: gpus must be at most {per} or a multiple of {per} ({} nodes have {per} GPUs), got {}",
                    spec.id,
                    m.name,
                    spec.gpus,
                    per = m.gpus_per_node
                )));
            }
        } else if spec.tier == Tier::Reserved {
            return Err(StateError::Invalid(format!(
                "job {}: a reserved job must name the gpu model of its reservation",
                spec.id
            )));
        }
        let id = spec.id;
        self.jobs.insert(
            id,
            Job {
                spec,
                attempt: Attempt(0),
                preemptions: 0,
                phase: Phase::Queued,
                run: None,
                notice: None,
                drilled: false,
                requeued_itself: false,
                last_node: None,
            },
        );
        self.enqueue(id);
        Ok(())
    }

    /// Puts back a queued job when the edge restarted, with the attempts
    /// it has had and its preemptions: its next attempt gets a new number,
    /// so an agent still holding an old one is fenced.
    pub fn restore_queued(
        &mut self,
        spec: JobSpec,
        attempt: Attempt,
        preemptions: u32,
    ) -> Result<(), StateError> {
        let id = spec.id;
        self.submit(spec)?;
        let job = self.jobs.get_mut(&id).expect("just submitted");
        job.attempt = attempt;
        job.preemptions = preemptions;
        Ok(())
    }

    /// A restored job (queued or running) was requeued by a drill since it
    /// was last preempted (see [`Job::settling`]): the edge keeps that
    /// with its record and says so after restoring it.
    pub fn restore_drilled(&mut self, id: JobId) -> Result<(), StateError> {
        self.jobs.get_mut(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))?.drilled = true;
        Ok(())
    }

    /// A restored job's last attempt requeued itself (see
    /// [`Job::requeued_itself`]): the edge keeps that with its record and
    /// says so after restoring it.
    pub fn restore_requeued_itself(&mut self, id: JobId) -> Result<(), StateError> {
        self.jobs.get_mut(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))?.requeued_itself =
            true;
        Ok(())
    }

    /// Puts back a job that was running when the edge restarted: `spec`
    /// as submitted, and its run as the edge recorded it. Refused if the
    /// GPUs are not free on up nodes of one model, or the shape is wrong.
    pub fn restore_run(&mut self, spec: JobSpec, run: RestoredRun) -> Result<(), StateError> {
        let RestoredRun {
            attempt,
            preemptions,
            alloc,
            started_at,
            last_checkpoint_at,
            notice,
            joined,
            leaving,
            resized_at,
        } = run;
        let id = spec.id;
        if self.jobs.contains_key(&id) {
            return Err(StateError::Conflict(format!("job {id}: already known")));
        }
        let model = match alloc.first() {
            Some((node, _)) => self.node_checked(*node)?.model,
            None => return Err(StateError::Invalid(format!("job {id}: restored run has no GPUs"))),
        };
        let gpus: u32 = alloc.iter().map(|(_, m)| m.count_ones()).sum();
        let in_range = match spec.max_gpus {
            None => gpus == spec.gpus,
            Some(max) => (spec.gpus..=max).contains(&gpus),
        };
        if !in_range {
            return Err(StateError::Invalid(format!(
                "job {id}: restored run has {gpus} GPUs, wants {}",
                match spec.max_gpus {
                    None => spec.gpus.to_string(),
                    Some(max) => format!("{}:{max}", spec.gpus),
                }
            )));
        }
        let parts_known = joined
            .iter()
            .map(|(n, _)| n)
            .chain(leaving.iter().map(|(n, _)| n))
            .all(|n| alloc.iter().skip(1).any(|(a, _)| a == n));
        if !parts_known || (!spec.is_elastic() && (!joined.is_empty() || !leaving.is_empty())) {
            return Err(StateError::Invalid(format!(
                "job {id}: restored run's joined or leaving nodes are not its own (nor its first)"
            )));
        }
        for &(node, mask) in &alloc {
            let n = self.node_checked(node)?;
            if n.status == NodeStatus::Lost || n.model != model || n.free_mask() & mask != mask {
                return Err(StateError::Conflict(format!("job {id}: GPUs on {} are not free", n.name)));
            }
        }
        if notice.is_some() && spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!("job {id}: only preemptible jobs drain")));
        }
        let (tier, tenant) = (spec.tier, spec.tenant);
        let phase = if notice.is_some() { Phase::Draining } else { Phase::Running };
        let gpu_rate = self.models[model.0 as usize].rate;
        let resized = match (joined.is_empty() && leaving.is_empty(), resized_at) {
            (true, None) => None,
            (_, at) => Some(Box::new(Resized { joined, leaving, at: at.unwrap_or(started_at) })),
        };
        let run =
            Run { attempt, model, alloc: alloc.clone(), started_at, last_checkpoint_at, gpu_rate, resized };
        let active = run.active_gpus();
        self.jobs.insert(
            id,
            Job {
                spec,
                attempt,
                preemptions,
                phase,
                run: Some(run),
                notice,
                drilled: false,
                requeued_itself: false,
                last_node: None,
            },
        );
        if phase == Phase::Running {
            self.adjust_usage(tier, tenant, model, active as i64);
        }
        self.fair_start(id);
        self.regrow(id);
        match notice.map(|n| n.reason) {
            Some(DrainReason::FairShare { .. }) => self.fair_share_draining += 1,
            Some(DrainReason::Quota { .. }) => self.quota_draining += 1,
            _ => {}
        }
        for (node, mask) in alloc {
            let n = &mut self.nodes[node.0 as usize];
            n.used |= mask;
            n.jobs.push((id, mask));
            self.reindex(node);
        }
        Ok(())
    }

    /// Puts back a hold that existed when the edge restarted: the queued job
    /// `id` waits for `victims` (those still draining) on exactly `alloc`,
    /// its start from it `staged` as [`State::stage`] left it. Without this
    /// a restarted server would preempt again for a job whose first victims
    /// are still leaving. Refused unless the job is queued and
    /// non-preemptible, a staged attempt is its next, and the GPUs are free
    /// or used only by draining victims.
    pub fn restore_hold(
        &mut self,
        id: JobId,
        alloc: Vec<(NodeId, u64)>,
        victims: &[JobId],
        parts: &[(JobId, NodeId)],
        staged: Option<Attempt>,
    ) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        if job.phase != Phase::Queued || job.spec.tier == Tier::Preemptible {
            return Err(StateError::Conflict(format!("job {id}: cannot hold GPUs")));
        }
        if staged.is_some_and(|a| a.0 != job.attempt.0.saturating_add(1)) {
            return Err(StateError::Conflict(format!("job {id}: staged attempt is not its next")));
        }
        let (gpus, tier, tenant) = (job.spec.gpus, job.spec.tier, job.spec.tenant);
        let waiting: BTreeSet<JobId> = victims
            .iter()
            .copied()
            .filter(|v| {
                self.jobs.get(v).is_some_and(|j| j.phase == Phase::Draining)
                    && !self.victim_of.contains_key(v)
            })
            .collect();
        let waiting_parts: BTreeSet<(JobId, NodeId)> = parts
            .iter()
            .copied()
            .filter(|(v, node)| {
                self.jobs.get(v).is_some_and(|j| j.run.as_ref().is_some_and(|r| r.is_leaving(*node)))
                    && !self.part_victim_of.contains_key(&(*v, *node))
            })
            .collect();
        let model = match alloc.first() {
            Some((node, _)) => self.node_checked(*node)?.model,
            None => return Err(StateError::Invalid(format!("job {id}: hold has no GPUs"))),
        };
        let total: u32 = alloc.iter().map(|(_, m)| m.count_ones()).sum();
        if total != gpus {
            return Err(StateError::Invalid(format!("job {id}: hold has {total} GPUs, wants {gpus}")));
        }
        for &(node, mask) in &alloc {
            let n = self.node_checked(node)?;
            let victims_here = n
                .jobs
                .iter()
                .filter(|(j, _)| waiting.contains(j) || waiting_parts.contains(&(*j, node)))
                .fold(0, |acc, (_, m)| acc | m);
            if n.status != NodeStatus::Up
                || n.model != model
                || n.held & mask != 0
                || mask & n.used & !victims_here != 0
            {
                return Err(StateError::Conflict(format!("job {id}: GPUs on {} cannot be held", n.name)));
            }
        }
        self.dequeue(id);
        self.jobs.get_mut(&id).expect("checked").phase = Phase::Holding;
        self.adjust_usage(tier, tenant, model, gpus as i64);
        for &(node, mask) in &alloc {
            self.nodes[node.0 as usize].held |= mask;
            self.reindex(node);
        }
        for v in &waiting {
            self.victim_of.insert(*v, id);
        }
        for part in &waiting_parts {
            self.part_victim_of.insert(*part, id);
        }
        if waiting.is_empty() && waiting_parts.is_empty() {
            self.ready_holds.insert(id);
        }
        self.holds.insert(id, Hold { job: id, model, alloc, waiting_on: waiting, waiting_parts, staged });
        Ok(())
    }

    /// Promises job `id`'s start from its hold to the hold's node before
    /// the hold is ready, so that the node can start it the moment its
    /// victims have gone without asking again: returns the attempt the
    /// start is (the job's next, which its placement from this hold will
    /// be). Once staged, that number is the hold's: if the hold goes
    /// without the placement (a cancel, its node lost), the job's next
    /// attempt is numbered after it, so a start the node may already have
    /// made is fenced as stale. Only a hold on one node, and only once.
    pub fn stage(&mut self, id: JobId) -> Result<Attempt, StateError> {
        let job = self.job_checked(id)?;
        let next = Attempt(
            job.attempt
                .0
                .checked_add(1)
                .ok_or_else(|| StateError::Conflict(format!("job {id}: no attempt numbers left")))?,
        );
        let hold = self
            .holds
            .get_mut(&id)
            .ok_or_else(|| StateError::Conflict(format!("job {id}: holds no GPUs")))?;
        if hold.alloc.len() != 1 || hold.staged.is_some() {
            return Err(StateError::Conflict(format!("job {id}: its start cannot be staged")));
        }
        hold.staged = Some(next);
        Ok(next)
    }

    /// Withdraws job `id`'s staged start: its hold stays, its number is
    /// spent, and its placement from the hold is the attempt after it.
    pub fn unstage(&mut self, id: JobId) -> Result<(), StateError> {
        let hold = self
            .holds
            .get_mut(&id)
            .ok_or_else(|| StateError::Conflict(format!("job {id}: holds no GPUs")))?;
        if let Some(staged) = hold.staged.take() {
            self.spend(id, staged);
        }
        Ok(())
    }

    /// Attempt numbers up to `attempt` of queued job `id` are taken (a
    /// start promised before the edge restarted, whose hold did not come
    /// back): its next attempt is numbered after them.
    pub fn fence_attempt(&mut self, id: JobId, attempt: Attempt) -> Result<(), StateError> {
        let job = self.jobs.get(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))?;
        if job.phase != Phase::Queued {
            return Err(StateError::Conflict(format!("job {id}: not queued")));
        }
        self.spend(id, attempt);
        Ok(())
    }

    /// Job `id`'s attempts up to `attempt` are taken: its next is numbered
    /// after them.
    fn spend(&mut self, id: JobId, attempt: Attempt) {
        let job = self.jobs.get_mut(&id).expect("a known job");
        job.attempt = job.attempt.max(attempt);
    }

    /// Withdraws a job that is not running (running jobs end through
    /// [`State::exited`] once their processes are gone).
    pub fn cancel(&mut self, id: JobId) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        match job.phase {
            Phase::Queued => self.dequeue(id),
            Phase::Holding => self.drop_hold(id),
            Phase::Running | Phase::Draining => {
                return Err(StateError::Conflict(format!(
                    "job {id}: running; stop its processes and report the exit"
                )))
            }
        }
        let job = self.jobs.remove(&id).expect("checked above");
        self.queued_by_tier[job.spec.tier.rank() as usize] -= 1;
        Ok(())
    }

    /// A fire drill: gives running preemptible job `id` a real drain
    /// notice now, with the deadline any drain would have (`now` plus the
    /// operator's `drain_window`). It is committed as a one-drain plan
    /// through [`State::apply`], so it meets every check a pass's drain
    /// does; the edge carries it out as it carries out a pass's drains.
    /// When the attempt exits without finishing, [`State::exited`] requeues
    /// it as [`ExitEffect::Drilled`]. Refused unless the job is preemptible
    /// and running without a notice.
    pub fn drill(&mut self, id: JobId, now: Time, drain_window: Span) -> Result<Drain, StateError> {
        let job = self.job_checked(id)?;
        if job.spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!(
                "job {id}: {}; only preemptible jobs are drained, so only they can be drilled",
                job.spec.tier
            )));
        }
        let attempt = match (job.phase, &job.run) {
            (Phase::Running, Some(run)) => run.attempt,
            (Phase::Draining, _) => {
                return Err(StateError::Conflict(format!("job {id}: already draining")));
            }
            _ => return Err(StateError::Conflict(format!("job {id}: not running"))),
        };
        let drain = Drain {
            job: id,
            attempt,
            notice_at: now,
            deadline: now + drain_window,
            reason: DrainReason::Drill,
        };
        let plan = Plan { now, drains: vec![drain], ..Plan::default() };
        self.apply(&plan).map_err(|e| StateError::Conflict(format!("job {id}: {e}")))?;
        Ok(drain)
    }

    /// Moves preemptible job `id` to the on-demand tier because its
    /// deadline no longer fits the preemptible tier's risk (the edge
    /// decides when). A queued job changes queue, where it takes its place
    /// as of `now`, as if submitted to on-demand then: by its submission
    /// time, a tenant could hold an early place in the on-demand queue at
    /// the preemptible price and claim it later. A running job changes
    /// tier where it runs (and would queue from `now` if it ran again): its GPUs move from
    /// the preemptible to the on-demand counters and it leaves the victim
    /// indices. That needs on-demand room outside every reservation at
    /// `now` (a job on lent reserved GPUs may be what fills it); without
    /// it the promotion is refused as a conflict and the job runs on as
    /// preemptible, for the edge to try again. A draining job is refused
    /// too: it is promoted once its exit has requeued it.
    pub fn promote(&mut self, id: JobId, now: Time) -> Result<Promoted, StateError> {
        let job = self.job_checked(id)?;
        if job.spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!(
                "job {id}: {}; only preemptible jobs are promoted",
                job.spec.tier
            )));
        }
        match job.phase {
            Phase::Queued => {
                self.dequeue(id);
                self.queued_by_tier[Tier::Preemptible.rank() as usize] -= 1;
                let spec = &mut self.jobs.get_mut(&id).expect("checked above").spec;
                spec.tier = Tier::OnDemand;
                // On-demand work is never shrunk: it runs on its fewest.
                spec.max_gpus = None;
                spec.submitted_at = spec.submitted_at.max(now);
                self.enqueue(id);
                Ok(Promoted::Queued)
            }
            Phase::Running => {
                let run = job.run.clone().expect("a running job has a run");
                if !run.leaving().is_empty() {
                    return Err(StateError::Conflict(format!(
                        "job {id}: nodes of it are leaving; promoted once they have"
                    )));
                }
                let (model, gpus, tenant) = (run.model, run.gpus(), job.spec.tenant);
                let nodes: Vec<NodeId> = run.alloc.iter().map(|(n, _)| *n).collect();
                let m = &self.models[model.0 as usize];
                let cap = m.capacity.saturating_sub(self.reserved_total(model, now));
                if m.on_demand_used + gpus > cap {
                    return Err(StateError::Conflict(format!(
                        "job {id}: no on-demand room outside reservations for {gpus} {} GPUs ({} of {cap} in use)",
                        m.name, m.on_demand_used
                    )));
                }
                self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
                self.adjust_usage(Tier::OnDemand, tenant, model, gpus as i64);
                // Its use so far moves with it: usage follows the tier a run is in.
                self.fair_stop(Tier::Preemptible, tenant, &run);
                let spec = &mut self.jobs.get_mut(&id).expect("checked above").spec;
                spec.tier = Tier::OnDemand;
                spec.submitted_at = spec.submitted_at.max(now);
                // It runs on as it is, never shrunk or grown again.
                if spec.max_gpus.take().is_some() {
                    spec.gpus = gpus;
                    self.regrow(id);
                }
                self.fair_start(id);
                for node in nodes {
                    self.reindex(node);
                }
                Ok(Promoted::Running)
            }
            Phase::Draining => {
                Err(StateError::Conflict(format!("job {id}: draining; promoted once requeued")))
            }
            Phase::Holding => unreachable!("preemptible jobs never hold GPUs"),
        }
    }

    /// The attempt's processes have all exited; its GPUs are free (or pass
    /// to the preemptor holding them).
    pub fn exited(&mut self, id: JobId, attempt: Attempt, kind: ExitKind) -> Result<ExitEffect, StateError> {
        self.fence(id, attempt)?;
        let job = &self.jobs[&id];
        let draining = job.phase == Phase::Draining;
        let drill = job.notice.is_some_and(|n| n.reason == DrainReason::Drill);
        self.end_run(id);
        let effect = match (draining, kind) {
            (_, ExitKind::Lost) => ExitEffect::RequeuedLost,
            (_, ExitKind::Restart) => ExitEffect::Restarted,
            (_, ExitKind::Completed) => ExitEffect::Finished,
            (_, ExitKind::Cancelled) => ExitEffect::Cancelled,
            (false, ExitKind::Requeue) => {
                self.jobs.get_mut(&id).expect("fenced").requeued_itself = true;
                ExitEffect::RequeuedLost
            }
            (true, ExitKind::Failed { .. } | ExitKind::Requeue) if drill => {
                self.jobs.get_mut(&id).expect("fenced").drilled = true;
                ExitEffect::Drilled
            }
            (true, ExitKind::Failed { .. } | ExitKind::Requeue) => {
                let job = self.jobs.get_mut(&id).expect("fenced");
                job.preemptions += 1;
                job.drilled = false;
                job.requeued_itself = false;
                match job.spec.max_preemptions {
                    Some(max) if job.preemptions > max => ExitEffect::PreemptionLimitReached,
                    _ => ExitEffect::Requeued { preempted: true },
                }
            }
            (false, ExitKind::Failed { requeue: true }) => ExitEffect::Requeued { preempted: false },
            (false, ExitKind::Failed { requeue: false }) => ExitEffect::Failed,
        };
        if let ExitEffect::Requeued { .. }
        | ExitEffect::RequeuedLost
        | ExitEffect::Restarted
        | ExitEffect::Drilled = effect
        {
            self.requeue(id);
        } else {
            self.jobs.remove(&id);
        }
        Ok(effect)
    }

    /// The attempt reports a completed checkpoint taken at `at`.
    pub fn checkpointed(&mut self, id: JobId, attempt: Attempt, at: Time) -> Result<(), StateError> {
        self.fence(id, attempt)?;
        let job = self.jobs.get_mut(&id).expect("fenced");
        let run = job.run.as_mut().expect("fenced");
        run.last_checkpoint_at = Some(run.last_checkpoint_at.map_or(at, |t| t.max(at)));
        let nodes: Vec<NodeId> = run.alloc.iter().map(|(n, _)| *n).collect();
        if job.spec.tier == Tier::Preemptible && job.phase == Phase::Running {
            for node in nodes {
                self.reindex(node);
            }
        }
        Ok(())
    }

    pub(super) fn job_checked(&self, id: JobId) -> Result<&Job, StateError> {
        self.jobs.get(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))
    }

    /// Refuses anything about an attempt that is not the job's live one.
    pub(super) fn fence(&self, id: JobId, attempt: Attempt) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        match &job.run {
            Some(run) if run.attempt == attempt => Ok(()),
            _ => Err(StateError::StaleAttempt { job: id, attempt, current: job.attempt }),
        }
    }

    // ---- internal bookkeeping -----------------------------------------

    pub(super) fn enqueue(&mut self, id: JobId) {
        self.queue_insert(id);
        self.queued_by_tier[self.jobs[&id].spec.tier.rank() as usize] += 1;
    }

    /// Removes a queued job from its class (the tier count is left to the
    /// caller: a job that leaves the queue to hold GPUs is still queued).
    pub(super) fn dequeue(&mut self, id: JobId) {
        self.queue_remove(id);
    }

    pub(super) fn requeue(&mut self, id: JobId) {
        let job = self.jobs.get_mut(&id).expect("requeue of a known job");
        job.phase = Phase::Queued;
        job.run = None;
        job.notice = None;
        self.enqueue(id);
    }

    /// Frees the GPUs of a running or draining job and updates counters.
    pub(super) fn end_run(&mut self, id: JobId) {
        let job = self.jobs.get_mut(&id).expect("end_run of a known job");
        let run = job.run.take().expect("end_run of a running job");
        if let [(node, _)] = run.alloc[..] {
            job.last_node = Some(node);
        }
        let was_draining = job.phase == Phase::Draining;
        match job.notice.map(|n| n.reason) {
            Some(DrainReason::FairShare { .. }) => self.fair_share_draining -= 1,
            Some(DrainReason::Quota { .. }) => self.quota_draining -= 1,
            _ => {}
        }
        let job = self.jobs.get_mut(&id).expect("end_run of a known job");
        job.notice = None;
        let (tier, tenant, elastic) = (job.spec.tier, job.spec.tenant, job.spec.is_elastic());
        self.fair_stop(tier, tenant, &run);
        if !was_draining {
            // Leaving parts stopped counting at their notice.
            self.adjust_usage(tier, tenant, run.model, -(run.active_gpus() as i64));
        }
        if elastic {
            self.growable.remove(&id);
        }
        for &(node, mask) in &run.alloc {
            let n = &mut self.nodes[node.0 as usize];
            debug_assert_eq!(n.used & mask, mask, "freeing GPUs that were not used");
            n.used &= !mask;
            n.jobs.retain(|(j, _)| *j != id);
            self.reindex(node);
        }
        if let Some(preemptor) = self.victim_of.remove(&id) {
            if let Some(hold) = self.holds.get_mut(&preemptor) {
                hold.waiting_on.remove(&id);
            }
            self.ready_if_done(preemptor);
        }
        for (node, _) in run.leaving() {
            self.part_gone(id, *node);
        }
    }

    /// The part on `node` of elastic job `id` no longer holds its GPUs:
    /// a preemptor waiting for it waits for it no more.
    fn part_gone(&mut self, id: JobId, node: NodeId) {
        if let Some(preemptor) = self.part_victim_of.remove(&(id, node)) {
            if let Some(hold) = self.holds.get_mut(&preemptor) {
                hold.waiting_parts.remove(&(id, node));
            }
            self.ready_if_done(preemptor);
        }
    }

    /// A hold whose victims and parts have all left is ready.
    fn ready_if_done(&mut self, preemptor: JobId) {
        if self.holds.get(&preemptor).is_some_and(|h| h.waiting_on.is_empty() && h.waiting_parts.is_empty()) {
            self.ready_holds.insert(preemptor);
        }
    }

    /// The part on `node` of elastic job `id`, given its notice by a
    /// shrink, has exited: its GPUs are free (or pass to the preemptor
    /// holding them) and the attempt goes on on its other nodes. What
    /// the part used is the edge's to meter, from when it joined
    /// ([`Run::joined_at`]) to its exit.
    pub fn part_left(&mut self, id: JobId, attempt: Attempt, node: NodeId) -> Result<(), StateError> {
        self.fence(id, attempt)?;
        let job = self.jobs.get_mut(&id).expect("fenced");
        let run = job.run.as_mut().expect("fenced");
        if !run.is_leaving(node) {
            return Err(StateError::Conflict(format!("job {id}: its part on {node} was not told to leave")));
        }
        self.drop_part(id, node);
        Ok(())
    }

    /// Whether `id`'s part on `node` was told to leave by a shrink.
    pub(super) fn leaving_on(&self, id: JobId, node: NodeId) -> bool {
        self.jobs.get(&id).and_then(|j| j.run.as_ref()).is_some_and(|r| r.is_leaving(node))
    }

    /// Elastic job `id`'s leaving part on `node` is gone (exited, or lost
    /// with its node): its GPUs are free, or pass to the preemptor
    /// holding them, and its use stops counting.
    pub(super) fn drop_part(&mut self, id: JobId, node: NodeId) {
        let job = self.jobs.get_mut(&id).expect("a known job");
        let run = job.run.as_mut().expect("a running job");
        let (tier, tenant) = (job.spec.tier, job.spec.tenant);
        let at = run.alloc.iter().position(|(n, _)| *n == node).expect("a leaving node is the run's");
        let (_, mask) = run.alloc.remove(at);
        let joined = run.joined_at(node);
        let resized = run.resized_mut();
        resized.joined.retain(|(n, _)| *n != node);
        resized.leaving.retain(|(n, _)| *n != node);
        let rate = run.gpu_rate.saturating_mul(mask.count_ones() as u64);
        self.fair.stop(tier, tenant, rate, joined);
        self.rekey(tier, tenant);
        let n = &mut self.nodes[node.0 as usize];
        debug_assert_eq!(n.used & mask, mask, "freeing GPUs that were not used");
        n.used &= !mask;
        n.jobs.retain(|(j, _)| *j != id);
        self.reindex(node);
        self.part_gone(id, node);
        self.regrow(id);
    }

    /// Keeps `growable` true of elastic job `id`: running below its most
    /// GPUs, none of its nodes leaving.
    pub(super) fn regrow(&mut self, id: JobId) {
        let growable = self.jobs.get(&id).is_some_and(|j| {
            j.phase == Phase::Running
                && j.run.as_ref().is_some_and(|r| r.leaving().is_empty() && r.gpus() < j.spec.most_gpus())
        });
        match growable {
            true => self.growable.insert(id),
            false => self.growable.remove(&id),
        };
    }

    /// Moves the tier counters by `delta` GPUs (negative to release).
    /// Draining preemptible jobs are no longer counted, so their callers
    /// release them when the drain starts, not when they exit.
    pub(super) fn adjust_usage(&mut self, tier: Tier, tenant: TenantId, model: GpuModelId, delta: i64) {
        let apply = |v: &mut u32| *v = (*v as i64 + delta) as u32;
        if tier != Tier::Reserved {
            self.quotas.adjust(tier, model, tenant, delta);
        }
        let m = &mut self.models[model.0 as usize];
        match tier {
            Tier::Reserved => {
                apply(&mut m.reserved_used);
                apply(self.reserved_used.entry((tenant, model)).or_insert(0));
            }
            Tier::OnDemand => apply(&mut m.on_demand_used),
            Tier::Preemptible => apply(&mut m.preemptible_active),
        }
    }

    /// Releases every hold with GPUs on `node`; the holders queue again.
    pub(super) fn release_holds_on(&mut self, node: NodeId) {
        let holders: Vec<JobId> =
            self.holds.values().filter(|h| h.alloc.iter().any(|(n, _)| *n == node)).map(|h| h.job).collect();
        for job in holders {
            self.drop_hold(job);
            self.requeue_holder(job);
        }
    }

    /// A job whose hold was released waits in its queue class again.
    pub(super) fn requeue_holder(&mut self, job: JobId) {
        self.jobs.get_mut(&job).expect("holder exists").phase = Phase::Queued;
        self.queue_insert(job);
    }

    /// Forgets a hold: its GPUs become free again as their victims leave.
    pub(super) fn drop_hold(&mut self, job: JobId) {
        let hold = self.holds.remove(&job).expect("holding job has a hold");
        self.ready_holds.remove(&job);
        if let Some(staged) = hold.staged {
            // Its node may have started that attempt already.
            self.spend(job, staged);
        }
        let spec = &self.jobs[&job].spec;
        let (tier, tenant, gpus) = (spec.tier, spec.tenant, spec.gpus);
        self.adjust_usage(tier, tenant, hold.model, -(gpus as i64));
        for victim in &hold.waiting_on {
            self.victim_of.remove(victim);
        }
        for part in &hold.waiting_parts {
            self.part_victim_of.remove(part);
        }
        for &(node, mask) in &hold.alloc {
            self.nodes[node.0 as usize].held &= !mask;
            self.reindex(node);
        }
    }
}
