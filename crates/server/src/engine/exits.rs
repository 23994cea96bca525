//! Attempts that end: a node's part exits, and the attempt ends once every
//! node's part has. The transition itself is `ending::end_attempt`.

use super::effects::{self, Effects};
use super::ending::{end_attempt, exit_kind, EndNote, STOP_GRACE_MS};
use super::table::JobTable;
use super::*;

/// How long after its deadline an attempt that never started (its node
/// still pulling its image) is ended by the server, whatever its agent
/// says: the agent's own kill at the deadline, and its report, come first.
pub const UNSTARTED_GRACE_MS: u64 = 5_000;

/// Where `job`'s live attempt, drained or cancelled and not yet started,
/// is due to be ended by the server; None if it started, or has no
/// notice.
pub(super) fn unstarted_due(job: &JobRecord) -> Option<u64> {
    if job.run_started_ms.is_some() || job.running_on.is_empty() || !job.state.is_live() {
        return None;
    }
    let drain = job.drain.as_ref().map(|n| n.deadline_ms);
    let cancel = job.cancel_notice.map(|c| c.1);
    let deadline = match (drain, cancel) {
        (Some(d), Some(c)) => d.min(c),
        (d, c) => d.or(c)?,
    };
    Some(deadline.saturating_add(UNSTARTED_GRACE_MS))
}

impl<S: Store> Engine<S> {
    /// One node's processes of an attempt are gone (at `at_ms` by the
    /// agent's clock); when the last node's are, the attempt has ended.
    pub(super) fn part_exited(
        &mut self,
        node: &str,
        attempt: AttemptRef,
        exit: PartExit,
        at_ms: u64,
        now: u64,
    ) -> Written {
        let PartExit {
            code,
            signal,
            completed,
            vanished,
            peak_memory_bytes,
            start_error,
            port_in_use,
            ended_by,
        } = exit;
        let id = attempt.job;
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let first_part = job.running_on.len() == job.placement.len();
        job.running_on.retain(|n| n != node);
        job.exited_ms = job.exited_ms.max(at_ms);
        job.vanished |= vanished;
        // A job's own requeue wins over its time limit: it asked in time.
        job.ended_by = match (job.ended_by, ended_by) {
            (Some(EndedBy::Requeue), _) | (_, Some(EndedBy::Requeue)) => Some(EndedBy::Requeue),
            (earlier, later) => earlier.or(later),
        };
        // The attempt's exit is its first part's, unless a later one
        // failed where those before succeeded: a part killed by a signal
        // after another exited 0 is the attempt's failure, not its success.
        let part_ok = code == Some(0) && signal.is_none() && !vanished;
        let so_far_ok = job.exit_code == Some(0) && job.exit_signal.is_none();
        if first_part || (so_far_ok && !part_ok) {
            job.exit_code = code;
            job.exit_signal = signal;
        }
        if let Some(port) = port_in_use {
            self.port_taken(id, node, port);
        }
        let detail = ExitedDetail {
            node: node.to_string(),
            code,
            signal,
            completed_marker: completed,
            vanished,
            peak_memory_bytes,
            start_error,
            port_in_use,
        };
        self.event(id, Event::Exited(detail))?;
        let job = &self.jobs[&id];
        if !job.running_on.is_empty() {
            return self.others_running(id, node, (code, signal, vanished, ended_by), part_ok, now);
        }
        let kind = exit_kind(job, completed, self.config.limits.max_requeues);
        let effect = match self.core.exited(id, attempt.attempt, kind) {
            Ok(effect) => effect,
            Err(e) => {
                tracing::error!(job = id.0, "core refused the exit: {e}");
                return self.save(id);
            }
        };
        let end_ms = self.jobs[&id].exited_ms;
        let reason = end_reason(&self.jobs[&id], effect, node);
        self.ended(id, effect, end_ms, now, EndNote { reason, ..Default::default() })
    }

