//! Nodes as the operator and the heartbeat timeout change them: drain, reclaim, removal, loss.

use super::effects;
use super::ending::EndNote;
use super::table::JobTable;
use super::*;

use ebb_api::DRAINED_FOR_AGENT_STOP as AGENT_STOPPING;

impl Fleet {
    /// Marks `node` unhealthy (it takes no new work) while its agent says
    /// its reports keep failing, and healthy again once they get through.
    /// Not stored: after a restart the agent's next poll says it again.
    pub(super) fn set_health(
        &mut self,
        core: &mut State,
        lines: &Lines,
        node: &str,
        failing: Option<String>,
    ) {
        let Some(id) = core.node_by_name(node) else { return };
        let healthy = failing.is_none();
        let was = self.unhealthy.contains_key(node);
        match failing {
            Some(why) => {
                lines.unquiet(node);
                if !was {
                    tracing::warn!(
                        node,
                        why,
                        "node unhealthy: its reports keep failing; it takes no new work"
                    );
                }
                self.unhealthy.insert(node.to_string(), why);
            }
            None if was => {
                tracing::info!(node, "node healthy again: its reports get through");
                self.unhealthy.remove(node);
            }
            None => return,
        }
        let _ = core.set_healthy(id, healthy);
    }
}

impl<S: Store> Engine<S> {
    /// `ebb drain NODE`: [`drain_node`], answered with the node's view.
    pub(super) fn drain_node(&mut self, name: &str) -> Result<ebb_api::Node, Fail> {
        drain_node(&mut self.parts(), name)?;
        Ok(self.node_view(name))
    }

    /// [`node_gone`], its quiet polls answered by the writer again.
    pub(super) fn node_gone(&mut self, name: &str, requeued: &[JobId], why: &str) -> Written {
        self.lines.unquiet(name);
        node_gone(&mut self.parts(), name, requeued, why)
    }
}

/// The model a reclaim names, or the only one.
fn reclaim_model(core: &State, gpu_model: Option<&str>) -> Result<GpuModelId, Refusal> {
    if let Some(name) = gpu_model {
        return core
            .model_by_name(name)
            .ok_or_else(|| Refusal::unacceptable(format!("gpu_model: unknown model {name:?}")));
    }
    let models: Vec<GpuModelId> = core.models().map(|(id, _)| id).collect();
    match models.as_slice() {
        [only] => Ok(*only),
        [] => Err(Refusal::conflict("no nodes have joined".into())),
        _ => Err(Refusal::unacceptable("gpu_model: required when nodes have several models".into())),
    }
}

/// `ebb reclaim --gpus N`: preemptible work of the model may hold N
/// fewer GPUs than it does now; the limit is stored, so it holds
/// across a restart until released.
pub(super) fn reclaim(
    core: &mut State,
    fx: &mut impl Effects,
    req: ebb_api::ReclaimRequest,
) -> Result<ebb_api::ReclaimReply, Fail> {
    if req.gpus == 0 {
        return Err(Refusal::invalid("gpus: must be at least 1".into()).into());
    }
    let model = reclaim_model(core, req.gpu_model.as_deref())?;
    let limit = core.reclaim(model, req.gpus).map_err(|e| Refusal::unacceptable(e.to_string()))?;
    let name = core.model(model).expect("known model").name.clone();
    let limit = core.model(model).expect("known model").preemptible_limit.unwrap_or(limit);
    fx.put_reclaim(&name, Some(limit))?;
    tracing::info!(gpu_model = name, gpus = req.gpus, limit, "preemptible capacity reclaimed");
    Ok(ebb_api::ReclaimReply { gpu_model: name, preemptible_limit: limit })
}

/// `ebb reclaim --release`: preemptible work may use any idle GPU of
/// the model again.
pub(super) fn release_reclaim(
    core: &mut State,
    fx: &mut impl Effects,
    req: ebb_api::ReclaimRelease,
) -> Result<ebb_api::ReclaimReleased, Fail> {
    let model = reclaim_model(core, req.gpu_model.as_deref())?;
    let m = core.model(model).expect("known model");
    let (name, released_limit) = (m.name.clone(), m.preemptible_limit);
    core.release_reclaim(model).map_err(|e| Refusal::internal(e.to_string()))?;
    fx.put_reclaim(&name, None)?;
    tracing::info!(gpu_model = name, ?released_limit, "reclaim released");
    Ok(ebb_api::ReclaimReleased { gpu_model: name, released_limit })
}

