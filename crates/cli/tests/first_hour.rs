//! What a new user meets in the first hour, on a real cluster: typos in
//! flags are errors, job scripts' `#EBB` lines are split as a shell would,
//! `submit --json` gives every id on one line, `cancel` takes several jobs
//! and a whole array, and a finished job cannot be cancelled.

mod cluster;

use std::time::Duration;

use cluster::{Cluster, Options};
use serde_json::Value;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `ebb submit --gpu 2 -- true` ran `--gpu` as the command; `#EBB` lines
/// were split on spaces, so a quoted value arrived in pieces.
#[test]
fn a_mistyped_flag_is_refused_naming_it_and_a_quoted_directive_reaches_the_job_whole() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let out = c.ebb_as(&c.admin, &["submit", "--gpu", "2", "--", "true"]);
    assert!(!out.status.success(), "a typo was accepted");
    let err = stderr(&out);
    assert!(err.contains("unexpected argument '--gpu'"), "{err}");
    assert!(err.contains("'--gpus'"), "no suggestion: {err}");
    assert!(c.jobs().is_empty(), "a job was made");

    // Flags may also end where the command starts, without `--`, and the
    // command's own flags stay its own.
    let id = c.submit(&["--gpus", "1", "sh", "-c", "echo plain"]);
    c.wait_state(id, "succeeded");
    assert_eq!(c.output(id), "plain\n");

    let dir = c.dir.join("scripts");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("hello.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#EBB --name \"my job\" --env MSG=\"hello world\"   # says hello\n#EBB --gpus 1\necho \"$MSG\"\n",
    )
    .unwrap();
    make_executable(&script);
    let id = c.submit(&[script.to_str().unwrap()]);
    let job = c.wait_state(id, "succeeded");
    assert_eq!(job["name"], "my job");
    assert_eq!(c.output(id), "hello world\n");

    let bad = dir.join("bad.sh");
    std::fs::write(&bad, "#!/bin/sh\n#EBB --gpus 1\n#EBB --gpu 2\ntrue\n").unwrap();
    make_executable(&bad);
    let out = c.ebb_as(&c.admin, &["submit", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}:3: #EBB --gpu 2: unexpected argument '--gpu'", bad.display())),
        "{err}"
    );
    assert!(err.contains("'--gpus'"), "{err}");
}

/// `submit --json` printed pretty JSON with `ids` only for arrays, and
/// `cancel` took one id.
#[test]
fn submit_json_is_one_line_with_every_id_and_cancel_takes_several_jobs_and_a_whole_array() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let submit = |args: &[&str]| -> Value {
        let mut full = vec!["submit", "--json"];
        full.extend_from_slice(args);
        let text = c.ebb(&full);
        assert_eq!(text.lines().count(), 1, "{text}");
        serde_json::from_str(&text).unwrap()
    };
    let one = submit(&["--", "sleep", "600"]);
    let id = one["id"].as_u64().unwrap();
    assert_eq!(one["ids"], serde_json::json!([id]));
    let array = submit(&["--array", "0-3", "--", "sleep", "600"]);
    let first = array["id"].as_u64().unwrap();
    let ids: Vec<u64> = array["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(ids, (first..first + 4).collect::<Vec<_>>());
    let other = submit(&["--", "sleep", "600"])["id"].as_u64().unwrap();

    c.wait_state(id, "running");
    let said = c.ebb(&["cancel", "--array", &first.to_string()]);
    assert_eq!(said.lines().count(), 4, "{said}");
    for task in &ids {
        c.wait_state(*task, "cancelled");
    }
    let said = c.ebb(&["cancel", &id.to_string(), &other.to_string()]);
    assert_eq!(said.lines().count(), 2, "{said}");
    c.wait_state(id, "cancelled");
    c.wait_state(other, "cancelled");

    // A task's id is not its array's.
    let out = c.ebb_as(&c.admin, &["cancel", "--array", &(first + 1).to_string()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&format!("is a task of array {first}")), "{}", stderr(&out));
}

/// Cancelling a job that had ended answered 200 as if it had done
/// something.
#[test]
fn cancelling_a_finished_job_is_refused_naming_its_state() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let done = c.submit(&["--", "true"]);
    c.wait_state(done, "succeeded");
    let running = c.submit(&["--", "sleep", "600"]);
    c.wait_state(running, "running");
    let out = c.ebb_as(&c.admin, &["cancel", &done.to_string(), &running.to_string()]);
    assert!(!out.status.success(), "cancelling a finished job succeeded");
    let err = stderr(&out);
    assert!(err.contains(&format!("job {done}: already succeeded; there is nothing to cancel")), "{err}");
    // The other job named is cancelled all the same.
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("job {running}: stopping")));
    c.wait_job(running, "cancelled", Duration::from_secs(20), |j| j["state"] == "cancelled");
    assert_eq!(c.job(done)["state"], "succeeded");
}

fn make_executable(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// 24 GPUs on two 8-GPU nodes, or 4096, were accepted and waited for ever.
#[test]
fn a_job_larger_than_the_cluster_is_refused_naming_what_it_has() {
    let c = Cluster::start(Options { nodes: 2, gpus: 8, ..Options::default() });
    for gpus in ["24", "4096"] {
        let out = c.ebb_as(&c.admin, &["submit", "--gpus", gpus, "--", "true"]);
        assert!(!out.status.success(), "{gpus} GPUs were accepted");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("gpus: {gpus} GPUs, but the cluster has 16 H100-80GB on 2 nodes in all")),
            "{err}"
        );
    }
    let out = c.ebb_as(&c.admin, &["submit", "--gpus", "24", "--gpu-model", "H100-80GB", "--", "true"]);
    assert!(
        stderr(&out).contains("gpus: 24 GPUs of H100-80GB, but the cluster has 16 H100-80GB"),
        "{}",
        stderr(&out)
    );
    assert!(c.jobs().is_empty());
    // A gang of both nodes is as large as it gets, and runs.
    let id = c.submit(&["--gpus", "16", "--", "true"]);
    c.wait_state(id, "succeeded");
}

