//! What a new user meets in the first hour, on a real cluster: typos in
//! flags are errors, job scripts' `#EBB` lines are split as a shell would,
//! `submit --json` gives every id on one line, `cancel` takes several jobs
//! and a whole array, and a finished job cannot be cancelled.

use std::time::Duration;

use crate::support;
use crate::support::{Cluster, Options};
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
    // A model no node has: refused, naming what the cluster has (a 422,
    // as every request the API document allows but the cluster refuses).
    let out = c.ebb_as(&c.admin, &["submit", "--gpu-model", "B200", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "gpu_model: no node has \"B200\"; the cluster has H100-80GB 16 GPUs in service (HTTP 422)"
        ),
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
    c.after_passes(2);
    assert_eq!(c.job(second)["state"], "queued", "a drained node took work");
    assert!(c.ebb(&["undrain", "node-1"]).contains("node-1: up"));
    let job = c.wait_state(second, "running");
    assert_eq!(job["placement"][0]["node"], "node-1");
    let out = c.ebb_as(&c.admin, &["undrain", "node-1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("node-1: not drained and no GPU out of service (it is up)"),
        "{}",
        stderr(&out)
    );

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
    c.after_passes(2);
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
        let out = std::process::Command::new(support::ebb_exe())
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
    let out = std::process::Command::new(support::ebb_exe())
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
        let out = std::process::Command::new(support::ebb_exe())
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
    let out = std::process::Command::new(support::ebb_exe()).args(["completions", "tcsh"]).output().unwrap();
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

/// A job's row in `ebb jobs`: the line whose first field is `id`.
fn row(table: &str, id: u64) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id.to_string().as_str()))
        .unwrap_or_else(|| panic!("no row for job {id} in\n{table}"))
        .to_string()
}

/// `ebb jobs` printed every job of every page, an array as a row per task,
/// with no age, no reason and no filters.
#[test]
fn jobs_is_a_table_with_arrays_collapsed_filters_and_the_newest_first_page() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let done = c.submit(&["--name", "quick", "--", "true"]);
    c.wait_state(done, "succeeded");
    let array = c.submit(&["--array", "0-9", "--name", "sweep", "--", "sleep", "600"]);
    let od = c.submit(&["--tier", "on-demand", "--name", "serve", "--", "sleep", "600"]);
    c.wait_state(od, "running");

    let table = c.ebb(&["jobs"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "NAME", "TENANT", "TIER", "GPUS", "STATE", "ATTEMPT", "AGE", "NODE", "REASON"]);
    // One row for the whole array, with its progress; every column aligned.
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 4, "{table}");
    let array_row =
        rows.iter().find(|r| r.trim_start().starts_with(&format!("{array}-{} ", array + 9))).unwrap();
    assert!(array_row.contains(" 0/10 done "), "{table}");
    assert!(array_row.contains(" sweep "), "the array's name, not its first task's: {table}");
    let state_at = rows[0].find("STATE").unwrap();
    for r in &rows[1..] {
        assert!(r[state_at..].starts_with(|ch: char| !ch.is_whitespace()), "STATE not aligned:\n{table}");
    }
    assert!(row(&table, od).contains(" running "), "{table}");

    // --expand: a row per task; filters by state, tier and name.
    let expanded = c.ebb(&["jobs", "--expand"]);
    assert_eq!(expanded.lines().count(), 1 + 12, "{expanded}");
    let running = c.ebb(&["jobs", "--state", "running", "--expand"]);
    let ids: Vec<u64> =
        running.lines().skip(1).map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect();
    assert!(ids.contains(&od) && ids.iter().all(|id| c.job(*id)["state"] == "running"), "{running}");
    let od_only = c.ebb(&["jobs", "--tier", "on-demand"]);
    assert_eq!(od_only.lines().count(), 2, "{od_only}");
    let named = c.ebb(&["jobs", "--name", "quic"]);
    assert_eq!(named.lines().count(), 2, "{named}");
    assert!(row(&named, done).contains(" succeeded "), "{named}");
    let out = c.ebb_as(&c.admin, &["jobs", "--state", "runing"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("state: unknown state \"runing\""), "{}", stderr(&out));

    // The newest first page, said to be one; --json gives every record.
    let newest = c.ebb(&["jobs", "--expand", "--limit", "3"]);
    let ids: Vec<u64> = newest
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('('))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, [array + 8, array + 9, od], "the newest three, oldest of them first: {newest}");
    assert!(newest.ends_with("(the newest 3; --limit N or --all for more)\n"), "{newest}");
    assert_eq!(c.jobs().len(), 12);

    // A requeued job shows the attempt it will run as.
    c.ebb(&["cancel", &od.to_string()]);
    let first_task = array;
    c.wait_state(first_task, "running");
    c.ebb(&["reclaim", "--gpus", "2"]);
    let requeued = c.wait_job(first_task, "requeued", Duration::from_secs(40), |j| j["state"] == "queued");
    let next = requeued["attempt"].as_u64().unwrap() + 1;
    let expanded = c.ebb(&["jobs", "--expand"]);
    assert!(row(&expanded, first_task).contains(&format!(" {next} next ")), "{expanded}");
}

