//! Plan effects: what a scheduling pass decided, made into records, events
//! and commands. The details of a start are in `launch`.

use ebb_scheduler::{Drain, Grow, Placement, Plan, Preemption, Shrink};

use super::effects::{self, Effects};
use super::table::JobTable;
use super::*;

/// How a fair-share preemption's notice begins (a restarted server knows
/// one by it).
pub(super) const FAIR_SHARE_REASON: &str = "fair share:";
/// How a quota's reclaim notice begins.
pub(super) const QUOTA_REASON: &str = "quota:";

/// A drill's notice, as the job reads it: a drain like any other.
pub(super) const DRILL_REASON: &str = "drill: save and exit as for a preemption; the job is requeued at once";

/// The most jobs one batch starts (or preempts for). A backlog released
/// onto a fleet is placed a piece at a time, each piece committed and sent
/// to its nodes while the next is placed, and nothing that comes meanwhile
/// (an on-demand job, a node's report) waits behind the whole of it. A
/// placement costs the writer tens of microseconds: a piece, tens of
/// milliseconds.
pub const BATCH_STARTS: usize = 2048;

impl<S: Store> Engine<S> {
    /// Plans and applies until the core has nothing more to do, or this
    /// batch has started `BATCH_STARTS` jobs: then `unsettled` says the
    /// next batch goes on at once.
    pub(super) fn schedule(&mut self, now: u64) -> Written {
        self.end_backoffs(now)?;
        let Parts { jobs, config, mut fx, .. } = self.parts();
        exits::end_gang_graces(jobs, config.gang_exit_grace, &mut fx, now)?;
        exits::end_unstarted(&mut self.parts())?;
        let Parts { jobs, core, config, mut fx, .. } = self.parts();
        deadline::check_deadlines(jobs, core, config.drain_window, &mut fx, now)?;
        self.hear_silent(now)?;
        let mut starts = 0;
        self.unsettled = false;
        for _ in 0..1000 {
            if starts >= BATCH_STARTS {
                self.unsettled = true;
                return Ok(());
            }
            let started = std::time::Instant::now();
            self.sched.max_starts = Some(BATCH_STARTS - starts);
            let mut plan = ebb_scheduler::schedule(&self.core, Time(now), &self.sched);
            self.keep_pending(std::mem::take(&mut plan.pending));
            if plan.is_empty() {
                self.core.keep_earmarks(&plan);
                return Ok(());
            }
            starts += plan.placements.len() + plan.preemptions.len();
            if let Err(e) = self.core.apply(&plan) {
                tracing::error!("plan refused: {e}");
                return Ok(());
            }
            self.counters.passes += 1;
            self.counters.pass_seconds += started.elapsed().as_secs_f64();
            self.lost_nodes(&plan)?;
            for drain in &plan.drains {
                drained(&mut self.parts(), drain)?;
            }
            for shrink in &plan.shrinks {
                shrinking(&mut self.parts(), shrink)?;
            }
            for preemption in &plan.preemptions {
                preempting(&mut self.parts(), preemption)?;
            }
            for placement in &plan.placements {
                self.placed(placement, now)?;
            }
            for grow in &plan.grows {
                self.grown(grow, now)?;
            }
        }
        tracing::error!("the scheduler did not settle in 1000 passes");
        Ok(())
    }

    /// Nodes the pass found silent past the heartbeat timeout, with the
    /// jobs it requeued from each.
    fn lost_nodes(&mut self, plan: &Plan) -> Written {
        for &node in &plan.lost_nodes {
            let name = self.core.node(node).expect("known").name.clone();
            let requeued: Vec<JobId> = plan
                .requeues
                .iter()
                .filter(|r| matches!(r.reason, ebb_scheduler::RequeueReason::NodeLost(n) if n == node))
                .map(|r| r.job)
                .collect();
            self.node_gone(&name, &requeued, "no heartbeat within the timeout")?;
        }
        Ok(())
    }

