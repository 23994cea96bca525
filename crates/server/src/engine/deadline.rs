//! Deadlines: a preemptible job that must be done by a time runs at the
//! preemptible rate while the rest of its work fits before then with a
//! margin, and is promoted to on-demand once it would not (Can't Be Late,
//! NSDI'24: stay on cheap capacity until the slack runs out).
//!
//! The problem: how much run time does the rest need, and how much may
//! the preemptible tier cost it? The job reports the fraction it has done
//! (`POST /ebb/v1/progress`, `ebb_sdk.progress`). Its rate is that
//! fraction over the run time it took, counting only time an attempt of
//! it actually ran (agents' clocks), every attempt's, lost work included,
//! so a job that loses work to preemptions looks slower, never faster.
//! The rest needs `ran × (1 − f) / f` from the report, less what it has
//! run since. The margin is what one more preemption can cost a job that
//! saves on notice: the drain window, a restart allowance
//! ([`RESTART_ALLOWANCE_MS`]: back in the queue and placed as on-demand,
//! restored from its checkpoint), and a tenth of the remaining run time
//! for an estimate drawn from a rate that varies. The job is promoted at
//! the first moment `now + needed + margin > deadline`; while it runs
//! at its rate, `now + needed` stays where it was, so the judgement
//! changes only when it reports again, when an attempt ends, or while it
//! waits in the queue: each job not yet promoted has one entry in
//! `Engine::deadlines` at the instant it must be judged again.
//!
//! Promotion is the core's (`State::promote`): a queued job changes
//! queue; a running one changes tier in place when the on-demand room
//! outside reservations allows, billed at the on-demand rate from the
//! promotion instant (its usage record gets two segments); when it does
//! not (it runs on lent reserved GPUs that on-demand may not use), it
//! runs on as preemptible and is tried again every [`RETRY_MS`]; a
//! draining one is promoted once its exit has requeued it.

use ebb_scheduler::Promoted;

use super::effects::{self, Effects};
use super::table::JobTable;
use super::*;

/// Time allowed for one restart after a preemption (the core's rule).
pub const RESTART_ALLOWANCE_MS: u64 = ebb_scheduler::deadline::RESTART_ALLOWANCE.0;
/// How soon a promotion that found no on-demand room is tried again.
pub const RETRY_MS: u64 = 10_000;

/// A job's deadline and what the server knows of its progress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Deadline {
    pub at_ms: u64,
    /// Run time of its attempts that have ended, milliseconds.
    #[serde(default)]
    pub ran_ms: u64,
    /// The latest progress report.
    #[serde(default)]
    pub progress: Option<Progress>,
    #[serde(default)]
    pub promoted: Option<Promotion>,
    /// A promotion the core could not make yet, and why.
    #[serde(default)]
    pub blocked: Option<String>,
}

/// A fraction done, and the run time it had taken when it was reported.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub fraction: f64,
    pub ran_ms: u64,
    pub at_ms: u64,
}

/// When and why the job moved to on-demand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Promotion {
    pub at_ms: u64,
    pub why: String,
    /// The attempt promoted as it ran, and the preemptible rate it ran at
    /// until then (none when the job was promoted in the queue).
    #[serde(default)]
    pub running: Option<(Attempt, i64)>,
}

/// What the estimate says at an instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judgement {
    /// Run time the rest needs; none before any progress is reported.
    pub needed_ms: Option<u64>,
    pub margin_ms: u64,
    /// Time from now to the deadline.
    pub left_ms: u64,
    pub promote: bool,
    /// When to judge again if nothing else happens first.
    pub due_ms: u64,
}

/// Run time of `job` up to `now`: its ended attempts' and the live one's.
pub fn ran_ms(job: &JobRecord, d: &Deadline, now: u64) -> u64 {
    let live = match (job.state.is_live(), job.run_started_ms) {
        (true, Some(started)) => now.saturating_sub(started),
        _ => 0,
    };
    d.ran_ms.saturating_add(live)
}

