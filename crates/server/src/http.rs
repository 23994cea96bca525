//! The REST API: routes, authentication, errors, the OpenAPI document.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use ebb_api as api;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};
use utoipa::OpenApi;

use crate::engine::{Engine, EngineConfig, Msg};
use crate::store::{Scope, SqliteStore};
use crate::{hash_token, ApiError, Principal, ServerConfig, TokenMap, TokenState};

#[derive(Clone)]
struct App {
    tx: mpsc::Sender<Msg>,
    tokens: TokenMap,
    poll_wait: Duration,
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

    /// Sends a message to the writer and waits for its reply.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> ApiResult<T> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| ApiError::internal("the server is stopping".into()))?;
        rx.await.map_err(|_| ApiError::internal("the request was not committed".into()))
    }
}

/// Parses a JSON body, naming the field that was wrong.
fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::bad_request(format!("body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Ebb", description = "Preemptible GPU compute with a drain window"),
    paths(submit, list_jobs, show_job, cancel_job, job_logs, list_nodes, drain_node, remove_node, reclaim,
        create_tenant, rotate_tenant_token, revoke_tenant_tokens, rotate_join_token, get_tenant_limits,
        set_tenant_limits, list_prices, set_price, create_reservation, list_reservations, delete_reservation, bill,
        operator_report),
    components(schemas(
        api::JobSubmission, api::Submitted, api::Job, api::JobEvent, api::NodeGpus, api::Node,
        api::ReclaimRequest, api::ReclaimReply, api::TenantRequest, api::TenantCreated, api::LogChunk,
        api::ErrorBody, api::SweepParam, api::Checkpoint, api::ArrayTask, api::ArrayProgress, api::TaskState,
        api::Price, api::PriceBook, api::PriceUpdate, api::ReservationRequest, api::Reservation, api::Usage,
        api::InvoiceLine, api::ReservationCharge, api::Invoice, api::TierReport, api::OperatorReport,
        api::NodeRemoved, api::JoinToken, api::TenantTokens
    )),
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
#[utoipa::path(post, path = "/v1/jobs", request_body = api::JobSubmission,
    responses((status = 201, body = api::Submitted), (status = 400, body = api::ErrorBody), (status = 401, body = api::ErrorBody)))]
async fn submit(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Submitted>)> {
    let principal = app.tenant(&headers)?;
    let spec: api::JobSubmission = parse(&body)?;
    let ids = app.ask(|reply| Msg::Submit { principal, spec, reply }).await??;
    let id = ids[0];
    let ids = if ids.len() > 1 { ids } else { Vec::new() };
    Ok((StatusCode::CREATED, Json(api::Submitted { id, ids })))
}

#[derive(Deserialize)]
struct JobsQuery {
    #[serde(default)]
    cursor: u64,
    #[serde(default)]
    limit: Option<usize>,
}

/// Jobs on one page unless asked for fewer.
const JOBS_PAGE: usize = 500;

/// The caller's jobs (an admin sees every tenant's), in id order, a page
/// at a time: `limit` (1-500, default 500) jobs with ids above `cursor`.
#[utoipa::path(get, path = "/v1/jobs",
    params(("cursor" = Option<u64>, Query, description = "the previous page's next_cursor"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 500)),
    responses((status = 200, body = api::JobPage), (status = 400, body = api::ErrorBody)))]
async fn list_jobs(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<JobsQuery>,
) -> ApiResult<Json<api::JobPage>> {
    let principal = app.tenant(&headers)?;
    let limit = q.limit.unwrap_or(JOBS_PAGE);
    if !(1..=JOBS_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit: must be between 1 and {JOBS_PAGE}, got {limit}")));
    }
    Ok(Json(app.ask(|reply| Msg::Jobs { principal, after: q.cursor, limit, reply }).await?))
}

/// One job with its event history.
#[utoipa::path(get, path = "/v1/jobs/{id}", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, body = api::ErrorBody)))]
async fn show_job(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Job { principal, id, reply }).await??))
}

/// Cancel a job: a queued job ends at once, a running one is stopped.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, body = api::ErrorBody)))]
async fn cancel_job(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Cancel { principal, id, reply }).await??))
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A job's output from `offset`; with `follow`, waits for more.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs",
    params(("id" = u64, Path), ("offset" = Option<u64>, Query), ("follow" = Option<bool>, Query), ("wait_ms" = Option<u64>, Query)),
    responses((status = 200, body = api::LogChunk), (status = 404, body = api::ErrorBody)))]