    /// A new attempt (`p`): what it carries is settled here (its nodes by
    /// name, its rate, its checkpoint interval, a gang's rendezvous, a
    /// start staged ahead, which is that start), then [`begin_attempt`].
    pub(super) fn placed(&mut self, p: &Placement, now: u64) -> Written {
        let id = p.job;
        let placement = self.named(&p.alloc);
        let staged = match &self.jobs[&id].staged {
            Some(s) if s.attempt == p.attempt && p.from_hold => {
                self.jobs.staged.remove(&id);
                self.jobs.get_mut(&id).expect("known job").staged.take()
            }
            Some(_) => {
                let Parts { jobs, core, mut fx, .. } = self.parts();
                staged::withdraw(jobs, core, &mut fx, id)?;
                None
            }
            None => None,
        };
        let interval = match &staged {
            Some(s) => s.interval.clone(),
            None => {
                let recommendation = self.launch().recommend(&self.jobs[&id], &placement, now);
                (recommendation.interval.as_secs(), self.why.of(&recommendation))
            }
        };
        // An elastic job may grow onto more nodes: it meets from its start.
        // A Slurm job's first node keeps its step directory on the port,
        // one node or many: `srun --jobid` reaches its steps there.
        let spec = &self.jobs[&id].spec;
        let gang = placement.len() > 1 || spec.max_gpus.is_some() || spec.slurm.is_some();
        let from = if spec.slurm.is_some() { SLURM_STEP_PORTS } else { TORCH_PORTS };
        let rendezvous = gang.then(|| self.launch().rendezvous(&self.jobs, &placement[0].node, from));
        let billing = self.rates(self.jobs[&id].tier, &placement[0].node)?;
        let new = NewAttempt {
            attempt: p.attempt,
            from_hold: p.from_hold,
            placement,
            billing,
            interval,
            rendezvous,
            sent_ahead: staged.is_some(),
        };
        begin_attempt(&mut self.parts(), id, new)
    }
}

/// Where a gang's rendezvous ports begin: torch's own default port.
const TORCH_PORTS: u16 = 29500;

/// Where a Slurm job's step directory ports begin: above Linux's ephemeral
/// range (32768-60999) and away from the ports scripts set for torch
/// themselves (`export MASTER_PORT=29500` on the first node, where the
/// directory listens too).
const SLURM_STEP_PORTS: u16 = 61000;

/// A preemptor holds its victims' GPUs until they have drained; its start
/// goes to their node now where it can (`staged`).
fn preempting(p: &mut Parts<'_, impl Effects>, pre: &Preemption) -> Written {
    let held = recovery::named(p.core, &pre.hold);
    let parts: Vec<(JobId, String)> =
        pre.parts.iter().map(|&(job, node)| (job, p.core.node(node).expect("known").name.clone())).collect();
    let job = p.jobs.get_mut(&pre.preemptor).expect("known job");
    job.held = held;
    job.waiting_for = pre.victims.clone();
    job.waiting_parts = parts;
    staged::stage(p, pre.preemptor);
    effects::save(p.jobs, &mut p.fx, pre.preemptor)?;
    let lost = pre.lost_gpu_ms as f64 / 1000.0;
    let victims = pre.victims.iter().map(|v| v.0).collect();
    let shrinking = p.jobs[&pre.preemptor]
        .waiting_parts
        .iter()
        .map(|(job, node)| PartOf { job: job.0, node: node.clone() })
        .collect();
    let detail = PreemptingDetail { victims, shrinking, lost_gpu_seconds: lost };
    p.fx.event(&p.jobs[&pre.preemptor], Event::Preempting(detail))
}

/// What a new attempt carries, settled where it is placed.
pub(super) struct NewAttempt {
    pub attempt: Attempt,
    /// Placed on the GPUs its job held for it (a preemptor's).
    pub from_hold: bool,
    pub placement: Vec<Part>,
    /// (model, the tier's rate, on-demand's), per GPU-hour.
    pub billing: (String, i64, i64),
    /// The checkpoint interval, seconds, and why.
    pub interval: (u64, String),
    /// A gang's rendezvous: its first node's address and a port.
    pub rendezvous: Option<(String, u16)>,
    /// Its start was staged ahead on its node: not sent again.
    pub sent_ahead: bool,
}

