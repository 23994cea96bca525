//! `scontrol`: `show hostnames`, `show job`, `show node`, `show
//! partition` and `show config` as Slurm prints them (tools read the
//! `Key=Value` words), and `requeue` of the job it runs in.

use std::fmt::Write;

use ebb_api as api;

use super::client;
use super::options;
use super::query::{duration, elapsed_s, node_list, reason_or_nodes, state, time_limit};
use crate::error::{failed, usage, CliError};

/// `scontrol show hostnames [LIST]`: one name a line, of `LIST` or the
/// job's own nodes.
pub fn hostnames(args: &[String]) -> Result<String, CliError> {
    let list = match args.first() {
        Some(list) => list.clone(),
        None => std::env::var("SLURM_JOB_NODELIST")
            .map_err(|_| usage("no host list given and SLURM_JOB_NODELIST is not set"))?,
    };
    let names = ebb_core::hostlist::expand(&list).map_err(usage)?;
    Ok(names.iter().map(|n| format!("{n}\n")).collect())
}

pub async fn scontrol(args: &[String]) -> Result<String, CliError> {
    let (given, words) = options::parse(options::Command::Scontrol, args, "")?;
    let one_line = options::flag(&given, "oneliner");
    // `show node=NAME` is `show node NAME`, as Slurm takes it.
    let words: Vec<&str> = words
        .iter()
        .flat_map(|w| match w.split_once('=') {
            Some((entity, name)) if !entity.is_empty() => vec![entity, name],
            _ => vec![w.as_str()],
        })
        .collect();
    let entity = |w: &str| w.to_ascii_lowercase();
    match words.as_slice() {
        ["show", "hostnames", rest @ ..] => hostnames(&rest.iter().map(|w| w.to_string()).collect::<Vec<_>>()),
        ["show", "job" | "jobs", id] => {
            let jobs = super::query::jobs_named(&client()?, id).await?;
            Ok(jobs.iter().map(show_job).collect())
        }
        ["show", what, rest @ ..] if ["node", "nodes", "nodename"].contains(&entity(what).as_str()) && rest.len() <= 1 => {
            let client = client()?;
            let nodes: Vec<api::Node> = client.get("/v1/nodes").await?;
            let partitions: Vec<api::Partition> = client.get("/v1/partitions").await?;
            show_nodes(&nodes, &partitions, rest.first().copied(), one_line)
        }
        ["show", what, rest @ ..]
            if ["partition", "partitions", "partitionname"].contains(&entity(what).as_str()) && rest.len() <= 1 =>
        {
            let client = client()?;
            let nodes: Vec<api::Node> = client.get("/v1/nodes").await?;
            let partitions: Vec<api::Partition> = client.get("/v1/partitions").await?;
            show_partitions(&partitions, &nodes, rest.first().copied(), one_line)
        }
        ["show", "config"] => Ok(show_config()),
        ["requeue", ids] => requeue(ids).await,
        _ => Err(usage(
            "Ebb's scontrol answers `show hostnames [LIST]`, `show job ID`, `show node [NAME]`, `show partition \
             [NAME]`, `show config` and `requeue ID` (see docs/slurm.md)",
        )),
    }
}

/// `scontrol requeue ID`: from inside that job, its attempt ends and it
/// goes back to the queue (through its own endpoint, so no token is
/// needed), as a preemption does.
async fn requeue(ids: &str) -> Result<String, CliError> {
    let own = [std::env::var("SLURM_JOB_ID").ok(), array_id()].into_iter().flatten().collect::<Vec<_>>();
    for id in ids.split(',') {
        if !own.iter().any(|o| o == id) {
            return Err(usage(format!(
                "requeue {id}: Ebb's scontrol requeues the job it runs in (its SLURM_JOB_ID), not other jobs"
            )));
        }
    }
    let url = std::env::var("EBB_METADATA_URL").map_err(|_| usage("requeue: not inside an Ebb job"))?;
    // The attempt is ended with SIGTERM to all its processes: this one
    // waits for the answer first.
    ignore_sigterm();
    let answer = reqwest::Client::new()
        .post(format!("{url}/ebb/v1/requeue"))
        .send()
        .await
        .map_err(|e| failed(format!("requeue: the node's endpoint: {e}")))?;
    match answer.status().as_u16() {
        202 => Ok(String::new()),
        status => Err(failed(format!(
            "requeue: the node answered {status}: {}",
            answer.text().await.unwrap_or_default()
        ))),
    }
}