async fn job_logs(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<u64>,
    Query(q): Query<LogQuery>,
) -> ApiResult<Json<api::LogChunk>> {
    let principal = app.tenant(&headers)?;
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(20_000).min(60_000));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let p = principal.clone();
        let (path, finished) = app.ask(|reply| Msg::LogFile { principal: p, id, reply }).await??;
        let data = read_from(&path, q.offset).await;
        if !data.is_empty() || !q.follow || finished || tokio::time::Instant::now() >= deadline {
            let next_offset = q.offset + data.len() as u64;
            let data = String::from_utf8_lossy(&data).into_owned();
            // Finished only once everything has been read.
            let finished = finished && read_from(&path, next_offset).await.is_empty();
            return Ok(Json(api::LogChunk { offset: q.offset, next_offset, data, finished }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read_from(path: &std::path::Path, offset: u64) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut file) = tokio::fs::File::open(path).await else { return Vec::new() };
    if file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut data = Vec::new();
    let _ = file.take(1 << 20).read_to_end(&mut data).await;
    data
}

/// Nodes and their GPUs (admin).
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = [api::Node])))]
async fn list_nodes(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<Vec<api::Node>>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::Nodes { reply }).await?))
}

/// Drain a node for maintenance (admin): it takes no new work, its
/// preemptible jobs get the drain window, others finish.
#[utoipa::path(post, path = "/v1/nodes/{name}/drain", params(("name" = String, Path)),
    responses((status = 200, body = api::Node), (status = 404, body = api::ErrorBody)))]
async fn drain_node(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<api::Node>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::DrainNode { name, reply }).await??))
}

/// Remove a node (admin): its credential is revoked at once and its live
/// attempts are requeued as lost. It may join again with the join token.
#[utoipa::path(delete, path = "/v1/nodes/{name}", params(("name" = String, Path)),
    responses((status = 200, body = api::NodeRemoved), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn remove_node(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<api::NodeRemoved>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::RemoveNode { name, reply }).await??))
}

/// Replace the agents' join token (admin): the new one is written to the
/// server's `join.token` and returned once; the old one is refused from
/// now. Nodes that joined keep their own credentials.
#[utoipa::path(post, path = "/v1/agent/join-token",
    responses((status = 200, body = api::JoinToken), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody)))]
async fn rotate_join_token(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<api::JoinToken>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::RotateJoinToken { reply }).await??))
}

/// Give a tenant a new token and revoke every older one (admin). The new
/// token is shown once.
#[utoipa::path(post, path = "/v1/tenants/{name}/tokens", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantTokens), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn rotate_tenant_token(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<api::TenantTokens>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::TenantTokens { name, issue: true, reply }).await??))
}

/// Revoke every token of a tenant (admin): refused from now.
#[utoipa::path(delete, path = "/v1/tenants/{name}/tokens", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantTokens), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
async fn revoke_tenant_tokens(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<api::TenantTokens>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::TenantTokens { name, issue: false, reply }).await??))
}

/// Take back N GPUs of preemptible capacity with the drain window (admin).
#[utoipa::path(post, path = "/v1/reclaim", request_body = api::ReclaimRequest,
    responses((status = 200, body = api::ReclaimReply), (status = 400, body = api::ErrorBody)))]
async fn reclaim(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::ReclaimReply>> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReclaimRequest = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::Reclaim { req, reply }).await??))
}

/// Create a tenant and its first token (admin). The token is shown once.
#[utoipa::path(post, path = "/v1/tenants", request_body = api::TenantRequest,
    responses((status = 201, body = api::TenantCreated), (status = 409, body = api::ErrorBody)))]
async fn create_tenant(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::TenantCreated>)> {
    app.require(&headers, Scope::Admin)?;
    let req: api::TenantRequest = parse(&body)?;
    let created = app.ask(|reply| Msg::CreateTenant { name: req.name, reply }).await??;
    Ok((StatusCode::CREATED, Json(created)))
}

