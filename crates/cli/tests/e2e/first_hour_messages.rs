//! What Ebb says in a new user's first hour, on a real cluster: `ebb show`
//! gives a failed start's cause in the timeline, short times in ms, "1
//! GPU", and an interval that agrees with the checkpoints above it;
//! deleting a reservation leaves the invoices of its past as they were;
//! `ebb tenant list`; amounts to the cent and rates to four decimals; and
//! help that offers `--server` only where a server is talked to.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{ebb_exe, event, read_env, wait_for, Cluster, Options};
use serde_json::Value;

const MODEL: &str = "H100-80GB";

/// `ebb show` printed `(1 GPUs)`, a 3 ms save as `took 0.00s`, an interval
/// "assumed until the job reports a checkpoint" under a reported one, and a
/// start that failed only as `exited with code 127` (the cause was in the
/// log alone).
#[test]
fn show_gives_a_failed_starts_cause_short_times_in_ms_one_gpu_and_an_interval_that_agrees() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });

    let typo = c.submit(&["--name", "typo", "--", "no-such-program-ebb", "--flag"]);
    let failed = c.wait_state(typo, "failed");
    let cause = r#"cannot start "no-such-program-ebb": No such file or directory"#;
    let start_error = event(&failed, "exited")["detail"]["start_error"].as_str().unwrap().to_string();
    assert!(start_error.starts_with(cause), "{start_error}");
    let shown = c.ebb(&["show", &typo.to_string()]);
    let exited = shown.lines().find(|l| l.contains(" exited ")).unwrap_or_else(|| panic!("{shown}"));
    assert!(exited.contains(&format!("with code 127: {cause}")), "{shown}");
    assert!(shown.contains("(1 GPU)") && !shown.contains("GPUs"), "{shown}");
    // A job that never checkpointed is not told its interval unless asked.
    assert!(!shown.contains("interval "), "{shown}");
    let why = c.ebb(&["show", "--why", &typo.to_string()]);
    assert!(why.contains("  interval     checkpoint every "), "{why}");

    // A job that reports a 3 ms checkpoint after it started.
    let script = r#"env > "$EBB_CHECKPOINT_DIR/env"; trap 'exit 0' TERM; while :; do sleep 0.05; done"#;
    let saver = c.submit(&["--", "bash", "-c", script]);
    let env_file = c.checkpoints(saver).join("env");
    let env = wait_for("the job's environment", Duration::from_secs(20), || {
        std::fs::metadata(&env_file).ok().filter(|m| m.len() > 0).map(|_| read_env(&env_file))
    });
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}/ebb/v1/checkpoint", env["EBB_METADATA_URL"]))
        .header("content-type", "application/json")
        .body(r#"{"step": 7, "seconds": 0.003}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    c.wait_job(saver, "the checkpoint", Duration::from_secs(20), |j| j["last_checkpoint"]["step"] == 7);
    let shown = c.ebb(&["show", &saver.to_string()]);
    let line = |label: &str| {
        shown
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("{label}: {shown}"))
    };
    assert!(line("checkpoint ").contains("(step 7, took 3ms, attempt 1)"), "{shown}");
    assert!(shown.lines().any(|l| l.contains(" checkpoint ") && l.ends_with("step 7, took 3ms")), "{shown}");
    assert!(!shown.contains(" 0.0s") && !shown.contains(" 0.00s"), "{shown}");
    // The interval was given at the attempt's start, before the report: it
    // says so, and that the report is for a next attempt's.
    let interval = line("interval ");
    let secs = &env["EBB_CHECKPOINT_INTERVAL_S"];
    assert!(interval.contains(&format!("(EBB_CHECKPOINT_INTERVAL_S={secs} for attempt 1)")), "{interval}");
    assert!(interval.contains("δ assumed: no checkpoint reported before this attempt"), "{interval}");
    assert!(interval.contains("checkpoints reported since this attempt started (δ now 3ms)"), "{interval}");

    c.ebb(&["cancel", &saver.to_string()]);
    c.wait_state(saver, "cancelled");
    let shown = c.ebb(&["show", &saver.to_string()]);
    assert!(line_with(&shown, "billed ").contains("attempt 1: 1 GPU x "), "{shown}");
    assert!(!shown.contains("1 GPUs"), "{shown}");
}

