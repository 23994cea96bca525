//! `ebb agent --simulate-nodes N` end to end: a fleet of simulated nodes
//! in one process, against the real server, beside real agents; their
//! jobs end as processes doing the same would.

use std::time::Duration;

use crate::support;
use crate::support::{events, wait_for, Cluster, Options};
use serde_json::Value;

/// The first event of `kind` of a job's attempt.
fn event(job: &Value, kind: &str, attempt: u64) -> Value {
    let found =
        job["events"].as_array().unwrap().iter().find(|e| e["kind"] == kind && e["attempt"] == attempt);
    found.unwrap_or_else(|| panic!("no {kind} of attempt {attempt}: {job}")).clone()
}

/// The `exited` event's details.
fn exited(job: &Value, attempt: u64) -> Value {
    event(job, "exited", attempt)["detail"].clone()
}

/// Milliseconds from the attempt's first `from` event to its exit, by the
/// server's record.
fn exited_after(job: &Value, from: &str, attempt: u64) -> u64 {
    let at = |kind: &str| event(job, kind, attempt)["at_ms"].as_u64().unwrap();
    at("exited") - at(from)
}

fn code_and_signal(detail: &Value) -> (Option<i64>, Option<i64>) {
    (detail["code"].as_i64(), detail["signal"].as_i64())
}

#[test]
fn two_hundred_simulated_nodes_join_run_an_array_and_a_real_agent_works_beside_them() {
    // At the server's default interval: 200 nodes poll 200 times a second.
    let mut c = Cluster::start(Options {
        nodes: 1,
        simulated_nodes: 200,
        gpus: 8,
        heartbeat_interval: "1s",
        ..Options::default()
    });
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 200);
    for node in nodes {
        assert_eq!((node["status"].as_str(), node["gpus"].as_u64()), (Some("up"), Some(8)), "{node}");
    }
    let mut names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!((names.len(), names[0], names[199]), (200, "node-0-00000", "node-0-00199"));

    // 400 tasks of 4 GPUs: the whole fleet at once.
    let array = c.submit(&["--array", "0-399", "--gpus", "4", "--env", "EBB_SIM_DURATION=1s", "--", "train"]);
    let progress = wait_for("the array to finish", Duration::from_secs(120), || {
        let progress = c.job(array)["progress"].clone();
        (progress["done"].as_u64()? == 400).then_some(progress)
    });
    assert_eq!(progress["total"], 400);
    let tasks = progress["tasks"].as_array().unwrap();
    assert!(tasks.iter().all(|t| t["state"] == "succeeded"), "{progress}");
    let one = c.job(tasks[123]["id"].as_u64().unwrap());
    assert_eq!(code_and_signal(&exited(&one, 1)), (Some(0), None));
    assert_eq!(exited(&one, 1)["completed_marker"], true);
    let usage = &one["usage"][0];
    assert_eq!((usage["outcome"].as_str(), usage["gpus"].as_u64()), (Some("completed"), Some(4)));
    assert!((1..=3).contains(&usage["seconds"].as_u64().unwrap()), "a 1 s task billed {usage}");

    // A real agent joins the same server and runs a real process.
    c.add_real_agent("A100-40GB");
    c.wait_nodes_up(201);
    let marker = c.dir.join("real-job-ran");
    let script = format!("echo real on $EBB_NODE > {}", marker.display());
    let real = c.submit(&["--gpu-model", "A100-40GB", "--gpus", "2", "--", "bash", "-c", &script]);
    c.wait_state(real, "succeeded");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "real on node-1");
    // And the fleet keeps working beside it.
    let again = c.submit(&["--gpus", "8", "--env", "EBB_SIM_DURATION=0.2", "--", "train"]);
    c.wait_state(again, "succeeded");
    c.assert_no_double_booking();
}

