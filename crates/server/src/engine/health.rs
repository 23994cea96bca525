//! GPU health as a node's agent reports it: GPUs out of service, nodes
//! drained for their health, warnings shown; and the operator returning
//! them (`ebb undrain`).

use ebb_api::{GpuFinding, HealthClass};

use super::effects::Effects;
use super::ending::{EndNote, STOP_GRACE_MS};
use super::fleet::undrain_node;
use super::*;
use crate::store::GpuOut;

/// A GPU that faults twice within this stays out until an operator
/// returns it.
const FAULT_MEMORY_MS: u64 = 24 * 3600 * 1000;

/// Refuses, whole, a health report past its bounds: too many
/// findings, a check's output too long, stamped past what RFC 3339 can
/// write (400) or later than the server's clock plus the allowed skew
/// (`bound`, 422).
pub(super) fn check_health_event(
    field: &str,
    i: usize,
    findings: &[GpuFinding],
    at_ms: u64,
    bound: u64,
) -> Result<(), Refusal> {
    if findings.len() > ebb_api::MAX_HEALTH_FINDINGS {
        return Err(Refusal::invalid(format!(
            "{field}[{i}].findings: at most {} findings, got {}; nothing of this request was applied",
            ebb_api::MAX_HEALTH_FINDINGS,
            findings.len()
        )));
    }
    for (k, f) in findings.iter().enumerate() {
        if let ebb_api::Finding::CheckFailed { output, .. } = &f.finding {
            let chars = output.chars().count();
            if chars > ebb_api::MAX_CHECK_OUTPUT_CHARS {
                return Err(Refusal::invalid(format!(
                    "{field}[{i}].findings[{k}].output: at most {} characters, got {chars}; nothing of \
                     this request was applied",
                    ebb_api::MAX_CHECK_OUTPUT_CHARS
                )));
            }
        }
    }
    if at_ms > ebb_core::time::LAST_WRITABLE_MS {
        return Err(Refusal::invalid(format!(
            "{field}[{i}].at_ms: {at_ms} is past the year 9999 (at most {}); nothing of this request \
             was applied",
            ebb_core::time::LAST_WRITABLE_MS
        )));
    }
    if at_ms > bound {
        return Err(Refusal::unacceptable(format!(
            "{field}[{i}].at_ms: the health report is stamped {} ({at_ms}), later than the server's \
             clock plus the allowed skew ({bound}); nothing of this request was applied: check the \
             node's clock",
            rfc3339(at_ms)
        )));
    }
    Ok(())
}

/// Refuses, whole, findings that name a GPU the node does not have
/// (a 422: the document allows any GPU a node could have).
pub(super) fn check_health_gpus(
    field: &str,
    node: &str,
    gpus: u8,
    events: &[AgentEvent],
) -> Result<(), Refusal> {
    for (i, event) in events.iter().enumerate() {
        let AgentEvent::Health { findings, .. } = event else { continue };
        for (k, f) in findings.iter().enumerate() {
            if let Some(gpu) = f.gpu.filter(|g| *g >= gpus) {
                return Err(Refusal::unacceptable(format!(
                    "{field}[{i}].findings[{k}].gpu: node {node} has GPUs 0 to {}, got {gpu}; nothing of \
                     this request was applied",
                    gpus.saturating_sub(1)
                )));
            }
        }
    }
    Ok(())
}

