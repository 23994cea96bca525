//! What a cancelled job sees, and what an operator's Prometheus sees, on a
//! real cluster: a cancel writes its notice before SIGTERM and kills at
//! the end of `--grace`; `/metrics` exports every series from the first
//! scrape and counts a preemption as it happens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::support::{events, now_ms, wait_for, Cluster, Options, Up};
use serde_json::Value;

fn ms(rfc3339: &str) -> u64 {
    humantime::parse_rfc3339(rfc3339).unwrap().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A cancel sent SIGTERM with no notice for the job's trap, and SIGKILL
/// 10 s later whatever the user wanted.
#[test]
fn a_cancelled_jobs_trap_finds_a_cancel_notice_and_a_job_ignoring_sigterm_is_killed_after_the_grace() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let dir = c.dir.join("seen");
    std::fs::create_dir_all(&dir).unwrap();
    // It has a child of its own: both are sent SIGTERM, every process of
    // its cgroup as it was when the signal came. The processes its trap
    // starts (a save, its upload) are not sent it: each of the ten here
    // finishes.
    let trapper = format!(
        r#"(trap 'echo term >> {seen}/child' TERM; touch {seen}/child-ready; while :; do sleep 0.05; done) &
trap 'echo term >> {seen}/main; cp "$EBB_DRAIN_FILE" {seen}/notice.json
p=; for i in 0 1 2 3 4 5 6 7 8 9; do sh -c "sleep 0.2; echo \$0 >> {seen}/saved" $i & p="$p $!"; done
wait $p; exit 0' TERM
touch {seen}/trapper; while :; do sleep 0.05; done"#,
        seen = dir.display()
    );
    let ignorer =
        format!("trap '' TERM; touch {seen}/ignorer; while :; do sleep 0.05; done", seen = dir.display());
    let trapping = c.submit(&["--", "bash", "-c", &trapper]);
    let ignoring = c.submit(&["--", "bash", "-c", &ignorer]);
    wait_for("both jobs to run", Duration::from_secs(30), || {
        ["trapper", "child-ready", "ignorer"].iter().all(|f| dir.join(f).exists()).then_some(())
    });
    let (a, b) = (trapping.to_string(), ignoring.to_string());

    // More than the drain window (30 s here) is refused, naming it, and
    // nothing is cancelled.
    let out = c.ebb_as(&c.admin, &["cancel", "--grace", "1m", &a, &b]);
    assert_eq!(out.status.code(), Some(1), "the server refused it: not to be sent again as it is");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("grace_ms: a cancel's grace may be at most the drain window, 30s; got 60s"),
        "{err}"
    );
    assert_eq!(c.job(trapping)["state"], "running");
    assert_eq!(c.job(ignoring)["state"], "running");
    let out = c.ebb_as(&c.admin, &["cancel", "--grace", "soon", &a]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grace"), "the flag is not named");
    // The API names the field.
    let post = |body: &str| {
        let resp = reqwest::blocking::Client::new()
            .post(format!("{}/v1/jobs/{a}/cancel", c.url))
            .bearer_auth(&c.admin)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.text().unwrap())
    };
    let (status, text) = post(r#"{"grace": 3000}"#);
    assert!(status == 400 && text.contains("unknown field `grace`"), "{status} {text}");
    let (status, text) = post(r#"{"grace_ms": -1}"#);
    assert!(status == 400 && text.contains("grace_ms"), "{status} {text}");
    assert_eq!(c.job(trapping)["state"], "running");

    let cancelled_at = now_ms();
    let said = c.ebb(&["cancel", "--grace", "3s", &a, &b]);
    assert_eq!(said, format!("job {a}: stopping\njob {b}: stopping\n"));

    let trapped = c.wait_state(trapping, "cancelled");
    let notice: Value = serde_json::from_slice(&std::fs::read(dir.join("notice.json")).unwrap()).unwrap();
    assert_eq!(notice["action"], "cancel", "{notice}");
    assert_eq!(notice["reason"], "cancel", "{notice}");
    let (notice_at, deadline) =
        (ms(notice["notice_at"].as_str().unwrap()), ms(notice["deadline"].as_str().unwrap()));
    assert_eq!(deadline - notice_at, 3_000, "{notice}");
    assert!(notice_at.abs_diff(cancelled_at) < 2_000, "the notice is not the cancel's: {notice}");
    let exited = trapped["events"].as_array().unwrap().iter().find(|e| e["kind"] == "exited").unwrap();
    assert_eq!(exited["detail"]["code"], 0, "the trap did not run: {exited}");
    for process in ["main", "child"] {
        let got = std::fs::read_to_string(dir.join(process)).unwrap_or_default();
        assert_eq!(got, "term\n", "the job's {process} process: its trap did not run once");
    }
    let mut saved: Vec<u32> = std::fs::read_to_string(dir.join("saved"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    saved.sort();
    assert_eq!(saved, (0..10).collect::<Vec<_>>(), "the processes the trap started were signalled too");

    let killed = c.wait_state(ignoring, "cancelled");
    let exited = killed["events"].as_array().unwrap().iter().find(|e| e["kind"] == "exited").unwrap().clone();
    assert_eq!(exited["detail"]["signal"], 9, "{exited}");
    let after = exited["at_ms"].as_u64().unwrap() - cancelled_at;
    eprintln!("killed {after} ms after the cancel command was started (grace 3 s)");
    assert!((2_500..8_000).contains(&after), "killed {after} ms after the cancel, not about 3 s");
    assert!(events(&killed).contains(&"cancel_requested".to_string()));
    let shown = c.ebb(&["show", &b]);
    assert!(shown.contains("SIGTERM, kill at") && shown.contains("(grace 3.0s)"), "{shown}");
}

/// The value of each series in a scrape, by its name with labels.
fn scrape(url: &str, token: &str) -> BTreeMap<String, f64> {
    let answer =
        reqwest::blocking::Client::new().get(format!("{url}/metrics")).bearer_auth(token).send().unwrap();
    assert_eq!(answer.status(), 200);
    let text = answer.text().unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(series, value)| (series.to_string(), value.parse().unwrap()))
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-metrics-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn submit(up: &Up, args: &[&str]) -> u64 {
    let mut full = vec!["submit", "--json"];
    full.extend_from_slice(args);
    let out = up.ebb(&full);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap()
}

fn state(up: &Up, id: u64) -> String {
    let out = up.ebb(&["show", &id.to_string(), "--json"]);
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["state"].as_str().unwrap().to_string()
}

fn stop(mut up: Up, dir: &Path) {
    let pid = nix::unistd::Pid::from_raw(up.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    up.child.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// `/metrics` left out every series nothing had happened to yet (no
/// `preemptible` row before the first preemptible job), and had no drain
/// time, held or draining GPUs, queue by tier or revenue at all.
#[test]
fn metrics_export_every_series_at_zero_and_count_a_preemption_as_the_report_does() {
    let dir = scratch("preemption");
    let up = Up::start_with(&dir, 1); // one node of 2 GPUs
    let url = up.env.iter().find(|(k, _)| k == "EBB_SERVER").unwrap().1.clone();
    let token = up.env.iter().find(|(k, _)| k == "EBB_TOKEN").unwrap().1.clone();
    let fresh = scrape(&url, &token);
    let mut zero = vec![
        "ebb_submissions_total".to_string(),
        "ebb_preemptions_total".into(),
        "ebb_drain_seconds_count".into(),
        "ebb_drain_seconds_sum".into(),
        "ebb_drain_gpu_seconds_total".into(),
        "ebb_lost_gpu_seconds_total".into(),
        "ebb_checkpoints_total".into(),
    ];
    for tier in ["reserved", "on-demand", "preemptible"] {
        for reason in ebb_api::PendingReason::ALL {
            zero.push(format!("ebb_jobs_queued{{tier=\"{tier}\",reason=\"{reason}\"}}"));
        }
        zero.push(format!("ebb_revenue_usd_total{{tier=\"{tier}\"}}"));
        for state in ["queued", "starting", "running", "draining", "succeeded", "failed", "cancelled"] {
            zero.push(format!("ebb_jobs{{tier=\"{tier}\",state=\"{state}\"}}"));
        }
        for state in ["running", "draining", "held"] {
            zero.push(format!("ebb_gpus_allocated{{tier=\"{tier}\",state=\"{state}\"}}"));
        }
    }
    for status in ["draining", "unhealthy", "lost"] {
        zero.push(format!("ebb_nodes{{status=\"{status}\"}}"));
    }
    for series in &zero {
        assert_eq!(fresh.get(series), Some(&0.0), "{series} on a fresh cluster: {fresh:?}");
    }
    assert_eq!(fresh.get("ebb_gpus"), Some(&2.0));
    assert_eq!(fresh.get("ebb_gpus_idle"), Some(&2.0));
    assert_eq!(fresh.get("ebb_nodes{status=\"up\"}"), Some(&1.0));

    // Two preemptible jobs of a GPU each: one leaves at once when drained,
    // the other only when the test says so. Then an on-demand job needs
    // both GPUs.
    let go = dir.join("go");
    let quick = submit(&up, &["--", "sleep", "600"]);
    let slow_script = format!(
        "trap 'while [ ! -e {go} ]; do sleep 0.05; done; exit 0' TERM; while :; do sleep 0.05; done",
        go = go.display()
    );
    let slow = submit(&up, &["--", "bash", "-c", &slow_script]);
    wait_for("both to run", Duration::from_secs(30), || {
        (state(&up, quick) == "running" && state(&up, slow) == "running").then_some(())
    });
    let urgent = submit(&up, &["--tier", "on-demand", "--gpus", "2", "--", "sleep", "1"]);

    // While the slow one drains: its GPU draining, the quick one's GPU
    // held for the on-demand job, which waits, with the quick one requeued.
    // (Once the scheduler has looked at the requeued one: until its next
    // pass, a job just requeued waits for `scheduling`.)
    let during = wait_for("the slow victim alone to drain", Duration::from_secs(30), || {
        let m = scrape(&url, &token);
        let held = m["ebb_gpus_allocated{tier=\"on-demand\",state=\"held\"}"] == 1.0;
        let looked_at = m["ebb_jobs_queued{tier=\"preemptible\",reason=\"scheduling\"}"] == 0.0;
        (held && looked_at).then_some(m)
    });
    assert_eq!(during["ebb_gpus_allocated{tier=\"preemptible\",state=\"draining\"}"], 1.0);
    assert_eq!(during["ebb_gpus_allocated{tier=\"preemptible\",state=\"running\"}"], 0.0);
    // Each waiting job is counted under why it waits.
    assert_eq!(during["ebb_jobs_queued{tier=\"on-demand\",reason=\"victims_draining\"}"], 1.0);
    assert_eq!(during["ebb_jobs_queued{tier=\"preemptible\",reason=\"resources\"}"], 1.0, "{during:?}");
    let queued: f64 = during.iter().filter(|(k, _)| k.starts_with("ebb_jobs_queued{")).map(|(_, v)| v).sum();
    assert_eq!(queued, 2.0, "{during:?}");
    assert_eq!(during["ebb_jobs{tier=\"preemptible\",state=\"draining\"}"], 1.0);
    assert_eq!(during["ebb_gpus_idle"], 0.0);
    assert_eq!(during["ebb_preemptions_total"], 1.0);

    std::fs::write(&go, "").unwrap();
    wait_for("the on-demand job to finish", Duration::from_secs(30), || {
        (state(&up, urgent) == "succeeded").then_some(())
    });
    let after = wait_for("both victims to run again", Duration::from_secs(30), || {
        let m = scrape(&url, &token);
        (m["ebb_gpus_allocated{tier=\"preemptible\",state=\"running\"}"] == 2.0).then_some(m)
    });
    assert_eq!(after["ebb_preemptions_total"], 2.0);
    assert_eq!(after["ebb_drain_seconds_count"], 2.0);
    assert!(after["ebb_drain_seconds_sum"] > 0.0, "{after:?}");
    assert!(after["ebb_drain_gpu_seconds_total"] > 0.0, "{after:?}");
    assert_eq!(after["ebb_submissions_total"], 3.0);
    assert_eq!(after["ebb_jobs{tier=\"on-demand\",state=\"succeeded\"}"], 1.0);
    assert_eq!(after["ebb_gpus_allocated{tier=\"on-demand\",state=\"held\"}"], 0.0);

    // Revenue counts what the report counts: every attempt that ended.
    let out = up.ebb(&["report", "--from", "2000-01-01", "--to", "2100-01-01", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for tier in report["tiers"].as_array().unwrap() {
        let name = tier["tier"].as_str().unwrap();
        let micro = tier["revenue_micro_usd"].as_i64().unwrap();
        let exported = after[&format!("ebb_revenue_usd_total{{tier=\"{name}\"}}")];
        assert_eq!((exported * 1e6).round() as i64, micro, "{name}: /metrics {exported}, report {micro} µ$");
        if name != "reserved" {
            assert!(micro > 0, "{name} earned nothing: {report}");
        }
    }
    stop(up, &dir);
}
