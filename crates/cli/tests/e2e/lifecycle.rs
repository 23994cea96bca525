//! Preemption end to end: the real `ebb` binary as server and agents on
//! loopback, jobs as real processes, the CLI as a user runs it.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::{events, pid_alive, read_env, repo_root, wait_for, Cluster, Options, RunAs};
use serde_json::Value;

const VICTIM: &str = r#"env > "$EBB_CHECKPOINT_DIR/env-$EBB_ATTEMPT"
trap 'touch "$EBB_CHECKPOINT_DIR/term-$EBB_ATTEMPT"; sleep 1; date +%s%N > "$EBB_CHECKPOINT_DIR/left-$EBB_ATTEMPT"; exit 0' TERM
while :; do sleep 0.05; done"#;

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

fn get(url: &str, header: Option<(&str, &str)>) -> (u16, String) {
    let mut req = http().get(url);
    if let Some((k, v)) = header {
        req = req.header(k, v);
    }
    let resp = req.send().unwrap();
    (resp.status().as_u16(), resp.text().unwrap())
}

#[test]
fn preemption_delivers_the_drain_and_requeues_the_victim() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, drain_window: "30s", ..Options::default() });
    let victim = c.submit(&["--gpus", "4", "--name", "victim", "--", "bash", "-c", VICTIM]);
    let ckpt = c.checkpoints(victim);
    let env1 = wait_for("the victim to start", Duration::from_secs(20), || {
        std::fs::metadata(ckpt.join("env-1"))
            .ok()
            .filter(|m| m.len() > 0)
            .map(|_| read_env(&ckpt.join("env-1")))
    });
    assert_eq!(env1["CUDA_VISIBLE_DEVICES"], "0,1,2,3");
    assert_eq!(env1["EBB_JOB_ID"], victim.to_string());
    assert_eq!(env1["EBB_ATTEMPT"], "1");
    assert_eq!(env1["EBB_TIER"], "preemptible");
    let meta = env1["EBB_METADATA_URL"].clone();
    assert_eq!(env1["AWS_EC2_METADATA_SERVICE_ENDPOINT"], format!("{meta}/"));
    assert_eq!(format!("http://{}", env1["GCE_METADATA_HOST"]), meta);
    let drain_file = std::path::PathBuf::from(&env1["EBB_DRAIN_FILE"]);
    assert!(!drain_file.exists());

    // Before the notice: every shape says "nothing yet".
    let aws = format!("{meta}/latest/meta-data/spot/instance-action");
    let gcp = format!("{meta}/computeMetadata/v1/instance/preempted");
    let azure = format!("{meta}/metadata/scheduledevents?api-version=2020-07-01");
    assert_eq!(get(&aws, None).0, 404);
    assert_eq!(get(&gcp, Some(("Metadata-Flavor", "Google"))), (200, "FALSE".into()));
    assert_eq!(get(&gcp, None).0, 403, "GCP requires its header");
    let (status, body) = get(&azure, Some(("Metadata", "true")));
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["Events"], serde_json::json!([]));
    let token = http()
        .put(format!("{meta}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .unwrap();
    assert_eq!(token.status().as_u16(), 200, "IMDSv2 token");
    // A GCP client blocking on the change from what it last read (its
    // ETag): answered at once if the change comes before it asks.
    let read = http().get(&gcp).header("Metadata-Flavor", "Google").send().unwrap();
    let etag = read.headers()["etag"].to_str().unwrap().to_string();
    let waiter = {
        let gcp = format!("{gcp}?wait_for_change=true&last_etag={etag}");
        std::thread::spawn(move || get(&gcp, Some(("Metadata-Flavor", "Google"))))
    };

    let od = c.submit(&[
        "--tier",
        "on-demand",
        "--gpus",
        "4",
        "--",
        "bash",
        "-c",
        r#"date +%s%N > "$EBB_CHECKPOINT_DIR/began"; echo "$CUDA_VISIBLE_DEVICES" > "$EBB_CHECKPOINT_DIR/gpus"; sleep 1"#,
    ]);
    wait_for("the victim's SIGTERM", Duration::from_secs(20), || ckpt.join("term-1").exists().then_some(()));
    // While the victim is still saving (it sleeps 1 s after the signal):
    let notice: Value = serde_json::from_slice(&std::fs::read(&drain_file).unwrap()).unwrap();
    assert_eq!(notice["action"], "preempt");
    assert!(notice["reason"].as_str().unwrap().contains(&format!("job {od}")));
    let (status, body) = get(&aws, None);
    assert_eq!(status, 200);
    let action: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(action["action"], "terminate");
    assert_eq!(&action["time"].as_str().unwrap()[..19], &notice["deadline"].as_str().unwrap()[..19]);
    assert_eq!(get(&gcp, Some(("Metadata-Flavor", "Google"))), (200, "TRUE".into()));
    assert_eq!(waiter.join().unwrap(), (200, "TRUE".into()), "wait_for_change returned on the notice");
    let events_doc: Value = serde_json::from_str(&get(&azure, Some(("Metadata", "true"))).1).unwrap();
    let event = &events_doc["Events"][0];
    assert_eq!(event["EventType"], "Preempt");
    assert_eq!(event["EventStatus"], "Scheduled");
    assert!(event["NotBefore"].as_str().unwrap().ends_with("GMT"), "RFC 1123: {}", event["NotBefore"]);
    assert_eq!(event["DurationInSeconds"], -1);

    // The victim exits, the on-demand job starts on the freed GPUs: its
    // start went to the node with the notice, and the node held it back
    // until the victim had gone.
    let od_job = c.wait_state(od, "succeeded");
    assert_eq!(std::fs::read_to_string(c.checkpoints(od).join("gpus")).unwrap().trim(), "0,1,2,3");
    let stamp = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap().trim().parse::<u128>().unwrap();
    let (left, began) = (stamp(ckpt.join("left-1")), stamp(c.checkpoints(od).join("began")));
    assert!(began > left, "the preemptor began {left} - {began} ns before its victim left");
    let placed = od_job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "placed").unwrap();
    assert_eq!(placed["detail"]["from_hold"], true, "{placed}");
    // The victim is requeued as attempt 2 with the same checkpoint directory,
    // and runs again once the GPUs are free.
    let env2 = wait_for("the victim's second attempt", Duration::from_secs(20), || {
        std::fs::metadata(ckpt.join("env-2"))
            .ok()
            .filter(|m| m.len() > 0)
            .map(|_| read_env(&ckpt.join("env-2")))
    });
    assert_eq!(env2["EBB_ATTEMPT"], "2");
    assert_eq!(env2["EBB_CHECKPOINT_DIR"], env1["EBB_CHECKPOINT_DIR"]);
    preempted_and_resumed(&c, victim, od);
}

