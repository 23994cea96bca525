//! Each attempt's own metadata endpoint, on loopback: Ebb's native notice
//! and the three clouds' spot/preemption shapes, so that spot-aware tools
//! and the clouds' SDKs find the drain notice where they already look.
//!
//! **It is the attempt's alone.** Every job on the node shares its
//! loopback, and a port scan finds every endpoint in a fraction of a
//! second, so each endpoint answers only requests whose path starts with
//! the attempt's own secret (128 random bits, hex), which only its
//! environment holds: `EBB_METADATA_URL` is `http://127.0.0.1:PORT/SECRET`,
//! and the clouds' variables name the same prefix
//! (`AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:PORT/SECRET/`,
//! `GCE_METADATA_HOST=127.0.0.1:PORT/SECRET`), which botocore, `google-auth`
//! and `ec2-metadata` (given the endpoint as its `service_url`) put in
//! front of their own paths. Why a path and not a header: the clouds'
//! clients send no header a job can set (IMDSv2's token is itself fetched
//! with a bare `PUT`), but all of them take an endpoint; a network
//! namespace per attempt would cut a gang's ranks off each other. Without
//! the secret, every path (`GET /` too) is a bare 404 that names nothing.
//! The environment is readable only by the job's own user (tenants run as
//! users of their own), and the secret never leaves the node.
//!
//! It bounds what a job can hold of its agent: 32 connections at once
//! (long polls count), each closed when idle for 10 s; and its reports
//! (checkpoints, resumes, progress) to a burst of 20, then one a second,
//! answering 429 beyond.
//!
//! * native: `GET /ebb/v1/notice` (404 until notice, then the notice JSON);
//!   `GET /ebb/v1/members` (an elastic job's latest change of nodes, told
//!   to the nodes that stay; 404 until one);
//!   `POST /ebb/v1/checkpoint` with `{"step", "bytes", "seconds"}` reports a
//!   completed checkpoint, relayed to the server; `POST /ebb/v1/resumed`
//!   with `{"step"}` says the attempt resumed from a checkpoint (a drill
//!   waits for it); `POST /ebb/v1/progress` with `{"fraction"}` (0 to 1)
//!   reports how much of the job is done, by which a deadline is judged
//! * AWS: `PUT /latest/api/token` (IMDSv2), `GET /latest/meta-data/spot/instance-action`
//! * GCP: `GET /computeMetadata/v1/instance/preempted` (`Metadata-Flavor: Google`),
//!   with `?wait_for_change=true` blocking until it changes
//! * Azure: `GET /metadata/scheduledevents` (`Metadata: true`)

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use ebb_api::{AgentEvent, AttemptRef};
use hyper::body::Incoming;
// Times as the native shape writes them: `2026-11-29T08:22:00.000Z`.
use ebb_core::time::rfc3339_millis as rfc3339;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::checkpoints::AttemptUploads;
use crate::notice::{Members, Notice, NoticeAction};
use crate::report::{now_ms, Reporter};

mod image;
pub(crate) use image::ShowImage;