#[test]
fn simulated_jobs_end_as_processes_doing_the_same_would() {
    let c = Cluster::start(Options {
        nodes: 1,
        simulated_nodes: 2,
        gpus: 2,
        drain_window: "6s",
        ..Options::default()
    });
    // Its duration over, a job exits 0, complete.
    let done = c.submit(&["--gpus", "2", "--env", "EBB_SIM_DURATION=0.5", "--", "train"]);
    let job = c.wait_state(done, "succeeded");
    assert_eq!(code_and_signal(&exited(&job, 1)), (Some(0), None));
    assert!(c.output(done).contains("runs for 500ms"), "{}", c.output(done));

    // Two preemptible jobs that ignore their notice fill the fleet; one
    // would run for ever, the other finishes inside the drain window.
    let stubborn = c.submit(&["--gpus", "2", "--env", "EBB_SIM_IGNORE_NOTICE=1", "--", "train"]);
    c.wait_state(stubborn, "running");
    let finisher = c.submit(&[
        "--gpus",
        "2",
        "--env",
        "EBB_SIM_IGNORE_NOTICE=1",
        "--env",
        "EBB_SIM_DURATION=3.5",
        "--",
        "train",
    ]);
    c.wait_state(finisher, "running");
    let preemptors: Vec<u64> = (0..2)
        .map(|_| {
            c.submit(&["--tier", "on-demand", "--gpus", "2", "--env", "EBB_SIM_DURATION=0.5", "--", "train"])
        })
        .collect();
    // The one that finished during its drain succeeded, as a job marking
    // itself complete does.
    let job = c.wait_state(finisher, "succeeded");
    assert!(events(&job).contains(&"drain_notice".to_string()), "finished before its notice: {job}");
    let finished = exited(&job, 1);
    assert_eq!(code_and_signal(&finished), (Some(0), None));
    assert_eq!(finished["completed_marker"], true);
    assert!(exited_after(&job, "drain_notice", 1) < 6000, "{job}");
    // The other was killed at the deadline, and requeued.
    for od in &preemptors {
        c.wait_state(*od, "succeeded");
    }
    let job = c.wait_job(stubborn, "its second attempt", Duration::from_secs(20), |j| {
        j["attempt"] == 2 && j["state"] == "running"
    });
    assert_eq!(code_and_signal(&exited(&job, 1)), (None, Some(9)), "SIGKILL at the deadline");
    assert!(exited_after(&job, "drain_notice", 1) >= 5500, "the deadline is 6 s after the notice: {job}");
    assert_eq!(job["usage"][0]["outcome"], "preempted");
    c.assert_no_double_booking();

    // A cancel ends a job at once if it heeds its notice, at the grace's
    // end if it ignores it.
    let polite = c.submit(&["--gpus", "2", "--", "train"]);
    c.wait_state(polite, "running");
    c.ebb(&["cancel", &polite.to_string(), &stubborn.to_string(), "--grace", "2s"]);
    let job = c.wait_state(polite, "cancelled");
    assert_eq!(code_and_signal(&exited(&job, 1)), (Some(0), None));
    assert!(exited_after(&job, "cancel_requested", 1) < 1500, "it exited at its notice: {job}");
    let job = c.wait_state(stubborn, "cancelled");
    assert_eq!(code_and_signal(&exited(&job, 2)), (None, Some(9)));
    assert!(exited_after(&job, "cancel_requested", 2) >= 1800, "killed at the grace's end: {job}");
}