/// The same preemption on simulated nodes (one `ebb agent
/// --simulate-nodes 2` process), its jobs driven by their `EBB_SIM_*`
/// variables: the victim saves for a second at its notice, reports its
/// checkpoint and exits within the window; it is requeued and resumes.
#[test]
fn preemption_delivers_the_drain_and_requeues_the_victim_on_simulated_nodes() {
    let c = Cluster::start(Options {
        nodes: 1,
        simulated_nodes: 2,
        gpus: 4,
        drain_window: "30s",
        ..Options::default()
    });
    // One node is held by on-demand work, which is never drained.
    let held = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "train"]);
    c.wait_state(held, "running");
    let victim =
        c.submit(&["--gpus", "4", "--name", "victim", "--env", "EBB_SIM_SAVE=1", "--", "train", "--resume"]);
    c.wait_state(victim, "running");
    let od = c.submit(&["--tier", "on-demand", "--gpus", "4", "--env", "EBB_SIM_DURATION=1s", "--", "train"]);
    let job = preempted_and_resumed(&c, victim, od);
    // It saved for a second after its notice, then said so and exited 0.
    let at = |kind: &str| {
        let e = job["events"].as_array().unwrap().iter().find(|e| e["kind"] == kind && e["attempt"] == 1);
        e.unwrap_or_else(|| panic!("no {kind} of attempt 1: {job}")).clone()
    };
    let (notice, checkpoint, exited) = (at("drain_notice"), at("checkpoint"), at("exited"));
    assert_eq!((exited["detail"]["code"].as_i64(), exited["detail"]["signal"].as_i64()), (Some(0), None));
    let saved_ms = checkpoint["at_ms"].as_u64().unwrap() - notice["at_ms"].as_u64().unwrap();
    assert!((900..30_000).contains(&saved_ms), "checkpoint {saved_ms} ms after the notice");
    assert!(exited["at_ms"].as_u64() >= checkpoint["at_ms"].as_u64(), "{checkpoint} {exited}");
    assert_eq!(job["last_checkpoint"]["attempt"], 1);
    assert_eq!(job["last_checkpoint"]["step"], 1);
    assert_eq!(job["last_checkpoint"]["seconds"], 1.0);
    let first = job["usage"].as_array().unwrap().iter().find(|u| u["attempt"] == 1).unwrap().clone();
    assert!(first["lost_gpu_seconds"].as_u64().unwrap() <= 4, "saved at the exit: {first}");
    assert_eq!(c.job(held)["state"], "running");
    let log = c.output(victim);
    assert!(log.contains("simulated attempt on node-0-0000") && log.contains("runs until stopped"), "{log}");
}

