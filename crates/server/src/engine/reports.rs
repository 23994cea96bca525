//! What an agent reports of a live attempt on its node: its part's start,
//! image pull, checkpoints, restore, resume, progress and exit. Each is a
//! function over the writer's parts; the agent protocol
//! (`agents::apply_event`) has already checked that the attempt is live
//! on the node.

use super::effects::{self, Effects};
use super::table::JobTable;
use super::*;

/// An event time of a live attempt, clamped to what the server can know:
/// not before the attempt was placed, not after now.
pub(super) fn known_time(jobs: &JobTable, attempt: AttemptRef, at_ms: u64, now: u64) -> u64 {
    let placed = jobs.get(&attempt.job).map_or(0, |j| j.started_ms);
    at_ms.clamp(placed.min(now), now)
}

/// One event of `node`'s about an attempt live on it. Events about no
/// attempt (health, stopping) and output are the agent protocol's own.
pub(super) fn attempt_event(p: &mut Parts<'_, impl Effects>, node: &str, event: AgentEvent) -> Written {
    let now = p.fx.now();
    let known = |jobs: &JobTable, attempt, at_ms| known_time(jobs, attempt, at_ms, now);
    match event {
        AgentEvent::Started { attempt, pid, at_ms } => {
            let at_ms = known(p.jobs, attempt, at_ms);
            part_started(p.jobs, &mut p.fx, node, attempt, pid, at_ms)
        }
        AgentEvent::Exited {
            attempt,
            code,
            signal,
            completed,
            at_ms,
            peak_memory_bytes,
            start_error,
            port_in_use,
            ended_by,
        } => {
            // Not before the attempt's start, as the record has it.
            let started = p.jobs[&attempt.job].run_started_ms.unwrap_or(0);
            let at_ms = known(p.jobs, attempt, at_ms.max(started));
            // A node's words, kept to a line's worth.
            let start_error = start_error.map(|e| clip(&e, MAX_START_ERROR_BYTES));
            let exit = PartExit {
                code,
                signal,
                completed,
                vanished: false,
                peak_memory_bytes,
                start_error,
                port_in_use,
                ended_by: ended_by.map(EndedBy::from),
            };
            exits::part_exited(p, node, attempt, exit, at_ms)
        }
        AgentEvent::Checkpoint { attempt, step, bytes, duration_ms, at_ms } => {
            let at_ms = known(p.jobs, attempt, at_ms);
            checkpointed(p, attempt, (step, bytes, duration_ms), at_ms)
        }
        AgentEvent::Resumed { attempt, step, at_ms } => {
            let at_ms = known(p.jobs, attempt, at_ms);
            let resumed = ResumedDetail { step, at: Some(rfc3339(at_ms)) };
            p.fx.event(&p.jobs[&attempt.job], Event::Resumed(resumed))?;
            drill::changed(p.jobs, &mut p.fx, attempt.job, |d| d.resumed(attempt.attempt, step, at_ms, now))?;
            effects::save(p.jobs, &mut p.fx, attempt.job)
        }
        AgentEvent::Restored { attempt, from_attempt, upload, step, files, bytes, duration_ms, at_ms } => {
            let at = Some(rfc3339(known(p.jobs, attempt, at_ms)));
            let seconds = duration_ms as f64 / 1000.0;
            let node = node.to_string();
            let detail = RestoredDetail { node, from_attempt, upload, step, files, bytes, seconds, at };
            p.fx.event(&p.jobs[&attempt.job], Event::Restored(detail))
        }
        AgentEvent::Progress { attempt, fraction, at_ms } => {
            let at_ms = known(p.jobs, attempt, at_ms);
            let window = p.config.drain_window;
            deadline::progressed(p.jobs, p.core, window, &mut p.fx, (attempt, fraction, at_ms), now)
        }
        AgentEvent::Pulling { attempt, done_bytes, total_bytes, at_ms } => {
            let at_ms = known(p.jobs, attempt, at_ms);
            pulling(p.jobs, &mut p.fx, node, attempt, (done_bytes, total_bytes), at_ms)
        }
        AgentEvent::Pulled { attempt, downloaded_bytes, duration_ms, at_ms } => {
            let at = Some(rfc3339(known(p.jobs, attempt, at_ms)));
            p.jobs.get_mut(&attempt.job).expect("live").pulling = None;
            let seconds = duration_ms as f64 / 1000.0;
            let detail = PulledDetail { node: node.to_string(), downloaded_bytes, seconds, at };
            p.fx.event(&p.jobs[&attempt.job], Event::Pulled(detail))?;
            effects::save(p.jobs, &mut p.fx, attempt.job)
        }
        AgentEvent::Health { .. } | AgentEvent::Stopping { .. } | AgentEvent::Output { .. } => {
            unreachable!("the agent protocol's own")
        }
    }
}

