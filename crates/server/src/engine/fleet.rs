//! Nodes as the operator and the heartbeat timeout change them: drain, reclaim, removal, loss.

use super::ending::EndNote;
use super::*;

use ebb_api::DRAINED_FOR_AGENT_STOP as AGENT_STOPPING;

impl<S: Store> Engine<S> {
    /// The core released every hold on `node` (lost or drained): so does
    /// the record.
    pub(super) fn forget_holds_on(&mut self, node: &str) -> Written {
        let holders: Vec<JobId> =
            self.jobs.values().filter(|j| j.held.iter().any(|p| p.node == node)).map(|j| j.id).collect();
        for id in holders {
            let job = self.jobs.get_mut(&id).expect("known job");
            job.held.clear();
            job.waiting_for.clear();
            self.save(id)?;
        }
        Ok(())
    }

    pub(super) fn drain_node(&mut self, name: &str) -> Result<ebb_api::Node, Fail> {
        let id = self
            .core
            .node_by_name(name)
            .ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
        self.core.drain_node(id).map_err(|e| Refusal::conflict(e.to_string()))?;
        self.forget_holds_on(name)?;
        let row = NodeRow { drained: true, drained_for: None, ..self.fleet.nodes[name].clone() };
        self.fleet.write(row, &mut self.store, &mut self.outbox)?;
        tracing::info!(node = name, "drained by the operator");
        self.node_webhooks(name, "node_drained", "drained by the operator")?;
        Ok(self.node_view(name))
    }

    /// The node's agent was told to stop (SIGTERM): the node drains as
    /// for the operator, saying why, so preemptible work gets its notice
    /// and window and nothing new lands there; the agent ends what still
    /// runs `stop_timeout_ms` later. A node drained already keeps the
    /// drain it has (its notices are out).
    pub(super) fn agent_stopping(&mut self, name: &str, stop_timeout_ms: u64) -> Written {
        let Some(id) = self.core.node_by_name(name) else { return Ok(()) };
        if matches!(self.core.node(id).map(|n| n.status), Some(NodeStatus::Cordoned | NodeStatus::Lost)) {
            return Ok(());
        }
        if let Err(e) = self.core.drain_node(id) {
            tracing::error!(node = name, "not drained for its agent's stop: {e}");
            return Ok(());
        }
        self.forget_holds_on(name)?;
        let timeout = Span(stop_timeout_ms.min(ebb_core::time::LAST_WRITABLE_MS)).human();
        let why = format!("{AGENT_STOPPING}: what still runs after {timeout} is ended and requeued");
        let row = NodeRow { drained: true, drained_for: Some(why.clone()), ..self.fleet.nodes[name].clone() };
        self.fleet.write(row, &mut self.store, &mut self.outbox)?;
        tracing::info!(node = name, "drained: {why}");
        self.node_webhooks(name, "node_drained", &format!("drained: {why}"))
    }

    /// A node drained because its agent stopped takes work again once the
    /// agent registers anew; any other drain stays until `ebb undrain`.
    pub(super) fn agent_started_again(&mut self, name: &str) -> Written {
        let Some(id) = self.core.node_by_name(name) else { return Ok(()) };
        let row = &self.fleet.nodes[name];
        let stopped = row.drained_for.as_deref().is_some_and(|why| why.starts_with(AGENT_STOPPING));
        if !stopped || self.core.node(id).map(|n| n.status) != Some(NodeStatus::Cordoned) {
            return Ok(());
        }
        if let Err(e) = self.core.undrain_node(id) {
            tracing::error!(node = name, "not back in service after its agent's restart: {e}");
            return Ok(());
        }
        let row = NodeRow { drained: false, drained_for: None, ..row.clone() };
        self.fleet.write(row, &mut self.store, &mut self.outbox)?;
        tracing::info!(node = name, "back in service: its agent started again");
        self.node_webhooks(name, "node_back", "back in service: its agent started again")
    }

    /// `ebb undrain NODE`: a drained node takes work again.
    pub(super) fn undrain_node(&mut self, name: &str) -> Result<ebb_api::Node, Fail> {
        let id = self
            .core
            .node_by_name(name)
            .ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
        if self.core.node(id).expect("known").status != NodeStatus::Cordoned {
            let status = super::views::status_name(self.core.node(id).expect("known").status);
            return Err(Refusal::conflict(format!("node {name}: not drained (it is {status})")).into());
        }
        self.core.undrain_node(id).map_err(|e| Refusal::conflict(e.to_string()))?;
        let row = NodeRow { drained: false, drained_for: None, ..self.fleet.nodes[name].clone() };
        self.fleet.write(row, &mut self.store, &mut self.outbox)?;
        tracing::info!(node = name, "back in service (undrained by the operator)");
        self.node_webhooks(name, "node_back", "back in service (undrained by the operator)")?;
        Ok(self.node_view(name))
    }