/// What `node`'s agent finds wrong now, all of it. A new fatal finding
/// takes its GPU out of service and ends the attempt on it, requeued
/// as lost and metered to the fault; a new drain finding drains the
/// node with the ordinary window; warnings are kept to be shown. A GPU
/// out for one fault comes back once its finding clears (the agent
/// restarted after a reset, or a check passes again), unless it has
/// faulted twice within a day.
pub(super) fn health_reported(
    p: &mut Parts<impl Effects>,
    node: &str,
    findings: Vec<GpuFinding>,
    at_ms: u64,
) -> Written {
    let (Some(id), Some(row)) = (p.core.node_by_name(node), p.fleet.nodes.get(node)) else {
        return Ok(());
    };
    let mut findings = findings;
    findings.sort();
    findings.dedup();
    if row.health == findings {
        return Ok(());
    }
    let at_ms = at_ms.min(p.fx.now());
    let mut row = row.clone();
    let new: Vec<&GpuFinding> = findings.iter().filter(|f| !row.health.contains(f)).collect();
    for f in &new {
        let class = f.class();
        *p.fx.counters().health_findings.entry((class.name(), f.kind())).or_insert(0) += 1;
        match class {
            HealthClass::Warn => tracing::warn!(node, class = class.name(), "{}", f.describe()),
            _ => tracing::error!(node, class = class.name(), "{}", f.describe()),
        }
    }
    // New faults: each GPU out once, for its first finding.
    let mut out = 0u64;
    for f in new.iter().filter(|f| f.class() == HealthClass::Fatal) {
        let Some(gpu) = f.gpu else { continue };
        if row.out_mask() & (1 << gpu) != 0 {
            continue;
        }
        row.gpu_faults.retain(|(_, t)| t.saturating_add(FAULT_MEMORY_MS) > at_ms);
        row.gpu_faults.push((gpu, at_ms));
        let twice = row.gpu_faults.iter().filter(|(g, _)| *g == gpu).count() >= 2;
        row.gpus_out.push(GpuOut { gpu, reason: f.describe(), since_ms: at_ms, until_returned: twice });
        out |= 1 << gpu;
    }
    // Faults that cleared: their GPUs back, unless kept for the operator.
    let faulty: u64 = findings
        .iter()
        .filter(|f| f.class() == HealthClass::Fatal)
        .filter_map(|f| f.gpu)
        .fold(0, |mask, gpu| mask | (1 << gpu));
    let back: u64 = row
        .gpus_out
        .iter()
        .filter(|o| !o.until_returned && faulty & (1 << o.gpu) == 0)
        .fold(0, |mask, o| mask | (1 << o.gpu));
    row.gpus_out.retain(|o| back & (1 << o.gpu) == 0);
    let drain = new.iter().find(|f| f.class() == HealthClass::Drain).map(|f| f.describe());
    row.health = findings;
    p.fleet.write(row, &mut p.fx)?;
    if back != 0 {
        match p.core.return_gpus(id, back) {
            Ok(()) => {
                tracing::info!(node, gpus = ?gpu_indices(back), "GPUs back in service: their fault cleared")
            }
            Err(e) => tracing::error!(node, "GPUs not returned: {e}"),
        }
        let text = format!("GPUs {:?} back in service: their fault cleared", gpu_indices(back));
        p.fx.node_event(node, "node_back", &text)?;
    }
    if out != 0 {
        gpus_faulted(p, (node, id), out, at_ms)?;
    }
    if let Some(why) = drain {
        drain_for_health(p, (node, id), why)?;
    }
    Ok(())
}

/// `ebb undrain NODE [--gpu N]`: the operator returns one GPU, or the
/// node and every GPU of it out of service (`fleet::undrain_node`).
pub(super) fn undrain(p: &mut Parts<impl Effects>, name: &str, gpu: Option<u8>) -> Result<(), Fail> {
    let id =
        p.core.node_by_name(name).ok_or_else(|| Refusal::not_found(format!("node {name}: not found")))?;
    let row = p.fleet.nodes[name].clone();
    let status = p.core.node(id).expect("known").status;
    let mask = match gpu {
        Some(g) if g >= row.gpus => {
            return Err(Refusal::unacceptable(format!(
                "gpu: node {name} has GPUs 0 to {}, got {g}",
                row.gpus.saturating_sub(1)
            ))
            .into())
        }
        Some(g) if row.out_mask() & (1 << g) == 0 => {
            return Err(Refusal::conflict(format!("node {name}: GPU {g} is in service")).into())
        }
        Some(g) => 1u64 << g,
        None => row.out_mask(),
    };
    if mask == 0 && status != NodeStatus::Cordoned {
        let status = super::views::status_name(status);
        return Err(Refusal::conflict(format!(
            "node {name}: not drained and no GPU out of service (it is {status})"
        ))
        .into());
    }
    if mask != 0 {
        p.core.return_gpus(id, mask).map_err(|e| Refusal::internal(e.to_string()))?;
        let mut back = row.clone();
        back.gpus_out.retain(|o| mask & (1 << o.gpu) == 0);
        back.gpu_faults.retain(|(g, _)| mask & (1 << g) == 0);
        p.fleet.write(back, &mut p.fx)?;
        tracing::info!(node = name, gpus = ?gpu_indices(mask), "GPUs returned to service by the operator");
        let text = format!("GPUs {:?} returned to service by the operator", gpu_indices(mask));
        p.fx.node_event(name, "node_back", &text)?;
    }
    if gpu.is_none() && status == NodeStatus::Cordoned {
        undrain_node(p, name)?;
    }
    Ok(())
}

