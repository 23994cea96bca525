//! Starts sent ahead: a preemptor's start goes to its hold's node with the
//! drain notices (`when_gpus_free`), the node's report of its victims'
//! exits and then of its start places it, and a hold that goes without its
//! placement withdraws the start and spends its number.

use ebb_core::{Attempt, JobId};
use std::collections::BTreeSet;

use ebb_api::{Action, AgentEvent, AttemptRef, EventKind, JobSubmission, Register, Report, StartAttempt};
use ebb_server::engine::Msg;
use ebb_server::store::SqliteStore;
use ebb_server::Principal;
use proptest::prelude::*;

use super::harness::{exited, TestEnv};

fn submit(env: &mut TestEnv, tier: &str) -> u64 {
    let spec = JobSubmission {
        gpus: Some(8),
        argv: vec!["work".into()],
        tier: Some(tier.into()),
        ..Default::default()
    };
    let principal = env.admin.clone();
    (env.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).unwrap()[0]).0
}

fn started(attempt: AttemptRef, at_ms: u64) -> AgentEvent {
    AgentEvent::Started { attempt, pid: 4242, at_ms }
}

/// A node whose whole 8 GPUs run a preemptible job, and an on-demand job
/// submitted for them: the victim, the preemptor, and what the node was
/// told after the preemption.
fn preempted(env: &mut TestEnv) -> (AttemptRef, u64, Vec<Action>) {
    env.register("n1", Vec::new(), Vec::new());
    let victim = submit(env, "preemptible");
    let victim = env.poll("n1").into_iter().find(|a| a.job == JobId(victim)).expect("placed");
    let now = env.now;
    env.report("n1", vec![started(victim, now)]);
    let od = submit(env, "on-demand");
    let commands = env.commands("n1");
    (victim, od, commands)
}

fn starts(commands: &[Action]) -> Vec<&StartAttempt> {
    commands.iter().filter_map(|a| if let Action::Start(s) = a { Some(s) } else { None }).collect()
}

#[test]
fn the_preemptors_start_goes_with_the_notice_and_its_start_after_the_exits_places_it() {
    let mut env = TestEnv::new("staged-flow");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    assert!(commands.iter().any(|a| matches!(a, Action::Drain(d) if d.attempt == victim)), "{commands:?}");
    let sent = starts(&commands);
    assert_eq!(sent.len(), 1, "{commands:?}");
    let start = sent[0];
    assert_eq!(
        (start.attempt, start.when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(1) }, true)
    );
    assert_eq!(start.gpus, (0..8).collect::<Vec<u8>>());
    assert!(start.env.contains_key("EBB_CHECKPOINT_INTERVAL_S"), "{:?}", start.env);
    // Until the node says so, the preemptor waits for its victim.
    let job = env.job(JobId(od)).unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("queued", 0));

    // One report: the victim's exit, then the preemptor's start.
    env.now += 3;
    let now = env.now;
    env.report("n1", vec![exited(victim, 0, now - 1), started(start.attempt, now)]);
    let job = env.job(JobId(od)).unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("running", 1));
    let kinds: Vec<EventKind> = job.events.iter().map(|e| e.kind()).collect();
    let at = |k| kinds.iter().position(|x| *x == k).unwrap_or_else(|| panic!("{k:?} in {kinds:?}"));
    assert!(
        at(EventKind::Preempting) < at(EventKind::Placed) && at(EventKind::Placed) < at(EventKind::Started)
    );
    assert_eq!(env.job(JobId(victim.job.0)).unwrap().state, "queued", "the victim is requeued");
    // Nothing is sent again: the start the node made is the placement's.
    assert!(starts(&env.commands("n1")).iter().all(|s| s.attempt.job != JobId(od)));

    // The same with the exit and the start in two reports: the exit's
    // batch places the job and sends nothing; the start makes it run.
    let mut env = TestEnv::new("staged-two-reports");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    let attempt = starts(&commands)[0].attempt;
    let now = env.now;
    env.report("n1", vec![exited(victim, 0, now)]);
    let job = env.job(JobId(od)).unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("starting", 1));
    assert!(starts(&env.commands("n1")).iter().all(|s| s.attempt.job != JobId(od)), "no second start");
    env.report("n1", vec![started(attempt, now)]);
    assert_eq!(env.job(JobId(od)).unwrap().state, "running");
}

#[test]
fn an_agent_that_cannot_hold_starts_back_gets_its_start_after_the_exits() {
    let mut env = TestEnv::new("staged-unable");
    let (victim, od, commands) = preempted(&mut env);
    assert!(starts(&commands).is_empty(), "{commands:?}");
    let now = env.now;
    env.report("n1", vec![exited(victim, 0, now)]);
    let sent = env.commands("n1");
    let sent = starts(&sent);
    assert_eq!(
        (sent[0].attempt, sent[0].when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(1) }, false)
    );
}

