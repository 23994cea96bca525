//! Starts sent ahead. A preemptor holds its victims' GPUs until they have
//! drained; without this, its start waits for each victim's exit to come
//! to the server, a commit, and a start to go back. Where the hold is on
//! one node whose agent can hold a start back (`starts_when_free`), the
//! preemptor's start goes to it with the drain notices, marked
//! `when_gpus_free`: the agent prepares it at once and starts its process
//! the moment the victims' exits are reported, and the server, reading
//! those exits and then the start in the node's report, places the job
//! from its hold as the attempt it promised.
//!
//! The promise is the core's ([`State::stage`]): the hold's placement is
//! that attempt, and a hold that goes without it (the job cancelled, its
//! node lost or cordoned, a takeover that could not restore it) spends the
//! number, so a start the node may have made already is stale wherever the
//! job runs next. The node is then told to withdraw it.

use ebb_scheduler::{Placement, Plan};

use super::effects;
use super::ending::STOP_GRACE_MS;
use super::table::JobTable;
use super::*;

/// A preemptor's start sent to its hold's node before its victims left.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedStart {
    pub attempt: Attempt,
    pub node: String,
    /// The checkpoint interval the start carries, seconds, and why: the
    /// placement records the same.
    pub interval: (u64, String),
}

impl<S: Store> Engine<S> {
    /// The node started job `id`'s staged attempt (its victims' exits came
    /// first in its report): the job is placed from its hold now, as the
    /// pass would have placed it. False if the core refuses the placement
    /// (the node started it while the core still has a victim there): the
    /// start is withdrawn and the attempt is stale.
    pub(super) fn place_staged(&mut self, id: JobId, now: u64) -> Written<bool> {
        let Some(hold) = self.core.hold(id) else { return Ok(false) };
        let Some(attempt) = hold.staged else { return Ok(false) };
        let placement =
            Placement { job: id, attempt, model: hold.model, alloc: hold.alloc.clone(), from_hold: true };
        let plan = Plan { now: Time(now), placements: vec![placement.clone()], ..Plan::default() };
        if let Err(e) = self.core.apply(&plan) {
            tracing::warn!(job = id.0, "a staged start could not be placed ({e}); withdrawn");
            let Parts { jobs, core, mut fx, .. } = self.parts();
            withdraw(jobs, core, &mut fx, id)?;
            return Ok(false);
        }
        self.placed(&placement, now)?;
        Ok(true)
    }

    /// At the end of a batch: staged starts whose holds went without their
    /// placement (a cancel, a lost or cordoned node) are withdrawn.
    pub(super) fn withdraw_gone_holds(&mut self) -> Written {
        if self.jobs.staged.is_empty() {
            return Ok(());
        }
        let gone: Vec<JobId> = self
            .jobs
            .staged
            .iter()
            .copied()
            .filter(|id| {
                let promised = self.jobs.get(id).and_then(|j| j.staged.as_ref()).map(|s| s.attempt);
                let held = self.core.hold(*id).and_then(|h| h.staged);
                promised.is_none() || promised != held
            })
            .collect();
        let Parts { jobs, core, mut fx, .. } = self.parts();
        for id in gone {
            withdraw(jobs, core, &mut fx, id)?;
        }
        Ok(())
    }

    /// The writer's staged starts agree: each in the set, in its record,
    /// and the core's hold.
    pub(super) fn check_staged(&self) -> Result<(), String> {
        for (id, job) in &self.jobs {
            if job.staged.is_some() != self.jobs.staged.contains(id) {
                return Err(format!("job {id}: staged start out of step with the set"));
            }
            if let Some(s) = &job.staged {
                let held = self.core.hold(*id).and_then(|h| h.staged);
                if held != Some(s.attempt) || job.state != JobState::Queued {
                    return Err(format!("job {id}: staged attempt {} not the core's ({held:?})", s.attempt));
                }
            }
        }
        if self.jobs.staged.iter().any(|id| !self.jobs.contains_key(id)) {
            return Err("a staged start of a job not held".into());
        }
        Ok(())
    }
}

/// Sends preemptor `id`'s start to its hold's node now, where it can be:
/// a hold on one node with victims still to leave, each of them on that
/// node alone (a gang's part elsewhere would keep the hold waiting after
/// the node's own part had gone), and an agent there that holds such a
/// start back. The caller saves the record.
pub(super) fn stage(p: &mut Parts<'_, impl Effects>, id: JobId) {
    let job = &p.jobs[&id];
    let [Part { node, gpus }] = &job.held[..] else { return };
    let local = |v: &JobId| p.jobs.get(v).is_some_and(|v| v.placement.iter().all(|p| p.node == *node));
    if job.waiting_for.is_empty()
        || !job.waiting_for.iter().all(local)
        || !p.fleet.starts_when_free.contains(node)
    {
        return;
    }
    let placement = vec![Part::new(node.clone(), gpus.clone())];
    let Ok(attempt) = p.core.stage(id) else { return };
    let launch = Launch { config: p.config, tenants: p.tenants, fleet: p.fleet };
    let recommendation = launch.recommend(&p.jobs[&id], &placement, p.fx.now());
    let why = p.why.of(&recommendation);
    let interval = (recommendation.interval.as_secs(), why);
    let staged = StagedStart { attempt, node: placement[0].node.clone(), interval };
    p.jobs.get_mut(&id).expect("known job").staged = Some(staged);
    p.jobs.staged.insert(id);
    p.fx.counters().starts_ahead += 1;
    send_staged(p.jobs, &launch, &mut p.fx, id);
}

/// The staged start of job `id`, to its node (again, after the node
/// registered anew without it).
pub(super) fn send_staged(jobs: &JobTable, launch: &Launch, fx: &mut impl Effects, id: JobId) {
    let job = &jobs[&id];
    let Some(staged) = &job.staged else { return };
    let mut placed = job.clone();
    placed.attempt = staged.attempt;
    placed.placement = job.held.clone();
    placed.interval = Some(staged.interval.clone());
    placed.rendezvous = None;
    for (node, mut start) in launch.starts(&placed) {
        start.when_gpus_free = true;
        fx.send(&node, Action::Start(start));
    }
}

/// Whether `attempt` is its job's start staged on `node`, not yet placed.
pub(super) fn staged_on(jobs: &JobTable, attempt: AttemptRef, node: &str) -> bool {
    jobs.get(&attempt.job).is_some_and(|job| {
        job.state == JobState::Queued
            && job.staged.as_ref().is_some_and(|s| s.attempt == attempt.attempt && s.node == node)
    })
}

/// Job `id`'s staged start will not be its placement: the core spends the
/// number, the record keeps it as spent (so a takeover numbers the next
/// attempt after it), and the node withdraws it (or stops it, if it ran).
pub(super) fn withdraw(jobs: &mut JobTable, core: &mut State, fx: &mut impl Effects, id: JobId) -> Written {
    jobs.staged.remove(&id);
    let Some(job) = jobs.get_mut(&id) else { return Ok(()) };
    let Some(staged) = job.staged.take() else { return Ok(()) };
    job.spent_attempt = job.spent_attempt.max(staged.attempt);
    fx.counters().starts_withdrawn += 1;
    let _ = core.unstage(id);
    let attempt = AttemptRef { job: id, attempt: staged.attempt };
    fx.send(&staged.node, Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None });
    effects::save(jobs, fx, id)
}
