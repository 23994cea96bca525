//! The agent protocol: registration, the command poll, reports of starts, checkpoints and output.

use super::effects::Effects;
use super::ending::{cancel_stop, STOP_GRACE_MS};
use super::table::JobTable;
use super::*;

impl<S: Store> Engine<S> {
    /// A node's agent (re)registers: the node joins or is heard from, what
    /// happened while the server could not be told is applied, and what
    /// the agent runs is reconciled with what the store says it runs.
    pub(super) fn register(
        &mut self,
        principal: &Principal,
        mut reg: Register,
        now: u64,
    ) -> Result<Registered, Fail> {
        check_registration(&reg)?;
        let issue_credential = self.access.may_register(principal, &reg.node)?;
        // Checked before anything of the registration is applied.
        check_event_times(self.config.max_clock_skew, "unreported", &reg.unreported, now)?;
        health::check_health_gpus("unreported", &reg.node, reg.gpus, &reg.unreported)?;
        // Attempts the agent comes back without ended after this, the last
        // time the node was heard from, and no later than now.
        let last_contact = fleet::last_contact(&self.fleet, &self.core, &reg.node).unwrap_or(now).min(now);
        join(&mut self.parts(), &reg)?;
        match reg.starts_when_free {
            true => self.fleet.starts_when_free.insert(reg.node.clone()),
            false => self.fleet.starts_when_free.remove(&reg.node),
        };
        // A fresh stream: whatever was queued for the old session is
        // re-derived below from what the store says.
        let channel = self.outbox.channels.entry(reg.node.clone()).or_insert_with(Channel::new);
        channel.commands.clear();
        // The agent follows from here: what is re-derived below reaches it.
        let next_seq = channel.next_seq - 1;
        // What happened while the server could not be told (it restarted):
        // starts, checkpoints and exits, accounted as they happened.
        let unreported = std::mem::take(&mut reg.unreported);
        self.apply_events(&reg.node, unreported, now)?;
        let kill = reconcile(&mut self.parts(), &reg.node, (&reg.running, &reg.waiting), last_contact)?;
        let credential = match issue_credential {
            true => {
                tracing::info!(node = reg.node, "node credential issued");
                let p = &mut self.parts();
                Some(p.access.grant(&mut p.fx, Principal::node(&reg.node))?)
            }
            false => None,
        };
        self.counters.registrations += 1;
        Ok(Registered {
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis(),
            kill,
            next_seq,
            epoch: self.epoch,
            credential,
            checkpoint_store: self.config.checkpoint_store.clone(),
        })
    }

    pub(super) fn poll(
        &mut self,
        node: &str,
        epoch: u64,
        after: u64,
        health: Option<Option<String>>,
        now: u64,
    ) -> Result<Poll, Fail> {
        self.counters.polls_writer += 1;
        self.access.credential_valid(node)?;
        let Some(id) = self.core.node_by_name(node) else {
            return Err(Refusal::conflict(format!("node {node}: not registered")).into());
        };
        if epoch != self.epoch {
            return Err(Refusal::conflict("the server restarted: register again".into()).into());
        }
        self.core.heartbeat(id, Time(now)).map_err(|e| Refusal::conflict(e.to_string()))?;
        let Parts { fleet, core, mut fx, .. } = self.parts();
        heard(fleet, core, &mut fx, node, now)?;
        if let Some(failing) = health {
            self.fleet.set_health(&mut self.core, &self.lines, node, failing);
        }
        self.line(node);
        let channel = self.outbox.channels.entry(node.to_string()).or_insert_with(Channel::new);
        while channel.commands.front().is_some_and(|c| c.seq <= after) {
            channel.commands.pop_front();
        }
        Ok(Poll {
            commands: channel.commands.iter().cloned().collect(),
            next_seq: channel.next_seq,
            changed: channel.notify.subscribe(),
        })
    }