/// Job `id`'s new attempt begins: its record reset for it, a start sent
/// to each of its nodes (unless it went ahead), and the timeline has it.
pub(super) fn begin_attempt(p: &mut Parts<'_, impl Effects>, id: JobId, new: NewAttempt) -> Written {
    let NewAttempt { attempt, from_hold, placement, billing, interval, rendezvous, sent_ahead } = new;
    let now = p.fx.now();
    let job = p.jobs.get_mut(&id).expect("known job");
    job.billing = Some(billing);
    job.interval = Some(interval.clone());
    job.step_key = (job.spec.slurm.is_some() && rendezvous.is_some()).then(crate::new_token);
    job.rendezvous = rendezvous;
    job.run_started_ms = None;
    job.started_on.clear();
    job.attempt_checkpoint_ms = None;
    job.exited_ms = 0;
    job.state = JobState::Starting;
    job.attempt = attempt;
    job.running_on = placement.iter().map(|p| p.node.clone()).collect();
    job.started_ms = now;
    job.drain = None;
    job.held.clear();
    job.waiting_for.clear();
    job.waiting_parts.clear();
    job.elastic = None;
    job.exit_code = None;
    job.exit_signal = None;
    if let Some(drill) = job.drill.as_mut() {
        drill.placed(attempt, &placement[0].node);
    }
    let shown = placement.iter().map(Part::view).collect();
    job.placement = placement;
    if !sent_ahead {
        let launch = Launch { config: p.config, tenants: p.tenants, fleet: p.fleet };
        for (node, start) in launch.starts(&p.jobs[&id]) {
            p.fx.send(&node, Action::Start(start));
        }
    }
    let (seconds, why) = interval;
    let interval = CheckpointInterval { seconds, why };
    let detail = PlacedDetail { placement: shown, from_hold, checkpoint_interval: Some(interval) };
    p.fx.event(&p.jobs[&id], Event::Placed(detail))?;
    effects::save(p.jobs, &mut p.fx, id)
}

/// What drained the attempt `d` drains, in words and as the record
/// keeps it (the node by name, the waiting tenant).
pub(super) fn drain_words(p: &Parts<'_, impl Effects>, d: &Drain) -> (String, Drained) {
    let name_of = |tenant: TenantId| p.tenants.names.get(&tenant).cloned().unwrap_or_default();
    match d.reason {
        DrainReason::Preempted { by } => (format!("preempted by job {}", by.0), Drained::Preempted { by }),
        DrainReason::NodeDrain { node } => {
            let name = p.core.node(node).expect("known").name.clone();
            let why = match &p.fleet.nodes[&name].drained_for {
                Some(stop) if stop.starts_with(ebb_api::DRAINED_FOR_AGENT_STOP) => {
                    format!("node {name} drained: {stop}")
                }
                Some(health) => format!("node {name} drained for its health: {health}"),
                None => format!("node {name} drained by the operator"),
            };
            (why, Drained::Node { node: name })
        }
        DrainReason::Reclaim => ("preemptible capacity reclaimed by the operator".into(), Drained::Reclaim),
        DrainReason::Drill => (DRILL_REASON.into(), Drained::Drill),
        DrainReason::Quota { tenant } => {
            let job = &p.jobs[&d.job];
            let why = format!(
                "{QUOTA_REASON} {} borrows past its quota of the {} tier; {} is under its own and waits",
                name_of(job.tenant),
                job.tier,
                name_of(tenant)
            );
            (why, Drained::Quota { waiting: tenant })
        }
        DrainReason::FairShare { tenant } => {
            let job = &p.jobs[&d.job];
            let victim = name_of(job.tenant);
            let share = p.core.share(job.tier, job.tenant, Time(d.notice_at.0));
            let why = format!(
                "{FAIR_SHARE_REASON} {victim} is furthest above its share of the {} tier ({:.0}% of its usage \
                 against a weight of {:.0}%); {} waits",
                job.tier,
                share.share * 100.0,
                share.weight_share * 100.0,
                name_of(tenant)
            );
            (why, Drained::FairShare { waiting: tenant })
        }
    }
}

/// What drained an attempt, for programs: the preemptor or the node.
fn drain_cause(cause: &Drained) -> DrainCause {
    match cause {
        Drained::Preempted { by } => DrainCause { by: Some(by.0), node: None },
        Drained::Node { node } => DrainCause { by: None, node: Some(node.clone()) },
        _ => DrainCause::default(),
    }
}

