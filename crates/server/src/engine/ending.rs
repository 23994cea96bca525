//! The end of an attempt, as a pure function of the job's record: how the
//! core is told it ended, and what ending it does to the record and writes
//! (the state, the event, the usage record, the work lost). The writer
//! applies it wherever an attempt ends: its processes exit, its node is
//! lost or removed, or a restarted server cannot put it back.

use super::*;
use crate::billing::NodeSpan;

/// The grace between a stop's signal and SIGKILL: a cancel's unless it
/// asks for another (`ebb cancel --grace`), and the other nodes' of a gang
/// whose part ended.
pub const STOP_GRACE_MS: u64 = 10_000;

/// What ended an attempt besides its own exit, as its node said; kept on
/// the record until the attempt's end is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The job asked to be requeued (`scontrol requeue`, its endpoint's
    /// `requeue`): requeued as a preemption is, not failed.
    Requeue,
    /// It ran past its time limit.
    TimeLimit,
    /// Its node's agent was stopped and the attempt still ran at the
    /// agent's stop timeout: requeued, not the job's failure.
    NodeStopping,
}

impl From<ebb_api::EndedBy> for EndedBy {
    fn from(by: ebb_api::EndedBy) -> EndedBy {
        match by {
            ebb_api::EndedBy::Requeue => EndedBy::Requeue,
            ebb_api::EndedBy::TimeLimit => EndedBy::TimeLimit,
            ebb_api::EndedBy::NodeStopping => EndedBy::NodeStopping,
        }
    }
}

/// The grace a cancel gets: the one asked for, or [`STOP_GRACE_MS`] (the
/// drain window if that is shorter). A cancel never holds GPUs longer
/// than a preemption may, so more than the drain window is refused.
pub(super) fn cancel_grace_ms(asked_ms: Option<u64>, drain_window: Span) -> Result<u64, Refusal> {
    match asked_ms {
        None => Ok(STOP_GRACE_MS.min(drain_window.0)),
        Some(ms) if ms <= drain_window.0 => Ok(ms),
        Some(ms) => Err(Refusal::unacceptable(format!(
            "grace_ms: a cancel's grace may be at most the drain window, {drain_window}; got {}",
            Span(ms)
        ))),
    }
}

/// The deadline of a cancel of `job` asked at `now` with `grace_ms`: its
/// drain's deadline if that comes sooner. None if the job already has a
/// cancel that ends it no later (a cancel never gives more time).
pub(super) fn cancel_deadline(job: &JobRecord, grace_ms: u64, now: u64) -> Option<u64> {
    let mut deadline = now.saturating_add(grace_ms);
    if let Some(DrainNotice { deadline_ms: drain_deadline, .. }) = job.drain.as_deref() {
        deadline = deadline.min(*drain_deadline);
    }
    match (job.cancel_requested, job.cancel_notice) {
        (false, _) => Some(deadline),
        (true, Some((_, earlier))) if deadline < earlier => Some(deadline),
        (true, _) => None,
    }
}

/// What stops `job`'s live `attempt` once its cancel was asked, as seen
/// at `now`: the cancel's notice and SIGKILL at its deadline (a record
/// of an older server, without one: the default grace from now).
pub(super) fn cancel_stop(job: &JobRecord, attempt: AttemptRef, now: u64) -> Action {
    match job.cancel_notice {
        Some((notice_at_ms, deadline_ms)) => Action::Stop {
            attempt,
            grace_ms: deadline_ms.saturating_sub(now),
            notice: Some(ebb_api::StopNotice { notice_at_ms, deadline_ms }),
        },
        None => Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None },
    }
}

/// What ending an attempt writes, beside the record it changed.
#[derive(Debug, PartialEq)]
pub(super) struct Ended {
    pub state: JobState,
    pub event: Event,
    /// The attempt's usage record: none if it never reported a start
    /// (nothing is known to have run).
    pub usage: Option<crate::store::UsageRow>,
    pub lost_gpu_ms: u64,
    /// A `--restart always` job's back-off before it runs again.
    pub backoff_ms: u64,
    /// It ended preempted: requeued, or failed past its max_preemptions.
    pub preempted: bool,
}