    pub(super) fn report(&mut self, report: ebb_api::Report, now: u64) -> Result<ReportReply, Fail> {
        let node = report.node.clone();
        self.access.credential_valid(&node)?;
        check_event_times(self.config.max_clock_skew, "events", &report.events, now)?;
        let id = self
            .core
            .node_by_name(&node)
            .ok_or_else(|| Refusal::conflict(format!("node {node}: not registered")))?;
        let gpus = self.core.node(id).expect("known").gpus;
        health::check_health_gpus("events", &node, gpus, &report.events)?;
        let _ = self.core.heartbeat(id, Time(now));
        let Parts { fleet, core, mut fx, .. } = self.parts();
        heard(fleet, core, &mut fx, &node, now)?;
        // A report got through: whatever failed before does no longer.
        self.fleet.set_health(&mut self.core, &self.lines, &node, None);
        if let Some(report_id) = report.id {
            let last = self.fleet.reports.get(&node).copied();
            if last.is_some_and(|l| l.session == report_id.session && l.seq >= report_id.seq) {
                tracing::debug!(node, seq = report_id.seq, "report applied before: not again");
                return Ok(ReportReply { stale: Vec::new() });
            }
            self.store.put_last_report(&node, report_id)?;
            self.fleet.reports.insert(node.clone(), report_id);
        }
        let stale = self.apply_events(&node, report.events, now)?;
        Ok(ReportReply { stale: stale.into_iter().collect() })
    }

    /// What a node's agent reports, in order; returns the stale attempts
    /// it spoke of. An event delivered twice (once with a registration,
    /// once in a report) counts once.
    pub(super) fn apply_events(
        &mut self,
        node: &str,
        events: Vec<AgentEvent>,
        now: u64,
    ) -> Written<BTreeSet<AttemptRef>> {
        let mut stale = BTreeSet::new();
        for event in events {
            if let Some(attempt) = self.apply_event(node, event, now)? {
                stale.insert(attempt);
            }
        }
        Ok(stale)
    }

    /// One event of a node's; the attempt it spoke of if that is stale.
    fn apply_event(&mut self, node: &str, event: AgentEvent, now: u64) -> Written<Option<AttemptRef>> {
        // A start staged ahead, before its placement: placed by its start
        // (or the checkpoint restored just before it, sent once its
        // process runs), the event then the placement's; withdrawn if it
        // ended without one (it could not start: the placement's own start
        // will say why); what else it says before then (its image's pull)
        // is not kept.
        if let Some(attempt) = staged_attempt(&event).filter(|a| staged::staged_on(&self.jobs, *a, node)) {
            match &event {
                AgentEvent::Started { .. } | AgentEvent::Restored { .. } => {
                    if !self.place_staged(attempt.job, now)? {
                        return Ok(Some(attempt));
                    }
                }
                AgentEvent::Exited { .. } => {
                    let Parts { jobs, core, mut fx, .. } = self.parts();
                    staged::withdraw(jobs, core, &mut fx, attempt.job)?;
                    return Ok(None);
                }
                _ => return Ok(None),
            }
        }
        if let Some(attempt) = event_attempt(&event).filter(|a| !live_on(&self.jobs, *a, node)) {
            // An exit of one already accounted for (lost or fenced) is
            // no news; anything else tells the node to stop it.
            return Ok((!matches!(event, AgentEvent::Exited { .. })).then_some(attempt));
        }
        match event {
            AgentEvent::Health { findings, at_ms } => {
                health::health_reported(&mut self.parts(), node, findings, at_ms)?
            }
            AgentEvent::Stopping { stop_timeout_ms, .. } => {
                fleet::agent_stopping(&mut self.parts(), node, stop_timeout_ms)?
            }
            AgentEvent::Output { attempt, data } => {
                // Only the nodes the attempt was placed on write its log.
                let gang = self.jobs[&attempt.job].placement.len() > 1;
                self.append_output(attempt.job, &data, gang.then_some(node))?;
            }
            event => reports::attempt_event(&mut self.parts(), node, event)?,
        }
        Ok(None)
    }
}