/// What a preemption leaves, whatever runs the jobs: the preemptor ran to
/// its end, the victim was requeued and runs again as attempt 2, `ebb
/// show` tells the story, and the usage records bill each attempt as what
/// it was. Returns the victim as it is then.
fn preempted_and_resumed(c: &Cluster, victim: u64, od: u64) -> Value {
    let od_job = c.wait_state(od, "succeeded");
    assert!(events(&od_job).contains(&"preempting".to_string()));
    let job = c.wait_job(victim, "running attempt 2", Duration::from_secs(10), |j| {
        j["state"] == "running" && j["attempt"] == 2
    });
    assert_eq!(job["preemptions"], 1);
    let kinds = events(&job);
    for kind in ["submitted", "placed", "started", "drain_notice", "exited", "requeued"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} missing from {kinds:?}");
    }
    // And `ebb show` tells the story to a person.
    let shown = c.ebb(&["show", &victim.to_string()]);
    assert!(shown.contains("drain_notice") && shown.contains(&format!("preempted by job {od}")), "{shown}");
    // Attempt 1 is billed as preempted, its drain included; the preemptor
    // as completed.
    let usage = |job: &Value| job["usage"].as_array().cloned().unwrap_or_default();
    let victim_usage = usage(&job);
    assert_eq!(victim_usage.len(), 1, "attempt 2 still runs: {victim_usage:?}");
    let first = &victim_usage[0];
    assert_eq!((first["attempt"].as_u64(), first["outcome"].as_str()), (Some(1), Some("preempted")));
    assert_eq!((first["tier"].as_str(), first["gpus"].as_u64()), (Some("preemptible"), Some(4)));
    assert_eq!(first["gpu_seconds"].as_u64().unwrap(), 4 * first["seconds"].as_u64().unwrap());
    assert!(first["drain_gpu_seconds"].as_u64().unwrap() >= 4, "a second of drain at least: {first}");
    let od_usage = usage(&od_job);
    assert_eq!(od_usage.len(), 1, "{od_usage:?}");
    assert_eq!(
        (od_usage[0]["outcome"].as_str(), od_usage[0]["tier"].as_str()),
        (Some("completed"), Some("on-demand"))
    );
    assert_eq!(od_usage[0]["gpu_seconds"].as_u64().unwrap(), 4 * od_usage[0]["seconds"].as_u64().unwrap());
    job
}

#[test]
fn a_victim_that_ignores_sigterm_is_killed_at_the_deadline_and_its_gpus_go_to_the_preemptor() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "2s", ..Options::default() });
    let stubborn =
        c.submit(&["--gpus", "2", "--", "bash", "-c", "trap '' TERM; while :; do sleep 0.05; done"]);
    c.wait_state(stubborn, "running");
    let first = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "30"]);
    let notice_at = Instant::now();
    c.wait_state(stubborn, "draining");
    // A second on-demand job may not take the GPUs held for the first.
    let second = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "30"]);
    let started = c.wait_state(first, "running");
    let waited = notice_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "the preemptor started {waited:?} after the notice, before the deadline"
    );
    assert_eq!(c.job(second)["state"], "queued");
    assert_eq!(started["placement"][0]["gpus"], serde_json::json!([0, 1]));
    let victim = c.job(stubborn);
    let exited = victim["events"].as_array().unwrap().iter().find(|e| e["kind"] == "exited").unwrap().clone();
    assert_eq!(exited["detail"]["signal"], 9, "SIGKILL at the deadline: {exited}");
    assert_eq!(victim["state"], "queued");
    c.assert_no_double_booking();
}

/// A preemptor's start goes to the node with its victim's notice; the
/// preemptor cancelled during the drain is withdrawn there, and the GPUs
/// go to the next job once the victim has left.
#[test]
fn a_preemptor_cancelled_while_its_victim_drains_never_starts() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "30s", ..Options::default() });
    let victim = c.submit(&[
        "--gpus",
        "2",
        "--",
        "bash",
        "-c",
        r#"trap 'while [ ! -e "$EBB_CHECKPOINT_DIR/release" ]; do sleep 0.05; done; exit 0' TERM; while :; do sleep 0.05; done"#,
    ]);
    c.wait_state(victim, "running");
    let od = c.submit(&[
        "--tier",
        "on-demand",
        "--gpus",
        "2",
        "--",
        "bash",
        "-c",
        r#"touch "$EBB_CHECKPOINT_DIR/began"; sleep 30"#,
    ]);
    c.wait_state(victim, "draining");
    c.ebb(&["cancel", &od.to_string()]);
    c.wait_state(od, "cancelled");
    // The node withdrew it while it waited: it never starts.
    let log = c.dir.join("logs").join("node-0.log");
    wait_for("the start withdrawn", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .any(|l| {
                l.contains("start withdrawn before its GPUs were free") && l.contains(&format!("job={od} "))
            })
            .then_some(())
    });
    let next = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "30"]);
    std::fs::write(c.checkpoints(victim).join("release"), "").unwrap();
    c.wait_state(next, "running");
    assert!(!c.checkpoints(od).join("began").exists(), "the cancelled preemptor ran");
    assert_eq!(c.job(od)["state"], "cancelled");
    c.assert_no_double_booking();
}

#[test]
fn non_preemptible_work_is_never_drained_and_acknowledged_jobs_survive_kill_9() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "30s", ..Options::default() });
    let od = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "60"]);
    c.wait_state(od, "running");
    let waiting = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "60"]);
    c.after_passes(2);
    assert_eq!(c.job(waiting)["state"], "queued", "nothing to preempt: an on-demand job waits");
    assert!(!events(&c.job(od)).contains(&"drain_notice".to_string()));
    // Acknowledged submissions, then kill -9 of the server at once.
    let acknowledged: Vec<u64> =
        (0..10).map(|i| c.submit(&["--name", &format!("acked-{i}"), "--", "true"])).collect();
    c.kill_server();
    c.start_server();
    let ids: Vec<u64> = c.jobs().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    for id in &acknowledged {
        assert!(ids.contains(id), "acknowledged job {id} lost across kill -9");
    }
    // The running job is still the running job; the agent reconnected.
    c.wait_nodes_up(1);
    let job = c.job(od);
    assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("running"), Some(1)));
    c.assert_no_double_booking();
    // Cancel it: the waiting on-demand job gets the GPUs, then the rest run.
    c.ebb(&["cancel", &od.to_string()]);
    c.wait_state(od, "cancelled");
    c.wait_state(waiting, "running");
    c.assert_no_double_booking();
    assert!(!events(&c.job(waiting)).contains(&"drain_notice".to_string()));
}