/// How the core is to be told the attempt ended, from the record (the
/// exit codes gathered from every node) and the SDK's completion marker;
/// a job that has requeued itself `max_requeues` times fails at the next.
pub(super) fn exit_kind(job: &JobRecord, completed: bool, max_requeues: u64) -> ExitKind {
    // A gang whose parts Ebb stopped has failed, whatever they exited with.
    let success =
        job.exit_code == Some(0) && job.exit_signal.is_none() && !job.vanished && job.gang_stopped.is_none();
    if job.cancel_requested {
        ExitKind::Cancelled
    } else if job.vanished || job.rendezvous_failed.is_some() || job.ended_by == Some(EndedBy::NodeStopping) {
        // A gang that could not meet was not the job's failure.
        ExitKind::Lost
    } else if job.ended_by == Some(EndedBy::Requeue) {
        // The job asked to go back to the queue: during a drain that is
        // its preemption; otherwise neither a failure nor a preemption,
        // up to the cluster's bound.
        match job.state == JobState::Draining {
            true => ExitKind::Failed { requeue: false },
            false if u64::from(job.requeues) >= max_requeues => ExitKind::Failed { requeue: false },
            false => ExitKind::Requeue,
        }
    } else if job.state == JobState::Draining {
        match success && (completed || job.spec.exit_on_drain_is_success) {
            true => ExitKind::Completed,
            false => ExitKind::Failed { requeue: false },
        }
    } else if job.ended_by == Some(EndedBy::TimeLimit) {
        // A time limit ends the job, as Slurm's TIMEOUT: no retry, no restart.
        ExitKind::Failed { requeue: false }
    } else if job.spec.restart == Restart::Always {
        ExitKind::Restart
    } else if success {
        ExitKind::Completed
    } else {
        ExitKind::Failed { requeue: job.retries < job.spec.max_retries.unwrap_or(0) }
    }
}

/// GPU-milliseconds of the live attempt's work since its last checkpoint
/// (or its start), if it ended at `end_ms`.
pub(super) fn lost_work(job: &JobRecord, end_ms: u64) -> u64 {
    let started = job.run_started_ms.unwrap_or(job.started_ms);
    let saved = job.attempt_checkpoint_ms.map_or(started, |c| c.max(started));
    end_ms.saturating_sub(saved) * job.running_gpus() as u64
}

/// What the caller of `ended` knows of an attempt's end that the record
/// does not: the words of what made a gang's attempt fail (in place of
/// the event's own reason), and the node a lost attempt was on and why.
#[derive(Debug, Default)]
pub(super) struct EndNote {
    pub reason: Option<String>,
    pub node: Option<String>,
    pub why: Option<String>,
}

impl EndNote {
    /// The note, in the event an attempt's end made: a requeue or a
    /// failure; the other ends have nothing it could add to.
    pub(super) fn add_to(self, event: &mut Event) {
        match event {
            Event::Requeued(d) => {
                if let Some(reason) = self.reason {
                    d.reason = reason;
                }
                d.node = self.node.or(d.node.take());
                d.why = self.why.or(d.why.take());
            }
            Event::Failed(d) => d.reason = self.reason.or(d.reason.take()),
            _ => {}
        }
    }
}

/// The live attempt of `job` ended at `end_ms` (by the agents' clocks, or
/// the node's last contact) with `effect`, as the core decided, at the
/// server's `now`, under the scheduler's `min_runtime`. The record leaves
/// the attempt behind: its new state, counters and no placement.
pub(super) fn end_attempt(
    job: &mut JobRecord,
    effect: ExitEffect,
    end_ms: u64,
    now: u64,
    min_runtime: Span,
) -> Ended {
    let success = job.exit_code == Some(0) && !job.vanished;
    let lost_gpu_ms = match effect {
        ExitEffect::Requeued { preempted: true }
        | ExitEffect::RequeuedLost
        | ExitEffect::PreemptionLimitReached => lost_work(job, end_ms),
        _ => 0,
    };
    let outcome = match effect {
        ExitEffect::Drilled => "drill",
        ExitEffect::Finished => "completed",
        ExitEffect::Failed | ExitEffect::Requeued { preempted: false } => "failed",
        ExitEffect::Cancelled => "cancelled",
        ExitEffect::PreemptionLimitReached | ExitEffect::Requeued { preempted: true } => "preempted",
        // The job's own requeue, outside a drain: neither lost nor failed.
        ExitEffect::RequeuedLost if job.ended_by == Some(EndedBy::Requeue) => "requeued",
        ExitEffect::RequeuedLost => "lost",
        ExitEffect::Restarted if success => "completed",
        ExitEffect::Restarted => "failed",
    };
    // A drill's window is run time like any other: no drain in its record.
    let notice_at_ms = job.drain.as_ref().map(|n| n.notice_at_ms).filter(|_| effect != ExitEffect::Drilled);
    let usage = meter(job, end_ms, outcome, notice_at_ms, lost_gpu_ms, min_runtime);
    job.lost_gpu_ms += lost_gpu_ms;
    let lost = lost_gpu_ms as f64 / 1000.0;
    let (state, event, backoff_ms) = next_state(job, effect, lost, end_ms, now);
    job.timed_out = state == JobState::Failed && job.ended_by == Some(EndedBy::TimeLimit);
    job.state = state;
    leave_attempt(job);
    let preempted =
        matches!(effect, ExitEffect::Requeued { preempted: true } | ExitEffect::PreemptionLimitReached);
    Ended { state, event, usage, lost_gpu_ms, backoff_ms, preempted }
}