/// What `node`'s agent runs against what the store says it runs: drains
/// and stops of attempts it still runs are sent again, attempts it came
/// back without end (as vanished, at its last contact), and the attempts
/// it runs that nobody holds are returned, to be killed. A start it holds
/// back until its GPUs are free (`waiting`) counts as running; a start
/// staged for it that it no longer has is sent again, or withdrawn if the
/// agent no longer holds starts back.
fn reconcile(
    p: &mut Parts<'_, impl Effects>,
    node: &str,
    (running, waiting): (&[AttemptRef], &[AttemptRef]),
    last_contact: u64,
) -> Written<Vec<AttemptRef>> {
    let now = p.fx.now();
    let mut running: BTreeSet<AttemptRef> = running.iter().copied().collect();
    running.extend(waiting.iter().copied());
    let staged: Vec<AttemptRef> = p
        .jobs
        .staged
        .iter()
        .map(|id| (*id, p.jobs[id].staged.as_ref().expect("in the set")))
        .filter(|(_, s)| s.node == node)
        .map(|(id, s)| AttemptRef { job: id, attempt: s.attempt })
        .collect();
    let capable = p.fleet.starts_when_free.contains(node);
    for attempt in &staged {
        let held = running.remove(attempt);
        match (held, capable) {
            (true, _) => {}
            (false, true) => {
                let launch = Launch { config: p.config, tenants: p.tenants, fleet: p.fleet };
                staged::send_staged(p.jobs, &launch, &mut p.fx, attempt.job);
            }
            (false, false) => staged::withdraw(p.jobs, p.core, &mut p.fx, attempt.job)?,
        }
    }
    // The node's attempts, from the core's index of them: every agent
    // registers again after a takeover, and a walk of every job for each
    // made 10,000 registrations take a minute with 100,000 jobs.
    let on_node: Vec<JobId> = match p.core.node_by_name(node) {
        Some(id) => p.core.node(id).expect("known").jobs().collect(),
        None => Vec::new(),
    };
    let held: BTreeSet<AttemptRef> = on_node
        .iter()
        .filter_map(|id| p.jobs.get(id))
        .filter(|j| j.state.is_live() && j.running_on.iter().any(|n| n == node))
        .map(|j| AttemptRef { job: j.id, attempt: j.attempt })
        .collect();
    let kill: Vec<AttemptRef> = running.difference(&held).copied().collect();
    if held.difference(&running).next().is_some() {
        // The agent came back without attempts it was running: an
        // interruption without notice.
        p.fleet.interrupted(node, &mut p.fx)?;
    }
    for attempt in held {
        if !running.contains(&attempt) {
            // The node does not run what we think it does: that part of
            // the attempt is gone.
            exits::part_exited(p, node, attempt, PartExit::vanished(None), last_contact)?;
            continue;
        }
        let job = &p.jobs[&attempt.job];
        let stop = match (job.cancel_requested, job.gang_stopped.is_some()) {
            (true, _) => Some(cancel_stop(job, attempt, now)),
            // A gang part stopped before the server restarted.
            (false, true) => Some(Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None }),
            (false, false) => None,
        };
        if let (JobState::Draining, Some(notice)) = (job.state, &job.drain) {
            let drain = DrainAttempt {
                attempt,
                notice_at_ms: notice.notice_at_ms,
                deadline_ms: notice.deadline_ms,
                reason: notice.reason.clone(),
            };
            p.fx.send(node, Action::Drain(drain));
        }
        if let Some(change) = shrink_in_progress(job, attempt, node) {
            p.fx.send(node, change);
        }
        if let Some(stop) = stop {
            p.fx.send(node, stop);
        }
    }
    if !kill.is_empty() {
        tracing::warn!(node, ?kill, "agent runs stale attempts; told to kill them");
    }
    Ok(kill)
}