/// A job got the agent's environment and directory: the README's own
/// workload commands failed with the virtual environment on PATH.
#[test]
fn a_job_runs_where_it_was_submitted_with_the_submitters_environment() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let project = c.submit_dir().join("project");
    std::fs::create_dir_all(project.join("sub")).unwrap();
    let submit = |extra: &[&str]| -> std::process::Output {
        let script = r#"printf '%s\n' "${GREETING-unset}" "$PWD" "${EBB_TOKEN-no token}" > seen"#;
        let mut args = vec!["submit", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "bash", "-c", script]);
        std::process::Command::new(support::ebb_exe())
            .args(&args)
            .current_dir(&project)
            .env("EBB_SERVER", &c.url)
            .env("EBB_TOKEN", &c.admin)
            .env("GREETING", "hello from the submitter")
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    };
    let run = |extra: &[&str], dir: &std::path::Path| -> Vec<String> {
        let out = submit(extra);
        assert!(out.status.success(), "{}", stderr(&out));
        let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
        c.wait_state(id, "succeeded");
        let seen = std::fs::read_to_string(dir.join("seen")).unwrap();
        std::fs::remove_file(dir.join("seen")).unwrap();
        seen.lines().map(str::to_string).collect()
    };
    let here = project.display().to_string();
    // By default: the submitter's variables and directory, never its token.
    assert_eq!(run(&[], &project), ["hello from the submitter", here.as_str(), "no token"]);
    // None of them, or only those named; a relative --chdir from here.
    assert_eq!(run(&["--export", "NONE"], &project), ["unset", here.as_str(), "no token"]);
    let sub = project.join("sub");
    let seen = run(&["--export", "GREETING,OTHER=1", "--chdir", "sub"], &sub);
    assert_eq!(seen, ["hello from the submitter", sub.display().to_string().as_str(), "no token"]);
    // --env wins over what is exported.
    assert_eq!(run(&["--env", "GREETING=mine"], &project)[0], "mine");
    let out = submit(&["--export", "NOT_SET_ANYWHERE"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--export NOT_SET_ANYWHERE: not set here"), "{}", stderr(&out));
    let out = submit(&["--export", "EBB_TOKEN"]);
    assert!(!out.status.success(), "a job was given the submitter's token");
    assert!(stderr(&out).contains("env: EBB_TOKEN is set by ebb"), "{}", stderr(&out));

    // The environment is the job's: its tenant (and an operator) see it.
    let id = c.jobs().last().unwrap()["id"].as_u64().unwrap();
    let job = c.job(id);
    assert_eq!(job["env"]["GREETING"], "mine");
    assert_eq!(job["workdir"], here);
    assert!(c.ebb(&["show", &id.to_string()]).contains(&format!("  workdir      {here}\n")));
}

/// A list of servers is tried in turn while one cannot be reached: the
/// request goes to the first that answers, once.
#[test]
fn a_comma_separated_server_list_is_tried_in_turn_and_a_request_is_sent_once() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let run = |servers: &str, args: &[&str]| {
        std::process::Command::new(support::ebb_exe())
            .args(args)
            .env("EBB_SERVER", servers)
            .env("EBB_TOKEN", &c.admin)
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    };
    let servers = format!("http://127.0.0.1:9, {}", c.url);
    let out = run(&servers, &["submit", "--json", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    c.wait_state(id, "succeeded");
    assert_eq!(c.jobs().len(), 1, "the submission was made once");
    // None reachable: each is named with its cause.
    let out = run("http://127.0.0.1:9,http://127.0.0.1:10", &["jobs"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot connect to http://127.0.0.1:9: connection refused")
            && err.contains("cannot connect to http://127.0.0.1:10: connection refused"),
        "{err}"
    );
    // A malformed entry is named.
    let out = run(&format!("{},127.0.0.1:7300", c.url), &["jobs"]);
    assert!(stderr(&out).contains("did you mean http://127.0.0.1:7300?"), "{}", stderr(&out));
}

/// A minimum run time is a duration of at most a day: more would spare a
/// job preempted before for most of its life.
#[test]
fn a_minimum_run_time_over_a_day_or_not_a_duration_is_refused_naming_the_flag() {
    for (value, says) in [
        ("25h", "--min-runtime 1d 1h: at most 24h (0 turns the rule off)"),
        ("5 minutes", "invalid value '5 minutes' for '--min-runtime <MIN_RUNTIME>'"),
    ] {
        let dir = std::env::temp_dir().join(format!("ebb-min-runtime-flag-{}", std::process::id()));
        let out = std::process::Command::new(support::ebb_exe())
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(["--min-runtime", value])
            .output()
            .unwrap();
        assert!(!out.status.success(), "the server started with --min-runtime {value}");
        let err = stderr(&out);
        assert!(err.contains(says), "{err}");
        assert!(!dir.exists(), "a refused server made {}", dir.display());
    }
}

/// How long finished jobs stay in the server's memory is a duration of
/// at most a week: beyond it the memory grows with them for nothing.
#[test]
fn keeping_finished_jobs_over_a_week_or_not_a_duration_is_refused_naming_the_flag() {
    for (value, says) in [
        ("200h", "--keep-finished 8d 8h: at most 168h, a week"),
        ("5 minutes", "invalid value '5 minutes' for '--keep-finished <KEEP_FINISHED>'"),
    ] {
        let dir = std::env::temp_dir().join(format!("ebb-keep-finished-flag-{}", std::process::id()));
        let out = std::process::Command::new(support::ebb_exe())
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(["--keep-finished", value])
            .output()
            .unwrap();
        assert!(!out.status.success(), "the server started with --keep-finished {value}");
        let err = stderr(&out);
        assert!(err.contains(says), "{err}");
        assert!(!dir.exists(), "a refused server made {}", dir.display());
    }
}

/// A heartbeat timeout shorter than two intervals loses every node that
/// misses a single check-in: the server refuses it, naming both flags.
#[test]
fn a_heartbeat_timeout_under_two_intervals_is_refused_before_anything_starts() {
    let dir = std::env::temp_dir().join(format!("ebb-heartbeat-flags-{}", std::process::id()));
    let out = std::process::Command::new(support::ebb_exe())
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .args(["--heartbeat-interval", "10s", "--heartbeat-timeout", "15s"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the server started");
    let err = stderr(&out);
    assert!(
        err.contains("--heartbeat-timeout 15.0s with --heartbeat-interval 10.0s")
            && err.contains("at least twice the interval")
            && err.contains("--heartbeat-timeout 30.0s"),
        "{err}"
    );
    assert!(!dir.exists(), "a refused server made {}", dir.display());
}