/// An attempt's secret: the first segment of every path its endpoint
/// answers.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// 128 bits from the OS, in hex.
    pub(crate) fn new() -> Result<Secret, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(Secret(ebb_api::hex(&bytes)))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// What is left of `path` once its first segment is this secret
    /// (compared in constant time); none if it is not.
    fn strip<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path.strip_prefix('/')?;
        let (first, rest) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let same = first.len() == self.0.len()
            && first.bytes().zip(self.0.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        same.then_some(rest)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Connections one endpoint holds at once, long polls included.
const MAX_CONNECTIONS: usize = 32;
/// A connection idle (or sending an unfinished request head) this long
/// is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Reports (checkpoints, resumes, progress) taken at once, and how many a
/// second after that.
const REPORT_BURST: f64 = 20.0;
const REPORTS_PER_SECOND: f64 = 1.0;

/// A token bucket for the job's reports.
struct Reports {
    tokens: f64,
    at: std::time::Instant,
}

impl Reports {
    fn new() -> Reports {
        Reports { tokens: REPORT_BURST, at: std::time::Instant::now() }
    }

    /// Takes one report if the bucket has one.
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * REPORTS_PER_SECOND;
        self.tokens = (self.tokens + refill).min(REPORT_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Ends the attempt so that its job is requeued (`POST
/// /ebb/v1/requeue`); false if it no longer runs.
pub(crate) type Requeue = Arc<dyn Fn() -> bool + Send + Sync>;

/// The attempt an endpoint serves.
pub(crate) struct Attempt {
    pub job: ebb_core::JobId,
    pub attempt: ebb_core::Attempt,
    pub node: String,
    pub requeue: Requeue,
    pub images: image::ShowImage,
}

#[derive(Clone)]
struct Endpoint {
    job: ebb_core::JobId,
    attempt: ebb_core::Attempt,
    node: String,
    requeue: Requeue,
    images: image::ShowImage,
    notice: watch::Receiver<Option<Notice>>,
    members: watch::Receiver<Option<Members>>,
    events: Arc<Reporter>,
    /// The attempt's checkpoint uploads, where there is a store.
    uploads: Option<Arc<AttemptUploads>>,
    reports: Arc<std::sync::Mutex<Reports>>,
}

impl Endpoint {
    /// The answer to a report over the job's rate; `None` for one within it.
    fn over_rate(&self) -> Option<Response> {
        match self.reports.lock().expect("report bucket").take() {
            true => None,
            false => Some((
                StatusCode::TOO_MANY_REQUESTS,
                Json(json!({ "error": format!(
                    "over {REPORTS_PER_SECOND} report a second (a burst of {REPORT_BURST}): this one was not taken"
                ) })),
            )
                .into_response()),
        }
    }
}

/// What the agent posts on an attempt's endpoint: its notice, and an
/// elastic attempt's latest change of nodes.
pub(crate) struct Posted {
    pub notice: watch::Receiver<Option<Notice>>,
    pub members: watch::Receiver<Option<Members>>,
}

/// Serves one attempt's endpoint on `listener`, under `secret`, until
/// its notice's sender is dropped; checkpoint reports go to `events`,
/// remembered until the server has them, as the attempt's start and exit
/// are.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    secret: Secret,
    attempt: Attempt,
    posted: Posted,
    events: Arc<Reporter>,
    uploads: Option<Arc<AttemptUploads>>,
) {
    let Posted { notice, members } = posted;
    let mut closed = notice.clone();
    let reports = Arc::new(std::sync::Mutex::new(Reports::new()));
    let Attempt { job, attempt, node, requeue, images } = attempt;
    let endpoint =
        Endpoint { job, attempt, node, requeue, images, notice, members, events, uploads, reports };
    let service = AttemptService { secret: Arc::new(secret), endpoint };
    let stop = async move { while closed.changed().await.is_ok() {} };
    let limits =
        ebb_http::Limits { header_read_timeout: IDLE_TIMEOUT, per_address: 0, total: MAX_CONNECTIONS };
    ebb_http::serve(listener, service, limits, stop).await;
}

/// The routes, the clouds' own paths and Ebb's: made once for every
/// attempt's endpoint (a start makes no routing table), each request
/// carrying its attempt's [`Endpoint`].
static ROUTES: std::sync::LazyLock<Router> = std::sync::LazyLock::new(|| {
    Router::new()
        .route("/", get(native_root))
        .route("/ebb/v1/notice", get(native_notice))
        .route("/ebb/v1/members", get(native_members))
        .route("/ebb/v1/checkpoint", post(native_checkpoint))
        .route("/ebb/v1/resumed", post(native_resumed))
        .route("/ebb/v1/progress", post(native_progress))
        .route("/ebb/v1/requeue", post(native_requeue))
        .route("/ebb/v1/image", post(image::native_image))
        .route("/latest/api/token", put(aws_token))
        .route("/latest/meta-data/spot/instance-action", get(aws_instance_action))
        .route("/computeMetadata/v1/instance/preempted", get(gcp_preempted))
        .route("/metadata/scheduledevents", get(azure_events))
});

/// One attempt's endpoint in front of [`ROUTES`]: a request whose path
/// starts with the attempt's secret goes on with the secret taken off
/// (so the routes are the clouds' own paths) and the attempt's
/// [`Endpoint`] with it; anything else is a bare 404 that names nothing.
#[derive(Clone)]
struct AttemptService {
    secret: Arc<Secret>,
    endpoint: Endpoint,
}

impl tower_service::Service<Request<Incoming>> for AttemptService {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let Some(mut request) = self.secret.strip_request(request.map(Body::new)) else {
            return Box::pin(std::future::ready(Ok((StatusCode::NOT_FOUND, "Not Found\n").into_response())));
        };
        request.extensions_mut().insert(self.endpoint.clone());
        // A router is always ready.
        Box::pin(tower_service::Service::call(&mut ROUTES.clone(), request))
    }
}

impl Secret {
    /// `request` with this secret taken off the front of its path; none
    /// if its path does not start with it.
    fn strip_request(&self, mut request: Request) -> Option<Request> {
        let rest = match self.strip(request.uri().path())? {
            "" => "/",
            rest => rest,
        };
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{rest}?{query}"),
            None => rest.to_string(),
        };
        let mut parts = request.uri().clone().into_parts();
        parts.path_and_query = Some(path_and_query.parse().ok()?);
        *request.uri_mut() = Uri::from_parts(parts).ok()?;
        Some(request)
    }
}

