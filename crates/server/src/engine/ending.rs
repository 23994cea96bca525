//! The end of an attempt, as a pure function of the job's record: how the
//! core is told it ended, and what ending it does to the record and writes
//! (the state, the event, the usage record, the work lost). The writer
//! applies it wherever an attempt ends: its processes exit, its node is
//! lost or removed, or a restarted server cannot put it back.

use super::*;

/// The grace between a stop's signal and SIGKILL: cancels, and the other
/// nodes of a gang whose part ended.
pub const STOP_GRACE_MS: u64 = 10_000;

/// What ending an attempt writes, beside the record it changed.
#[derive(Debug, PartialEq)]
pub(super) struct Ended {
    pub state: JobState,
    pub kind: EventKind,
    pub detail: serde_json::Value,
    /// The attempt's usage record: none if it never reported a start
    /// (nothing is known to have run).
    pub usage: Option<crate::store::UsageRow>,
    pub lost_gpu_ms: u64,
    /// A `--restart always` job's back-off before it runs again.
    pub backoff_ms: u64,
    pub preempted: bool,
}

/// How the core is to be told the attempt ended, from the record (the
/// exit codes gathered from every node) and the SDK's completion marker.
pub(super) fn exit_kind(job: &JobRecord, completed: bool) -> ExitKind {
    let success = job.exit_code == Some(0) && !job.vanished;
    if job.cancel_requested {
        ExitKind::Cancelled
    } else if job.vanished {
        ExitKind::Lost
    } else if job.state == JobState::Draining {
        match success && (completed || job.spec.exit_on_drain_is_success) {
            true => ExitKind::Completed,
            false => ExitKind::Failed { requeue: false },
        }
    } else if job.spec.restart.as_deref() == Some("always") {
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
    end_ms.saturating_sub(saved) * job.gpus as u64
}

/// The live attempt of `job` ended at `end_ms` (by the agents' clocks, or
/// the node's last contact) with `effect`, as the core decided, at the
/// server's `now`. The record leaves the attempt behind: its new state,
/// counters and no placement.
pub(super) fn end_attempt(job: &mut JobRecord, effect: ExitEffect, end_ms: u64, now: u64) -> Ended {
    let success = job.exit_code == Some(0) && !job.vanished;
    let lost_gpu_ms = match effect {
        ExitEffect::Requeued { preempted: true }
        | ExitEffect::RequeuedLost
        | ExitEffect::PreemptionLimitReached => lost_work(job, end_ms),
        _ => 0,
    };
    let outcome = match effect {
        ExitEffect::Finished => "completed",
        ExitEffect::Failed | ExitEffect::Requeued { preempted: false } => "failed",
        ExitEffect::Cancelled => "cancelled",
        ExitEffect::PreemptionLimitReached | ExitEffect::Requeued { preempted: true } => "preempted",
        ExitEffect::RequeuedLost => "lost",
        ExitEffect::Restarted if success => "completed",
        ExitEffect::Restarted => "failed",
    };
    let usage = meter(job, end_ms, outcome, lost_gpu_ms);
    job.lost_gpu_ms += lost_gpu_ms;
    let lost = lost_gpu_ms as f64 / 1000.0;
    let mut backoff_ms = 0;
    let (state, kind, detail) = match effect {
        ExitEffect::Finished => (
            JobState::Succeeded,
            EventKind::Succeeded,
            json!({ "ran_ms": now.saturating_sub(job.started_ms) }),
        ),
        ExitEffect::Failed => {
            (JobState::Failed, EventKind::Failed, json!({ "code": job.exit_code, "signal": job.exit_signal }))
        }
        ExitEffect::Cancelled => (JobState::Cancelled, EventKind::Cancelled, json!({})),
        ExitEffect::PreemptionLimitReached => {
            job.preemptions += 1;
            let detail = json!({ "reason": "preempted more than max_preemptions", "lost_gpu_seconds": lost });
            (JobState::Failed, EventKind::Failed, detail)
        }
        ExitEffect::Requeued { preempted: true } => {
            job.preemptions += 1;
            let detail =
                json!({ "reason": "preempted", "preemptions": job.preemptions, "lost_gpu_seconds": lost });
            (JobState::Queued, EventKind::Requeued, detail)
        }
        ExitEffect::Requeued { preempted: false } => {
            job.retries += 1;
            (
                JobState::Queued,
                EventKind::Requeued,
                json!({ "reason": "failed, retrying", "retries": job.retries }),
            )
        }
        ExitEffect::RequeuedLost => {
            (JobState::Queued, EventKind::Requeued, json!({ "reason": "lost", "lost_gpu_seconds": lost }))
        }
        ExitEffect::Restarted => {
            let ran_ms = end_ms.saturating_sub(job.run_started_ms.unwrap_or(end_ms));
            job.quick_exits = if ran_ms < QUICK_EXIT_MS { job.quick_exits.saturating_add(1) } else { 0 };
            backoff_ms = restart_backoff_ms(job.quick_exits);
            let detail = json!({
                "reason": "restart always", "code": job.exit_code, "signal": job.exit_signal,
                "quick_exits": job.quick_exits, "backoff_seconds": backoff_ms as f64 / 1000.0,
            });
            (JobState::Queued, EventKind::Requeued, detail)
        }
    };
    job.state = state;
    job.placement.clear();
    job.running_on.clear();
    job.notice = None;
    job.vanished = false;
    job.rendezvous = None;
    if state == JobState::Queued {
        job.exit_code = None;
        job.exit_signal = None;
    }
    let preempted = matches!(effect, ExitEffect::Requeued { preempted: true });
    Ended { state, kind, detail, usage, lost_gpu_ms, backoff_ms, preempted }
}

/// The usage record of the live attempt, ended at `end_ms`.
fn meter(job: &JobRecord, end_ms: u64, outcome: &str, lost_gpu_ms: u64) -> Option<crate::store::UsageRow> {
    let (Some(started_ms), Some((model, rate, on_demand_rate))) = (job.run_started_ms, &job.billing) else {
        return None; // never reported started: nothing is known to have run
    };
    Some(crate::billing::meter(crate::billing::Ended {
        job: job.id,
        attempt: job.attempt,
        tenant: job.tenant,
        tier: job.tier.as_str(),
        gpu_model: model,
        gpus: job.gpus,
        started_ms,
        ended_ms: end_ms,
        notice_at_ms: job.notice.as_ref().map(|n| n.0),
        rate: *rate,
        on_demand_rate: *on_demand_rate,
        lost_gpu_ms,
        outcome,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A preemptible job of 2 GPUs placed at 1,000, started at 2,000 by its
    /// agent, checkpointed at 5,000, at $2.00 (preemptible $1.00) per GPU-hour.
    fn running() -> JobRecord {
        let spec = ebb_api::JobSubmission { argv: vec!["train".into()], ..Default::default() };
        let mut job = JobRecord::queued(7, 1, StoredSpec::from(spec), Tier::Preemptible, 2, 15, 0);
        job.state = JobState::Running;
        job.attempt = 3;
        job.placement = vec![("a".into(), vec![0, 1])];
        job.running_on = vec!["a".into()];
        job.started_on = vec!["a".into()];
        job.started_ms = 1_000;
        job.run_started_ms = Some(2_000);
        job.attempt_checkpoint_ms = Some(5_000);
        job.billing = Some(("H100".into(), 1_000_000, 2_000_000));
        job
    }

    #[test]
    fn a_preempted_attempt_is_requeued_metered_and_its_work_since_the_checkpoint_counted_lost() {
        let mut job = running();
        job.state = JobState::Draining;
        job.notice = Some((8_000, 9_000, "preempted by job 9".into()));
        job.exit_code = Some(0);
        let ended = end_attempt(&mut job, ExitEffect::Requeued { preempted: true }, 9_000, 9_500);
        assert_eq!((ended.state, ended.kind), (JobState::Queued, EventKind::Requeued));
        assert_eq!(ended.lost_gpu_ms, 2 * 4_000);
        assert!(ended.preempted);
        let usage = ended.usage.expect("metered");
        assert_eq!((usage.job, usage.attempt, usage.started_ms, usage.ended_ms), (7, 3, 2_000, 9_000));
        assert_eq!(usage.outcome, "preempted");
        assert_eq!((job.preemptions, job.lost_gpu_ms), (1, 8_000));
        assert!(job.placement.is_empty() && job.running_on.is_empty() && job.notice.is_none());
        assert_eq!(job.exit_code, None, "a requeued job shows no exit code");
    }

    #[test]
    fn a_lost_attempt_is_metered_to_the_given_end_and_an_attempt_never_started_is_not_metered() {
        let mut job = running();
        let ended = end_attempt(&mut job, ExitEffect::RequeuedLost, 6_000, 60_000);
        assert_eq!(ended.usage.expect("metered").ended_ms, 6_000);
        assert_eq!(ended.lost_gpu_ms, 2 * 1_000);
        assert_eq!(ended.detail["reason"], "lost");
        let mut never = running();
        never.run_started_ms = None;
        let ended = end_attempt(&mut never, ExitEffect::RequeuedLost, 6_000, 60_000);
        assert_eq!(ended.usage, None);
    }

    #[test]
    fn quick_restarts_back_off_and_a_long_run_resets_the_count() {
        let mut job = running();
        job.exit_code = Some(1);
        let first = end_attempt(&mut job, ExitEffect::Restarted, 3_000, 3_000);
        assert_eq!((first.backoff_ms, job.quick_exits), (1_000, 1));
        assert_eq!(first.usage.expect("metered").outcome, "failed");
        job.run_started_ms = Some(10_000);
        job.billing = Some(("H100".into(), 1, 1));
        let second = end_attempt(&mut job, ExitEffect::Restarted, 10_500, 10_500);
        assert_eq!((second.backoff_ms, job.quick_exits), (2_000, 2));
        job.run_started_ms = Some(20_000);
        let long = end_attempt(&mut job, ExitEffect::Restarted, 20_000 + QUICK_EXIT_MS, 40_000);
        assert_eq!((long.backoff_ms, job.quick_exits), (0, 0));
    }

    #[test]
    fn the_exit_kind_follows_cancel_loss_drain_restart_and_retries_in_that_order() {
        let mut job = running();
        job.exit_code = Some(0);
        assert_eq!(exit_kind(&job, false), ExitKind::Completed);
        job.state = JobState::Draining;
        assert_eq!(exit_kind(&job, false), ExitKind::Failed { requeue: false }, "drained without the marker");
        assert_eq!(exit_kind(&job, true), ExitKind::Completed);
        job.vanished = true;
        assert_eq!(exit_kind(&job, true), ExitKind::Lost);
        job.cancel_requested = true;
        assert_eq!(exit_kind(&job, true), ExitKind::Cancelled);
        let mut failing = running();
        failing.exit_code = Some(2);
        failing.spec.max_retries = Some(1);
        assert_eq!(exit_kind(&failing, false), ExitKind::Failed { requeue: true });
        failing.retries = 1;
        assert_eq!(exit_kind(&failing, false), ExitKind::Failed { requeue: false });
        failing.spec.restart = Some("always".into());
        assert_eq!(exit_kind(&failing, false), ExitKind::Restart);
    }
}
