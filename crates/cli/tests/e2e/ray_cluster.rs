//! A Ray cluster inside an elastic Ebb job (`python -m ebb_sdk.ray_cluster`),
//! `ray` from PyPI, unchanged, on CPU: a node leaves at a shrink, Ray is
//! drained there with the deadline, and the Ray job goes on and finishes
//! right. `scripts/test` installs `ray` and runs this module on its own,
//! before the rest: with every node on one host, Ray's GCS timed out under
//! the whole suite's load in 4 of 27 runs on the 2-core machine.

use std::path::Path;
use std::time::Duration;

use crate::support::{repo_root, Cluster, Options};

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_string).collect()
}

/// `--gpus 4:8` on two 4-GPU nodes: Ray's head on the first, a worker on
/// the second, tasks on both. An on-demand job takes the second node: its
/// part gets the drain notice, `ray drain-node` tells Ray (preemption, the
/// deadline), the node leaves once idle, and the tasks go on on one node,
/// Ray retrying any that were there. Every square comes back right, and
/// the job succeeds in its first attempt, never requeued.
#[test]
fn a_ray_job_goes_on_when_a_node_is_drained_from_under_it() {
    let ray = std::process::Command::new("python3").args(["-c", "import ray"]).output().unwrap();
    assert!(
        ray.status.success(),
        "no ray for python3 (scripts/test installs ray==2.52.1 into target/py, first on PATH): {}",
        String::from_utf8_lossy(&ray.stderr)
    );
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: 4,
        server_args: vec!["--min-runtime".into(), "2s".into()],
        ..Options::default()
    });
    let scratch = std::env::temp_dir().join(format!("ebb-ray-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let (log, release) = (scratch.join("ray.log"), scratch.join("release"));
    let example = repo_root().join("examples/ray_tasks.py");
    let job = c.submit(&[
        "--gpus",
        "4:8",
        "--name",
        "ray",
        "--signal",
        "WINCH",
        "--",
        "python3",
        "-m",
        "ebb_sdk.ray_cluster",
        "--",
        "python3",
        example.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--release",
        release.to_str().unwrap(),
    ]);
    let minute = Duration::from_secs(60);
    let start = std::time::Instant::now();
    while !lines(&log).iter().any(|l| l.contains(" on 2 nodes, tasks on 2 so far")) {
        assert!(
            start.elapsed() < 3 * minute,
            "no tasks on two Ray nodes: {}\n{:?}",
            c.output(job),
            c.job(job)["events"]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let until_released = format!("while [ ! -e '{}' ]; do sleep 0.1; done", release.display());
    let on_demand = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "bash", "-c", &until_released]);
    c.wait_job(job, "its second node's part to leave", 2 * minute, |j| {
        j["events"].as_array().unwrap().iter().any(|e| e["kind"] == "shrunk")
    });
    let start = std::time::Instant::now();
    while !lines(&log).iter().any(|l| l.contains(" on 1 nodes, ")) {
        let (tail, events) = (lines(&log), c.job(job)["events"].clone());
        assert!(
            start.elapsed() < 2 * minute,
            "no tasks on one Ray node: {}\n{tail:?}\n{events}",
            c.output(job)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(&release, "").unwrap();
    let done =
        c.wait_job(job, "its end", 2 * minute, |j| j["state"] == "succeeded" || j["state"] == "failed");
    assert_eq!(done["state"], "succeeded", "{}", c.output(job));
    assert_eq!((done["attempt"].as_u64(), done["preemptions"].as_u64()), (Some(1), Some(0)));
    let all = lines(&log);
    let last = all.last().cloned().unwrap_or_default();
    assert!(last.contains(" squares, 0 wrong, on 2 nodes in all"), "{all:?}");
    // Ray was told, with the reason: it records the node as drained for a preemption.
    let left = format!("a node left: AUTOSCALER_DRAIN_PREEMPTED: Ebb: preempted by job {on_demand} on node-");
    assert!(all.iter().any(|l| l.starts_with(&left)), "{all:?}");
    c.wait_job(on_demand, "the on-demand job's end", minute, |j| j["state"] == "succeeded");
    let _ = std::fs::remove_dir_all(&scratch);
}