/// GPUs of `mask` on `node` faulted at `at_ms`: out of service in the core,
/// and the attempts on them ended as a lost node's are, each stopped on
/// every node it runs on.
fn gpus_faulted(
    p: &mut Parts<'_, impl Effects>,
    (node, id): (&str, NodeId),
    mask: u64,
    at_ms: u64,
) -> Written {
    let (requeued, holds_released) = match p.core.take_gpus_out(id, mask) {
        Ok(taken) => taken,
        Err(e) => {
            tracing::error!(node, "GPUs not taken out of service: {e}");
            return Ok(());
        }
    };
    if holds_released {
        fleet::forget_holds_on(p.jobs, &mut p.fx, node)?;
    }
    let out: Vec<GpuOut> =
        p.fleet.nodes[node].gpus_out.iter().filter(|o| mask & (1 << o.gpu) != 0).cloned().collect();
    for o in &out {
        p.fx.node_event(node, "gpu_out", &format!("GPU {} out of service: {}", o.gpu, o.reason))?;
    }
    if requeued.is_empty() {
        return Ok(());
    }
    // An interruption without notice: it counts toward the node's (and so
    // its model's) mean time between interruptions.
    p.fleet.interrupted(node, &mut p.fx)?;
    let why = out.iter().map(|o| o.reason.clone()).collect::<Vec<_>>().join("; ");
    let now = p.fx.now();
    for job in requeued {
        let record = &p.jobs[&job];
        let attempt = AttemptRef { job, attempt: record.attempt };
        for n in &record.running_on {
            p.fx.send(n, Action::Stop { attempt, grace_ms: STOP_GRACE_MS, notice: None });
        }
        let end_ms = reports::known_time(p.jobs, attempt, at_ms, now);
        let note = EndNote { node: Some(node.to_string()), why: Some(why.clone()), ..Default::default() };
        tracing::warn!(job = job.0, node, "attempt {} ended by a GPU fault: {why}", attempt.attempt);
        exits::ended(p, job, (ExitEffect::RequeuedLost, end_ms), note)?;
    }
    Ok(())
}

/// The node drains for its health: as the operator's drain, with why.
fn drain_for_health(p: &mut Parts<'_, impl Effects>, (node, id): (&str, NodeId), why: String) -> Written {
    if matches!(p.core.node(id).map(|n| n.status), Some(NodeStatus::Cordoned | NodeStatus::Lost)) {
        return Ok(());
    }
    let said = format!("drained for its health: {why}");
    match fleet::drain(p, (node, id), Some(why), &said) {
        Ok(()) => {
            tracing::error!(node, "{said}");
            Ok(())
        }
        Err(Fail::Store(e)) => Err(e),
        Err(Fail::Refused(e)) => {
            tracing::error!(node, "not {said}: {}", e.message);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fatal_finding_over_the_parts_takes_its_gpu_out_until_it_clears_and_counts_once() {
        let mut owned = effects::Owned::new(JobId(1), 5_000);
        let spec = NodeSpec { name: "a".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        let id = owned.core.add_node(spec, Time(0)).unwrap();
        let row =
            serde_json::json!({"name": "a", "gpu_model": "H100", "gpus": 8, "labels": {}, "drained": false});
        owned.fleet.put(serde_json::from_value(row).unwrap());
        let p = &mut owned.parts();
        let xid = GpuFinding { gpu: Some(3), finding: ebb_api::Finding::Xid { code: 79 } };

        health_reported(p, "a", vec![xid.clone()], 4_000).unwrap();
        let out = &p.fleet.nodes["a"].gpus_out;
        assert_eq!((out.len(), out[0].gpu, out[0].since_ms, out[0].until_returned), (1, 3, 4_000, false));
        assert_eq!(p.core.node(id).unwrap().out_mask(), 1 << 3);
        // Said again, it changes nothing and is not counted again.
        health_reported(p, "a", vec![xid.clone(), xid], 4_500).unwrap();
        assert_eq!(p.fx.counters.health_findings[&("fatal", "xid")], 1);
        assert_eq!(p.fx.nodes.len(), 1, "one row written");
        // Cleared (the agent restarted after a reset): back in service.
        health_reported(p, "a", Vec::new(), 6_000).unwrap();
        assert!(p.fleet.nodes["a"].gpus_out.is_empty());
        assert_eq!(p.core.node(id).unwrap().out_mask(), 0);
        let said: Vec<(&str, &str)> = p.fx.node_events.iter().map(|(_, n, t)| (*n, t.as_str())).collect();
        assert_eq!(said.last(), Some(&("node_back", "GPUs [3] back in service: their fault cleared")));
        // An undrain of a GPU in service is refused, naming it.
        let refused = undrain(p, "a", Some(3)).unwrap_err();
        assert!(
            matches!(&refused, Fail::Refused(r) if r.message == "node a: GPU 3 is in service"),
            "{refused:?}"
        );
    }
}
