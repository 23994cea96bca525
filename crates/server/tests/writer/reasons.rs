//! Why a job waits, through the API: each pending reason the scheduler
//! gives, with its sentence, on a fleet of fake agents.

use ebb_api::AgentEvent;
use ebb_core::Span;
use serde_json::{json, Value};

use super::api::Api;

const MODEL: &str = "H100-80GB";

#[test]
fn every_waiting_job_says_why_in_the_api() {
    let mut api = Api::new("reasons", |c| c.drain_window = Span(60_000));
    api.node("node-0", MODEL, 4);
    api.node("node-1", MODEL, 4);
    let admin = api.admin.clone();
    api.tenant("team");
    let later = api.tenant("later");
    let at = |api: &Api, ms: u64| ebb_server::rfc3339(api.env.now + ms);
    let day = 86_400_000;
    let reserve = |api: &mut Api, tenant: &str, gpus: u32, start: String, end: String| {
        let body = json!({"tenant": tenant, "gpu_model": MODEL, "gpus": gpus, "start": start, "end": end, "backdate": true});
        let made = api.post(&admin, "/v1/reservations", &body);
        assert_eq!(made.status, 201, "{}", made.body);
    };
    let end = at(&api, day);
    reserve(&mut api, "team", 4, "2020-01-01".into(), end);
    let (start, end) = (at(&api, 3_600_000), at(&api, 2 * day));
    reserve(&mut api, "later", 2, start, end);

    // Two preemptible jobs fill the fleet.
    let victims: Vec<u64> =
        (0..2).map(|_| api.submit(&admin, &json!({"argv": ["work"], "gpus": 4}))).collect();
    for node in ["node-0", "node-1"] {
        let at_ms = api.env.now;
        let started =
            api.env.poll(node).into_iter().map(|attempt| AgentEvent::Started { attempt, pid: 7, at_ms });
        api.env.report(node, started.collect());
    }
    for v in &victims {
        assert_eq!(api.job(*v)["state"], "running");
    }
    // On-demand may use 8 - 4 reserved: the first preempts, and waits for
    // its victim's drain; the second is capped, the third waits behind it.
    let on_demand = json!({"argv": ["work"], "gpus": 4, "tier": "on-demand"});
    let preemptor = api.submit(&admin, &on_demand);
    let capped = api.submit(&admin, &on_demand);
    let behind = api.submit(&admin, &on_demand);
    let early = api.submit(&later, &json!({"argv": ["work"], "gpus": 2, "tier": "reserved"}));

    let reason = |api: &mut Api, id: u64, code: &str| -> Value {
        let job = api.job(id);
        assert_eq!(job["pending_reason"], code, "{job}");
        job
    };
    let held = reason(&mut api, preemptor, "victims_draining");
    let detail = held["pending_detail"].as_str().unwrap();
    let victim =
        victims.iter().find(|v| detail.contains(&format!("waiting for job {v} to drain (deadline ")));
    let victim = *victim.unwrap_or_else(|| panic!("{detail}"));
    assert!(detail.contains("its GPUs are held on node-"), "{detail}");
    assert_eq!(api.job(victim)["state"], "draining");
    let capped_view = reason(&mut api, capped, "reservation_cap");
    assert_eq!(
        capped_view["pending_detail"],
        "on-demand may use 4 of 8 H100-80GB: 4 are reserved, and on-demand work uses 4"
    );
    let behind_view = reason(&mut api, behind, "priority");
    let text = behind_view["pending_detail"].as_str().unwrap();
    assert!(text.starts_with(&format!("behind job {capped}, ")), "{text}");
    let early_view = reason(&mut api, early, "reservation_not_started");
    let text = early_view["pending_detail"].as_str().unwrap();
    assert!(text.starts_with("waits for its tenant's reservation of H100-80GB, which starts at "), "{text}");
    let running = api.job(victims.iter().copied().find(|&v| v != victim).unwrap());
    assert_eq!((running["pending_reason"].as_str(), running.get("pending_detail")), (None, None));

    // The operator reclaims all preemptible capacity: a preemptible job waits for it.
    for id in [preemptor, capped, behind] {
        let cancelled = api.post(&admin, &format!("/v1/jobs/{id}/cancel"), &json!({}));
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    }
    let reclaimed = api.post(&admin, "/v1/reclaim", &json!({"gpus": 8}));
    assert_eq!(reclaimed.status, 200, "{}", reclaimed.body);
    let small = api.submit(&admin, &json!({"argv": ["work"], "gpus": 1}));
    let view = reason(&mut api, small, "reclaimed");
    let text = view["pending_detail"].as_str().unwrap();
    assert!(
        text.starts_with(
            "the operator reclaimed preemptible H100-80GB capacity: preemptible work may use 0, and uses 0"
        ),
        "{text}"
    );
}
