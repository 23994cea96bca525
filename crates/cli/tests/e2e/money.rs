//! Money end to end: the price book, usage records, invoices and
//! reservations on a real cluster (server, agents and job processes on
//! loopback), checked through the CLI as a tenant and an operator use it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support;
use crate::support::{events, wait_for, Cluster, Options};
use serde_json::{json, Value};

const MODEL: &str = "H100-80GB";

fn create_tenant(c: &Cluster, name: &str) -> String {
    let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
    v["token"].as_str().unwrap().to_string()
}

fn json_as(c: &Cluster, token: &str, args: &[&str]) -> Value {
    let out = c.ebb_as(token, args);
    assert!(out.status.success(), "ebb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The period around now that every attempt of a test falls in.
fn today() -> (String, String) {
    let day = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() / 86_400;
    let date = |d: u64| {
        humantime::format_rfc3339(UNIX_EPOCH + Duration::from_secs(d * 86_400)).to_string()[..10].to_string()
    };
    (date(day - 1), date(day + 2))
}

fn sum(values: &[Value], field: &str) -> i64 {
    values.iter().map(|v| v[field].as_i64().unwrap()).sum()
}

fn get(c: &Cluster, token: &str, path: &str) -> (u16, Value) {
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let response = client.get(format!("{}{path}", c.url)).bearer_auth(token).send().unwrap();
    (response.status().as_u16(), response.json().unwrap())
}

/// `GET /v1/report/series` adds up to `GET /v1/report` over the same
/// period, for steps that divide it evenly and not. The period ends now, so
/// that neither the capacity nor a running attempt grows between the calls.
fn assert_series_adds_up_to_the_report(c: &Cluster) {
    let (from, _) = today();
    let to = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let (status, report) = get(c, &c.admin, &format!("/v1/report?from={from}&to={to}"));
    assert_eq!(status, 200, "{report}");
    for step in ["1h", "7m"] {
        let (status, series) =
            get(c, &c.admin, &format!("/v1/report/series?from={from}&to={to}&step={step}"));
        assert_eq!(status, 200, "{series}");
        let buckets = series["buckets"].as_array().unwrap();
        assert!(buckets.len() > 24, "{step}: {} buckets", buckets.len());
        assert_eq!(
            (&buckets[0]["start"], &buckets[buckets.len() - 1]["end"]),
            (&report["from"], &report["to"])
        );
        let hours = |b: &Value, tier: &str| {
            b["tiers"].as_array().unwrap().iter().find(|t| t["tier"] == tier).unwrap()["gpu_hours"]
                .as_f64()
                .unwrap()
        };
        let micro = |b: &Value, tier: &str| {
            b["tiers"].as_array().unwrap().iter().find(|t| t["tier"] == tier).unwrap()["revenue_micro_usd"]
                .as_i64()
                .unwrap()
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
        let sum_f = |f: &dyn Fn(&Value) -> f64| buckets.iter().map(f).sum::<f64>();
        assert!(close(
            sum_f(&|b| b["capacity_gpu_hours"].as_f64().unwrap()),
            report["capacity_gpu_hours"].as_f64().unwrap()
        ));
        for tier in ["reserved", "on-demand", "preemptible"] {
            let (in_report, summed) = (hours(&report, tier), sum_f(&|b| hours(b, tier)));
            assert!(
                close(summed, in_report),
                "{step} {tier}: {summed} GPU-hours in the buckets, {in_report} in the report"
            );
            let summed: i64 = buckets.iter().map(|b| micro(b, tier)).sum();
            assert_eq!(summed, micro(&report, tier), "{step} {tier}: revenue");
        }
        for field in ["reservation_revenue_micro_usd", "total_revenue_micro_usd"] {
            let summed: i64 = buckets.iter().map(|b| b[field].as_i64().unwrap()).sum();
            assert_eq!(summed, report[field].as_i64().unwrap(), "{step}: {field}");
        }
    }
}

/// A job that "works" until told to stop, then exits at once.
const WORKER: &str = "trap 'exit 0' TERM; echo working; sleep 1.5 & wait";

/// The same, for a minute.
const LONG_WORKER: &str = "trap 'exit 0' TERM; sleep 60 & wait";

#[test]
fn a_resumed_job_is_spared_while_another_victim_fits_and_the_bill_counts_every_preemption() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let acme = create_tenant(&c, "acme");
    let jobs = [
        c.submit_as(&acme, &["--gpus", "1", "--", "bash", "-c", LONG_WORKER]),
        c.submit_as(&acme, &["--gpus", "1", "--", "bash", "-c", LONG_WORKER]),
    ];
    // An on-demand job of 1 GPU takes one of them; waits until it has run
    // and both preemptible jobs run again. The preemptions of each job.
    let preempt = |total: u64| -> Vec<u64> {
        let od = c.submit(&["--tier", "on-demand", "--gpus", "1", "--", "sleep", "0.3"]);
        c.wait_state(od, "succeeded");
        wait_for_preemptions(&c, &jobs, total)
    };
    let first = preempt(1);
    let resumed = if first[0] == 1 { 0 } else { 1 };
    // The resumed job has lost least (nothing since it started again), yet
    // the other one is taken: the resumed one is within the server's
    // default minimum run time, 5 minutes.
    assert_eq!(preempt(2), vec![1, 1], "the job that had just resumed was taken again");
    // Now both have just resumed: one must go all the same, and the
    // on-demand job does not wait for the rule.
    let third = preempt(3);
    assert!(third.contains(&2), "{third:?}");
    assert_eq!(first[resumed], 1);
    for job in jobs {
        c.ebb(&["cancel", &job.to_string()]);
        c.wait_state(job, "cancelled");
    }

    let (from, to) = today();
    let bill = json_as(&c, &acme, &["bill", "--from", &from, "--to", &to, "--json"]);
    assert_eq!(bill["attempts"], 5, "{bill}");
    assert_eq!(bill["preemptions"], 3, "{bill}");
    assert_eq!(bill["repeat_preemptions"], 1, "{bill}");
    assert_eq!(bill["preemptions_within_min_runtime"], 1, "{bill}");
    let text = String::from_utf8(c.ebb_as(&acme, &["bill", "--from", &from, "--to", &to]).stdout).unwrap();
    assert!(
        text.contains(
            "5 attempts, 3 preempted (1 again after an earlier preemption, 1 of them within the minimum run time)"
        ),
        "{text}"
    );
}

/// Waits until `jobs` have been preempted `total` times in all and all run
/// again; returns each one's preemptions.
fn wait_for_preemptions(c: &Cluster, jobs: &[u64], total: u64) -> Vec<u64> {
    support::wait_for(&format!("{total} preemptions, every job running"), Duration::from_secs(30), || {
        let shown: Vec<Value> = jobs.iter().map(|j| c.job(*j)).collect();
        let counts: Vec<u64> = shown.iter().map(|j| j["preemptions"].as_u64().unwrap()).collect();
        let running = shown.iter().all(|j| j["state"] == "running");
        (running && counts.iter().sum::<u64>() == total).then_some(counts)
    })
}

#[test]
fn a_tenant_pays_half_for_preemptible_work_and_the_bill_matches_show() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    // $3.60 per GPU-hour: 1,000 micro-dollars per GPU-second on demand.
    c.ebb(&["price", "set", MODEL, "--on-demand", "3.60"]);
    let book: Value = serde_json::from_str(&c.ebb(&["price", "list", "--json"])).unwrap();
    assert_eq!(book["preemptible_discount_percent"], 50.0);
    for p in book["prices"].as_array().unwrap() {
        assert_eq!(
            p["preemptible_micro_usd"].as_i64().unwrap() * 2,
            p["on_demand_micro_usd"].as_i64().unwrap()
        );
    }
    let acme = create_tenant(&c, "acme");
    // The same job on each tier.
    let od = c.submit_as(&acme, &["--tier", "on-demand", "--gpus", "2", "--", "bash", "-c", WORKER]);
    c.wait_state(od, "succeeded");
    let pe = c.submit_as(&acme, &["--gpus", "2", "--", "bash", "-c", WORKER]);
    c.wait_state(pe, "running");
    wait_for("the worker to run", Duration::from_secs(20), || c.output(pe).contains("working").then_some(()));
    // Someone else's on-demand work takes the GPUs once.
    c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "0.5"]);
    let done = c.wait_job(pe, "to finish after a preemption", Duration::from_secs(30), |j| {
        j["state"] == "succeeded" && j["preemptions"] == 1
    });
    assert_eq!(done["attempt"], 2);

    let (from, to) = today();
    let bill = json_as(&c, &acme, &["bill", "--from", &from, "--to", &to, "--json"]);
    let lines = bill["lines"].as_array().unwrap();
    let line =
        |tier: &str| lines.iter().find(|l| l["tier"] == tier).unwrap_or_else(|| panic!("{tier}: {bill}"));
    let (on_demand, preemptible) = (line("on-demand"), line("preemptible"));
    assert_eq!(lines.len(), 2, "{bill}");
    assert_eq!(on_demand["rate_micro_usd"], 3_600_000);
    assert_eq!(preemptible["rate_micro_usd"], 1_800_000, "preemptible at exactly 50%");
    // Per GPU-second: 1,000 on demand, 500 preemptible -- exact here.
    let (od_s, pe_s) =
        (on_demand["gpu_seconds"].as_i64().unwrap(), preemptible["gpu_seconds"].as_i64().unwrap());
    assert_eq!(on_demand["amount_micro_usd"].as_i64().unwrap(), od_s * 1_000);
    assert_eq!(preemptible["amount_micro_usd"].as_i64().unwrap(), pe_s * 500);
    assert_eq!(bill["preemptible_savings_micro_usd"].as_i64().unwrap(), pe_s * 500);
    assert_eq!(bill["on_demand_equivalent_micro_usd"].as_i64().unwrap(), (od_s + pe_s) * 1_000);
    assert_eq!(bill["total_micro_usd"].as_i64().unwrap(), od_s * 1_000 + pe_s * 500);
    assert_eq!((bill["attempts"].as_u64(), bill["preemptions"].as_u64()), (Some(3), Some(1)));
    assert!(bill["drain_gpu_hours"].as_f64().unwrap() > 0.0);

    // The numbers match `ebb show`: one record per attempt, the same totals.
    let usage = |id: u64| {
        json_as(&c, &acme, &["show", &id.to_string(), "--json"])["usage"].as_array().unwrap().clone()
    };
    let (od_usage, pe_usage) = (usage(od), usage(pe));
    assert_eq!((od_usage.len(), pe_usage.len()), (1, 2));
    assert_eq!(sum(&od_usage, "gpu_seconds"), od_s);
    assert_eq!(sum(&pe_usage, "gpu_seconds"), pe_s);
    assert_eq!(sum(&od_usage, "amount_micro_usd"), on_demand["amount_micro_usd"].as_i64().unwrap());
    assert_eq!(sum(&pe_usage, "amount_micro_usd"), preemptible["amount_micro_usd"].as_i64().unwrap());
    assert_eq!(pe_usage[0]["outcome"], "preempted");
    assert!(pe_usage[0]["drain_gpu_seconds"].as_u64().unwrap() >= 2);
    // Metered per started second of the process's life: the worker sleeps 1.5 s.
    assert_eq!(od_usage[0]["seconds"], 2, "{od_usage:?}");
    let shown = String::from_utf8(c.ebb_as(&acme, &["show", &pe.to_string()]).stdout).unwrap();
    assert!(shown.contains("billed       attempt 1: 2 GPUs x") && shown.contains("(preempted)"), "{shown}");

    // The same invoice as CSV and for people.
    let csv =
        String::from_utf8(c.ebb_as(&acme, &["bill", "--from", &from, "--to", &to, "--csv"]).stdout).unwrap();
    let total = csv.lines().find(|l| l.starts_with("total,")).unwrap();
    assert!(total.contains(&bill["total_micro_usd"].to_string()), "{csv}");
    let preemptions = csv.lines().find(|l| l.starts_with("preemptions,")).unwrap();
    assert_eq!(preemptions, format!("preemptions,,,,,,,,{}", bill["preemptions"]), "{csv}");
    assert_eq!(bill["preemptions"], 1, "{bill}");
    let text = String::from_utf8(c.ebb_as(&acme, &["bill", "--from", &from, "--to", &to]).stdout).unwrap();
    // For people, to the cent.
    let cents = ebb_core::MicroUsd(bill["total_micro_usd"].as_i64().unwrap()).amount_text();
    assert!(text.contains("saved by running preemptible") && text.contains(&cents), "{text}");
    // A tenant cannot read another's bill; the operator can.
    let other = c.ebb_as(&acme, &["bill", "--tenant", "default", "--from", &from, "--to", &to]);
    assert!(!other.status.success());
    let by_operator: Value =
        serde_json::from_str(&c.ebb(&["bill", "--tenant", "acme", "--from", &from, "--to", &to, "--json"]))
            .unwrap();
    assert_eq!(by_operator["total_micro_usd"], bill["total_micro_usd"]);
    // The operator's report sees both tiers' revenue.
    let report: Value =
        serde_json::from_str(&c.ebb(&["report", "--from", &from, "--to", &to, "--json"])).unwrap();
    let tier = |t: &str| report["tiers"].as_array().unwrap().iter().find(|x| x["tier"] == t).unwrap().clone();
    assert!(
        tier("preemptible")["revenue_micro_usd"].as_i64().unwrap()
            >= preemptible["amount_micro_usd"].as_i64().unwrap()
    );
    assert_eq!(report["idle_capacity_sold_micro_usd"], tier("preemptible")["revenue_micro_usd"]);
    assert!(report["capacity_gpu_hours"].as_f64().unwrap() > report["used_gpu_hours"].as_f64().unwrap());
    // And over time, bucket by bucket.
    assert_series_adds_up_to_the_report(&c);
    // A step that is too short, or makes too many buckets, is refused by
    // name, saying what fits; a tenant may not read the report at all.
    for (step, status, says) in [
        ("30s", 422, "step: 30s is shorter than the shortest step, 1m"),
        ("1m", 422, "makes 4320 buckets, over the limit of 1000; use a step of at least 5m for this period"),
        ("soon", 400, "step: \"soon\" is not a duration"),
    ] {
        let (got, body) = get(&c, &c.admin, &format!("/v1/report/series?from={from}&to={to}&step={step}"));
        assert_eq!(got, status, "{step}: {body}");
        assert!(body["error"].as_str().unwrap().contains(says), "{step}: {body}");
    }
    let (got, body) = get(&c, &c.admin, &format!("/v1/report/series?from={to}&to={from}&step=1h"));
    assert_eq!(got, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("is not before"), "{body}");
    let (got, body) = get(&c, &acme, &format!("/v1/report/series?from={from}&to={to}&step=1h"));
    assert_eq!(got, 403, "{body}");
}