#[test]
fn a_hold_whose_victim_is_a_gang_part_waits_for_the_whole_gang() {
    // The gang's part on the other node could outlast this node's: the
    // start is not sent ahead, and goes once the whole gang has exited.
    let mut env = TestEnv::new("staged-gang");
    env.starts_when_free = true;
    env.register("n1", Vec::new(), Vec::new());
    env.register("n2", Vec::new(), Vec::new());
    let spec = JobSubmission { gpus: Some(16), argv: vec!["work".into()], ..Default::default() };
    let principal = env.admin.clone();
    let gang = env.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).unwrap()[0];
    let mut parts = Vec::new();
    for node in ["n1", "n2"] {
        let attempt = env.poll(node).into_iter().find(|a| a.job == gang).expect("a part on each node");
        let now = env.now;
        env.report(node, vec![started(attempt, now)]);
        parts.push(attempt);
    }
    let od = submit(&mut env, "on-demand");
    for node in ["n1", "n2"] {
        let commands = env.commands(node);
        assert!(starts(&commands).is_empty(), "{node}: {commands:?}");
    }
    let now = env.now;
    env.report("n1", vec![exited(parts[0], 0, now)]);
    env.report("n2", vec![exited(parts[1], 0, now)]);
    let node = &env.job(JobId(od)).unwrap().placement[0].node.clone();
    let commands = env.commands(node);
    let sent = starts(&commands);
    assert_eq!(
        (sent[0].attempt, sent[0].when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(1) }, false)
    );
}

#[test]
fn a_hold_that_goes_withdraws_its_start_and_spends_its_number() {
    // The preemptor is cancelled while its victim drains: the node is
    // told to withdraw the start, and a start it made anyway is stale.
    let mut env = TestEnv::new("staged-cancel");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    let attempt = starts(&commands)[0].attempt;
    env.cancel(JobId(od), None).unwrap();
    let commands = env.commands("n1");
    assert!(
        commands.iter().any(|a| matches!(a, Action::Stop { attempt: a, .. } if *a == attempt)),
        "{commands:?}"
    );
    let now = env.now;
    let (msg, mut reply) =
        TestEnv::<SqliteStore>::report_msg("n1", vec![exited(victim, 0, now), started(attempt, now)]);
    env.call_quiet(msg);
    assert_eq!(reply.try_recv().unwrap().unwrap().stale, vec![attempt]);
    assert_eq!(env.job(JobId(od)).unwrap().state, "cancelled");
    let metrics = env.call(|reply| Msg::Metrics { reply });
    assert_eq!((metrics.counters.starts_ahead, metrics.counters.starts_withdrawn), (1, 1));

    // The node starts it while the server still has the victim there (an
    // agent that did not wait): stale, withdrawn, and the job's placement
    // once the victim has gone is the next number, sent as any start.
    let mut env = TestEnv::new("staged-early");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    let attempt = starts(&commands)[0].attempt;
    let now = env.now;
    let (msg, mut reply) = TestEnv::<SqliteStore>::report_msg("n1", vec![started(attempt, now)]);
    env.call_quiet(msg);
    assert_eq!(reply.try_recv().unwrap().unwrap().stale, vec![attempt]);
    let commands = env.commands("n1");
    assert!(commands.iter().any(|a| matches!(a, Action::Stop { attempt: a, .. } if *a == attempt)));
    assert_eq!(env.job(JobId(od)).unwrap().state, "queued", "still waits for its victim");
    env.report("n1", vec![exited(victim, 0, now)]);
    let sent = env.commands("n1");
    let sent = starts(&sent);
    assert_eq!(
        (sent[0].attempt, sent[0].when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(2) }, false)
    );
    let job = env.job(JobId(od)).unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("starting", 2));
}

