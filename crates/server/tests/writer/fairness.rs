//! Fair share and quotas through the API: weights and quotas an operator
//! sets, priorities a tenant gives, usage that survives a restart, and
//! every wait explained with its numbers.

use ebb_api::AgentEvent;
use serde_json::{json, Value};

use super::api::Api;
use super::harness::exited;

const MODEL: &str = "H100-80GB";

/// Starts every attempt the node was told to run; returns them.
fn start_all(api: &mut Api, node: &str) -> Vec<ebb_api::AttemptRef> {
    let at_ms = api.env.now;
    let attempts = api.env.poll(node);
    let started = attempts.iter().map(|&attempt| AgentEvent::Started { attempt, pid: 7, at_ms }).collect();
    api.env.report(node, started);
    attempts
}

/// Time passes with the node checking in (it would be lost otherwise);
/// nothing starts meanwhile.
fn wait(api: &mut Api, ms: u64) {
    for _ in 0..ms / 30_000 {
        api.env.now += 30_000;
        assert!(api.env.poll("node-0").is_empty());
    }
}

fn tenants(api: &mut Api) -> Value {
    let admin = api.admin.clone();
    let answer = api.get(&admin, "/v1/tenants");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn row<'v>(list: &'v Value, tenant: &str) -> &'v Value {
    list.as_array().unwrap().iter().find(|t| t["tenant"] == tenant).unwrap()
}

#[test]
fn a_tenant_that_had_the_tier_waits_behind_one_that_had_none_and_says_why() {
    let mut api = Api::new("fair-share", |_| {});
    api.node("node-0", MODEL, 4);
    let admin = api.admin.clone();
    let acme = api.tenant("acme");
    let beta = api.tenant("beta");
    // A weight out of range is refused with its field; 3 is kept.
    let answer = api.put(&admin, "/v1/tenants/beta/limits", &json!({"weight": 0}));
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(answer.error().contains("weight"), "{}", answer.error());
    let answer = api.put(&admin, "/v1/tenants/beta/limits", &json!({"weight": 3}));
    assert_eq!((answer.status, answer.body["weight"].as_u64()), (200, Some(3)), "{}", answer.body);
    // A priority out of range is refused.
    let answer = api.post(&acme, "/v1/jobs", &json!({"argv": ["x"], "priority": 1001}));
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.error().contains("priority"), "{}", answer.error());

    // acme fills the node for an hour, and queues more.
    let first: Vec<u64> = (0..4).map(|_| api.submit(&acme, &json!({"argv": ["train"]}))).collect();
    let attempts = start_all(&mut api, "node-0");
    assert_eq!(attempts.len(), 4);
    let low = api.submit(&acme, &json!({"argv": ["more"]}));
    let urgent = api.submit(&acme, &json!({"argv": ["more"], "priority": 5}));
    wait(&mut api, 3_600_000);
    // acme's usage: 4 GPU-hours at $3.60 on demand, decayed over the hour.
    let list = tenants(&mut api);
    let share = &row(&list, "acme")["shares"][0];
    assert_eq!(
        (share["tier"].as_str(), share["share_percent"].as_f64()),
        (Some("preemptible"), Some(100.0)),
        "{list}"
    );
    assert_eq!(row(&list, "beta")["weight"].as_u64(), Some(3));

    let late: Vec<u64> = (0..2).map(|_| api.submit(&beta, &json!({"argv": ["eval"]}))).collect();
    api.env.report("node-0", vec![exited(attempts[0], 0, api.env.now)]);
    // The freed GPU goes to beta, which had none; acme's priority job is
    // next among acme's own, and waits behind beta.
    let started = start_all(&mut api, "node-0");
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), vec![late[0]]);
    let started_first = started;
    let job = api.job(late[1]);
    assert_eq!(job["pending_reason"], "resources", "{job}");
    let job = api.job(urgent);
    assert_eq!(job["pending_reason"], "fair_share", "{job}");
    let detail = job["pending_detail"].as_str().unwrap();
    assert!(detail.starts_with("acme is over its share: 100% of this tier's usage"), "{detail}");
    assert!(detail.ends_with("against a weight of 25%; 1 tenant ahead"), "{detail}");
    assert_eq!(api.job(low)["pending_reason"], "priority", "behind acme's own urgent job");
    // The view says each job's own priority; the default is left out.
    assert_eq!((api.job(urgent)["priority"].as_i64(), api.job(low).get("priority")), (Some(5), None));

    // The usage is the store's: a restarted server orders the same way.
    api.restart();
    let running = vec![attempts[1], attempts[2], attempts[3], started_first[0]];
    api.env.register_node("node-0", MODEL, 4, running, Vec::new());
    api.env.report("node-0", vec![exited(attempts[1], 0, api.env.now)]);
    let started = start_all(&mut api, "node-0");
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), vec![late[1]]);
    let list = tenants(&mut api);
    assert!(row(&list, "acme")["shares"][0]["share_percent"].as_f64().unwrap() > 90.0, "{list}");
    api.env.report("node-0", vec![exited(attempts[2], 0, api.env.now)]);
    let started = start_all(&mut api, "node-0");
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), vec![urgent], "acme's priority first");
    let _ = first;
}