#[test]
fn a_killed_agent_requeues_its_jobs_and_its_restart_runs_no_stale_attempt() {
    let mut c =
        Cluster::start(Options { nodes: 1, gpus: 2, heartbeat_timeout: "1500ms", ..Options::default() });
    let job = c.submit_sleeper(2);
    let pid = c.sleeper_pid(job, 1);
    assert!(pid_alive(pid));
    // Once the start is reported, the agent has recorded the process group.
    c.wait_state(job, "running");
    // The server meters a lost node's work up to its last contact: let the
    // agent be heard once after the start, so that the attempt has run.
    let started = c.job(job)["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "started")
        .map(|e| e["at"].as_str().unwrap().to_string())
        .expect("a started event");
    wait_for("a heartbeat after the start", Duration::from_secs(10), || {
        let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
        // Both times are RFC 3339 in UTC to the millisecond: they sort as strings.
        (nodes[0]["last_heartbeat"].as_str().unwrap() > started.as_str()).then_some(())
    });
    c.kill_agent(0);
    let requeued = c.wait_job(job, "requeued as lost", Duration::from_secs(20), |j| j["state"] == "queued");
    let last = requeued["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["kind"].as_str(), last["detail"]["reason"].as_str()), (Some("requeued"), Some("lost")));
    assert_eq!(requeued["preemptions"], 0, "lost is not preempted");
    assert_eq!(requeued["retries"], 0, "lost is not failed");
    assert!(pid_alive(pid), "the orphaned attempt still runs while its agent is gone");
    c.start_agent(0);
    c.wait_nodes_up(1);
    wait_for("the stale attempt to be killed", Duration::from_secs(10), || (!pid_alive(pid)).then_some(()));
    let again = c.wait_job(job, "attempt 2 running", Duration::from_secs(20), |j| {
        j["state"] == "running" && j["attempt"] == 2
    });
    assert_eq!(again["placement"][0]["node"], "node-0");
    let pid2 = c.sleeper_pid(job, 2);
    assert!(pid_alive(pid2) && !pid_alive(pid));
    // The lost node is an unannounced interruption: it is in attempt 2's
    // recommended checkpoint interval, and so is the work attempt 1 lost.
    let why = again["checkpoint_interval_why"].as_str().unwrap();
    assert!(why.contains("from 1 unannounced interruption"), "{why}");
    let lost = last["detail"]["lost_gpu_seconds"].as_f64().unwrap();
    assert!(lost > 0.0, "attempt 1 ran without a checkpoint: its work was lost");
}

/// A job's argv is run as given, never through a shell, and the CLI names
/// a refusal as the API does. What each tenant may see and touch, and how
/// every refusal reads, is tested in-process
/// (`crates/server/tests/writer/requests.rs`).
#[test]
fn argv_is_never_passed_through_a_shell_and_the_cli_names_a_refusal() {
    let c = Cluster::start(Options::default());
    let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", "team-a", "--json"])).unwrap();
    let a = v["token"].as_str().unwrap().to_string();
    let job = c.submit_as(&a, &["--", "/bin/echo", "$HOME; touch /tmp/ebb-shell-test"]);
    c.wait_state(job, "succeeded");
    let out = c.ebb_as(&a, &["logs", &job.to_string()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "$HOME; touch /tmp/ebb-shell-test\n");
    assert!(!std::path::Path::new("/tmp/ebb-shell-test").exists());
    // The CLI says what the API said, and exits non-zero.
    let out = c.ebb_as(&a, &["submit", "--gpus", "0", "--", "true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpus: must be between 1"));
    let metrics = c.metrics();
    assert!(metrics.contains("ebb_jobs{tier=\"preemptible\",state=\"succeeded\"} 1"), "{metrics}");
}

#[test]
fn job_scripts_arrays_and_operator_drain_and_reclaim() {
    let c = Cluster::start(Options { nodes: 2, gpus: 2, drain_window: "5s", ..Options::default() });
    // A job script: its #EBB lines carry the flags, --array makes tasks.
    let script = c.dir.join("job.sh");
    std::fs::write(&script, "#!/bin/bash\n#EBB --gpus 2 --name scripted\n#EBB --env GREETING=hello\necho \"$GREETING task=$EBB_TASK_INDEX gpus=$CUDA_VISIBLE_DEVICES\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = c.ebb(&["submit", "--json", "--array", "0-2", script.to_str().unwrap()]);
    let submitted: Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<u64> = submitted["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 3);
    for (index, id) in ids.iter().enumerate() {
        let job = c.wait_state(*id, "succeeded");
        assert_eq!(job["gpus"], 2);
        assert_eq!(job["name"], format!("scripted[{index}]"));
        let logs = c.ebb(&["logs", &id.to_string()]);
        assert_eq!(logs, format!("hello task={index} gpus=0,1\n"));
    }
    // Operator drain: the node's preemptible job gets the window, its
    // on-demand job runs on, and nothing new lands there.
    let pre = c.submit(&["--gpus", "2", "--", "sleep", "600"]);
    let od = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "600"]);
    let pre_node = c.wait_state(pre, "running")["placement"][0]["node"].as_str().unwrap().to_string();
    let od_node = c.wait_state(od, "running")["placement"][0]["node"].as_str().unwrap().to_string();
    assert_ne!(pre_node, od_node);
    let drained: Value = serde_json::from_str(&c.ebb(&["drain", &pre_node, "--json"])).unwrap();
    assert_eq!(drained["status"], "draining");
    let requeued =
        c.wait_job(pre, "requeued by the drain", Duration::from_secs(20), |j| j["state"] == "queued");
    let notice =
        requeued["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").unwrap().clone();
    assert!(
        notice["detail"]["reason"].as_str().unwrap().contains(&format!("node {pre_node} drained")),
        "{notice}"
    );
    c.after_passes(2);
    assert_eq!(c.job(pre)["state"], "queued", "the drained node takes no new work");
    assert_eq!(c.job(od)["state"], "running");
    // Reclaim: with the on-demand job gone, the preemptible one runs on the
    // other node; reclaiming its 2 GPUs drains it and keeps it off.
    c.ebb(&["cancel", &od.to_string()]);
    let again = c.wait_job(pre, "running again", Duration::from_secs(20), |j| j["state"] == "running");
    assert_eq!(again["placement"][0]["node"], od_node.as_str());
    let reclaimed: Value = serde_json::from_str(&c.ebb(&["reclaim", "--gpus", "2", "--json"])).unwrap();
    assert_eq!(reclaimed["preemptible_limit"], 0);
    let job = c.wait_job(pre, "reclaimed", Duration::from_secs(20), |j| {
        j["state"] == "queued" && j["preemptions"] == 2
    });
    assert!(events(&job).iter().filter(|k| *k == "drain_notice").count() == 2);
    c.after_passes(2);
    assert_eq!(c.job(pre)["state"], "queued", "preemptible work stays under the reclaim limit");
    c.assert_no_double_booking();
}

#[test]
fn logs_follow_a_running_job_live() {
    use std::io::BufRead;
    let c = Cluster::start(Options::default());
    let job = c.submit(&["--", "bash", "-c", "echo one; sleep 1.5; echo two"]);
    c.wait_state(job, "running");
    let mut follow = std::process::Command::new(support::ebb_exe())
        .args(["logs", "-f", &job.to_string()])
        .env("EBB_SERVER", &c.url)
        .env("EBB_TOKEN", &c.admin)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "one");
    assert_eq!(c.job(job)["state"], "running", "the first line arrived while the job still ran");
    assert_eq!(lines.next().unwrap().unwrap(), "two");
    assert!(lines.next().is_none(), "follow ends when the job does");
    assert!(follow.wait().unwrap().success());
    assert_eq!(c.job(job)["state"], "succeeded");

    // A job that has not started: what it waits for, once, then its output.
    let filler = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "600"]);
    c.wait_state(filler, "running");
    let queued = c.submit(&["--", "echo", "three"]);
    let mut follow = std::process::Command::new(support::ebb_exe())
        .args(["logs", "-f", &queued.to_string()])
        .env("EBB_SERVER", &c.url)
        .env("EBB_TOKEN", &c.admin)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let said = std::io::BufReader::new(follow.stderr.take().unwrap()).lines().next().unwrap().unwrap();
    assert!(said.starts_with(&format!("ebb logs: job {queued} is queued: ")), "{said}");
    assert!(said.ends_with("; its output follows once it starts"), "{said}");
    c.ebb(&["cancel", &filler.to_string()]);
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "three");
    assert!(follow.wait().unwrap().success());
}

