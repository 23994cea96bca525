//! Each attempt's own metadata endpoint, on loopback: Ebb's native notice
//! and the three clouds' spot/preemption shapes, so that spot-aware tools
//! and the clouds' SDKs find the drain notice where they already look.
//!
//! * native: `GET /ebb/v1/notice` (404 until notice, then the notice JSON);
//!   `POST /ebb/v1/checkpoint` with `{"step", "bytes", "seconds"}` reports a
//!   completed checkpoint, relayed to the server; `POST /ebb/v1/resumed`
//!   with `{"step"}` says the attempt resumed from a checkpoint (a drill
//!   waits for it); `POST /ebb/v1/progress` with `{"fraction"}` (0 to 1)
//!   reports how much of the job is done, by which a deadline is judged
//! * AWS: `PUT /latest/api/token` (IMDSv2), `GET /latest/meta-data/spot/instance-action`
//! * GCP: `GET /computeMetadata/v1/instance/preempted` (`Metadata-Flavor: Google`),
//!   with `?wait_for_change=true` blocking until it changes
//! * Azure: `GET /metadata/scheduledevents` (`Metadata: true`)

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use ebb_api::{AgentEvent, AttemptRef};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::checkpoints::AttemptUploads;
use crate::report::{now_ms, Reporter};

/// The drain notice as every shape reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub action: String,
    pub notice_at: String,
    pub deadline: String,
    pub reason: String,
    #[serde(skip)]
    pub deadline_ms: u64,
}

impl Notice {
    /// A drain's notice: the job is preempted (and requeued) unless it
    /// finishes first.
    pub fn new(notice_at_ms: u64, deadline_ms: u64, reason: String) -> Notice {
        Notice {
            action: "preempt".into(),
            notice_at: rfc3339(notice_at_ms),
            deadline: rfc3339(deadline_ms),
            reason,
            deadline_ms,
        }
    }

    /// A cancel's notice: the job ends, whatever it does, by the deadline.
    pub fn cancel(notice_at_ms: u64, deadline_ms: u64) -> Notice {
        Notice { action: "cancel".into(), ..Notice::new(notice_at_ms, deadline_ms, "cancel".into()) }
    }

    /// Whether this notice replaces `current`: an attempt has one notice,
    /// and a later one counts only if its deadline comes sooner (a cancel
    /// of a job being drained, a second cancel with a shorter grace). The
    /// same notice again (a command repeated after a reconnect) does not.
    pub fn supersedes(&self, current: Option<&Notice>) -> bool {
        current.is_none_or(|c| self.deadline_ms < c.deadline_ms)
    }
}

/// Times as the native shape writes them: `2026-11-29T08:22:00.000Z`.
fn rfc3339(ms: u64) -> String {
    ebb_core::time::rfc3339_millis(ms)
}

#[derive(Clone)]
struct Endpoint {
    job: u64,
    attempt: u32,
    node: String,
    notice: watch::Receiver<Option<Notice>>,
    events: Arc<Reporter>,
    /// The attempt's checkpoint uploads, where there is a store.
    uploads: Option<Arc<AttemptUploads>>,
}

/// Serves one attempt's endpoint on `listener` until `notice` is dropped;
/// checkpoint reports go to `events`, remembered until the server has
/// them, as the attempt's start and exit are.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    job: u64,
    attempt: u32,
    node: String,
    notice: watch::Receiver<Option<Notice>>,
    events: Arc<Reporter>,
    uploads: Option<Arc<AttemptUploads>>,
) {
    let mut closed = notice.clone();
    let endpoint = Endpoint { job, attempt, node, notice, events, uploads };
    let router = Router::new()
        .route("/", get(native_root))
        .route("/ebb/v1/notice", get(native_notice))
        .route("/ebb/v1/checkpoint", post(native_checkpoint))
        .route("/ebb/v1/resumed", post(native_resumed))
        .route("/ebb/v1/progress", post(native_progress))
        .route("/latest/api/token", put(aws_token))
        .route("/latest/meta-data/spot/instance-action", get(aws_instance_action))
        .route("/computeMetadata/v1/instance/preempted", get(gcp_preempted))
        .route("/metadata/scheduledevents", get(azure_events))
        .with_state(endpoint);
    let stop = async move { while closed.changed().await.is_ok() {} };
    let _ = axum::serve(listener, router).with_graceful_shutdown(stop).await;
}

async fn native_root(State(e): State<Endpoint>) -> Json<serde_json::Value> {
    let notice = e.notice.borrow().clone();
    Json(json!({ "job": e.job, "attempt": e.attempt, "node": e.node, "notice": notice }))
}

