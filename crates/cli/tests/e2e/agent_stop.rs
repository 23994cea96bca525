//! An agent told to stop (SIGTERM, as `systemctl stop` sends) drains its
//! node before it exits: its preemptible job gets the notice and saves in
//! its window and is requeued; its on-demand job gets the agent's stop
//! timeout, then is ended and requeued, not failed; the node takes work
//! again when the agent starts.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{event, events, pid_alive, wait_for, Cluster, Options};

#[test]
fn sigterm_to_an_agent_drains_its_node_requeues_its_jobs_and_a_restart_brings_the_node_back() {
    let mut c = Cluster::start(Options {
        nodes: 1,
        gpus: 2,
        drain_window: "20s",
        agent_args: vec!["--stop-timeout", "4s"],
        ..Options::default()
    });
    // Saves at its notice (SIGTERM) and exits 0, as a well-behaved
    // preemptible job does.
    let save = r#"trap 'echo saved > "$EBB_CHECKPOINT_DIR/saved-$EBB_ATTEMPT"; exit 0' TERM
                  echo $$ > "$EBB_CHECKPOINT_DIR/pid-$EBB_ATTEMPT"; sleep 600 & wait"#;
    let preemptible = c.submit(&["--gpus", "1", "--", "bash", "-c", save]);
    let on_demand = c.submit(&["--tier", "on-demand", "--gpus", "1", "--", "sleep", "600"]);
    for id in [preemptible, on_demand] {
        c.wait_job(id, "running", Duration::from_secs(30), |j| j["state"] == "running");
    }
    let pid = c.sleeper_pid(preemptible, 1);

    let agent = c.agent_pid(0);
    let told = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();

    // The preemptible job: the notice, its save, its exit, requeued as a
    // preemption, long before the window's 20 s.
    let job = c.wait_job(preemptible, "requeued after its save", Duration::from_secs(15), |j| {
        j["state"] == "queued" && j["usage"].as_array().is_some_and(|u| !u.is_empty())
    });
    let notice = event(&job, "drain_notice");
    let reason = notice["detail"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("node node-0 drained: its agent is stopping (SIGTERM)")
            && !reason.contains("health"),
        "the notice says why, and not that the node was unhealthy: {notice}"
    );
    assert_eq!(job["usage"][0]["outcome"], "preempted", "{job}");
    assert!(c.checkpoints(preemptible).join("saved-1").is_file(), "it saved in its window");
    assert!(!pid_alive(pid));
    // Ended by its save, not the stop timeout: a preemption (above), not
    // an attempt the agent ended as it stopped.
    let requeued = event(&job, "requeued");
    assert_eq!(requeued["detail"]["reason"], "preempted", "{requeued}");

    // The node is drained, saying why, while the on-demand job runs on.
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    let node = &nodes[0];
    assert_eq!(node["status"], "draining", "{node}");
    assert!(node["drained_for"].as_str().unwrap().starts_with("its agent is stopping (SIGTERM)"), "{node}");
    assert_eq!(c.job(on_demand)["state"], "running");

    // The on-demand job: ended at the stop timeout and requeued, not
    // failed; then the agent exits on its own, 0.
    let job = c.wait_job(on_demand, "requeued at the stop timeout", Duration::from_secs(15), |j| {
        j["state"] == "queued" && j["usage"].as_array().is_some_and(|u| !u.is_empty())
    });
    assert!(told.elapsed() >= Duration::from_secs(4), "not before the stop timeout: {:?}", told.elapsed());
    assert_eq!(job["usage"][0]["outcome"], "lost", "{job}");
    let said = c.ebb(&["show", &on_demand.to_string()]);
    assert!(said.contains("node-0's agent stopped (SIGTERM) before the attempt ended"), "{said}");
    assert!(!events(&job).iter().any(|e| e == "failed"), "{:?}", events(&job));
    let status = wait_for("the agent to exit", Duration::from_secs(10), || c.agent_exited(0));
    assert!(status.success(), "the agent exits 0 after a stop: {status}");

    // Started again, the node takes work: both jobs run their second attempt.
    c.start_agent(0);
    for id in [preemptible, on_demand] {
        c.wait_job(id, "attempt 2 running", Duration::from_secs(30), |j| {
            j["state"] == "running" && j["attempt"] == 2
        });
    }
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["status"], "up", "{}", nodes[0]);
    assert!(nodes[0]["drained_for"].is_null(), "{}", nodes[0]);
    c.assert_no_double_booking();
}
