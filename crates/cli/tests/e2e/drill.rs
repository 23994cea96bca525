//! Fire drills end to end: `ebb drill` against the real `ebb` binary as
//! server and agents on loopback, jobs as real Python processes using the
//! SDK (on the nodes' PYTHONPATH), each given a real notice with its
//! cluster's drain window.

use std::process::Output;
use std::time::Duration;

use crate::support::{events, repo_root, wait_for, Cluster, Options};
use serde_json::Value;

/// A job that is ready: it resumes from its latest checkpoint with the
/// SDK (which reports the resume), counts steps, and at the notice keeps
/// the notice file, saves its step and exits.
const READY: &str = r#"
import os, shutil, time, ebb_sdk
ebb_sdk.watcher()
ckpt = ebb_sdk.CheckpointManager(keep=2)
resumed = ckpt.load_latest(lambda f: int(f.read()))
step = resumed[0] if resumed else 0
attempt = ebb_sdk.attempt()
print(f"attempt {attempt} from step {step}", flush=True)
while True:
    time.sleep(0.02)
    step += 1
    if ebb_sdk.drain_requested():
        shutil.copy(os.environ["EBB_DRAIN_FILE"], os.path.join(ckpt.directory, f"notice-{attempt}.json"))
        ckpt.save(step, str(step).encode())
        ebb_sdk.exit_now()
"#;

/// A job that ignores its notice: it saves every half second until the
/// notice file appears (writing the step it had reached then beside its
/// checkpoints) and resumes from its latest save, but never exits on the
/// signal.
const IGNORES: &str = r#"
import os, signal, time, ebb_sdk
ckpt = ebb_sdk.CheckpointManager(keep=2, interval=0.5)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
resumed = ckpt.load_latest(lambda f: int(f.read()))
step = resumed[0] if resumed else 0
seen = False
while True:
    time.sleep(0.02)
    step += 1
    noticed = os.path.exists(os.environ["EBB_DRAIN_FILE"])
    if noticed and not seen:
        seen = True
        with open(os.path.join(ckpt.directory, f"noticed-{ebb_sdk.attempt()}"), "w") as f:
            f.write(str(step))
    if ckpt.should_save() and not noticed:
        ckpt.save(step, str(step).encode())
"#;

/// A job that saves at its notice but never loads what it saved: each
/// attempt starts over, its steps counted from 1, one saved every half
/// second.
const STARTS_OVER: &str = r#"
import time, ebb_sdk
ckpt = ebb_sdk.CheckpointManager(keep=2, interval=0.5)
step = 0
while True:
    time.sleep(0.02)
    if ckpt.should_save():
        step += 1
        ckpt.save(step, str(step).encode())
        if ckpt.drain_requested():
            ebb_sdk.exit_now()
"#;

fn python(c: &Cluster, script: &str) -> u64 {
    c.submit(&["--gpus", "2", "--", "python3", "-c", script])
}

fn drill(c: &Cluster, token: &str, id: u64, args: &[&str]) -> Output {
    let id = id.to_string();
    let mut full = vec!["drill", id.as_str(), "--timeout", "60s"];
    full.extend_from_slice(args);
    c.ebb_as(token, &full)
}