/// Run time the rest of the work needs after `ran` milliseconds of run
/// time, at the rate of the latest report.
pub fn needed_ms(d: &Deadline, ran: u64) -> Option<u64> {
    let p = d.progress?;
    if p.fraction >= 1.0 {
        return Some(0);
    }
    if p.fraction <= 0.0 || p.ran_ms == 0 {
        return None;
    }
    let total = p.ran_ms as f64 / p.fraction;
    let total = if total.is_finite() { total.min(u64::MAX as f64 / 2.0) as u64 } else { u64::MAX / 2 };
    Some(total.saturating_sub(ran.max(p.ran_ms)))
}

/// Whether `job`, with deadline `d`, must be promoted at `now`. With no
/// progress reported, the rest is taken as needing no time: the job is
/// promoted only once not even one preemption would fit before the deadline.
pub fn judge(job: &JobRecord, d: &Deadline, now: u64, drain_window: Span) -> Judgement {
    let needed = needed_ms(d, ran_ms(job, d, now));
    let need = needed.unwrap_or(0);
    let margin = ebb_scheduler::deadline::margin(Span(need), drain_window).0;
    let promote = ebb_scheduler::deadline::must_promote(Time(now), Span(need), Time(d.at_ms), drain_window);
    // As if it waited from now: the latest instant it may start and still fit.
    let due_ms =
        ebb_scheduler::deadline::latest_start(Span(need), Time(d.at_ms), drain_window).0.max(now + 1);
    Judgement { needed_ms: needed, margin_ms: margin, left_ms: d.at_ms.saturating_sub(now), promote, due_ms }
}

fn percent(fraction: f64) -> String {
    format!("{:.0}%", (fraction * 100.0).clamp(0.0, 100.0))
}

/// Where `job` stands, for `GET /v1/jobs/{id}` and `ebb show`.
pub fn status(job: &JobRecord, d: &Deadline, now: u64, drain_window: Span) -> ebb_api::DeadlineStatus {
    let j = judge(job, d, now, drain_window);
    let fraction = d.progress.map(|p| p.fraction);
    let done = fraction.map(percent);
    let left = Span(j.left_ms).human();
    let (state, summary) = if job.state.is_final() {
        let end = job.exited_ms.max(job.submitted_ms);
        match (job.state == JobState::Succeeded, end <= d.at_ms) {
            (true, true) => ("met", format!("met: done {} before the deadline", Span(d.at_ms - end).human())),
            (true, false) => {
                ("missed", format!("missed: done {} after the deadline", Span(end - d.at_ms).human()))
            }
            (false, _) => ("missed", format!("missed: the job {}", job.state.as_str())),
        }
    } else if now > d.at_ms {
        (
            "missed",
            format!(
                "missed: the deadline passed {} ago{}",
                Span(now - d.at_ms).human(),
                done.as_ref().map(|f| format!(", {f} done")).unwrap_or_default()
            ),
        )
    } else if let Some(p) = &d.promoted {
        (
            "promoted",
            format!("promoted to on-demand {} ago: {}", Span(now.saturating_sub(p.at_ms)).human(), p.why),
        )
    } else {
        match (done, j.needed_ms) {
            (Some(done), Some(needed)) => {
                let blocked =
                    d.blocked.as_ref().map(|b| format!("; promotion waits: {b}")).unwrap_or_default();
                (
                    "on_track",
                    format!("on track: {done} done, needs {} of {left} left{blocked}", Span(needed).human()),
                )
            }
            _ => ("no_progress", format!("no progress reported yet, {left} left")),
        }
    };
    ebb_api::DeadlineStatus {
        deadline: rfc3339(d.at_ms),
        deadline_ms: d.at_ms,
        state: state.into(),
        summary,
        fraction_done: fraction,
        needed_seconds: j.needed_ms.map(|ms| ms.div_ceil(1000)),
        left_seconds: j.left_ms / 1000,
        promoted_at: d.promoted.as_ref().map(|p| rfc3339(p.at_ms)),
        promoted_why: d.promoted.as_ref().map(|p| p.why.clone()),
    }
}