/// What a node that registers again must be told of an elastic attempt's
/// shrink under way: its drain, where its part is leaving; where it stays,
/// the change of nodes (the latest shrink's).
fn shrink_in_progress(job: &JobRecord, attempt: AttemptRef, node: &str) -> Option<Action> {
    let leaving = &job.elastic.as_deref()?.leaving;
    if let Some(part) = leaving.iter().find(|l| l.node == node) {
        let n = &part.notice;
        let (notice_at_ms, deadline_ms, reason) = (n.notice_at_ms, n.deadline_ms, n.reason.clone());
        return Some(Action::Drain(DrainAttempt { attempt, notice_at_ms, deadline_ms, reason }));
    }
    let latest = leaving.iter().max_by_key(|l| l.notice.notice_at_ms)?;
    let gone = leaving.iter().filter(|l| l.notice.notice_at_ms == latest.notice.notice_at_ms);
    let change = Change::Shrink { leaving: gone.map(|l| l.node.clone()).collect(), notice: &latest.notice };
    Some(Action::Members(job.membership(attempt, change)))
}

/// How often an idle node's contact is written (it has nothing to meter).
pub(super) const IDLE_CONTACT_MS: u64 = 5 * 60 * 1000;

/// What the document states of a registration, refused with a 400 naming
/// the field: names that fit in a listing and a URL path, a GPU count a
/// node can have. Lengths are in characters, as the document's
/// `maxLength` counts them (a name of 64 characters may be 256 bytes).
fn check_registration(reg: &Register) -> Result<(), Refusal> {
    let plain = |text: &str, slash_too: bool| {
        !text.chars().any(|c| c.is_control() && c <= '\u{7f}' || (slash_too && c == '/'))
    };
    let chars = |text: &str| text.chars().count();
    if reg.node.is_empty() || chars(&reg.node) > 253 || !plain(&reg.node, true) {
        return Err(Refusal::invalid(format!(
            "node: a name of 1 to 253 characters without control characters or '/', got {:?}",
            reg.node
        )));
    }
    if reg.gpu_model.is_empty() || chars(&reg.gpu_model) > 64 || !plain(&reg.gpu_model, false) {
        return Err(Refusal::invalid(format!(
            "gpu_model: a name of 1 to 64 characters without control characters, got {:?}",
            reg.gpu_model
        )));
    }
    if !(1..=ebb_scheduler::MAX_GPUS_PER_NODE).contains(&reg.gpus) {
        return Err(Refusal::invalid(format!(
            "gpus: must be between 1 and {}, got {}",
            ebb_scheduler::MAX_GPUS_PER_NODE,
            reg.gpus
        )));
    }
    if let Some(cpus) = reg.cpus.filter(|c| !(1..=1 << 20).contains(c)) {
        return Err(Refusal::invalid(format!("cpus: must be between 1 and 1048576, got {cpus}")));
    }
    if let Some(mib) = reg.memory_mib.filter(|m| !(1..=1 << 40).contains(m)) {
        return Err(Refusal::invalid(format!("memory_mib: must be between 1 and 1099511627776, got {mib}")));
    }
    Ok(())
}

/// The attempt an event speaks of (a node's health and its stopping
/// speak of none).
fn event_attempt(event: &AgentEvent) -> Option<AttemptRef> {
    match event {
        AgentEvent::Started { attempt, .. }
        | AgentEvent::Exited { attempt, .. }
        | AgentEvent::Checkpoint { attempt, .. }
        | AgentEvent::Resumed { attempt, .. }
        | AgentEvent::Restored { attempt, .. }
        | AgentEvent::Progress { attempt, .. }
        | AgentEvent::Pulling { attempt, .. }
        | AgentEvent::Pulled { attempt, .. }
        | AgentEvent::Output { attempt, .. } => Some(*attempt),
        AgentEvent::Health { .. } | AgentEvent::Stopping { .. } => None,
    }
}

/// The attempt an event is of, where a staged start may send it: all but
/// what only a running job says (checkpoints, resumes, progress).
fn staged_attempt(event: &AgentEvent) -> Option<AttemptRef> {
    match event {
        AgentEvent::Checkpoint { .. } | AgentEvent::Resumed { .. } | AgentEvent::Progress { .. } => None,
        _ => event_attempt(event),
    }
}

