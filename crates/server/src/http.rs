//! The REST API: routes, authentication, errors, the OpenAPI document.

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
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use utoipa::OpenApi;

use crate::engine::{Engine, EngineConfig, JobState, Msg};
use crate::leader::{LeaseConfig, Proxy, Role};
use crate::store::{Scope, SqliteStore, Store};
use crate::{hash_token, ApiError, Principal, ServerConfig, TokenMap, TokenState};

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
    streams: Arc<std::sync::Mutex<HashMap<Option<u32>, usize>>>,
    /// The SHA-256 of the token a Prometheus server scrapes `/metrics`
    /// with (`--metrics-token-file`), beside an operator's.
    metrics_token: Option<Arc<str>>,
    registries: ebb_image::Registries,
}

/// How many `/v1/stream` connections one tenant (or the operators) may
/// hold open at once: each is a task and a socket for as long as a page
/// stays open, so a tenant opening them in a loop cannot starve others.
const STREAMS_PER_TENANT: usize = 32;

/// One open stream, counted while it lives.
struct StreamSlot {
    streams: Arc<std::sync::Mutex<HashMap<Option<u32>, usize>>>,
    tenant: Option<u32>,
}

impl StreamSlot {
    fn take(app: &App, principal: &Principal) -> ApiResult<StreamSlot> {
        let tenant = principal.tenant.as_ref().map(|(id, _)| *id);
        let mut open = app.streams.lock().expect("stream counts");
        let count = open.entry(tenant).or_insert(0);
        if *count >= STREAMS_PER_TENANT {
            let who =
                principal.tenant.as_ref().map_or("the operators".to_string(), |(_, n)| format!("tenant {n}"));
            return Err(ApiError::too_many(format!(
                "{who} has {STREAMS_PER_TENANT} event streams open, the most allowed; close a dashboard tab or another reader of /v1/stream"
            )));
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
                Err(ApiError::unavailable(format!("{field}image: {e}; nothing was submitted")))
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

/// A path parameter. One that does not parse (`/v1/jobs/abc`) is a JSON 400
/// like every other refusal, never axum's plain-text one.
struct ApiPath<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(e) => {
                Err(ApiError { status: e.status().as_u16(), message: format!("path: {}", e.body_text()) })
            }
        }
    }
}

/// A query string. A malformed one is a JSON 400 naming the parameter.
struct ApiQuery<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(e) => {
                let text = e.body_text();
                let detail = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
                let message =
                    if detail.contains(": ") { detail.to_string() } else { format!("query: {detail}") };
                Err(ApiError { status: e.status().as_u16(), message })
            }
        }
    }
}

/// A request body, read whole. One over the server's limit is a JSON 413.
struct Body(Bytes);

/// axum's default body limit, which every route keeps.
const BODY_LIMIT: &str = "2 MiB";

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError { status: 413, message: format!("body: over the {BODY_LIMIT} limit") })
            }
            Err(e) => {
                Err(ApiError { status: e.status().as_u16(), message: format!("body: {}", e.body_text()) })
            }
        }
    }
}

/// Parses a JSON body, naming the field that was wrong. A number written
/// with a zero fraction (`2.0`) is the integer it equals, as in JSON Schema.
fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    // Every body is an object; serde would also read a struct from an
    // array of its fields (`[null, null]`), which the document rules out.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("body: expected a JSON object".into()));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize(de) {
        Ok(value) => Ok(value),
        Err(e) if e.inner().to_string().starts_with("invalid type: floating point") => {
            let mut value: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| body_error(String::new(), e))?;
            integral_floats_as_integers(&mut value);
            serde_path_to_error::deserialize(value)
                .map_err(|e| body_error(e.path().to_string(), e.into_inner()))
        }
        Err(e) => Err(body_error(e.path().to_string(), e.into_inner())),
    }
}

fn body_error(path: String, inner: impl std::fmt::Display) -> ApiError {
    if path == "." || path.is_empty() {
        ApiError::bad_request(format!("body: {inner}"))
    } else {
        ApiError::bad_request(format!("{path}: {inner}"))
    }
}

fn integral_floats_as_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().expect("an f64");
            if f.fract() == 0.0 && f >= 0.0 && f < u64::MAX as f64 {
                *n = (f as u64).into();
            } else if f.fract() == 0.0 && f < 0.0 && f >= i64::MIN as f64 {
                *n = (f as i64).into();
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        serde_json::Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Ebb", description = "Preemptible GPU compute with a drain window"),
    paths(submit, submit_batch, list_jobs, show_job, cancel_job, drill_job, job_logs, list_nodes, drain_node, undrain_node, remove_node, reclaim, release_reclaim,
        create_tenant, list_tenants, rotate_tenant_token, revoke_tenant_tokens, rotate_join_token, get_tenant_limits,
        set_tenant_limits, list_registry_logins, set_registry_login, delete_registry_login, list_prices, set_price, create_reservation, list_reservations, delete_reservation, bill,
        operator_report, operator_report_series, agent_register, agent_commands, agent_report, tls_ca),
    components(schemas(
        api::JobSubmission, api::Submitted, api::JobBatch, api::BatchSubmitted, api::Job, api::JobEvent, api::EventKind, api::NodeGpus, api::Node, api::HeldGpus,
        api::ReclaimRequest, api::ReclaimReply, api::ReclaimRelease, api::ReclaimReleased, api::TenantRequest, api::TenantCreated, api::TenantSummary, api::LogChunk, api::LogSource,
        api::ErrorBody, api::SweepParam, api::Checkpoint, api::Drill, api::DrillCheckpoint, api::DeadlineStatus, api::UsageSegment, api::ArrayTask, api::ArrayProgress, api::TaskState,
        api::Price, api::PriceBook, api::PriceUpdate, api::ReservationRequest, api::Reservation, api::Borrower, api::Usage,
        api::InvoiceLine, api::ReservationCharge, api::Invoice, api::TierReport, api::OperatorReport,
        api::ReportBucket, api::ReportSeries,
        api::NodeRemoved, api::JoinToken, api::TenantTokens,
        api::AttemptRef, api::Register, api::Registered, api::CheckpointStoreLocation, api::Command, api::Action, api::StartAttempt,
        api::DrainAttempt, api::StopNotice, api::CancelRequest, api::Commands, api::Report, api::AgentEvent, api::ReportReply,
        api::JobImage, api::PullProgress, api::StartImage, api::RegistryLogin, api::RegistryLoginInfo
    )),
    tags(
        (name = "jobs", description = "Submitting, watching and cancelling jobs (tenant or admin token)"),
        (name = "operator", description = "Nodes, capacity and tenants (admin token)"),
        (name = "tenants", description = "A tenant's own settings: its registry logins (tenant or admin token)"),
        (name = "billing", description = "Prices, reservations, invoices and the operator's report"),
        (name = "agent", description = "The protocol between the server and its agents (join token)")
    ),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

/// Submit a job. Answered only once the job is durable.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = api::JobSubmission,
    responses((status = 201, body = api::Submitted),
        (status = 422, description = "A well-formed job this cluster refuses: an unknown GPU model, a shape its nodes cannot hold, a reserved job without a reservation, an empty program name, an array range backwards or over 10000 tasks, a sweep with an array, an image the registry does not have or refuses the tenant's login for", body = api::ErrorBody),
        (status = 503, description = "The image's registry cannot be reached: nothing was submitted", body = api::ErrorBody)))]