#[test]
fn a_simulated_fleet_is_refused_what_it_cannot_do() {
    let refused = |args: &[&str]| {
        let out = std::process::Command::new(support::ebb_exe())
            .args(["agent", "--server", "http://127.0.0.1:9", "--join-token", "t"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let gpus = ["--fake-gpus", "8", "--gpu-model", "H100"];
    let e = refused(&[&["--simulate-nodes", "0"][..], &gpus].concat());
    assert!(e.contains("--simulate-nodes 0: from 1 to 100000"), "{e}");
    let e = refused(&[&["--simulate-nodes", "100001"][..], &gpus].concat());
    assert!(e.contains("--simulate-nodes 100001: from 1 to 100000"), "{e}");
    let e = refused(&["--stop-timeout", "25h"]);
    assert!(e.contains("--stop-timeout 1d 1h: at most 1d"), "{e}");
    let e = refused(&["--stop-timeout=-1s"]);
    assert!(e.contains("--stop-timeout") && e.contains("-1s"), "{e}");
    let e = refused(&["--simulate-nodes", "2"]);
    assert!(e.contains("needs --fake-gpus"), "{e}");
    let e = refused(&[&["--simulate-nodes", "2", "--checkpoint-root", "/tmp"][..], &gpus].concat());
    assert!(e.contains("--checkpoint-root: simulated jobs write no files"), "{e}");
    // More nodes than open files: the limit is named, and how to raise it.
    let out = std::process::Command::new("bash")
        .args(["-c", r#"ulimit -n 1000 && ulimit -Hn 1000 && exec "$@""#, "bash", support::ebb_exe()])
        .args(["agent", "--server", "http://127.0.0.1:9", "--join-token", "t", "--simulate-nodes", "5000"])
        .args(gpus)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains("the open-file limit is 1000") && e.contains("ulimit -n"), "{e}");
}

/// `ebb drill`'s report of a job, as `--json` gives it.
fn drill(c: &Cluster, id: u64) -> Value {
    let out = c.ebb_as(&c.admin, &["drill", &id.to_string(), "--timeout", "30s", "--json"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until job `id`'s attempt `attempt` runs and has reported a
/// checkpoint of at least `step`.
fn saved(c: &Cluster, id: u64, attempt: u64, step: u64) -> Value {
    c.wait_job(id, &format!("attempt {attempt}'s checkpoint of step {step}"), Duration::from_secs(30), |j| {
        j["state"] == "running"
            && j["attempt"] == attempt
            && j["last_checkpoint"]["step"].as_u64().is_some_and(|s| s >= step)
    })
}

#[test]
fn a_drill_of_a_simulated_job_that_checkpoints_concludes_ready_with_the_step_it_resumed_from() {
    let c = Cluster::start(Options {
        nodes: 1,
        simulated_nodes: 2,
        gpus: 2,
        drain_window: "5s",
        ..Options::default()
    });
    let id = c.submit(&[
        "--gpus",
        "2",
        "--env",
        "EBB_SIM_CHECKPOINT=1s",
        "--env",
        "EBB_SIM_SAVE=0.2",
        "--",
        "train",
    ]);
    saved(&c, id, 1, 2);
    let report = drill(&c, id);
    assert_eq!(
        (report["verdict"].as_str(), report["failures"].as_array()),
        (Some("ready"), None),
        "{report}"
    );
    // It saved at its notice, a step past its periodic ones, and resumed
    // from that step.
    let step = report["checkpoint"]["step"].as_u64().unwrap();
    assert!(step >= 3, "{report}");
    assert!(report["checkpoint"]["after_notice_seconds"].as_f64().unwrap() >= 0.0, "{report}");
    assert_eq!((report["next_attempt"].as_u64(), report["resumed_step"].as_u64()), (Some(2), Some(step)));

    // Attempt 2 said so, and numbers its checkpoints on from there.
    saved(&c, id, 2, step + 1);
    let job = c.job(id);
    assert_eq!(event(&job, "resumed", 2)["detail"]["step"].as_u64(), Some(step), "{job}");
    assert_eq!(event(&job, "checkpoint", 2)["detail"]["step"].as_u64(), Some(step + 1), "{job}");
    assert_eq!(job["preemptions"].as_u64(), Some(0));
    let log = c.output(id);
    assert!(log.contains(&format!("resumes from step {step} (")), "{log}");
    let shown = c.ebb(&["show", &id.to_string()]);
    assert!(
        shown.contains("verdict: ready") && shown.contains(&format!("resumed from step {step}")),
        "{shown}"
    );
}

#[test]
fn a_preempted_simulated_job_resumes_on_another_node_and_runs_only_what_was_left() {
    let c = Cluster::start(Options {
        nodes: 1,
        simulated_nodes: 2,
        gpus: 2,
        drain_window: "5s",
        ..Options::default()
    });
    // One node is busy with a job that never saves, the other with one
    // that runs 8 s, saving every second and at its notice.
    let filler = c.submit(&["--gpus", "2", "--", "train"]);
    c.wait_state(filler, "running");
    let id = c.submit(&[
        "--gpus",
        "2",
        "--env",
        "EBB_SIM_DURATION=8",
        "--env",
        "EBB_SIM_CHECKPOINT=1s",
        "--env",
        "EBB_SIM_SAVE=0.2",
        "--",
        "train",
    ]);
    saved(&c, id, 1, 3);
    // An on-demand job takes its GPUs: it has the least work to lose.
    let urgent =
        c.submit(&["--tier", "on-demand", "--gpus", "2", "--env", "EBB_SIM_DURATION=60", "--", "train"]);
    c.wait_state(urgent, "running");
    let job = c.wait_state(id, "queued");
    assert_eq!((job["preemptions"].as_u64(), job["attempt"].as_u64()), (Some(1), Some(1)), "{job}");
    let step = job["last_checkpoint"]["step"].as_u64().unwrap();
    // The other node frees up: attempt 2 runs there.
    c.ebb(&["cancel", &filler.to_string()]);
    let job = c.wait_job(id, "to finish", Duration::from_secs(30), |j| j["state"] == "succeeded");
    let node = |attempt| event(&job, "started", attempt)["detail"]["node"].as_str().unwrap().to_string();
    assert_ne!(node(1), node(2), "{job}");
    assert_eq!(event(&job, "resumed", 2)["detail"]["step"].as_u64(), Some(step), "{job}");

    // It ran its 8 s once (and its save), not 8 s more after the
    // preemption: less than twice its duration, and less than its duration
    // with a second and a half to spare.
    let usage = job["usage"].as_array().unwrap();
    let outcomes: Vec<&str> = usage.iter().map(|u| u["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["preempted", "completed"], "{job}");
    let ran = |u: &Value| u["ended_ms"].as_u64().unwrap() - u["started_ms"].as_u64().unwrap();
    let total: u64 = usage.iter().map(ran).sum();
    assert!(total < 2 * 8_000, "ran {total} ms in all: {usage:?}");
    assert!(total < 8_000 + 1_500, "ran {total} ms in all: {usage:?}");
    // Step 3 or later was saved: at least 3 s of work, so at most 5 s left.
    assert!(ran(&usage[1]) < 5_000 + 500, "attempt 2 ran {} ms: {usage:?}", ran(&usage[1]));
    assert!(c.output(id).contains(&format!("resumes from step {step} (")), "{}", c.output(id));
    c.assert_no_double_booking();
}