/// `ebb_drills_total{verdict}` from the server's `/metrics`.
fn drills(c: &Cluster, verdict: &str) -> f64 {
    let text = c.metrics();
    let series = format!("ebb_drills_total{{verdict=\"{verdict}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(series.as_str()));
    line.unwrap_or_else(|| panic!("no {series} in:\n{text}")).parse().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until job `id`'s attempt has reported a checkpoint of at least
/// `step`: it runs, and has saved work a drill can test.
fn saved(c: &Cluster, id: u64, step: u64) {
    c.wait_job(id, "a checkpoint", Duration::from_secs(30), |j| {
        j["state"] == "running" && j["last_checkpoint"]["step"].as_u64().is_some_and(|s| s >= step)
    });
}

#[test]
fn a_ready_job_saves_exits_in_the_window_and_resumes_and_the_drill_is_neither_a_preemption_nor_lost_work() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "10s", ..Options::default() });
    let id = python(&c, READY);
    c.wait_job(id, "its start", Duration::from_secs(30), |j| j["state"] == "running");
    wait_for("its first words", Duration::from_secs(30), || {
        c.output(id).contains("attempt 1 from step 0").then_some(())
    });

    let out = drill(&c, &c.admin, id, &[]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", text(&out.stderr));
    let lines: Vec<&str> = said.lines().collect();
    let expected = [
        "drain notice sent to attempt 1 on node-0; SIGKILL at ",
        "checkpoint reported at +",
        "exited with code 0 at +",
        "requeued at once",
        "attempt 2 placed on node-0",
        "attempt 2 started at +",
        "resumed from step ",
        "verdict: ready",
    ];
    let mut at = 0;
    for step in expected {
        let found = lines[at..].iter().position(|l| l.contains(step));
        at += found.unwrap_or_else(|| panic!("{step:?} missing, or out of order, in:\n{said}")) + 1;
    }

    // The job got a real notice: the drain's, with the cluster's window.
    let notice: Value =
        serde_json::from_slice(&std::fs::read(c.checkpoints(id).join("notice-1.json")).unwrap()).unwrap();
    assert_eq!(notice["action"], "preempt");
    assert!(notice["reason"].as_str().unwrap().starts_with("drill: "), "{notice}");

    let job = c.job(id);
    let d = &job["drill"];
    assert_eq!((d["verdict"].as_str(), d["failures"].as_array()), (Some("ready"), None), "{d}");
    assert_eq!((d["attempt"].as_u64(), d["window_seconds"].as_f64()), (Some(1), Some(10.0)));
    assert_eq!((d["fit_window"].as_bool(), d["requeued"].as_bool()), (Some(true), Some(true)));
    assert!(d["margin_seconds"].as_f64().unwrap() > 5.0, "{d}");
    assert!(d["lost_seconds"].as_f64().unwrap() < 5.0, "{d}");
    let saved_step = d["checkpoint"]["step"].as_u64().unwrap();
    assert_eq!(d["resumed_step"].as_u64(), Some(saved_step));
    assert!(d["checkpoint"]["after_notice_seconds"].as_f64().unwrap() >= 0.0, "saved after the notice: {d}");
    assert!(c.output(id).contains(&format!("attempt 2 from step {saved_step}")));

    // It runs again as attempt 2; not a preemption, no lost work.
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("running"), Some(2)));
    assert_eq!((job["preemptions"].as_u64(), job["lost_gpu_seconds"].as_f64()), (Some(0), Some(0.0)));
    let kinds = events(&job);
    assert_eq!(kinds.iter().filter(|k| *k == "drill").count(), 2, "notice and verdict: {kinds:?}");
    for kind in ["drain_notice", "requeued", "resumed"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} missing from {kinds:?}");
    }
    let verdict = job["events"].as_array().unwrap().iter().rfind(|e| e["kind"] == "drill").unwrap().clone();
    assert_eq!(
        (verdict["detail"]["phase"].as_str(), verdict["detail"]["verdict"].as_str()),
        (Some("verdict"), Some("ready"))
    );

    // Billed as the run time it was: no drain, no lost work, no preemption.
    let usage = job["usage"].as_array().unwrap();
    assert_eq!(usage.len(), 1, "{usage:?}");
    let first = &usage[0];
    assert_eq!((first["attempt"].as_u64(), first["outcome"].as_str()), (Some(1), Some("drill")));
    assert_eq!((first["drain_gpu_seconds"].as_u64(), first["lost_gpu_seconds"].as_u64()), (Some(0), Some(0)));
    assert_eq!(first["gpu_seconds"].as_u64().unwrap(), 2 * first["seconds"].as_u64().unwrap());
    let day = |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string()[..10].to_string();
    let now = std::time::SystemTime::now();
    let (from, to) = (day(now - Duration::from_secs(86_400)), day(now + Duration::from_secs(86_400)));
    let bill: Value =
        serde_json::from_str(&c.ebb(&["bill", "--from", &from, "--to", &to, "--json"])).unwrap();
    assert_eq!((bill["attempts"].as_u64(), bill["preemptions"].as_u64()), (Some(1), Some(0)), "{bill}");
    assert_eq!((bill["drain_gpu_hours"].as_f64(), bill["lost_gpu_hours"].as_f64()), (Some(0.0), Some(0.0)));
    assert_eq!(bill["total_micro_usd"], first["amount_micro_usd"], "{bill}");
    assert_eq!(bill["lines"][0]["tier"], "preemptible");

    // `ebb show` tells the story.
    let shown = c.ebb(&["show", &id.to_string()]);
    assert!(
        shown.contains("  drill        attempt 1 on node-0") && shown.contains("verdict: ready"),
        "{shown}"
    );
    assert!(shown.contains(&format!("resumed from step {saved_step}")), "{shown}");

    // From a notebook: the SDK's helper drills it again, as attempt 2.
    let sdk = std::process::Command::new("python3")
        .args(["-c", "import json, ebb_sdk; print(json.dumps(ebb_sdk.drill(int(__import__('sys').argv[1]), timeout=60, progress=False)))"])
        .arg(id.to_string())
        .env("PYTHONPATH", repo_root().join("sdk/python"))
        .env("EBB_SERVER", &c.url)
        .env("EBB_TOKEN", &c.admin)
        .env_remove("EBB_CONFIG")
        .output()
        .unwrap();
    assert!(sdk.status.success(), "{}", text(&sdk.stderr));
    let report: Value = serde_json::from_slice(&sdk.stdout).unwrap();
    assert_eq!(
        (report["verdict"].as_str(), report["attempt"].as_u64()),
        (Some("ready"), Some(2)),
        "{report}"
    );
    let job = c.wait_job(id, "attempt 3", Duration::from_secs(10), |j| j["state"] == "running");
    assert_eq!((job["attempt"].as_u64(), job["preemptions"].as_u64()), (Some(3), Some(0)));
    assert_eq!((drills(&c, "ready"), drills(&c, "failed")), (2.0, 0.0), "both drills counted ready");
}

