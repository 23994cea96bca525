//! `--json` for `squeue`, `sacct` and `sinfo`, in the shape Slurm's
//! data_parser (v0.0.44, Slurm 25.11) gives it: a `meta` block, `errors`
//! and `warnings`, and the records with Slurm's field names and types —
//! a number that may be unset is `{"set", "infinite", "number"}`, a state
//! a list of names, an exit code `{"status", "return_code", "signal"}`.
//! Ebb fills the fields it knows and leaves out the ones it does not (a
//! node's CPUs and memory where its agent did not say), rather than
//! invent them.

use ebb_api as api;
use serde_json::{json, Value};

use super::query::{job_id, node_count, state};
use super::sinfo::node_state;

/// Slurm's number that may be unset.
fn maybe(number: Option<u64>) -> Value {
    json!({"set": number.is_some(), "infinite": false, "number": number.unwrap_or(0)})
}

fn unix_s(text: Option<&str>) -> Option<u64> {
    text.and_then(|t| humantime::parse_rfc3339(t).ok()).map(|t| ebb_core::time::unix_ms(t) / 1000)
}

/// `--json[=VERSION]`: Ebb answers in data_parser v0.0.44's shape, which
/// v0.0.41 to v0.0.43 share for these fields.
pub fn data_parser(given: &super::options::Given) -> Result<(), crate::error::CliError> {
    match super::options::last(given, "json") {
        None | Some("" | "v0.0.41" | "v0.0.42" | "v0.0.43" | "v0.0.44") => Ok(()),
        Some(other) => Err(crate::error::usage(format!(
            "--json={other}: Ebb answers as data_parser v0.0.44 (v0.0.41 to v0.0.44 are taken)"
        ))),
    }
}

/// The envelope every `--json` answer has.
fn envelope(command: &str, key: &str, records: Vec<Value>) -> String {
    let answer = json!({
        key: records,
        "meta": {
            "plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.44", "accounting_storage": ""},
            "client": {"source": "", "user": "", "group": ""},
            "command": [command, "--json"],
            "slurm": {
                "version": {"major": "25", "minor": "11", "micro": "7"},
                "release": "25.11.7",
                "cluster": "ebb",
            },
        },
        "errors": [],
        "warnings": [],
    });
    format!("{}\n", serde_json::to_string_pretty(&answer).expect("JSON of JSON"))
}

fn exit_code(job: &api::Job) -> Value {
    let status = match (state(job), job.exit_code) {
        ("PENDING" | "RUNNING", _) => "PENDING",
        (_, Some(0)) | ("COMPLETED", None) => "SUCCESS",
        (_, Some(_)) => "ERROR",
        (_, None) => "SIGNALED",
    };
    json!({
        "status": [status],
        "return_code": maybe(job.exit_code.map(|c| c.max(0) as u64)),
        "signal": {"id": maybe(None), "name": ""},
    })
}

fn partition(job: &api::Job) -> String {
    job.slurm.as_ref().and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone())
}

fn nodes(job: &api::Job) -> String {
    let names: Vec<&str> = job.placement.iter().map(|p| p.node.as_str()).collect();
    ebb_core::hostlist::compress(&names)
}

/// `squeue --json`: the jobs as slurmctld's job records.
pub fn squeue(jobs: &[api::Job]) -> String {
    let records = jobs
        .iter()
        .map(|job| {
            let slurm = job.slurm.as_ref();
            json!({
                "job_id": job.id,
                "name": job.name.clone().unwrap_or_default(),
                "user_name": job.tenant,
                "account": slurm.and_then(|s| s.account.clone()).unwrap_or_default(),
                "qos": slurm.and_then(|s| s.qos.clone()).unwrap_or_default(),
                "partition": partition(job),
                "job_state": [state(job)],
                "state_reason": job.pending_reason.map_or("None".to_string(), |r| r.as_str().to_string()),
                "array_job_id": maybe(job.array.as_ref().map(|a| a.id)),
                "array_task_id": maybe(job.array.as_ref().map(|a| a.index)),
                "batch_flag": slurm.is_some(),
                "command": job.argv.first().cloned().unwrap_or_default(),
                "current_working_directory": job.workdir.clone().unwrap_or_default(),
                "nodes": nodes(job),
                "node_count": maybe(Some(u64::from(node_count(job)))),
                "cpus_per_task": maybe(slurm.and_then(|s| s.cpus_per_task).map(u64::from)),
                "tres_per_node": format!("gres/gpu:{}", job.gpus / node_count(job)),
                "tres_req_str": format!("gres/gpu={}", job.gpus),
                "restart_cnt": job.attempt.saturating_sub(1),
                "requeue": true,
                "submit_time": maybe(unix_s(Some(&job.submitted_at))),
                "start_time": maybe(unix_s(job.started_at.as_deref())),
                "end_time": maybe(unix_s(job.ended_at.as_deref())),
                "time_limit": maybe(job.time_limit_s.map(|s| s.div_ceil(60))),
                "exit_code": exit_code(job),
            })
        })
        .collect();
    envelope("squeue", "jobs", records)
}

