//! Deadlines end to end: a preemptible job with a deadline reports its
//! progress from a real process through its agent; the server keeps it
//! preemptible while the rest fits and promotes it to on-demand when it
//! no longer does; its attempt is billed at each rate for its own
//! seconds, and the invoice shows both.

use std::time::{Duration, UNIX_EPOCH};

use crate::support::{events, now_ms, Cluster, Options};
use serde_json::Value;

const MODEL: &str = "H100-80GB";

/// Reports 10% after a second of run time, waits for the test's word,
/// then reports only 10.5% after six seconds more (the rest would now
/// take minutes), runs on two seconds and finishes.
const JOB: &str = r#"
import json, os, time, urllib.request
def progress(fraction):
    request = urllib.request.Request(os.environ["EBB_METADATA_URL"] + "/ebb/v1/progress",
        data=json.dumps({"fraction": fraction}).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request).read()
time.sleep(1)
progress(0.10)
go = os.environ["GO_FILE"]
while not os.path.exists(go):
    time.sleep(0.05)
time.sleep(6)
progress(0.105)
time.sleep(2)
"#;

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[test]
fn a_job_whose_progress_slows_is_promoted_and_billed_at_both_rates_to_the_micro_dollar() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    // $3.60 per GPU-hour: 1,000 micro-dollars per GPU-second on demand, 500 preemptible.
    c.ebb(&["price", "set", MODEL, "--on-demand", "3.60"]);
    let go = c.dir.join("go");
    let go_env = format!("GO_FILE={}", go.display());
    // The margin in this cluster is the 30 s drain window, a minute's
    // restart allowance and a tenth of the rest: 150 s leaves the first
    // estimate (about 20 s more) a minute of slack, and none to the second
    // (over a minute more).
    let deadline = rfc3339(now_ms() + 150_000);
    let id =
        c.submit(&["--gpus", "2", "--deadline", &deadline, "--env", &go_env, "--", "python3", "-c", JOB]);
    let job = c.wait_job(id, "its first progress", Duration::from_secs(30), |j| {
        j["deadline"]["fraction_done"].as_f64().is_some()
    });
    let d = &job["deadline"];
    assert_eq!((d["state"].as_str(), job["tier"].as_str()), (Some("on_track"), Some("preemptible")), "{job}");
    assert!(d["summary"].as_str().unwrap().starts_with("on track: 10% done, needs "), "{d}");
    let shown = String::from_utf8(c.ebb_as(&c.admin, &["show", &id.to_string()]).stdout).unwrap();
    assert!(shown.contains("deadline") && shown.contains("on track: 10% done"), "{shown}");

    std::fs::write(&go, "").unwrap();
    let job = c.wait_job(id, "promoted", Duration::from_secs(30), |j| j["deadline"]["state"] == "promoted");
    assert_eq!(
        (job["tier"].as_str(), job["state"].as_str(), job["attempt"].as_u64()),
        (Some("on-demand"), Some("running"), Some(1))
    );
    let promoted =
        job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "promoted").unwrap().clone();
    assert_eq!(promoted["detail"]["running"], true, "{promoted}");
    assert!(promoted["detail"]["reason"].as_str().unwrap().starts_with("10% done, needs "), "{promoted}");
    let shown = String::from_utf8(c.ebb_as(&c.admin, &["show", &id.to_string()]).stdout).unwrap();
    assert!(shown.contains("promoted to on-demand"), "{shown}");

    let done = c.wait_state(id, "succeeded");
    assert_eq!(events(&done).iter().filter(|e| *e == "promoted").count(), 1, "{done}");
    assert_eq!(done["deadline"]["state"], "met", "{done}");
    let usage = done["usage"].as_array().unwrap();
    assert_eq!(usage.len(), 1, "one record for the one attempt: {usage:?}");
    let u = &usage[0];
    let segments = u["segments"].as_array().unwrap();
    let seg = |i: usize, field: &str| segments[i][field].as_i64().unwrap();
    assert_eq!(
        (segments[0]["tier"].as_str(), segments[1]["tier"].as_str()),
        (Some("preemptible"), Some("on-demand"))
    );
    assert_eq!((seg(0, "rate_micro_usd"), seg(1, "rate_micro_usd")), (1_800_000, 3_600_000));
    // Split at the promotion: the started seconds before it at 500 per
    // GPU-second, the rest of the attempt's at 1,000.
    let (started, ended) = (u["started_ms"].as_i64().unwrap(), u["ended_ms"].as_i64().unwrap());
    let promoted_ms = promoted["at_ms"].as_i64().unwrap().clamp(started, ended);
    assert_eq!(seg(0, "seconds"), (promoted_ms - started + 999) / 1000, "{u}");
    assert_eq!(seg(0, "seconds") + seg(1, "seconds"), u["seconds"].as_i64().unwrap(), "{u}");
    assert!(seg(0, "seconds") >= 8 && seg(1, "seconds") >= 2, "{u}");
    assert_eq!(seg(0, "amount_micro_usd"), seg(0, "seconds") * 2 * 500);
    assert_eq!(seg(1, "amount_micro_usd"), seg(1, "seconds") * 2 * 1_000);
    assert_eq!(
        u["amount_micro_usd"].as_i64().unwrap(),
        seg(0, "amount_micro_usd") + seg(1, "amount_micro_usd")
    );

    let shown = String::from_utf8(c.ebb_as(&c.admin, &["show", &id.to_string()]).stdout).unwrap();
    let both = format!(
        "{} GPU-s preemptible at $1.8000/GPU-h + {} GPU-s on-demand at $3.6000/GPU-h",
        seg(0, "seconds") * 2,
        seg(1, "seconds") * 2
    );
    assert!(shown.contains(&both) && shown.contains("deadline") && shown.contains("met: done"), "{shown}");

    // The invoice has a line at each rate, and they add up to the record.
    let day = now_ms() / 86_400_000;
    let date = |d: u64| rfc3339(d * 86_400_000)[..10].to_string();
    let (from, to) = (date(day - 1), date(day + 2));
    let bill: Value =
        serde_json::from_str(&c.ebb(&["bill", "--from", &from, "--to", &to, "--json"])).unwrap();
    let lines = bill["lines"].as_array().unwrap();
    let line =
        |tier: &str| lines.iter().find(|l| l["tier"] == tier).unwrap_or_else(|| panic!("{tier}: {bill}"));
    assert_eq!(lines.len(), 2, "{bill}");
    assert_eq!(line("preemptible")["gpu_seconds"].as_i64().unwrap(), seg(0, "seconds") * 2);
    assert_eq!(line("preemptible")["amount_micro_usd"].as_i64().unwrap(), seg(0, "amount_micro_usd"));
    assert_eq!(line("on-demand")["gpu_seconds"].as_i64().unwrap(), seg(1, "seconds") * 2);
    assert_eq!(line("on-demand")["amount_micro_usd"].as_i64().unwrap(), seg(1, "amount_micro_usd"));
    assert_eq!(bill["total_micro_usd"], u["amount_micro_usd"], "{bill}");
    assert_eq!(bill["preemptible_savings_micro_usd"].as_i64().unwrap(), seg(0, "seconds") * 2 * 500);
    let text = String::from_utf8(c.ebb_as(&c.admin, &["bill", "--from", &from, "--to", &to]).stdout).unwrap();
    assert!(text.contains("preemptible") && text.contains("on-demand"), "{text}");

    // `/metrics` counts the same revenue as the bill, each part under its
    // tier: this attempt is the only one that ended.
    assert_eq!(revenue_micro_usd(&c, "preemptible"), seg(0, "amount_micro_usd"));
    assert_eq!(revenue_micro_usd(&c, "on-demand"), seg(1, "amount_micro_usd"));
}

/// `ebb_revenue_usd_total{tier}` from the server's `/metrics`, in
/// micro-dollars.
fn revenue_micro_usd(c: &Cluster, tier: &str) -> i64 {
    let text = c.metrics();
    let series = format!("ebb_revenue_usd_total{{tier=\"{tier}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(series.as_str()));
    let usd: f64 = line.unwrap_or_else(|| panic!("no {series} in:\n{text}")).parse().unwrap();
    (usd * 1e6).round() as i64
}
