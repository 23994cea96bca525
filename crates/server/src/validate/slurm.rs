//! A Slurm batch job's options and a heterogeneous job's components,
//! checked as the API document states them.

use ebb_api::JobSubmission;

use super::{bad, refuse};
use crate::Refusal;

/// A heterogeneous job's components: two to sixteen, each its nodes and
/// GPUs a node in bounds, all of one size a node, adding up to the job's
/// nodes and GPUs; not an array, not elastic.
pub(super) fn components(
    spec: &JobSubmission,
    slurm: &ebb_api::SlurmBatch,
    gpus: u32,
    tasks: bool,
) -> Result<(), Refusal> {
    let parts = &slurm.components;
    if parts.is_empty() {
        return Ok(());
    }
    if parts.len() < 2 || parts.len() > 16 {
        return bad(format!("slurm.components: a heterogeneous job has 2 to 16, got {}", parts.len()));
    }
    for (k, part) in parts.iter().enumerate() {
        let counts = [
            ("nodes", Some(part.nodes), 4096),
            ("gpus_per_node", Some(part.gpus_per_node), 64),
            ("ntasks", part.ntasks, 65536),
            ("ntasks_per_node", part.ntasks_per_node, 65536),
            ("cpus_per_task", part.cpus_per_task, 65536),
        ];
        for (field, value, max) in counts {
            if let Some(n) = value.filter(|n| *n == 0 || *n > max) {
                return bad(format!("slurm.components[{k}].{field}: must be between 1 and {max}, got {n}"));
            }
        }
    }
    let per_node = parts[0].gpus_per_node;
    if let Some((k, part)) = parts.iter().enumerate().find(|(_, p)| p.gpus_per_node != per_node) {
        return refuse(format!(
            "slurm.components[{k}]: {} GPUs a node where component 0 has {per_node}: a heterogeneous job is one \
             gang on whole nodes of one size",
            part.gpus_per_node
        ));
    }
    let nodes: u32 = parts.iter().map(|p| p.nodes).sum();
    if slurm.nodes.is_some_and(|n| n != nodes) {
        return bad(format!("slurm.nodes: the components' nodes add up to {nodes}, not {:?}", slurm.nodes));
    }
    if u64::from(nodes) * u64::from(per_node) != u64::from(gpus) {
        return bad(format!("gpus: the components' GPUs add up to {nodes} nodes of {per_node}, not {gpus}"));
    }
    if tasks || spec.max_gpus.is_some() {
        return refuse("slurm.components: a heterogeneous job is neither an array nor elastic".into());
    }
    Ok(())
}