#[test]
fn a_server_restarted_mid_drain_keeps_the_hold_and_evicts_no_one_else() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 4, drain_window: "60s", ..Options::default() });
    let bystander = c.submit(&["--gpus", "2", "--", "sleep", "600"]);
    c.wait_state(bystander, "running");
    // Started later, so it has lost less work: the victim. It stays in its
    // drain until the test releases it.
    let slow = c.submit(&[
        "--gpus",
        "2",
        "--",
        "bash",
        "-c",
        r#"trap '' TERM; touch "$EBB_CHECKPOINT_DIR/deaf"; while [ ! -e "$EBB_CHECKPOINT_DIR/release" ]; do sleep 0.05; done"#,
    ]);
    c.wait_state(slow, "running");
    wait_for("the victim to ignore its signal", Duration::from_secs(20), || {
        c.checkpoints(slow).join("deaf").exists().then_some(())
    });
    let od = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "600"]);
    c.wait_state(slow, "draining");
    c.kill_server();
    c.start_server();
    c.wait_nodes_up(1);
    c.after_passes(3);
    assert_eq!(c.job(od)["state"], "queued");
    let bystander_job = c.job(bystander);
    assert_eq!(bystander_job["state"], "running");
    assert!(!events(&bystander_job).contains(&"drain_notice".to_string()), "a second victim was drained");
    std::fs::write(c.checkpoints(slow).join("release"), "").unwrap();
    let started = c.wait_state(od, "running");
    let slow_gpus = c.job(slow)["events"].as_array().unwrap().iter().find(|e| e["kind"] == "placed").unwrap()
        ["detail"]["placement"][0]["gpus"]
        .clone();
    assert_eq!(started["placement"][0]["gpus"], slow_gpus, "the preemptor got the victim's GPUs");
    assert_eq!(c.job(bystander)["state"], "running");
    c.assert_no_double_booking();
}