#[test]
fn a_reservation_takes_back_its_lent_gpus_and_the_borrower_pays_only_what_it_ran() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, drain_window: "20s", ..Options::default() });
    c.ebb(&["price", "set", MODEL, "--on-demand", "3.60", "--reserved", "1.80"]);
    let owner = create_tenant(&c, "owner");
    let borrower = create_tenant(&c, "borrower");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let at = |secs: i64| {
        humantime::format_rfc3339(UNIX_EPOCH + Duration::from_secs((now.as_secs() as i64 + secs) as u64))
            .to_string()
    };
    let r: Value = serde_json::from_str(&c.ebb(&[
        "reservation",
        "create",
        "--tenant",
        "owner",
        "--gpu-model",
        MODEL,
        "--gpus",
        "4",
        "--backdate",
        "--start",
        &at(-3600),
        "--end",
        &at(3600),
        "--json",
    ]))
    .unwrap();
    assert_eq!(r["rate_micro_usd"], 1_800_000, "the book's reserved rate");
    // Idle reserved GPUs are lent to preemptible work.
    let script = r#"trap 'date +%s%3N > "$EBB_CHECKPOINT_DIR/end-$EBB_ATTEMPT"; exit 0' TERM
date +%s%3N > "$EBB_CHECKPOINT_DIR/start-$EBB_ATTEMPT"
while :; do sleep 0.05; done"#;
    let lent = c.submit_as(&borrower, &["--gpus", "4", "--", "bash", "-c", script]);
    c.wait_state(lent, "running");
    // The operator sees who borrows the idle reserved GPUs; the owner sees
    // how many are lent, not to whom.
    let listed: Value = serde_json::from_str(&c.ebb(&["reservation", "list", "--json"])).unwrap();
    let lending =
        |r: &Value| (r["active"].clone(), r["in_use"].clone(), r["lent"].clone(), r["borrowers"].clone());
    assert_eq!(
        lending(&listed[0]),
        (json!(true), json!(0), json!(4), json!([{"job": lent, "tenant": "borrower", "gpus": 4}])),
        "{listed}"
    );
    let seen: Value = serde_json::from_str(
        &String::from_utf8(c.ebb_as(&owner, &["reservation", "list", "--json"]).stdout).unwrap(),
    )
    .unwrap();
    assert_eq!(lending(&seen[0]), (json!(true), json!(0), json!(4), Value::Null), "{seen}");
    // Once it runs (its trap set), the owner wants its GPUs back.
    wait_for("the borrower's process", Duration::from_secs(20), || {
        c.checkpoints(lent).join("start-1").exists().then_some(())
    });
    let own = c.submit_as(&owner, &["--tier", "reserved", "--gpus", "4", "--", "sleep", "3"]);
    let started = c.wait_job(own, "the owner's job to start", Duration::from_secs(20), |j| {
        events(j).contains(&"started".to_string())
    });
    let victim = c.job(lent);
    let notice =
        victim["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").unwrap().clone();
    let placed =
        started["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == "placed").unwrap().clone();
    let took = placed["at_ms"].as_u64().unwrap() - notice["at_ms"].as_u64().unwrap();
    assert!(took < 20_000, "the owner waited {took} ms, longer than the drain window");
    assert_eq!(victim["preemptions"], 1);
    let listed: Value = serde_json::from_str(&c.ebb(&["reservation", "list", "--json"])).unwrap();
    assert_eq!(
        lending(&listed[0]),
        (json!(true), json!(4), json!(0), Value::Null),
        "its owner uses it: {listed}"
    );
    c.wait_state(own, "succeeded");
    // Back on its lent GPUs after the owner is done; cancel it there.
    c.wait_job(lent, "attempt 2", Duration::from_secs(20), |j| j["attempt"] == 2 && j["state"] == "running");
    c.ebb_as(&borrower, &["cancel", &lent.to_string()]);
    c.wait_state(lent, "cancelled");

    // The borrower is billed for what attempt 1 ran: per started second of
    // its process's life, at the preemptible rate.
    let ckpt = c.checkpoints(lent);
    let ms = |name: &str| std::fs::read_to_string(ckpt.join(name)).unwrap().trim().parse::<u64>().unwrap();
    let ran_ms = ms("end-1") - ms("start-1");
    let (from, to) = today();
    let bill = json_as(&c, &borrower, &["bill", "--from", &from, "--to", &to, "--json"]);
    let usage =
        json_as(&c, &borrower, &["show", &lent.to_string(), "--json"])["usage"].as_array().unwrap().clone();
    assert_eq!(usage[0]["outcome"], "preempted");
    let billed = usage[0]["seconds"].as_u64().unwrap();
    // The process's own clock and the agent's differ by the time it takes to
    // start bash and to notice its exit: at most a second either way.
    assert!(billed.abs_diff(ran_ms.div_ceil(1000)) <= 1, "billed {billed} s, ran {ran_ms} ms");
    assert_eq!(usage[0]["rate_micro_usd"], 1_800_000);
    assert_eq!(bill["lines"][0]["tier"], "preemptible");
    assert!(bill["reservations"].as_array().unwrap().is_empty(), "the borrower has no reservation");

    // The owner pays the reservation for the committed period, used or not;
    // its reserved job is on the bill at no extra charge.
    let owner_bill = json_as(&c, &owner, &["bill", "--from", &from, "--to", &to, "--json"]);
    let charge = &owner_bill["reservations"][0];
    assert_eq!(charge["gpu_seconds"], 4 * 7200);
    assert_eq!(charge["amount_micro_usd"], 4 * 2 * 1_800_000);
    let reserved_line = &owner_bill["lines"][0];
    assert_eq!(
        (reserved_line["tier"].as_str(), reserved_line["amount_micro_usd"].as_i64()),
        (Some("reserved"), Some(0))
    );
    assert_eq!(owner_bill["total_micro_usd"], charge["amount_micro_usd"]);
    assert!(owner_bill["on_demand_equivalent_micro_usd"].as_i64().unwrap() > 0);
    let listed: Value = serde_json::from_str(&c.ebb(&["reservation", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    // The report over time has the reservation's charges too, to the
    // micro-dollar.
    assert_series_adds_up_to_the_report(&c);
}