async fn submit(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::Submitted>)> {
    let principal = app.tenant(&headers)?;
    let mut spec: api::JobSubmission = parse(&body)?;
    app.resolve_image(&principal, &mut spec, "").await?;
    let ids = app.ask(|reply| Msg::Submit { principal, spec, reply }).await??;
    let id = ids[0];
    let ids = if ids.len() > 1 { ids } else { Vec::new() };
    Ok((StatusCode::CREATED, Json(api::Submitted { id, ids })))
}

/// Submit several jobs in one request: one transaction, all or none. A
/// refusal names the submission (`jobs[3].gpus: ...`).
#[utoipa::path(post, path = "/v1/jobs/batch", tag = "jobs", request_body = api::JobBatch,
    responses((status = 201, body = api::BatchSubmitted),
        (status = 422, description = "A submission this cluster refuses (named by its index), an empty batch, or over 10000 jobs in all", body = api::ErrorBody),
        (status = 503, description = "An image's registry cannot be reached: nothing was submitted", body = api::ErrorBody)))]
async fn submit_batch(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::BatchSubmitted>)> {
    let principal = app.tenant(&headers)?;
    let batch: api::JobBatch = parse(&body)?;
    if batch.jobs.is_empty() {
        return Err(ApiError::unprocessable("jobs: the batch is empty".into()));
    }
    let mut specs = batch.jobs;
    // One registry round trip per distinct image of the batch.
    let mut resolved: HashMap<String, String> = HashMap::new();
    for (i, spec) in specs.iter_mut().enumerate() {
        if let Some(digest) = spec.image.as_ref().and_then(|r| resolved.get(r)) {
            spec.image_digest = Some(digest.clone());
            continue;
        }
        app.resolve_image(&principal, spec, &format!("jobs[{i}].")).await?;
        if let (Some(reference), Some(digest)) = (&spec.image, &spec.image_digest) {
            resolved.insert(reference.clone(), digest.clone());
        }
    }
    let made = app.ask(|reply| Msg::SubmitBatch { principal, specs, reply }).await??;
    let jobs = made
        .into_iter()
        .map(|ids| api::Submitted { id: ids[0], ids: if ids.len() > 1 { ids } else { Vec::new() } })
        .collect();
    Ok((StatusCode::CREATED, Json(api::BatchSubmitted { jobs })))
}

#[derive(Deserialize)]
struct JobsQuery {
    #[serde(default)]
    cursor: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arrays: Option<String>,
}

impl JobsQuery {
    /// The engine's query, or a 400 naming the parameter that is wrong.
    fn check(self) -> ApiResult<crate::engine::JobQuery> {
        let limit = self.limit.unwrap_or(JOBS_PAGE);
        if !(1..=JOBS_PAGE).contains(&limit) {
            return Err(ApiError::bad_request(format!(
                "limit: must be between 1 and {JOBS_PAGE}, got {limit}"
            )));
        }
        let desc = match self.order.as_deref() {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!("order: must be asc or desc, got {other:?}")))
            }
        };
        let collapse = match self.arrays.as_deref() {
            None | Some("expand") => false,
            Some("collapse") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "arrays: must be expand or collapse, got {other:?}"
                )))
            }
        };
        let states = match self.state.as_deref() {
            None => None,
            Some(list) => Some(job_states(list)?),
        };
        let tier = match self.tier.as_deref() {
            None => None,
            Some(t @ ("reserved" | "on-demand" | "preemptible")) => t.parse::<ebb_core::Tier>().ok(),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "tier: must be reserved, on-demand or preemptible, got {other:?}"
                )))
            }
        };
        Ok(crate::engine::JobQuery {
            cursor: self.cursor,
            limit,
            desc,
            states,
            tier,
            name: self.name,
            collapse,
        })
    }
}

/// `queued,running`, or `active` for every unfinished state.
fn job_states(list: &str) -> ApiResult<Vec<JobState>> {
    let mut states = Vec::new();
    for name in list.split(',') {
        match name {
            "active" => states.extend(JobState::ALL.into_iter().filter(|s| !s.is_final())),
            _ => states.push(JobState::parse(name).ok_or_else(|| {
                let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::bad_request(format!(
                    "state: unknown state {name:?}; states are active, {}",
                    known.join(", ")
                ))
            })?),
        }
    }
    Ok(states)
}

/// Jobs on one page unless asked for fewer.
const JOBS_PAGE: usize = 500;

/// The caller's jobs (an admin sees every tenant's), a page at a time by
/// id: `limit` (1-500, default 500) jobs past `cursor`, oldest first
/// (`order=desc`: newest first), filtered by state, tier and name.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    params(("cursor" = Option<u64>, Query, description = "the previous page's next_cursor"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 500),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "asc (oldest first, the default) or desc (newest first)"),
        ("state" = Option<String>, Query, pattern = "^(active|queued|starting|running|draining|succeeded|failed|cancelled)(,(active|queued|starting|running|draining|succeeded|failed|cancelled))*$",
            description = "only these states, comma-separated: queued, starting, running, draining, succeeded, failed, cancelled; active = the unfinished four"),
        ("tier" = Option<String>, Query, pattern = "^(reserved|on-demand|preemptible)$", description = "only this tier: reserved, on-demand or preemptible"),
        ("name" = Option<String>, Query, description = "only jobs whose name contains this"),
        ("arrays" = Option<String>, Query, pattern = "^(expand|collapse)$", description = "expand (every task, the default) or collapse (an array is one entry: its first task, with the array's progress; a state filter matches any task's state)")),
    responses((status = 200, body = api::JobPage), (status = 400, body = api::ErrorBody)))]
async fn list_jobs(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<JobsQuery>,
) -> ApiResult<Json<api::JobPage>> {
    let principal = app.tenant(&headers)?;
    let query = q.check()?;
    Ok(Json(app.ask(|reply| Msg::Jobs { principal, query, reply }).await??))
}

/// One job with its event history.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody)))]
async fn show_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Job { principal, id, reply }).await??))
}

/// Cancel a job: a queued job ends at once, a running one gets a notice
/// (`reason` `cancel`), SIGTERM, and SIGKILL after the grace. A job that
/// has already ended is a 409 naming its state.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = u64, Path)),
    request_body(content = Option<api::CancelRequest>, description = "Optional: an empty body takes the defaults"),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody),
        (status = 409, description = "The job has already ended", body = api::ErrorBody),
        (status = 422, description = "A grace longer than the cluster's drain window", body = api::ErrorBody)))]
