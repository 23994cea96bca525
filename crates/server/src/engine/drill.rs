//! Fire drills (`POST /v1/jobs/{id}/drill`): what AWS FIS and `az vm
//! simulate-eviction` do for spot VMs, made for jobs. A running
//! preemptible job gets a real drain notice with the cluster's drain
//! window (the core's `State::drill`, carried out as any pass's drain:
//! the notice file, the endpoint, the signal, SIGKILL at the deadline);
//! its exit requeues it at once (`ExitEffect::Drilled`: neither a
//! preemption nor a failure, billed as ordinary run time); and the next
//! attempt is watched until it says it resumed from what was saved.
//!
//! The drill's record ([`DrillRecord`]) is kept with the job and moved by
//! pure transitions as the facts come in: the exit, the next attempt's
//! placement and start, its resume report or a checkpoint that shows it
//! started over, the job's end. Once it has what it needs it concludes:
//! `ready`, or the list of what failed (the rules are in
//! docs/job-contract.md, "Drills"). A `drill` event marks its start and
//! its verdict.

use super::*;

/// Work lost at the exit that a ready job may have: the moments between
/// its last save and its exit (reporting the save, the interpreter's
/// teardown).
pub const LOST_WORK_TOLERANCE: Span = Span(5_000);

/// An exit by SIGKILL this close to the deadline is the deadline's kill
/// (the agent's clock and the server's may differ by as much).
const KILL_TOLERANCE_MS: u64 = 1_000;

/// A job's latest drill, as the store keeps it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DrillRecord {
    /// The attempt given the notice, and its nodes.
    pub attempt: Attempt,
    pub nodes: Vec<String>,
    pub notice_at_ms: u64,
    pub deadline_ms: u64,
    /// The newest checkpoint reported up to the drilled attempt's exit.
    #[serde(default)]
    pub checkpoint: Option<SavedCheckpoint>,
    #[serde(default)]
    pub exit: Option<DrillExit>,
    #[serde(default)]
    pub next: Option<NextAttempt>,
    #[serde(default)]
    pub resumed: Option<Resume>,
    #[serde(default)]
    pub failures: Vec<String>,
    #[serde(default)]
    pub concluded_ms: Option<u64>,
}

/// How the drilled attempt ended, by its agents' clocks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DrillExit {
    pub at_ms: u64,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Wall-clock milliseconds of work since its last checkpoint (or its
    /// start) when it exited.
    pub lost_ms: u64,
    /// It was requeued (it did not finish, was not cancelled or lost).
    pub requeued: bool,
}

/// The attempt after the drilled one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NextAttempt {
    pub attempt: Attempt,
    pub node: String,
    #[serde(default)]
    pub started_ms: Option<u64>,
}

/// The next attempt's report that it resumed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Resume {
    pub at_ms: u64,
    pub step: Option<u64>,
}

/// The end of an attempt, as the drill needs to know it.
pub(super) struct AttemptEnd {
    pub attempt: Attempt,
    pub effect: ExitEffect,
    pub at_ms: u64,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub lost_ms: u64,
    /// The job's newest checkpoint, any attempt's.
    pub saved: Option<SavedCheckpoint>,
}

impl AttemptEnd {
    /// What the drill of `job` needs to know of its live attempt's end at
    /// `end_ms` with `effect`, taken before the record forgets it.
    pub(super) fn of(job: &JobRecord, effect: ExitEffect, end_ms: u64) -> AttemptEnd {
        AttemptEnd {
            attempt: job.attempt,
            effect,
            at_ms: end_ms,
            code: job.exit_code,
            signal: job.exit_signal,
            lost_ms: ending::lost_work(job, end_ms) / u64::from(job.running_gpus().max(1)),
            saved: job.checkpoints.last.as_deref().cloned(),
        }
    }
}

const SIGKILL: i32 = 9;

impl DrillRecord {
    pub fn new(attempt: Attempt, nodes: Vec<String>, notice_at_ms: u64, deadline_ms: u64) -> DrillRecord {
        DrillRecord { attempt, nodes, notice_at_ms, deadline_ms, ..DrillRecord::default() }
    }

