//! Fire drills through the API: who may drill what, one at a time, and
//! the verdict of a job that saved nothing.

use ebb_api::AgentEvent;
use ebb_core::Span;
use ebb_core::{Attempt, JobId};
use serde_json::{json, Value};

use super::api::Api;
use super::harness::exited;

fn drill(api: &mut Api, token: &str, id: u64) -> super::api::Answer {
    api.post(token, &format!("/v1/jobs/{id}/drill"), &json!({}))
}

#[test]
fn only_a_running_preemptible_job_of_ones_own_can_be_drilled_and_only_once_at_a_time() {
    let mut api = Api::new("drill-rules", |c| c.drain_window = Span(10_000));
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let one = |tier: &str| json!({"argv": ["work"], "gpus": 1, "tier": tier});
    let running = api.submit(&admin, &one("preemptible"));
    let cancelled = api.submit(&admin, &one("preemptible"));
    let on_demand = api.submit(&admin, &one("on-demand"));
    let starts = api.env.poll("n1");
    assert_eq!(starts.len(), 3, "{starts:?}");
    let at_ms = api.env.now;
    let started = starts.iter().map(|&attempt| AgentEvent::Started { attempt, pid: 4242, at_ms }).collect();
    api.env.report("n1", started);
    let queued = api.submit(&admin, &json!({"argv": ["work"], "gpus": 4}));

    let refused = |api: &mut Api, token: &str, id: u64| -> (u16, String) {
        let said = drill(api, token, id);
        (said.status, said.error())
    };
    assert_eq!(
        refused(&mut api, &admin, queued),
        (409, format!("job {queued}: queued; only a running job can be drilled"))
    );
    assert_eq!(
        refused(&mut api, &admin, on_demand),
        (
            422,
            format!(
                "job {on_demand}: on-demand; only preemptible jobs are drained, so only they can be drilled"
            )
        )
    );
    let other = api.tenant("other");
    assert_eq!(refused(&mut api, &other, running), (404, format!("job {running}: not found")));
    let cancel = api.post(&admin, &format!("/v1/jobs/{cancelled}/cancel"), &json!({"grace_ms": 10_000}));
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    assert_eq!(
        refused(&mut api, &admin, cancelled),
        (409, format!("job {cancelled}: being cancelled; there is nothing to drill"))
    );

    // A drill in progress: a second one is refused while the job drains.
    let first = drill(&mut api, &admin, running);
    assert_eq!((first.status, first.body["state"].as_str()), (200, Some("draining")), "{}", first.body);
    let (status, again) = refused(&mut api, &admin, running);
    assert_eq!(status, 409);
    assert!(again.starts_with(&format!("job {running}: already draining (drill: ")), "{again}");

    // Nothing was saved: the job exits in its window, starts again as
    // attempt 2, and the drill fails for want of a checkpoint.
    api.env.now += 1_000;
    let attempt = starts.iter().copied().find(|a| a.job == JobId(running)).unwrap();
    let at_ms = api.env.now;
    api.env.report("n1", vec![exited(attempt, 0, at_ms)]);
    let next = api.env.poll("n1");
    let next = next.iter().copied().find(|a| a.job == JobId(running)).expect("attempt 2 placed");
    assert_eq!(next.attempt, Attempt(2));
    api.env.report("n1", vec![AgentEvent::Started { attempt: next, pid: 4343, at_ms }]);
    let drilled = api.job(running);
    let d = &drilled["drill"];
    assert_eq!(d["verdict"], "failed", "{d}");
    assert!(d["failures"][0].as_str().unwrap().starts_with("no checkpoint"), "{d}");
    // The refusals left the others as they were.
    let kept: Value = api.job(on_demand);
    assert_eq!((kept["state"].as_str(), kept.get("drill")), (Some("running"), None), "{kept}");
    assert_eq!(api.job(queued)["state"], "queued");
}
