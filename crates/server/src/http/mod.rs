//! The REST API: the router and authentication here; extractors, the
//! OpenAPI document, one module per resource, the agent protocol and the
//! process start-up in their own modules.

mod agent;
mod doc;
mod extract;
mod fleet;
mod jobs;
mod money;
pub mod scrape;
mod start;
mod tenants;
mod watch;
mod webhooks;

use extract::{parse, ApiPath, ApiQuery, Body};
pub use start::{serve, ServeError};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use ebb_api as api;
use ebb_core::{JobId, TenantId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::engine::{EngineConfig, JobState, Msg};
use crate::leader::{LeaseConfig, Proxy, Role};
use crate::store::{Scope, SqliteStore, Store};
use crate::{hash_token, Principal, Refusal, Refused, ServerConfig, TokenMap, TokenState};

#[derive(Clone)]
struct App {
    role: Arc<Role>,
    feed: crate::engine::Feed,
    tokens: TokenMap,
    poll_wait: Duration,
    /// The CA certificate (PEM) joining agents fetch, when the server
    /// serves HTTPS and knows its CA.
    tls_ca: Option<Arc<str>>,
    /// Open `/v1/stream` connections by tenant (`None`: operators).
    streams: Arc<std::sync::Mutex<HashMap<Option<TenantId>, usize>>>,
    /// The SHA-256 of the token a Prometheus server scrapes `/metrics`
    /// with (`--metrics-token-file`), beside an operator's.
    metrics_token: Option<Arc<scrape::ScrapeTokens>>,
    registries: ebb_image::Registries,
}

/// How many `/v1/stream` connections one tenant (or the operators) may
/// hold open at once: each is a task and a socket for as long as a page
/// stays open, so a tenant opening them in a loop cannot starve others.
const STREAMS_PER_TENANT: usize = 32;

/// One open stream, counted while it lives.
struct StreamSlot {
    streams: Arc<std::sync::Mutex<HashMap<Option<TenantId>, usize>>>,
    tenant: Option<TenantId>,
}

impl StreamSlot {
    fn take(app: &App, principal: &Principal) -> ApiResult<StreamSlot> {
        let tenant = principal.tenant.as_ref().map(|(id, _)| *id);
        let mut open = app.streams.lock().expect("stream counts");
        let count = open.entry(tenant).or_insert(0);
        if *count >= STREAMS_PER_TENANT {
            let who =
                principal.tenant.as_ref().map_or("the operators".to_string(), |(_, n)| format!("tenant {n}"));
            return Err(Refusal::over_limit(format!(
                "{who} has {STREAMS_PER_TENANT} event streams open, the most allowed; close a dashboard tab or another reader of /v1/stream"
            ))
            .into());
        }
        *count += 1;
        Ok(StreamSlot { streams: app.streams.clone(), tenant })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.lock().expect("stream counts");
        if let Some(count) = open.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// An error for an API caller: an HTTP status and a message that names
/// what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: String) -> Self {
        ApiError { status: 400, message }
    }
    pub fn unauthorized(message: &str) -> Self {
        ApiError { status: 401, message: message.into() }
    }
    pub fn forbidden(message: &str) -> Self {
        ApiError { status: 403, message: message.into() }
    }
    pub fn not_found(message: String) -> Self {
        ApiError { status: 404, message }
    }
    pub fn unprocessable(message: String) -> Self {
        ApiError { status: 422, message }
    }
    pub fn internal(message: String) -> Self {
        ApiError { status: 500, message }
    }
}

/// Each kind of refusal's HTTP status: the only place the two meet.
/// Refusals the API document states (a limit, a pattern) are 400s; those
/// it cannot state (what this cluster has, how fields relate, limits the
/// operator sets) are 422s.
pub fn status(kind: Refused) -> u16 {
    match kind {
        Refused::Invalid => 400,
        Refused::Unauthenticated => 401,
        Refused::Forbidden => 403,
        Refused::NotFound => 404,
        Refused::Conflict => 409,
        Refused::Unacceptable => 422,
        Refused::OverLimit => 429,
        Refused::Internal => 500,
        Refused::Unavailable => 503,
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        ApiError { status: status(r.kind), message: r.message }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(api::ErrorBody { error: self.message })).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

impl App {
    fn principal(&self, headers: &HeaderMap) -> ApiResult<Principal> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthorized("missing bearer token (Authorization: Bearer TOKEN)"))?;
        let token =
            value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).ok_or_else(|| {
                ApiError::unauthorized("malformed Authorization header: expected Bearer TOKEN")
            })?;
        match self.tokens.read().expect("token map").get(&hash_token(token)) {
            Some(TokenState::Valid(principal)) => Ok(principal.clone()),
            Some(TokenState::Revoked(why)) => Err(ApiError::unauthorized(why)),
            None => Err(ApiError::unauthorized("invalid token")),
        }
    }

    fn require(&self, headers: &HeaderMap, scope: Scope) -> ApiResult<Principal> {
        let principal = self.principal(headers)?;
        if principal.scope != scope {
            let what = match scope {
                Scope::Admin => "this call needs an admin token",
                Scope::Agent => "this call needs the agents' join token",
                Scope::Node => "this call needs a node's credential",
                Scope::Tenant => "this call needs a tenant token",
            };
            return Err(ApiError::forbidden(what));
        }
        Ok(principal)
    }

    fn tenant(&self, headers: &HeaderMap) -> ApiResult<Principal> {
        let principal = self.principal(headers)?;
        match principal.scope {
            Scope::Agent => Err(ApiError::forbidden("the join token is for agents only")),
            Scope::Node => Err(ApiError::forbidden("a node's credential is for its agent only")),
            Scope::Admin | Scope::Tenant => Ok(principal),
        }
    }

    /// A poll or report: only with the credential of the node it names.
    fn node(&self, headers: &HeaderMap, node: &str) -> ApiResult<Principal> {
        let principal = self.principal(headers)?;
        match (principal.scope, principal.node.as_deref()) {
            (Scope::Node, Some(own)) if own == node => Ok(principal),
            (Scope::Node, Some(own)) => Err(ApiError::forbidden(&format!(
                "this credential is node {own}'s; it cannot speak for node {node}"
            ))),
            (Scope::Agent, _) => Err(ApiError::forbidden(
                "the join token only registers a node: polls and reports need the node's own credential, \
                 which registration returns",
            )),
            _ => Err(ApiError::forbidden("this call needs a node's credential")),
        }
    }

    /// Resolves the image a submission names to its digest, with the
    /// tenant's login for its registry: a reference the registry does not
    /// have is refused now, not found at the start.
    async fn resolve_image(
        &self,
        principal: &Principal,
        spec: &mut api::JobSubmission,
        field: &str,
    ) -> ApiResult<()> {
        spec.image_digest = None;
        let Some(reference) = spec.image.clone() else { return Ok(()) };
        let parsed = self
            .registries
            .check(&reference)
            .map_err(|e| ApiError::unprocessable(format!("{field}image: {e}")))?;
        let login = match &principal.tenant {
            Some((tenant, _)) => {
                let (tenant, registry) = (*tenant, parsed.registry().to_string());
                self.ask(|reply| Msg::RegistryLoginFor { tenant, registry, reply }).await?
            }
            None => None,
        };
        let login = login.map(|l| ebb_image::Login { username: l.username, password: l.password });
        match ebb_image::resolve(&self.registries, &reference, login.as_ref()).await {
            Ok(digest) => {
                spec.image_digest = Some(digest);
                Ok(())
            }
            Err(e) if e.is_transient() => {
                Err(Refusal::unavailable(format!("{field}image: {e}; nothing was submitted")).into())
            }
            Err(e) => Err(ApiError::unprocessable(format!("{field}image: {e}"))),
        }
    }

    /// Sends a message to the writer and waits for its reply.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> ApiResult<T> {
        let (tx, rx) = oneshot::channel();
        let not_leading = || ApiError {
            status: 503,
            message: "this server is not leading now; nothing was done, try again".into(),
        };
        let writer = self.role.writer().ok_or_else(not_leading)?;
        writer.send(make(tx)).await.map_err(|_| not_leading())?;
        rx.await.map_err(|_| ApiError::internal("the request was not committed".into()))
    }
}