    /// A part of a gang exited while others run. Being drained or
    /// cancelled, the other parts already have their notice and deadline:
    /// they finish their own save. A part that failed fails the gang: the
    /// others are stopped now. A part that exited 0 leaves the others the
    /// gang exit grace to exit on their own (torchrun's nodes end
    /// milliseconds apart; a rank 0 may save final weights after its peers
    /// are done).
    fn others_running(
        &mut self,
        id: JobId,
        node: &str,
        (code, signal, vanished, ended_by): (Option<i32>, Option<i32>, bool, Option<EndedBy>),
        part_ok: bool,
        now: u64,
    ) -> Written {
        let job = &self.jobs[&id];
        if job.state == JobState::Draining || job.cancel_requested || job.gang_stopped.is_some() {
            return self.save(id);
        }
        if let Some(why) = self.jobs[&id].rendezvous_failed.clone() {
            self.stop_gang(id, format!("{why}: the other parts were stopped"))?;
            return self.save(id);
        }
        if part_ok {
            if job.gang_grace_until.is_none() {
                let until_ms = now.saturating_add(self.config.gang_exit_grace.as_millis());
                self.jobs.get_mut(&id).expect("live attempt").gang_grace_until = Some(until_ms);
                self.jobs.gang_graces.insert(until_ms, id);
            }
        } else {
            let why = match (code, signal, vanished) {
                _ if ended_by == Some(EndedBy::Requeue) => {
                    format!("node {node}'s part asked to be requeued")
                }
                _ if ended_by == Some(EndedBy::TimeLimit) => {
                    format!("node {node}'s part ran past the time limit")
                }
                _ if ended_by == Some(EndedBy::NodeStopping) => {
                    format!("node {node}'s agent stopped and ended its part")
                }
                (_, _, true) => format!("node {node}'s part was lost"),
                (_, Some(sig), _) => format!("node {node}'s part was killed by signal {sig}"),
                (Some(c), _, _) => format!("node {node}'s part exited with code {c}"),
                _ => format!("node {node}'s part ended"),
            };
            self.stop_gang(id, format!("{why}: the other parts were stopped"))?;
        }
        self.save(id)
    }

    /// The gang's rendezvous port was taken on `node` by another program:
    /// no gang gets it there again, and this attempt is requeued once its
    /// parts have ended (a failure to meet is not the job's).
    fn port_taken(&mut self, id: JobId, node: &str, port: u16) {
        let addr =
            self.fleet.nodes.get(node).and_then(|n| n.address.clone()).unwrap_or_else(|| node.to_string());
        let taken = self.fleet.busy_ports.entry(addr).or_default();
        if !taken.contains(&port) {
            taken.push_back(port);
            if taken.len() > BUSY_PORTS_KEPT {
                taken.pop_front();
            }
        }
        let why =
            format!("the rendezvous port {port} (MASTER_PORT) is in use on node {node} by another program");
        tracing::warn!(job = id.0, node, port, "{why}; the gang is requeued with another port");
        self.jobs.get_mut(&id).expect("live attempt").rendezvous_failed = Some(why);
    }

    fn stop_gang(&mut self, id: JobId, why: String) -> Written {
        let (jobs, _, _, mut fx) = self.parts();
        stop_gang(jobs, &mut fx, id, why)
    }

    /// Attempts drained or cancelled before they started, whose deadline
    /// (and grace) has passed with no exit from their nodes: ended here,
    /// as lost with those nodes' parts, so that their GPUs go to whoever
    /// waits. A start the agent reports later is a stale attempt's, and
    /// killed.
    pub(super) fn end_unstarted(&mut self, now: u64) -> Written {
        while let Some((until_ms, (id, attempt))) = self.jobs.unstarted.pop_due(now) {
            let Some(job) = self.jobs.get(&id) else { continue };
            if job.attempt != attempt || unstarted_due(job) != Some(until_ms) {
                continue; // it started, ended, or has another deadline
            }
            let deadline = until_ms - UNSTARTED_GRACE_MS;
            let why =
                "not started by its deadline (its node was still preparing it, e.g. pulling its image): \
                       ended by the server";
            tracing::warn!(job = id.0, attempt = attempt.0, "{why}");
            let a = AttemptRef { job: id, attempt };
            for node in job.running_on.clone() {
                self.outbox.push(&node, Action::Stop { attempt: a, grace_ms: 0, notice: None });
                let exit = PartExit::vanished(Some(why.to_string()));
                if !self.jobs.get(&id).is_some_and(|j| j.attempt == attempt && j.running_on.contains(&node)) {
                    break;
                }
                self.part_exited(&node, a, exit, deadline, now)?;
            }
        }
        Ok(())
    }