    pub fn is_open(&self) -> bool {
        self.concluded_ms.is_none()
    }

    /// `ready` or `failed`, once concluded.
    pub fn verdict(&self) -> Option<&'static str> {
        self.concluded_ms.map(|_| if self.failures.is_empty() { "ready" } else { "failed" })
    }

    fn conclude(&mut self, now: u64) {
        self.concluded_ms.get_or_insert(now);
    }

    fn saved_step(&self) -> Option<u64> {
        self.checkpoint.as_ref().and_then(|c| c.step)
    }

    /// The exit came at the deadline's SIGKILL, or after the deadline.
    fn exceeded(&self) -> Option<bool> {
        let exit = self.exit.as_ref()?;
        let killed = exit.signal == Some(SIGKILL) && exit.at_ms + KILL_TOLERANCE_MS >= self.deadline_ms;
        Some(killed || exit.at_ms > self.deadline_ms)
    }

    /// How the drilled attempt ended, for people.
    fn exit_text(&self) -> Option<String> {
        let exit = self.exit.as_ref()?;
        let how = match (exit.code, exit.signal) {
            (_, Some(SIGKILL)) if self.exceeded() == Some(true) => "killed at the deadline".to_string(),
            (_, Some(signal)) => format!("killed by signal {signal}"),
            (Some(code), None) => format!("exited with code {code}"),
            (None, None) => "ended (its node lost track of it)".to_string(),
        };
        Some(how)
    }

    /// The drilled attempt ended; or the attempt after it did before it
    /// reported a resume.
    pub(super) fn attempt_ended(&mut self, end: AttemptEnd, now: u64) {
        if !self.is_open() {
            return;
        }
        if end.attempt == self.attempt && self.exit.is_none() {
            self.checkpoint = end.saved;
            let requeued = end.effect == ExitEffect::Drilled;
            self.exit = Some(DrillExit {
                at_ms: end.at_ms,
                code: end.code,
                signal: end.signal,
                lost_ms: end.lost_ms,
                requeued,
            });
            let failures = self.window_failures();
            self.failures.extend(failures);
            if !requeued {
                self.failures.push(format!("not requeued: the attempt {}", ended_how(end.effect)));
                self.conclude(now);
            }
        } else if self.next.as_ref().is_some_and(|n| n.attempt == end.attempt) {
            self.failures.push(format!(
                "did not resume: attempt {} {} without reporting a resume",
                end.attempt,
                ended_how(end.effect)
            ));
            self.conclude(now);
        }
    }

    /// What the exit shows: whether there was anything saved, whether it
    /// fit the window, and how much work it lost.
    fn window_failures(&self) -> Vec<String> {
        let Some(exit) = &self.exit else { return Vec::new() };
        let mut failures = Vec::new();
        if self.checkpoint.is_none() {
            failures.push("no checkpoint: none was reported before the exit".to_string());
        }
        if self.exceeded() == Some(true) {
            failures.push(match exit.signal {
                Some(SIGKILL) => "exceeded the window: killed at the deadline".to_string(),
                _ => format!(
                    "exceeded the window: exited {} after the deadline",
                    Span(exit.at_ms - self.deadline_ms).human()
                ),
            });
        }
        if exit.lost_ms > LOST_WORK_TOLERANCE.0 {
            let since = match &self.checkpoint {
                Some(c) if c.attempt == self.attempt => match c.step {
                    Some(step) => format!("its checkpoint of step {step}"),
                    None => "its last checkpoint".to_string(),
                },
                _ => "its start".to_string(),
            };
            failures.push(format!("lost {}: work since {since} when it exited", Span(exit.lost_ms).human()));
        }
        failures
    }

    /// The job was placed again after the drilled attempt was requeued.
    pub(super) fn placed(&mut self, attempt: Attempt, node: &str) {
        let requeued = self.exit.as_ref().is_some_and(|e| e.requeued);
        if self.is_open() && requeued && self.next.is_none() {
            self.next = Some(NextAttempt { attempt, node: node.to_string(), started_ms: None });
        }
    }

    /// The next attempt started (its first node did). With nothing saved
    /// there is nothing to resume from: the drill ends here.
    pub(super) fn started(&mut self, attempt: Attempt, at_ms: u64, now: u64) {
        let Some(next) = self.next.as_mut().filter(|n| n.attempt == attempt) else { return };
        next.started_ms.get_or_insert(at_ms);
        if self.is_open() && self.checkpoint.is_none() {
            self.conclude(now);
        }
    }

    /// The next attempt says it resumed, from `step` if it said which.
    pub(super) fn resumed(&mut self, attempt: Attempt, step: Option<u64>, at_ms: u64, now: u64) {
        if !self.is_open() || self.next.as_ref().is_none_or(|n| n.attempt != attempt) {
            return;
        }
        self.resumed = Some(Resume { at_ms, step });
        if let (Some(saved), Some(step)) = (self.saved_step(), step) {
            if step < saved {
                self.failures.push(format!(
                    "did not resume: attempt {attempt} resumed from step {step}, not from the saved step {saved}"
                ));
            }
        }
        self.conclude(now);
    }

    /// The next attempt reported a checkpoint before any resume: one not
    /// past the saved step shows it started over.
    pub(super) fn checkpointed(&mut self, attempt: Attempt, step: Option<u64>, now: u64) {
        if !self.is_open() || self.next.as_ref().is_none_or(|n| n.attempt != attempt) {
            return;
        }
        if let (Some(saved), Some(step)) = (self.saved_step(), step) {
            if step <= saved {
                self.failures.push(format!(
                    "did not resume: attempt {attempt} reported a checkpoint of step {step}, not past the saved \
                     step {saved}, without reporting a resume"
                ));
                self.conclude(now);
            }
        }
    }

    /// The job reached a final state, or a new drill replaces this one,
    /// before the drill could conclude.
    pub(super) fn abandoned(&mut self, why: &str, now: u64) {
        if !self.is_open() {
            return;
        }
        let what = match &self.next {
            Some(next) => format!("attempt {}", next.attempt),
            None => "its next attempt".to_string(),
        };
        if self.exit.is_none() {
            self.failures.push(format!("not requeued: {why} before the drilled attempt exited"));
        } else {
            self.failures.push(format!("did not resume: {why} before {what} reported a resume"));
        }
        self.conclude(now);
    }

    pub fn view(&self) -> ebb_api::Drill {
        let since_notice = |ms: u64| (ms as f64 - self.notice_at_ms as f64) / 1000.0;
        let exit = self.exit.as_ref();
        ebb_api::Drill {
            attempt: self.attempt.0,
            nodes: self.nodes.clone(),
            notice_at: rfc3339(self.notice_at_ms),
            notice_at_ms: self.notice_at_ms,
            deadline: rfc3339(self.deadline_ms),
            deadline_ms: self.deadline_ms,
            window_seconds: since_notice(self.deadline_ms),
            checkpoint: self.checkpoint.as_ref().map(|c| ebb_api::DrillCheckpoint {
                at: rfc3339(c.at_ms),
                at_ms: c.at_ms,
                attempt: c.attempt.0,
                step: c.step,
                after_notice_seconds: since_notice(c.at_ms),
            }),
            exited_at: exit.map(|e| rfc3339(e.at_ms)),
            exited_ms: exit.map(|e| e.at_ms),
            exit_after_notice_seconds: exit.map(|e| since_notice(e.at_ms)),
            exit: self.exit_text(),
            fit_window: self.exceeded().map(|exceeded| !exceeded),
            margin_seconds: exit.map(|e| (self.deadline_ms as f64 - e.at_ms as f64) / 1000.0),
            lost_seconds: exit.map(|e| e.lost_ms as f64 / 1000.0),
            requeued: exit.is_some_and(|e| e.requeued),
            next_attempt: self.next.as_ref().map(|n| n.attempt.0),
            next_node: self.next.as_ref().map(|n| n.node.clone()),
            next_started_at: self.next.as_ref().and_then(|n| n.started_ms).map(rfc3339),
            next_started_ms: self.next.as_ref().and_then(|n| n.started_ms),
            resumed_at: self.resumed.as_ref().map(|r| rfc3339(r.at_ms)),
            resumed_ms: self.resumed.as_ref().map(|r| r.at_ms),
            resumed_step: self.resumed.as_ref().and_then(|r| r.step),
            verdict: self.verdict().map(str::to_string),
            failures: self.failures.clone(),
            concluded_at: self.concluded_ms.map(rfc3339),
        }
    }
}

