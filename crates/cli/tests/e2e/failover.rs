//! A control plane of two servers on one PostgreSQL: the leader is killed
//! (`kill -9`) or frozen past its lease (SIGSTOP) while a job drains,
//! another runs and a client submits continuously; the other server takes
//! over. Nothing answered is lost, nothing runs twice, the drain keeps its
//! deadline, and the bill is what the processes ran.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::plane::{Plane, Submitter, DRAIN_WINDOW_MS};
use crate::support::{ebb_exe, pid_alive, wait_for};
use serde_json::Value;

/// A job that notes each attempt's pid and start time (ms), and its end
/// when it is let end (not when it is killed).
const NOTED: &str = r#"d="$EBB_CHECKPOINT_DIR"; echo "$EBB_ATTEMPT $$ $(date +%s%3N)" >> "$d/starts"
echo "noted attempt $EBB_ATTEMPT began"
trap 'echo "$EBB_ATTEMPT $(date +%s%3N)" >> "$d/ends"; exit 0' TERM
sleep 600 & wait"#;

/// As `NOTED`, but deaf to the drain notice: it is killed at the deadline.
const DEAF: &str = r#"d="$EBB_CHECKPOINT_DIR"; echo "$EBB_ATTEMPT $$ $(date +%s%3N)" >> "$d/starts"
trap '' TERM
sleep 600 & while true; do wait; done"#;

fn lines(path: &Path) -> Vec<Vec<u64>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
        .collect()
}

fn event_ms(job: &Value, kind: &str, attempt: u64) -> Option<u64> {
    job["events"].as_array().unwrap().iter().find(|e| e["kind"] == kind && e["attempt"] == attempt)?["at_ms"]
        .as_u64()
}

