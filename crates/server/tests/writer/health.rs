//! A node whose agent says its reports keep failing is shown unhealthy and
//! gets no new work; its running jobs go on; it takes work again once its
//! reports get through. The writer (`Engine`) is driven directly, speaking
//! the agent protocol as `ebb agent` does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use ebb_api::{Action, AgentEvent, AttemptRef, JobSubmission, Register, Report};
use ebb_core::Span;
use ebb_server::billing::Pricing;
use ebb_server::engine::{Engine, EngineConfig, Msg};
use ebb_server::store::{Scope, SqliteStore};
use ebb_server::Principal;
use tokio::sync::oneshot;

const NODE: &str = "node-0";
const NOW: u64 = 1_800_000_000_000;

struct Server {
    engine: Engine<SqliteStore>,
    epoch: u64,
    after: u64,
    admin: Principal,
}

impl Server {
    fn start(name: &str) -> Server {
        let dir = std::env::temp_dir().join(format!("ebb-health-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let config = EngineConfig {
            keep_finished: Span(300_000),
            pricing: Pricing { prices: Vec::new(), default_price: 1_000_000, discount_bps: 5_000 },
            ..EngineConfig::for_tests(&dir)
        };
        let store = SqliteStore::open_unsynced(&dir.join("ebb.db")).unwrap();
        let (engine, _) = Engine::open(store, config, Arc::new(RwLock::new(HashMap::new())), NOW)
            .map_err(|e| e.to_string())
            .unwrap();
        let admin = Principal::tenant(Scope::Admin, 1, "default");
        let mut server = Server { engine, epoch: 0, after: 0, admin };
        let reg = Register {
            node: NODE.into(),
            gpu_model: "H100".into(),
            gpus: 4,
            labels: BTreeMap::new(),
            running: Vec::new(),
            address: None,
            unreported: Vec::new(),
            starts_when_free: false,
            waiting: Vec::new(),
        };
        let registered =
            server.call(|reply| Msg::Register { principal: Principal::join(), reg, reply }).unwrap();
        server.epoch = registered.epoch;
        server.after = registered.next_seq;
        server
    }

    fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        let (tx, mut rx) = oneshot::channel();
        self.engine.batch(vec![make(tx)], NOW).unwrap();
        self.engine.sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
        rx.try_recv().expect("answered")
    }

    /// One poll; the attempts it tells the node to start.
    fn poll(&mut self, failing: Option<&str>) -> Vec<AttemptRef> {
        let (epoch, after, health) = (self.epoch, self.after, Some(failing.map(String::from)));
        let poll =
            self.call(|reply| Msg::Poll { node: NODE.into(), epoch, after, health, reply }).expect("polled");
        let mut starts = Vec::new();
        for command in poll.commands.into_iter().map(std::sync::Arc::unwrap_or_clone) {
            self.after = command.seq;
            if let Action::Start(s) = command.action {
                starts.push(s.attempt);
            }
        }
        starts
    }

    fn submit(&mut self, gpus: u32) -> u64 {
        let spec = JobSubmission { gpus: Some(gpus), argv: vec!["work".into()], ..Default::default() };
        let principal = self.admin.clone();
        self.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).expect("submitted")[0]
    }

    fn node(&mut self) -> ebb_api::Node {
        self.call(|reply| Msg::Nodes { reply }).into_iter().find(|n| n.name == NODE).expect("joined")
    }

    fn state(&mut self, id: u64) -> String {
        let principal = self.admin.clone();
        self.call(|reply| Msg::Job { principal, id, reply }).expect("job").state
    }
}

#[test]
fn a_node_whose_reports_fail_is_unhealthy_and_gets_no_new_work_until_they_get_through() {
    let mut s = Server::start("poll");
    let first = s.submit(2);
    let started = s.poll(None);
    assert_eq!(started.iter().map(|a| a.job).collect::<Vec<_>>(), vec![first]);

    // The agent says its reports keep failing: unhealthy, with the reason.
    let why = "reports failing for 30s: 413 Payload Too Large";
    assert!(s.poll(Some(why)).is_empty());
    let node = s.node();
    assert_eq!(node.status, "unhealthy");
    assert_eq!(node.unhealthy.as_deref(), Some(why));
    let second = s.submit(2);
    assert!(s.poll(Some(why)).is_empty(), "an unhealthy node was sent new work");
    assert_eq!(s.state(second), "queued");
    assert_eq!(node.jobs, vec![first], "its running job stays");

    // A poll without the complaint: healthy, and the queued job goes there
    // (its start comes with the next poll).
    assert!(s.poll(None).is_empty());
    let started = s.poll(None);
    assert_eq!(s.node().status, "up");
    assert_eq!(s.node().unhealthy, None);
    assert_eq!(started.iter().map(|a| a.job).collect::<Vec<_>>(), vec![second]);
}

#[test]
fn a_report_that_gets_through_makes_the_node_healthy_again() {
    let mut s = Server::start("report");
    assert!(s.poll(Some("reports failing for 30s: connection refused")).is_empty());
    assert_eq!(s.node().status, "unhealthy");
    let job = s.submit(1);
    assert!(s.poll(Some("still")).is_empty());
    assert_eq!(s.state(job), "queued");

    let report = Report { node: NODE.into(), events: Vec::<AgentEvent>::new(), id: None };
    s.call(|reply| Msg::Report { report, reply }).expect("report accepted");
    assert_eq!(s.node().status, "up");
    assert_eq!(s.state(job), "starting", "the healthy node takes the queued job");
}

#[test]
fn a_long_poll_asking_again_does_not_undo_a_report_that_got_through() {
    let mut s = Server::start("again");
    assert!(s.poll(Some("reports failing for 30s: 503")).is_empty());
    let report = Report { node: NODE.into(), events: Vec::<AgentEvent>::new(), id: None };
    s.call(|reply| Msg::Report { report, reply }).expect("report accepted");
    // The same long poll, woken: it says nothing of health.
    let (epoch, after) = (s.epoch, s.after);
    s.call(|reply| Msg::Poll { node: NODE.into(), epoch, after, health: None, reply }).expect("polled");
    assert_eq!(s.node().status, "up");
}