/// Some nodes of an elastic job told to leave: each is sent the drain
/// notice its part acts on, the record keeps it, and the timeline has it;
/// the attempt goes on on its other nodes.
pub(super) fn shrinking(p: &mut Parts<'_, impl Effects>, s: &Shrink) -> Written {
    let as_drain = Drain {
        job: s.job,
        attempt: s.attempt,
        notice_at: s.notice_at,
        deadline: s.deadline,
        reason: s.reason,
    };
    let (reason, cause) = drain_words(p, &as_drain);
    let nodes: Vec<String> = s.nodes.iter().map(|&n| p.core.node(n).expect("known").name.clone()).collect();
    let detail = drain_cause(&cause);
    let notice =
        DrainNotice { notice_at_ms: s.notice_at.0, deadline_ms: s.deadline.0, cause, reason: reason.clone() };
    let job = p.jobs.get_mut(&s.job).expect("known job");
    let elastic = job.elastic.get_or_insert_with(Default::default);
    for node in &nodes {
        elastic.leaving.push(LeavingPart { node: node.clone(), notice: notice.clone() });
    }
    elastic.resized_ms = Some(s.notice_at.0);
    let drain = DrainAttempt {
        attempt: AttemptRef { job: s.job, attempt: s.attempt },
        notice_at_ms: s.notice_at.0,
        deadline_ms: s.deadline.0,
        reason: reason.clone(),
    };
    for node in &nodes {
        p.fx.send(node, Action::Drain(drain.clone()));
    }
    // The nodes that stay hear of it as the leaving ones do, so that the
    // job saves once for all before the deadline.
    let job = &p.jobs[&s.job];
    let members = job.membership(drain.attempt, Change::Shrink { leaving: nodes.clone(), notice: &notice });
    for node in &members.nodes {
        p.fx.send(node, Action::Members(members.clone()));
    }
    let detail = ShrinkingDetail {
        nodes,
        reason,
        notice_at: rfc3339(s.notice_at.0),
        deadline: rfc3339(s.deadline.0),
        detail,
    };
    p.fx.event(&p.jobs[&s.job], Event::Shrinking(detail))?;
    effects::save(p.jobs, &mut p.fx, s.job)
}

impl<S: Store> Engine<S> {
    /// An elastic job grows onto whole free nodes: the same attempt, a
    /// start sent to each new node (joining the attempt's rendezvous).
    pub(super) fn grown(&mut self, g: &Grow, now: u64) -> Written {
        let added = self.named(&g.alloc);
        let id = g.job;
        let job = self.jobs.get_mut(&id).expect("known job");
        let elastic = job.elastic.get_or_insert_with(Default::default);
        for part in &added {
            elastic.joined.push((part.node.clone(), now));
        }
        elastic.resized_ms = Some(now);
        let nodes: Vec<String> = added.iter().map(|part| part.node.clone()).collect();
        job.placement.extend(added);
        job.running_on.extend(nodes.iter().cloned());
        let now_gpus = job.placement.iter().map(|part| part.gpus.len() as u32).sum();
        let Parts { jobs, config, tenants, fleet, mut fx, .. } = self.parts();
        let launch = Launch { config, tenants, fleet };
        for (node, start) in launch.starts(&jobs[&id]) {
            if nodes.contains(&node) {
                fx.send(&node, Action::Start(start));
            }
        }
        // The nodes it ran on hear that their ranks re-form.
        let attempt = AttemptRef { job: id, attempt: g.attempt };
        let members = jobs[&id].membership(attempt, Change::Grow { joining: nodes.clone(), at_ms: now });
        for node in members.nodes.iter().filter(|n| !nodes.contains(n)) {
            fx.send(node, Action::Members(members.clone()));
        }
        fx.event(&jobs[&id], Event::Grown(GrownDetail { nodes, now_gpus }))?;
        effects::save(jobs, &mut fx, id)
    }
}

/// A drain notice (`give_notice`), said as [`drain_words`] say it.
pub(super) fn drained(p: &mut Parts<'_, impl Effects>, d: &Drain) -> Written {
    let said = drain_words(p, d);
    give_notice(p.jobs, &mut p.fx, d, said)
}