    /// The live attempt of job `id` ended at `end_ms` with `effect` (the
    /// core knows already): the record, its usage record, the event (with
    /// `note` in its detail), the tenant's load and a restart's back-off.
    pub(super) fn ended(
        &mut self,
        id: JobId,
        effect: ExitEffect,
        end_ms: u64,
        now: u64,
        note: EndNote,
    ) -> Written {
        let min_runtime = self.sched.min_runtime;
        // What a drill needs of the attempt, before the record forgets it.
        let drill_end = self.drill_attempt_end(id, effect, end_ms);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        deadline::attempt_ended(job, end_ms);
        // A drill is not a drain in the counters: its time is run time.
        let drained_ms = job
            .drain
            .as_ref()
            .filter(|_| effect != ExitEffect::Drilled)
            .map(|n| end_ms.saturating_sub(n.notice_at_ms));
        let mut ended = end_attempt(job, effect, end_ms, now, min_runtime);
        if let Some(usage) = &ended.usage {
            self.store.add_usage(usage)?;
            self.fair_share_usage(usage, now);
        }
        self.counters.ended(ended.usage.as_ref(), drained_ms);
        self.counters.lost_gpu_seconds += ended.lost_gpu_ms as f64 / 1000.0;
        self.counters.preempted += u64::from(ended.preempted);
        if ended.backoff_ms > 0 {
            // Out of the core's queue until the back-off is over.
            match self.core.cancel(id) {
                Ok(()) => {
                    let until_ms = now.saturating_add(ended.backoff_ms);
                    self.jobs.get_mut(&id).expect("live attempt").waiting =
                        Some(Waiting::Backoff { until_ms });
                    self.jobs.backoff.insert(until_ms, id);
                }
                Err(e) => tracing::error!(job = id.0, "restart back-off not applied: {e}"),
            }
        }
        note.add_to(&mut ended.event);
        self.event(id, ended.event)?;
        self.drill_changed(id, |d| d.attempt_ended(drill_end, now))?;
        if ended.state.is_final() {
            self.finished(id)?;
        }
        self.save(id)?;
        if ended.state == JobState::Queued && self.jobs[&id].cancel_requested {
            // Its cancel stands: an attempt lost with its node while it
            // was being cancelled does not run again.
            return match self.cancel(id, &ebb_api::CancelRequest::default(), now) {
                Ok(_) => Ok(()),
                Err(Fail::Store(e)) => Err(e),
                Err(Fail::Refused(e)) => {
                    tracing::error!(job = id.0, "its cancel could not stand: {}", e.message);
                    Ok(())
                }
            };
        }
        // Back in the queue, it may no longer have the time to wait.
        self.judge_deadline(id, now)
    }
}

/// Why an attempt ended as it did, where its exit alone does not say:
/// a gang that could not meet or was stopped, the job's own requeue, its
/// node's agent stopping, its time limit.
fn end_reason(job: &JobRecord, effect: ExitEffect, node: &str) -> Option<String> {
    match (&job.rendezvous_failed, &job.gang_stopped) {
        (Some(why), _) if effect == ExitEffect::RequeuedLost => {
            Some(format!("{why}; requeued with another port"))
        }
        _ if job.ended_by == Some(EndedBy::Requeue) && effect == ExitEffect::RequeuedLost => {
            Some("requeued by the job (scontrol requeue)".to_string())
        }
        _ if job.ended_by == Some(EndedBy::NodeStopping) && effect == ExitEffect::RequeuedLost => {
            Some(format!("requeued: node {node}'s agent stopped (SIGTERM) before the attempt ended"))
        }
        _ if job.ended_by == Some(EndedBy::Requeue)
            && effect == ExitEffect::Failed
            && job.state != JobState::Draining =>
        {
            Some(format!("requeued itself {} times, the most a job may (--max-requeues)", job.requeues))
        }
        _ if job.ended_by == Some(EndedBy::TimeLimit) && effect == ExitEffect::Failed => {
            let limit = job.spec.time_limit_ms.map(|ms| Span(ms).human()).unwrap_or_default();
            Some(format!("time limit: it ran past its limit of {limit}"))
        }
        (_, Some(why))
            if matches!(effect, ExitEffect::Failed | ExitEffect::Requeued { preempted: false }) =>
        {
            Some(why.clone())
        }
        _ => None,
    }
}