#[test]
fn quotas_are_set_checked_shown_and_make_jobs_wait_not_fail() {
    let mut api = Api::new("quotas", |_| {});
    api.node("node-0", MODEL, 8);
    let admin = api.admin.clone();
    let acme = api.tenant("acme");
    let _beta = api.tenant("beta");
    let quota = |tier: &str, model: &str, nominal: u64, borrow: Option<u64>, lend: Option<u64>| json!({"tier": tier, "gpu_model": model, "nominal": nominal, "borrowing_limit": borrow, "lending_limit": lend});
    for (bad, field) in [
        (quota("reserved", MODEL, 4, None, None), "quotas[0].tier"),
        (quota("preemptible", "T4", 4, None, None), "quotas[0].gpu_model"),
        (quota("preemptible", MODEL, 4, None, Some(5)), "quotas[0].lending_limit"),
        (quota("preemptible", MODEL, 1_000_001, None, None), "quotas[0].nominal"),
    ] {
        let answer = api.put(&admin, "/v1/tenants/acme/limits", &json!({"quotas": [bad]}));
        assert_eq!(answer.status, 422, "{}", answer.body);
        assert!(answer.error().starts_with(field), "{field}: {}", answer.error());
    }
    let many: Vec<Value> = (0..65).map(|_| quota("preemptible", MODEL, 1, None, None)).collect();
    let answer = api.put(&admin, "/v1/tenants/acme/limits", &json!({ "quotas": many }));
    assert_eq!((answer.status, answer.error().as_str()), (422, "quotas: at most 64 a tenant"));
    let twice = json!({"quotas": [quota("preemptible", MODEL, 2, None, None), quota("preemptible", MODEL, 3, None, None)]});
    assert_eq!(api.put(&admin, "/v1/tenants/acme/limits", &twice).status, 422);
    // A tenant cannot set its own.
    let own = json!({"quotas": [quota("preemptible", MODEL, 8, None, None)]});
    assert_eq!(api.put(&acme, "/v1/tenants/acme/limits", &own).status, 403);

    let set = json!({"weight": 2, "quotas": [quota("preemptible", MODEL, 2, Some(1), None)]});
    let answer = api.put(&admin, "/v1/tenants/acme/limits", &set);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let jobs: Vec<u64> = (0..4).map(|_| api.submit(&acme, &json!({"argv": ["x"]}))).collect();
    let started = start_all(&mut api, "node-0");
    assert_eq!(started.len(), 3, "2 of its quota and 1 borrowed");
    let job = api.job(jobs[3]);
    assert_eq!(job["pending_reason"], "quota", "{job}");
    assert_eq!(
        job["pending_detail"].as_str(),
        Some("acme uses 3 of its 2 preemptible H100-80GB; borrowing is at most 1"),
        "{job}"
    );
    let usage = api.get(&acme, "/v1/tenants/acme/limits").body;
    assert_eq!(usage["quotas"][0]["used"].as_u64(), Some(3), "{usage}");
    assert_eq!(usage["quotas"][0]["nominal"].as_u64(), Some(2), "{usage}");
    let metrics = api.get(&admin, "/metrics").body;
    let metrics = metrics.as_str().unwrap();
    for line in [
        r#"ebb_tenant_quota_gpus{tenant="acme",tier="preemptible",gpu_model="H100-80GB",kind="nominal"} 2"#,
        r#"ebb_tenant_quota_gpus{tenant="acme",tier="preemptible",gpu_model="H100-80GB",kind="used"} 3"#,
        r#"ebb_tenant_weight_share{tenant="acme",tier="preemptible"} 1.0"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // Kept through a restart; dropped on request.
    api.restart();
    api.env.register_node("node-0", MODEL, 8, started, Vec::new());
    assert!(api.env.poll("node-0").is_empty());
    assert_eq!(api.job(jobs[3])["pending_reason"], "quota");
    let answer = api.put(&admin, "/v1/tenants/acme/limits", &json!({"weight": 2, "quotas": []}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(start_all(&mut api, "node-0").len(), 1, "no quota: it runs");
}