/// How an attempt ended, as a drill's failure says it.
fn ended_how(effect: ExitEffect) -> &'static str {
    match effect {
        ExitEffect::Finished => "finished the job",
        ExitEffect::Failed | ExitEffect::Requeued { preempted: false } => "failed",
        ExitEffect::Cancelled => "was cancelled",
        ExitEffect::Requeued { preempted: true } | ExitEffect::PreemptionLimitReached => "was preempted",
        ExitEffect::RequeuedLost => "was lost with its node",
        ExitEffect::Restarted => "exited and restarts",
        ExitEffect::Drilled => "was drilled",
    }
}

impl<S: Store> Engine<S> {
    /// Starts a drill of job `id`: the core gives it its notice, and the
    /// record, the agents and the timeline are told as for any drain.
    pub(super) fn drill(&mut self, principal: &Principal, id: JobId) -> Result<ebb_api::Job, Fail> {
        self.visible(principal, id)?;
        let job = &self.jobs[&id];
        if job.tier != Tier::Preemptible {
            return Err(Refusal::unacceptable(format!(
                "job {id}: {}; only preemptible jobs are drained, so only they can be drilled",
                job.tier
            ))
            .into());
        }
        if job.cancel_requested {
            return Err(
                Refusal::conflict(format!("job {id}: being cancelled; there is nothing to drill")).into()
            );
        }
        match job.state {
            JobState::Running => {}
            JobState::Draining => {
                let why = job.drain.as_ref().map(|n| format!(" ({})", n.reason)).unwrap_or_default();
                return Err(Refusal::conflict(format!("job {id}: already draining{why}")).into());
            }
            state => {
                return Err(Refusal::conflict(format!(
                    "job {id}: {}; only a running job can be drilled",
                    state.as_str()
                ))
                .into())
            }
        }
        begin(&mut self.parts(), id)?;
        self.job_view(principal, id)
    }
}

