//! GPUs that go bad, as the writer sees its agents' health reports: a
//! fatal finding takes the GPU out and requeues the attempt on it as lost,
//! metered to the fault; a drain finding drains the node with the window;
//! a warning changes nothing; a GPU that faults twice in a day stays out
//! until the operator returns it; a restart keeps all of it; bad reports
//! are refused whole, by name. The writer (`Engine`) is driven directly,
//! speaking the agent protocol as `ebb agent` does.

use ebb_core::{Attempt, JobId};
use std::collections::BTreeMap;

use ebb_api::{
    Action, AgentEvent, AttemptRef, Finding, GpuFinding, JobSubmission, Register, Report, Throttle,
};
use ebb_core::Span;
use ebb_server::billing::Pricing;
use ebb_server::engine::{EngineConfig, Msg};
use tokio::sync::oneshot;

use crate::harness::TestEnv;

const NODE: &str = "node-0";
const START: u64 = crate::harness::T0;

/// The writer with one 10-GPU node, on the one harness (`TestEnv`), in
/// this file's words.
struct Server {
    env: TestEnv,
}

fn config(dir: &std::path::Path) -> EngineConfig {
    EngineConfig {
        drain_window: Span(60_000),
        // Days pass in these tests without a poll: the node is never lost.
        heartbeat_timeout: Span(30 * 86_400_000),
        keep_finished: Span(3_600_000),
        pricing: Pricing { prices: Vec::new(), default_price: 3_600_000, discount_bps: 5_000 },
        ..EngineConfig::for_tests(dir)
    }
}

fn xid(gpu: u8, code: u32) -> GpuFinding {
    GpuFinding { gpu: Some(gpu), finding: Finding::Xid { code } }
}

impl Server {
    fn start(name: &str) -> Server {
        let mut env = TestEnv::new(&format!("gpu-faults-{name}"));
        env.now = START;
        env.config = config(&env.dir);
        env.restart();
        let mut server = Server { env };
        server.register(Vec::new()).unwrap();
        server
    }

    fn now(&self) -> u64 {
        self.env.now
    }

    /// The server restarts on its database; the agent registers again,
    /// saying what it runs.
    fn restart(&mut self, running: Vec<AttemptRef>) {
        self.env.restart();
        self.register_running(running, Vec::new()).unwrap();
    }

    fn register(&mut self, unreported: Vec<AgentEvent>) -> Result<(), ebb_server::Refusal> {
        self.register_running(Vec::new(), unreported)
    }

    fn register_running(
        &mut self,
        running: Vec<AttemptRef>,
        unreported: Vec<AgentEvent>,
    ) -> Result<(), ebb_server::Refusal> {
        self.env.try_register(Register {
            node: NODE.into(),
            gpu_model: "H100".into(),
            gpus: 10,
            labels: BTreeMap::new(),
            running,
            address: None,
            unreported,
            starts_when_free: false,
            waiting: Vec::new(),
            cpus: None,
            memory_mib: None,
        })
    }