/// A draining job, a running one and a steady stream of submissions, then
/// `fail` done to the leader (server 0); server 1 must take over.
fn survives(name: &str, fail: impl FnOnce(&mut Plane) -> Instant, after: impl FnOnce(&mut Plane)) {
    let mut plane = Plane::start(name);
    let victim = plane.submit(&["--gpus", "2", "--", "bash", "-c", DEAF]);
    plane.wait_job(victim, "running", |j| j["state"] == "running");
    let runner = plane.submit(&["--tier", "on-demand", "--gpus", "2", "--", "bash", "-c", NOTED]);
    let runner_job = plane.wait_job(runner, "running", |j| j["state"] == "running");
    let runner_pid = wait_for("the runner's pid", Duration::from_secs(10), || {
        lines(&plane.checkpoints(runner).join("starts")).first().map(|l| l[1] as i32)
    });
    let began = "noted attempt 1 began";
    wait_for("the runner's output", Duration::from_secs(10), || {
        plane.run(&["logs", &runner.to_string()]).contains(began).then_some(())
    });
    let submitter = Submitter::start(&plane);
    let preemptor = plane.submit(&["--tier", "on-demand", "--gpus", "2", "--", "bash", "-c", NOTED]);
    let draining = plane.wait_job(victim, "draining", |j| j["state"] == "draining");
    let deadline = event_ms(&draining, "drain_notice", 1).unwrap() + DRAIN_WINDOW_MS;
    // The leader fails with submissions under way.
    submitter.wait_answered(5);

    let failed_at = fail(&mut plane);
    let health = plane.wait_role(1, "leader");
    eprintln!("server 1 leads after {:?}: {health}", failed_at.elapsed());
    assert_eq!(health["epoch"], 2, "{health}");
    assert_eq!(health["leader"], plane.urls[1].as_str(), "{health}");
    after(&mut plane);

    plane.wait_job(preemptor, "running", |j| j["state"] == "running");
    // And go on to be answered by the new leader.
    submitter.wait_answered(submitter.answered() + 5);
    let (answered, refused) = submitter.finish();
    eprintln!("{} submissions answered, {refused} not", answered.len());
    assert!(answered.len() >= 10, "too few submissions answered: {}", answered.len());

    // Every submission answered 2xx exists, once; ids never went back.
    let all: Value = serde_json::from_str(&plane.run(&["jobs", "--json", "--all"])).unwrap();
    let ids: Vec<u64> = all.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    for id in &answered {
        assert!(ids.contains(id), "job {id} was answered 2xx and is gone");
    }
    assert!(answered.windows(2).all(|w| w[0] < w[1]), "ids went back: {answered:?}");
    let steady = all.as_array().unwrap().iter().filter(|j| j["name"] == "steady").count();
    assert!(steady >= answered.len() && steady <= answered.len() + refused, "{steady} steady jobs");

    // Its output from before the failover is there, from the new leader.
    let logs = plane.run(&["logs", &runner.to_string()]);
    assert_eq!(logs.matches(began).count(), 1, "{logs}");

    // The running job was never restarted: its one process lives on.
    let job = plane.job(runner);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("running"), Some(1)), "{job}");
    assert_eq!(job["placement"], runner_job["placement"]);
    assert_eq!(lines(&plane.checkpoints(runner).join("starts")).len(), 1);
    assert!(pid_alive(runner_pid), "the running job's process is gone");

    // The draining job was killed at its original deadline, after which
    // (and not before) its preemptor started.
    let victim_job = plane.job(victim);
    let first =
        usage(&victim_job).into_iter().find(|u| u["attempt"] == 1).expect("the drained attempt's usage");
    let ended = first["ended_ms"].as_u64().unwrap();
    assert!(
        ended + 500 >= deadline && ended <= deadline + 1500,
        "drained attempt ended at {ended}, its deadline was {deadline}: {victim_job}"
    );
    assert_eq!(first["outcome"], "preempted");
    let started = event_ms(&plane.job(preemptor), "started", 1).unwrap();
    assert!(started >= ended, "the preemptor started at {started}, before its victim ended at {ended}");

    // Nothing ran twice: the attempts the agents started (each keeps a run
    // directory per attempt) are exactly those the server has a usage
    // record for or has running, each on one node.
    let mut known: Vec<(u64, u64)> = Vec::new();
    for j in all.as_array().unwrap() {
        let id = j["id"].as_u64().unwrap();
        if ["running", "draining", "starting"].contains(&j["state"].as_str().unwrap()) {
            known.push((id, j["attempt"].as_u64().unwrap()));
        }
        if [victim, runner, preemptor].contains(&id) {
            for u in usage(&plane.job(id)) {
                known.push((id, u["attempt"].as_u64().unwrap()));
            }
        }
    }
    known.sort();
    let mut started: Vec<(u64, u64)> =
        ["node-0", "node-1"].iter().flat_map(|n| run_dirs(&plane.dir.join(n))).collect();
    started.sort();
    assert_eq!(started, known, "the agents started other attempts than the server accounts for");
    assert_eq!(known, vec![(victim, 1), (runner, 1), (preemptor, 1)]);

    // The bill is what the processes ran: end the two on-demand jobs, then
    // compare each usage record with the process's own start and end, and
    // the invoice with the records, to the micro-dollar.
    plane.run(&["cancel", &victim.to_string(), &runner.to_string(), &preemptor.to_string()]);
    for id in [victim, runner, preemptor] {
        plane.wait_job(id, "cancelled", |j| j["state"] == "cancelled");
    }
    let mut total = 0i64;
    for id in [victim, runner, preemptor] {
        let job = plane.job(id);
        let starts = lines(&plane.checkpoints(id).join("starts"));
        let ends = lines(&plane.checkpoints(id).join("ends"));
        for u in usage(&job) {
            let attempt = u["attempt"].as_u64().unwrap();
            let start = starts.iter().find(|l| l[0] == attempt).expect("a start noted by the process")[2];
            let (from, to) = (u["started_ms"].as_u64().unwrap(), u["ended_ms"].as_u64().unwrap());
            assert!(from.abs_diff(start) < 1000, "job {id}.{attempt}: metered from {from}, began {start}");
            if let Some(end) = ends.iter().find(|l| l[0] == attempt) {
                assert!(to.abs_diff(end[1]) < 1000, "job {id}.{attempt}: metered to {to}, ended {}", end[1]);
            }
            let seconds = (to - from).div_ceil(1000);
            assert_eq!(u["seconds"].as_u64().unwrap(), seconds, "{u}");
            let gpu_seconds = seconds * u["gpus"].as_u64().unwrap();
            let rate = u["rate_micro_usd"].as_i64().unwrap();
            let amount = (i128::from(rate) * i128::from(gpu_seconds as i64) / 3600) as i64;
            assert_eq!(u["amount_micro_usd"].as_i64().unwrap(), amount, "{u}");
            total += amount;
        }
    }
    // The frozen leader's late submission, if it was applied, ran as the
    // same tenant: it is on the bill too, once it has ended.
    let all: Value = serde_json::from_str(&plane.run(&["jobs", "--json", "--all"])).unwrap();
    let late: Vec<u64> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["name"] == "late")
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    for id in late {
        let _ = plane.ebb(&["cancel", &id.to_string()]);
        let job = plane.wait_job(id, "ended", |j| {
            ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or(""))
        });
        total += usage(&job).iter().map(|u| u["amount_micro_usd"].as_i64().unwrap()).sum::<i64>();
    }
    let day = |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string()[..10].to_string();
    let now = std::time::SystemTime::now();
    let (from, to) = (day(now), day(now + Duration::from_secs(86_400)));
    let bill: Value =
        serde_json::from_str(&plane.run(&["bill", "--from", &from, "--to", &to, "--json"])).unwrap();
    assert_eq!(bill["total_micro_usd"].as_i64().unwrap(), total, "{bill}");
}

