//! What a cancelled job sees, on a real cluster: a cancel writes its
//! notice before SIGTERM and kills at the end of `--grace`.

mod cluster;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster::{events, wait_for, Cluster, Options};
use serde_json::Value;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

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
    let trapper = format!(
        r#"trap 'cp "$EBB_DRAIN_FILE" {seen}/notice.json; exit 0' TERM; touch {seen}/trapper; while :; do sleep 0.05; done"#,
        seen = dir.display()
    );
    let ignorer =
        format!("trap '' TERM; touch {seen}/ignorer; while :; do sleep 0.05; done", seen = dir.display());
    let trapping = c.submit(&["--", "bash", "-c", &trapper]);
    let ignoring = c.submit(&["--", "bash", "-c", &ignorer]);
    wait_for("both jobs to run", Duration::from_secs(30), || {
        (dir.join("trapper").exists() && dir.join("ignorer").exists()).then_some(())
    });
    let (a, b) = (trapping.to_string(), ignoring.to_string());

    // More than the drain window (30 s here) is refused, naming it, and
    // nothing is cancelled.
    let out = c.ebb_as(&c.admin, &["cancel", "--grace", "1m", &a, &b]);
    assert!(!out.status.success());
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

    let killed = c.wait_state(ignoring, "cancelled");
    let exited = killed["events"].as_array().unwrap().iter().find(|e| e["kind"] == "exited").unwrap().clone();
    assert_eq!(exited["detail"]["signal"], 9, "{exited}");
    let after = exited["at_ms"].as_u64().unwrap() - cancelled_at;
    eprintln!("killed {after} ms after the cancel command was started (grace 3 s)");
    assert!((2_500..8_000).contains(&after), "killed {after} ms after the cancel, not about 3 s");
    assert!(events(&killed).contains(&"cancel_requested".to_string()));
    let shown = c.ebb(&["show", &b]);
    assert!(shown.contains("SIGTERM, kill at") && shown.contains("(grace 3 s)"), "{shown}");
}