#[test]
fn a_takeover_keeps_a_staged_start_and_sends_it_again_to_an_agent_without_it() {
    // The agent comes back holding it: nothing is sent again, and its
    // start after the victim's exit places the job as promised.
    let mut env = TestEnv::new("staged-takeover");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    let attempt = starts(&commands)[0].attempt;
    env.restart();
    env.waiting = vec![attempt];
    env.register("n1", vec![victim], Vec::new());
    let commands = env.commands("n1");
    assert!(starts(&commands).is_empty(), "{commands:?}");
    assert!(commands.iter().any(|a| matches!(a, Action::Drain(d) if d.attempt == victim)), "{commands:?}");
    let now = env.now;
    env.report("n1", vec![exited(victim, 0, now), started(attempt, now)]);
    let job = env.job(JobId(od)).unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("running", 1));

    // An agent that restarted too comes back without it: it is sent again.
    let mut env = TestEnv::new("staged-agent-restart");
    env.starts_when_free = true;
    let (victim, od, _) = preempted(&mut env);
    env.restart();
    env.register("n1", vec![victim], Vec::new());
    let commands = env.commands("n1");
    let sent = starts(&commands);
    assert_eq!(
        (sent[0].attempt, sent[0].when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(1) }, true)
    );

    // An agent that no longer says it can hold starts back: the staged
    // start is withdrawn from it at registration (it holds none), and the
    // placement after the exit is sent as any start, numbered after it.
    let mut env = TestEnv::new("staged-agent-unable");
    env.starts_when_free = true;
    let (victim, od, commands) = preempted(&mut env);
    let attempt = starts(&commands)[0].attempt;
    env.starts_when_free = false;
    env.register("n1", vec![victim], Vec::new());
    let now = env.now;
    env.report("n1", vec![exited(victim, 0, now)]);
    let commands = env.commands("n1");
    let sent = starts(&commands);
    assert_eq!(
        (sent[0].attempt, sent[0].when_gpus_free),
        (AttemptRef { job: JobId(od), attempt: Attempt(2) }, false)
    );
    assert_ne!(sent[0].attempt, attempt);
}

/// What happens to a staged start, in any order.
#[derive(Clone, Debug)]
enum Step {
    /// The node polls and does what it is told, as the agent does.
    Poll,
    /// The victim exits; the node starts a start waiting for its GPUs
    /// (its exit and that start in one report, or two).
    VictimExits {
        one_report: bool,
    },
    /// The staged start cannot start (its image, say): an exit of 127.
    StartFails,
    CancelPreemptor,
    DrainNode,
    UndrainNode,
    /// `kill -9` of the server; the node registers again with what it runs
    /// and holds.
    ServerRestart,
    /// The agent restarts: what it ran and held is gone.
    AgentRestart,
    /// The node registers again saying it can, or cannot, hold starts.
    Reregister {
        capable: bool,
    },
    /// Time passes (the drain's deadline, the tick's work).
    Tick {
        ms: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Poll),
        3 => any::<bool>().prop_map(|one_report| Step::VictimExits { one_report }),
        1 => Just(Step::StartFails),
        1 => Just(Step::CancelPreemptor),
        1 => Just(Step::DrainNode),
        1 => Just(Step::UndrainNode),
        1 => Just(Step::ServerRestart),
        1 => Just(Step::AgentRestart),
        1 => any::<bool>().prop_map(|capable| Step::Reregister { capable }),
        1 => (0u64..5_000).prop_map(|ms| Step::Tick { ms }),
    ]
}

/// The node as the agent behaves: what runs, what waits for its GPUs,
/// every attempt of the preemptor it ever started.
struct Node {
    victim: Option<AttemptRef>,
    waiting: Option<AttemptRef>,
    running: BTreeSet<AttemptRef>,
    ever_started: Vec<AttemptRef>,
    capable: bool,
}

impl Node {
    fn start(&mut self, env: &mut TestEnv, attempt: AttemptRef, events: &mut Vec<AgentEvent>) {
        assert!(!self.ever_started.contains(&attempt), "{attempt:?} started twice: {:?}", self.ever_started);
        assert!(self.victim.is_none(), "the preemptor started while its victim ran");
        self.ever_started.push(attempt);
        self.running.insert(attempt);
        events.push(started(attempt, env.now));
    }

    /// A report; the attempts it says are stale are killed.
    fn report(&mut self, env: &mut TestEnv, events: Vec<AgentEvent>) {
        if events.is_empty() {
            return;
        }
        let report = Report { node: "n1".into(), events, id: None };
        let reply = env.call(|reply| Msg::Report { report, reply }).expect("report taken");
        let killed: Vec<AgentEvent> =
            reply.stale.iter().filter(|a| self.running.remove(a)).map(|a| exited(*a, 137, env.now)).collect();
        self.report(env, killed);
    }

    fn register(&mut self, env: &mut TestEnv) {
        let reg = Register {
            node: "n1".into(),
            gpu_model: "H100".into(),
            gpus: 8,
            labels: Default::default(),
            running: self.victim.iter().chain(self.running.iter()).copied().collect(),
            address: None,
            unreported: Vec::new(),
            starts_when_free: self.capable,
            waiting: self.waiting.iter().copied().collect(),
            cpus: None,
            memory_mib: None,
        };
        let principal = Principal::node("n1");
        let registered = env.call(|reply| Msg::Register { principal, reg, reply }).expect("registered");
        env.agents.get_mut("n1").unwrap().epoch = registered.epoch;
        env.agents.get_mut("n1").unwrap().after = registered.next_seq;
        for a in &registered.kill {
            if self.waiting == Some(*a) {
                self.waiting = None;
            }
            if self.running.remove(a) {
                let now = env.now;
                self.report(env, vec![exited(*a, 137, now)]);
            }
            assert_ne!(self.victim, Some(*a), "the victim is the server's");
        }
    }