async fn cancel_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
    Body(body): Body,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    // No body, or the document's `null`, takes the defaults.
    let req: api::CancelRequest = match body.trim_ascii() {
        b"" | b"null" => api::CancelRequest::default(),
        _ => parse(&body)?,
    };
    Ok(Json(app.ask(|reply| Msg::Cancel { principal, id, req, reply }).await??))
}

/// A fire drill: the running preemptible job gets a real drain notice
/// with the cluster's drain window (its notice file, its endpoint, its
/// signal, SIGKILL at the deadline) and is requeued at once when it exits,
/// counted as neither a preemption nor a failure and billed as run time.
/// `drill` in the answer, and in `GET /v1/jobs/{id}` as it goes on, says
/// what it did and, once its next attempt reported resuming, the verdict.
#[utoipa::path(post, path = "/v1/jobs/{id}/drill", tag = "jobs", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody),
        (status = 409, description = "The job is not running, is already draining, or is being cancelled", body = api::ErrorBody),
        (status = 422, description = "The job is not preemptible", body = api::ErrorBody)))]
async fn drill_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Drill { principal, id, reply }).await??))
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
    /// With where each gang node's lines start (`LogChunk::sources`).
    #[serde(default)]
    label: bool,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A job's output from `offset`; with `follow`, waits for more.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = u64, Path), ("offset" = Option<u64>, Query), ("follow" = Option<bool>, Query), ("wait_ms" = Option<u64>, Query, description = "With follow: how long to wait for output, at most 60000"), ("label" = Option<bool>, Query, description = "With where each of a gang's nodes' lines start (sources)")),
    responses((status = 200, body = api::LogChunk), (status = 404, description = "No such job the caller may see", body = api::ErrorBody)))]
async fn job_logs(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> ApiResult<Json<api::LogChunk>> {
    let principal = app.tenant(&headers)?;
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(20_000).min(60_000));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let p = principal.clone();
        let (offset, sources) = (q.offset, q.label);
        let log = app.ask(|reply| Msg::LogFile { principal: p, id, offset, sources, reply }).await??;
        let (path, finished) = (log.path, log.finished);
        let data = match log.stored {
            Some(data) => data,
            None => read_from(&path, q.offset, log.committed).await,
        };
        if !data.is_empty() || !q.follow || finished || tokio::time::Instant::now() >= deadline {
            let next_offset = q.offset + data.len() as u64;
            let data = String::from_utf8_lossy(&data).into_owned();
            // Finished only once everything has been read.
            let finished = finished && next_offset >= log.committed;
            let sources =
                log.sources.into_iter().map(|(offset, node)| api::LogSource { offset, node }).collect();
            return Ok(Json(api::LogChunk { offset: q.offset, next_offset, data, finished, sources }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Up to 1 MiB of the log from `offset`, never past what is committed.
async fn read_from(path: &std::path::Path, offset: u64, committed: u64) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut file) = tokio::fs::File::open(path).await else { return Vec::new() };
    if offset >= committed || file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut data = Vec::new();
    let _ = file.take((committed - offset).min(1 << 20)).read_to_end(&mut data).await;
    data
}

/// Nodes and their GPUs (admin).
#[utoipa::path(get, path = "/v1/nodes", tag = "operator", responses((status = 200, body = [api::Node])))]
async fn list_nodes(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<Vec<api::Node>>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::Nodes { reply }).await?))
}

/// Drain a node for maintenance (admin): it takes no new work, its
/// preemptible jobs get the drain window, others finish.
#[utoipa::path(post, path = "/v1/nodes/{name}/drain", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::Node), (status = 404, description = "No such node", body = api::ErrorBody),
        (status = 409, description = "The node cannot be drained now", body = api::ErrorBody)))]
async fn drain_node(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::Node>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::DrainNode { name, reply }).await??))
}

/// Put a drained node back into service (admin).
#[utoipa::path(post, path = "/v1/nodes/{name}/undrain", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::Node), (status = 404, description = "No such node", body = api::ErrorBody),
        (status = 409, description = "The node is not drained", body = api::ErrorBody)))]
async fn undrain_node(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::Node>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::UndrainNode { name, reply }).await??))
}

/// Remove a node (admin): its credential is revoked at once and its live
/// attempts are requeued as lost. It may join again with the join token.
#[utoipa::path(delete, path = "/v1/nodes/{name}", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::NodeRemoved), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn remove_node(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::NodeRemoved>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::RemoveNode { name, reply }).await??))
}

/// Replace the agents' join token (admin): the new one is written to the
/// server's `join.token` and returned once; the old one is refused from
/// now. Nodes that joined keep their own credentials.
#[utoipa::path(post, path = "/v1/agent/join-token", tag = "operator",
    responses((status = 200, body = api::JoinToken), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody)))]
async fn rotate_join_token(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<api::JoinToken>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::RotateJoinToken { reply }).await??))
}

/// Give a tenant a new token and revoke every older one (admin). The new
/// token is shown once.
#[utoipa::path(post, path = "/v1/tenants/{name}/tokens", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantTokens), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn rotate_tenant_token(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::TenantTokens>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::TenantTokens { name, issue: true, reply }).await??))
}

/// Revoke every token of a tenant (admin): refused from now.
#[utoipa::path(delete, path = "/v1/tenants/{name}/tokens", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantTokens), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn revoke_tenant_tokens(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::TenantTokens>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::TenantTokens { name, issue: false, reply }).await??))
}

/// Take back N GPUs of preemptible capacity with the drain window (admin).
#[utoipa::path(post, path = "/v1/reclaim", tag = "operator", request_body = api::ReclaimRequest,
    responses((status = 200, body = api::ReclaimReply), (status = 409, description = "No node has joined yet", body = api::ErrorBody),
        (status = 422, description = "An unknown GPU model, or none named when nodes have several", body = api::ErrorBody)))]
async fn reclaim(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::ReclaimReply>> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReclaimRequest = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::Reclaim { req, reply }).await??))
}

/// Lift a reclaim (admin): preemptible work may use any idle GPU of the
/// model again.
#[utoipa::path(post, path = "/v1/reclaim/release", tag = "operator", request_body = api::ReclaimRelease,
    responses((status = 200, body = api::ReclaimReleased), (status = 409, description = "No node has joined yet", body = api::ErrorBody),
        (status = 422, description = "An unknown GPU model, or none named when nodes have several", body = api::ErrorBody)))]
async fn release_reclaim(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::ReclaimReleased>> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReclaimRelease = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::ReleaseReclaim { req, reply }).await??))
}

/// Create a tenant and its first token (admin). The token is shown once.
#[utoipa::path(post, path = "/v1/tenants", tag = "operator", request_body = api::TenantRequest,
    responses((status = 201, body = api::TenantCreated), (status = 409, description = "The tenant exists", body = api::ErrorBody)))]
