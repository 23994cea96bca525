//! A node whose agent says its reports keep failing is shown unhealthy and
//! gets no new work; its running jobs go on; it takes work again once its
//! reports get through. The writer (`Engine`) is driven directly, speaking
//! the agent protocol as `ebb agent` does.

use ebb_api::{AgentEvent, AttemptRef, Report};
use ebb_server::engine::Msg;

use crate::harness::TestEnv;

const NODE: &str = "node-0";

/// A writer with one 4-GPU node registered.
fn start(name: &str) -> TestEnv {
    let mut env = TestEnv::new(&format!("health-{name}"));
    env.register_node(NODE, "H100", 4, Vec::new(), Vec::new());
    env
}

/// One poll saying whether the node's reports are failing: the attempts
/// it tells the node to start.
fn poll(env: &mut TestEnv, failing: Option<&str>) -> Vec<AttemptRef> {
    env.poll_saying(NODE, Some(failing.map(String::from)))
}

#[test]
fn a_node_whose_reports_fail_is_unhealthy_and_gets_no_new_work_until_they_get_through() {
    let mut s = start("poll");
    let first = s.submit(2);
    let started = poll(&mut s, None);
    assert_eq!(started.iter().map(|a| a.job).collect::<Vec<_>>(), vec![first]);

    // The agent says its reports keep failing: unhealthy, with the reason.
    let why = "reports failing for 30s: 413 Payload Too Large";
    assert!(poll(&mut s, Some(why)).is_empty());
    let node = s.node(NODE);
    assert_eq!(node.status, "unhealthy");
    assert_eq!(node.unhealthy.as_deref(), Some(why));
    let second = s.submit(2);
    assert!(poll(&mut s, Some(why)).is_empty(), "an unhealthy node was sent new work");
    assert_eq!(s.state(second), "queued");
    assert_eq!(node.jobs, vec![first.0], "its running job stays");

    // A poll without the complaint: healthy, and the queued job goes there
    // (its start comes with the next poll).
    assert!(poll(&mut s, None).is_empty());
    let started = poll(&mut s, None);
    assert_eq!(s.node(NODE).status, "up");
    assert_eq!(s.node(NODE).unhealthy, None);
    assert_eq!(started.iter().map(|a| a.job).collect::<Vec<_>>(), vec![second]);
}

#[test]
fn a_report_that_gets_through_makes_the_node_healthy_again() {
    let mut s = start("report");
    assert!(poll(&mut s, Some("reports failing for 30s: connection refused")).is_empty());
    assert_eq!(s.node(NODE).status, "unhealthy");
    let job = s.submit(1);
    assert!(poll(&mut s, Some("still")).is_empty());
    assert_eq!(s.state(job), "queued");

    let report = Report { node: NODE.into(), events: Vec::<AgentEvent>::new(), id: None };
    s.call(|reply| Msg::Report { report, reply }).expect("report accepted");
    assert_eq!(s.node(NODE).status, "up");
    assert_eq!(s.state(job), "starting", "the healthy node takes the queued job");
}

#[test]
fn a_long_poll_asking_again_does_not_undo_a_report_that_got_through() {
    let mut s = start("again");
    assert!(poll(&mut s, Some("reports failing for 30s: 503")).is_empty());
    let report = Report { node: NODE.into(), events: Vec::<AgentEvent>::new(), id: None };
    s.call(|reply| Msg::Report { report, reply }).expect("report accepted");
    // The same long poll, woken: it says nothing of health.
    s.commands_saying(NODE, None);
    assert_eq!(s.node(NODE).status, "up");
}