fn line_with<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("{label}: {text}"))
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    serde_json::from_str(&c.ebb(args)).unwrap()
}

fn rfc3339(secs_from_now: i64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    humantime::format_rfc3339(UNIX_EPOCH + Duration::from_secs((now + secs_from_now) as u64)).to_string()
}

fn reserve(c: &Cluster, tenant: &str, gpus: &str, start: &str, end: &str) -> u64 {
    let args = ["reservation", "create", "--tenant", tenant, "--gpu-model", MODEL, "--gpus", gpus];
    let r = json(c, &[&args[..], &["--backdate", "--start", start, "--end", end, "--json"]].concat());
    r["id"].as_u64().unwrap()
}

/// Deleting a reservation removed its row, and invoices are computed from
/// the rows: a past invoice lost its charge.
#[test]
fn deleting_a_reservation_leaves_the_invoices_of_its_past_unchanged_and_tenants_are_listed() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    c.ebb(&["price", "set", MODEL, "--on-demand", "3.60", "--reserved", "1.80"]);
    let tokens: std::collections::BTreeMap<&str, String> = ["acme", "beta"]
        .into_iter()
        .map(|name| {
            (name, json(&c, &["tenant", "create", name, "--json"])["token"].as_str().unwrap().to_string())
        })
        .collect();

    // A start in the past would charge for time gone: refused unless the
    // operator says it is a contract that began earlier (--backdate).
    let create = ["reservation", "create", "--tenant", "acme", "--gpu-model", MODEL, "--gpus", "2"];
    let out = c.ebb_as(&c.admin, &[&create[..], &["--start", "2024-01-01", "--end", "2024-02-01"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("start: 2024-01-01 is ") && err.contains("--backdate"),
        "{err}"
    );
    assert_eq!(c.ebb(&["reservation", "list"]), "no reservations\n");

    // A reservation of a past month: 744 h x 2 GPUs x $1.80 = $2,678.40.
    let past = reserve(&c, "acme", "2", "2024-01-01", "2024-02-01");
    let bill_args = ["bill", "--tenant", "acme", "--from", "2024-01-01", "--to", "2024-02-01"];
    let report_args = ["report", "--from", "2024-01-01", "--to", "2024-02-01", "--json"];
    let (bill, text, report) =
        (c.ebb(&[&bill_args[..], &["--json"]].concat()), c.ebb(&bill_args), c.ebb(&report_args));
    let invoice: Value = serde_json::from_str(&bill).unwrap();
    assert_eq!(invoice["reservations"][0]["amount_micro_usd"], 2_678_400_000_i64, "{bill}");
    // For people: amounts to the cent, rates to four decimals.
    let charge = line_with(&text, "reservation ");
    assert!(
        charge.contains("1.8000") && charge.contains("2678.40") && charge.contains(": 2 GPUs,"),
        "{text}"
    );
    assert!(line_with(&text, "total").ends_with(" 2678.40"), "{text}");
    let prices = c.ebb(&["price", "list"]);
    assert!(
        line_with(&prices, MODEL).split_whitespace().eq([MODEL, "3.6000", "1.8000", "1.8000"]),
        "{prices}"
    );

    let said = c.ebb(&["reservation", "delete", &past.to_string()]);
    assert!(said.contains(&format!("reservation {past}: deleted; its charge from 2024-01-01")), "{said}");
    assert_eq!(c.ebb(&[&bill_args[..], &["--json"]].concat()), bill, "the past invoice changed");
    assert_eq!(c.ebb(&bill_args), text);
    assert_eq!(c.ebb(&report_args), report, "the operator's report of the past changed");
    assert_eq!(c.ebb(&["reservation", "list"]), "no reservations\n");
    // Its id is gone for people, even though its charges stay.
    let again = c.ebb_as(&c.admin, &["reservation", "delete", &past.to_string()]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("not found"));

    // One in force, ended early: what it charged up to now stays, nothing after.
    let (start, middle) = (rfc3339(-3600), rfc3339(-1800));
    let current = reserve(&c, "beta", "1", &start, &rfc3339(3600));
    let early = ["bill", "--tenant", "beta", "--from", &start, "--to", &middle, "--json"];
    let before = c.ebb(&early);
    let said = c.ebb(&["reservation", "delete", &current.to_string()]);
    assert!(said.contains("deleted; its charge from") && said.contains("stays on the invoices"), "{said}");
    assert_eq!(c.ebb(&early), before, "the charge before the deletion changed");
    let (day_before, day_after) = (rfc3339(-86_400), rfc3339(86_400));
    let all = json(&c, &["bill", "--tenant", "beta", "--from", &day_before, "--to", &day_after, "--json"]);
    let charged = all["reservations"][0]["gpu_seconds"].as_u64().unwrap();
    assert!((3600..3700).contains(&charged), "charged {charged} GPU-s for an hour in force: {all}");
    // Its tenant's reserved jobs can no longer draw on it.
    let out = c.ebb_as(&tokens["beta"], &["submit", "--tier", "reserved", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("tenant beta has none"), "{err}");

    // One not started yet is withdrawn: it never charged anything.
    let future = reserve(&c, "acme", "1", "2031-01-01", "2031-02-01");
    let said = c.ebb(&["reservation", "delete", &future.to_string()]);
    assert!(said.contains("withdrawn before its start") && said.contains("charged nothing"), "{said}");
    let kept = reserve(&c, "beta", "3", "2032-01-01", "2032-02-01");
    let listed = c.ebb(&["reservation", "list"]);
    let mut rows = listed.lines();
    assert!(
        rows.next().unwrap().split_whitespace().eq([
            "ID",
            "TENANT",
            "GPUS",
            "GPU",
            "MODEL",
            "START",
            "END",
            "USD/GPU-HOUR",
            "IN",
            "USE",
            "LENT",
            "BORROWERS"
        ]),
        "{listed}"
    );
    // Not in force yet: nothing in use or lent.
    let row: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(row, [&*kept.to_string(), "beta", "3", MODEL, row[4], row[5], "1.8000", "-", "-"], "{listed}");

    // Tenants, with their working tokens; the operator's flags before the
    // command work as they always did.
    c.ebb(&["tenant", "token", "revoke", "beta"]);
    let out = Command::new(ebb_exe())
        .args(["--server", &c.url, "--token", &c.admin, "tenant", "list", "--json"])
        .env_remove("EBB_SERVER")
        .env_remove("EBB_TOKEN")
        .env_remove("EBB_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tenants: Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary = |name: &str| {
        tenants
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == name)
            .unwrap_or_else(|| panic!("{name}: {tenants}"))
    };
    assert_eq!(tenants.as_array().unwrap().len(), 3, "{tenants}");
    assert_eq!((summary("acme")["tokens"].as_u64(), summary("beta")["tokens"].as_u64()), (Some(1), Some(0)));
    assert_eq!(summary("beta")["reservations"], 1);
    let text = c.ebb(&["tenant", "list"]);
    let names: Vec<&str> = text.lines().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(names, ["TENANT", "acme", "beta", "default"], "{text}");
    // Only an operator lists tenants.
    let out = c.ebb_as(&tokens["acme"], &["tenant", "list"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs an admin token (HTTP 403)"));

    // Across a restart the deleted reservations stay charged, unlisted and
    // out of the scheduler.
    c.kill_server();
    c.start_server();
    assert_eq!(c.ebb(&[&bill_args[..], &["--json"]].concat()), bill, "the past invoice changed on restart");
    assert_eq!(c.ebb(&early), before);
    let listed = json(&c, &["reservation", "list", "--json"]);
    let ids: Vec<u64> = listed.as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [kept]);
}

/// `ebb up --help` and `ebb sim --help` listed `--server` and `--token`,
/// which they never used.
#[test]
fn only_commands_that_talk_to_a_server_offer_server_and_token() {
    let help = |args: &[&str]| {
        let out = Command::new(ebb_exe()).args(args).arg("--help").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    for local in [&["up"][..], &["sim"], &["server"], &["completions"], &[]] {
        let text = help(local);
        assert!(!text.contains("--server") && !text.contains("--token"), "ebb {local:?}: {text}");
    }
    for remote in [&["jobs"][..], &["submit"], &["tenant", "list"], &["bill"]] {
        let text = help(remote);
        assert!(
            text.contains("--server <URL[,URL...]>") && text.contains("--token <TOKEN>"),
            "ebb {remote:?}: {text}"
        );
    }
    // Set in the environment, they are not asked for again in a usage line.
    let out = Command::new(ebb_exe())
        .args(["show"])
        .env("EBB_SERVER", "http://127.0.0.1:9")
        .env("EBB_TOKEN", "x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Usage: ebb show <ID>") && !err.contains("--server"), "{err}");
    let agent = help(&["agent"]);
    assert!(agent.contains("--server <URL[,URL...]>") && !agent.contains("--token"), "{agent}");

    let out = Command::new(ebb_exe()).args(["--server", "http://127.0.0.1:9", "up"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error exits 2, as clap's own");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--server: ebb up talks to no server"), "{err}");
}

/// A script can tell a command it used wrongly (2) from one that may work
/// when sent again (75, no server answered) from one the server refused
/// or that failed (1).
#[test]
fn the_exit_status_says_whether_to_fix_the_command_or_send_it_again() {
    let run = |server: &str, args: &[&str]| {
        let out = Command::new(ebb_exe())
            .args(args)
            .env("EBB_SERVER", server)
            .env("EBB_TOKEN", "x")
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // A port the OS gave and took back: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, err) = run(&format!("http://127.0.0.1:{free}"), &["jobs"]);
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("cannot connect to"), "{err}");
    let (code, err) = run(&format!("127.0.0.1:{free}"), &["jobs"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a URL; did you mean http://127.0.0.1:"), "{err}");
    let (code, err) =
        run(&format!("http://127.0.0.1:{free}"), &["submit", "--env", "NOEQUALS", "--", "true"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--env NOEQUALS: expected K=V"), "{err}");
}

/// A tenant's job named `ESC ] 0 ; owned BEL ESC [ 2 J` cleared the
/// operator's screen and set its window's title through `ebb jobs` and
/// `ebb show`, and its output did the same through `ebb logs`. What the
/// CLI shows is text now: control characters are escapes; `ebb logs`
/// escapes on a terminal unless `--raw`, and passes bytes to a pipe.
#[test]
fn escape_sequences_a_tenant_puts_in_names_and_output_never_reach_the_terminal() {
    let c = Cluster::start(Options::default());
    let name = "train\u{1b}]0;owned\u{7}\u{1b}[2J";
    let id = c.submit(&["--name", name, "--", "printf", "\\033]0;owned\\007\\033[2Jdone\\n"]);
    c.wait_state(id, "succeeded");
    for args in [vec!["jobs"], vec!["show", &id.to_string()]] {
        let out = c.ebb(&args);
        assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{args:?}: {out:?}");
        assert!(out.contains("train\\x1b]0;owned"), "{args:?}: {out}");
    }
    // JSON keeps the name as it is, escaped as JSON escapes it.
    let shown: Value = serde_json::from_str(&c.ebb(&["show", &id.to_string(), "--json"])).unwrap();
    assert_eq!(shown["name"], name);
    // On a terminal (script(1) gives ebb one), the job's output is escaped.
    let logs = |raw: bool| {
        let command = format!("{} logs {id}{}", ebb_exe(), if raw { " --raw" } else { "" });
        let out = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env("EBB_SERVER", &c.url)
            .env("EBB_TOKEN", &c.admin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let escaped = logs(false);
    assert!(escaped.contains("\\x1b]0;owned\\x07\\x1b[2Jdone"), "{escaped:?}");
    assert!(!escaped.contains('\u{1b}'), "{escaped:?}");
    assert!(logs(true).contains("\u{1b}]0;owned\u{7}\u{1b}[2Jdone"), "--raw passes the bytes");
    // To a pipe, as programs read it: the bytes.
    assert_eq!(c.output(id), "\u{1b}]0;owned\u{7}\u{1b}[2Jdone\n");
}