async fn native_notice(State(e): State<Endpoint>) -> Response {
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

async fn native_checkpoint(State(e): State<Endpoint>, body: Bytes) -> Response {
    let bad = |m: String| (StatusCode::BAD_REQUEST, Json(json!({ "error": m }))).into_response();
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

async fn native_resumed(State(e): State<Endpoint>, body: Bytes) -> Response {
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

async fn native_progress(State(e): State<Endpoint>, body: Bytes) -> Response {
    let bad = |m: String| (StatusCode::BAD_REQUEST, Json(json!({ "error": m }))).into_response();
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

async fn aws_token(State(e): State<Endpoint>) -> String {
    format!("ebb-imdsv2-{}-{}", e.job, e.attempt)
}

/// AWS times are whole seconds: `2026-11-29T08:22:00Z`.
fn aws_time(ms: u64) -> String {
    ebb_core::time::rfc3339_seconds(ms)
}

async fn aws_instance_action(State(e): State<Endpoint>) -> Response {
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
    State(mut e): State<Endpoint>,
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

async fn azure_events(State(e): State<Endpoint>, headers: HeaderMap) -> Response {
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
                    "EventType": if n.action == "cancel" { "Terminate" } else { "Preempt" },
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
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::testing::{self, until, FakeServer};

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
        tokio::spawn(serve(listener, 4, 2, "node-1".into(), notice_rx, reporter.clone(), None));
        let answer = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/ebb/v1/checkpoint"))
            .body(r#"{"step": 7, "seconds": 1.5}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202);
        let checkpoint = |e: &AgentEvent| {
            matches!(e, AgentEvent::Checkpoint { attempt, step: Some(7), duration_ms: 1500, .. }
                if *attempt == AttemptRef { job: 4, attempt: 2 })
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
        let fake = Arc::new(FakeServer::default());
        let (_, reporter) = testing::reporter(fake.clone(), "metadata-resumed").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_notice, notice_rx) = watch::channel(None);
        tokio::spawn(serve(listener, 4, 3, "node-1".into(), notice_rx, reporter.clone(), None));
        let post = |body: &'static str| {
            reqwest::Client::new().post(format!("http://127.0.0.1:{port}/ebb/v1/resumed")).body(body).send()
        };
        let bad = post(r#"{"step": -1}"#).await.unwrap();
        assert_eq!(bad.status(), 400);
        assert!(bad.text().await.unwrap().contains("step"), "the field is named");
        assert_eq!(post(r#"{"step": 1200}"#).await.unwrap().status(), 202);
        assert_eq!(post("{}").await.unwrap().status(), 202);
        let resumed = |step: Option<u64>| {
            move |e: &AgentEvent| {
                matches!(e, AgentEvent::Resumed { attempt, step: s, .. }
                    if *attempt == AttemptRef { job: 4, attempt: 3 } && *s == step)
            }
        };
        until("both are delivered", || {
            let delivered = fake.delivered();
            delivered.iter().any(resumed(Some(1200))) && delivered.iter().any(resumed(None))
        })
        .await;
    }

    /// A progress report is relayed to the server; one that is not a
    /// fraction from 0 to 1 is refused naming the field.
    #[tokio::test]
    async fn a_progress_report_is_relayed_and_one_that_is_not_a_fraction_refused() {
        let fake = Arc::new(FakeServer::default());
        let (_, reporter) = testing::reporter(fake.clone(), "metadata-progress").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_notice, notice_rx) = watch::channel(None);
        tokio::spawn(serve(listener, 4, 3, "node-1".into(), notice_rx, reporter.clone(), None));
        let post = |body: &'static str| {
            reqwest::Client::new().post(format!("http://127.0.0.1:{port}/ebb/v1/progress")).body(body).send()
        };
        for bad in [r#"{"fraction": 1.5}"#, r#"{"fraction": -0.1}"#, "{}", r#"{"fraction": "half"}"#] {
            let answer = post(bad).await.unwrap();
            assert_eq!(answer.status(), 400, "{bad}");
            assert!(answer.text().await.unwrap().contains("fraction"), "{bad}: the field is named");
        }
        assert_eq!(post(r#"{"fraction": 0.62}"#).await.unwrap().status(), 202);
        let progress = |e: &AgentEvent| {
            matches!(e, AgentEvent::Progress { attempt, fraction, .. }
                if *attempt == AttemptRef { job: 4, attempt: 3 } && *fraction == 0.62)
        };
        until("it is delivered", || fake.delivered().iter().any(progress)).await;
        assert_eq!(fake.delivered().iter().filter(|e| matches!(e, AgentEvent::Progress { .. })).count(), 1);
    }
}