/// The registering node into the core: heard from if it is there
/// already (with the GPUs it had), else added, keeping the history of
/// a node back after being lost.
pub(super) fn join(p: &mut Parts<impl Effects>, reg: &Register) -> Result<(), Fail> {
    let now = p.fx.now();
    if let Some(id) = p.core.node_by_name(&reg.node) {
        let n = p.core.node(id).expect("known");
        if n.status != NodeStatus::Lost {
            let model = &p.core.model(n.model).expect("known").name;
            if n.gpus != reg.gpus || *model != reg.gpu_model {
                return Err(Refusal::conflict(format!(
                    "node {}: joined before with {} x {model}, now reports {} x {}",
                    reg.node, n.gpus, reg.gpus, reg.gpu_model
                ))
                .into());
            }
            p.core.heartbeat(id, Time(now)).map_err(|e| Refusal::conflict(e.to_string()))?;
            heard(p.fleet, p.core, &mut p.fx, &reg.node, now)?;
            fleet::agent_started_again(p, &reg.node)?;
            let row = &p.fleet.nodes[&reg.node];
            let said = (reg.address.clone().or(row.address.clone()), reg.cpus, reg.memory_mib);
            if said != (row.address.clone(), row.cpus, row.memory_mib) {
                let (address, cpus, memory_mib) = said;
                let row = NodeRow { address, cpus, memory_mib, ..row.clone() };
                p.fleet.write(row, &mut p.fx)?;
            }
            return Ok(());
        }
    }
    let spec = NodeSpec {
        name: reg.node.clone(),
        gpu_model: reg.gpu_model.clone(),
        gpus: reg.gpus,
        labels: reg.labels.clone(),
    };
    // What the document states was checked first (400s); what is left
    // is the cluster's (a model's nodes all have one number of GPUs).
    p.core.add_node(spec, Time(now)).map_err(|e| Refusal::unacceptable(e.to_string()))?;
    let known = p.fleet.nodes.get(&reg.node);
    let row = NodeRow {
        name: reg.node.clone(),
        gpu_model: reg.gpu_model.clone(),
        gpus: reg.gpus,
        labels: reg.labels.clone(),
        drained: false,
        address: reg.address.clone(),
        cpus: reg.cpus,
        memory_mib: reg.memory_mib,
        joined_ms: known.map_or(now, |n| n.joined_ms),
        interruptions: known.map_or(0, |n| n.interruptions),
        removed: false,
        drained_for: None,
        // A node back after being lost keeps its GPUs' history; the
        // core kept which are out.
        gpus_out: known.map_or_else(Vec::new, |n| n.gpus_out.clone()),
        gpu_faults: known.map_or_else(Vec::new, |n| n.gpu_faults.clone()),
        health: known.map_or_else(Vec::new, |n| n.health.clone()),
    };
    p.fleet.write(row, &mut p.fx)?;
    p.money.price_for(&reg.gpu_model, &p.config.pricing, &mut p.fx)?;
    p.money.rate_models(p.core, &p.config.pricing);
    tenants::apply_quotas(p.core, p.admission);
    heard(p.fleet, p.core, &mut p.fx, &reg.node, now)?;
    tracing::info!(node = reg.node, gpus = reg.gpus, gpu_model = reg.gpu_model, "node joined");
    Ok(())
}