/// A drained node could not be put back, nor a reclaim lifted, and a
/// reclaim was forgotten by a restarted server.
#[test]
fn undrain_and_releasing_a_reclaim_undo_what_the_operator_did_and_a_reclaim_survives_a_restart() {
    let mut c = Cluster::start(Options { nodes: 2, gpus: 2, ..Options::default() });
    assert!(c.ebb(&["drain", "node-1"]).contains("node-1: draining"));
    let first = c.submit(&["--gpus", "2", "--", "sleep", "600"]);
    let second = c.submit(&["--gpus", "2", "--", "sleep", "600"]);
    c.wait_state(first, "running");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.job(second)["state"], "queued", "a drained node took work");
    assert!(c.ebb(&["undrain", "node-1"]).contains("node-1: up"));
    let job = c.wait_state(second, "running");
    assert_eq!(job["placement"][0]["node"], "node-1");
    let out = c.ebb_as(&c.admin, &["undrain", "node-1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("node-1: not drained (it is up)"), "{}", stderr(&out));

    // Take back all preemptible capacity: both jobs drain, and wait queued.
    let said = c.ebb(&["reclaim", "--gpus", "4"]);
    assert!(said.contains("preemptible work may now hold at most 0"), "{said}");
    for id in [first, second] {
        c.wait_job(id, "requeued", Duration::from_secs(20), |j| j["state"] == "queued");
    }
    // The limit is stored: a restarted server keeps it.
    c.kill_server();
    c.start_server();
    c.wait_nodes_up(2);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.job(first)["state"], "queued", "the reclaim was forgotten");
    let said = c.ebb(&["reclaim", "--release"]);
    assert!(
        said.contains("released the reclaim of H100-80GB (preemptible work was held to 0 GPUs)"),
        "{said}"
    );
    c.wait_state(first, "running");
    c.wait_state(second, "running");
    assert!(c.ebb(&["reclaim", "--release"]).contains("no reclaim to release"));
}

/// reqwest's wording ("error sending request for url", "builder error"),
/// or a whole HTML error page, was what a user saw for a wrong server; a
/// port in use showed only as the server failing after `ebb up` had set
/// up its directory.
#[test]
fn an_unreachable_or_wrong_server_is_said_plainly_and_ebb_up_on_a_port_in_use_writes_nothing() {
    use std::io::{Read, Write};
    let ebb = |server: &str| {
        let out = std::process::Command::new(cluster::ebb_exe())
            .args(["jobs", "--server", server, "--token", "x"])
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap();
        assert!(!out.status.success());
        stderr(&out)
    };
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = ebb(&format!("http://127.0.0.1:{port}"));
    assert!(err.contains(&format!("cannot connect to http://127.0.0.1:{port}: connection refused")), "{err}");
    let err = ebb(&format!("127.0.0.1:{port}"));
    assert!(err.contains(&format!("not a URL; did you mean http://127.0.0.1:{port}?")), "{err}");
    let err = ebb(&format!("localhost:{port}"));
    assert!(err.contains(&format!("did you mean http://localhost:{port}?")), "{err}");

    // Something else listens there: a web server's error page.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = other.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in other.incoming().flatten() {
            let mut stream = stream;
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let page = "<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>";
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    let err = ebb(&format!("http://127.0.0.1:{port}"));
    assert!(!err.contains("<html"), "the page was dumped: {err}");
    assert!(err.contains("answered HTTP 404 with something that is not Ebb's API"), "{err}");

    // `ebb up` on that port: said at once, nothing written.
    let dir = std::env::temp_dir().join(format!("ebb-busy-port-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(cluster::ebb_exe())
        .args(["up", "--port", &port.to_string(), "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pass --port 0 for any free port"), "{}", stderr(&out));
    assert!(!dir.exists(), "ebb up wrote its directory first");
}

/// Shell completions and manual pages, made from the command's own
/// definition, so they list every command and flag there is.
#[test]
fn completions_and_manual_pages_come_from_the_command_itself() {
    let ebb = |args: &[&str]| {
        let out = std::process::Command::new(cluster::ebb_exe())
            .args(args)
            .env_remove("EBB_SERVER")
            .output()
            .unwrap();
        assert!(out.status.success(), "ebb {args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let bash = ebb(&["completions", "bash"]);
    assert!(bash.contains("_ebb()") && bash.contains("undrain") && bash.contains("--gpu-model"), "{bash}");
    assert!(ebb(&["completions", "zsh"]).starts_with("#compdef ebb"));
    let out = std::process::Command::new(cluster::ebb_exe()).args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("possible values: bash, elvish, fish, powershell, zsh"),
        "{}",
        stderr(&out)
    );
    assert!(ebb(&["man"]).contains(".TH ebb 1"));
    let dir = std::env::temp_dir().join(format!("ebb-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    ebb(&["man", "--out-dir", dir.to_str().unwrap()]);
    let submit = std::fs::read_to_string(dir.join("ebb-submit.1")).unwrap();
    assert!(submit.contains("\\-\\-gpus") && submit.contains("#EBB"), "{submit}");
    let _ = std::fs::remove_dir_all(&dir);
}