async fn native_root(Extension(e): Extension<Endpoint>) -> Json<serde_json::Value> {
    let notice = e.notice.borrow().clone();
    let members = e.members.borrow().clone();
    Json(json!({ "job": e.job, "attempt": e.attempt, "node": e.node, "notice": notice, "members": members }))
}

async fn native_members(Extension(e): Extension<Endpoint>) -> Response {
    match e.members.borrow().clone() {
        Some(members) => Json(members).into_response(),
        None => (StatusCode::NOT_FOUND, "no change of nodes\n").into_response(),
    }
}

async fn native_notice(Extension(e): Extension<Endpoint>) -> Response {
    match e.notice.borrow().clone() {
        Some(notice) => Json(notice).into_response(),
        None => (StatusCode::NOT_FOUND, "no drain notice\n").into_response(),
    }
}

/// A checkpoint report from the job: all fields optional, `seconds` is
/// how long taking the checkpoint took.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointReport {
    #[serde(default)]
    step: Option<u64>,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    seconds: Option<f64>,
}

async fn native_checkpoint(Extension(e): Extension<Endpoint>, body: Bytes) -> Response {
    let bad = |m: String| (StatusCode::BAD_REQUEST, Json(json!({ "error": m }))).into_response();
    if let Some(over) = e.over_rate() {
        return over;
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let report: CheckpointReport = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(err) => {
            let path = err.path().to_string();
            return bad(format!("{path}: {}", err.into_inner()));
        }
    };
    let seconds = report.seconds.unwrap_or(0.0);
    if !seconds.is_finite() || !(0.0..=1e7).contains(&seconds) {
        return bad(format!("seconds: must be a duration in seconds, got {seconds}"));
    }
    let at_ms = now_ms();
    let event = AgentEvent::Checkpoint {
        attempt: AttemptRef { job: e.job, attempt: e.attempt },
        step: report.step,
        bytes: report.bytes,
        duration_ms: (seconds * 1000.0).round() as u64,
        at_ms,
    };
    if e.events.try_send(event).is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the agent is stopping" })))
            .into_response();
    }
    // The job renamed its files before reporting: they are complete.
    if let Some(uploads) = &e.uploads {
        uploads.checkpointed(report.step);
    }
    (StatusCode::ACCEPTED, Json(json!({ "accepted": true, "at": rfc3339(at_ms) }))).into_response()
}

/// A resume report from the job: the step of the checkpoint it resumed
/// from, if it has steps.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeReport {
    #[serde(default)]
    step: Option<u64>,
}

async fn native_resumed(Extension(e): Extension<Endpoint>, body: Bytes) -> Response {
    if let Some(over) = e.over_rate() {
        return over;
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let report: ResumeReport = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(err) => {
            let path = err.path().to_string();
            let message = format!("{path}: {}", err.into_inner());
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response();
        }
    };
    let at_ms = now_ms();
    let attempt = AttemptRef { job: e.job, attempt: e.attempt };
    if e.events.try_send(AgentEvent::Resumed { attempt, step: report.step, at_ms }).is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the agent is stopping" })))
            .into_response();
    }
    (StatusCode::ACCEPTED, Json(json!({ "accepted": true, "at": rfc3339(at_ms) }))).into_response()
}

/// A progress report from the job: the fraction of its work done, from
/// 0 to 1, which the server judges a deadline by.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressReport {
    fraction: f64,
}