    /// The model a reclaim names, or the only one.
    fn reclaim_model(&self, gpu_model: Option<&str>) -> Result<GpuModelId, Refusal> {
        if let Some(name) = gpu_model {
            return self
                .core
                .model_by_name(name)
                .ok_or_else(|| Refusal::unacceptable(format!("gpu_model: unknown model {name:?}")));
        }
        let models: Vec<GpuModelId> = self.core.models().map(|(id, _)| id).collect();
        match models.as_slice() {
            [only] => Ok(*only),
            [] => Err(Refusal::conflict("no nodes have joined".into())),
            _ => Err(Refusal::unacceptable("gpu_model: required when nodes have several models".into())),
        }
    }

    /// `ebb reclaim --gpus N`: preemptible work of the model may hold N
    /// fewer GPUs than it does now; the limit is stored, so it holds
    /// across a restart until released.
    pub(super) fn reclaim(&mut self, req: ebb_api::ReclaimRequest) -> Result<ebb_api::ReclaimReply, Fail> {
        if req.gpus == 0 {
            return Err(Refusal::invalid("gpus: must be at least 1".into()).into());
        }
        let model = self.reclaim_model(req.gpu_model.as_deref())?;
        let limit = self.core.reclaim(model, req.gpus).map_err(|e| Refusal::unacceptable(e.to_string()))?;
        let name = self.core.model(model).expect("known model").name.clone();
        let limit = self.core.model(model).expect("known model").preemptible_limit.unwrap_or(limit);
        self.store.put_reclaim(&name, Some(limit))?;
        tracing::info!(gpu_model = name, gpus = req.gpus, limit, "preemptible capacity reclaimed");
        Ok(ebb_api::ReclaimReply { gpu_model: name, preemptible_limit: limit })
    }

    /// `ebb reclaim --release`: preemptible work may use any idle GPU of
    /// the model again.
    pub(super) fn release_reclaim(
        &mut self,
        req: ebb_api::ReclaimRelease,
    ) -> Result<ebb_api::ReclaimReleased, Fail> {
        let model = self.reclaim_model(req.gpu_model.as_deref())?;
        let m = self.core.model(model).expect("known model");
        let (name, released_limit) = (m.name.clone(), m.preemptible_limit);
        self.core.release_reclaim(model).map_err(|e| Refusal::internal(e.to_string()))?;
        self.store.put_reclaim(&name, None)?;
        tracing::info!(gpu_model = name, ?released_limit, "reclaim released");
        Ok(ebb_api::ReclaimReleased { gpu_model: name, released_limit })
    }

    /// `ebb nodes remove NAME`: the node's credential is revoked at once
    /// and the node is taken out as a lost node is (its live attempts
    /// requeued as lost, metered to its last contact). It may join again
    /// with the join token, and gets a fresh credential then.
    pub(super) fn remove_node(&mut self, name: &str, now: u64) -> Result<ebb_api::NodeRemoved, Fail> {
        let id = self
            .core
            .node_by_name(name)
            .ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
        let why = format!(
            "node {name}'s credential was revoked by the operator (ebb nodes remove {name}); to rejoin, \
             delete the agent's node.credential and restart it with the join token"
        );
        let revoked = self.revoke(|p| p.scope == Scope::Node && p.node.as_deref() == Some(name), &why)?;
        let requeued: Vec<JobId> =
            self.core.lose_node(id).map_err(|e| Refusal::internal(e.to_string()))?.into_iter().collect();
        self.node_gone(name, &requeued, "removed by the operator", now)?;
        if let Some(row) = self.fleet.nodes.get(name) {
            let row = NodeRow { removed: true, ..row.clone() };
            self.fleet.write(row, &mut self.store, &mut self.outbox)?;
        }
        if let Some(channel) = self.outbox.channels.get_mut(name) {
            channel.commands.clear();
        }
        tracing::warn!(node = name, ?requeued, "node removed by the operator; its credential is revoked");
        let requeued = requeued.iter().map(|j| j.0).collect();
        Ok(ebb_api::NodeRemoved { node: name.to_string(), requeued, credential_revoked: revoked > 0 })
    }

    /// Node `name` is gone (no heartbeat within the timeout, or removed by
    /// the operator) and the core has requeued the jobs `requeued` had on
    /// it: their records follow. The node's processes are taken to have
    /// run until it was last heard from (before this server started, if
    /// not since), and are metered to there.
    pub(super) fn node_gone(&mut self, name: &str, requeued: &[JobId], why: &str, now: u64) -> Written {
        tracing::warn!(node = name, "node lost: {why}");
        self.node_webhooks(name, "node_lost", why)?;
        self.unquiet(name);
        self.forget_holds_on(name)?;
        self.fleet.interrupted(name, &mut self.store, &mut self.outbox)?;
        let heard = self.last_contact(name).unwrap_or(now);
        for &id in requeued {
            let note =
                EndNote { node: Some(name.to_string()), why: Some(why.to_string()), ..Default::default() };
            self.ended(id, ExitEffect::RequeuedLost, heard, note)?;
        }
        Ok(())
    }
}