/// A tenant's limits in force and what it holds against them (an admin,
/// or the tenant itself).
#[utoipa::path(get, path = "/v1/tenants/{name}/limits", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantUsage), (status = 404, body = api::ErrorBody)))]
async fn get_tenant_limits(
    State(app): State<App>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
) -> ApiResult<Json<api::TenantUsage>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::TenantLimits { principal, tenant, set: None, reply }).await??))
}

/// Set a tenant's own limits (admin); an absent one is the server's default.
#[utoipa::path(put, path = "/v1/tenants/{name}/limits", params(("name" = String, Path)),
    request_body = api::TenantLimits,
    responses((status = 200, body = api::TenantUsage), (status = 400, body = api::ErrorBody),
        (status = 404, body = api::ErrorBody)))]
async fn set_tenant_limits(
    State(app): State<App>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::TenantUsage>> {
    let principal = app.require(&headers, Scope::Admin)?;
    let set: api::TenantLimits = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::TenantLimits { principal, tenant, set: Some(set), reply }).await??))
}

/// The price book: per GPU model, on-demand, preemptible (the fixed
/// discount off on-demand) and reserved prices per GPU-hour.
#[utoipa::path(get, path = "/v1/prices", responses((status = 200, body = api::PriceBook)))]
async fn list_prices(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<api::PriceBook>> {
    app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Prices { reply }).await?))
}

/// Set a GPU model's prices (admin). Attempts already running keep the
/// rate they started with.
#[utoipa::path(put, path = "/v1/prices/{model}", params(("model" = String, Path)), request_body = api::PriceUpdate,
    responses((status = 200, body = api::Price), (status = 400, body = api::ErrorBody)))]
async fn set_price(
    State(app): State<App>,
    headers: HeaderMap,
    Path(model): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Price>> {
    app.require(&headers, Scope::Admin)?;
    let update: api::PriceUpdate = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::SetPrice { model, update, reply }).await??))
}

/// Reserve GPUs of a model for a tenant over a period (admin).
#[utoipa::path(post, path = "/v1/reservations", request_body = api::ReservationRequest,
    responses((status = 201, body = api::Reservation), (status = 400, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
async fn create_reservation(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Reservation>)> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReservationRequest = parse(&body)?;
    let created = app.ask(|reply| Msg::CreateReservation { req, reply }).await??;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Reservations: a tenant's own, or every one for an admin.
#[utoipa::path(get, path = "/v1/reservations", responses((status = 200, body = [api::Reservation])))]
async fn list_reservations(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<api::Reservation>>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Reservations { principal, reply }).await?))
}

/// Delete a reservation (admin); refused while its reserved jobs run.
#[utoipa::path(delete, path = "/v1/reservations/{id}", params(("id" = u64, Path)),
    responses((status = 200, body = api::Reservation), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
async fn delete_reservation(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<u64>,
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
#[utoipa::path(get, path = "/v1/bill",
    params(("from" = String, Query), ("to" = String, Query), ("tenant" = Option<String>, Query)),
    responses((status = 200, body = api::Invoice), (status = 400, body = api::ErrorBody)))]
async fn bill(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PeriodQuery>,
) -> ApiResult<Json<api::Invoice>> {
    let principal = app.tenant(&headers)?;
    let PeriodQuery { from, to, tenant } = q;
    Ok(Json(app.ask(|reply| Msg::Bill { principal, tenant, from, to, reply }).await??))
}

/// Utilisation and revenue by tier over `[from, to)` (admin).
#[utoipa::path(get, path = "/v1/report", params(("from" = String, Query), ("to" = String, Query)),
    responses((status = 200, body = api::OperatorReport), (status = 400, body = api::ErrorBody)))]
async fn operator_report(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PeriodQuery>,
) -> ApiResult<Json<api::OperatorReport>> {
    app.require(&headers, Scope::Admin)?;
    let PeriodQuery { from, to, .. } = q;
    Ok(Json(app.ask(|reply| Msg::OperatorReport { from, to, reply }).await??))
}