fn array_id() -> Option<String> {
    let array = std::env::var("SLURM_ARRAY_JOB_ID").ok()?;
    let task = std::env::var("SLURM_ARRAY_TASK_ID").ok()?;
    Some(format!("{array}_{task}"))
}

fn ignore_sigterm() {
    // SAFETY: ignoring a signal installs no handler.
    unsafe {
        let _ =
            nix::sys::signal::signal(nix::sys::signal::Signal::SIGTERM, nix::sys::signal::SigHandler::SigIgn);
    }
}

/// `scontrol show config`: what a tool may ask of Slurm's configuration,
/// as Ebb has it.
pub fn show_config() -> String {
    let lines: [(&str, String); 6] = [
        ("ClusterName", "ebb".into()),
        ("GresTypes", "gpu".into()),
        ("PreemptMode", "REQUEUE".into()),
        ("PreemptType", "preempt/partition_prio".into()),
        ("SelectType", "select/cons_tres".into()),
        ("SLURM_VERSION", "25.11.7".into()),
    ];
    let mut out = String::from("Configuration data as of Ebb's server\n");
    for (key, value) in lines {
        writeln!(out, "{key:<31} = {value}").unwrap();
    }
    out
}

/// `scontrol show job`: a job as `Key=Value` words.
pub fn show_job(job: &api::Job) -> String {
    let slurm = job.slurm.as_ref();
    let mut words =
        vec![format!("JobId={}", job.id), format!("JobName={}", job.name.clone().unwrap_or_default())];
    if let Some(task) = &job.array {
        words.push(format!("ArrayJobId={} ArrayTaskId={}", task.id, task.index));
    }
    words.extend([
        format!("UserId={}", job.tenant),
        format!("JobState={} Reason={}", state(job), reason_or_nodes(job).trim_matches(['(', ')'])),
        format!(
            "Requeue=1 Restarts={} ExitCode={}:0",
            job.attempt.saturating_sub(1),
            job.exit_code.unwrap_or(0)
        ),
        format!("RunTime={} TimeLimit={}", duration(elapsed_s(job), false), time_limit(job, false)),
        format!("SubmitTime={}", job.submitted_at.trim_end_matches('Z')),
        format!("Partition={}", slurm.and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone())),
        format!("NodeList={}", node_list(job)),
        format!("NumNodes={} TRES=gres/gpu={}", job.placement.len().max(1), job.gpus),
        format!("WorkDir={}", job.workdir.clone().unwrap_or_default()),
    ]);
    words.join(" ") + "\n"
}

/// Slurm's `Key=Value` record: on one line with `-o`, else its first
/// word, then the rest indented three spaces, a few a line, as
/// `scontrol show` prints them.
fn record(words: &[(&str, String)], one_line: bool) -> String {
    let words: Vec<String> = words.iter().map(|(key, value)| format!("{key}={value}")).collect();
    if one_line {
        return words.join(" ") + "\n";
    }
    let mut out = format!("{}\n", words[0]);
    for line in words[1..].chunks(3) {
        out.push_str(&format!("   {}\n", line.join(" ")));
    }
    out + "\n"
}

/// `scontrol show partition [NAME]`: each partition as Slurm describes
/// one, its nodes every node (Ebb's partitions are tiers over one fleet).
pub fn show_partitions(
    partitions: &[api::Partition],
    nodes: &[api::Node],
    name: Option<&str>,
    one_line: bool,
) -> Result<String, CliError> {
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    let mut out = String::new();
    for p in partitions.iter().filter(|p| name.is_none_or(|n| n == p.name)) {
        let preempted = if p.tier == "preemptible" { "REQUEUE" } else { "OFF" };
        out.push_str(&record(
            &[
                ("PartitionName", p.name.clone()),
                ("AllowGroups", "ALL".into()),
                ("AllowAccounts", "ALL".into()),
                ("AllowQos", "ALL".into()),
                ("Default", if p.default { "YES" } else { "NO" }.into()),
                ("MaxTime", "UNLIMITED".into()),
                ("Nodes", ebb_core::hostlist::compress(&names)),
                ("PreemptMode", preempted.into()),
                ("State", "UP".into()),
                ("TotalNodes", nodes.len().to_string()),
                ("TRES", format!("gres/gpu={gpus}")),
            ],
            one_line,
        ));
    }
    match (out.is_empty(), name) {
        (true, Some(name)) => Err(usage(format!("Partition {name} not found"))),
        _ => Ok(out),
    }
}

