//! Webhooks end to end: a receiver on loopback (`webhooks/receiver.py`)
//! verifies each delivery's signature with Python's own hmac as the docs
//! tell a receiver to; it answers 500 for the first minute; the server is
//! killed with SIGKILL meanwhile; every event of a preempted and resumed
//! job arrives afterwards, in order.

use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;

use crate::support::{now_ms, repo_root, wait_for, Cluster, Options};

struct Receiver {
    dir: std::path::PathBuf,
    child: Child,
    url: String,
}

impl Receiver {
    fn start(dir: std::path::PathBuf) -> Receiver {
        std::fs::create_dir_all(&dir).unwrap();
        let script = repo_root().join("crates/cli/tests/e2e/webhooks/receiver.py");
        let child = Command::new("python3").arg(script).arg(&dir).spawn().unwrap();
        let port = wait_for("the receiver's port", Duration::from_secs(20), || {
            std::fs::read_to_string(dir.join("port")).ok()
        });
        Receiver { url: format!("http://127.0.0.1:{port}"), dir, child }
    }

    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The deliveries taken (answered 2xx), in the order they came.
fn taken(log: &[Value]) -> Vec<&Value> {
    log.iter().filter(|e| e["status"] == 204).collect()
}

#[test]
fn every_event_arrives_signed_in_order_after_a_minute_of_500s_and_a_kill_9() {
    // The receiver is on loopback, which the server reaches only when
    // the operator says so.
    let server_args = vec!["--outbound-allow".to_string(), "127.0.0.1".to_string()];
    let mut c =
        Cluster::start(Options { nodes: 1, gpus: 4, drain_window: "3s", server_args, ..Options::default() });
    let receiver = Receiver::start(c.dir.join("receiver"));
    let start = now_ms();
    std::fs::write(receiver.dir.join("fail-until"), format!("{}", start as f64 / 1000.0 + 60.0)).unwrap();
    let add = |path: &str, events: &str, slack: bool| -> Value {
        let url = format!("{}{path}", receiver.url);
        let mut args = vec!["tenant", "webhook", "add", "default", &url, "--events", events, "--json"];
        if slack {
            args.push("--slack");
        }
        let made: Value = serde_json::from_str(&c.ebb(&args)).unwrap();
        let secret = made["secret"].as_str().unwrap();
        std::fs::write(receiver.dir.join(format!("secret-{}", made["id"])), secret).unwrap();
        made
    };
    let hook = add("/hook", "preempted,requeued,succeeded", false);
    let slack = add("/slack", "succeeded", true);
    let said = c.ebb(&["tenant", "webhook", "list", "default"]);
    assert!(said.contains("/hook") && said.contains("preempted,requeued,succeeded"), "{said}");
    let refused =
        c.ebb_as(&c.admin, &["tenant", "webhook", "add", "default", "ftp://x", "--events", "failed"]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("url: http:// or https://, got ftp://"), "{why}");

    // A preemptible job preempted by an on-demand one, saved, resumed, done.
    let victim = c.submit(&[
        "--gpus",
        "4",
        "--",
        "bash",
        "-c",
        r#"trap 'exit 0' TERM; if [ "$EBB_ATTEMPT" = 1 ]; then sleep 600 & wait; else sleep 1; fi"#,
    ]);
    c.wait_state(victim, "running");
    let preemptor = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "2"]);
    c.wait_job(victim, "requeued", Duration::from_secs(20), |j| j["preemptions"] == 1);
    // The writer goes down hard while the receiver still fails: nothing of
    // the outbox is lost.
    c.kill_server();
    c.start_server();
    c.wait_state(preemptor, "succeeded");
    c.wait_state(victim, "succeeded");
    let log = wait_for("every event taken", Duration::from_secs(120), || {
        let log = receiver.log();
        let events: Vec<(u64, String)> = taken(&log)
            .iter()
            .filter(|e| e["path"] == "/hook")
            .map(|e| (e["body"]["job"]["id"].as_u64().unwrap(), e["event"].as_str().unwrap().to_string()))
            .collect();
        (events.iter().filter(|(job, _)| *job == victim).count() >= 3
            && events.iter().any(|(job, e)| *job == preemptor && e == "succeeded")
            && taken(&log).iter().any(|e| e["path"] == "/slack"))
        .then_some(log)
    });
    let waited = (now_ms() - start) as f64 / 1000.0;
    assert!(waited >= 60.0, "taken after the minute of 500s ({waited:.0} s)");

    // Every try verified with the documented scheme.
    assert!(log.iter().all(|e| e["verified"] == true), "a signature did not verify: {log:?}");
    assert!(log.iter().any(|e| e["status"] == 500), "the receiver's 500s were tried");
    // The victim's events, once or more each, in the order they happened.
    let mut seen: Vec<String> = Vec::new();
    for e in taken(&log).iter().filter(|e| e["path"] == "/hook" && e["body"]["job"]["id"] == victim) {
        let event = e["event"].as_str().unwrap().to_string();
        if !seen.contains(&event) {
            seen.push(event);
        }
    }
    assert_eq!(seen, ["preempted", "requeued", "succeeded"], "first taken in order: {log:?}");
    let preempted = taken(&log).into_iter().find(|e| e["event"] == "preempted").unwrap();
    assert_eq!(preempted["body"]["webhook"], hook["id"]);
    assert!(preempted["body"]["text"].as_str().unwrap().contains(&format!("preempted by job {preemptor}")));
    assert_eq!(preempted["body"]["job"]["tier"], "preemptible");
    // The Slack-shaped body: a text and nothing else.
    let to_slack = taken(&log).into_iter().find(|e| e["path"] == "/slack").unwrap();
    let keys: Vec<&String> = to_slack["body"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["text"]);
    assert!(to_slack["body"]["text"].as_str().unwrap().starts_with("Ebb: job "), "{to_slack}");
    assert_eq!(to_slack["webhook"], slack["id"].to_string());

    // The log shows the failures and the deliveries.
    let said = c.ebb(&["tenant", "webhook", "log", "default", &hook["id"].to_string()]);
    assert!(said.contains("failed") && said.contains(ebb_server::webhooks::NOT_DELIVERED), "{said}");
    assert!(said.contains("delivered") && said.contains("HTTP 204"), "{said}");
    let listed = c.ebb(&["tenant", "webhook", "list", "default"]);
    wait_for("nothing left to deliver", Duration::from_secs(10), || {
        let listed = c.ebb(&["tenant", "webhook", "list", "default", "--json"]);
        let hooks: Vec<Value> = serde_json::from_str(&listed).unwrap();
        hooks.iter().all(|h| h["pending"] == 0).then_some(())
    });
    assert!(listed.contains("PENDING"), "{listed}");
}