/// What the live attempt's record holds of it, gone: its placement, drain,
/// gang and pull; its exit too if the job runs again.
fn leave_attempt(job: &mut JobRecord) {
    job.ended_by = None;
    job.placement.clear();
    job.running_on.clear();
    job.drain = None;
    job.vanished = false;
    job.rendezvous = None;
    job.step_key = None;
    job.gang_grace_until = None;
    job.gang_stopped = None;
    job.rendezvous_failed = None;
    job.pulling = None;
    if job.state == JobState::Queued {
        job.exit_code = None;
        job.exit_signal = None;
    }
}

/// The job's state after its attempt ended with `effect`, the event that
/// says so, and the back-off before it may start again (ms); its counters
/// (preemptions, retries, requeues, quick exits) moved. `lost` is the
/// attempt's lost work, GPU-seconds.
fn next_state(
    job: &mut JobRecord,
    effect: ExitEffect,
    lost: f64,
    end_ms: u64,
    now: u64,
) -> (JobState, Event, u64) {
    let mut backoff_ms = 0;
    let requeued = |reason: &str| RequeuedDetail { reason: reason.into(), ..Default::default() };
    let (state, event) = match effect {
        ExitEffect::Finished => {
            let ran_ms = Some(now.saturating_sub(job.started_ms));
            (JobState::Succeeded, Event::Succeeded(SucceededDetail { ran_ms }))
        }
        ExitEffect::Failed => {
            let detail = FailedDetail { code: job.exit_code, signal: job.exit_signal, ..Default::default() };
            (JobState::Failed, Event::Failed(detail))
        }
        ExitEffect::Cancelled => (JobState::Cancelled, Event::Cancelled(CancelledDetail::default())),
        ExitEffect::PreemptionLimitReached => {
            job.preemptions += 1;
            job.drilled_since_preempted = false;
            job.requeued_itself = false;
            let detail = FailedDetail {
                reason: Some("preempted more than max_preemptions".into()),
                lost_gpu_seconds: Some(lost),
                ..Default::default()
            };
            (JobState::Failed, Event::Failed(detail))
        }
        ExitEffect::Requeued { preempted: true } => {
            job.preemptions += 1;
            job.drilled_since_preempted = false;
            job.requeued_itself = false;
            let detail = RequeuedDetail {
                preemptions: Some(job.preemptions),
                lost_gpu_seconds: Some(lost),
                ..requeued("preempted")
            };
            (JobState::Queued, Event::Requeued(detail))
        }
        ExitEffect::Requeued { preempted: false } => {
            job.retries += 1;
            (
                JobState::Queued,
                Event::Requeued(RequeuedDetail {
                    retries: Some(job.retries),
                    ..requeued("failed, retrying")
                }),
            )
        }
        ExitEffect::RequeuedLost if job.ended_by == Some(EndedBy::Requeue) => {
            // Its own requeue: no protection earned (as the core has it),
            // and the restart back-off when it comes quickly, so that a job
            // that requeues itself in a loop cannot start 35 attempts a
            // second.
            job.requeues = job.requeues.saturating_add(1);
            job.requeued_itself = true;
            let ran_ms = end_ms.saturating_sub(job.run_started_ms.unwrap_or(end_ms));
            job.quick_exits = if ran_ms < QUICK_EXIT_MS { job.quick_exits.saturating_add(1) } else { 0 };
            backoff_ms = restart_backoff_ms(job.quick_exits);
            let detail = RequeuedDetail {
                quick_exits: Some(job.quick_exits).filter(|n| *n > 0),
                backoff_seconds: Some(backoff_ms as f64 / 1000.0).filter(|_| backoff_ms > 0),
                ..requeued("requeued by the job")
            };
            (JobState::Queued, Event::Requeued(detail))
        }
        ExitEffect::RequeuedLost => (
            JobState::Queued,
            Event::Requeued(RequeuedDetail { lost_gpu_seconds: Some(lost), ..requeued("lost") }),
        ),
        ExitEffect::Drilled => {
            // As the core has it: the next attempt resumes from no preemption.
            job.drilled_since_preempted = true;
            (JobState::Queued, Event::Requeued(requeued("drill")))
        }
        ExitEffect::Restarted => {
            let ran_ms = end_ms.saturating_sub(job.run_started_ms.unwrap_or(end_ms));
            job.quick_exits = if ran_ms < QUICK_EXIT_MS { job.quick_exits.saturating_add(1) } else { 0 };
            backoff_ms = restart_backoff_ms(job.quick_exits);
            let detail = RequeuedDetail {
                code: job.exit_code,
                signal: job.exit_signal,
                quick_exits: Some(job.quick_exits),
                backoff_seconds: Some(backoff_ms as f64 / 1000.0),
                ..requeued("restart always")
            };
            (JobState::Queued, Event::Requeued(detail))
        }
    };
    (state, event, backoff_ms)
}