/// Judges job `id`'s deadline again at `now`, promoting it if it no
/// longer fits, else noting when to judge it next. Over the job table and
/// the core, which a promotion changes, and the effects.
pub(super) fn judge_deadline(
    jobs: &mut JobTable,
    core: &mut State,
    drain_window: Span,
    fx: &mut impl Effects,
    id: JobId,
    now: u64,
) -> Written {
    let Some(job) = jobs.get(&id) else { return Ok(()) };
    let Some(d) = &job.deadline else { return Ok(()) };
    if job.state.is_final() || d.promoted.is_some() || job.tier != Tier::Preemptible {
        return Ok(());
    }
    let j = judge(job, d, now, drain_window);
    if !j.promote {
        jobs.deadlines.insert(j.due_ms, id);
        return Ok(());
    }
    promote(jobs, core, fx, id, j, now)
}

fn promote(
    jobs: &mut JobTable,
    core: &mut State,
    fx: &mut impl Effects,
    id: JobId,
    j: Judgement,
    now: u64,
) -> Written {
    let job = &jobs[&id];
    let d = job.deadline.as_ref().expect("a deadline job");
    let fraction = d.progress.map(|p| p.fraction);
    let why = match (fraction, j.needed_ms) {
        (Some(f), Some(needed)) => format!(
            "{} done, needs {} + {} margin, {} left",
            percent(f),
            Span(needed).human(),
            Span(j.margin_ms).human(),
            Span(j.left_ms).human()
        ),
        _ => format!(
            "no progress reported, {} left, within the {} margin",
            Span(j.left_ms).human(),
            Span(j.margin_ms).human()
        ),
    };
    let in_core = job.waiting.is_none();
    let promoted = if in_core { core.promote(id, Time(now)) } else { Ok(Promoted::Queued) };
    let job = jobs.get_mut(&id).expect("checked above");
    let d = job.deadline.as_mut().expect("a deadline job");
    let running = match promoted {
        Ok(Promoted::Queued) => None,
        Ok(Promoted::Running) => {
            let (model, rate, on_demand) = job.billing.clone().expect("a running job has its rates");
            job.billing = Some((model, on_demand, on_demand));
            Some((job.attempt, rate))
        }
        Err(e) => {
            let first = d.blocked.is_none();
            d.blocked = Some(e.to_string());
            jobs.deadlines.insert(now + RETRY_MS, id);
            if first {
                let message = format!("deadline: promotion to on-demand waits: {e}");
                fx.event(&jobs[&id], Event::Warning(WarningDetail { message, ..Default::default() }))?;
            }
            return effects::save(jobs, fx, id);
        }
    };
    d.blocked = None;
    d.promoted = Some(Promotion { at_ms: now, why: why.clone(), running });
    job.tier = Tier::OnDemand;
    // On-demand work is never shrunk or grown: an elastic job runs on as
    // it is, or queues for its fewest (as the core took it).
    let holding = job.running_gpus();
    if job.spec.max_gpus.take().is_some() && running.is_some() {
        job.gpus = holding;
    }
    let detail = PromotedDetail {
        running: running.is_some(),
        fraction_done: fraction,
        needed_seconds: j.needed_ms.map(|ms| ms.div_ceil(1000)),
        margin_seconds: j.margin_ms / 1000,
        left_seconds: j.left_ms / 1000,
        reason: why,
    };
    fx.event(&jobs[&id], Event::Promoted(detail))?;
    effects::save(jobs, fx, id)
}

/// Judges the deadlines that are due by `now`.
pub(super) fn check_deadlines(
    jobs: &mut JobTable,
    core: &mut State,
    drain_window: Span,
    fx: &mut impl Effects,
    now: u64,
) -> Written {
    while let Some((_, id)) = jobs.deadlines.pop_due(now) {
        judge_deadline(jobs, core, drain_window, fx, id, now)?;
    }
    Ok(())
}

