//! Elastic jobs in the replay: a shrink's notice to some of a job's
//! nodes, those parts leaving, and grows. The work model is at the top of
//! `engine.rs`.

use ebb_core::NodeId;
use ebb_scheduler::Shrink;

use super::*;

/// A part of an elastic job's attempt told to leave.
pub(super) struct Leaving {
    pub node: NodeId,
    pub gpus: u32,
    pub notice: Time,
    /// The job saves for it (and does not work) until it leaves.
    pub saves: bool,
}

impl Engine<'_> {
    /// A shrink's notice reaches elastic job `i`: as a drain's would, the
    /// job saves in `drain_checkpoint` if that fits the window (and works
    /// no more meanwhile), the parts then leaving; or the parts leave at
    /// once (no notice) or at the deadline, and what stays is rolled back
    /// to the last checkpoint.
    pub(super) fn shrink_notice(&mut self, i: usize, now: Time, shrink: &Shrink) {
        let run = self.state.job(shrink.job).and_then(|j| j.run.as_ref()).expect("a shrunk job runs");
        let window = shrink.deadline.saturating_since(now);
        let (exit_at, saves) = match (self.config.notice, self.config.drain_checkpoint) {
            (NoticeMode::None, _) => (now, false),
            (NoticeMode::Drain, Some(save)) if save <= window => (now + save, true),
            (NoticeMode::Drain, _) => (shrink.deadline, false),
        };
        let parts: Vec<Leaving> = shrink
            .nodes
            .iter()
            .map(|&node| {
                let gpus = run.alloc.iter().find(|(n, _)| *n == node).map_or(0, |(_, m)| m.count_ones());
                Leaving { node, gpus, notice: now, saves }
            })
            .collect();
        let job = &mut self.jobs[i];
        job.shrinks += 1;
        let attempt = job.attempt.0;
        if saves && job.paused_at.is_none() && job.drain.is_none() {
            job.paused_at = Some(now);
            job.generation += 1; // no completion or checkpoint while it saves
        }
        for part in &parts {
            self.push(exit_at, Event::PartExit(i, attempt, part.node.0));
        }
        self.jobs[i].leaving.extend(parts);
    }

    /// The part of job `i` on `node` leaves: its GPUs are metered and
    /// freed, and the job restarts on what stays, from the save made for
    /// it or rolled back to its last checkpoint (as the last of the
    /// parts leaving together goes). An event for an attempt that has
    /// ended is ignored.
    pub(super) fn part_exit(&mut self, i: usize, now: Time, attempt: Attempt, node: u32) {
        let job = &self.jobs[i];
        let live = job.run.is_some() && job.attempt == attempt;
        let Some(at) = job.leaving.iter().position(|l| l.node.0 == node).filter(|_| live) else { return };
        self.meter(i, now);
        let job = &mut self.jobs[i];
        let part = job.leaving.remove(at);
        job.held -= part.gpus;
        self.drain += part.gpus as u128 * now.saturating_since(part.notice).0 as u128;
        self.state.part_left(Self::id(i), attempt, part.node).expect("a leaving part of a live attempt");
        let job = &mut self.jobs[i];
        let gpus = job.run.as_ref().expect("live").gpus - part.gpus;
        if job.drain.is_some() {
            // Stopped whole meanwhile: it ends with its drain.
            return;
        }
        if job.leaving.iter().any(|l| l.saves) {
            // Saving still for parts that go later: it restarts with them.
            job.run.as_mut().expect("live").gpus = gpus;
            return;
        }
        match part.saves {
            true => job.saved = job.progress(now),
            false => {
                let lost = job.gpus as u128 * (job.progress(now) - job.saved) as u128;
                self.lost += lost;
                job.lost += lost;
                self.owners[job.owner].lost += lost;
            }
        }
        if job.saved >= job.duration {
            // It had done its work: what stays finishes now.
            self.exit(i, now, true);
            return;
        }
        let overhead = self.config.restart_overhead.0;
        let (restart_gpus, ran) = {
            let run = job.run.as_ref().expect("live");
            (run.gpus, now.saturating_since(run.start).0)
        };
        self.restart += restart_gpus as u128 * job.run.as_ref().expect("live").overhead.min(ran) as u128;
        if part.saves {
            let attempt = job.attempt;
            self.state.checkpointed(Self::id(i), attempt, now).expect("live attempt");
        }
        self.stretch(i, now, overhead, gpus);
    }

    /// Job `i` grows by `gpus` GPUs: it saves (instantly, as a periodic
    /// checkpoint) and restarts on all of them.
    pub(super) fn grow(&mut self, i: usize, now: Time, gpus: u32) {
        self.meter(i, now);
        let job = &mut self.jobs[i];
        job.grows += 1;
        job.held += gpus;
        job.saved = job.progress(now);
        let run = job.run.as_ref().expect("a grown job runs");
        let (working, ran) = (run.gpus, now.saturating_since(run.start).0);
        self.restart += working as u128 * run.overhead.min(ran) as u128;
        let attempt = job.attempt;
        self.state.checkpointed(Self::id(i), attempt, now).expect("live attempt");
        if self.jobs[i].saved >= self.jobs[i].duration {
            self.exit(i, now, true);
            return;
        }
        self.stretch(i, now, self.config.restart_overhead.0, working + gpus);
    }
}
