//! Attempts drained or cancelled before they started (their node still
//! pulling their image): a registry that trickled a layer held a whole
//! cluster `starting`, an on-demand job waited past its victim's deadline
//! and a cancel stopped nothing. The server now ends such an attempt at
//! its deadline (and a short grace), whatever its agent says.

use ebb_api::AttemptRef;
use ebb_core::{Attempt, JobId};
use serde_json::json;

use super::api::Api;

fn spec(tier: &str, argv: &str) -> serde_json::Value {
    json!({"argv": [argv], "gpus": 4, "tier": tier})
}

#[test]
fn a_drained_attempt_that_never_started_frees_its_gpus_at_its_deadline() {
    let mut api = Api::new("unstarted-drain", |_| {});
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let victim = api.submit(&admin, &spec("preemptible", "train"));
    assert_eq!(
        api.env.poll("n1"),
        [AttemptRef { job: JobId(victim), attempt: Attempt(1) }],
        "placed; pulling, never started"
    );
    let waiting = api.submit(&admin, &spec("on-demand", "serve"));
    assert_eq!(api.job(victim)["state"], "draining");
    let deadline = api.env.now + api.env.config.drain_window.as_millis();
    // The agent says nothing: at the deadline the GPUs are still its.
    api.env.now = deadline;
    api.env.tick();
    assert_eq!(api.job(waiting)["state"], "queued");
    api.env.now = deadline + ebb_server::engine::UNSTARTED_GRACE_MS;
    api.env.tick();
    let shown = api.job(victim);
    assert_eq!(shown["state"], "queued", "{shown}");
    let exited = shown["events"].as_array().unwrap().iter().find(|e| e["kind"] == "exited").unwrap().clone();
    assert!(
        exited["detail"]["start_error"].as_str().unwrap().contains("not started by its deadline"),
        "{exited}"
    );
    let commands = api.env.commands("n1");
    assert!(
        commands
            .iter()
            .any(|c| matches!(c, ebb_api::Action::Stop { attempt, .. } if attempt.job == JobId(victim))),
        "the node is told to stop it: {commands:?}"
    );
    assert!(
        commands.iter().any(|c| matches!(c, ebb_api::Action::Start(s) if s.attempt.job == JobId(waiting))),
        "the on-demand job starts: {commands:?}"
    );
    assert!(api.env.usage(JobId(victim)).is_empty(), "a pull is not metered");
}

#[test]
fn a_cancelled_attempt_that_never_started_ends_at_its_grace() {
    let mut api = Api::new("unstarted-cancel", |_| {});
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let job = api.submit(&admin, &spec("on-demand", "train"));
    assert_eq!(api.env.poll("n1").len(), 1);
    api.env.cancel(JobId(job), Some(1_000)).unwrap();
    api.env.now += 1_000 + ebb_server::engine::UNSTARTED_GRACE_MS;
    api.env.tick();
    assert_eq!(api.job(job)["state"], "cancelled");
    // Its agent's late word of a start is a stale attempt's.
    let at_ms = api.env.now;
    api.env.report(
        "n1",
        vec![ebb_api::AgentEvent::Started {
            attempt: AttemptRef { job: JobId(job), attempt: Attempt(1) },
            pid: 9,
            at_ms,
        }],
    );
    assert_eq!(api.job(job)["state"], "cancelled");
}

/// Found by the writer's fuzzer: a job cancelled while its node was then
/// removed was requeued as lost, and ran again with its cancel forgotten.
#[test]
fn a_job_cancelled_while_its_node_is_removed_is_cancelled_not_run_again() {
    let mut api = Api::new("cancel-then-lost", |_| {});
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let job = api.submit(&admin, &spec("on-demand", "train"));
    assert_eq!(api.env.poll("n1").len(), 1);
    api.env.cancel(JobId(job), None).unwrap();
    let name = "n1".to_string();
    api.env.call(|reply| ebb_server::engine::Msg::RemoveNode { name, reply }).unwrap();
    api.node("n2", "H100", 4);
    assert_eq!(api.job(job)["state"], "cancelled");
    assert!(api.env.poll("n2").is_empty(), "it ran again");
}
