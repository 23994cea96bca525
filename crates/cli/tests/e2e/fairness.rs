//! Fair share and quotas on a real cluster (a server and agents on
//! loopback, real job processes and signals), through the CLI as two
//! tenants and their operator use it.

use std::time::Duration;

use crate::support::{events, wait_for, Cluster, Options};
use serde_json::Value;

fn create_tenant(c: &Cluster, name: &str) -> String {
    let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
    v["token"].as_str().unwrap().to_string()
}

/// Jobs of `ids` in each state.
fn states(c: &Cluster, ids: &[u64]) -> (usize, usize) {
    let jobs = c.jobs();
    let of = |state: &str| {
        jobs.iter().filter(|j| ids.contains(&j["id"].as_u64().unwrap()) && j["state"] == state).count()
    };
    (of("queued"), of("running"))
}

/// Tenant A's 200-task preemptible array fills the cluster; tenant B's
/// four jobs start as A's tasks end, long before A's array is done, each
/// first saying why it waits; then, with quotas, A waits at its borrowing
/// limit with reason `quota`, and B, under its own quota, gets the GPUs A
/// borrowed back through the drain window.
#[test]
fn a_late_tenant_starts_as_the_first_ones_tasks_end_and_quotas_wait_and_give_back() {
    let c = Cluster::start(Options { nodes: 2, gpus: 4, drain_window: "10s", ..Default::default() });
    let a = create_tenant(&c, "acme");
    let b = create_tenant(&c, "beta");
    let first = c.submit_as(&a, &["--array", "0-199", "--", "sleep", "0.5"]);
    let array: Vec<u64> = (first..first + 200).collect();
    wait_for("acme's tasks on all 8 GPUs", Duration::from_secs(30), || {
        (states(&c, &array).1 == 8).then_some(())
    });
    let late: Vec<u64> = (0..4).map(|_| c.submit_as(&b, &["--", "sleep", "300"])).collect();
    // Every GPU is busy: beta's first job says so (unless an acme task
    // ended meanwhile and it starts or runs already), the rest wait behind it.
    let job = c.job(late[0]);
    let waits = ["resources", "scheduling"].contains(&job["pending_reason"].as_str().unwrap_or(""));
    assert!(waits || ["starting", "running"].contains(&job["state"].as_str().unwrap()), "{job}");
    wait_for("beta's four jobs running", Duration::from_secs(30), || {
        (states(&c, &late).1 == 4).then_some(())
    });
    let (queued, _) = states(&c, &array);
    assert!(queued >= 150, "beta waited behind acme's array: {queued} of its 200 tasks still queued");
    // acme's tasks wait for the half beta holds, saying so.
    let list = c.ebb(&["tenant", "list"]);
    assert!(list.lines().any(|l| l.starts_with("acme") && l.contains("preemptible")), "{list}");
    for id in &late {
        c.ebb(&["cancel", &id.to_string()]);
    }
    c.ebb(&["cancel", "--array", &first.to_string()]);
    wait_for("acme's array gone", Duration::from_secs(60), || (states(&c, &array) == (0, 0)).then_some(()));

    // acme owed 2 and may borrow 6 more; beta owed 4, idle now.
    c.ebb(&["tenant", "update", "acme", "--quota", "preemptible:H100-80GB:2:6"]);
    c.ebb(&["tenant", "update", "beta", "--quota", "preemptible:H100-80GB:4"]);
    let held: Vec<u64> = (0..10).map(|_| c.submit_as(&a, &["--", "sleep", "300"])).collect();
    wait_for("acme at its borrowing limit", Duration::from_secs(30), || {
        (states(&c, &held).1 == 8).then_some(())
    });
    let waiting = held.iter().map(|id| c.job(*id)).find(|j| j["state"] == "queued").unwrap();
    assert_eq!(waiting["pending_reason"], "quota", "{waiting}");
    assert_eq!(
        waiting["pending_detail"].as_str(),
        Some("acme uses 8 of its 2 preemptible H100-80GB; borrowing is at most 6"),
        "{waiting}"
    );
    let limits = c.ebb(&["tenant", "limits", "acme"]);
    assert!(
        limits.contains("quota         preemptible H100-80GB: uses 8 of 2; borrows at most 6"),
        "{limits}"
    );
    let list = c.ebb(&["tenant", "list"]);
    let quota = "\n  quota preemptible H100-80GB: uses 8 of 2; borrows at most 6, lends at most all\n";
    assert!(list.contains(quota), "{list}");
    // beta, under its quota, gets back the GPUs acme borrowed: acme's
    // borrowed jobs drain one at a time, and beta's start in the window.
    let owed: Vec<u64> = (0..4).map(|_| c.submit_as(&b, &["--", "sleep", "300"])).collect();
    let job = c.wait_job(owed[0], "waiting for acme to give back", Duration::from_secs(10), |j| {
        j["pending_reason"] == "reclaiming_quota" || j["state"] == "running"
    });
    wait_for("beta's jobs running", Duration::from_secs(60), || (states(&c, &owed).1 >= 2).then_some(()));
    assert!(job["pending_reason"] == "reclaiming_quota" || job["state"] == "running", "{job}");
    wait_for("beta's four jobs running", Duration::from_secs(60), || {
        (states(&c, &owed).1 == 4).then_some(())
    });
    let drained: Vec<Value> =
        held.iter().map(|id| c.job(*id)).filter(|j| j["preemptions"].as_u64() > Some(0)).collect();
    assert_eq!(drained.len(), 4, "beta's four GPUs, no more: the 2 nobody is owed stay acme's");
    assert!(events(&drained[0]).iter().any(|e| e == "drain_notice"), "{}", drained[0]);
    let notice =
        drained[0]["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").unwrap();
    assert!(notice["text"].as_str().unwrap().contains("quota: acme borrows past its quota"), "{notice}");
    // acme runs its 2 and the 2 nobody's quota covers; the rest wait, none refused.
    let (queued, running) = states(&c, &held);
    assert_eq!((queued, running), (6, 4), "acme's jobs wait, none refused");
}