async fn create_tenant(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::TenantCreated>)> {
    app.require(&headers, Scope::Admin)?;
    let req: api::TenantRequest = parse(&body)?;
    let created = app.ask(|reply| Msg::CreateTenant { name: req.name, reply }).await??;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Every tenant, by name, with its working tokens, what it holds and its
/// reservations not yet ended (admin).
#[utoipa::path(get, path = "/v1/tenants", tag = "operator",
    responses((status = 200, body = [api::TenantSummary])))]
async fn list_tenants(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<api::TenantSummary>>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::Tenants { reply }).await?))
}

/// A tenant's limits in force and what it holds against them (an admin,
/// or the tenant itself).
#[utoipa::path(get, path = "/v1/tenants/{name}/limits", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantUsage), (status = 404, body = api::ErrorBody)))]
async fn get_tenant_limits(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Json<api::TenantUsage>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::TenantLimits { principal, tenant, set: None, reply }).await??))
}

/// A tenant's registry logins: the registries and user names (never the
/// passwords). The tenant itself or an operator.
#[utoipa::path(get, path = "/v1/tenants/{name}/registry-logins", tag = "tenants", params(("name" = String, Path)),
    responses((status = 200, body = Vec<api::RegistryLoginInfo>), (status = 404, body = api::ErrorBody)))]
async fn list_registry_logins(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Json<Vec<api::RegistryLoginInfo>>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::RegistryLogins { principal, tenant, set: None, reply }).await??))
}

/// Give the login a tenant's image pulls from `registry` (`HOST[:PORT]`)
/// use; it replaces the one before. The tenant itself or an operator.
#[utoipa::path(put, path = "/v1/tenants/{name}/registry-logins/{registry}", tag = "tenants",
    params(("name" = String, Path), ("registry" = String, Path)), request_body = api::RegistryLogin,
    responses((status = 200, body = Vec<api::RegistryLoginInfo>), (status = 404, body = api::ErrorBody),
        (status = 422, description = "Not a registry host, or an empty user name or password", body = api::ErrorBody)))]
async fn set_registry_login(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath((tenant, registry)): ApiPath<(String, String)>,
    Body(body): Body,
) -> ApiResult<Json<Vec<api::RegistryLoginInfo>>> {
    let principal = app.tenant(&headers)?;
    let login: api::RegistryLogin = parse(&body)?;
    let set = Some((registry, Some(login)));
    Ok(Json(app.ask(|reply| Msg::RegistryLogins { principal, tenant, set, reply }).await??))
}

/// Remove a tenant's login for `registry`.
#[utoipa::path(delete, path = "/v1/tenants/{name}/registry-logins/{registry}", tag = "tenants",
    params(("name" = String, Path), ("registry" = String, Path)),
    responses((status = 200, body = Vec<api::RegistryLoginInfo>), (status = 404, body = api::ErrorBody),
        (status = 422, body = api::ErrorBody)))]
async fn delete_registry_login(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath((tenant, registry)): ApiPath<(String, String)>,
) -> ApiResult<Json<Vec<api::RegistryLoginInfo>>> {
    let principal = app.tenant(&headers)?;
    let set = Some((registry, None));
    Ok(Json(app.ask(|reply| Msg::RegistryLogins { principal, tenant, set, reply }).await??))
}

/// Set a tenant's own limits (admin); an absent one is the server's default.
#[utoipa::path(put, path = "/v1/tenants/{name}/limits", tag = "operator", params(("name" = String, Path)),
    request_body = api::TenantLimits,
    responses((status = 200, body = api::TenantUsage), (status = 404, body = api::ErrorBody),
        (status = 422, description = "A limit of 0", body = api::ErrorBody)))]
async fn set_tenant_limits(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(tenant): ApiPath<String>,
    Body(body): Body,
) -> ApiResult<Json<api::TenantUsage>> {
    let principal = app.require(&headers, Scope::Admin)?;
    let set: api::TenantLimits = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::TenantLimits { principal, tenant, set: Some(set), reply }).await??))
}

/// The price book: per GPU model, on-demand, preemptible (the fixed
/// discount off on-demand) and reserved prices per GPU-hour.
#[utoipa::path(get, path = "/v1/prices", tag = "billing", responses((status = 200, body = api::PriceBook)))]
async fn list_prices(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<api::PriceBook>> {
    app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Prices { reply }).await?))
}

/// Set a GPU model's prices (admin). Attempts already running keep the
/// rate they started with.
#[utoipa::path(put, path = "/v1/prices/{model}", tag = "billing", params(("model" = String, Path)), request_body = api::PriceUpdate,
    responses((status = 200, body = api::Price),
        (status = 422, description = "An unknown GPU model, or a price the preemptible discount cannot take to a whole micro-dollar", body = api::ErrorBody)))]
async fn set_price(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(model): ApiPath<String>,
    Body(body): Body,
) -> ApiResult<Json<api::Price>> {
    app.require(&headers, Scope::Admin)?;
    let update: api::PriceUpdate = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::SetPrice { model, update, reply }).await??))
}

/// Reserve GPUs of a model for a tenant over a period (admin).
#[utoipa::path(post, path = "/v1/reservations", tag = "billing", request_body = api::ReservationRequest,
    responses((status = 201, body = api::Reservation),
        (status = 409, description = "The period overlaps the tenant's other reservation, or the model's GPUs are already reserved", body = api::ErrorBody),
        (status = 422, description = "An unknown tenant or GPU model, more GPUs than the model has, an end not after the start, a rate the discount cannot take", body = api::ErrorBody)))]
async fn create_reservation(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::Reservation>)> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReservationRequest = parse(&body)?;
    let created = app.ask(|reply| Msg::CreateReservation { req, reply }).await??;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Reservations: a tenant's own, or every one for an admin.
#[utoipa::path(get, path = "/v1/reservations", tag = "billing", responses((status = 200, body = [api::Reservation])))]
async fn list_reservations(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<api::Reservation>>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Reservations { principal, reply }).await?))
}

/// Delete a reservation (admin); refused while its reserved jobs run.
#[utoipa::path(delete, path = "/v1/reservations/{id}", tag = "billing", params(("id" = u64, Path)),
    responses((status = 200, body = api::Reservation), (status = 404, description = "No such reservation", body = api::ErrorBody),
        (status = 409, description = "Its reserved jobs are running", body = api::ErrorBody)))]
async fn delete_reservation(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::Reservation>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::DeleteReservation { id, reply }).await??))
}

#[derive(Deserialize)]
struct PeriodQuery {
    from: String,
    to: String,
    #[serde(default)]
    tenant: Option<String>,
}

/// An invoice for `[from, to)`: the caller's tenant, or `tenant` for an admin.
#[utoipa::path(get, path = "/v1/bill", tag = "billing",
    params(("from" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)"),
        ("to" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)"),
        ("tenant" = Option<String>, Query, description = "The tenant to bill (an admin's token; a tenant may name only itself)")),
    responses((status = 200, body = api::Invoice),
        (status = 422, description = "From not before to, an unknown tenant, or no tenant named with an admin token", body = api::ErrorBody)))]