    fn advance(&mut self, ms: u64) {
        self.env.now += ms;
        self.env.call(|reply| Msg::Metrics { reply });
    }

    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        self.env.call(make)
    }

    /// One poll: the commands it brings.
    fn poll(&mut self) -> Vec<Action> {
        self.env.commands_saying(NODE, Some(None))
    }

    /// Polls and reports every start as begun now: the attempts and their GPUs.
    fn start_what_is_sent(&mut self) -> Vec<(AttemptRef, Vec<u8>)> {
        let starts: Vec<(AttemptRef, Vec<u8>)> = self
            .poll()
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(s) => Some((s.attempt, s.gpus)),
                _ => None,
            })
            .collect();
        let now = self.now();
        let events = starts
            .iter()
            .map(|(attempt, _)| AgentEvent::Started { attempt: *attempt, pid: 1, at_ms: now })
            .collect();
        self.report(events).expect("starts reported");
        starts
    }

    fn report(&mut self, events: Vec<AgentEvent>) -> Result<ebb_api::ReportReply, ebb_server::Refusal> {
        let report = Report { node: NODE.into(), events, id: None };
        self.call(|reply| Msg::Report { report, reply })
    }

    fn health(&mut self, findings: Vec<GpuFinding>, at_ms: u64) {
        self.report(vec![AgentEvent::Health { findings, at_ms }]).expect("health reported");
    }

    fn submit(&mut self, gpus: u32, tier: &str) -> u64 {
        let spec = JobSubmission {
            gpus: Some(gpus),
            tier: Some(tier.into()),
            argv: vec!["work".into()],
            ..Default::default()
        };
        let principal = self.env.admin.clone();
        (self.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).expect("submitted")[0]).0
    }

    fn node(&mut self) -> ebb_api::Node {
        self.env.node(NODE)
    }

    fn job(&mut self, id: u64) -> ebb_api::Job {
        self.env.job(JobId(id)).expect("job")
    }

    fn undrain(&mut self, gpu: Option<u8>) -> Result<ebb_api::Node, ebb_server::Refusal> {
        self.call(|reply| Msg::UndrainNode { name: NODE.into(), gpu, reply })
    }

    fn metrics(&mut self) -> String {
        ebb_server::metrics::render(&self.call(|reply| Msg::Metrics { reply }))
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

#[test]
fn an_xid_79_requeues_the_attempt_on_its_gpu_as_lost_metered_to_the_fault_and_keeps_the_gpu_out() {
    let mut s = Server::start("xid");
    let big = s.submit(8, "preemptible");
    let started = s.start_what_is_sent();
    assert_eq!(started, vec![(AttemptRef { job: JobId(big), attempt: Attempt(1) }, (0..8).collect())]);
    let small = s.submit(2, "on-demand");
    let started = s.start_what_is_sent();
    assert_eq!(started, vec![(AttemptRef { job: JobId(small), attempt: Attempt(1) }, vec![8, 9])]);

    // GPU 3 falls off the bus 50 s in; the agent's report comes 10 s later.
    s.advance(60_000);
    s.health(vec![xid(3, 79)], START + 50_000);
    let job = s.job(big);
    assert_eq!(job.state, "queued", "requeued at once");
    let usage = &job.usage[0];
    assert_eq!((usage.outcome.as_str(), usage.ended_ms), ("lost", START + 50_000), "metered to the fault");
    let requeued = job.events.iter().rev().find(|e| e.kind().as_str() == "requeued").expect("requeued");
    let said = &requeued.text;
    assert!(said.contains("lost") && said.contains("Xid 79 (fallen off the bus)"), "{said}");
    let stops: Vec<Action> = s.poll().into_iter().filter(|a| matches!(a, Action::Stop { .. })).collect();
    assert!(
        matches!(stops.as_slice(), [Action::Stop { attempt, .. }] if *attempt == AttemptRef { job: JobId(big), attempt: Attempt(1) }),
        "the node is told to stop the attempt: {stops:?}"
    );
    assert_eq!(s.job(small).state, "running", "the on-demand job on GPUs 8-9 goes on");
    let node = s.node();
    assert_eq!(node.gpus_out.len(), 1);
    assert_eq!((node.gpus_out[0].gpu, node.gpus_out[0].until_returned), (3, false));
    assert_eq!(node.gpus_out[0].reason, "GPU 3: Xid 79 (fallen off the bus)");
    // The exit the agent reports afterwards changes nothing.
    let exit = AgentEvent::Exited {
        attempt: AttemptRef { job: JobId(big), attempt: Attempt(1) },
        code: None,
        signal: Some(9),
        completed: false,
        at_ms: s.now(),
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
        ended_by: None,
    };
    s.report(vec![exit]).unwrap();
    assert_eq!(s.job(big).usage.len(), 1, "billed once, to the fault");

    // 7 GPUs are left free on the node: the 8-GPU job waits, a 7-GPU job
    // starts there, on every free GPU but 3.
    assert!(s.start_what_is_sent().is_empty());
    assert_eq!(s.job(big).pending_reason, Some(ebb_api::PendingReason::Resources));
    let seven = s.submit(7, "on-demand");
    let started = s.start_what_is_sent();
    assert_eq!(
        started,
        vec![(AttemptRef { job: JobId(seven), attempt: Attempt(1) }, vec![0, 1, 2, 4, 5, 6, 7])]
    );
    let metrics = s.metrics();
    assert_eq!(metric(&metrics, "ebb_gpus_faulted"), 1.0);
    assert_eq!(metric(&metrics, "ebb_health_findings_total{class=\"fatal\",kind=\"xid\"}"), 1.0);
    assert_eq!(metric(&metrics, "ebb_gpus"), 9.0, "capacity without the GPU out");

    // A restart keeps it out, and its attempt ended.
    let running = vec![
        AttemptRef { job: JobId(small), attempt: Attempt(1) },
        AttemptRef { job: JobId(seven), attempt: Attempt(1) },
    ];
    s.restart(running);
    assert_eq!(s.node().gpus_out.iter().map(|o| o.gpu).collect::<Vec<_>>(), vec![3]);
    assert_eq!(s.job(big).state, "queued");
    assert_eq!(metric(&s.metrics(), "ebb_gpus"), 9.0);
    // The interruption counts toward the M of the interval recommended to
    // an attempt placed after it.
    let interval = s.job(seven).checkpoint_interval_why.expect("an interval");
    assert!(interval.contains("M from 1 unannounced interruption"), "{interval}");
}

#[test]
fn a_gpu_that_faults_twice_in_a_day_stays_out_until_the_operator_returns_it() {
    let mut s = Server::start("twice");
    s.health(vec![xid(3, 48)], START);
    assert!(!s.node().gpus_out[0].until_returned);
    // The GPU was reset: its agent finds nothing wrong, and it is back.
    s.advance(1_000);
    s.health(Vec::new(), s.now());
    assert!(s.node().gpus_out.is_empty(), "back once its fault cleared");
    // Again within the day: out, and it stays out when the fault clears.
    s.advance(3_600_000);
    s.health(vec![xid(3, 79)], s.now());
    assert!(s.node().gpus_out[0].until_returned);
    s.advance(1_000);
    s.health(Vec::new(), s.now());
    let out = s.node().gpus_out;
    assert_eq!((out.len(), out[0].until_returned), (1, true), "kept out for the operator");
    assert_eq!(metric(&s.metrics(), "ebb_gpus_faulted"), 1.0);

    // The operator returns it; asking for a GPU in service or one the
    // node lacks is refused by name.
    let refused = s.undrain(Some(4)).unwrap_err();
    assert_eq!(
        (ebb_server::http::status(refused.kind), refused.message.as_str()),
        (409, "node node-0: GPU 4 is in service")
    );
    let refused = s.undrain(Some(10)).unwrap_err();
    assert_eq!(
        (ebb_server::http::status(refused.kind), refused.message.as_str()),
        (422, "gpu: node node-0 has GPUs 0 to 9, got 10")
    );
    let node = s.undrain(Some(3)).expect("returned");
    assert!(node.gpus_out.is_empty());
    let refused = s.undrain(None).unwrap_err();
    assert_eq!(ebb_server::http::status(refused.kind), 409, "{}", refused.message);
    assert_eq!(metric(&s.metrics(), "ebb_gpus"), 10.0);

    // A day after, one more fault is a first one again.
    s.advance(25 * 3_600_000);
    s.health(vec![xid(3, 79)], s.now());
    assert!(!s.node().gpus_out[0].until_returned);
}

#[test]
fn a_drain_finding_drains_the_node_with_its_window_and_a_warning_changes_nothing() {
    let mut s = Server::start("drain");
    let preemptible = s.submit(4, "preemptible");
    let on_demand = s.submit(4, "on-demand");
    assert_eq!(s.start_what_is_sent().len(), 2);

    // Thermal throttling: shown and counted, nothing else.
    let hot = GpuFinding { gpu: Some(5), finding: Finding::Throttled { reason: Throttle::Thermal } };
    s.health(vec![hot.clone()], s.now());
    let node = s.node();
    assert_eq!(node.status, "up");
    assert_eq!(node.warnings, vec!["GPU 5: throttled at its thermal limit".to_string()]);
    assert!(s.poll().is_empty(), "a warning sends nothing");
    assert_eq!(metric(&s.metrics(), "ebb_health_findings_total{class=\"warn\",kind=\"throttled\"}"), 1.0);
    s.health(vec![hot.clone()], s.now());
    assert_eq!(
        metric(&s.metrics(), "ebb_health_findings_total{class=\"warn\",kind=\"throttled\"}"),
        1.0,
        "a finding still there is not counted again"
    );

    // The operator's check fails, naming no GPU: the node drains with the
    // window, the preemptible job first, the on-demand job left to finish.
    let failed = GpuFinding {
        gpu: None,
        finding: Finding::CheckFailed { code: Some(1), output: "dcgmi diag: PCIe test failed".into() },
    };
    s.health(vec![hot, failed], s.now());
    let node = s.node();
    assert_eq!(node.status, "draining");
    let why = node.drained_for.expect("drained for its health");
    assert_eq!(why, "the health check exited 1: dcgmi diag: PCIe test failed");
    let drains: Vec<Action> = s.poll().into_iter().filter(|a| matches!(a, Action::Drain(_))).collect();
    match drains.as_slice() {
        [Action::Drain(d)] => {
            assert_eq!(d.attempt, AttemptRef { job: JobId(preemptible), attempt: Attempt(1) });
            assert_eq!(d.deadline_ms - d.notice_at_ms, 60_000, "the ordinary window");
            assert_eq!(d.reason, format!("node node-0 drained for its health: {why}"));
        }
        other => panic!("one drain, of the preemptible job: {other:?}"),
    }
    assert_eq!(s.job(on_demand).state, "running");
    assert!(s.job(preemptible).events.iter().all(|e| e.kind().as_str() != "requeued"));
    // Nothing new is placed on it; undrain returns it.
    let next = s.submit(1, "on-demand");
    assert!(s.start_what_is_sent().is_empty());
    let node = s.undrain(None).expect("undrained");
    assert_eq!((node.status.as_str(), node.drained_for), ("up", None));
    assert_eq!(s.start_what_is_sent().iter().map(|(a, _)| a.job.0).collect::<Vec<_>>(), vec![next]);
    // The drain was announced: it is no interruption, for an attempt
    // placed after it.
    let interval = s.job(next).checkpoint_interval_why.expect("an interval");
    assert!(interval.contains("M from 0 unannounced"), "{interval}");
}

#[test]
fn a_health_report_past_its_bounds_is_refused_whole_by_name() {
    let mut s = Server::start("bounds");
    let job = s.submit(1, "preemptible");
    let started = s.start_what_is_sent();
    let attempt = started[0].0;
    let progress =
        AgentEvent::Checkpoint { attempt, step: Some(7), bytes: None, duration_ms: 10, at_ms: s.now() };
    let cases = [
        (vec![xid(10, 79)], "events[1].findings[0].gpu: node node-0 has GPUs 0 to 9, got 10"),
        (
            vec![GpuFinding {
                gpu: Some(0),
                finding: Finding::CheckFailed { code: Some(1), output: "x".repeat(2049) },
            }],
            "events[1].findings[0].output: at most 2048 characters, got 2049",
        ),
        (vec![xid(0, 13); 513], "events[1].findings: at most 512 findings, got 513"),
    ];
    for (findings, said) in cases {
        let events = vec![progress.clone(), AgentEvent::Health { findings, at_ms: s.now() }];
        let refused = s.report(events).unwrap_err();
        // A GPU the node lacks is the cluster's refusal; the bounds, the document's.
        let status = if said.contains(".gpu: ") { 422 } else { 400 };
        assert_eq!(ebb_server::http::status(refused.kind), status, "{}", refused.message);
        assert!(refused.message.starts_with(said), "{}", refused.message);
        assert!(refused.message.ends_with("nothing of this request was applied"), "{}", refused.message);
    }
    let late = vec![AgentEvent::Health { findings: vec![xid(0, 79)], at_ms: s.now() + 3_600_000 }];
    assert_eq!(s.report(late).unwrap_err().kind, ebb_server::Refused::Unacceptable);
    let refused =
        s.register(vec![AgentEvent::Health { findings: vec![xid(12, 79)], at_ms: s.now() }]).unwrap_err();
    assert!(refused.message.starts_with("unreported[0].findings[0].gpu: "), "{}", refused.message);
    assert!(s.node().gpus_out.is_empty(), "nothing applied");
    assert_eq!(s.job(job).state, "running");
    assert_eq!(s.job(job).last_checkpoint, None, "the checkpoint beside them was not applied either");
}

/// An agent told to stop (SIGTERM) drains its node, as a health finding
/// may: its preemptible attempt gets the notice, its on-demand one runs
/// on until the agent ends it at its stop timeout, which requeues it, not
/// fails it; the agent's next registration returns the node to service,
/// and does not undo an operator's drain.
#[test]
fn an_agents_stop_drains_the_node_requeues_what_it_ends_and_its_return_undoes_only_that_drain() {
    let mut s = Server::start("agent-stop");
    let preemptible = s.submit(2, "preemptible");
    let on_demand = s.submit(2, "on-demand");
    assert_eq!(s.start_what_is_sent().len(), 2);

    s.report(vec![AgentEvent::Stopping { stop_timeout_ms: 360_000, at_ms: s.now() }]).unwrap();
    let node = s.node();
    assert_eq!(
        node.drained_for.as_deref(),
        Some("its agent is stopping (SIGTERM): what still runs after 6m 00s is ended and requeued")
    );
    let actions = s.poll();
    let drained: Vec<AttemptRef> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Drain(d) => Some(d.attempt),
            _ => None,
        })
        .collect();
    assert_eq!(drained, [AttemptRef { job: JobId(preemptible), attempt: Attempt(1) }], "{actions:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::Stop { .. })), "{actions:?}");
    // Nothing new lands on a node whose agent is going.
    let later = s.submit(1, "on-demand");
    assert!(s.start_what_is_sent().is_empty());

    // The preemptible job saves and exits 0; the on-demand one is ended by
    // the agent at its stop timeout.
    s.advance(5_000);
    let exit = |job: u64, code: Option<i32>, signal: Option<i32>, ended_by, at_ms| AgentEvent::Exited {
        attempt: AttemptRef { job: JobId(job), attempt: Attempt(1) },
        code,
        signal,
        completed: false,
        at_ms,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
        ended_by,
    };
    s.report(vec![exit(preemptible, Some(0), None, None, s.now())]).unwrap();
    s.advance(355_000);
    s.report(vec![exit(on_demand, None, Some(15), Some(ebb_api::EndedBy::NodeStopping), s.now())]).unwrap();
    let job = s.job(preemptible);
    assert_eq!((job.state.as_str(), job.usage[0].outcome.as_str()), ("queued", "preempted"));
    let job = s.job(on_demand);
    assert_eq!(
        (job.state.as_str(), job.usage[0].outcome.as_str()),
        ("queued", "lost"),
        "requeued, not failed"
    );
    let requeued = job.events.iter().rev().find(|e| e.kind().as_str() == "requeued").expect("requeued");
    assert!(
        requeued.text.contains("node-0's agent stopped (SIGTERM) before the attempt ended"),
        "{}",
        requeued.text
    );

    // The agent starts again: the node is back, and takes all three.
    s.register(Vec::new()).unwrap();
    let node = s.node();
    assert_eq!((node.status.as_str(), node.drained_for.as_deref()), ("up", None));
    let mut started: Vec<u64> = s.start_what_is_sent().into_iter().map(|(a, _)| a.job.0).collect();
    started.sort();
    assert_eq!(started, [preemptible, on_demand, later]);

    // An operator's drain outlives the agent's restarts.
    let drained = s.call(|reply| Msg::DrainNode { name: NODE.into(), reply }).unwrap();
    assert_eq!(drained.drained_for, None);
    s.report(vec![AgentEvent::Stopping { stop_timeout_ms: 0, at_ms: s.now() }]).unwrap();
    assert_eq!(s.node().drained_for, None, "the operator's drain stands");
    s.register(Vec::new()).unwrap();
    assert_ne!(s.node().status, "up");
}