#[test]
fn an_agent_back_from_a_partition_stops_the_attempt_the_server_replaced() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, heartbeat_timeout: "1s", ..Options::default() });
    let job = c.submit_sleeper(2);
    let pid1 = c.sleeper_pid(job, 1);
    c.freeze_agent(0, true);
    let requeued = c.wait_job(job, "requeued as lost", Duration::from_secs(20), |j| j["state"] == "queued");
    assert_eq!(requeued["attempt"], 1);
    c.freeze_agent(0, false);
    // Back: the agent learns it was declared lost, rejoins, is told to kill
    // attempt 1, and runs attempt 2 instead.
    c.wait_job(job, "attempt 2 running", Duration::from_secs(20), |j| {
        j["state"] == "running" && j["attempt"] == 2
    });
    wait_for("the replaced attempt to stop", Duration::from_secs(10), || (!pid_alive(pid1)).then_some(()));
    let pid2 = c.sleeper_pid(job, 2);
    assert!(pid_alive(pid2));
    c.assert_no_double_booking();
}

#[test]
fn a_service_with_restart_always_runs_again_after_each_exit_until_cancelled() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let script = r#"echo "run $EBB_ATTEMPT"; sleep 0.2; exit $(( EBB_ATTEMPT % 2 ))"#;
    let service = c.submit(&[
        "--tier",
        "on-demand",
        "--restart",
        "always",
        "--name",
        "api",
        "--",
        "bash",
        "-c",
        script,
    ]);
    let job =
        c.wait_job(service, "a third run", Duration::from_secs(30), |j| j["attempt"].as_u64() >= Some(3));
    // Exits with 1 and 0 alike: restarted, never failed, never retried.
    assert_ne!(job["state"], "failed");
    assert_eq!((job["retries"].as_u64(), job["preemptions"].as_u64()), (Some(0), Some(0)));
    let restarts = job["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "requeued" && e["detail"]["reason"] == "restart always")
        .count();
    assert!(restarts >= 2, "{job}");
    c.ebb(&["cancel", &service.to_string()]);
    let cancelled = c.wait_state(service, "cancelled");
    let attempts = cancelled["attempt"].as_u64().unwrap();
    c.after_passes(3);
    assert_eq!(c.job(service)["attempt"].as_u64(), Some(attempts), "a cancelled service does not come back");
    // Every run is billed, each with its own outcome.
    let usage = c.job(service)["usage"].as_array().unwrap().clone();
    assert!(
        usage.iter().any(|u| u["outcome"] == "failed") && usage.iter().any(|u| u["outcome"] == "completed")
    );
    let bad = c.ebb_as(&c.admin, &["submit", "--restart", "sometimes", "--", "true"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("restart: expected never or always"));
}

/// An agent's polls, by who answered them: (the writer, the quiet line,
/// the wake that carried their commands).
fn polls(c: &Cluster) -> (f64, f64, f64) {
    let text = c.metrics();
    let value = |answered: &str| {
        let series = format!("ebb_agent_polls_total{{answered=\"{answered}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)?.parse().ok()).unwrap()
    };
    (value("writer"), value("quiet"), value("woken"))
}

/// Waits until the node's next poll reaches the writer: it has seen what
/// was committed before, and its next poll is on its way to wait.
fn next_writer_poll(c: &Cluster) {
    let seen = polls(c).0;
    wait_for("the node's next poll at the writer", Duration::from_secs(20), || {
        (polls(c).0 > seen).then_some(())
    });
}

fn last_heartbeat(c: &Cluster) -> String {
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    nodes[0]["last_heartbeat"].as_str().unwrap().to_string()
}

#[test]
fn an_idle_nodes_polls_are_answered_without_the_writer_and_still_count_as_contact() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, heartbeat_timeout: "1500ms", ..Options::default() });
    // Idle at a 200 ms interval: about 5 polls a second, all but the first
    // answered from the node's quiet line.
    // Counted until five quiet polls came (about a second; longer on a
    // loaded machine), not over a fixed sleep, from its first quiet one.
    wait_for("the idle node's first quiet poll", Duration::from_secs(20), || {
        (polls(&c).1 >= 1.0).then_some(())
    });
    let (writer0, quiet0, _) = polls(&c);
    let heard0 = last_heartbeat(&c);
    let (writer1, _) = wait_for("five quiet polls", Duration::from_secs(20), || {
        let (writer, quiet, _) = polls(&c);
        (quiet - quiet0 >= 5.0).then_some((writer, quiet))
    });
    assert!(writer1 - writer0 <= 1.0, "polls to the writer {writer0} -> {writer1}");
    // Past the 1.5 s heartbeat timeout with quiet polls alone (the time
    // is what is tested): their contact is applied, the node's last
    // heartbeat moves on, and it stays up.
    std::thread::sleep(Duration::from_millis(1_600));
    let heard1 = last_heartbeat(&c);
    assert!(heard1 > heard0, "last heartbeat {heard0} -> {heard1}");
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["status"], "up", "{nodes}");

    // A job for the quiet node is delivered to the poll waiting there
    // (woken by the commit, it takes the start from the writer); while it
    // runs, the node is not quiet and its polls go to the writer.
    let job = c.submit_sleeper(1);
    c.wait_state(job, "running");
    next_writer_poll(&c);
    let (writer2, quiet2, _) = polls(&c);
    let quiet3 = wait_for("three polls of the busy node at the writer", Duration::from_secs(20), || {
        let (writer, quiet, _) = polls(&c);
        (writer - writer2 >= 3.0).then_some(quiet)
    });
    assert_eq!(quiet3, quiet2, "a busy node's polls are not quiet");
    // A start for the busy node's waiting poll: the commit that queues it
    // wakes the poll, which answers with it where it waits, with no second
    // trip to the writer. Up to three tries: a commit that lands between an
    // answer and the next poll is answered by the writer.
    let mut woken = false;
    for _ in 0..3 {
        next_writer_poll(&c);
        let before = polls(&c).2;
        let second = c.submit_sleeper(1);
        c.wait_state(second, "running");
        woken = polls(&c).2 > before;
        c.ebb(&["cancel", &second.to_string()]);
        c.wait_state(second, "cancelled");
        if woken {
            break;
        }
    }
    assert!(woken, "no start reached a waiting poll with the wake");
    c.ebb(&["cancel", &job.to_string()]);
    c.wait_state(job, "cancelled");
    let quiet4 = polls(&c).1;
    wait_for("the node to be quiet again", Duration::from_secs(10), || (polls(&c).1 > quiet4).then_some(()));

    // A quiet node that goes silent is lost at the timeout as any other,
    // and joins again when it comes back.
    c.freeze_agent(0, true);
    wait_for("the silent node to be lost", Duration::from_secs(10), || {
        let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
        (nodes[0]["status"] == "lost").then_some(())
    });
    c.freeze_agent(0, false);
    c.wait_nodes_up(1);
    let job = c.submit_sleeper(1);
    c.wait_state(job, "running");
}