/// `sacct --json`: the jobs as slurmdbd's job records.
pub fn sacct(jobs: &[api::Job]) -> String {
    let records = jobs
        .iter()
        .map(|job| {
            let slurm = job.slurm.as_ref();
            let start = unix_s(job.started_at.as_deref());
            let end = unix_s(job.ended_at.as_deref());
            json!({
                "job_id": job.id,
                "name": job.name.clone().unwrap_or_default(),
                "user": job.tenant,
                "account": slurm.and_then(|s| s.account.clone()).unwrap_or_default(),
                "qos": slurm.and_then(|s| s.qos.clone()).unwrap_or_default(),
                "partition": partition(job),
                "cluster": "ebb",
                "nodes": nodes(job),
                "array": {
                    "job_id": job.array.as_ref().map_or(0, |a| a.id),
                    "task_id": maybe(job.array.as_ref().map(|a| a.index)),
                    "task": job.array.as_ref().map_or(String::new(), |a| a.index.to_string()),
                    "limits": {"max": {"running": {"tasks": 0}}},
                },
                "state": {
                    "current": [state(job)],
                    "reason": job.pending_reason.map_or("None".to_string(), |r| r.as_str().to_string()),
                },
                "exit_code": exit_code(job),
                "restart_cnt": job.attempt.saturating_sub(1),
                "working_directory": job.workdir.clone().unwrap_or_default(),
                "time": {
                    "submission": unix_s(Some(&job.submitted_at)).unwrap_or(0),
                    "start": start.unwrap_or(0),
                    "end": end.unwrap_or(0),
                    "elapsed": match (start, end) {
                        (Some(s), Some(e)) => e.saturating_sub(s),
                        _ => 0,
                    },
                    "limit": maybe(job.time_limit_s.map(|s| s.div_ceil(60))),
                },
                "tres": {
                    "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": job.gpus}],
                    "allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": if job.placement.is_empty() { 0 } else { job.gpus }}],
                },
                "steps": [],
                "id_display": job_id(job),
            })
        })
        .collect();
    envelope("sacct", "jobs", records)
}