/// The live attempt reported `fraction` done at `at_ms`: its progress
/// noted, and its deadline judged again.
pub(super) fn progressed(
    jobs: &mut JobTable,
    core: &mut State,
    drain_window: Span,
    fx: &mut impl Effects,
    (attempt, fraction, at_ms): (AttemptRef, f64, u64),
    now: u64,
) -> Written {
    if !fraction.is_finite() || !(0.0..=1.0).contains(&fraction) {
        tracing::warn!(job = attempt.job.0, "progress {fraction} is not a fraction from 0 to 1: ignored");
        return Ok(());
    }
    let job = jobs.get_mut(&attempt.job).expect("live attempt");
    let Some(d) = job.deadline.as_mut() else { return Ok(()) };
    let live = job.run_started_ms.map_or(0, |s| at_ms.saturating_sub(s));
    d.progress = Some(Progress { fraction, ran_ms: d.ran_ms.saturating_add(live), at_ms });
    effects::save(jobs, fx, attempt.job)?;
    judge_deadline(jobs, core, drain_window, fx, attempt.job, now)
}

/// The live attempt of `job` ran until `end_ms`: its run time counts.
pub(super) fn attempt_ended(job: &mut JobRecord, end_ms: u64) {
    if let (Some(d), Some(started)) = (job.deadline.as_mut(), job.run_started_ms) {
        d.ran_ms = d.ran_ms.saturating_add(end_ms.saturating_sub(started));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Span = Span(300_000);
    const H: u64 = 3_600_000;

    fn job(state: JobState, run_started_ms: Option<u64>) -> JobRecord {
        let spec = ebb_api::JobSubmission { argv: vec!["train".into()], ..Default::default() };
        let mut job =
            JobRecord::queued(JobId(7), TenantId(1), StoredSpec::from(spec), Tier::Preemptible, 1, 15, 0);
        job.state = state;
        job.run_started_ms = run_started_ms;
        job
    }

    #[test]
    fn judging_over_the_parts_notes_when_to_judge_again_or_promotes_with_one_event_and_one_write() {
        // A queued job waiting outside the core (at its tenant's limit)
        // that has not reported progress, its deadline at 10 h.
        let mut queued = job(JobState::Queued, None);
        queued.waiting = Some(Waiting::TenantLimit);
        queued.deadline = Some(Box::new(Deadline { at_ms: 10 * H, ..Deadline::default() }));
        let mut jobs = JobTable::new(JobId(8));
        jobs.insert(JobId(7), Box::new(queued));
        let mut core = State::new();
        let mut fx = effects::Recorded::default();
        // At 0 it fits: judged again once a preemption would not (10 h − 6 min).
        judge_deadline(&mut jobs, &mut core, WINDOW, &mut fx, JobId(7), 0).unwrap();
        assert!(fx.events.is_empty() && fx.saved.is_empty() && fx.sent.is_empty());
        assert_eq!(jobs.deadlines.pop_due(u64::MAX), Some((10 * H - 360_000, JobId(7))));
        // Past that, it is promoted in the queue: one event, one write.
        let now = 10 * H - 300_000;
        fx.now = now;
        jobs.deadlines.insert(10 * H - 360_000, JobId(7));
        check_deadlines(&mut jobs, &mut core, WINDOW, &mut fx, now).unwrap();
        assert!(matches!(&fx.events[..], [(JobId(7), Event::Promoted(p))] if !p.running), "{:?}", fx.events);
        assert_eq!(fx.saved.len(), 1);
        assert_eq!(fx.saved[0].tier, Tier::OnDemand);
        assert!(fx.saved[0].deadline.as_ref().unwrap().promoted.is_some());
        assert!(fx.sent.is_empty());
        // Promoted, it is not judged again.
        jobs.deadlines.insert(0, JobId(7));
        check_deadlines(&mut jobs, &mut core, WINDOW, &mut fx, now + H).unwrap();
        assert_eq!((fx.events.len(), fx.saved.len()), (1, 1));
    }

    #[test]
    fn a_job_on_track_stays_preemptible_and_one_that_slows_is_promoted() {
        // 25% after 1 h of run time: 3 h more; the deadline at 10 h leaves 9 h.
        let running = job(JobState::Running, Some(0));
        let mut d = Deadline { at_ms: 10 * H, ..Deadline::default() };
        d.progress = Some(Progress { fraction: 0.25, ran_ms: H, at_ms: H });
        let j = judge(&running, &d, H, WINDOW);
        assert_eq!((j.needed_ms, j.left_ms, j.promote), (Some(3 * H), 9 * H, false));
        assert_eq!(j.margin_ms, 300_000 + 60_000 + 3 * H / 10);
        // Still at that rate 2 h later: 1 h more, nothing changes.
        assert_eq!(judge(&running, &d, 3 * H, WINDOW).needed_ms, Some(H));
        assert!(!judge(&running, &d, 3 * H, WINDOW).promote);
        // But at 3 h it reports only 30%: 7 h more, 7 h left: promoted.
        d.progress = Some(Progress { fraction: 0.30, ran_ms: 3 * H, at_ms: 3 * H });
        let j = judge(&running, &d, 3 * H, WINDOW);
        assert_eq!((j.needed_ms, j.promote), (Some(7 * H), true));
    }

    #[test]
    fn only_run_time_counts_and_a_queued_job_is_promoted_when_its_slack_is_gone() {
        // 50% after 2 h of run time over two attempts, then queued.
        let queued = job(JobState::Queued, None);
        let d = Deadline {
            at_ms: 10 * H,
            ran_ms: 2 * H,
            progress: Some(Progress { fraction: 0.5, ran_ms: 2 * H, at_ms: 3 * H }),
            ..Deadline::default()
        };
        let j = judge(&queued, &d, 4 * H, WINDOW);
        assert_eq!((j.needed_ms, j.promote), (Some(2 * H), false));
        // It must start by 10 h − 2 h − (5 min + 1 min + 12 min).
        assert_eq!(j.due_ms, 10 * H - 2 * H - (300_000 + 60_000 + 2 * H / 10));
        assert!(!judge(&queued, &d, j.due_ms, WINDOW).promote);
        assert!(judge(&queued, &d, j.due_ms + 1, WINDOW).promote);
    }

    #[test]
    fn without_progress_a_job_is_promoted_only_when_one_preemption_would_not_fit() {
        let queued = job(JobState::Queued, None);
        let d = Deadline { at_ms: 10 * H, ..Deadline::default() };
        let j = judge(&queued, &d, 0, WINDOW);
        assert_eq!((j.needed_ms, j.promote, j.due_ms), (None, false, 10 * H - 360_000));
        assert!(judge(&queued, &d, 10 * H - 359_999, WINDOW).promote);
        let s = status(&queued, &d, 0, WINDOW);
        assert_eq!(
            (s.state.as_str(), s.summary.as_str()),
            ("no_progress", "no progress reported yet, 10h 00m left")
        );
    }

    #[test]
    fn the_status_says_where_it_stands() {
        let running = job(JobState::Running, Some(0));
        let mut d = Deadline {
            at_ms: 7 * H,
            progress: Some(Progress { fraction: 0.62, ran_ms: 5 * H, at_ms: 5 * H }),
            ..Deadline::default()
        };
        let s = status(&running, &d, 0, WINDOW);
        assert_eq!(s.state, "on_track");
        assert!(s.summary.starts_with("on track: 62% done, needs 3h 03m of 7h 00m left"), "{}", s.summary);
        d.promoted = Some(Promotion { at_ms: 0, why: "62% done".into(), running: Some((Attempt(1), 1)) });
        assert_eq!(status(&running, &d, H, WINDOW).summary, "promoted to on-demand 1h 00m ago: 62% done");
        assert_eq!(status(&running, &d, 8 * H, WINDOW).state, "missed");
        let mut done = job(JobState::Succeeded, None);
        done.exited_ms = 6 * H;
        assert_eq!(status(&done, &d, 8 * H, WINDOW).summary, "met: done 1h 00m before the deadline");
    }
}