/// `scontrol show node [NAME]`: each node as Slurm describes one. Its
/// address is its name, as Slurm's is where none is configured: the
/// site's DNS resolves it.
pub fn show_nodes(
    nodes: &[api::Node],
    partitions: &[api::Partition],
    name: Option<&str>,
    one_line: bool,
) -> Result<String, CliError> {
    let partition_names: Vec<&str> = partitions.iter().map(|p| p.name.as_str()).collect();
    let mut out = String::new();
    for node in nodes.iter().filter(|n| name.is_none_or(|w| w == n.name)) {
        let reason = node.drained_for.clone().or_else(|| node.unhealthy.clone());
        let mut words = vec![
            ("NodeName", node.name.clone()),
            ("NodeAddr", node.address.clone().unwrap_or_else(|| node.name.clone())),
            ("NodeHostName", node.name.clone()),
            ("CPUTot", node.cpus.unwrap_or(1).to_string()),
            ("RealMemory", node.memory_mib.unwrap_or(1).to_string()),
            ("Gres", format!("gpu:{}:{}", node.gpu_model, node.gpus)),
            ("GresUsed", format!("gpu:{}:{}", node.gpu_model, node.gpus_used)),
            ("State", super::sinfo::node_state(node).1.to_ascii_uppercase()),
            ("Partitions", partition_names.join(",")),
            ("CfgTRES", format!("gres/gpu={}", node.gpus)),
            ("AllocTRES", format!("gres/gpu={}", node.gpus_used)),
        ];
        if let Some(reason) = reason {
            words.push(("Reason", reason));
        }
        out.push_str(&record(&words, one_line));
    }
    match (out.is_empty(), name) {
        (true, Some(name)) => Err(usage(format!("Node {name} not found"))),
        _ => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, used: u32, status: &str, drained_for: Option<&str>) -> api::Node {
        serde_json::from_value(json!({
            "name": name, "gpu_model": "H100-80GB", "gpus": 8, "status": status, "unhealthy": null,
            "gpus_used": used, "gpus_held": 0, "held": [], "last_heartbeat": "", "jobs": [], "placements": [],
            "drained_for": drained_for, "gpus_out": [], "warnings": [], "address": "10.0.0.7", "cpus": 64,
            "memory_mib": 515000
        }))
        .unwrap()
    }

    fn partitions() -> Vec<api::Partition> {
        vec![
            api::Partition { name: "spot".into(), tier: "preemptible".into(), default: true },
            api::Partition { name: "gpu".into(), tier: "on-demand".into(), default: false },
        ]
    }

    /// What SkyPilot reads: `PartitionName=` and `Default=YES` from
    /// `show partitions -o`, `NodeAddr=` and `Gres=` from `show node=NAME`.
    #[test]
    fn nodes_and_partitions_read_as_scontrol_prints_them() {
        let nodes = [node("node-0", 0, "up", None), node("node-1", 8, "draining", Some("GPU 3: Xid 79"))];
        let text = show_partitions(&partitions(), &nodes, None, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("PartitionName=spot AllowGroups=ALL"), "{text}");
        assert!(lines[0].contains(" Default=YES ") && lines[0].contains(" PreemptMode=REQUEUE "), "{text}");
        assert!(lines[1].contains(" Default=NO ") && lines[1].contains(" PreemptMode=OFF "), "{text}");
        assert!(lines[0].contains(" Nodes=node-[0-1] ") && lines[0].ends_with(" TRES=gres/gpu=16"), "{text}");
        let one = show_nodes(&nodes, &partitions(), Some("node-1"), false).unwrap();
        assert!(
            one.starts_with(
                "NodeName=node-1\n   NodeAddr=10.0.0.7 NodeHostName=node-1 CPUTot=64\n   RealMemory=515000 \
                 Gres=gpu:H100-80GB:8 "
            ),
            "{one}"
        );
        assert!(
            one.contains("State=DRAINING")
                && one.contains("Partitions=spot,gpu")
                && one.contains("Reason=GPU 3: Xid 79"),
            "{one}"
        );
        assert_eq!(
            show_nodes(&nodes, &partitions(), Some("node-9"), true).unwrap_err().to_string(),
            "Node node-9 not found"
        );
        assert_eq!(
            show_partitions(&partitions(), &nodes, Some("x"), true).unwrap_err().to_string(),
            "Partition x not found"
        );
    }
}
