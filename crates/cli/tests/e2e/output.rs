//! A job's output cannot wedge its node: whatever it prints, and however
//! fast, the node stays up, its output arrives within the agent's limits
//! with a line saying what was dropped, and the next job runs.

use std::time::Duration;

use crate::support::{Cluster, Options};
use serde_json::Value;

/// The agent's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn node_status(c: &Cluster) -> String {
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    nodes[0]["status"].as_str().unwrap().to_string()
}

/// The node is up and runs a next job, whose output arrives whole.
fn assert_node_takes_the_next_job(c: &Cluster) {
    assert_eq!(node_status(c), "up");
    let next = c.submit(&["--", "echo", "the next job"]);
    c.wait_state(next, "succeeded");
    assert_eq!(c.output(next), "the next job\n");
}

/// Submits `script` and waits for it to end; its log.
fn run_to_end(c: &Cluster, script: &str) -> String {
    let id = c.submit(&["--", "bash", "-c", script]);
    c.wait_job(id, "to end", Duration::from_secs(60), |j| {
        ["succeeded", "failed"].contains(&j["state"].as_str().unwrap())
    });
    c.output(id)
}

#[test]
fn yes_for_five_seconds_is_rate_limited_and_the_node_stays_healthy() {
    let c = Cluster::start(Options::default());
    let pid = c.agent_pid(0);
    let before = peak_rss_kib(pid);
    let log = run_to_end(&c, "timeout 5 yes");
    let after = peak_rss_kib(pid);
    eprintln!("agent VmHWM: {before} KiB before `timeout 5 yes`, {after} KiB after; log {} bytes", log.len());
    assert!(log.starts_with("y\ny\ny\n"));
    assert!(log.contains(
        "[ebb: output over the rate limit of 1 MiB/s (burst 4 MiB): dropping it until it slows]\n"
    ));
    let last = log.lines().last().unwrap();
    assert!(
        last.starts_with("[ebb: ") && last.contains("bytes of this attempt's output were dropped"),
        "the log ends with what was dropped: {last:?}"
    );
    // The burst and at most the rate over five seconds (and some slack).
    assert!(log.len() < 12 << 20, "{} bytes passed the rate limit", log.len());
    assert_node_takes_the_next_job(&c);
}

#[test]
fn a_megabyte_of_control_characters_arrives_whole_and_the_node_takes_the_next_job() {
    let c = Cluster::start(Options::default());
    // 1 MB of \x01 is 6 MB of JSON: more than the server takes in one body.
    let log = run_to_end(&c, r"head -c 1000000 /dev/zero | tr '\0' '\1'");
    assert_eq!(log.len(), 1_000_000, "every byte arrives");
    assert!(log.bytes().all(|b| b == 1));
    assert_node_takes_the_next_job(&c);
}

#[test]
fn control_characters_over_the_rate_are_cut_with_a_marker_and_the_node_takes_the_next_job() {
    let c = Cluster::start(Options {
        agent_args: vec!["--output-rate", "100KiB", "--output-burst", "1MiB"],
        ..Options::default()
    });
    // 5 MB at once: the 1 MiB burst arrives, the rest is dropped and said so.
    let log = run_to_end(&c, r"head -c 5000000 /dev/zero | tr '\0' '\1'");
    let kept = log.bytes().take_while(|&b| b == 1).count();
    assert!((1 << 20..5_000_000).contains(&kept), "{kept} bytes kept");
    let rest = &log[kept..];
    assert!(rest.starts_with("\n[ebb: output over the rate limit of 100 KiB/s (burst 1 MiB)"), "{rest:?}");
    assert!(
        rest.ends_with(&format!(
            "were dropped ({0} over the rate limit); {kept} were kept]\n",
            5_000_000 - kept
        )),
        "{rest:?}"
    );
    assert_node_takes_the_next_job(&c);
}

#[test]
fn output_over_the_per_attempt_cap_is_dropped_with_a_marker() {
    let c = Cluster::start(Options {
        agent_args: vec!["--max-output-per-attempt", "100KiB"],
        ..Options::default()
    });
    let log = run_to_end(&c, r"head -c 1000000 /dev/zero | tr '\0' 'x'; echo; echo done");
    let kept = log.bytes().take_while(|&b| b == b'x').count();
    assert_eq!(kept, 100 * 1024);
    let rest = &log[kept..];
    assert!(
        rest.starts_with("\n[ebb: output over the 100 KiB per-attempt limit: dropping the rest]\n"),
        "{rest:?}"
    );
    assert!(rest.ends_with("[ebb: 897606 bytes of this attempt's output were dropped (897606 over the per-attempt limit); 102400 were kept]\n"), "{rest:?}");
    assert!(!rest.contains("done"));
    assert_node_takes_the_next_job(&c);
}
