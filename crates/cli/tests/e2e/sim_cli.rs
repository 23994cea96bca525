//! `ebb sim` as a user runs it: the real binary, real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ebb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ebb")).args(args).output().expect("ebb runs")
}

fn itp_trace(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/itp").join(name);
    assert!(path.is_file(), "missing ITP trace {}", path.display());
    path.display().to_string()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn writes_json_and_a_self_contained_report() {
    let dir = temp_dir("report");
    let (json, report) = (dir.join("out.json"), dir.join("out.html"));
    let trace = itp_trace("cluster10.csv");
    let args = [
        "sim",
        "--trace",
        &trace,
        "--nodes",
        "4",
        "--preemptible-fraction",
        "0.5",
        "--drain-window",
        "5m",
        "--json",
        json.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    let out = ebb(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("jobs                    260 (260 completed, 0 unschedulable)"), "{stdout}");
    assert!(out.stderr.is_empty(), "no progress bar when stderr is not a terminal");
    // It says which files it wrote.
    assert!(stdout.contains(&format!("wrote the summary (JSON) to {}\n", json.display())), "{stdout}");
    assert!(stdout.contains(&format!("wrote the report (HTML) to {}\n", report.display())), "{stdout}");

    let summary: serde_json::Value = serde_json::from_str(&text(&json)).unwrap();
    assert_eq!(summary["jobs"], 260);
    assert_eq!(summary["config"]["drain_window_s"], 300.0);
    let first = text(&json);
    assert!(ebb(&args).status.success());
    assert_eq!(first, text(&json), "byte-identical JSON for the same input");

    let html = text(&report);
    assert_eq!(html.matches("<svg").count(), 4, "four charts");
    assert!(!html.contains("<script"), "no scripts");
    let external = html.replace("http://www.w3.org/2000/svg", "");
    assert!(!external.contains("http://") && !external.contains("https://"), "nothing fetched");
    for title in ["utilisation by tier", "Jobs waiting", "Preemptions per hour", "Cumulative revenue"] {
        assert!(html.contains(title), "{title}");
    }
    // Ticks read as people write them ($160k, 100%), in the dashboard's colours.
    let labels: Vec<&str> =
        html.split("</text>").filter_map(|p| p.rsplit_once('>')).map(|(_, t)| t.trim()).collect();
    assert!(labels.contains(&"100%") && labels.contains(&"$0"), "tick labels: {labels:?}");
    assert!(!labels.iter().any(|l| l.ends_with(".0")), "a tick written as a float: {labels:?}");
    assert!(html.contains("#1D6B38") || html.contains("#1d6b38"), "the dashboard's preemptible green");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn json_to_standard_output() {
    let trace = itp_trace("cluster10.csv");
    let dir = temp_dir("stdout");
    let report = dir.join("out.html");
    let out =
        ebb(&["sim", "--trace", &trace, "--nodes", "4", "--json", "-", "--report", report.to_str().unwrap()]);
    assert!(out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["completed"], 260);
    // Standard output is the JSON alone; what was written is said beside it.
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr, format!("wrote the report (HTML) to {}\n", report.display()));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_bad_trace_is_refused_naming_line_and_field() {
    let dir = temp_dir("bad");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "job_id,submission_time,duration,num_gpu\na,1,10,1\nb,2,ten,1\n").unwrap();
    let out = ebb(&["sim", "--trace", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 3: duration: expected a non-negative integer, got \"ten\""), "{stderr}");

    let out = ebb(&["sim", "--trace", &format!("cheap={}", bad.display())]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("unknown tier \"cheap\": expected preemptible (also spot), on-demand"), "{said}");

    let out = ebb(&["sim", "--trace", dir.join("missing.csv").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.csv"));

    let out = ebb(&["sim", "--trace", bad.to_str().unwrap(), "--drain-window", "5 minutes"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--drain-window"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The tables of `docs/simulator.md` and `docs/elastic.md` are what the
/// scripts print with this
/// binary (`scripts/sim-tables --check`): a change to the core or the
/// simulator that moves a figure fails here until the pages are made again
/// (`scripts/sim-tables`).
#[test]
fn the_simulators_tables_are_what_the_binary_prints() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/sim-tables"))
        .arg("--check")
        .env("EBB", env!("CARGO_BIN_EXE_ebb"))
        .output()
        .expect("scripts/sim-tables runs");
    assert!(
        out.status.success(),
        "the simulator's tables differ from the replays:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "sim-tables: 7 tables as the binary prints them");
}
