//! For tests: a fake server on loopback that records what the agent tells
//! it and hands out the commands a test gives it, and an agent following
//! it with a [`FakeSupervisor`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use ebb_api::{Action, AgentEvent, AttemptRef, Command, Commands, Register, Registered, Report, ReportReply};

use crate::client::Client;
use crate::commands::{Agent, Node};
use crate::drain;
use crate::output::OutputLimits;
use crate::report::{is_output, Reporter};
use crate::supervisor::fake::FakeSupervisor;

/// A server whose reports fail while `broken`, refuses output with 413
/// while `refuse_output`, and records what the agent says.
#[derive(Default)]
pub(crate) struct FakeServer {
    pub broken: AtomicBool,
    pub refuse_output: AtomicBool,
    /// The next poll answers 409, as a restarted server does.
    pub restarted: AtomicBool,
    /// The `failing` parameter of each poll, in order.
    pub polls: Mutex<Vec<Option<String>>>,
    pub registrations: Mutex<Vec<Register>>,
    pub delivered: Mutex<Vec<AgentEvent>>,
    /// The id of every report tried, delivered or not.
    pub report_ids: Mutex<Vec<Option<ebb_api::ReportId>>>,
    /// What the next poll hands out.
    pub commands: Mutex<Vec<Action>>,
    /// What the next registration's reply says to kill.
    pub kill: Mutex<Vec<AttemptRef>>,
    seq: AtomicU64,
}

impl FakeServer {
    /// The events delivered so far.
    pub(crate) fn delivered(&self) -> Vec<AgentEvent> {
        self.delivered.lock().unwrap().clone()
    }
}

async fn register(State(fake): State<Arc<FakeServer>>, Json(body): Json<Register>) -> Json<Registered> {
    fake.registrations.lock().unwrap().push(body);
    Json(Registered {
        heartbeat_interval_ms: 50,
        kill: std::mem::take(&mut *fake.kill.lock().unwrap()),
        next_seq: fake.seq.load(Ordering::SeqCst),
        epoch: 1,
        credential: None,
        checkpoint_store: None,
    })
}

async fn commands(
    State(fake): State<Arc<FakeServer>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Commands>, (StatusCode, String)> {
    fake.polls.lock().unwrap().push(q.get("failing").cloned());
    if fake.restarted.swap(false, Ordering::SeqCst) {
        return Err((StatusCode::CONFLICT, "the server restarted".into()));
    }
    let actions = std::mem::take(&mut *fake.commands.lock().unwrap());
    let commands: Vec<Command> = actions
        .into_iter()
        .map(|action| Command { seq: fake.seq.fetch_add(1, Ordering::SeqCst) + 1, action })
        .collect();
    if commands.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Json(Commands { commands, next_seq: fake.seq.load(Ordering::SeqCst) }))
}

async fn report(
    State(fake): State<Arc<FakeServer>>,
    Json(r): Json<Report>,
) -> Result<Json<ReportReply>, StatusCode> {
    fake.report_ids.lock().unwrap().push(r.id);
    if fake.broken.load(Ordering::SeqCst) {
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    if fake.refuse_output.load(Ordering::SeqCst) && r.events.iter().any(is_output) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    fake.delivered.lock().unwrap().extend(r.events);
    Ok(Json(ReportReply { stale: Vec::new() }))
}

/// Serves `fake` on loopback; its address.
pub(crate) async fn serve(fake: Arc<FakeServer>) -> String {
    let app = Router::new()
        .route("/v1/agent/register", post(register))
        .route("/v1/agent/commands", get(commands))
        .route("/v1/agent/report", post(report))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    server
}

/// A directory of the test's own, under one of this test process's.
/// The first call removes those of test processes that are gone, so
/// that runs do not pile them up in the temporary directory.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = std::env::temp_dir().join("ebb-agent-tests");
    let gone = |pid: Option<&str>| {
        pid.and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists())
    };
    SWEPT.call_once(|| {
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            if gone(entry.file_name().to_str()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        // Those of the days before, one per test and process.
        for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("ebb-agent-test-") && gone(name.rsplit('-').next()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let mine = root.join(std::process::id().to_string());
    let dir = mine.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Open to the users some tests run jobs as, whatever the umask.
    for parent in [&root, &mine] {
        let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755));
    }
    dir
}

/// A client of `fake` and a reporter whose report loop delivers to it.
pub(crate) async fn reporter(fake: Arc<FakeServer>, name: &str) -> (Arc<Client>, Arc<Reporter>) {
    let server = serve(fake).await;
    let client = Arc::new(Client::new(reqwest::Client::new(), &server, "t", &temp_dir(name), None));
    let (reporter, queue) = Reporter::new(OutputLimits::default().buffer);
    tokio::spawn(reporter.clone().run(queue, client.clone(), "node-1".into(), |_| {}));
    (client, reporter)
}

/// An agent following `fake`, its processes faked; it says it is unhealthy
/// once reports have failed for 300 ms.
pub(crate) async fn agent(fake: Arc<FakeServer>, name: &str) -> Arc<Agent<FakeSupervisor>> {
    let server = serve(fake).await;
    let client = Arc::new(Client::new(reqwest::Client::new(), &server, "t", &temp_dir(name), None));
    let (reporter, queue) = Reporter::new(OutputLimits::default().buffer);
    let supervisor = FakeSupervisor::with_reporter(name, reporter.clone());
    let fenced = supervisor.clone();
    tokio::spawn(reporter.clone().run(queue, client.clone(), "node-1".into(), move |stale| {
        drain::kill_stale(&*fenced, stale, "the server fenced this stale attempt")
    }));
    let node = Node {
        name: "node-1".into(),
        gpu_model: "H100".into(),
        gpus: 1,
        labels: BTreeMap::new(),
        address: "127.0.0.1".into(),
        unhealthy_after: Duration::from_millis(300),
    };
    let agent = Arc::new(Agent {
        node,
        client,
        reporter,
        supervisor,
        registrations: Default::default(),
        checkpoints: None,
        health: None,
    });
    tokio::spawn(agent.clone().follow());
    agent
}

/// Waits until `done`, for at most 20 s.
pub(crate) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shrink of `attempt` down to `nodes` (8 GPUs each), decided at
/// `at_ms` with the ordinary five minutes, `node-9` leaving.
pub(crate) fn shrink(attempt: AttemptRef, nodes: &[&str], at_ms: u64) -> ebb_api::Membership {
    ebb_api::Membership {
        attempt,
        change: ebb_api::MembershipChange::Shrink,
        at_ms,
        deadline_ms: Some(at_ms + 300_000),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        leaving: vec!["node-9".into()],
        joining: vec![],
        gpus: 8 * nodes.len() as u32,
        reason: "preempted by job 7".into(),
    }
}