/// Alice's job, through the clouds' own clients unchanged: `ec2-metadata`
/// (given the endpoint as its `service_url`, as it has no variable) and
/// `google-auth` (which reads `GCE_METADATA_HOST`) each poll for the
/// notice; on it, the job prints what each saw and exits in its window.
const CLOUD_CLIENTS: &str = r#"
import os, signal, sys, time
from ec2_metadata import EC2Metadata
import google.auth.transport.requests
from google.auth.compute_engine import _metadata
with open(os.path.join(os.environ["EBB_CHECKPOINT_DIR"], "endpoint"), "w") as f:
    f.write(os.environ["EBB_METADATA_URL"])
aws = EC2Metadata()
aws.service_url = os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] + "latest/"
aws.metadata_url = aws.service_url + "meta-data/"
gcp = google.auth.transport.requests.Request()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clients say when to go
print("before: aws", aws.spot_instance_action, "gcp", _metadata.get(gcp, "instance/preempted"), flush=True)
while True:
    action = aws.spot_instance_action
    preempted = _metadata.get(gcp, "instance/preempted")
    if action is not None and preempted == "TRUE":
        print("aws:", action.action, action.time.strftime("%Y-%m-%dT%H:%M:%S"), "gcp:", preempted, flush=True)
        sys.exit(0)
    time.sleep(0.1)
"#;

/// Bob's job: every open port on the node's loopback, and what each
/// answers to what an attacker would send an endpoint.
const SCANNER: &str = r#"
import concurrent.futures, json, socket, urllib.request, urllib.error
opened = []
for port in range(32768, 61000):
    s = socket.socket()
    s.settimeout(0.05)
    if s.connect_ex(("127.0.0.1", port)) == 0:
        opened.append(port)
    s.close()
print("open", " ".join(map(str, opened)), flush=True)
tries = [("GET", "/", None), ("GET", "/ebb/v1/notice", None),
         ("POST", "/ebb/v1/checkpoint", {"step": 999999}), ("POST", "/ebb/v1/progress", {"fraction": 0.0001}),
         ("POST", "/ebb/v1/resumed", {"step": 1}), ("PUT", "/latest/api/token", None),
         ("GET", "/latest/meta-data/spot/instance-action", None),
         ("GET", "/computeMetadata/v1/instance/preempted", None), ("GET", "/metadata/scheduledevents", None)]