async fn agent_register(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
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
async fn agent_commands(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PollQuery>,
) -> ApiResult<Json<api::Commands>> {
    app.node(&headers, &q.node)?;
    let deadline = tokio::time::Instant::now() + app.poll_wait;
    // What the poll says of the node's health counts once, when it comes:
    // a report that got through meanwhile is newer news.
    let mut health = Some(q.failing.clone());
    loop {
        let node = q.node.clone();
        let health = health.take();
        let mut poll =
            app.ask(|reply| Msg::Poll { node, epoch: q.epoch, after: q.after, health, reply }).await??;
        if !poll.commands.is_empty() {
            return Ok(Json(api::Commands { commands: poll.commands, next_seq: poll.next_seq }));
        }
        // Subscribed while the poll was handled: any later push wakes us.
        match tokio::time::timeout_at(deadline, poll.changed.changed()).await {
            Ok(Ok(())) => continue,
            _ => return Ok(Json(api::Commands { commands: Vec::new(), next_seq: poll.next_seq })),
        }
    }
}

async fn agent_report(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::ReportReply>> {
    let principal = app.principal(&headers)?;
    if !matches!(principal.scope, Scope::Agent | Scope::Node) {
        return Err(ApiError::forbidden("this call needs a node's credential"));
    }
    let report: api::Report = parse(&body)?;
    app.node(&headers, &report.node)?;
    Ok(Json(app.ask(|reply| Msg::Report { report, reply }).await??))
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

async fn metrics(State(app): State<App>) -> ApiResult<Response> {
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

pub async fn serve(config: ServerConfig) -> Result<(), String> {
    exit_on_panic();
    let dir = &config.data_dir;
    private_data_dir(dir)?;
    let store = SqliteStore::open(&dir.join("ebb.db")).map_err(|e| e.to_string())?;
    let tokens = Arc::new(RwLock::new(HashMap::new()));
    let engine_config = EngineConfig {
        data_dir: dir.clone(),
        drain_window: config.drain_window,
        heartbeat_timeout: config.heartbeat_timeout,
        heartbeat_interval: config.heartbeat_interval,
        max_clock_skew: config.max_clock_skew,
        pricing: config.pricing.clone(),
        limits: config.limits.clone(),
        run_as: config.run_as.clone(),
    };
    let (engine, created) =
        Engine::open(store, engine_config, tokens.clone(), crate::engine::now_ms()).map_err(|e| e.message)?;
    for path in created {
        tracing::info!("created {path} (mode 0600)");
        eprintln!("ebb server: wrote {path}");
    }
    let (tx, rx) = mpsc::channel(1 << 16);
    std::thread::Builder::new()
        .name("ebb-writer".into())
        .spawn(move || engine.run(rx))
        .map_err(|e| format!("cannot start the writer thread: {e}"))?;
    let ticker = tx.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        loop {
            every.tick().await;
            if ticker.send(Msg::Tick).await.is_err() {
                return;
            }
        }
    });
    let app = App { tx, tokens, poll_wait: Duration::from_millis(config.heartbeat_interval.as_millis()) };
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/jobs", post(submit).get(list_jobs))
        .route("/v1/jobs/{id}", get(show_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/nodes/{name}", delete(remove_node))
        .route("/v1/nodes/{name}/drain", post(drain_node))
        .route("/v1/reclaim", post(reclaim))
        .route("/v1/tenants", post(create_tenant))
        .route("/v1/tenants/{name}/limits", get(get_tenant_limits).put(set_tenant_limits))
        .route("/v1/tenants/{name}/tokens", post(rotate_tenant_token).delete(revoke_tenant_tokens))
        .route("/v1/prices", get(list_prices))
        .route("/v1/prices/{model}", put(set_price))
        .route("/v1/reservations", post(create_reservation).get(list_reservations))
        .route("/v1/reservations/{id}", delete(delete_reservation))
        .route("/v1/bill", get(bill))
        .route("/v1/report", get(operator_report))
        .route("/v1/agent/join-token", post(rotate_join_token))
        .route("/v1/agent/register", post(agent_register))
        .route("/v1/agent/commands", get(agent_commands))
        .route("/v1/agent/report", post(agent_report))
        .layer(DefaultBodyLimit::max(api::MAX_REQUEST_BYTES))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let url = format!("http://{addr}");
    std::fs::write(dir.join("server.url"), format!("{url}\n")).map_err(|e| e.to_string())?;
    tracing::info!(%url, data_dir = %dir.display(), "ebb server listening");
    eprintln!("ebb server: listening on {url}");
    axum::serve(listener, router).with_graceful_shutdown(shutdown_signal()).await.map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