/// `ebb nodes remove NAME`: the node's credential is revoked at once
/// and the node is taken out as a lost node is (its live attempts
/// requeued as lost, metered to its last contact). It may join again
/// with the join token, and gets a fresh credential then.
pub(super) fn remove_node(
    p: &mut Parts<impl Effects>,
    lines: &Lines,
    name: &str,
) -> Result<ebb_api::NodeRemoved, Fail> {
    let id =
        p.core.node_by_name(name).ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
    let why = format!(
        "node {name}'s credential was revoked by the operator (ebb nodes remove {name}); to rejoin, \
         delete the agent's node.credential and restart it with the join token"
    );
    let revoked =
        p.access.revoke(&mut p.fx, |p| p.scope == Scope::Node && p.node.as_deref() == Some(name), &why)?;
    let requeued: Vec<JobId> =
        p.core.lose_node(id).map_err(|e| Refusal::internal(e.to_string()))?.into_iter().collect();
    lines.unquiet(name);
    node_gone(p, name, &requeued, "removed by the operator")?;
    if let Some(row) = p.fleet.nodes.get(name) {
        let row = NodeRow { removed: true, ..row.clone() };
        p.fleet.write(row, &mut p.fx)?;
    }
    p.fx.forget_commands(name);
    tracing::warn!(node = name, ?requeued, "node removed by the operator; its credential is revoked");
    let requeued = requeued.iter().map(|j| j.0).collect();
    Ok(ebb_api::NodeRemoved { node: name.to_string(), requeued, credential_revoked: revoked > 0 })
}

/// The core released every hold on `node` (lost or drained): so do the
/// records.
pub(super) fn forget_holds_on(jobs: &mut JobTable, fx: &mut impl Effects, node: &str) -> Written {
    let holders: Vec<JobId> =
        jobs.values().filter(|j| j.held.iter().any(|p| p.node == node)).map(|j| j.id).collect();
    for id in holders {
        let job = jobs.get_mut(&id).expect("known job");
        job.held.clear();
        job.waiting_for.clear();
        effects::save(jobs, fx, id)?;
    }
    Ok(())
}

/// Node `name`, in the core as `id`, drains (its preemptible work gets its
/// notice, nothing new lands there): its holds go, its row says so
/// (`why`: for what, or the operator's drain), and the operator's
/// webhooks hear it said as `said`.
pub(super) fn drain(
    p: &mut Parts<'_, impl Effects>,
    (name, id): (&str, NodeId),
    why: Option<String>,
    said: &str,
) -> Result<(), Fail> {
    p.core.drain_node(id).map_err(|e| Refusal::conflict(e.to_string()))?;
    forget_holds_on(p.jobs, &mut p.fx, name)?;
    let row = NodeRow { drained: true, drained_for: why, ..p.fleet.nodes[name].clone() };
    p.fleet.write(row, &mut p.fx)?;
    Ok(p.fx.node_event(name, "node_drained", said)?)
}

/// `ebb drain NODE`.
pub(super) fn drain_node(p: &mut Parts<'_, impl Effects>, name: &str) -> Result<(), Fail> {
    let id =
        p.core.node_by_name(name).ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
    drain(p, (name, id), None, "drained by the operator")?;
    tracing::info!(node = name, "drained by the operator");
    Ok(())
}

/// The node's agent was told to stop (SIGTERM): the node drains as for
/// the operator, saying why, so preemptible work gets its notice and
/// window and nothing new lands there; the agent ends what still runs
/// `stop_timeout_ms` later. A node drained already keeps the drain it has
/// (its notices are out).
pub(super) fn agent_stopping(p: &mut Parts<'_, impl Effects>, name: &str, stop_timeout_ms: u64) -> Written {
    let Some(id) = p.core.node_by_name(name) else { return Ok(()) };
    if matches!(p.core.node(id).map(|n| n.status), Some(NodeStatus::Cordoned | NodeStatus::Lost)) {
        return Ok(());
    }
    let timeout = Span(stop_timeout_ms.min(ebb_core::time::LAST_WRITABLE_MS)).human();
    let why = format!("{AGENT_STOPPING}: what still runs after {timeout} is ended and requeued");
    let said = format!("drained: {why}");
    match drain(p, (name, id), Some(why), &said) {
        Ok(()) => {
            tracing::info!(node = name, "{said}");
            Ok(())
        }
        Err(Fail::Store(e)) => Err(e),
        Err(Fail::Refused(e)) => {
            tracing::error!(node = name, "not drained for its agent's stop: {}", e.message);
            Ok(())
        }
    }
}