/// Moves job `id`'s open drill by `change`; if that concludes it,
/// the `drill` event with the report. Saving the record is the
/// caller's.
pub(super) fn changed(
    jobs: &mut JobTable,
    fx: &mut impl Effects,
    id: JobId,
    change: impl FnOnce(&mut DrillRecord),
) -> Written {
    let Some(drill) = jobs.get_mut(&id).and_then(|j| j.drill.as_mut()).filter(|d| d.is_open()) else {
        return Ok(());
    };
    change(drill);
    if drill.is_open() {
        return Ok(());
    }
    let report = drill.view();
    match report.verdict.as_deref() {
        Some("ready") => fx.counters().drills_ready += 1,
        _ => fx.counters().drills_failed += 1,
    }
    tracing::info!(job = id.0, verdict = report.verdict.as_deref(), failures = ?report.failures, "drill concluded");
    fx.event(&jobs[&id], Event::Drill(DrillDetail::Verdict(Box::new(report))))
}

/// A drill of job `id` begins: its running attempt is drained as for a
/// preemption, with a drill's notice, and the drill's record opens.
fn begin(p: &mut Parts<'_, impl Effects>, id: JobId) -> Result<(), Fail> {
    let (now, window) = (p.fx.now(), p.config.drain_window);
    let drain = p.core.drill(id, Time(now), window).map_err(|e| match e {
        ebb_scheduler::StateError::Invalid(m) => Refusal::unacceptable(m),
        other => Refusal::conflict(other.to_string()),
    })?;
    changed(p.jobs, &mut p.fx, id, |d| d.abandoned("a new drill began", now))?;
    let job = p.jobs.get_mut(&id).expect("visible");
    let nodes = job.running_on.clone();
    job.drill = Some(Box::new(DrillRecord::new(drain.attempt, nodes.clone(), now, drain.deadline.0)));
    let detail = DrillNotice {
        attempt: drain.attempt.0,
        nodes,
        notice_at: rfc3339(now),
        deadline: rfc3339(drain.deadline.0),
        window_seconds: window.as_secs_f64(),
    };
    p.fx.event(job, Event::Drill(DrillDetail::Notice(detail)))?;
    Ok(plan::drained(p, &drain)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTICE: u64 = 100_000;
    const DEADLINE: u64 = 110_000;

    fn drill() -> DrillRecord {
        DrillRecord::new(Attempt(1), vec!["node-0".into()], NOTICE, DEADLINE)
    }

    fn checkpoint(attempt: Attempt, at_ms: u64, step: u64) -> Option<SavedCheckpoint> {
        Some(SavedCheckpoint { at_ms, attempt, step: Some(step), bytes: None, seconds: 0.1 })
    }

    fn end(attempt: Attempt, at_ms: u64, code: Option<i32>, signal: Option<i32>, lost_ms: u64) -> AttemptEnd {
        let saved = checkpoint(Attempt(1), NOTICE + 500, 7);
        AttemptEnd { attempt, effect: ExitEffect::Drilled, at_ms, code, signal, lost_ms, saved }
    }

    /// Saved at the notice, exited, placed again and started: what a
    /// ready job does up to its resume report.
    fn exited_and_restarted() -> DrillRecord {
        let mut d = drill();
        d.attempt_ended(end(Attempt(1), NOTICE + 600, Some(0), None, 100), NOTICE + 700);
        d.placed(Attempt(2), "node-1");
        d.started(Attempt(2), NOTICE + 800, NOTICE + 900);
        d
    }

    #[test]
    fn a_job_that_saves_exits_in_the_window_and_resumes_from_its_step_is_ready() {
        let mut d = exited_and_restarted();
        assert!(d.is_open(), "open until the resume");
        d.resumed(Attempt(2), Some(7), NOTICE + 1_000, NOTICE + 1_100);
        assert_eq!((d.verdict(), d.failures.as_slice()), (Some("ready"), &[][..]));
        let view = d.view();
        assert_eq!(view.exit.as_deref(), Some("exited with code 0"));
        assert_eq!(
            (view.fit_window, view.margin_seconds, view.lost_seconds),
            (Some(true), Some(9.4), Some(0.1))
        );
        assert_eq!(view.checkpoint.unwrap().after_notice_seconds, 0.5);
        assert_eq!(
            (view.next_attempt, view.next_node.as_deref(), view.resumed_step),
            (Some(2), Some("node-1"), Some(7))
        );
        assert_eq!(view.window_seconds, 10.0);
        // Reports after the verdict change nothing.
        d.checkpointed(Attempt(2), Some(1), NOTICE + 2_000);
        assert_eq!(d.verdict(), Some("ready"));
    }

    #[test]
    fn a_job_killed_at_the_deadline_exceeded_the_window_and_lost_its_work_since_the_checkpoint() {
        let mut d = drill();
        d.attempt_ended(end(Attempt(1), DEADLINE + 20, None, Some(9), 9_500), DEADLINE + 30);
        d.placed(Attempt(2), "node-0");
        d.resumed(Attempt(2), Some(7), DEADLINE + 500, DEADLINE + 600);
        assert_eq!(d.verdict(), Some("failed"));
        assert_eq!(
            d.failures,
            [
                "exceeded the window: killed at the deadline",
                "lost 9.5s: work since its checkpoint of step 7 when it exited"
            ]
        );
        let view = d.view();
        assert_eq!((view.exit.as_deref(), view.fit_window), (Some("killed at the deadline"), Some(false)));
        assert!(view.margin_seconds.unwrap() < 0.0);
    }

    #[test]
    fn an_exit_after_the_deadline_without_a_kill_exceeded_the_window_too() {
        let mut d = drill();
        d.attempt_ended(end(Attempt(1), DEADLINE + 1_500, Some(0), None, 0), DEADLINE + 1_600);
        assert_eq!(d.failures, ["exceeded the window: exited 1.5s after the deadline"]);
    }

    #[test]
    fn without_any_checkpoint_the_drill_ends_when_the_next_attempt_starts() {
        let mut d = drill();
        let mut nothing = end(Attempt(1), NOTICE + 300, Some(1), None, 40_000);
        nothing.saved = None;
        d.attempt_ended(nothing, NOTICE + 400);
        d.placed(Attempt(2), "node-0");
        assert!(d.is_open());
        d.started(Attempt(2), NOTICE + 500, NOTICE + 600);
        assert_eq!(d.verdict(), Some("failed"));
        assert_eq!(
            d.failures,
            [
                "no checkpoint: none was reported before the exit",
                "lost 40.0s: work since its start when it exited"
            ]
        );
    }

    #[test]
    fn a_next_attempt_that_starts_over_did_not_resume() {
        // It says so.
        let mut d = exited_and_restarted();
        d.resumed(Attempt(2), Some(0), NOTICE + 1_000, NOTICE + 1_000);
        assert_eq!(d.failures, ["did not resume: attempt 2 resumed from step 0, not from the saved step 7"]);
        // It checkpoints a step not past the saved one without saying.
        let mut d = exited_and_restarted();
        d.checkpointed(Attempt(2), Some(8), NOTICE + 1_000);
        assert!(d.is_open(), "a step past the saved one proves nothing either way");
        d.checkpointed(Attempt(2), Some(1), NOTICE + 2_000);
        assert_eq!(d.verdict(), Some("failed"));
        assert!(
            d.failures[0].starts_with("did not resume: attempt 2 reported a checkpoint of step 1"),
            "{:?}",
            d.failures
        );
        // It ends without a word.
        let mut d = exited_and_restarted();
        let mut ended = end(Attempt(2), NOTICE + 3_000, Some(1), None, 0);
        ended.effect = ExitEffect::Failed;
        d.attempt_ended(ended, NOTICE + 3_000);
        assert_eq!(d.failures, ["did not resume: attempt 2 failed without reporting a resume"]);
        // The job is cancelled while it waits to start again.
        let mut d = drill();
        d.attempt_ended(end(Attempt(1), NOTICE + 600, Some(0), None, 100), NOTICE + 700);
        d.abandoned("the job was cancelled", NOTICE + 800);
        assert_eq!(
            d.failures,
            ["did not resume: the job was cancelled before its next attempt reported a resume"]
        );
    }

    #[test]
    fn a_drilled_attempt_that_finishes_or_is_lost_is_not_requeued() {
        let mut d = drill();
        let mut finished = end(Attempt(1), NOTICE + 600, Some(0), None, 0);
        finished.effect = ExitEffect::Finished;
        d.attempt_ended(finished, NOTICE + 700);
        assert_eq!(
            (d.verdict(), d.failures.as_slice()),
            (Some("failed"), &["not requeued: the attempt finished the job".to_string()][..])
        );
        let mut d = drill();
        let mut lost = end(Attempt(1), NOTICE + 600, None, None, 0);
        lost.effect = ExitEffect::RequeuedLost;
        d.attempt_ended(lost, NOTICE + 700);
        assert_eq!(d.failures, ["not requeued: the attempt was lost with its node"]);
        assert_eq!(d.view().exit.as_deref(), Some("ended (its node lost track of it)"));
    }

    #[test]
    fn a_resume_without_a_step_counts_and_a_step_past_the_saved_one_counts() {
        let mut d = exited_and_restarted();
        d.resumed(Attempt(2), None, NOTICE + 1_000, NOTICE + 1_000);
        assert_eq!(d.verdict(), Some("ready"));
        let mut d = exited_and_restarted();
        d.resumed(Attempt(2), Some(9), NOTICE + 1_000, NOTICE + 1_000);
        assert_eq!(d.verdict(), Some("ready"));
    }

    #[test]
    fn reports_of_other_attempts_are_not_the_resume() {
        let mut d = exited_and_restarted();
        d.resumed(Attempt(3), Some(7), NOTICE + 1_000, NOTICE + 1_000);
        d.checkpointed(Attempt(1), Some(0), NOTICE + 1_000);
        assert!(d.is_open() && d.resumed.is_none());
    }
}