def probe(port):
    # Every port is tried at once: the loopback of a busy node (other
    # clusters' servers and endpoints) has many open ports.
    found = []
    for prefix in ["", "/" + "0" * 32]:
        for method, path, body in tries:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request("http://127.0.0.1:%d%s%s" % (port, prefix, path), data, method=method,
                                         headers={"Metadata-Flavor": "Google", "Metadata": "true"})
            try:
                with urllib.request.urlopen(req, timeout=2) as answer:
                    text = answer.read(300).decode(errors="replace")
                    found.append(" ".join(map(str, ["ANSWERED", port, prefix + path, answer.status, text.replace("\n", " ")[:200]])))
            except urllib.error.HTTPError as e:
                # Another test's server may reset the connection mid-body.
                try:
                    text = e.read(300).decode(errors="replace")
                except Exception:
                    text = ""
                if "job" in text or "preempt" in text:
                    found.append(" ".join(map(str, ["NAMED", port, prefix + path, e.code, text[:200]])))
            except Exception:
                pass
    return found
with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
    for found in pool.map(probe, opened):
        for line in found:
            print(line, flush=True)
print("scanned", flush=True)
"#;

/// Bob's job scanned the node's loopback, found Alice's endpoint by
/// `GET /` (which named her job), reported a checkpoint she never took
/// (her lost work read 0, so she was drained in Bob's place), faked her
/// progress and read her notice. Each endpoint answers its own attempt
/// alone now: Bob's scan finds her port and gets a bare 404 everywhere,
/// the server hears nothing, and the clouds' real clients in her job
/// still see her notice.
#[test]
fn another_tenants_job_cannot_use_an_attempts_endpoint_and_the_clouds_clients_see_their_notice() {
    let c = Cluster::start(Options {
        nodes: 1,
        gpus: 4,
        run_as: Some(RunAs { tenants: vec![], default: None }),
        ..Options::default()
    });
    let token = |name: &str| {
        let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let (alice, bob) = (token("alice"), token("bob"));
    // Each job runs as its tenant's own uid: the system's python3, with the
    // clients scripts/test installed for it.
    let python = "/usr/bin/python3";
    let installed = repo_root().join("target/py-clients");
    assert!(
        installed.join("ec2_metadata").is_dir(),
        "the clouds' clients are not in {} (scripts/test installs them)",
        installed.display()
    );
    let clients = format!("PYTHONPATH={}", installed.display());
    let victim = c.submit_as(&alice, &["--gpus", "2", "--env", &clients, "--", python, "-c", CLOUD_CLIENTS]);
    let endpoint = wait_for("alice's endpoint", Duration::from_secs(30), || {
        std::fs::read_to_string(c.checkpoints(victim).join("endpoint")).ok().filter(|e| !e.is_empty())
    });
    wait_for("alice's clients to ask", Duration::from_secs(30), || {
        c.output(victim).contains("before:").then_some(())
    });
    assert!(c.output(victim).starts_with("before: aws None gcp FALSE"), "{}", c.output(victim));
    let port: u16 =
        endpoint.trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().parse().unwrap();

    let scan = c.submit_as(&bob, &["--gpus", "1", "--", python, "-c", SCANNER]);
    let scanned = c.wait_job(scan, "the scan", Duration::from_secs(120), |j| j["state"] == "succeeded");
    let out = c.output(scan);
    assert!(out.ends_with("scanned\n"), "{out} {scanned}");
    let open: Vec<u16> = out.lines().next().unwrap().split(' ').skip(1).map(|p| p.parse().unwrap()).collect();
    assert!(open.contains(&port), "the scan did not reach alice's port {port}: {out}");
    // What got through: any answer from her endpoint's port but a bare
    // 404, or an answer anywhere that names her job. (Other servers on the
    // loopback, of tests running beside this one, answer what they serve.)
    let port_text = port.to_string();
    let names_her_job =
        |l: &str| l.contains(&format!("job {victim}")) || l.contains(&format!("\"job\":{victim}"));
    let through: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ANSWERED") || l.starts_with("NAMED"))
        .filter(|l| l.split(' ').nth(1) == Some(port_text.as_str()) || names_her_job(l))
        .collect();
    assert!(through.is_empty(), "bob's job got through: {through:?}");
    let job = c.job(victim);
    assert!(job["checkpoint"].is_null() || job["checkpoint"]["last"].is_null(), "a forged checkpoint: {job}");
    assert!(!events(&job).iter().any(|e| e == "checkpoint" || e == "progress"), "{job}");

    // Her own notice reaches her through both clouds' clients.
    let od = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "1"]);
    let log = wait_for("alice's clients to see the notice", Duration::from_secs(30), || {
        let out = c.output(victim);
        out.contains("aws: ").then_some(out)
    });
    let notice = c.job(victim);
    let drained =
        notice["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").cloned().unwrap();
    let deadline = drained["detail"]["deadline"].as_str().unwrap();
    assert!(log.contains(&format!("aws: terminate {} gcp: TRUE", &deadline[..19])), "{log}\n{drained}");
    c.wait_state(od, "succeeded");
}
