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
    /// [`ended`], over the writer's parts.
    pub(super) fn ended(&mut self, id: JobId, effect: ExitEffect, end_ms: u64, note: EndNote) -> Written {
        ended(&mut self.parts(), id, (effect, end_ms), note)
    }
}

/// One node's processes of an attempt are gone (at `at_ms` by the agent's
/// clock); when the last node's are, the attempt has ended.
pub(super) fn part_exited(
    p: &mut Parts<'_, impl Effects>,
    node: &str,
    attempt: AttemptRef,
    exit: PartExit,
    at_ms: u64,
) -> Written {
    let id = attempt.job;
    if p.jobs[&id].elastic.as_ref().is_some_and(|e| e.leaving.iter().any(|l| l.node == node)) {
        return part_left(p, node, attempt, at_ms);
    }
    let PartExit { code, signal, completed, vanished, peak_memory_bytes, start_error, port_in_use, ended_by } =
        exit;
    let job = p.jobs.get_mut(&id).expect("live attempt");
    let first_part = job.running_on.len() == job.placement.len();
    job.running_on.retain(|n| n != node);
    job.exited_ms = job.exited_ms.max(at_ms);
    job.vanished |= vanished;
    // A job's own requeue wins over its time limit: it asked in time.
    job.ended_by = match (job.ended_by, ended_by) {
        (Some(EndedBy::Requeue), _) | (_, Some(EndedBy::Requeue)) => Some(EndedBy::Requeue),
        (earlier, later) => earlier.or(later),
    };
    // The attempt's exit is its first part's, unless a later one failed
    // where those before succeeded: a part killed by a signal after
    // another exited 0 is the attempt's failure, not its success.
    let part_ok = code == Some(0) && signal.is_none() && !vanished;
    let so_far_ok = job.exit_code == Some(0) && job.exit_signal.is_none();
    if first_part || (so_far_ok && !part_ok) {
        job.exit_code = code;
        job.exit_signal = signal;
    }
    // The job's own port alone: a job's word cannot mark others busy.
    if let Some(port) = port_in_use.filter(|port| job.rendezvous.as_ref().is_some_and(|(_, own)| own == port))
    {
        job.rendezvous_failed = Some(port_taken(p.fleet, id, node, port));
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
    p.fx.event(&p.jobs[&id], Event::Exited(detail))?;
    let job = &p.jobs[&id];
    if !job.running_on.is_empty() {
        return others_running(p, id, node, (code, signal, vanished, ended_by), part_ok);
    }
    let kind = exit_kind(job, completed, p.config.limits.max_requeues);
    let effect = match p.core.exited(id, attempt.attempt, kind) {
        Ok(effect) => effect,
        Err(e) => {
            tracing::error!(job = id.0, "core refused the exit: {e}");
            return effects::save(p.jobs, &mut p.fx, id);
        }
    };
    let end_ms = job.exited_ms;
    let reason = end_reason(job, effect, node);
    ended(p, id, (effect, end_ms), EndNote { reason, ..Default::default() })
}

/// An elastic job's part told to leave has gone (however it exited: it
/// was told to): the core frees its GPUs, the part is metered from its
/// node's join to its exit and counted in its tenant's fair share, and the
/// attempt goes on on the other nodes.
fn part_left(p: &mut Parts<'_, impl Effects>, node: &str, attempt: AttemptRef, at_ms: u64) -> Written {
    let id = attempt.job;
    let now = p.fx.now();
    if let Some(n) = p.core.node_by_name(node) {
        if let Err(e) = p.core.part_left(id, attempt.attempt, n) {
            tracing::error!(job = id.0, node, "core refused the part's leaving: {e}");
        }
    }
    let job = p.jobs.get_mut(&id).expect("live attempt");
    let started = job.run_started_ms.unwrap_or(job.started_ms);
    let Some(at) = job.placement.iter().position(|part| part.node == node) else {
        return effects::save(p.jobs, &mut p.fx, id);
    };
    let part = job.placement.remove(at);
    job.running_on.retain(|n| n != node);
    job.started_on.retain(|n| n != node);
    let elastic = job.elastic.get_or_insert_with(Default::default);
    let notice_at_ms = elastic.leaving.iter().find(|l| l.node == node).map(|l| l.notice.notice_at_ms);
    elastic.leaving.retain(|l| l.node != node);
    let from_ms = elastic.joined.iter().find(|(n, _)| n == node).map_or(started, |(_, at)| *at);
    elastic.joined.retain(|(n, _)| n != node);
    let gpus = part.gpus.len() as u32;
    let to_ms = at_ms.max(from_ms);
    elastic.left.push(LeftPart { node: node.to_string(), gpus, from_ms, to_ms, notice_at_ms });
    let now_gpus = job.placement.iter().map(|part| part.gpus.len() as u32).sum();
    if let Some((model, _, _)) = &job.billing {
        if let Some(model) = p.core.model_by_name(model) {
            let span = (Time(from_ms), Time(to_ms));
            let _ = p.core.record_usage(job.tenant, job.tier, model, gpus, span, Time(now));
        }
    }
    let gpu_seconds = (to_ms - from_ms) as f64 / 1000.0 * f64::from(gpus);
    let detail = ShrunkDetail { node: node.to_string(), gpus, gpu_seconds, now_gpus };
    p.fx.event(&p.jobs[&id], Event::Shrunk(detail))?;
    effects::save(p.jobs, &mut p.fx, id)
}

/// A part of a gang exited while others run. Being drained or cancelled,
/// the other parts already have their notice and deadline: they finish
/// their own save. A part that failed fails the gang: the others are
/// stopped now. A part that exited 0 leaves the others the gang exit grace
/// to exit on their own (torchrun's nodes end milliseconds apart; a rank 0
/// may save final weights after its peers are done).
fn others_running(
    p: &mut Parts<'_, impl Effects>,
    id: JobId,
    node: &str,
    (code, signal, vanished, ended_by): (Option<i32>, Option<i32>, bool, Option<EndedBy>),
    part_ok: bool,
) -> Written {
    let job = &p.jobs[&id];
    if job.state == JobState::Draining || job.cancel_requested || job.gang_stopped.is_some() {
        return effects::save(p.jobs, &mut p.fx, id);
    }
    if let Some(why) = job.rendezvous_failed.clone() {
        stop_gang(p.jobs, &mut p.fx, id, format!("{why}: the other parts were stopped"))?;
        return effects::save(p.jobs, &mut p.fx, id);
    }
    if part_ok {
        if job.gang_grace_until.is_none() {
            let until_ms = p.fx.now().saturating_add(p.config.gang_exit_grace.as_millis());
            p.jobs.get_mut(&id).expect("live attempt").gang_grace_until = Some(until_ms);
            p.jobs.gang_graces.insert(until_ms, id);
        }
    } else {
        let why = match (code, signal, vanished) {
            _ if ended_by == Some(EndedBy::Requeue) => format!("node {node}'s part asked to be requeued"),
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
        stop_gang(p.jobs, &mut p.fx, id, format!("{why}: the other parts were stopped"))?;
    }
    effects::save(p.jobs, &mut p.fx, id)
}

/// The gang's rendezvous port was taken on `node` by another program: no
/// gang gets it there again. Returns why the gang could not meet: its
/// attempt is requeued once its parts have ended (a failure to meet is
/// not the job's).
fn port_taken(fleet: &mut Fleet, id: JobId, node: &str, port: u16) -> String {
    let addr = fleet.nodes.get(node).and_then(|n| n.address.clone()).unwrap_or_else(|| node.to_string());
    let taken = fleet.busy_ports.entry(addr).or_default();
    if !taken.contains(&port) {
        taken.push_back(port);
        if taken.len() > BUSY_PORTS_KEPT {
            taken.pop_front();
        }
    }
    let why = format!("the rendezvous port {port} (MASTER_PORT) is in use on node {node} by another program");
    tracing::warn!(job = id.0, node, port, "{why}; the gang is requeued with another port");
    why
}

/// Attempts drained or cancelled before they started, whose deadline (and
/// grace) has passed with no exit from their nodes: ended here, as lost
/// with those nodes' parts, so that their GPUs go to whoever waits. A
/// start the agent reports later is a stale attempt's, and killed.
pub(super) fn end_unstarted(p: &mut Parts<'_, impl Effects>) -> Written {
    while let Some((until_ms, (id, attempt))) = p.jobs.unstarted.pop_due(p.fx.now()) {
        let Some(job) = p.jobs.get(&id) else { continue };
        if job.attempt != attempt || unstarted_due(job) != Some(until_ms) {
            continue; // it started, ended, or has another deadline
        }
        let deadline = until_ms - UNSTARTED_GRACE_MS;
        let why = "not started by its deadline (its node was still preparing it, e.g. pulling its image): \
                   ended by the server";
        tracing::warn!(job = id.0, attempt = attempt.0, "{why}");
        let a = AttemptRef { job: id, attempt };
        for node in job.running_on.clone() {
            p.fx.send(&node, Action::Stop { attempt: a, grace_ms: 0, notice: None });
            let exit = PartExit::vanished(Some(why.to_string()));
            if !p.jobs.get(&id).is_some_and(|j| j.attempt == attempt && j.running_on.contains(&node)) {
                break;
            }
            part_exited(p, &node, a, exit, deadline)?;
        }
    }
    Ok(())
}

/// The live attempt of job `id` ended at `end_ms` with `effect` (the core
/// knows already): the record, its usage record, the event (with `note`
/// in its detail), the tenant's load and a restart's back-off.
pub(super) fn ended(
    p: &mut Parts<'_, impl Effects>,
    id: JobId,
    (effect, end_ms): (ExitEffect, u64),
    note: EndNote,
) -> Written {
    let now = p.fx.now();
    let job = p.jobs.get_mut(&id).expect("live attempt");
    // What a drill needs of the attempt, before the record forgets it.
    let drill_end = drill::AttemptEnd::of(job, effect, end_ms);
    deadline::attempt_ended(job, end_ms);
    // A drill is not a drain in the counters: its time is run time.
    let drained_ms = job
        .drain
        .as_ref()
        .filter(|_| effect != ExitEffect::Drilled)
        .map(|n| end_ms.saturating_sub(n.notice_at_ms));
    // An elastic attempt's parts that left were counted as they did.
    let counted = job.elastic.as_ref().map_or(0, |e| e.left.len());
    let mut ended = end_attempt(job, effect, end_ms, now, p.config.min_runtime);
    if let Some(usage) = &ended.usage {
        p.fx.add_usage(usage)?;
        money::fair_share_usage(p.core, usage, now, counted);
    }
    let counters = p.fx.counters();
    counters.ended(ended.usage.as_ref(), drained_ms);
    counters.lost_gpu_seconds += ended.lost_gpu_ms as f64 / 1000.0;
    counters.preempted += u64::from(ended.preempted);
    if ended.backoff_ms > 0 {
        // Out of the core's queue until the back-off is over.
        match p.core.cancel(id) {
            Ok(()) => {
                let until_ms = now.saturating_add(ended.backoff_ms);
                job.waiting = Some(Waiting::Backoff { until_ms });
                p.jobs.backoff.insert(until_ms, id);
            }
            Err(e) => tracing::error!(job = id.0, "restart back-off not applied: {e}"),
        }
    }
    note.add_to(&mut ended.event);
    p.fx.event(&p.jobs[&id], ended.event)?;
    drill::changed(p.jobs, &mut p.fx, id, |d| d.attempt_ended(drill_end, now))?;
    if ended.state.is_final() {
        finished(p.jobs, p.core, p.admission, &mut p.fx, id)?;
    }
    effects::save(p.jobs, &mut p.fx, id)?;
    if ended.state == JobState::Queued && p.jobs[&id].cancel_requested {
        // Its cancel stands: an attempt lost with its node while it was
        // being cancelled does not run again.
        return match super::jobs::cancel(p, id, None) {
            Ok(()) => Ok(()),
            Err(Fail::Store(e)) => Err(e),
            Err(Fail::Refused(e)) => {
                tracing::error!(job = id.0, "its cancel could not stand: {}", e.message);
                Ok(())
            }
        };
    }
    // Back in the queue, it may no longer have the time to wait.
    deadline::judge_deadline(p.jobs, p.core, p.config.drain_window, &mut p.fx, id, now)
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

/// Job `id` reached a final state: its open drill is abandoned, it leaves
/// its tenant's load and no more output comes for it; the gates it held
/// open, and its tenant's next waiting job may be admitted.
pub(super) fn finished(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    fx: &mut impl Effects,
    id: JobId,
) -> Written {
    let why = match jobs[&id].state {
        JobState::Cancelled => "the job was cancelled",
        JobState::Failed => "the job failed",
        _ => "the job succeeded",
    };
    let now = fx.now();
    drill::changed(jobs, fx, id, |d| d.abandoned(why, now))?;
    let job = jobs.get_mut(&id).expect("known job");
    let was = job.waiting.take();
    let tenant = job.tenant;
    admission.release(job, was);
    jobs.logs.remove(&id);
    gates::open_gates(jobs, core, admission, fx, id, was)?;
    admission::admit_waiting(jobs, core, admission, fx, tenant)
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