/// Node `name`, drained, takes work again, saying why (`said`).
fn back(p: &mut Parts<'_, impl Effects>, name: &str, id: NodeId, said: &str) -> Result<(), Fail> {
    p.core.undrain_node(id).map_err(|e| Refusal::conflict(e.to_string()))?;
    let row = NodeRow { drained: false, drained_for: None, ..p.fleet.nodes[name].clone() };
    p.fleet.write(row, &mut p.fx)?;
    tracing::info!(node = name, "{said}");
    Ok(p.fx.node_event(name, "node_back", said)?)
}

/// A node drained because its agent stopped takes work again once the
/// agent registers anew; any other drain stays until `ebb undrain`.
pub(super) fn agent_started_again(p: &mut Parts<'_, impl Effects>, name: &str) -> Written {
    let Some(id) = p.core.node_by_name(name) else { return Ok(()) };
    let row = &p.fleet.nodes[name];
    let stopped = row.drained_for.as_deref().is_some_and(|why| why.starts_with(AGENT_STOPPING));
    if !stopped || p.core.node(id).map(|n| n.status) != Some(NodeStatus::Cordoned) {
        return Ok(());
    }
    match back(p, name, id, "back in service: its agent started again") {
        Ok(()) => Ok(()),
        Err(Fail::Store(e)) => Err(e),
        Err(Fail::Refused(e)) => {
            tracing::error!(node = name, "not back in service after its agent's restart: {}", e.message);
            Ok(())
        }
    }
}

/// `ebb undrain NODE`: a drained node takes work again.
pub(super) fn undrain_node(p: &mut Parts<'_, impl Effects>, name: &str) -> Result<(), Fail> {
    let id =
        p.core.node_by_name(name).ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
    let status = p.core.node(id).expect("known").status;
    if status != NodeStatus::Cordoned {
        let status = super::views::status_name(status);
        return Err(Refusal::conflict(format!("node {name}: not drained (it is {status})")).into());
    }
    back(p, name, id, "back in service (undrained by the operator)")
}

/// When `node` was last heard from: since this server started, as the
/// core has it; before, as the store had it.
pub(super) fn last_contact(fleet: &Fleet, core: &State, node: &str) -> Option<u64> {
    if fleet.heard_since_start.contains(node) {
        let id = core.node_by_name(node)?;
        return Some(core.node(id)?.last_heartbeat.0);
    }
    fleet.heard_before.get(node).copied()
}

