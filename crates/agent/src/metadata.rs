//! Each attempt's own metadata endpoint, on loopback: Ebb's native notice
//! and the three clouds' spot/preemption shapes, so that spot-aware tools
//! and the clouds' SDKs find the drain notice where they already look.
//!
//! * native: `GET /ebb/v1/notice` (404 until notice, then the notice JSON)
//! * AWS: `PUT /latest/api/token` (IMDSv2), `GET /latest/meta-data/spot/instance-action`
//! * GCP: `GET /computeMetadata/v1/instance/preempted` (`Metadata-Flavor: Google`),
//!   with `?wait_for_change=true` blocking until it changes
//! * Azure: `GET /metadata/scheduledevents` (`Metadata: true`)

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

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
    pub fn new(notice_at_ms: u64, deadline_ms: u64, reason: String) -> Notice {
        Notice {
            action: "preempt".into(),
            notice_at: crate::rfc3339(notice_at_ms),
            deadline: crate::rfc3339(deadline_ms),
            reason,
            deadline_ms,
        }
    }
}

#[derive(Clone)]
struct Endpoint {
    job: u64,
    attempt: u32,
    node: String,
    notice: watch::Receiver<Option<Notice>>,
}

/// Serves one attempt's endpoint on `listener` until `notice` is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    job: u64,
    attempt: u32,
    node: String,
    notice: watch::Receiver<Option<Notice>>,
) {
    let mut closed = notice.clone();
    let endpoint = Endpoint { job, attempt, node, notice };
    let router = Router::new()
        .route("/", get(native_root))
        .route("/ebb/v1/notice", get(native_notice))
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

async fn aws_token(State(e): State<Endpoint>) -> String {
    format!("ebb-imdsv2-{}-{}", e.job, e.attempt)
}

/// AWS times are whole seconds: `2026-11-29T08:22:00Z`.
fn aws_time(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
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
            let not_before = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(n.deadline_ms));
            json!({
                "DocumentIncarnation": 1,
                "Events": [{
                    "EventId": format!("ebb-{}-{}", e.job, e.attempt),
                    "EventType": "Preempt",
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
