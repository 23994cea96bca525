//! Attempts that end: a node's part exits, the attempt ends once all parts have, and is metered.

use super::*;

impl<S: Store> Engine<S> {
    /// GPU-milliseconds of the live attempt's work since its last
    /// checkpoint (or its start), if it ended at `end_ms`.
    pub(super) fn lost_work(job: &JobRecord, end_ms: u64) -> u64 {
        let started = job.run_started_ms.unwrap_or(job.started_ms);
        let saved = job.attempt_checkpoint_ms.map_or(started, |c| c.max(started));
        end_ms.saturating_sub(saved) * job.gpus as u64
    }

    /// One node's processes of an attempt are gone (at `at_ms` by the
    /// agent's clock); when the last node's are, the attempt has ended.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn part_exited(
        &mut self,
        node: &str,
        attempt: AttemptRef,
        exit: PartExit,
        at_ms: u64,
        now: u64,
    ) {
        let PartExit { code, signal, completed, vanished, peak_memory_bytes } = exit;
        let id = attempt.job;
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.running_on.retain(|n| n != node);
        job.exited_ms = job.exited_ms.max(at_ms);
        job.vanished |= vanished;
        if job.exit_code.is_none() || code.is_some_and(|c| c != 0) {
            job.exit_code = code;
            job.exit_signal = signal;
        }
        let mut detail = json!({
            "node": node, "code": code, "signal": signal, "completed_marker": completed, "vanished": vanished,
        });
        if let Some(peak) = peak_memory_bytes {
            detail["peak_memory_bytes"] = json!(peak);
        }
        self.event(id, "exited", detail);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        if !job.running_on.is_empty() {
            // A gang ends as a whole. Being drained, the other parts already
            // have their notice and deadline: they finish their own save.
            // Otherwise they are stopped as a cancel stops them: the signal,
            // then SIGKILL after a grace.
            if job.state != JobState::Draining {
                let rest = job.running_on.clone();
                for n in rest {
                    self.push(&n, Action::Stop { attempt, grace_ms: 10_000 });
                }
            }
            self.save(id);
            return;
        }
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let draining = job.state == JobState::Draining;
        let success = job.exit_code == Some(0) && !job.vanished;
        let kind = if job.cancel_requested {
            ExitKind::Cancelled
        } else if job.vanished {
            ExitKind::Lost
        } else if draining {
            if success && (completed || job.spec.exit_on_drain_is_success) {
                ExitKind::Completed
            } else {
                ExitKind::Failed { requeue: false }
            }
        } else if job.spec.restart.as_deref() == Some("always") {
            ExitKind::Restart
        } else if success {
            ExitKind::Completed
        } else {
            ExitKind::Failed { requeue: job.retries < job.spec.max_retries.unwrap_or(0) }
        };
        let effect = match self.core.exited(JobId(id), Attempt(attempt.attempt), kind) {
            Ok(effect) => effect,
            Err(e) => {
                tracing::error!(job = id, "core refused the exit: {e}");
                return;
            }
        };
        let job = self.jobs.get_mut(&id).expect("live attempt");
        let ran_ms = now.saturating_sub(job.started_ms);
        let lost_ms = match effect {
            ExitEffect::Requeued { preempted: true }
            | ExitEffect::RequeuedLost
            | ExitEffect::PreemptionLimitReached => Self::lost_work(job, job.exited_ms),
            _ => 0,
        };
        job.lost_gpu_ms += lost_ms;
        self.counters.lost_gpu_seconds += lost_ms as f64 / 1000.0;
        let lost = lost_ms as f64 / 1000.0;
        let outcome = match effect {
            ExitEffect::Finished => "completed",
            ExitEffect::Failed | ExitEffect::Requeued { preempted: false } => "failed",
            ExitEffect::Cancelled => "cancelled",
            ExitEffect::PreemptionLimitReached | ExitEffect::Requeued { preempted: true } => "preempted",
            ExitEffect::RequeuedLost => "lost",
            ExitEffect::Restarted if success => "completed",
            ExitEffect::Restarted => "failed",
        };
        let end = self.jobs[&id].exited_ms;
        self.meter(id, attempt.attempt, end, outcome, lost_ms);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.placement.clear();
        job.notice = None;
        job.vanished = false;
        job.rendezvous = None;
        let (state, kind, detail) = match effect {
            ExitEffect::Finished => (JobState::Succeeded, "succeeded", json!({ "ran_ms": ran_ms })),
            ExitEffect::Failed => {
                (JobState::Failed, "failed", json!({ "code": job.exit_code, "signal": job.exit_signal }))
            }
            ExitEffect::Cancelled => (JobState::Cancelled, "cancelled", json!({})),
            ExitEffect::PreemptionLimitReached => {
                job.preemptions += 1;
                (
                    JobState::Failed,
                    "failed",
                    json!({ "reason": "preempted more than max_preemptions", "lost_gpu_seconds": lost }),
                )
            }
            ExitEffect::Requeued { preempted: true } => {
                job.preemptions += 1;
                self.counters.preempted += 1;
                (
                    JobState::Queued,
                    "requeued",
                    json!({ "reason": "preempted", "preemptions": job.preemptions, "lost_gpu_seconds": lost }),
                )
            }
            ExitEffect::Requeued { preempted: false } => {
                job.retries += 1;
                (
                    JobState::Queued,
                    "requeued",
                    json!({ "reason": "failed, retrying", "retries": job.retries }),
                )
            }
            ExitEffect::RequeuedLost => {
                (JobState::Queued, "requeued", json!({ "reason": "lost", "lost_gpu_seconds": lost }))
            }
            ExitEffect::Restarted => {
                let ran_ms = job.exited_ms.saturating_sub(job.run_started_ms.unwrap_or(job.exited_ms));
                job.quick_exits = if ran_ms < QUICK_EXIT_MS { job.quick_exits.saturating_add(1) } else { 0 };
                let backoff_ms = restart_backoff_ms(job.quick_exits);
                (
                    JobState::Queued,
                    "requeued",
                    json!({
                        "reason": "restart always", "code": job.exit_code, "signal": job.exit_signal,
                        "quick_exits": job.quick_exits, "backoff_seconds": backoff_ms as f64 / 1000.0,
                    }),
                )
            }
        };
        let job = self.jobs.get_mut(&id).expect("live attempt");
        job.state = state;
        if state == JobState::Queued {
            job.exit_code = None;
            job.exit_signal = None;
        }
        let backoff_ms = match effect {
            ExitEffect::Restarted => restart_backoff_ms(job.quick_exits),
            _ => 0,
        };
        if backoff_ms > 0 {
            // Out of the core's queue until the back-off is over.
            match self.core.cancel(JobId(id)) {
                Ok(()) => {
                    let until_ms = now.saturating_add(backoff_ms);
                    self.jobs.get_mut(&id).expect("live attempt").waiting =
                        Some(Waiting::Backoff { until_ms });
                    self.backoff.insert((until_ms, id));
                }
                Err(e) => tracing::error!(job = id, "restart back-off not applied: {e}"),
            }
        }
        if state.is_final() {
            self.finished(id);
        }
        self.event(id, kind, detail);
        self.save(id);
    }

    /// The usage record of job `id`'s attempt, ended at `end_ms`: written
    /// in this batch's transaction, with the state change that ended it.
    pub(super) fn meter(&mut self, id: u64, attempt: u32, end_ms: u64, outcome: &str, lost_gpu_ms: u64) {
        let job = &self.jobs[&id];
        let (Some(started_ms), Some((model, rate, on_demand_rate))) = (job.run_started_ms, &job.billing)
        else {
            return; // never reported started: nothing is known to have run
        };
        let usage = crate::billing::meter(crate::billing::Ended {
            job: id,
            attempt,
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
        });
        if let Err(e) = self.store.add_usage(&usage) {
            tracing::error!(job = id, attempt, "usage not recorded: {e}");
        }
    }
}