/// Stops the parts of gang `id` still running, for `why`: the attempt has
/// failed, whatever they exit with.
pub(super) fn stop_gang(jobs: &mut JobTable, fx: &mut impl Effects, id: JobId, why: String) -> Written {
    let job = jobs.get_mut(&id).expect("live attempt");
    let attempt = AttemptRef { job: id, attempt: job.attempt };
    job.gang_stopped = Some(why.clone());
    for node in &job.running_on {
        fx.send(node, Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None });
    }
    fx.event(&jobs[&id], Event::GangStopped(GangStoppedDetail { reason: why }))
}

/// Gangs whose grace after a part's exit 0 has run out by `now` with
/// parts still running (`gang_exit_grace` after that exit): those are
/// stopped, and the attempt fails.
pub(super) fn end_gang_graces(
    jobs: &mut JobTable,
    gang_exit_grace: Span,
    fx: &mut impl Effects,
    now: u64,
) -> Written {
    while let Some((until_ms, id)) = jobs.gang_graces.pop_due(now) {
        let Some(job) = jobs.get(&id) else { continue };
        if !job.state.is_live() || job.gang_grace_until != Some(until_ms) || job.running_on.is_empty() {
            continue;
        }
        if job.state == JobState::Draining || job.cancel_requested || job.gang_stopped.is_some() {
            continue;
        }
        let waiting = job.running_on.join(", ");
        let grace = gang_exit_grace.human();
        let why = format!(
            "a part exited 0, and {waiting} had not exited within the gang exit grace of {grace}: stopped"
        );
        stop_gang(jobs, fx, id, why)?;
        effects::save(jobs, fx, id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_past_its_grace_has_its_running_parts_stopped_once_and_one_that_ended_is_left() {
        let mut gang = JobRecord::running_gang(JobId(3), Attempt(2), &["b", "c"]);
        gang.gang_grace_until = Some(10_000);
        let mut jobs = JobTable::new(JobId(4));
        jobs.insert(JobId(3), Box::new(gang));
        jobs.gang_graces.insert(10_000, JobId(3));
        let mut fx = effects::Recorded { now: 10_000, ..Default::default() };
        end_gang_graces(&mut jobs, Span(60_000), &mut fx, 9_999).unwrap();
        assert!(fx.sent.is_empty() && fx.events.is_empty(), "not yet due");
        end_gang_graces(&mut jobs, Span(60_000), &mut fx, 10_000).unwrap();
        let attempt = AttemptRef { job: JobId(3), attempt: Attempt(2) };
        let stopped: Vec<&str> = fx
            .sent
            .iter()
            .filter(|(_, a)| matches!(a, Action::Stop { attempt: a, .. } if *a == attempt))
            .map(|(node, _)| node.as_str())
            .collect();
        assert_eq!(stopped, ["b", "c"]);
        assert!(
            matches!(&fx.events[..], [(JobId(3), Event::GangStopped(g))] if g.reason.contains("b, c had not exited within the gang exit grace of 1m")),
            "{:?}",
            fx.events
        );
        assert_eq!(fx.saved.len(), 1);
        assert!(fx.saved[0].gang_stopped.is_some());
        // Due again (a stale entry), it is stopped already: nothing more.
        jobs.gang_graces.insert(10_000, JobId(3));
        end_gang_graces(&mut jobs, Span(60_000), &mut fx, 20_000).unwrap();
        assert_eq!((fx.sent.len(), fx.events.len(), fx.saved.len()), (2, 1, 1));
    }
}