/// Node `name` is gone (no heartbeat within the timeout, or removed by the
/// operator) and the core has requeued the jobs `requeued` had on it:
/// their records follow. The node's processes are taken to have run until
/// it was last heard from (before this server started, if not since), and
/// are metered to there.
pub(super) fn node_gone(
    p: &mut Parts<'_, impl Effects>,
    name: &str,
    requeued: &[JobId],
    why: &str,
) -> Written {
    tracing::warn!(node = name, "node lost: {why}");
    p.fx.node_event(name, "node_lost", why)?;
    forget_holds_on(p.jobs, &mut p.fx, name)?;
    p.fleet.interrupted(name, &mut p.fx)?;
    let heard = last_contact(p.fleet, p.core, name).unwrap_or(p.fx.now());
    for &id in requeued {
        let note = EndNote { node: Some(name.to_string()), why: Some(why.to_string()), ..Default::default() };
        exits::ended(p, id, (ExitEffect::RequeuedLost, heard), note)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_drained_over_the_parts_loses_its_holds_says_why_and_an_agents_restart_brings_back_only_its_own_drain(
    ) {
        let mut owned = effects::Owned::new(JobId(4), 0);
        let spec = NodeSpec { name: "a".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        owned.core.add_node(spec, Time(0)).unwrap();
        let row =
            serde_json::json!({"name": "a", "gpu_model": "H100", "gpus": 8, "labels": {}, "drained": false});
        owned.fleet.put(serde_json::from_value(row).unwrap());
        // Job 3 holds GPUs on a for a preemption.
        let mut holder = JobRecord::running_gang(JobId(3), Attempt(1), &["b"]);
        holder.state = JobState::Queued;
        holder.held = vec![Part::new("a", vec![0, 1])];
        holder.waiting_for = vec![JobId(9)];
        owned.jobs.insert(JobId(3), Box::new(holder));
        let mut p = owned.parts();

        // The agent stops: the node drains, saying so; the hold goes.
        agent_stopping(&mut p, "a", 600_000).unwrap();
        assert!(p.jobs[&JobId(3)].held.is_empty() && p.jobs[&JobId(3)].waiting_for.is_empty());
        let row = &p.fleet.nodes["a"];
        assert!(row.drained && row.drained_for.as_deref().unwrap().starts_with(AGENT_STOPPING), "{row:?}");
        assert!(matches!(&p.fx.node_events[..], [(n, "node_drained", t)] if n == "a" && t.contains("10m")));
        // Its agent is back: so is the node.
        agent_started_again(&mut p, "a").unwrap();
        assert!(!p.fleet.nodes["a"].drained);
        assert_eq!(p.fx.node_events.last().unwrap().1, "node_back");

        // The operator's drain is not lifted by an agent's restart; an
        // unknown node is refused by name.
        drain_node(&mut p, "a").unwrap();
        agent_started_again(&mut p, "a").unwrap();
        assert!(p.fleet.nodes["a"].drained && p.fleet.nodes["a"].drained_for.is_none());
        assert!(
            matches!(drain_node(&mut p, "zz"), Err(Fail::Refused(r)) if r.message == "node zz: not found")
        );
        undrain_node(&mut p, "a").unwrap();
        let refused = undrain_node(&mut p, "a").unwrap_err();
        assert!(matches!(&refused, Fail::Refused(r) if r.message.contains("not drained")), "{refused:?}");
        let said: Vec<&str> = p.fx.node_events.iter().map(|(_, name, _)| *name).collect();
        assert_eq!(said, ["node_drained", "node_back", "node_drained", "node_back"]);
    }

    #[test]
    fn a_reclaim_over_the_parts_names_its_model_and_is_written_until_released() {
        let mut owned = effects::Owned::new(JobId(1), 0);
        let mut add = |name: &str, model: &str| {
            let spec =
                NodeSpec { name: name.into(), gpu_model: model.into(), gpus: 8, labels: BTreeMap::new() };
            owned.core.add_node(spec, Time(0)).unwrap();
        };
        add("a", "H100");
        add("b", "A100");
        let Parts { core, fx, .. } = &mut owned.parts();
        let reclaim =
            |gpus, model: Option<&str>| ebb_api::ReclaimRequest { gpus, gpu_model: model.map(Into::into) };
        let refused = |r: Result<ebb_api::ReclaimReply, Fail>| match r {
            Err(Fail::Refused(r)) => r.message,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(reclaim_gpus(core, fx, reclaim(0, None))), "gpus: must be at least 1");
        assert_eq!(
            refused(reclaim_gpus(core, fx, reclaim(2, None))),
            "gpu_model: required when nodes have several models"
        );
        assert_eq!(
            refused(reclaim_gpus(core, fx, reclaim(2, Some("B200")))),
            "gpu_model: unknown model \"B200\""
        );
        // Two fewer than preemptible work holds now (none): none at all.
        let reply = reclaim_gpus(core, fx, reclaim(2, Some("H100"))).unwrap();
        assert_eq!((reply.gpu_model.as_str(), reply.preemptible_limit), ("H100", 0));
        let released =
            release_reclaim(core, fx, ebb_api::ReclaimRelease { gpu_model: Some("H100".into()) }).unwrap();
        assert_eq!(released.released_limit, Some(0));
        assert_eq!(fx.reclaims, [("H100".to_string(), Some(0)), ("H100".to_string(), None)]);
    }

    fn reclaim_gpus(
        core: &mut State,
        fx: &mut effects::Recorded,
        req: ebb_api::ReclaimRequest,
    ) -> Result<ebb_api::ReclaimReply, Fail> {
        reclaim(core, fx, req)
    }
}