#[test]
fn a_job_that_ignores_the_notice_is_killed_at_the_deadline_and_exceeded_the_window() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "2s", ..Options::default() });
    let id = python(&c, IGNORES);
    saved(&c, id, 2);
    let out = drill(&c, &c.admin, id, &["--json"]);
    assert!(!out.status.success(), "a failed drill exits non-zero");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "failed", "{report}");
    assert_eq!(
        report["failures"],
        serde_json::json!(["exceeded the window: killed at the deadline"]),
        "{report}"
    );
    assert_eq!(
        (report["exit"].as_str(), report["fit_window"].as_bool()),
        (Some("killed at the deadline"), Some(false))
    );
    assert!(report["margin_seconds"].as_f64().unwrap() <= 0.0, "{report}");
    // It saved periodically and resumed from that: only the window failed.
    assert_eq!(report["resumed_step"], report["checkpoint"]["step"], "{report}");
    // Its save was a periodic one, from before it saw the notice (which
    // may be after the server sent it: a save in between counts as after
    // the notice, though the job had not seen it).
    let noticed_at: u64 =
        std::fs::read_to_string(c.checkpoints(id).join("noticed-1")).unwrap().parse().unwrap();
    assert!(
        report["checkpoint"]["step"].as_u64().unwrap() < noticed_at,
        "saved after seeing the notice: {report}"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("job {id}: the drill failed: exceeded the window")), "{stderr}");
    let job = c.job(id);
    assert_eq!((job["preemptions"].as_u64(), job["attempt"].as_u64()), (Some(0), Some(2)));
    assert_eq!(job["usage"][0]["outcome"], "drill");
    assert_eq!((drills(&c, "ready"), drills(&c, "failed")), (0.0, 1.0), "the drill counted failed");
}

#[test]
fn a_job_that_starts_over_did_not_resume() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "5s", ..Options::default() });
    let id = python(&c, STARTS_OVER);
    saved(&c, id, 3);
    let out = drill(&c, &c.admin, id, &[]);
    let said = text(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("verdict: failed"), "{said}");
    let job = c.job(id);
    let d = &job["drill"];
    let saved_step = d["checkpoint"]["step"].as_u64().unwrap();
    assert!(saved_step >= 3, "{d}");
    let failures: Vec<&str> = d["failures"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    let expected = format!(
        "did not resume: attempt 2 reported a checkpoint of step 1, not past the saved step {saved_step}"
    );
    assert!(failures[0].starts_with(&expected), "{failures:?}");
    assert!(said.contains(&format!("  - {}", failures[0])), "{said}");
    assert_eq!((d["fit_window"].as_bool(), d.get("resumed_step")), (Some(true), None));
}

/// A job that saves at its notice but neither loads its save nor saves
/// again: nothing says whether it resumed.
const SILENT: &str = r#"
import time, ebb_sdk
ebb_sdk.watcher()
ckpt = ebb_sdk.CheckpointManager(interval=3600)
print(f"attempt {ebb_sdk.attempt()}", flush=True)
step = 0
while True:
    time.sleep(0.02)
    step += 1
    if ebb_sdk.drain_requested():
        ckpt.save(step, str(step).encode())
        ebb_sdk.exit_now()
"#;

#[test]
fn a_resume_not_reported_within_the_timeout_is_said_and_the_drill_waits_for_it() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "5s", ..Options::default() });
    let id = python(&c, SILENT);
    wait_for("its start", Duration::from_secs(30), || c.output(id).contains("attempt 1").then_some(()));
    let out = c.ebb_as(&c.admin, &["drill", &id.to_string(), "--timeout", "1s", "--json"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("job {id}: resume not confirmed within 1.0s of attempt 2's start")),
        "{stderr}"
    );
    // The report so far: saved, exited in time, started again; no verdict.
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["fit_window"].as_bool(), report["next_attempt"].as_u64()), (Some(true), Some(2)));
    assert!(report.get("verdict").is_none() && report["next_started_ms"].is_u64(), "{report}");
    // The server goes on waiting: the drill is open, the job runs.
    let job = c.job(id);
    assert_eq!((job["state"].as_str(), job["drill"].get("verdict")), (Some("running"), None));
}