async fn native_progress(Extension(e): Extension<Endpoint>, body: Bytes) -> Response {
    let bad = |m: String| (StatusCode::BAD_REQUEST, Json(json!({ "error": m }))).into_response();
    if let Some(over) = e.over_rate() {
        return over;
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let report: ProgressReport = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(err) => {
            let path = err.path().to_string();
            return bad(format!("{path}: {}", err.into_inner()));
        }
    };
    if !report.fraction.is_finite() || !(0.0..=1.0).contains(&report.fraction) {
        return bad(format!("fraction: must be from 0 to 1, got {}", report.fraction));
    }
    let at_ms = now_ms();
    let attempt = AttemptRef { job: e.job, attempt: e.attempt };
    if e.events.try_send(AgentEvent::Progress { attempt, fraction: report.fraction, at_ms }).is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "the agent is stopping" })))
            .into_response();
    }
    (StatusCode::ACCEPTED, Json(json!({ "accepted": true, "at": rfc3339(at_ms) }))).into_response()
}

/// The job asks to be requeued (`scontrol requeue` in a Slurm job): its
/// attempt is ended (SIGTERM to every process, SIGKILL 10 s later) and the
/// job goes back to the queue, as a preemption does, not as a failure.
/// The body is ignored.
async fn native_requeue(Extension(e): Extension<Endpoint>) -> Response {
    if let Some(over) = e.over_rate() {
        return over;
    }
    match (e.requeue)() {
        true => (StatusCode::ACCEPTED, Json(json!({ "requeued": true }))).into_response(),
        false => (StatusCode::CONFLICT, Json(json!({ "error": "the attempt is no longer running" })))
            .into_response(),
    }
}

async fn aws_token(Extension(e): Extension<Endpoint>) -> String {
    format!("ebb-imdsv2-{}-{}", e.job, e.attempt)
}

/// AWS times are whole seconds: `2026-11-29T08:22:00Z`.
fn aws_time(ms: u64) -> String {
    ebb_core::time::rfc3339_seconds(ms)
}

async fn aws_instance_action(Extension(e): Extension<Endpoint>) -> Response {
    match e.notice.borrow().clone() {
        Some(n) => Json(json!({ "action": "terminate", "time": aws_time(n.deadline_ms) })).into_response(),
        None => (StatusCode::NOT_FOUND, "Not Found\n").into_response(),
    }
}

#[derive(Deserialize)]
struct GcpQuery {
    #[serde(default)]
    wait_for_change: bool,
    #[serde(default)]
    last_etag: Option<String>,
}

async fn gcp_preempted(
    Extension(mut e): Extension<Endpoint>,
    headers: HeaderMap,
    Query(q): Query<GcpQuery>,
) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (StatusCode::FORBIDDEN, "Missing Metadata-Flavor:Google header.\n").into_response();
    }
    let value = |n: &Option<Notice>| if n.is_some() { "TRUE" } else { "FALSE" };
    let current = value(&e.notice.borrow_and_update());
    let unchanged = q.last_etag.as_deref().is_none_or(|etag| etag == current);
    if q.wait_for_change && unchanged {
        let _ = tokio::time::timeout(Duration::from_secs(300), e.notice.changed()).await;
    }
    let now = value(&e.notice.borrow());
    ([("metadata-flavor", "Google"), ("etag", now)], now.to_string()).into_response()
}