/// With fair-share preemption, a late tenant's jobs start within the
/// drain window of their submission: the tenant furthest above its share
/// has jobs drained, one reclaim at a time, each saying why.
#[test]
fn with_fair_share_preemption_a_late_tenant_starts_within_the_drain_window() {
    let c = Cluster::start(Options {
        nodes: 1,
        gpus: 4,
        drain_window: "10s",
        server_args: vec!["--fair-share-preemption=20".into(), "--min-runtime=1s".into()],
        ..Default::default()
    });
    let a = create_tenant(&c, "acme");
    let b = create_tenant(&c, "beta");
    let first = c.submit_as(&a, &["--array", "0-9", "--", "sleep", "600"]);
    let array: Vec<u64> = (first..first + 10).collect();
    wait_for("acme's tasks on all 4 GPUs", Duration::from_secs(30), || {
        (states(&c, &array).1 == 4).then_some(())
    });
    // Within --min-runtime acme's tasks are no victims; past it, beta's
    // first job names the one it drains.
    let late: Vec<u64> = (0..2).map(|_| c.submit_as(&b, &["--", "sleep", "600"])).collect();
    let job = wait_for("beta's job to reclaim its share or run", Duration::from_secs(10), || {
        let job = c.job(late[0]);
        (job["pending_reason"] == "reclaiming_share" || job["state"] == "running").then_some(job)
    });
    if job["state"] != "running" {
        let detail = job["pending_detail"].as_str().unwrap();
        assert!(
            detail.starts_with("fair-share preemption: 1 job of acme, furthest above its share"),
            "{detail}"
        );
    }
    wait_for("beta's jobs running", Duration::from_secs(40), || (states(&c, &late).1 == 2).then_some(()));

    let drained: Vec<Value> =
        array.iter().map(|id| c.job(*id)).filter(|j| j["preemptions"].as_u64() > Some(0)).collect();
    assert_eq!(drained.len(), 2, "one of acme's jobs per job of beta");
    let notice =
        drained[0]["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").unwrap();
    assert!(
        notice["text"].as_str().unwrap().contains("fair share: acme is furthest above its share"),
        "{notice}"
    );
    // The drained tasks are back in acme's queue, not failed.
    assert!(drained.iter().all(|j| j["state"] == "queued"), "{drained:?}");
    c.ebb(&["cancel", "--array", &first.to_string()]);
}