    fn poll(&mut self, env: &mut TestEnv, od: u64) {
        let mut events = Vec::new();
        for action in env.commands("n1") {
            match action {
                Action::Start(s) if s.attempt.job == JobId(od) => {
                    if self.running.contains(&s.attempt) || self.waiting == Some(s.attempt) {
                        continue; // a repeated command
                    }
                    assert!(
                        s.when_gpus_free || self.victim.is_none(),
                        "a start onto the victim's GPUs: {s:?}"
                    );
                    assert!(
                        !s.when_gpus_free || self.capable,
                        "a start held back sent to a node that cannot"
                    );
                    match (s.when_gpus_free && self.victim.is_some(), self.waiting) {
                        (true, None) => self.waiting = Some(s.attempt),
                        (true, Some(w)) => panic!("two starts held back: {w:?} and {:?}", s.attempt),
                        (false, _) => self.start(env, s.attempt, &mut events),
                    }
                }
                Action::Stop { attempt, .. } if attempt.job == JobId(od) => {
                    if self.waiting == Some(attempt) {
                        self.waiting = None;
                    }
                    if self.running.remove(&attempt) {
                        events.push(exited(attempt, 143, env.now));
                    }
                }
                _ => {}
            }
        }
        self.report(env, events);
    }
}

static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 100, ..ProptestConfig::default() })]

    /// Whatever happens around a staged start: it never starts twice, nor
    /// onto its victim's GPUs; the server's state stays whole (each batch's
    /// `sanity_check`); and once the victim has gone and the node has
    /// polled, the preemptor runs on the node as exactly the attempt the
    /// server says, or was cancelled, and nothing stale runs.
    #[test]
    fn a_staged_start_starts_once_whatever_happens(steps in proptest::collection::vec(step(), 1..14)) {
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut env = TestEnv::new(&format!("staged-any-{case}"));
        env.starts_when_free = true;
        let (victim, od, commands) = preempted(&mut env);
        let mut node = Node {
            victim: Some(victim),
            waiting: None,
            running: BTreeSet::new(),
            ever_started: Vec::new(),
            capable: true,
        };
        if let Some(s) = starts(&commands).first() {
            node.waiting = Some(s.attempt);
        }
        let end = [Step::UndrainNode, Step::VictimExits { one_report: true }, Step::Poll, Step::Poll];
        for step in steps.iter().chain(end.iter()) {
            match step.clone() {
                Step::Poll => node.poll(&mut env, od),
                Step::VictimExits { one_report } => {
                    let Some(v) = node.victim.take() else { continue };
                    let mut events = vec![exited(v, 0, env.now)];
                    if !one_report {
                        node.report(&mut env, std::mem::take(&mut events));
                    }
                    if let Some(w) = node.waiting.take() {
                        node.start(&mut env, w, &mut events);
                    }
                    node.report(&mut env, events);
                }
                Step::StartFails => {
                    if let Some(w) = node.waiting.take() {
                        let now = env.now;
                        node.report(&mut env, vec![exited(w, 127, now)]);
                    }
                }
                Step::CancelPreemptor => {
                    let _ = env.cancel(JobId(od), None);
                }
                Step::DrainNode => {
                    let _ = env.call(|reply| Msg::DrainNode { name: "n1".into(), reply });
                }
                Step::UndrainNode => {
                    let _ = env.call(|reply| Msg::UndrainNode { name: "n1".into(), gpu: None, reply });
                }
                Step::ServerRestart => {
                    env.restart();
                    node.register(&mut env);
                }
                Step::AgentRestart => {
                    let mut events: Vec<AgentEvent> = Vec::new();
                    if let Some(v) = node.victim.take() {
                        events.push(exited(v, 137, env.now));
                    }
                    node.waiting = None;
                    node.running.clear();
                    // Its exits never reach the server: it registers anew.
                    drop(events);
                    node.register(&mut env);
                }
                Step::Reregister { capable } => {
                    node.capable = capable;
                    node.register(&mut env);
                }
                Step::Tick { ms } => {
                    env.now += ms;
                    env.tick();
                    env.engine().sanity_check().unwrap_or_else(|e| panic!("after a tick: {e}"));
                }
            }
        }
        let job = env.job(JobId(od)).unwrap();
        let running: Vec<AttemptRef> = node.running.iter().copied().collect();
        match job.state.as_str() {
            "cancelled" => prop_assert!(running.is_empty(), "{running:?} runs after the cancel"),
            "running" | "starting" => prop_assert_eq!(running, vec![AttemptRef { job: JobId(od), attempt: Attempt(job.attempt) }]),
            other => prop_assert!(running.is_empty(), "{other} with {running:?} running"),
        }
    }
}