/// The usage record of the live attempt, ended at `end_ms`, drained from
/// `notice_at_ms` if it was. Whether it had its notice within
/// `min_runtime` of its placement is judged as the core judged it when it
/// chose the victim: from the placement instant (`started_ms`, the core's
/// `Run::started_at`) to the notice, both the server's instants, for a job
/// preempted before (its count is not yet moved by this ending).
fn meter(
    job: &JobRecord,
    end_ms: u64,
    outcome: &str,
    notice_at_ms: Option<u64>,
    lost_gpu_ms: u64,
    min_runtime: Span,
) -> Option<crate::store::UsageRow> {
    let (Some(started_ms), Some((model, rate, on_demand_rate))) = (job.run_started_ms, &job.billing) else {
        return None; // never reported started: nothing is known to have run
    };
    // As the core judged settling: an attempt a drill requeued follows none.
    let follows_preemption = job.preemptions > 0 && !job.drilled_since_preempted;
    let within_min_runtime = follows_preemption
        && notice_at_ms.is_some_and(|notice_at| Span(notice_at.saturating_sub(job.started_ms)) < min_runtime);
    Some(crate::billing::meter(crate::billing::Ended {
        job: job.id,
        attempt: job.attempt,
        tenant: job.tenant,
        tier: job.tier.as_str(),
        gpu_model: model,
        gpus: job.running_gpus(),
        started_ms,
        ended_ms: end_ms,
        notice_at_ms,
        rate: *rate,
        on_demand_rate: *on_demand_rate,
        lost_gpu_ms,
        outcome,
        follows_preemption,
        within_min_runtime,
        promoted: job.deadline.as_ref().and_then(|d| d.promoted.as_ref()).and_then(|p| {
            p.running.filter(|(attempt, _)| *attempt == job.attempt).map(|(_, rate)| (p.at_ms, rate))
        }),
        parts: node_spans(job, started_ms, end_ms, notice_at_ms),
    }))
}