async fn bill(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<PeriodQuery>,
) -> ApiResult<Json<api::Invoice>> {
    let principal = app.tenant(&headers)?;
    let PeriodQuery { from, to, tenant } = q;
    Ok(Json(app.ask(|reply| Msg::Bill { principal, tenant, from, to, reply }).await??))
}

/// Utilisation and revenue by tier over `[from, to)` (admin).
#[utoipa::path(get, path = "/v1/report", tag = "billing",
    params(("from" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)"),
        ("to" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)")),
    responses((status = 200, body = api::OperatorReport), (status = 422, description = "From not before to", body = api::ErrorBody)))]
async fn operator_report(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<PeriodQuery>,
) -> ApiResult<Json<api::OperatorReport>> {
    app.require(&headers, Scope::Admin)?;
    let PeriodQuery { from, to, .. } = q;
    Ok(Json(app.ask(|reply| Msg::OperatorReport { from, to, reply }).await??))
}

#[derive(Deserialize)]
struct SeriesQuery {
    from: String,
    to: String,
    step: String,
}

/// The operator's report over `[from, to)` in buckets of `step` (admin):
/// per bucket, capacity, use and utilisation by tier, and revenue by tier
/// and from reservations. The buckets add up to `/v1/report`'s figures.
#[utoipa::path(get, path = "/v1/report/series", tag = "billing",
    params(("from" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)"),
        ("to" = String, Query, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$", description = "RFC 3339 (2026-12-01T08:00:00Z) or a date (2026-12-01, midnight UTC)"),
        ("step" = String, Query, pattern = r"^[0-9]{1,6}(s|m|h|d)$", description = "The buckets' length (15m, 1h, 1d): at least a minute, and at most 1,000 buckets in the period")),
    responses((status = 200, body = api::ReportSeries),
        (status = 422, description = "From not before to, a step under a minute, or more than 1,000 buckets (the message says what fits)", body = api::ErrorBody)))]
async fn operator_report_series(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<SeriesQuery>,
) -> ApiResult<Json<api::ReportSeries>> {
    app.require(&headers, Scope::Admin)?;
    let SeriesQuery { from, to, step } = q;
    Ok(Json(app.ask(|reply| Msg::OperatorReportSeries { from, to, step, reply }).await??))
}

/// An agent joins (join token), or rejoins after a restart or a partition
/// saying what it runs.
#[utoipa::path(post, path = "/v1/agent/register", tag = "agent", request_body = api::Register,
    responses((status = 200, body = api::Registered),
        (status = 409, description = "The node cannot join as it says (another node's name with other GPUs)", body = api::ErrorBody),
        (status = 422, description = "A node the cluster cannot take (its model's nodes have another number of GPUs), or an unreported event stamped later than the server's clock plus the allowed skew", body = api::ErrorBody)))]
async fn agent_register(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::Registered>> {
    let principal = app.principal(&headers)?;
    if !matches!(principal.scope, Scope::Agent | Scope::Node) {
        return Err(ApiError::forbidden("registering needs the join token or the node's credential"));
    }
    let reg: api::Register = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::Register { principal, reg, reply }).await??))
}

#[derive(Deserialize)]
struct PollQuery {
    node: String,
    epoch: u64,
    after: u64,
    /// The agent's reports have not got through for a while: why.
    #[serde(default)]
    failing: Option<String>,
}

/// Long poll: commands after `after`, or an empty list once a heartbeat
/// interval has passed.
#[utoipa::path(get, path = "/v1/agent/commands", tag = "agent",
    params(("node" = String, Query), ("epoch" = u64, Query, description = "The server's epoch from registration"),
        ("after" = u64, Query, description = "The last command sequence number seen")),
    responses((status = 200, body = api::Commands),
        (status = 409, description = "The node is not registered, or the server restarted: register again", body = api::ErrorBody)))]
async fn agent_commands(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<PollQuery>,
) -> ApiResult<Json<CommandsOut>> {
    app.node(&headers, &q.node)?;
    let deadline = poll_deadline(app.poll_wait);
    // What the poll says of the node's health counts once, when it comes:
    // a report that got through meanwhile is newer news.
    let mut health = Some(q.failing.clone());
    // A quiet node (idle, healthy, nothing waiting) is answered without
    // the writer; anything else, or a wake, goes to it.
    let quiet = match (&q.failing, app.role.lines()) {
        (None, Some(lines)) => lines.poll(&q.node, q.epoch, q.after, crate::engine::now_ms()),
        _ => None,
    };
    if let Some(mut poll) = quiet {
        match tokio::time::timeout_at(deadline, poll.changed.changed()).await {
            Ok(Ok(())) => health = None,
            _ => return Ok(Json(CommandsOut { commands: Vec::new(), next_seq: poll.next_seq })),
        }
    }
    loop {
        let node = q.node.clone();
        let health = health.take();
        let mut poll =
            app.ask(|reply| Msg::Poll { node, epoch: q.epoch, after: q.after, health, reply }).await??;
        if !poll.commands.is_empty() {
            return Ok(Json(CommandsOut { commands: poll.commands, next_seq: poll.next_seq }));
        }
        // Subscribed while the poll was handled: any later push wakes us.
        match tokio::time::timeout_at(deadline, poll.changed.changed()).await {
            Ok(Ok(())) => continue,
            _ => return Ok(Json(CommandsOut { commands: Vec::new(), next_seq: poll.next_seq })),
        }
    }
}

/// [`api::Commands`] as a poll answers it: the commands shared with the
/// node's stream, written out as they are.
#[derive(Serialize)]
struct CommandsOut {
    #[serde(serialize_with = "shared_commands")]
    commands: Vec<Arc<api::Command>>,
    next_seq: u64,
}

fn shared_commands<S: serde::Serializer>(commands: &[Arc<api::Command>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(commands.iter().map(|c| &**c))
}

/// When an empty poll is answered: a heartbeat interval from now, brought
/// back to a tick of a shared grid (a quarter of the interval, at most
/// 250 ms). Polls that come at scattered moments then end together, and
/// their agents ask again together: an idle fleet wakes the server a few
/// times a second instead of at every poll's own instant.
fn poll_deadline(wait: Duration) -> tokio::time::Instant {
    static ORIGIN: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(tokio::time::Instant::now);
    let grid = (wait / 4).clamp(Duration::from_millis(1), Duration::from_millis(250));
    let due = (tokio::time::Instant::now() + wait).duration_since(origin);
    let ticks = due.as_nanos() / grid.as_nanos();
    origin + Duration::from_nanos((ticks * grid.as_nanos()) as u64)
}

/// What happened on the node: starts, checkpoints, output, exits.
#[utoipa::path(post, path = "/v1/agent/report", tag = "agent", request_body = api::Report,
    responses((status = 200, body = api::ReportReply),
        (status = 409, description = "The node is not registered", body = api::ErrorBody),
        (status = 422, description = "An event stamped later than the server's clock plus the allowed skew: nothing of the report was applied", body = api::ErrorBody)))]