/// A part of the live attempt started on `node`: a gang runs once every
/// node has started its part.
fn part_started(
    jobs: &mut JobTable,
    fx: &mut impl Effects,
    node: &str,
    attempt: AttemptRef,
    pid: u32,
    at_ms: u64,
) -> Written {
    let job = jobs.get_mut(&attempt.job).expect("live");
    if job.started_on.iter().any(|n| n == node) {
        return Ok(());
    }
    job.started_on.push(node.to_string());
    job.run_started_ms = Some(job.run_started_ms.map_or(at_ms, |t| t.min(at_ms)));
    // A node an elastic job grew onto counts from its part's start, as
    // the attempt's first nodes do, not from when the grow was decided.
    if let Some(elastic) = job.elastic.as_deref_mut() {
        if let Some((_, joined_ms)) = elastic.joined.iter_mut().find(|(n, _)| n == node) {
            *joined_ms = (*joined_ms).max(at_ms);
        }
    }
    if job.state == JobState::Starting && job.started_on.len() == job.placement.len() {
        job.state = JobState::Running;
    }
    let detail = StartedDetail { node: node.to_string(), pid, at: Some(rfc3339(at_ms)) };
    fx.event(job, Event::Started(detail))?;
    let now = fx.now();
    drill::changed(jobs, fx, attempt.job, |d| d.started(attempt.attempt, at_ms, now))?;
    effects::save(jobs, fx, attempt.job)
}

/// The live attempt's image pull on `node`: `(done, total)` bytes. Its
/// first report (or one starting over) is an event.
fn pulling(
    jobs: &mut JobTable,
    fx: &mut impl Effects,
    node: &str,
    attempt: AttemptRef,
    (done_bytes, total_bytes): (u64, u64),
    at_ms: u64,
) -> Written {
    let job = jobs.get_mut(&attempt.job).expect("live");
    let first = job.pulling.as_ref().is_none_or(|(n, _, _)| n != node) || done_bytes == 0;
    job.pulling = Some((node.to_string(), done_bytes.min(total_bytes), total_bytes));
    if first {
        let digest = job.spec.image.as_ref().map(|i| i.digest.clone());
        let detail = PullingDetail { node: node.to_string(), digest, total_bytes, at: Some(rfc3339(at_ms)) };
        fx.event(job, Event::Pulling(detail))?;
    }
    effects::save(jobs, fx, attempt.job)
}

/// The live attempt reported a completed checkpoint (its step, bytes and
/// how long it took): the core picks victims by it, the record shows it,
/// and a checkpoint that would not fit in the drain window earns the job
/// a warning.
fn checkpointed(
    p: &mut Parts<'_, impl Effects>,
    attempt: AttemptRef,
    (step, bytes, duration_ms): (Option<u64>, Option<u64>, u64),
    at_ms: u64,
) -> Written {
    let (id, now) = (attempt.job, p.fx.now());
    if let Err(e) = p.core.checkpointed(id, attempt.attempt, Time(now)) {
        tracing::warn!(job = id.0, "checkpoint not taken: {e}");
        return Ok(());
    }
    p.fx.counters().checkpoints += 1;
    let window = p.config.drain_window;
    let job = p.jobs.get_mut(&id).expect("live attempt");
    let seconds = duration_ms as f64 / 1000.0;
    let checkpoint = SavedCheckpoint { at_ms, attempt: attempt.attempt, step, bytes, seconds };
    job.checkpoints.record(checkpoint, duration_ms);
    job.attempt_checkpoint_ms = Some(job.attempt_checkpoint_ms.map_or(at_ms, |t| t.max(at_ms)));
    let warn = duration_ms > window.as_millis() && !job.checkpoints.warned;
    job.checkpoints.warned |= warn;
    p.fx.event(job, Event::Checkpoint(CheckpointDetail { step, bytes, seconds }))?;
    drill::changed(p.jobs, &mut p.fx, id, |d| d.checkpointed(attempt.attempt, step, now))?;
    if warn {
        let message = format!(
            "a checkpoint took {}, longer than the {} drain window: a save started at notice will not \
             finish before the kill; checkpoint periodically (EBB_CHECKPOINT_INTERVAL_S) or make the save \
             faster",
            Span(duration_ms).human(),
            window.human(),
        );
        tracing::warn!(job = id.0, "{message}");
        let detail = WarningDetail {
            message,
            checkpoint_seconds: Some(seconds),
            drain_window_seconds: Some(window.as_secs()),
        };
        p.fx.event(&p.jobs[&id], Event::Warning(detail))?;
    }
    effects::save(p.jobs, &mut p.fx, id)
}

/// What a start failure's cause may take in an event: the schema's bound.
const MAX_START_ERROR_BYTES: usize = 4096;

/// `text` cut to at most `max` bytes, between characters, with `…` where
/// it was cut.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut at = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}…", &text[..at])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_start_error_is_clipped_between_characters() {
        assert_eq!(super::clip("short", 4096), "short");
        let long = "é".repeat(3000);
        let clipped = super::clip(&long, super::MAX_START_ERROR_BYTES);
        assert!(clipped.len() <= super::MAX_START_ERROR_BYTES && clipped.ends_with('…'), "{}", clipped.len());
    }
}