/// The router over a writer the caller runs, without a listener, TLS or a
/// process: what the in-process tests serve requests with
/// (`tower::ServiceExt::oneshot`), as a listener serves its connections.
/// `role` must lead, with the writer's queue; polls are answered at once.
pub fn in_process(
    role: Arc<Role>,
    tokens: TokenMap,
    feed: crate::engine::Feed,
    metrics_token: Option<&str>,
) -> Router {
    let app = App {
        role: role.clone(),
        feed,
        tokens,
        poll_wait: Duration::ZERO,
        tls_ca: None,
        streams: Arc::default(),
        metrics_token: metrics_token.map(|t| Arc::new(scrape::ScrapeTokens::fixed(t))),
        registries: ebb_image::Registries::default(),
    };
    let proxy = Proxy::new(role.clone(), None).expect("a forwarding client without a CA");
    router(app, role, proxy)
}

/// Anything not routed: a JSON 404.
async fn no_route() -> ApiError {
    ApiError::not_found("no such route (see /openapi.json)".into())
}

/// A route called with a method it does not take: a JSON 405 (axum adds
/// the `Allow` header).
async fn wrong_method() -> ApiError {
    ApiError { status: 405, message: "method not allowed on this route (see /openapi.json)".into() }
}

/// Every route: `/v1` and the page, refusals as JSON, and each request
/// forwarded to the leader when this server follows.
fn router(app: App, role: Arc<Role>, proxy: Proxy) -> Router {
    Router::new()
        .route("/healthz", get(crate::leader::healthz).with_state(role))
        .route("/openapi.json", get(doc::openapi))
        .route("/metrics", get(watch::metrics))
        .route("/v1/jobs", post(jobs::submit).get(jobs::list_jobs))
        .route("/v1/jobs/batch", post(jobs::submit_batch))
        .route("/v1/jobs/{id}", get(jobs::show_job))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel_job))
        .route("/v1/jobs/{id}/signal", post(jobs::signal_job))
        .route("/v1/jobs/{id}/steps", get(jobs::job_steps))
        .route("/v1/partitions", get(jobs::list_partitions))
        .route("/v1/jobs/{id}/drill", post(jobs::drill_job))
        .route("/v1/jobs/{id}/logs", get(jobs::job_logs))
        .route("/v1/nodes", get(fleet::list_nodes))
        .route("/v1/capacity", get(fleet::capacity))
        .route("/v1/nodes/{name}", delete(fleet::remove_node))
        .route("/v1/nodes/{name}/drain", post(fleet::drain_node))
        .route("/v1/nodes/{name}/undrain", post(fleet::undrain_node))
        .route("/v1/reclaim", post(fleet::reclaim))
        .route("/v1/reclaim/release", post(fleet::release_reclaim))
        .route("/v1/webhooks", post(webhooks::create_webhook).get(webhooks::list_webhooks))
        .route("/v1/webhooks/{id}", delete(webhooks::delete_webhook))
        .route("/v1/webhooks/{id}/log", get(webhooks::webhook_log))
        .route("/v1/tenants", post(tenants::create_tenant).get(tenants::list_tenants))
        .route("/v1/tenants/{name}/limits", get(tenants::get_tenant_limits).put(tenants::set_tenant_limits))
        .route("/v1/tenants/{name}/registry-logins", get(tenants::list_registry_logins))
        .route(
            "/v1/tenants/{name}/registry-logins/{registry}",
            axum::routing::put(tenants::set_registry_login).delete(tenants::delete_registry_login),
        )
        .route(
            "/v1/tenants/{name}/tokens",
            post(tenants::rotate_tenant_token).delete(tenants::revoke_tenant_tokens),
        )
        .route("/v1/prices", get(money::list_prices))
        .route("/v1/prices/{model}", put(money::set_price))
        .route("/v1/reservations", post(money::create_reservation).get(money::list_reservations))
        .route("/v1/reservations/{id}", delete(money::delete_reservation))
        .route("/v1/bill", get(money::bill))
        .route("/v1/report", get(money::operator_report))
        .route("/v1/report/series", get(money::operator_report_series))
        .route("/v1/agent/join-token", post(fleet::rotate_join_token))
        .route("/v1/agent/register", post(agent::agent_register))
        .route("/v1/agent/commands", get(agent::agent_commands))
        .route("/v1/agent/report", post(agent::agent_report))
        .route("/v1/agent/image", post(agent::agent_image))
        .route("/v1/tls/ca.crt", get(agent::tls_ca))
        .route("/v1/stream", get(watch::stream))
        .route("/", get(crate::web::index))
        .route("/assets/{name}", get(crate::web::asset))
        .layer(DefaultBodyLimit::max(api::MAX_REQUEST_BYTES))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(proxy, crate::leader::forward))
}