/// A job's usage records (none while its first attempt runs).
fn usage(job: &Value) -> Vec<Value> {
    job["usage"].as_array().cloned().unwrap_or_default()
}

/// The attempts an agent started: one run directory each.
fn run_dirs(data_dir: &Path) -> Vec<(u64, u64)> {
    std::fs::read_dir(data_dir.join("run"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (job, attempt) = name.split_once('-')?;
            Some((job.parse().ok()?, attempt.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_leader_killed_mid_drain_loses_nothing_and_runs_nothing_twice() {
    survives(
        "kill",
        |plane| {
            plane.kill_server(0);
            Instant::now()
        },
        |_| {},
    );
}

#[test]
fn a_leader_frozen_past_its_lease_is_fenced_off_and_follows_when_it_wakes() {
    let late = Arc::new(Mutex::new(None));
    let late_out = late.clone();
    survives(
        "stop",
        |plane| {
            plane.signal(0, "-STOP");
            let frozen = Instant::now();
            // A submission to the frozen leader alone waits in its socket.
            let child = Command::new(ebb_exe())
                .args(["submit", "--json", "--name", "late", "--", "true"])
                .current_dir(plane.dir.join("submit"))
                .env("EBB_SERVER", &plane.urls[0])
                .env("EBB_TOKEN", &plane.admin)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // A read through the follower, which forwards it to the frozen
            // leader until it takes over: then it is asked again, of the new
            // leader, and answered while the old one is still frozen.
            let read = Command::new(ebb_exe())
                .args(["nodes", "--json"])
                .env("EBB_SERVER", &plane.urls[1])
                .env("EBB_TOKEN", &plane.admin)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            *late.lock().unwrap() = Some((child, read));
            frozen
        },
        move |plane| {
            let (late, mut read) = late_out.lock().unwrap().take().unwrap();
            let answered = wait_for("the read through the follower", Duration::from_secs(15), || {
                read.try_wait().unwrap()
            });
            let out = read.wait_with_output().unwrap();
            assert!(answered.success(), "{}", String::from_utf8_lossy(&out.stderr));
            plane.signal(0, "-CONT");
            let health = wait_for("the woken leader to follow epoch 2", Duration::from_secs(20), || {
                plane.health(0).filter(|h| h["role"] == "follower" && h["epoch"] == 2)
            });
            assert_eq!(health["leader"], plane.urls[1].as_str());
            let log = plane.server_log(0);
            // Refused by the epoch check at its next batch, or, if it froze
            // inside a transaction, by PostgreSQL ending that session at
            // the idle-in-transaction timeout: either way nothing of it
            // commits.
            assert!(
                log.contains("deposed: this server led at epoch 1, and the database is at epoch 2")
                    || log.contains("idle-in-transaction timeout"),
                "the woken leader's batch was not refused:\n{log}"
            );
            // Whatever the late submission was told, it was applied at most
            // once, and exactly once if it was told it was.
            let out = late.wait_with_output().unwrap();
            let all: Value = serde_json::from_str(&plane.run(&["jobs", "--json", "--all"])).unwrap();
            let late_jobs = all.as_array().unwrap().iter().filter(|j| j["name"] == "late").count();
            assert_eq!(
                late_jobs,
                usize::from(out.status.success()),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        },
    );
}