/// An elastic attempt's parts, each node from its join to its exit: those
/// that left, and those there at its end. Empty for an attempt whose
/// nodes never changed, metered whole.
fn node_spans(job: &JobRecord, started_ms: u64, end_ms: u64, notice_at_ms: Option<u64>) -> Vec<NodeSpan> {
    let Some(elastic) = job.elastic.as_deref().filter(|e| !e.left.is_empty() || !e.joined.is_empty()) else {
        return Vec::new();
    };
    let left = elastic.left.iter().map(|l| NodeSpan {
        gpus: l.gpus,
        from_ms: l.from_ms,
        to_ms: l.to_ms,
        notice_at_ms: l.notice_at_ms,
    });
    let staying = job.placement.iter().map(|part| {
        let from_ms = elastic.joined.iter().find(|(n, _)| *n == part.node).map_or(started_ms, |(_, at)| *at);
        let leaving = elastic.leaving.iter().find(|l| l.node == part.node).map(|l| l.notice.notice_at_ms);
        NodeSpan {
            gpus: part.gpus.len() as u32,
            from_ms,
            to_ms: end_ms.max(from_ms),
            notice_at_ms: leaving.or(notice_at_ms),
        }
    });
    left.chain(staying).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN_RUNTIME: Span = Span(300_000);

    fn preempted_by_9(notice_at_ms: u64, deadline_ms: u64) -> DrainNotice {
        let (cause, reason) = (Drained::Preempted { by: JobId(9) }, "preempted by job 9".into());
        DrainNotice { notice_at_ms, deadline_ms, cause, reason }
    }

    /// A preemptible job of 2 GPUs placed at 1,000, started at 2,000 by its
    /// agent, checkpointed at 5,000, at $2.00 (preemptible $1.00) per GPU-hour.
    fn running() -> JobRecord {
        let spec = ebb_api::JobSubmission { argv: vec!["train".into()], ..Default::default() };
        let mut job =
            JobRecord::queued(JobId(7), TenantId(1), StoredSpec::from(spec), Tier::Preemptible, 2, 15, 0);
        job.state = JobState::Running;
        job.attempt = Attempt(3);
        job.placement = vec![Part::new("a", vec![0, 1])];
        job.running_on = vec!["a".into()];
        job.started_on = vec!["a".into()];
        job.started_ms = 1_000;
        job.run_started_ms = Some(2_000);
        job.attempt_checkpoint_ms = Some(5_000);
        job.billing = Some(("H100".into(), 1_000_000, 2_000_000));
        job
    }

    #[test]
    fn a_cancels_grace_is_ten_seconds_or_the_drain_window_and_never_more_than_the_window() {
        assert_eq!(cancel_grace_ms(None, Span(300_000)), Ok(10_000));
        assert_eq!(cancel_grace_ms(None, Span(3_000)), Ok(3_000));
        assert_eq!(cancel_grace_ms(Some(0), Span(3_000)), Ok(0));
        assert_eq!(cancel_grace_ms(Some(300_000), Span(300_000)), Ok(300_000));
        let refused = cancel_grace_ms(Some(600_000), Span(300_000)).unwrap_err();
        assert_eq!(
            (crate::http::status(refused.kind), refused.message.as_str()),
            (422, "grace_ms: a cancel's grace may be at most the drain window, 300s; got 600s")
        );
    }

    #[test]
    fn a_cancel_ends_a_draining_job_no_later_than_its_drain_and_a_second_cancel_only_sooner() {
        let mut job = running();
        assert_eq!(cancel_deadline(&job, 10_000, 20_000), Some(30_000));
        job.state = JobState::Draining;
        job.drain = Some(Box::new(preempted_by_9(15_000, 25_000)));
        assert_eq!(cancel_deadline(&job, 10_000, 20_000), Some(25_000), "the drain's deadline is sooner");
        assert_eq!(cancel_deadline(&job, 1_000, 20_000), Some(21_000));
        job.cancel_requested = true;
        job.cancel_notice = Some((20_000, 21_000));
        assert_eq!(cancel_deadline(&job, 1_000, 20_500), None, "no more time for a second cancel");
        assert_eq!(cancel_deadline(&job, 0, 20_500), Some(20_500));
        // A record of an older server, cancelled without a notice.
        job.cancel_notice = None;
        assert_eq!(cancel_deadline(&job, 0, 20_500), None);
        let a = AttemptRef { job: JobId(7), attempt: Attempt(3) };
        assert_eq!(
            cancel_stop(&job, a, 20_500),
            Action::Stop { attempt: a, grace_ms: STOP_GRACE_MS, notice: None }
        );
    }

    /// `ebb_preemptions_total` left out the preemption that took a job
    /// past its `max_preemptions`.
    #[test]
    fn a_preemption_past_the_limit_fails_the_job_and_counts_as_a_preemption() {
        let mut job = running();
        job.state = JobState::Draining;
        job.drain = Some(Box::new(preempted_by_9(8_000, 9_000)));
        let ended = end_attempt(&mut job, ExitEffect::PreemptionLimitReached, 9_000, 9_500, MIN_RUNTIME);
        assert_eq!((ended.state, ended.event.kind()), (JobState::Failed, EventKind::Failed));
        assert!(ended.preempted);
        assert_eq!(ended.usage.expect("metered").outcome, "preempted");
        assert_eq!(job.preemptions, 1);
    }

    #[test]
    fn a_preempted_attempt_is_requeued_metered_and_its_work_since_the_checkpoint_counted_lost() {
        let mut job = running();
        job.state = JobState::Draining;
        job.drain = Some(Box::new(preempted_by_9(8_000, 9_000)));
        job.exit_code = Some(0);
        let ended =
            end_attempt(&mut job, ExitEffect::Requeued { preempted: true }, 9_000, 9_500, MIN_RUNTIME);
        assert_eq!((ended.state, ended.event.kind()), (JobState::Queued, EventKind::Requeued));
        assert_eq!(ended.lost_gpu_ms, 2 * 4_000);
        assert!(ended.preempted);
        let usage = ended.usage.expect("metered");
        assert_eq!(
            (usage.job, usage.attempt, usage.started_ms, usage.ended_ms),
            (JobId(7), Attempt(3), 2_000, 9_000)
        );
        assert_eq!(usage.outcome, "preempted");
        assert_eq!((job.preemptions, job.lost_gpu_ms), (1, 8_000));
        assert!(job.placement.is_empty() && job.running_on.is_empty() && job.drain.is_none());
        assert_eq!(job.exit_code, None, "a requeued job shows no exit code");
    }

    #[test]
    fn a_preemption_says_whether_the_job_was_preempted_before_and_within_the_minimum_run_time() {
        // Placed at 1,000, noticed at 8,000: 7 s into the attempt.
        let preempted = |preemptions, min_runtime| {
            let mut job = running();
            job.preemptions = preemptions;
            job.state = JobState::Draining;
            job.drain = Some(Box::new(preempted_by_9(8_000, 9_000)));
            let ended =
                end_attempt(&mut job, ExitEffect::Requeued { preempted: true }, 9_000, 9_500, min_runtime);
            let usage = ended.usage.expect("metered");
            (usage.follows_preemption, usage.within_min_runtime)
        };
        assert_eq!(preempted(0, Span(10_000)), (false, false), "a first preemption is no repeat");
        assert_eq!(preempted(1, Span(10_000)), (true, true));
        assert_eq!(preempted(2, Span(7_000)), (true, false), "7 s is not less than 7 s");
        assert_eq!(preempted(1, Span::ZERO), (true, false), "the rule off");
    }

    #[test]
    fn a_drilled_attempt_is_requeued_and_billed_as_run_time_neither_preempted_nor_failed() {
        let mut job = running();
        job.state = JobState::Draining;
        job.drain = Some(Box::new(DrainNotice { cause: Drained::Drill, ..preempted_by_9(8_000, 18_000) }));
        job.exit_code = Some(0);
        let ended = end_attempt(&mut job, ExitEffect::Drilled, 9_000, 9_500, MIN_RUNTIME);
        assert_eq!((ended.state, ended.event.kind()), (JobState::Queued, EventKind::Requeued));
        assert!(matches!(&ended.event, Event::Requeued(d) if d.reason == "drill"), "{:?}", ended.event);
        assert!(!ended.preempted);
        assert_eq!(ended.lost_gpu_ms, 0, "not in the lost-work counters");
        let usage = ended.usage.expect("metered");
        assert_eq!((usage.outcome.as_str(), usage.seconds, usage.drain_gpu_seconds), ("drill", 7, 0));
        assert_eq!(usage.amount, crate::billing::amount(1_000_000, 2 * 7), "at the tier's rate");
        assert_eq!((job.preemptions, job.retries, job.lost_gpu_ms), (0, 0, 0));
        assert!(job.placement.is_empty() && job.drain.is_none());
    }

    #[test]
    fn a_lost_attempt_is_metered_to_the_given_end_and_an_attempt_never_started_is_not_metered() {
        let mut job = running();
        let ended = end_attempt(&mut job, ExitEffect::RequeuedLost, 6_000, 60_000, MIN_RUNTIME);
        assert_eq!(ended.usage.expect("metered").ended_ms, 6_000);
        assert_eq!(ended.lost_gpu_ms, 2 * 1_000);
        assert!(matches!(&ended.event, Event::Requeued(d) if d.reason == "lost"), "{:?}", ended.event);
        let mut never = running();
        never.run_started_ms = None;
        let ended = end_attempt(&mut never, ExitEffect::RequeuedLost, 6_000, 60_000, MIN_RUNTIME);
        assert_eq!(ended.usage, None);
    }

    #[test]
    fn quick_restarts_back_off_and_a_long_run_resets_the_count() {
        let mut job = running();
        job.exit_code = Some(1);
        let first = end_attempt(&mut job, ExitEffect::Restarted, 3_000, 3_000, MIN_RUNTIME);
        assert_eq!((first.backoff_ms, job.quick_exits), (1_000, 1));
        assert_eq!(first.usage.expect("metered").outcome, "failed");
        job.run_started_ms = Some(10_000);
        job.billing = Some(("H100".into(), 1, 1));
        let second = end_attempt(&mut job, ExitEffect::Restarted, 10_500, 10_500, MIN_RUNTIME);
        assert_eq!((second.backoff_ms, job.quick_exits), (2_000, 2));
        job.run_started_ms = Some(20_000);
        let long = end_attempt(&mut job, ExitEffect::Restarted, 20_000 + QUICK_EXIT_MS, 40_000, MIN_RUNTIME);
        assert_eq!((long.backoff_ms, job.quick_exits), (0, 0));
    }

    #[test]
    fn the_exit_kind_follows_cancel_loss_drain_restart_and_retries_in_that_order() {
        let mut job = running();
        job.exit_code = Some(0);
        assert_eq!(exit_kind(&job, false, 100), ExitKind::Completed);
        job.state = JobState::Draining;
        assert_eq!(
            exit_kind(&job, false, 100),
            ExitKind::Failed { requeue: false },
            "drained without the marker"
        );
        assert_eq!(exit_kind(&job, true, 100), ExitKind::Completed);
        job.vanished = true;
        assert_eq!(exit_kind(&job, true, 100), ExitKind::Lost);
        job.cancel_requested = true;
        assert_eq!(exit_kind(&job, true, 100), ExitKind::Cancelled);
        let mut failing = running();
        failing.exit_code = Some(2);
        failing.spec.max_retries = Some(1);
        assert_eq!(exit_kind(&failing, false, 100), ExitKind::Failed { requeue: true });
        failing.retries = 1;
        assert_eq!(exit_kind(&failing, false, 100), ExitKind::Failed { requeue: false });
        failing.spec.restart = Restart::Always;
        assert_eq!(exit_kind(&failing, false, 100), ExitKind::Restart);
    }

    /// A job that requeues itself in a loop: each requeue after the
    /// restart back-off when the attempt was quick, no protection earned,
    /// and the one past the cluster's bound fails it.
    #[test]
    fn a_self_requeue_backs_off_earns_no_protection_and_is_bounded() {
        let mut job = running();
        job.ended_by = Some(EndedBy::Requeue);
        assert_eq!(exit_kind(&job, false, 2), ExitKind::Requeue);
        job.state = JobState::Draining;
        assert_eq!(
            exit_kind(&job, false, 2),
            ExitKind::Failed { requeue: false },
            "in a drain: its preemption"
        );
        job.state = JobState::Running;
        let mut backoffs = Vec::new();
        for _ in 0..2 {
            job.ended_by = Some(EndedBy::Requeue);
            job.run_started_ms = Some(10_000);
            let ended = end_attempt(&mut job, ExitEffect::RequeuedLost, 11_000, 11_000, MIN_RUNTIME);
            assert!(job.requeued_itself && ended.state == JobState::Queued);
            backoffs.push(ended.backoff_ms);
            job.state = JobState::Running;
        }
        assert_eq!(backoffs, [1_000, 2_000]);
        assert_eq!(job.requeues, 2);
        job.ended_by = Some(EndedBy::Requeue);
        assert_eq!(exit_kind(&job, false, 2), ExitKind::Failed { requeue: false }, "past --max-requeues");
        // A preemption gives back what a preemption earns.
        job.state = JobState::Draining;
        end_attempt(&mut job, ExitEffect::Requeued { preempted: true }, 12_000, 12_000, MIN_RUNTIME);
        assert!(!job.requeued_itself);
    }
}
