//! GPUs that go bad, end to end: the agents' simulated GPUs fault through
//! their fault files (`ebb agent --fake-gpu-faults`), the operator's check
//! (`--health-check`) fails on purpose, and the jobs are real processes.

use std::time::Duration;

use serde_json::Value;

use crate::support::{now_ms, pid_alive, wait_for, Cluster, Options};

/// The node a job runs on (its index) and its GPUs there.
fn placed(job: &Value) -> (usize, Vec<u64>) {
    let part = &job["placement"][0];
    let node = part["node"].as_str().unwrap().strip_prefix("node-").unwrap().parse().unwrap();
    (node, part["gpus"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect())
}

fn running(c: &Cluster, id: u64, attempt: u64) -> Value {
    c.wait_job(id, &format!("attempt {attempt} running"), Duration::from_secs(30), |j| {
        j["state"] == "running" && j["attempt"] == attempt
    })
}

#[test]
fn an_xid_takes_its_gpu_out_and_requeues_its_job_a_warning_changes_nothing_a_failed_check_drains() {
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: 10,
        drain_window: "3s",
        health: true,
        ..Options::default()
    });
    // An 8-GPU preemptible job and a 2-GPU on-demand job on one node.
    let big = c.submit_sleeper(8);
    let (node, gpus) = placed(&running(&c, big, 1));
    assert_eq!(gpus, (0..8).collect::<Vec<_>>());
    let small = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "8"]);
    assert_eq!(placed(&running(&c, small, 1)), (node, vec![8, 9]), "the best fit: beside the 8-GPU job");
    let other = 1 - node;
    let pid = c.sleeper_pid(big, 1);

    // Xid 79 on GPU 3: the 8-GPU job is requeued at once as lost, billed
    // to the fault, and runs next on the other node.
    let fault_at = now_ms();
    c.set_gpu_faults(node, &[r#"{"gpu":3,"kind":"xid","code":79}"#]);
    let job = running(&c, big, 2);
    let lost = &job["usage"][0];
    assert_eq!(lost["outcome"], "lost", "{lost}");
    let ended = lost["ended_ms"].as_u64().unwrap();
    assert!(
        (fault_at..fault_at + 3_000).contains(&ended),
        "metered to the fault: {} ms after it",
        ended - fault_at
    );
    assert_eq!(placed(&job).0, other, "the next 8-GPU job goes elsewhere");
    let said = c.ebb(&["show", &big.to_string()]);
    assert!(said.contains("Xid 79 (fallen off the bus)"), "{said}");
    wait_for("the first attempt's process ended", Duration::from_secs(10), || {
        (!pid_alive(pid)).then_some(())
    });
    let nodes = c.ebb(&["nodes"]);
    let out_line = format!("node-{node}: GPU 3 out of service since ");
    assert!(nodes.contains(&out_line) && nodes.contains("Xid 79 (fallen off the bus)"), "{nodes}");

    // A 7-GPU job may use the node, on every GPU but 3 and the two busy.
    let seven = c.submit(&["--gpus", "7", "--", "sleep", "600"]);
    let (at, gpus) = placed(&running(&c, seven, 1));
    assert_eq!((at, gpus), (node, vec![0, 1, 2, 4, 5, 6, 7]));
    // The 2-GPU job finishes undisturbed.
    let done = c.wait_state(small, "succeeded");
    assert_eq!(done["attempt"], 1);
    assert!(
        crate::support::events(&done).iter().all(|e| e != "drain_notice"),
        "{:?}",
        crate::support::events(&done)
    );

    // A GPU at its thermal limit on the other node: shown, counted, and
    // nothing changes.
    c.set_gpu_faults(other, &[r#"{"gpu":5,"kind":"throttled","reason":"thermal"}"#]);
    let warned = format!("node-{other}: warning: GPU 5: throttled at its thermal limit");
    wait_for("the warning shown", Duration::from_secs(10), || {
        c.ebb(&["nodes"]).contains(&warned).then_some(())
    });
    let metrics = c.metrics();
    assert!(metrics.contains("ebb_gpus_faulted 1\n"), "{metrics}");
    assert!(
        metrics.contains("ebb_health_findings_total{class=\"warn\",kind=\"throttled\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("ebb_health_findings_total{class=\"fatal\",kind=\"xid\"} 1\n"), "{metrics}");
    let capacity = c.ebb(&["capacity"]);
    assert!(capacity.contains("1 GPU out of service for a fault"), "{capacity}");
    assert_eq!(c.job(big)["attempt"], 2, "a warning drains nothing");

    // The operator's check fails on the other node: it drains with its
    // window, the 8-GPU job saves and is requeued; it waits.
    c.fail_health_check(other, Some("memory test: FAIL"));
    let drained = c.wait_job(big, "requeued by the health drain", Duration::from_secs(30), |j| {
        j["state"] == "queued" && j["preemptions"] == 1
    });
    let events = drained["events"].as_array().unwrap();
    let notice = events.iter().find(|e| e["kind"] == "drain_notice").expect("a drain notice");
    let reason = notice["detail"]["reason"].as_str().unwrap();
    assert_eq!(
        reason,
        format!("node node-{other} drained for its health: the health check exited 1: memory test: FAIL")
    );
    let nodes = c.ebb(&["nodes"]);
    assert!(nodes.contains(&format!("node-{other}: drained for its health: ")), "{nodes}");

    // The operator returns both: the node, and GPU 3 though its fault file
    // still says Xid (the operator has the last word).
    c.fail_health_check(other, None);
    let back = c.ebb(&["undrain", &format!("node-{other}")]);
    assert_eq!(back.lines().next(), Some(format!("node node-{other}: up").as_str()), "{back}");
    running(&c, big, 3);
    let back = c.ebb(&["undrain", &format!("node-{node}"), "--gpu", "3"]);
    assert!(back.starts_with(&format!("node node-{node}: GPU 3 back in service; up")), "{back}");
    // Two more readings of the node, the fault file unchanged.
    let checked = c.health_checks(node);
    wait_for("two more health checks", Duration::from_secs(20), || {
        (c.health_checks(node) >= checked + 2).then_some(())
    });
    assert!(!c.ebb(&["nodes"]).contains(&out_line), "a finding already seen does not take it out again");
    c.assert_no_double_booking();
}
