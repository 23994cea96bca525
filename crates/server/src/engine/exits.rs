//! Attempts that end: a node's part exits, and the attempt ends once every
//! node's part has. The transition itself is `ending::end_attempt`.

use super::ending::{end_attempt, exit_kind, STOP_GRACE_MS};
use super::*;

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
        let PartExit { code, signal, completed, vanished, peak_memory_bytes, start_error } = exit;
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
        if let Some(error) = start_error {
            detail["start_error"] = json!(error);
        }
        self.event(id, EventKind::Exited, detail)?;
        let job = &self.jobs[&id];
        if !job.running_on.is_empty() {
            // A gang ends as a whole. Being drained or cancelled, the other
            // parts already have their notice and deadline: they finish
            // their own save. Otherwise they are stopped: SIGTERM, then
            // SIGKILL after the default grace.
            if job.state != JobState::Draining && !job.cancel_requested {
                for n in job.running_on.clone() {
                    self.outbox.push(&n, Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None });
                }
            }
            return self.save(id);
        }
        let kind = exit_kind(job, completed);
        let effect = match self.core.exited(JobId(id), Attempt(attempt.attempt), kind) {
            Ok(effect) => effect,
            Err(e) => {
                tracing::error!(job = id, "core refused the exit: {e}");
                return self.save(id);
            }
        };
        let end_ms = self.jobs[&id].exited_ms;
        self.ended(id, effect, end_ms, now, json!({}))
    }

    /// The live attempt of job `id` ended at `end_ms` with `effect` (the
    /// core knows already): the record, its usage record, the event (with
    /// `extra` in its detail), the tenant's load and a restart's back-off.
    pub(super) fn ended(
        &mut self,
        id: u64,
        effect: ExitEffect,
        end_ms: u64,
        now: u64,
        extra: serde_json::Value,
    ) -> Written {
        let min_runtime = self.sched.min_runtime;
        // What a drill needs of the attempt, before the record forgets it.
        let drill_end = self.drill_attempt_end(id, effect, end_ms);
        self.deadline_attempt_ended(id, end_ms);
        let job = self.jobs.get_mut(&id).expect("live attempt");
        // A drill is not a drain in the counters: its time is run time.
        let drained_ms =
            job.notice.as_ref().filter(|_| effect != ExitEffect::Drilled).map(|n| end_ms.saturating_sub(n.0));
        let mut ended = end_attempt(job, effect, end_ms, now, min_runtime);
        if let Some(usage) = &ended.usage {
            self.store.add_usage(usage)?;
        }
        self.counters.ended(ended.usage.as_ref(), drained_ms);
        self.counters.lost_gpu_seconds += ended.lost_gpu_ms as f64 / 1000.0;
        self.counters.preempted += u64::from(ended.preempted);
        if ended.backoff_ms > 0 {
            // Out of the core's queue until the back-off is over.
            match self.core.cancel(JobId(id)) {
                Ok(()) => {
                    let until_ms = now.saturating_add(ended.backoff_ms);
                    self.jobs.get_mut(&id).expect("live attempt").waiting =
                        Some(Waiting::Backoff { until_ms });
                    self.backoff.insert((until_ms, id));
                }
                Err(e) => tracing::error!(job = id, "restart back-off not applied: {e}"),
            }
        }
        if let (Some(detail), serde_json::Value::Object(extra)) = (ended.detail.as_object_mut(), extra) {
            detail.extend(extra);
        }
        self.event(id, ended.kind, ended.detail)?;
        self.drill_changed(id, |d| d.attempt_ended(drill_end, now))?;
        if ended.state.is_final() {
            self.finished(id)?;
        }
        self.save(id)?;
        // Back in the queue, it may no longer have the time to wait.
        self.judge_deadline(id, now)
    }
}
