//! One owner per data directory, and nothing of `ebb up` outlives it: a
//! second server, agent or `ebb up` on a directory in use refuses at once
//! and touches nothing; `kill -9` of `ebb up` takes its server, agents and
//! jobs with it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{ebb_exe, pid_alive, wait_for, Cluster, Options, Up};
use serde_json::Value;

/// Every process whose command line names `dir`: `ebb up`'s server and
/// agents (and `ebb up` itself).
fn processes_of(dir: &Path) -> Vec<i32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.windows(needle.len()).any(|w| w == needle) && pid_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-own-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What the directory holds, file by file (name, length, modified).
fn listing(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            match meta.is_dir() {
                true => stack.push(entry.path()),
                false => all.push((entry.path(), meta.len(), meta.modified().unwrap())),
            }
        }
    }
    all.sort();
    all
}

/// Two servers on one database both acknowledged the same job id, and the
/// store kept only one: the second now refuses before it touches anything.
#[test]
fn a_second_server_or_agent_on_a_data_dir_in_use_refuses_and_the_first_is_untouched() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let id = c.submit(&["--", "true"]);
    c.wait_state(id, "succeeded");
    let server_dir = c.dir.join("server");
    let before = std::fs::read_to_string(server_dir.join("server.url")).unwrap();
    let out = Command::new(ebb_exe())
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&server_dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--data-dir {}: in use by another process (pid ", server_dir.display())),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(server_dir.join("server.url")).unwrap(), before);
    // The first goes on, with the ids it hands out.
    assert_eq!(c.submit(&["--", "true"]), id + 1);

    let agent_dir = c.dir.join("agents/node-0");
    let out = Command::new(ebb_exe())
        .args([
            "agent",
            "--server",
            &c.url,
            "--name",
            "node-0",
            "--fake-gpus",
            "2",
            "--gpu-model",
            "H100-80GB",
        ])
        .args(["--join-token-file", server_dir.join("join.token").to_str().unwrap(), "--data-dir"])
        .arg(&agent_dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--data-dir {}: in use by another process (pid ", agent_dir.display())),
        "{err}"
    );
    c.wait_state(id + 1, "succeeded");
}

/// A second `ebb up` on the directory of a running one reused its node
/// names: its agents killed the first cluster's jobs as leftovers and its
/// logs were overwritten. Now it refuses, and the first runs on. Run again
/// as it was first run (the same port too), it says one thing: the
/// directory is in use, by which process, and where that cluster is.
#[test]
fn a_second_ebb_up_on_a_directory_in_use_refuses_and_the_first_cluster_is_untouched() {
    let dir = scratch("two-ups");
    let first = Up::start(&dir);
    let (id, pid) = first.sleeper();
    let before = listing(&dir.join("logs"));
    let url = first.env.iter().find(|(k, _)| k == "EBB_SERVER").unwrap().1.clone();
    let port = url.rsplit(':').next().unwrap().to_string();
    let out = Command::new(ebb_exe())
        .args(["up", "--nodes", "1", "--gpus-per-node", "2", "--port", &port, "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let holder =
        format!("--data-dir {}: in use by another process (pid {})", dir.display(), first.child.id());
    assert!(err.contains(&holder), "{err}");
    assert!(err.contains(&format!("the cluster running from it serves {url}")), "{err}");
    assert!(!err.contains("--port"), "the port, not the news, was said too: {err}");
    assert_eq!(listing(&dir.join("logs")).len(), before.len());
    // A job submitted since runs through the first cluster: its node
    // would have reported the sleeper's end before this one's.
    let out = first.ebb(&["submit", "--json", "--", "true"]);
    let after = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap().to_string();
    wait_for("a job submitted since to succeed", Duration::from_secs(30), || {
        let shown: Value = serde_json::from_slice(&first.ebb(&["show", &after, "--json"]).stdout).ok()?;
        (shown["state"] == "succeeded").then_some(())
    });
    assert!(pid_alive(pid), "the first cluster's job was killed");
    let shown: Value = serde_json::from_slice(&first.ebb(&["show", &id, "--json"]).stdout).unwrap();
    assert_eq!(shown["state"], "running");
    let mut first = first;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(first.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kill -9` of `ebb up` left its server and agents running under PID 1,
/// holding the port. Now they go with it, and so do their jobs; the same
/// command then starts the cluster again.
#[test]
fn kill_9_of_ebb_up_leaves_no_process_within_2_s() {
    let dir = scratch("kill-up");
    let mut up = Up::start(&dir);
    let (_, job) = up.sleeper();
    let mut cluster = processes_of(&dir);
    cluster.push(job);
    assert!(cluster.len() >= 4, "ebb up, its server, its agent and the job: {cluster:?}");
    up.child.kill().unwrap(); // SIGKILL
    up.child.wait().unwrap();
    let killed = Instant::now();
    wait_for("every process of the cluster to end", Duration::from_secs(2), || {
        cluster.iter().all(|pid| !pid_alive(*pid)).then_some(())
    });
    eprintln!("all gone {:?} after the kill", killed.elapsed());
    // The directory is free again, and the port with it.
    let mut again = Up::start(&dir);
    again.sleeper();
    again.child.kill().unwrap();
    again.child.wait().unwrap();
    wait_for("the second cluster to end", Duration::from_secs(5), || {
        processes_of(&dir).is_empty().then_some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ebb up` restarted on a directory with a drained node waited 20 s for
/// the node to be "up", said only 1 of 2 agents joined, and stopped. Now it
/// comes up and says the node is drained.
#[test]
fn ebb_up_restarted_with_a_drained_node_comes_up_and_says_so() {
    let dir = scratch("drained");
    let mut up = Up::start_with(&dir, 2);
    let out = up.ebb(&["drain", "node-1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(up.child.wait().unwrap().success());

    let mut again = Up::start_with(&dir, 2);
    let said = again.says("is drained");
    assert!(
        said.contains("node-1 is drained: it takes no new work (ebb undrain node-1 puts it back)"),
        "{said}"
    );
    let out = again.ebb(&["undrain", "node-1"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("node-1: up"));
    again.child.kill().unwrap();
    again.child.wait().unwrap();
    wait_for("the cluster to end", Duration::from_secs(5), || processes_of(&dir).is_empty().then_some(()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ebb up` started by root ran every tenant's jobs as root. Now only the
/// operator's own tenant's do (`default`, the admin token's); another
/// tenant's run as a uid of its own, never root. (Run by another user,
/// every job runs as that user, and this says nothing new.)
#[test]
fn a_root_ebb_up_runs_other_tenants_jobs_as_their_own_uids() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: an ebb up of this user runs every job as this user");
        return;
    }
    let dir = scratch("root-up");
    let mut up = Up::start(&dir);
    up.says("other tenants' as uids of their own");
    let created = up.ebb(&["tenant", "create", "bob", "--json"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let bob: Value = serde_json::from_slice(&created.stdout).unwrap();
    let bob_token = bob["token"].as_str().unwrap().to_string();
    let uid_of = |token: Option<&str>| -> u32 {
        let mut submit = Command::new(ebb_exe());
        submit.args(["submit", "--json", "--", "sh", "-c", "id -u"]).envs(up.env.clone());
        if let Some(token) = token {
            submit.env("EBB_TOKEN", token);
        }
        let out = submit.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap().to_string();
        wait_for("the job to finish", Duration::from_secs(30), || {
            let mut logs = Command::new(ebb_exe());
            logs.args(["logs", &id]).envs(up.env.clone());
            let shown: Value = serde_json::from_slice(&up.ebb(&["show", &id, "--json"]).stdout).ok()?;
            (shown["state"] == "succeeded").then_some(())?;
            String::from_utf8_lossy(&logs.output().ok()?.stdout).trim().parse().ok()
        })
    };
    assert_eq!(uid_of(None), 0, "the operator's own jobs run as whoever started the cluster");
    let bobs = uid_of(Some(&bob_token));
    eprintln!("bob's job ran as uid {bobs}");
    assert!(bobs >= 2_000_000, "bob's job ran as uid {bobs}");
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    wait_for("the cluster to end", Duration::from_secs(5), || processes_of(&dir).is_empty().then_some(()));
    let _ = std::fs::remove_dir_all(&dir);
}