async fn azure_events(Extension(e): Extension<Endpoint>, headers: HeaderMap) -> Response {
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "Bad request. Required metadata header not specified" })),
        )
            .into_response();
    }
    let body = match e.notice.borrow().clone() {
        None => json!({ "DocumentIncarnation": 0, "Events": [] }),
        Some(n) => {
            let not_before = httpdate::fmt_http_date(ebb_core::time::writable(n.deadline_ms));
            json!({
                "DocumentIncarnation": 1,
                "Events": [{
                    "EventId": format!("ebb-{}-{}", e.job, e.attempt),
                    "EventType": match n.action { NoticeAction::Cancel => "Terminate", NoticeAction::Preempt => "Preempt" },
                    "ResourceType": "VirtualMachine",
                    "Resources": [e.node],
                    "EventStatus": "Scheduled",
                    "NotBefore": not_before,
                    "Description": n.reason,
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }]
            })
        }
    };
    Json(body).into_response()
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::testing::{self, until, FakeServer};
    use ebb_core::JobId;

    /// An attempt's endpoint (job 4, `attempt`) on a port of its own: the
    /// server it reports to, its reporter, where it listens, its URL (the
    /// secret included) and the sender of its notice (the endpoint stops
    /// when that is dropped).
    pub(super) struct Served {
        pub(super) fake: Arc<FakeServer>,
        pub(super) reporter: Arc<Reporter>,
        pub(super) addr: std::net::SocketAddr,
        pub(super) base: String,
        pub(super) notice: watch::Sender<Option<Notice>>,
        pub(super) members: watch::Sender<Option<Members>>,
        pub(super) requeued: Arc<AtomicUsize>,
    }

    pub(super) async fn served(name: &str, attempt: u32) -> Served {
        let fake = Arc::new(FakeServer::default());
        let (_, reporter) = testing::reporter(fake.clone(), name).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (notice, notice_rx) = watch::channel(None);
        let (members, members_rx) = watch::channel(None);
        let secret = Secret::new().unwrap();
        let base = format!("http://{addr}/{}", secret.as_str());
        let requeued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(serve(
            listener,
            secret,
            numbered(attempt, requeued.clone()),
            Posted { notice: notice_rx, members: members_rx },
            reporter.clone(),
            None,
        ));
        Served { fake, reporter, addr, base, notice, members, requeued }
    }

    /// Job 4's `attempt` on node-1, whose requeues count in `requeued`
    /// (and which runs until it has been requeued once).
    fn numbered(attempt: u32, requeued: Arc<AtomicUsize>) -> Attempt {
        let requeue: Requeue = Arc::new(move || requeued.fetch_add(1, Ordering::SeqCst) == 0);
        // Shows `reg/ok:v1` alone, as an agent with that image would.
        let images: image::ShowImage = Arc::new(|reference| {
            Box::pin(async move {
                match reference.as_str() {
                    "reg/ok:v1" => Ok(json!({ "reference": reference, "rootfs": "/views/4-1/abc" })),
                    _ => Err((422, format!("image {reference}: not found in the registry"))),
                }
            })
        });
        Attempt { job: JobId(4), attempt: ebb_core::Attempt(attempt), node: "node-1".into(), requeue, images }
    }

    /// The endpoint put checkpoints straight on the report queue, so a
    /// registration never carried one the server had not had, and its
    /// delivery made the agent forget a later start or exit instead.
    #[tokio::test]
    async fn a_checkpoint_the_job_reports_is_remembered_until_the_server_has_it() {
        let fake = Arc::new(FakeServer::default());
        fake.broken.store(true, Ordering::SeqCst);
        let (_, reporter) = testing::reporter(fake.clone(), "metadata-checkpoint").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_notice, notice_rx) = watch::channel(None);
        let (_members, members_rx) = watch::channel(None);
        let secret = Secret::new().unwrap();
        let base = format!("http://127.0.0.1:{port}/{}", secret.as_str());
        let attempt = numbered(2, Arc::new(AtomicUsize::new(0)));
        let posted = Posted { notice: notice_rx, members: members_rx };
        tokio::spawn(serve(listener, secret, attempt, posted, reporter.clone(), None));
        let answer = reqwest::Client::new()
            .post(format!("{base}/ebb/v1/checkpoint"))
            .body(r#"{"step": 7, "seconds": 1.5}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202);
        let checkpoint = |e: &AgentEvent| {
            matches!(e, AgentEvent::Checkpoint { attempt, step: Some(7), duration_ms: 1500, .. }
                if *attempt == AttemptRef { job: JobId(4), attempt: ebb_core::Attempt(2) })
        };
        let unreported = reporter.unreported();
        assert!(unreported.len() == 1 && checkpoint(&unreported[0]), "{unreported:?}");
        fake.broken.store(false, Ordering::SeqCst);
        until("the checkpoint is delivered", || fake.delivered().iter().any(checkpoint)).await;
        until("it is forgotten", || reporter.unreported().is_empty()).await;
    }

    /// A resume report is a fact the server needs, as a checkpoint is:
    /// relayed in order and remembered until delivered; a malformed one
    /// is refused naming the field.
    #[tokio::test]
    async fn a_resume_the_job_reports_is_relayed_and_a_malformed_one_refused() {
        let Served { fake, base, notice: _notice, .. } = served("metadata-resumed", 3).await;
        let post = |body: &'static str| {
            reqwest::Client::new().post(format!("{base}/ebb/v1/resumed")).body(body).send()
        };
        let bad = post(r#"{"step": -1}"#).await.unwrap();
        assert_eq!(bad.status(), 400);
        assert!(bad.text().await.unwrap().contains("step"), "the field is named");
        assert_eq!(post(r#"{"step": 1200}"#).await.unwrap().status(), 202);
        assert_eq!(post("{}").await.unwrap().status(), 202);
        let resumed = |step: Option<u64>| {
            move |e: &AgentEvent| {
                matches!(e, AgentEvent::Resumed { attempt, step: s, .. }
                    if *attempt == AttemptRef { job: JobId(4), attempt: ebb_core::Attempt(3) } && *s == step)
            }
        };
        until("both are delivered", || {
            let delivered = fake.delivered();
            delivered.iter().any(resumed(Some(1200))) && delivered.iter().any(resumed(None))
        })
        .await;
    }

    /// The job's requeue ends its attempt once: a second ask, when it no
    /// longer runs, is a 409 that says so; the body is not read.
    #[tokio::test]
    async fn a_requeue_the_job_asks_for_ends_its_attempt_once() {
        let s = served("metadata-requeue", 3).await;
        let http = reqwest::Client::new();
        let first = http.post(format!("{}/ebb/v1/requeue", s.base)).body("anything").send().await.unwrap();
        assert_eq!(first.status(), 202);
        let second = http.post(format!("{}/ebb/v1/requeue", s.base)).send().await.unwrap();
        assert_eq!(second.status(), 409);
        assert!(second.text().await.unwrap().contains("no longer running"));
        assert_eq!(s.requeued.load(Ordering::SeqCst), 2);
        let without_secret = http.post(format!("http://{}/ebb/v1/requeue", s.addr)).send().await.unwrap();
        assert_eq!(without_secret.status(), 404);
        assert_eq!(s.requeued.load(Ordering::SeqCst), 2);
    }

    /// A progress report is relayed to the server; one that is not a
    /// fraction from 0 to 1 is refused naming the field.
    #[tokio::test]
    async fn a_progress_report_is_relayed_and_one_that_is_not_a_fraction_refused() {
        let Served { fake, base, notice: _notice, .. } = served("metadata-progress", 3).await;
        let post = |body: &'static str| {
            reqwest::Client::new().post(format!("{base}/ebb/v1/progress")).body(body).send()
        };
        for bad in [r#"{"fraction": 1.5}"#, r#"{"fraction": -0.1}"#, "{}", r#"{"fraction": "half"}"#] {
            let answer = post(bad).await.unwrap();
            assert_eq!(answer.status(), 400, "{bad}");
            assert!(answer.text().await.unwrap().contains("fraction"), "{bad}: the field is named");
        }
        assert_eq!(post(r#"{"fraction": 0.62}"#).await.unwrap().status(), 202);
        let progress = |e: &AgentEvent| {
            matches!(e, AgentEvent::Progress { attempt, fraction, .. }
                if *attempt == AttemptRef { job: JobId(4), attempt: ebb_core::Attempt(3) } && *fraction == 0.62)
        };
        until("it is delivered", || fake.delivered().iter().any(progress)).await;
        assert_eq!(fake.delivered().iter().filter(|e| matches!(e, AgentEvent::Progress { .. })).count(), 1);
    }

    /// Bob's job scanned the node's ports, found Alice's endpoint by
    /// `GET /` (which named her job) and reported a checkpoint she never
    /// took, faked progress, and read her notice. Without her attempt's
    /// secret, every path is a bare 404 now, and nothing reaches the
    /// server; with a wrong secret of the right length too.
    #[tokio::test]
    async fn without_the_attempts_secret_every_path_is_a_404_that_names_nothing() {
        let Served { reporter, addr, base, notice, members, .. } = served("metadata-secret", 2).await;
        let port = addr.port();
        notice.send_replace(Some(Notice::new(1, 2, "preempted".into())));
        members.send_replace(Some(shrink_to(&["node-1"], 5)));
        let own = base.rsplit('/').next().unwrap().to_string();
        let http = reqwest::Client::new();
        let wrong = "0".repeat(own.len());
        let paths = [
            "/",
            "/ebb/v1/notice",
            "/ebb/v1/members",
            "/latest/meta-data/spot/instance-action",
            "/computeMetadata/v1/instance/preempted",
            "/metadata/scheduledevents?api-version=2020-07-01",
        ];
        for prefix in ["".to_string(), format!("/{wrong}"), format!("/{}", &own[..8]), format!("/{own}x")] {
            for path in paths {
                let url = format!("http://127.0.0.1:{port}{prefix}{path}");
                let answer = http
                    .get(&url)
                    .header("Metadata-Flavor", "Google")
                    .header("Metadata", "true")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), 404, "{url}");
                let body = answer.text().await.unwrap();
                assert!(
                    !body.contains("node-1") && !body.contains("preempt") && !body.contains('4'),
                    "{url}: {body}"
                );
            }
            for path in ["/ebb/v1/checkpoint", "/ebb/v1/progress", "/ebb/v1/resumed", "/ebb/v1/requeue"] {
                let url = format!("http://127.0.0.1:{port}{prefix}{path}");
                let body = if path.ends_with("progress") {
                    r#"{"fraction": 0.0001}"#
                } else {
                    r#"{"step": 999999}"#
                };
                assert_eq!(http.post(&url).body(body).send().await.unwrap().status(), 404, "{url}");
            }
            let url = format!("http://127.0.0.1:{port}{prefix}/latest/api/token");
            assert_eq!(http.put(&url).send().await.unwrap().status(), 404, "{url}");
        }
        assert!(reporter.unreported().is_empty(), "a stranger's report was taken");
        // The attempt itself, with its secret, sees its own.
        let root: serde_json::Value =
            http.get(format!("http://127.0.0.1:{port}/{own}/")).send().await.unwrap().json().await.unwrap();
        assert_eq!((root["job"].as_u64(), root["attempt"].as_u64()), (Some(4), Some(2)));
        let aws =
            http.get(format!("http://127.0.0.1:{port}/{own}/latest/meta-data/spot/instance-action")).send();
        assert_eq!(aws.await.unwrap().status(), 200);
    }

    /// A shrink of job 4's attempt 2 down to `nodes`, as the job reads it.
    fn shrink_to(nodes: &[&str], at_ms: u64) -> Members {
        let attempt = AttemptRef { job: JobId(4), attempt: ebb_core::Attempt(2) };
        Members::new(&testing::shrink(attempt, nodes, at_ms))
    }

    /// The nodes that stay read a change of nodes where they read the
    /// notice: 404 until one, then the latest, in the file's shape; the
    /// root shows it beside the notice.
    #[tokio::test]
    async fn a_change_of_nodes_is_served_once_posted_in_the_files_shape() {
        let Served { base, notice: _notice, members, .. } = served("metadata-members", 2).await;
        let http = reqwest::Client::new();
        let get = |path: &str| http.get(format!("{base}{path}")).send();
        let none = get("/ebb/v1/members").await.unwrap();
        assert_eq!(none.status(), 404);
        assert_eq!(none.text().await.unwrap(), "no change of nodes\n");
        members.send_replace(Some(shrink_to(&["node-1", "node-2"], 1_000)));
        let got: serde_json::Value = get("/ebb/v1/members").await.unwrap().json().await.unwrap();
        let file = serde_json::to_value(shrink_to(&["node-1", "node-2"], 1_000)).unwrap();
        assert_eq!(got, file);
        assert_eq!(got["change"], "shrink");
        assert_eq!(got["deadline"], "1970-01-01T00:05:01.000Z");
        assert_eq!(got["nodes"], json!(["node-1", "node-2"]));
        assert_eq!((got["leaving"].clone(), got["gpus"].clone()), (json!(["node-9"]), json!(16)));
        let root: serde_json::Value = get("/").await.unwrap().json().await.unwrap();
        assert_eq!(root["members"], file);
        assert!(root["notice"].is_null());
    }

    /// Every endpoint shares one routing table: each answers for its own
    /// attempt, with its own notice, and one attempt's secret opens no
    /// other's endpoint.
    #[tokio::test]
    async fn endpoints_side_by_side_each_answer_for_their_own_attempt() {
        let a = served("metadata-side-a", 2).await;
        let b = served("metadata-side-b", 3).await;
        b.notice.send_replace(Some(Notice::new(1, 2, "preempted".into())));
        let http = reqwest::Client::new();
        let get = |url: String| {
            let http = http.clone();
            async move { http.get(url).header("Metadata", "true").send().await.unwrap() }
        };
        let root: serde_json::Value = get(format!("{}/", a.base)).await.json().await.unwrap();
        assert_eq!((root["attempt"].as_u64(), root["notice"].is_null()), (Some(2), true));
        let root: serde_json::Value = get(format!("{}/", b.base)).await.json().await.unwrap();
        assert_eq!((root["attempt"].as_u64(), root["notice"].is_null()), (Some(3), false));
        assert_eq!(get(format!("{}/ebb/v1/notice", a.base)).await.status(), 404);
        assert_eq!(get(format!("{}/ebb/v1/notice", b.base)).await.status(), 200);
        // Each one's secret on the other's port.
        let secret = |base: &str| base.rsplit('/').next().unwrap().to_string();
        for (port, other) in [(a.addr.port(), secret(&b.base)), (b.addr.port(), secret(&a.base))] {
            let answer = get(format!("http://127.0.0.1:{port}/{other}/ebb/v1/notice")).await;
            assert_eq!(answer.status(), 404, "port {port} took another attempt's secret");
        }
        drop(a.notice);
        // B's is served on after A's has stopped.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(a.addr).await.is_ok() {
            assert!(std::time::Instant::now() < deadline, "A's endpoint still listens");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(get(format!("{}/ebb/v1/notice", b.base)).await.status(), 200);
    }

    proptest::proptest! {
        /// Whatever the path and query, taking the secret off never
        /// panics, passes on only a path that started with the secret,
        /// and keeps the rest and the query as they were.
        #[test]
        fn taking_the_secret_off_any_path_keeps_the_rest(
            rest in "(/[a-zA-Z0-9%._~-]{0,12}){0,4}",
            query in proptest::option::of("[a-zA-Z0-9=&%_-]{0,20}"),
            prefix in "[a-f0-9/]{0,40}",
        ) {
            let secret = Secret("0123456789abcdef0123456789abcdef".into());
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            for (path, passes) in [(format!("/{}{rest}", secret.0), true), (format!("/{prefix}{rest}"), false)] {
                let Ok(request) = Request::builder().uri(format!("{path}{query}")).body(Body::empty()) else {
                    continue;
                };
                match secret.strip_request(request) {
                    Some(request) => {
                        proptest::prop_assert!(passes || prefix.starts_with(&secret.0), "{path}");
                        let want = if rest.is_empty() { "/" } else { rest.as_str() };
                        proptest::prop_assert_eq!(request.uri().path(), want);
                        proptest::prop_assert_eq!(request.uri().query(), query.strip_prefix('?'));
                    }
                    None => proptest::prop_assert!(!passes, "{path}{query} refused"),
                }
            }
        }
    }

    /// A job sent 20,000 checkpoint reports in 3.7 s, each an event kept
    /// for ever: past a burst, one a second is taken and the rest are
    /// refused with a 429 that says why.
    #[tokio::test]
    async fn reports_past_the_burst_are_refused_with_a_429() {
        let Served { base, notice: _notice, .. } = served("metadata-rate", 2).await;
        let http = reqwest::Client::new();
        let mut statuses = Vec::new();
        for step in 0..40 {
            let body = format!(r#"{{"step": {step}}}"#);
            statuses.push(
                http.post(format!("{base}/ebb/v1/checkpoint")).body(body).send().await.unwrap().status(),
            );
        }
        let accepted = statuses.iter().filter(|s| **s == 202).count();
        assert!((20..=22).contains(&accepted), "{accepted} of 40 taken at once: {statuses:?}");
        let refused =
            http.post(format!("{base}/ebb/v1/progress")).body(r#"{"fraction": 0.5}"#).send().await.unwrap();
        assert_eq!(refused.status(), 429);
        assert!(refused.text().await.unwrap().contains("report a second"));
    }

    /// A job opened 2,145 idle connections to its own endpoint and the
    /// root agent ran out of descriptors: an endpoint holds 32 at once and
    /// closes the rest as they come.
    #[tokio::test]
    async fn an_endpoint_holds_a_bounded_number_of_connections() {
        use tokio::io::AsyncReadExt;
        let Served { addr, base, notice: _notice, .. } = served("metadata-conns", 2).await;
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a connection over the bound was kept: {read:?}");
        held.pop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = reqwest::Client::new().get(format!("{base}/ebb/v1/notice")).send().await.unwrap();
        assert_eq!(answer.text().await.unwrap(), "no drain notice\n", "a freed place was not given back");
    }
}