/// Gives the live attempt `d` drains its notice, said as `(reason,
/// cause)`: the record says draining until the deadline, every node of
/// the attempt is told, and the timeline has it.
pub(super) fn give_notice(
    jobs: &mut JobTable,
    fx: &mut impl Effects,
    d: &Drain,
    (reason, cause): (String, Drained),
) -> Written {
    let id = d.job;
    let detail = drain_cause(&cause);
    let job = jobs.get_mut(&id).expect("known job");
    job.state = JobState::Draining;
    job.drain = Some(Box::new(DrainNotice {
        notice_at_ms: d.notice_at.0,
        deadline_ms: d.deadline.0,
        cause,
        reason: reason.clone(),
    }));
    let attempt = AttemptRef { job: id, attempt: d.attempt };
    let drain = DrainAttempt {
        attempt,
        notice_at_ms: d.notice_at.0,
        deadline_ms: d.deadline.0,
        reason: reason.clone(),
    };
    for node in &job.running_on {
        fx.send(node, Action::Drain(drain.clone()));
    }
    jobs.note_unstarted(id);
    let detail = DrainNoticeDetail {
        reason,
        notice_at: rfc3339(d.notice_at.0),
        deadline: rfc3339(d.deadline.0),
        detail,
    };
    fx.event(&jobs[&id], Event::DrainNotice(detail))?;
    effects::save(jobs, fx, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_drains_the_record_tells_every_node_of_the_attempt_and_is_in_the_timeline_once() {
        let gang = JobRecord::running_gang(JobId(5), Attempt(3), &["a", "b"]);
        let mut jobs = JobTable::new(JobId(6));
        jobs.insert(JobId(5), Box::new(gang));
        let mut fx = effects::Recorded { now: 60_000, ..Default::default() };
        let d = Drain {
            job: JobId(5),
            attempt: Attempt(3),
            notice_at: Time(60_000),
            deadline: Time(360_000),
            reason: DrainReason::Preempted { by: JobId(9) },
        };
        let said = ("preempted by job 9".to_string(), Drained::Preempted { by: JobId(9) });
        give_notice(&mut jobs, &mut fx, &d, said).unwrap();
        let told: Vec<&str> = fx
            .sent
            .iter()
            .filter(|(_, a)| {
                matches!(a, Action::Drain(n) if n.attempt == AttemptRef { job: JobId(5), attempt: Attempt(3) }
                    && n.deadline_ms == 360_000)
            })
            .map(|(node, _)| node.as_str())
            .collect();
        assert_eq!(told, ["a", "b"]);
        assert!(
            matches!(&fx.events[..], [(JobId(5), Event::DrainNotice(n))] if n.detail.by == Some(9)),
            "{:?}",
            fx.events
        );
        let saved = &fx.saved[..];
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0].state, JobState::Draining);
        let notice = saved[0].drain.as_deref().unwrap();
        assert_eq!((notice.deadline_ms, &notice.cause), (360_000, &Drained::Preempted { by: JobId(9) }));
        // Started: no end at the deadline by the server's own hand.
        assert_eq!(jobs.unstarted.pop_due(u64::MAX), None);
    }

    #[test]
    fn a_gangs_new_attempt_sends_each_node_its_rank_and_one_staged_ahead_is_not_sent_again() {
        // Job 5's attempt 2 ended; attempt 3 goes to nodes a and b.
        let mut queued = JobRecord::running_gang(JobId(5), Attempt(2), &["x"]);
        queued.state = JobState::Queued;
        queued.running_on.clear();
        let mut owned = effects::Owned::new(JobId(6), 90_000);
        owned.jobs.insert(JobId(5), Box::new(queued));
        owned.tenants.names.insert(TenantId(1), "alpha".into());
        let mut p = owned.parts();
        let new = |sent_ahead| NewAttempt {
            attempt: Attempt(3),
            from_hold: false,
            placement: vec![Part::new("a", vec![0, 1]), Part::new("b", vec![2, 3])],
            billing: ("H100".into(), 1_000_000, 2_000_000),
            interval: (600, "why".into()),
            rendezvous: Some(("10.0.0.1".into(), 29501)),
            sent_ahead,
        };
        begin_attempt(&mut p, JobId(5), new(false)).unwrap();

        let starts: Vec<(&str, &StartAttempt)> =
            p.fx.sent
                .iter()
                .filter_map(|(node, a)| match a {
                    Action::Start(s) => Some((node.as_str(), s)),
                    _ => None,
                })
                .collect();
        assert_eq!(starts.len(), 2);
        for (rank, (node, start)) in starts.iter().enumerate() {
            assert_eq!(*node, ["a", "b"][rank]);
            assert_eq!(start.attempt, AttemptRef { job: JobId(5), attempt: Attempt(3) });
            assert_eq!((start.tenant.as_str(), start.gpus.len()), ("alpha", 2));
            assert_eq!(start.env["NODE_RANK"], rank.to_string());
            assert_eq!(
                (start.env["MASTER_ADDR"].as_str(), start.env["MASTER_PORT"].as_str()),
                ("10.0.0.1", "29501")
            );
            assert_eq!(start.env["EBB_CHECKPOINT_INTERVAL_S"], "600");
            assert_eq!(start.rendezvous_port, (rank == 0).then_some(29501), "the first node checks the port");
        }
        let job = &p.jobs[&JobId(5)];
        assert_eq!((job.state, job.attempt, job.started_ms), (JobState::Starting, Attempt(3), 90_000));
        assert_eq!(job.running_on, ["a", "b"]);
        assert!(matches!(&p.fx.events[..], [(JobId(5), Event::Placed(d))] if d.placement.len() == 2));
        assert_eq!(p.fx.saved.len(), 1);

        // A start staged ahead on its node is that start: nothing is sent.
        p.fx.sent.clear();
        begin_attempt(&mut p, JobId(5), new(true)).unwrap();
        assert!(p.fx.sent.is_empty(), "{:?}", p.fx.sent);
    }
}