/// Refuses, whole, a progress report that is not a fraction, events
/// stamped past what RFC 3339 can write (the document's bound: a 400),
/// and events stamped later than the server's clock plus the allowed
/// skew (a 422: a node's clock that far ahead is wrong, and nothing it
/// says about time can be taken). `field` names where the events came
/// from in the request.
pub(super) fn check_event_times(
    max_clock_skew: Span,
    field: &str,
    events: &[AgentEvent],
    now: u64,
) -> Result<(), Refusal> {
    let bound = now.saturating_add(max_clock_skew.as_millis());
    for (i, event) in events.iter().enumerate() {
        if let AgentEvent::Progress { fraction, .. } = event {
            if !(0.0..=1.0).contains(fraction) {
                return Err(Refusal::invalid(format!(
                    "{field}[{i}].fraction: must be from 0 to 1, got {fraction}; nothing of this request was applied"
                )));
            }
        }
        if let AgentEvent::Exited { start_error: Some(error), .. } = event {
            if error.chars().count() > ebb_api::MAX_START_ERROR_CHARS {
                return Err(Refusal::invalid(format!(
                    "{field}[{i}].start_error: at most {} characters, got {}; nothing of this request was applied",
                    ebb_api::MAX_START_ERROR_CHARS,
                    error.chars().count()
                )));
            }
        }
        if let AgentEvent::Health { findings, at_ms } = event {
            health::check_health_event(field, i, findings, *at_ms, bound)?;
            continue;
        }
        if let AgentEvent::Stopping { at_ms, .. } = event {
            // When it stopped is the agent's to say; only the bound of
            // what can be written is checked (the timeout is clamped).
            if *at_ms > ebb_core::time::LAST_WRITABLE_MS {
                return Err(Refusal::invalid(format!(
                    "{field}[{i}].at_ms: {at_ms} is past the year 9999 (at most {}); nothing of this \
                     request was applied",
                    ebb_core::time::LAST_WRITABLE_MS
                )));
            }
            continue;
        }
        let (kind, attempt, at_ms) = match event {
            AgentEvent::Started { attempt, at_ms, .. } => ("started", attempt, *at_ms),
            AgentEvent::Exited { attempt, at_ms, .. } => ("exited", attempt, *at_ms),
            AgentEvent::Checkpoint { attempt, at_ms, .. } => ("checkpoint", attempt, *at_ms),
            AgentEvent::Resumed { attempt, at_ms, .. } => ("resumed", attempt, *at_ms),
            AgentEvent::Restored { attempt, at_ms, .. } => ("restored", attempt, *at_ms),
            AgentEvent::Progress { attempt, at_ms, .. } => ("progress", attempt, *at_ms),
            AgentEvent::Pulling { attempt, at_ms, .. } => ("pulling", attempt, *at_ms),
            AgentEvent::Pulled { attempt, at_ms, .. } => ("pulled", attempt, *at_ms),
            AgentEvent::Output { .. } | AgentEvent::Health { .. } | AgentEvent::Stopping { .. } => continue,
        };
        if at_ms > ebb_core::time::LAST_WRITABLE_MS {
            return Err(Refusal::invalid(format!(
                "{field}[{i}].at_ms: {at_ms} is past the year 9999 (at most {}); nothing of this \
                 request was applied",
                ebb_core::time::LAST_WRITABLE_MS
            )));
        }
        if at_ms > bound {
            return Err(Refusal::unacceptable(format!(
                "{field}[{i}].at_ms: the {kind} event of job {} attempt {} is stamped {} ({at_ms}), later \
                 than the server's clock plus the allowed skew of {} ({bound}); nothing of this request \
                 was applied: check the node's clock",
                attempt.job,
                attempt.attempt,
                rfc3339(at_ms),
                max_clock_skew.human(),
            )));
        }
    }
    Ok(())
}

/// Records contact with `node`, durably while it runs attempts, so
/// that a restarted server meters work on a node that never comes back
/// up to its last contact. A node that runs nothing has nothing to
/// meter: its contact is written at most every [`IDLE_CONTACT_MS`], so
/// an idle fleet's heartbeats are not each a write and a sync of the
/// database. A busy node's is written on the next tick, with every
/// other contact since: a poll that brings nothing else is then no
/// transaction of its own, and a server that dies meters up to a tick
/// less than ran, never more.
pub(super) fn heard(fleet: &mut Fleet, core: &State, fx: &mut impl Effects, node: &str, now: u64) -> Written {
    if !fleet.heard_since_start.contains(node) {
        fleet.heard_since_start.insert(node.to_string());
    }
    let every = IDLE_CONTACT_MS;
    let idle = core.node_by_name(node).and_then(|id| core.node(id)).is_none_or(|n| n.jobs().next().is_none());
    match fleet.heard_stored.get_mut(node) {
        Some(stored) if idle && now.saturating_sub(*stored) < every => return Ok(()),
        Some(stored) => *stored = now,
        None => {
            fleet.heard_stored.insert(node.to_string(), now);
        }
    }
    if idle {
        fleet.contact_due.remove(node);
        return fx.heard(node, now);
    }
    fleet.contact_due.insert(node.to_string(), now);
    Ok(())
}

