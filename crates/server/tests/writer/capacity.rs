//! `GET /v1/capacity`: what the cluster has and what a job of each tier
//! could get now, as counts anyone with a token may read.

use ebb_api::AgentEvent;
use serde_json::{json, Value};

use super::api::Api;

const MODEL: &str = "H100-80GB";

#[test]
fn capacity_counts_the_idle_the_busy_the_reserved_and_what_each_tier_could_get() {
    let mut api = Api::new("capacity", |_| {});
    api.node("node-0", MODEL, 4);
    api.node("node-1", MODEL, 4);
    let admin = api.admin.clone();
    let team = api.tenant("team");
    let other = api.tenant("other");
    let end = ebb_server::rfc3339(api.env.now + 86_400_000);
    let body = json!({"tenant": "team", "gpu_model": MODEL, "gpus": 2, "start": ebb_server::rfc3339(api.env.now), "end": end});
    assert_eq!(api.post(&admin, "/v1/reservations", &body).status, 201);
    let capacity = |api: &mut Api, token: &str| -> Value {
        let answer = api.get(token, "/v1/capacity");
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body["models"][0].clone()
    };
    let tiers = |c: &Value, what: &str| {
        [&c[what]["reserved"], &c[what]["on_demand"], &c[what]["preemptible"]].map(|v| v.as_u64().unwrap())
    };

    // Empty: every GPU idle; on-demand may not use the 2 reserved.
    let c = capacity(&mut api, &admin);
    assert_eq!(
        (c["gpus"].as_u64(), c["idle"].as_u64(), c["idle_on_one_node"].as_u64()),
        (Some(8), Some(8), Some(4))
    );
    assert_eq!((c["reserved"].as_u64(), c["reserved_for_you"].as_u64()), (Some(2), Some(0)));
    assert_eq!(tiers(&c, "available"), [0, 6, 8]);

    // A preemptible job on one node: on-demand could still get 6, by
    // draining it; preemptible, the other node's 4.
    let job = api.submit(&admin, &json!({"argv": ["work"], "gpus": 4}));
    let node = api.job(job)["placement"][0]["node"].as_str().unwrap().to_string();
    let at_ms = api.env.now;
    let started =
        api.env.poll(&node).into_iter().map(|attempt| AgentEvent::Started { attempt, pid: 7, at_ms });
    api.env.report(&node, started.collect());
    let c = capacity(&mut api, &admin);
    assert_eq!((c["idle"].as_u64(), c["draining"].as_u64()), (Some(4), Some(0)));
    assert_eq!(tiers(&c, "in_use"), [0, 0, 4]);
    assert_eq!(tiers(&c, "available"), [0, 6, 4]);

    // The idle node drained by the operator: out of service, not idle.
    let idle = if node == "node-0" { "node-1" } else { "node-0" };
    assert_eq!(api.post(&admin, &format!("/v1/nodes/{idle}/drain"), &json!({})).status, 200);
    let c = capacity(&mut api, &admin);
    assert_eq!((c["nodes"].as_u64(), c["gpus"].as_u64()), (Some(1), Some(4)));
    assert_eq!((c["nodes_out_of_service"].as_u64(), c["gpus_out_of_service"].as_u64()), (Some(1), Some(4)));
    assert_eq!((c["idle"].as_u64(), c["idle_on_one_node"].as_u64()), (Some(0), Some(0)));
    assert_eq!(tiers(&c, "available"), [0, 2, 0]);

    // Tenants read the same counts, with their own reservations.
    let mine = capacity(&mut api, &team);
    assert_eq!(
        (mine["reserved_for_you"].as_u64(), mine["available"]["reserved"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(mine["in_use"], c["in_use"]);
    let theirs = capacity(&mut api, &other);
    assert_eq!(theirs["reserved_for_you"], 0);
    assert!(!theirs.to_string().contains(&format!("\"{job}\"")), "no job ids: {theirs}");
    assert_eq!(api.get("not-a-token", "/v1/capacity").status, 401);
}