/// `sinfo --json`: each partition's nodes in each state.
pub fn sinfo(nodes: &[api::Node], partitions: &[(String, bool)]) -> String {
    let mut records = Vec::new();
    for (partition, _) in partitions {
        let mut states: Vec<(&str, Vec<&api::Node>)> = Vec::new();
        for node in nodes {
            let long = node_state(node).1;
            match states.iter_mut().find(|(s, _)| *s == long) {
                Some((_, group)) => group.push(node),
                None => states.push((long, vec![node])),
            }
        }
        for (long, group) in states {
            let names: Vec<&str> = group.iter().map(|n| n.name.as_str()).collect();
            let busy = matches!(long, "allocated" | "mixed" | "draining");
            let idle = long == "idle";
            let total = group.len();
            let addresses: Vec<&str> =
                group.iter().map(|n| n.address.as_deref().unwrap_or(n.name.as_str())).collect();
            let range = |values: Vec<u64>| -> Option<(u64, u64)> {
                Some((*values.iter().min()?, *values.iter().max()?)).filter(|_| values.len() == group.len())
            };
            let cpus = range(group.iter().filter_map(|n| n.cpus.map(u64::from)).collect());
            let memory = range(group.iter().filter_map(|n| n.memory_mib).collect());
            let mut record = json!({
                "port": 0,
                "node": {"state": [long.to_ascii_uppercase()]},
                "nodes": {
                    "allocated": if busy { total } else { 0 },
                    "idle": if idle { total } else { 0 },
                    "other": if busy || idle { 0 } else { total },
                    "total": total,
                    "hostnames": names,
                    "addresses": addresses,
                    "nodes": names,
                },
                "gres": {
                    "total": group.first().map_or(String::new(), |n| format!("gpu:{}:{}", n.gpu_model, n.gpus)),
                    "used": group.first().map_or(String::new(), |n| format!("gpu:{}:{}", n.gpu_model, n.gpus_used)),
                },
                "reason": {
                    "description": group.first().and_then(|n| n.drained_for.clone().or_else(|| n.unhealthy.clone())).unwrap_or_default(),
                    "time": 0,
                },
                "partition": {"name": partition, "partition": {"state": ["UP"]}},
            });
            if let Some((least, most)) = cpus {
                record["cpus"] = json!({"minimum": least, "maximum": most});
            }
            if let Some((least, most)) = memory {
                record["memory"] = json!({"minimum": least, "maximum": most});
            }
            records.push(record);
        }
    }
    envelope("sinfo", "sinfo", records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, exit_code: Option<i32>) -> api::Job {
        serde_json::from_value(json!({
            "id": 7, "tenant": "alice", "name": "train", "tier": "preemptible", "gpus": 2,
            "gpu_model": null, "argv": ["train.sh"], "state": state, "attempt": 2, "preemptions": 1,
            "retries": 0, "submitted_at": "2026-12-03T10:00:00Z", "exit_code": exit_code,
            "placement": [{"node": "node-1", "gpus": [0, 1]}], "time_limit_s": 3600,
            "started_at": "2026-12-03T10:00:00Z", "ended_at": "2026-12-03T11:02:03Z"
        }))
        .unwrap()
    }

    /// The fields tools read, in data_parser's names and types.
    #[test]
    fn jobs_and_nodes_read_as_slurms_data_parser_writes_them() {
        let out: Value = serde_json::from_str(&squeue(&[job("running", None)])).unwrap();
        let j = &out["jobs"][0];
        assert_eq!((j["job_id"].as_u64(), j["job_state"].clone()), (Some(7), json!(["RUNNING"])));
        assert_eq!(j["time_limit"], json!({"set": true, "infinite": false, "number": 60}));
        assert_eq!(j["array_job_id"]["set"], false);
        assert_eq!((j["nodes"].as_str(), j["restart_cnt"].as_u64()), (Some("node-1"), Some(1)));
        assert_eq!(j["submit_time"]["number"], 1_796_292_000u64);
        assert_eq!(out["meta"]["slurm"]["release"], "25.11.7");
        assert_eq!((out["errors"].clone(), out["warnings"].clone()), (json!([]), json!([])));

        let out: Value = serde_json::from_str(&sacct(&[job("failed", Some(3))])).unwrap();
        let j = &out["jobs"][0];
        assert_eq!(j["state"]["current"], json!(["FAILED"]));
        assert_eq!(j["exit_code"]["status"], json!(["ERROR"]));
        assert_eq!(j["exit_code"]["return_code"]["number"], 3);
        assert_eq!(j["time"]["elapsed"], 3723);

        let node: api::Node = serde_json::from_value(json!({
            "name": "node-0", "gpu_model": "H100-80GB", "gpus": 8, "status": "up", "unhealthy": null,
            "gpus_used": 8, "gpus_held": 0, "held": [], "last_heartbeat": "", "jobs": [], "placements": [],
            "drained_for": null, "gpus_out": [], "warnings": []
        }))
        .unwrap();
        let out: Value = serde_json::from_str(&sinfo(&[node], &[("spot".into(), true)])).unwrap();
        let row = &out["sinfo"][0];
        assert_eq!(
            (row["node"]["state"].clone(), row["nodes"]["allocated"].as_u64()),
            (json!(["ALLOCATED"]), Some(1))
        );
        assert_eq!(
            (row["gres"]["total"].as_str(), row["partition"]["name"].as_str()),
            (Some("gpu:H100-80GB:8"), Some("spot"))
        );
    }
}
