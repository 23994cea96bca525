//! Elastic gangs through the writer: a range is checked at submit; a job
//! placed on three nodes loses one to an on-demand job (the notice to
//! that node alone), goes on on two with the same attempt, grows back,
//! and is metered node by node; a restart in the middle keeps all of it.
//! The nodes that stay are told of each change of nodes.

use ebb_api::{
    Action, AgentEvent, AttemptRef, DrainAttempt, EventKind, JobSubmission, Membership, MembershipChange,
    StartAttempt,
};
use ebb_core::JobId;
use ebb_server::engine::Msg;

use crate::harness::*;

fn three_nodes(name: &str) -> TestEnv {
    let mut env = TestEnv::new(name);
    for node in ["a", "b", "c"] {
        env.register(node, Vec::new(), Vec::new());
    }
    env
}

fn submit(env: &mut TestEnv, spec: JobSubmission) -> Result<JobId, ebb_server::Refusal> {
    let principal = env.admin.clone();
    let spec = JobSubmission { argv: vec!["train".into()], ..spec };
    env.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).map(|ids| ids[0])
}

/// What nodes a, b and c were told since the last look, each node's in
/// order: their agents poll as they would while time passes.
#[derive(Default)]
struct Told(std::collections::BTreeMap<String, Vec<Action>>);

impl Told {
    /// Lets `ms` pass in steps of 10 s, every node polling at each.
    fn pass(&mut self, env: &mut TestEnv, ms: u64) {
        let mut left = ms;
        loop {
            for node in ["a", "b", "c"] {
                let actions = env.commands(node);
                self.0.entry(node.to_string()).or_default().extend(actions);
            }
            env.tick();
            if left == 0 {
                return;
            }
            let step = left.min(10_000);
            env.now += step;
            left -= step;
        }
    }

    /// The starts each node was told of, taken.
    fn starts(&mut self) -> Vec<(String, StartAttempt)> {
        let mut starts = Vec::new();
        for (node, actions) in &mut self.0 {
            for action in std::mem::take(actions) {
                if let Action::Start(start) = action {
                    starts.push((node.clone(), start));
                }
            }
        }
        starts
    }

    /// The nodes told to drain `attempt`, taken.
    fn drained(&mut self, attempt: AttemptRef) -> Vec<String> {
        self.drains(attempt).into_iter().map(|(node, _)| node).collect()
    }

    /// The drains of `attempt` each node was told, taken.
    fn drains(&mut self, attempt: AttemptRef) -> Vec<(String, DrainAttempt)> {
        let mut drained = Vec::new();
        for (node, actions) in &mut self.0 {
            actions.retain(|action| match action {
                Action::Drain(d) if d.attempt == attempt => {
                    drained.push((node.clone(), d.clone()));
                    false
                }
                _ => true,
            });
        }
        drained
    }

    /// The changes of nodes each node was told, taken.
    fn members(&mut self) -> Vec<(String, Membership)> {
        let mut told = Vec::new();
        for (node, actions) in &mut self.0 {
            actions.retain(|action| match action {
                Action::Members(m) => {
                    told.push((node.clone(), m.clone()));
                    false
                }
                _ => true,
            });
        }
        told
    }
}

/// The GPUs the metrics count preemptible jobs running on.
fn preemptible_running_gpus(env: &mut TestEnv) -> u64 {
    let metrics = env.call(|reply| Msg::Metrics { reply });
    metrics.gpus.get(&("preemptible", "running")).copied().unwrap_or(0)
}

/// The nodes of its attempt, its first first.
fn nodes_of(env: &mut TestEnv, id: JobId) -> Vec<String> {
    env.job(id).unwrap().placement.iter().map(|part| part.node.clone()).collect()
}

fn kinds(env: &mut TestEnv, id: JobId) -> Vec<EventKind> {
    env.job(id).unwrap().events.iter().map(|e| e.kind()).collect()
}

#[test]
fn a_range_is_refused_at_submit_naming_what_is_wrong() {
    let mut env = three_nodes("elastic-refusals");
    let elastic = |gpus, max, tier: &str| JobSubmission {
        gpus: Some(gpus),
        max_gpus: Some(max),
        tier: Some(tier.into()),
        ..Default::default()
    };
    for (spec, words) in [
        (elastic(16, 8, "preemptible"), "max_gpus: an elastic job's most GPUs must be above gpus (16)"),
        (elastic(8, 8, "preemptible"), "must be above gpus (8)"),
        (elastic(8, 16, "on-demand"), "max_gpus: only preemptible jobs are elastic"),
        (elastic(4, 16, "preemptible"), "whole nodes of 8 GPUs: 4:16"),
        (elastic(8, 20, "preemptible"), "whole nodes of 8 GPUs: 8:20"),
        (elastic(8, 32, "preemptible"), "max_gpus: 32 GPUs"),
    ] {
        let err = submit(&mut env, spec).unwrap_err();
        assert!(err.to_string().contains(words), "{err}");
    }
    assert!(env.jobs().is_empty(), "nothing refused was kept");
}