async fn agent_report(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::ReportReply>> {
    let principal = app.principal(&headers)?;
    if !matches!(principal.scope, Scope::Agent | Scope::Node) {
        return Err(ApiError::forbidden("this call needs a node's credential"));
    }
    let report: api::Report = parse(&body)?;
    app.node(&headers, &report.node)?;
    Ok(Json(app.ask(|reply| Msg::Report { report, reply }).await??))
}

/// The CA that signed this server's certificate, PEM: an agent joining
/// with `--ca-fingerprint` fetches it without verifying the connection,
/// then trusts it only if its SHA-256 is the fingerprint it was given. No
/// token: it is public, and the agent has none it may send yet.
#[utoipa::path(get, path = "/v1/tls/ca.crt", tag = "agent", security(()),
    responses(
        (status = 200, description = "The CA certificate, PEM", content_type = "application/x-pem-file", body = String),
        (status = 404, description = "The server serves plain HTTP, or was given a certificate without its CA", body = api::ErrorBody)))]
async fn tls_ca(State(app): State<App>) -> ApiResult<Response> {
    match &app.tls_ca {
        Some(pem) => Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem.to_string()).into_response()),
        None => Err(ApiError::not_found(
            "this server has no CA to hand out: it serves plain HTTP, or HTTPS with --tls-cert and no ca.crt in its data dir"
                .into(),
        )),
    }
}

async fn openapi() -> Json<serde_json::Value> {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    Json(DOCUMENT.get_or_init(document).clone())
}

/// The OpenAPI document: the operations as annotated, plus what holds for
/// all of them, so that no answer the server gives goes undescribed.
fn document() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    state_unsigned_ranges(&mut doc);
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        for operation in
            paths.values_mut().filter_map(|item| item.as_object_mut()).flat_map(|item| item.values_mut())
        {
            add_common_errors(operation);
        }
    }
    doc
}

/// Every unsigned integer states its range: a value outside it does not
/// parse, and is refused with a 400.
fn state_unsigned_ranges(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            // utoipa spells these `u-int32` and so on.
            let unsigned = match map.get("format").and_then(|f| f.as_str()) {
                Some("uint8" | "u-int8") => Some(("uint8", u64::from(u8::MAX))),
                Some("uint16" | "u-int16") => Some(("uint16", u64::from(u16::MAX))),
                Some("uint32" | "u-int32") => Some(("uint32", u64::from(u32::MAX))),
                Some("uint64" | "u-int64") => Some(("uint64", u64::MAX)),
                _ => None,
            };
            if let Some((format, max)) = unsigned {
                map.insert("format".into(), format.into());
                map.entry("minimum").or_insert(0.into());
                map.entry("maximum").or_insert(max.into());
            }
            map.values_mut().for_each(state_unsigned_ranges);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(state_unsigned_ranges),
        _ => {}
    }
}

/// The refusals every operation can give: each a JSON `ErrorBody`.
fn add_common_errors(operation: &mut serde_json::Value) {
    let takes_input =
        operation.get("parameters").is_some_and(|p| p.as_array().is_some_and(|p| !p.is_empty()));
    let takes_body = operation.get("requestBody").is_some();
    // Open to anyone (`security: [{}]`): no token is looked at.
    let open = operation.get("security").is_some_and(|s| *s == serde_json::json!([{}]));
    let Some(responses) = operation.get_mut("responses").and_then(|r| r.as_object_mut()) else { return };
    let error = |description: &str| {
        serde_json::json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        })
    };
    if takes_input || takes_body {
        responses.entry("400").or_insert_with(|| {
            error("A malformed request: a parameter or body that does not match this document (the message names the field)")
        });
    }
    if takes_body {
        responses.entry("413").or_insert_with(|| error(&format!("The body is over the {BODY_LIMIT} limit")));
    }
    if open {
        return;
    }
    responses.entry("401").or_insert_with(|| {
        error("No bearer token, a malformed Authorization header, or an unknown or revoked token")
    });
    responses
        .entry("403")
        .or_insert_with(|| error("The token may not make this call (an admin-only call, or an agent's)"));
}

/// Server-sent events, one each time a batch that changed jobs, nodes or
/// money commits (`data: {"seq": N}`; the first says where the count
/// stands), for a page to read again what it shows; a comment every 15 s
/// keeps the connection open. The events carry no data: what is read
/// again is what the token may see. Read with `fetch` (an `EventSource`
/// cannot send the token).
async fn stream(State(app): State<App>, headers: HeaderMap) -> ApiResult<Response> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let principal = app.tenant(&headers)?;
    let slot = StreamSlot::take(&app, &principal)?;
    let changes = app.feed.subscribe();
    let events =
        futures_util::stream::unfold((changes, true, slot), |(mut changes, first, slot)| async move {
            if !first && changes.changed().await.is_err() {
                return None;
            }
            let seq = *changes.borrow_and_update();
            let event = Event::default().data(format!("{{\"seq\":{seq}}}"));
            Some((Ok::<_, std::convert::Infallible>(event), (changes, false, slot)))
        });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
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

/// `/metrics` publishes revenue by tier, which `/v1/report` keeps to
/// operators: it takes an operator's token or the scrape token of
/// `--metrics-token-file` (Prometheus' `authorization` with a
/// `credentials_file`).
async fn metrics(State(app): State<App>, headers: HeaderMap) -> ApiResult<Response> {
    let scraper = app.metrics_token.as_deref().is_some_and(|hash| {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(hash_token);
        given.is_some_and(|given| {
            given.len() == hash.len()
                && given.bytes().zip(hash.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        })
    });
    if !scraper {
        app.require(&headers, Scope::Admin).map_err(|e| match e.status {
            403 => ApiError::forbidden(
                "/metrics needs an operator's token or the scrape token (ebb server --metrics-token-file)",
            ),
            _ => e,
        })?;
    }
    let snapshot = app.ask(|reply| Msg::Metrics { reply }).await?;
    let text = crate::metrics::render(&snapshot);
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response())
}

/// A panic anywhere in the server ends the process: the writer's state may
/// be ahead of the store, and a server that answers 500 for ever serves no
/// one. A supervisor (systemd, `ebb up`) restarts it from the last commit.
fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!(
            "panic: {info}; exiting so that a supervisor restarts the server from its last commit"
        );
        eprintln!("ebb server: panic; exiting (status 70) to restart from the last commit");
        std::process::exit(70);
    }));
}

/// The data dir holds tenants' environments, output and the tokens: only
/// the server's user may read it. Files made before this rule are fixed.
fn private_data_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| format!("--data-dir {}: {e}", dir.display()))?;
    let chmod = |path: &std::path::Path, mode: u32| -> Result<(), String> {
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {e}", path.display())),
            _ => Ok(()),
        }
    };
    chmod(dir, 0o700)?;
    chmod(&dir.join("logs"), 0o700)?;
    for name in ["ebb.db", "ebb.db-wal", "ebb.db-shm", "admin.token", "join.token"] {
        chmod(&dir.join(name), 0o600)?;
    }
    for entry in std::fs::read_dir(dir.join("logs")).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        chmod(&entry.path(), 0o600)?;
    }
    Ok(())
}