/// On the tick: the busy nodes' contacts since the last.
pub(super) fn write_contacts(fleet: &mut Fleet, fx: &mut impl Effects) -> Written {
    let mut due: Vec<(String, u64)> = fleet.contact_due.drain().collect();
    due.sort_unstable();
    for (node, at) in due {
        fx.heard(&node, at)?;
    }
    Ok(())
}

/// Is `attempt` the job's live attempt on `node`?
pub(super) fn live_on(jobs: &JobTable, attempt: AttemptRef, node: &str) -> bool {
    jobs.get(&attempt.job).is_some_and(|j| {
        j.attempt == attempt.attempt && j.state.is_live() && j.running_on.iter().any(|n| n == node)
    })
}

#[cfg(test)]
mod tests {
    use ebb_api::Register;

    fn register(node: &str, gpu_model: &str) -> Register {
        Register {
            node: node.into(),
            gpu_model: gpu_model.into(),
            gpus: 8,
            labels: Default::default(),
            running: Vec::new(),
            address: None,
            unreported: Vec::new(),
            starts_when_free: false,
            waiting: Vec::new(),
            cpus: None,
            memory_mib: None,
        }
    }

    /// The document's limits are characters (JSON Schema's `maxLength`):
    /// a name at the limit in four-byte characters is taken, one past it
    /// is refused, and C1 controls (which the document's pattern allows)
    /// are taken.
    #[test]
    fn registration_names_are_measured_in_characters_as_the_document_says() {
        let ok = |node: &str, model: &str| super::check_registration(&register(node, model)).is_ok();
        assert!(ok(&"😍".repeat(253), &"😍".repeat(64)));
        assert!(ok("n\u{85}", "H100\u{9f}"));
        assert!(!ok(&"😍".repeat(254), "H100"));
        assert!(!ok("n", &"😍".repeat(65)));
        assert!(!ok("", "H100") && !ok("n", "") && !ok("a/b", "H100") && !ok("n", "H\u{7f}"));
        let e = super::check_registration(&register("n", &"x".repeat(65))).unwrap_err();
        assert!(format!("{e:?}").contains("gpu_model: a name of 1 to 64 characters"), "{e:?}");
    }

    #[test]
    fn a_node_joins_over_the_parts_priced_and_heard_and_may_not_come_back_another_size() {
        use super::super::*;
        let mut owned = effects::Owned::new(JobId(1), 9_000);
        let p = &mut owned.parts();
        super::join(p, &register("a", "H100")).unwrap();
        let id = p.core.node_by_name("a").expect("in the core");
        assert_eq!(p.core.node(id).unwrap().gpus, 8);
        assert_eq!(p.fx.nodes.last().map(|n| (n.name.as_str(), n.joined_ms)), Some(("a", 9_000)));
        assert_eq!(p.fx.prices.len(), 1, "a model first seen is priced at the default");
        assert_eq!(p.fx.heard, [("a".to_string(), 9_000)], "an idle node's contact is written");
        // Its agent back with another size is refused; with the same, heard.
        let other = Register { gpus: 4, ..register("a", "H100") };
        let refused = super::join(p, &other).unwrap_err();
        let said = "node a: joined before with 8 x H100, now reports 4 x H100";
        assert!(matches!(&refused, Fail::Refused(r) if r.message == said), "{refused:?}");
        super::join(p, &register("a", "H100")).unwrap();
        assert_eq!(p.fx.prices.len(), 1, "priced once");
    }
}