/// A Slurm batch job's script and options, as the document states them.
pub(super) fn slurm_batch(slurm: &ebb_api::SlurmBatch) -> Result<(), Refusal> {
    let bad = |m: String| Err(Refusal::invalid(m));
    // The document cannot require it: a job's view leaves the script out.
    if slurm.script.is_empty() {
        return Err(Refusal::unacceptable("slurm.script: a Slurm job's submission needs its script".into()));
    }
    if !slurm.script.starts_with("#!") || slurm.script.len() < 3 {
        return bad("slurm.script: the first line must start with #! and an interpreter".into());
    }
    if slurm.script.len() > ebb_api::MAX_SLURM_SCRIPT_BYTES {
        return bad(format!(
            "slurm.script: {} bytes, over the limit of {} bytes",
            slurm.script.len(),
            ebb_api::MAX_SLURM_SCRIPT_BYTES
        ));
    }
    if slurm.script.contains('\0') {
        return bad("slurm.script: contains a NUL byte".into());
    }
    for (field, value) in [("output", &slurm.output), ("error", &slurm.error)] {
        if let Some(v) = value {
            if v.is_empty() || v.len() > 4096 || v.contains('\0') {
                return bad(format!("slurm.{field}: must be a path of 1 to 4096 bytes without NUL"));
            }
        }
    }
    if let Some(dir) = &slurm.submit_dir {
        if dir.len() > 4096 || dir.contains('\0') {
            return bad("slurm.submit_dir: must be a path of at most 4096 bytes without NUL".into());
        }
    }
    let counts = [
        ("nodes", slurm.nodes, 4096),
        ("ntasks", slurm.ntasks, 65536),
        ("ntasks_per_node", slurm.ntasks_per_node, 65536),
        ("cpus_per_task", slurm.cpus_per_task, 65536),
    ];
    for (field, value, max) in counts {
        if let Some(n) = value {
            if n == 0 || n > max {
                return bad(format!("slurm.{field}: must be between 1 and {max}, got {n}"));
            }
        }
    }
    if let Some(s) = slurm.signal_before_s.filter(|&s| s > 65535) {
        return bad(format!("slurm.signal_before_s: at most 65535, got {s}"));
    }
    for (field, value) in [("partition", &slurm.partition), ("qos", &slurm.qos), ("account", &slurm.account)]
    {
        if let Some(v) = value {
            // The document's pattern, `^[^\s\u0085\u0000]*$`, as its
            // regular expressions read `\s`: Unicode's white space, U+FEFF.
            if v.chars().count() > 256 || v.chars().any(|c| c.is_whitespace() || c == '\u{feff}' || c == '\0')
            {
                return bad(format!("slurm.{field}: at most 256 characters, no spaces"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{submission, Limits};
    use super::*;
    use ebb_scheduler::State;

    /// A core with one 8-GPU H100 node.
    fn one_node() -> State {
        let mut core = State::new();
        let node = ebb_scheduler::NodeSpec {
            name: "n".into(),
            gpu_model: "H100".into(),
            gpus: 8,
            labels: Default::default(),
        };
        core.add_node(node, ebb_core::Time(0)).unwrap();
        core
    }

    /// A Slurm account, partition or QOS is refused exactly as the API
    /// document's pattern and length say: Unicode white space (U+0085
    /// included, which the document's `\s` leaves out and names), U+FEFF
    /// (which its `\s` includes), NUL; at most 256 characters, not bytes.
    #[test]
    fn slurm_names_are_refused_as_the_document_says() {
        let core = one_node();
        let with = |account: &str| {
            let script = "#!/bin/bash\ntrue\n".to_string();
            let slurm = ebb_api::SlurmBatch { account: Some(account.into()), script, ..Default::default() };
            let spec = JobSubmission { argv: vec!["x".into()], slurm: Some(slurm), ..Default::default() };
            match submission(&spec, &core, &Limits::default()) {
                Ok(_) => true,
                Err(e) if e.message.starts_with("slurm.account") => false,
                Err(e) => panic!("{account:?}: {}", e.message),
            }
        };
        for refused in ["a b", "a\u{85}b", "a\u{2000}", "\u{feff}", "a\0", &"x".repeat(257)] {
            assert!(!with(refused), "{refused:?} accepted");
        }
        for accepted in ["research-7", "\u{94}\u{b5}0\u{14}", &"é".repeat(256)] {
            assert!(with(accepted), "{accepted:?} refused");
        }
    }

    /// A heterogeneous job: 2 to 16 components, in bounds, of one size a
    /// node that the cluster's nodes have, adding up to the job's nodes
    /// and GPUs, not an array and not elastic.
    #[test]
    fn a_heterogeneous_jobs_components_add_up_to_whole_nodes_of_one_size() {
        let core = one_node();
        let part =
            |nodes, gpus_per_node| ebb_api::SlurmComponent { nodes, gpus_per_node, ..Default::default() };
        let with = |parts: Vec<ebb_api::SlurmComponent>, gpus: u32, nodes: Option<u32>| {
            let script = "#!/bin/bash\ntrue\n".to_string();
            let slurm = ebb_api::SlurmBatch { script, nodes, components: parts, ..Default::default() };
            let spec = JobSubmission {
                argv: vec!["x".into()],
                gpus: Some(gpus),
                slurm: Some(slurm),
                ..Default::default()
            };
            submission(&spec, &core, &Limits::default()).err().map(|e| e.message)
        };
        assert_eq!(with(vec![part(1, 8), part(2, 8)], 24, Some(3)), None);
        assert_eq!(
            with(vec![part(1, 8)], 8, Some(1)).unwrap(),
            "slurm.components: a heterogeneous job has 2 to 16, got 1"
        );
        let mixed = with(vec![part(1, 8), part(2, 4)], 16, Some(3)).unwrap();
        assert!(mixed.contains("4 GPUs a node where component 0 has 8"), "{mixed}");
        assert!(with(vec![part(1, 8), part(2, 8)], 16, Some(3))
            .unwrap()
            .contains("add up to 3 nodes of 8, not 16"));
        assert!(with(vec![part(1, 8), part(2, 8)], 24, Some(2)).unwrap().contains("add up to 3"));
        assert!(with(vec![part(1, 4), part(1, 4)], 8, None).unwrap().contains("this cluster's have 8"));
        assert!(with(vec![part(0, 8), part(1, 8)], 8, None).unwrap().contains("components[0].nodes"));
        assert!(with(vec![part(1, 8); 17], 8, None).unwrap().contains("2 to 16"));
    }

    /// A Slurm block without its script is schema-valid (a job's view
    /// leaves the script out), so it is refused as what the document
    /// cannot state: 422, naming the field.
    #[test]
    fn a_slurm_submission_without_its_script_is_unprocessable() {
        let core = one_node();
        let slurm = ebb_api::SlurmBatch::default();
        let spec = JobSubmission { argv: vec!["x".into()], slurm: Some(slurm), ..Default::default() };
        let refused = submission(&spec, &core, &Limits::default()).err().expect("refused");
        assert_eq!(
            (crate::http::status(refused.kind), refused.message.as_str()),
            (422, "slurm.script: a Slurm job's submission needs its script")
        );
    }
}