/// Starts the writer thread: it opens the store (on its own thread, as a
/// blocking database client must not run on the async runtime), restores
/// the engine from it, and then takes messages. Returns the files the
/// engine created, once it is ready.
fn start_writer<S: Store + 'static>(
    open: impl FnOnce() -> Result<S, crate::store::StoreError> + Send + 'static,
    config: EngineConfig,
    tokens: TokenMap,
    feed: crate::engine::Feed,
    rx: mpsc::Receiver<Msg>,
) -> Result<(Vec<String>, Arc<crate::engine::Lines>), String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ebb-writer".into())
        .spawn(move || {
            let opened = open().map_err(|e| e.to_string()).and_then(|store| {
                Engine::open(store, config, tokens, crate::engine::now_ms()).map_err(|e| e.message)
            });
            match opened {
                Ok((mut engine, created)) => {
                    engine.feed(feed);
                    let _ = ready_tx.send(Ok((created, engine.lines())));
                    if let Some(e) = engine.run(rx) {
                        // Serve no state the store does not have.
                        tracing::error!("{e}; stopping");
                        std::process::exit(70);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("cannot start the writer thread: {e}"))?;
    ready_rx.recv().map_err(|_| "the writer thread ended before it was ready".to_string())?
}

pub async fn serve(config: ServerConfig) -> Result<(), String> {
    exit_on_panic();
    let dir = &config.data_dir;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    // Before anything in the directory is touched; held until the process ends.
    let _owner = crate::lock::lock_dir(dir, "ebb server")?;
    private_data_dir(dir)?;
    let tls = crate::tls::ServerTls::prepare(&config.tls, dir, config.listen)?;
    for path in tls.iter().flat_map(|t| &t.written) {
        eprintln!("ebb server: wrote {}", path.display());
    }
    if config.database.is_some() && tls.as_ref().is_some_and(|t| t.ca.is_none()) {
        return Err(format!(
            "--tls-cert with --database: put the CA that signed the servers' certificates in {}; \
             a server verifies the leader's certificate with it when it forwards a request",
            dir.join(crate::tls::CA_CERT).display()
        ));
    }
    // A personal cluster (`ebb up`) runs every job as its own user: no news.
    let own_user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name);
    for (user, tenants) in
        config.run_as.shared().into_iter().filter(|(user, _)| Some(user) != own_user.as_ref())
    {
        let who = match tenants.iter().any(|t| t == "*") {
            true => "every tenant --run-as does not name".to_string(),
            false => format!("tenants {}", tenants.join(", ")),
        };
        tracing::warn!(
            user,
            "{who} run as one Unix user, {user}: their jobs can read each other's processes, \
             environments, checkpoints and notices on a shared node"
        );
    }
    let tokens = Arc::new(RwLock::new(HashMap::new()));
    let engine_config = EngineConfig {
        data_dir: dir.clone(),
        drain_window: config.drain_window,
        min_runtime: config.min_runtime,
        heartbeat_timeout: config.heartbeat_timeout,
        heartbeat_interval: config.heartbeat_interval,
        keep_finished: config.keep_finished,
        max_clock_skew: config.max_clock_skew,
        gang_exit_grace: config.gang_exit_grace,
        pricing: config.pricing.clone(),
        limits: config.limits.clone(),
        run_as: config.run_as.clone(),
        checkpoint_store: config.checkpoint_store.clone(),
        images: config.images.clone(),
    };
    // Bound first: a server on one database with others says where it
    // answers, and `--listen 127.0.0.1:0` picks its port here.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
    let role = Arc::new(Role::default());
    let feed: crate::engine::Feed = Arc::new(tokio::sync::watch::Sender::new(0));
    let created = match &config.database {
        None => {
            let (tx, rx) = mpsc::channel(1 << 16);
            let path = dir.join("ebb.db");
            let (created, lines) = start_writer(
                move || SqliteStore::open(&path),
                engine_config,
                tokens.clone(),
                feed.clone(),
                rx,
            )?;
            role.lead(0, &url, tx, lines);
            created
        }
        Some(database) => {
            let advertise = match &config.advertise {
                Some(advertise) => advertise.trim_end_matches('/').to_string(),
                None if addr.ip().is_unspecified() => {
                    return Err(format!(
                        "--advertise: with --database, say where the other servers reach this one \
                         (--listen {addr} is every address)"
                    ))
                }
                None => url.clone(),
            };
            let lease = LeaseConfig { database: database.clone(), url: advertise, lease: config.lease };
            let role = role.clone();
            let (tokens, feed) = (tokens.clone(), feed.clone());
            tokio::task::spawn_blocking(move || {
                crate::leader::start(lease, engine_config, tokens, role, feed)
            })
            .await
            .map_err(|e| e.to_string())??
        }
    };
    for path in created {
        tracing::info!("created {path} (mode 0600)");
        eprintln!("ebb server: wrote {path}");
    }
    let ticks = role.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        loop {
            every.tick().await;
            if let Some(writer) = ticks.writer() {
                let _ = writer.send(Msg::Tick).await;
            }
        }
    });
    let proxy = Proxy::new(role.clone(), tls.as_ref().and_then(|t| t.ca.as_ref()).map(|ca| ca.pem.as_str()))?;
    let app = App {
        role: role.clone(),
        feed,
        tokens,
        poll_wait: Duration::from_millis(config.heartbeat_interval.as_millis()),
        tls_ca: tls.as_ref().and_then(|t| t.ca.as_ref()).map(|ca| Arc::from(ca.pem.as_str())),
        streams: Arc::default(),
        metrics_token: config.metrics_token.as_deref().map(|t| Arc::from(hash_token(t).as_str())),
        registries: config.registries.clone(),
    };
    let router = Router::new()
        .route("/healthz", get(crate::leader::healthz).with_state(role))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/jobs", post(submit).get(list_jobs))
        .route("/v1/jobs/batch", post(submit_batch))
        .route("/v1/jobs/{id}", get(show_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/v1/jobs/{id}/drill", post(drill_job))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/nodes/{name}", delete(remove_node))
        .route("/v1/nodes/{name}/drain", post(drain_node))
        .route("/v1/nodes/{name}/undrain", post(undrain_node))
        .route("/v1/reclaim", post(reclaim))
        .route("/v1/reclaim/release", post(release_reclaim))
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{name}/limits", get(get_tenant_limits).put(set_tenant_limits))
        .route("/v1/tenants/{name}/registry-logins", get(list_registry_logins))
        .route(
            "/v1/tenants/{name}/registry-logins/{registry}",
            axum::routing::put(set_registry_login).delete(delete_registry_login),
        )
        .route("/v1/tenants/{name}/tokens", post(rotate_tenant_token).delete(revoke_tenant_tokens))
        .route("/v1/prices", get(list_prices))
        .route("/v1/prices/{model}", put(set_price))
        .route("/v1/reservations", post(create_reservation).get(list_reservations))
        .route("/v1/reservations/{id}", delete(delete_reservation))
        .route("/v1/bill", get(bill))
        .route("/v1/report", get(operator_report))
        .route("/v1/report/series", get(operator_report_series))
        .route("/v1/agent/join-token", post(rotate_join_token))
        .route("/v1/agent/register", post(agent_register))
        .route("/v1/agent/commands", get(agent_commands))
        .route("/v1/agent/report", post(agent_report))
        .route("/v1/tls/ca.crt", get(tls_ca))
        .route("/v1/stream", get(stream))
        .route("/", get(crate::web::index))
        .route("/assets/{name}", get(crate::web::asset))
        .layer(DefaultBodyLimit::max(api::MAX_REQUEST_BYTES))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(proxy, crate::leader::forward));
    std::fs::write(dir.join("server.url"), format!("{url}\n")).map_err(|e| e.to_string())?;
    tracing::info!(%url, data_dir = %dir.display(), "ebb server listening");
    eprintln!("ebb server: listening on {url}");
    for line in tls.iter().flat_map(|t| t.join_hint(dir)) {
        eprintln!("ebb server: {line}");
    }
    crate::tls::serve(listener, router, tls.as_ref(), config.connections, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_documents_its_refusals_as_error_bodies() {
        let doc = document();
        let error_body = serde_json::json!({"$ref": "#/components/schemas/ErrorBody"});
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                operations += 1;
                let responses = op["responses"].as_object().unwrap();
                let open = op["security"] == serde_json::json!([{}]);
                for code in ["401", "403"] {
                    assert_eq!(responses.contains_key(code), !open, "{method} {path}: {code}");
                }
                if op.get("requestBody").is_some() {
                    assert!(
                        responses.contains_key("400") && responses.contains_key("413"),
                        "{method} {path}"
                    );
                }
                for (code, response) in responses {
                    if code.starts_with('4') {
                        let schema = &response["content"]["application/json"]["schema"];
                        assert_eq!(*schema, error_body, "{method} {path} {code}");
                    }
                }
            }
        }
        // Every route `serve` routes under /v1: a new one needs its
        // `#[utoipa::path]` and a place in `ApiDoc`'s paths.
        assert_eq!(operations, 35, "routes documented");
    }

    #[test]
    fn a_whole_number_written_with_a_fraction_is_that_integer() {
        let body = |text: &str| Bytes::from(text.to_string());
        let spec: api::JobSubmission = parse(&body(r#"{"argv": ["x"], "gpus": 2.0}"#)).unwrap();
        assert_eq!(spec.gpus, Some(2));
        let err = parse::<api::JobSubmission>(&body(r#"{"argv": ["x"], "gpus": 2.5}"#)).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.starts_with("gpus: "), "{}", err.message);
        let err = parse::<api::JobSubmission>(&body(r#"{"argv": ["x"], "gpus": -1.0}"#)).unwrap_err();
        assert!(err.message.starts_with("gpus: "), "{}", err.message);
        // Exactly, even where a quick parse of the decimal is off by one ulp.
        let limits: api::TenantLimits = parse(&body(r#"{"max_jobs": 3826017507836854.0}"#)).unwrap();
        assert_eq!(limits.max_jobs, Some(3826017507836854));
        let err = parse::<api::TenantLimits>(&body("[null, null]")).unwrap_err();
        assert_eq!(err.message, "body: expected a JSON object");
    }

    /// A job's events are a union on `kind`: each kind names the schema
    /// of its detail, and every schema named is in the document.
    #[test]
    fn every_event_kind_is_documented_with_its_detail() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        let text = serde_json::to_string(&schemas["Event"]).unwrap();
        for kind in api::EventKind::ALL {
            assert!(text.contains(&format!("\"{}\"", kind.as_str())), "{kind} not in {text}");
        }
        let whole = doc.to_string();
        for reference in whole.split("\"#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(schemas.get(name).is_some(), "{name} is referred to and not described");
        }
        for detail in ["PlacedDetail", "DrainNoticeDetail", "DrillDetail", "RequeuedDetail"] {
            assert!(schemas.get(detail).is_some(), "{detail} not described");
        }
    }

    #[test]
    fn the_agent_protocol_is_documented_under_its_own_tag() {
        let doc = document();
        for (path, method) in
            [("/v1/agent/register", "post"), ("/v1/agent/commands", "get"), ("/v1/agent/report", "post")]
        {
            assert_eq!(doc["paths"][path][method]["tags"], serde_json::json!(["agent"]), "{path}");
        }
    }

    #[test]
    fn unsigned_integers_and_limits_state_their_ranges() {
        let doc = document();
        let job = &doc["components"]["schemas"]["JobSubmission"]["properties"];
        assert_eq!((job["gpus"]["minimum"].as_u64(), job["gpus"]["maximum"].as_u64()), (Some(1), Some(4096)));
        assert_eq!(u64::from(crate::validate::MAX_GPUS), job["gpus"]["maximum"].as_u64().unwrap());
        assert_eq!(job["max_retries"]["maximum"].as_u64(), Some(u64::from(u32::MAX)));
        assert_eq!(job["argv"]["minItems"].as_u64(), Some(1));
        // validate::array_pattern_allows implements this pattern.
        assert_eq!(job["array"]["pattern"].as_str(), Some(r"^0*[0-9]{1,19}(-0*[0-9]{1,19})?$"));
        let reservation = &doc["components"]["schemas"]["ReservationRequest"]["properties"];
        assert_eq!(reservation["start"]["pattern"].as_str(), Some(ebb_api::TIME_PATTERN));
        assert_eq!(reservation["rate_usd"]["pattern"].as_str(), Some(ebb_api::USD_PATTERN));
        let price = &doc["components"]["schemas"]["PriceUpdate"]["properties"];
        assert_eq!(price["on_demand_usd"]["pattern"].as_str(), Some(ebb_api::USD_PATTERN));
        let logs = &doc["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"];
        let id = logs.as_array().unwrap().iter().find(|p| p["name"] == "id").unwrap();
        assert_eq!(
            (id["schema"]["format"].as_str(), id["schema"]["maximum"].as_u64()),
            (Some("uint64"), Some(u64::MAX))
        );
        let bill = doc["paths"]["/v1/bill"]["get"]["parameters"].as_array().unwrap().clone();
        let from = bill.iter().find(|p| p["name"] == "from").unwrap();
        assert_eq!(from["schema"]["pattern"].as_str(), Some(ebb_api::TIME_PATTERN));
        let series = doc["paths"]["/v1/report/series"]["get"]["parameters"].as_array().unwrap().clone();
        let step = series.iter().find(|p| p["name"] == "step").unwrap();
        assert_eq!(step["schema"]["pattern"].as_str(), Some(ebb_api::STEP_PATTERN));
    }
}