#[test]
fn an_elastic_gang_loses_a_node_goes_on_grows_back_and_is_metered_node_by_node() {
    let mut env = three_nodes("elastic-gang");
    let mut told = Told::default();
    let id =
        submit(&mut env, JobSubmission { gpus: Some(8), max_gpus: Some(24), ..Default::default() }).unwrap();
    told.pass(&mut env, 0);
    let started = told.starts();
    assert_eq!(started.len(), 3, "placed on every free node up to its most");
    let attempt = started[0].1.attempt;
    for (node, start) in &started {
        assert_eq!(start.attempt, attempt);
        assert_eq!(start.env["PET_NNODES"], "1:3");
        assert_eq!(start.env["PET_RDZV_BACKEND"], "c10d");
        assert_eq!(start.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"], "1");
        assert_eq!((start.env["EBB_GPUS_MIN"].as_str(), start.env["EBB_GPUS_MAX"].as_str()), ("8", "24"));
        let at_ms = env.now;
        env.report(node, vec![AgentEvent::Started { attempt, pid: 1, at_ms }]);
    }
    let first = env.job(id).unwrap().placement[0].node.clone();
    for (node, start) in &started {
        // The rendezvous store lives on the first node, which never leaves alone.
        assert_eq!(start.env["PET_RDZV_CONF"], format!("is_host={},last_call_timeout=5", *node == first));
        assert_eq!(start.env["EBB_FIRST_NODE"], first);
    }
    let job = env.job(id).unwrap();
    assert_eq!((job.gpus, job.max_gpus), (8, Some(24)));

    // An on-demand job needs a node: one of the others leaves, told alone.
    told.pass(&mut env, 600_000);
    let on_demand = JobSubmission { gpus: Some(8), tier: Some("on-demand".into()), ..Default::default() };
    let od = submit(&mut env, on_demand).unwrap();
    told.pass(&mut env, 0);
    let drained = told.drains(attempt);
    assert_eq!(drained.len(), 1, "the notice goes to the leaving node only: {drained:?}");
    let (leaving, notice) = drained[0].clone();
    assert_ne!(leaving, first, "the first node never leaves alone");
    // The nodes that stay hear of it at once, before the deadline, with
    // the nodes and GPUs the job will have; no signal, no drain.
    let staying: Vec<String> =
        ["a", "b", "c"].into_iter().filter(|n| *n != leaving).map(String::from).collect();
    let change = Membership {
        attempt,
        change: MembershipChange::Shrink,
        at_ms: notice.notice_at_ms,
        deadline_ms: Some(notice.deadline_ms),
        nodes: nodes_of(&mut env, id).into_iter().filter(|n| *n != leaving).collect(),
        leaving: vec![leaving.clone()],
        joining: vec![],
        gpus: 16,
        reason: notice.reason.clone(),
    };
    assert_eq!(change.nodes[0], first, "the first node first");
    let told_members: Vec<_> = told.members();
    assert_eq!(told_members, staying.iter().map(|n| (n.clone(), change.clone())).collect::<Vec<_>>());
    // A node that registers again (its agent restarted) is told again:
    // the leaving one its drain, one that stays the change.
    for node in ["a", "b", "c"] {
        env.register(node, vec![attempt], Vec::new());
    }
    told.pass(&mut env, 0);
    assert_eq!(told.drained(attempt), vec![leaving.clone()]);
    assert_eq!(told.members(), staying.iter().map(|n| (n.clone(), change.clone())).collect::<Vec<_>>());
    assert_eq!(env.state(id), "running");
    assert!(kinds(&mut env, id).contains(&EventKind::Shrinking));

    // The part exits: the job goes on on two nodes, same attempt; the
    // on-demand job starts on the freed node.
    told.pass(&mut env, 30_000);
    let left_at = env.now;
    env.report(&leaving, vec![exited(attempt, 143, left_at)]);
    assert_eq!(env.state(id), "running", "a part that leaves on a shrink does not end the attempt");
    let job = env.job(id).unwrap();
    assert_eq!(job.attempt, attempt.attempt.0);
    assert_eq!(job.placement.len(), 2);
    assert_eq!(preemptible_running_gpus(&mut env), 16, "the metrics count what it holds");
    assert!(kinds(&mut env, id).contains(&EventKind::Shrunk));
    told.pass(&mut env, 0);
    let od_start = told.starts();
    assert_eq!(od_start.len(), 1, "{od_start:?}");
    assert_eq!((od_start[0].0.as_str(), od_start[0].1.attempt.job), (leaving.as_str(), od));
    let od_attempt = od_start[0].1.attempt;

    // The on-demand job ends; after min_runtime the job grows back onto
    // the node, the same attempt joining its rendezvous.
    env.report(&leaving, vec![AgentEvent::Started { attempt: od_attempt, pid: 2, at_ms: left_at }]);
    told.pass(&mut env, 60_000);
    let at = env.now;
    env.report(&leaving, vec![exited(od_attempt, 0, at)]);
    told.pass(&mut env, 300_000);
    let told_members = told.members();
    let grown = told.starts();
    // The new part starts a few seconds after the grow (its image, its
    // directories): its node counts from then.
    env.now += 3_000;
    let grown_started = env.now;
    env.report(&leaving, vec![AgentEvent::Started { attempt, pid: 3, at_ms: grown_started }]);
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert_eq!(
        (grown[0].0.as_str(), grown[0].1.attempt),
        (leaving.as_str(), attempt),
        "the same attempt grows"
    );
    let events = env.job(id).unwrap().events;
    let grown_at = events.iter().find(|e| e.kind() == EventKind::Grown).expect("a grown event").at_ms;
    // Grown once min_runtime had passed since the shrink's notice.
    let noticed_at = events.iter().find(|e| e.kind() == EventKind::Shrinking).unwrap().at_ms;
    assert_eq!(grown_at - noticed_at, 300_000);
    assert_eq!(preemptible_running_gpus(&mut env), 24);
    assert_eq!(env.job(id).unwrap().placement.len(), 3);
    // The two nodes it ran on hear that it grows; the new one starts.
    let change = Membership {
        attempt,
        change: MembershipChange::Grow,
        at_ms: grown_at,
        deadline_ms: None,
        nodes: nodes_of(&mut env, id),
        leaving: vec![],
        joining: vec![leaving.clone()],
        gpus: 24,
        reason: format!("grown onto {leaving}"),
    };
    assert_eq!(told_members, staying.iter().map(|n| (n.clone(), change.clone())).collect::<Vec<_>>());

    // A restart keeps it all; the nodes register again saying what runs.
    env.restart();
    for node in ["a", "b", "c"] {
        env.register(node, vec![attempt], Vec::new());
    }
    assert_eq!(env.job(id).unwrap().placement.len(), 3);
    assert_eq!(env.state(id), "running");

    // Every part exits 0: the job succeeded, metered node by node.
    told.pass(&mut env, 100_000);
    let end = env.now;
    for node in ["a", "b", "c"] {
        env.report(node, vec![exited(attempt, 0, end)]);
    }
    assert_eq!(env.state(id), "succeeded");
    let usage = env.usage(id);
    assert_eq!(usage.len(), 1, "one record for the attempt");
    let parts = usage[0].parts();
    assert_eq!(parts.len(), 4, "three nodes from the start (one left), one grown: {parts:?}");
    let start = usage[0].started_ms;
    let secs = |from: u64, to: u64| (to - from).div_ceil(1000);
    let expected = 8 * secs(start, left_at) + 2 * 8 * secs(start, end) + 8 * secs(grown_started, end);
    assert_eq!(usage[0].gpu_seconds(), expected, "{parts:?}");
}

/// A running elastic job whose deadline needs on-demand is promoted where
/// it runs and stays as it is, rigid: on-demand work is never shrunk or
/// grown. A restart keeps it so.
#[test]
fn a_promoted_elastic_job_runs_on_rigid_at_its_size() {
    let mut env = three_nodes("elastic-promoted");
    let mut told = Told::default();
    let deadline = Some(ebb_server::rfc3339(env.now + 600_000));
    let spec = JobSubmission { gpus: Some(8), max_gpus: Some(24), deadline, ..Default::default() };
    let id = submit(&mut env, spec).unwrap();
    told.pass(&mut env, 0);
    let started = told.starts();
    assert_eq!(started.len(), 3);
    let attempt = started[0].1.attempt;
    for (node, _) in &started {
        let at_ms = env.now;
        env.report(node, vec![AgentEvent::Started { attempt, pid: 1, at_ms }]);
    }
    // 40% in 300 s: the rest does not fit before the deadline.
    told.pass(&mut env, 300_000);
    let at_ms = env.now;
    env.report(&started[0].0, vec![AgentEvent::Progress { attempt, fraction: 0.4, at_ms }]);
    let job = env.job(id).unwrap();
    assert_eq!(
        (job.tier.as_str(), job.state.as_str(), job.gpus, job.max_gpus),
        ("on-demand", "running", 24, None)
    );
    env.restart();
    for node in ["a", "b", "c"] {
        env.register(node, vec![attempt], Vec::new());
    }
    let job = env.job(id).unwrap();
    assert_eq!(
        (job.tier.as_str(), job.state.as_str(), job.gpus, job.max_gpus),
        ("on-demand", "running", 24, None)
    );
}
