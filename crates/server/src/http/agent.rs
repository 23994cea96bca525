//! The protocol between the server and its agents: register, poll for
//! commands, report; and the CA a joining agent fetches.

use super::*;

/// An agent joins (join token), or rejoins after a restart or a partition
/// saying what it runs.
#[utoipa::path(post, path = "/v1/agent/register", tag = "agent", request_body = api::Register,
    responses((status = 200, body = api::Registered),
        (status = 409, description = "The node cannot join as it says (another node's name with other GPUs)", body = api::ErrorBody),
        (status = 422, description = "A node the cluster cannot take (its model's nodes have another number of GPUs), or an unreported event stamped later than the server's clock plus the allowed skew", body = api::ErrorBody)))]
pub(super) async fn agent_register(
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
pub(super) struct PollQuery {
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
pub(super) async fn agent_commands(
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
        // Subscribed while the poll was handled: any later push wakes us,
        // with the stream as the commit that woke us left it. Its commands
        // are answered from there; the writer, which checked this poll a
        // moment ago, takes the contact on its tick.
        match tokio::time::timeout_at(deadline, poll.changed.changed()).await {
            Ok(Ok(())) => {
                let delivered = poll.changed.borrow_and_update().clone();
                let commands = delivered.after(q.after);
                if let (false, Some(lines)) = (commands.is_empty(), app.role.lines()) {
                    lines.woken(&q.node, crate::engine::now_ms());
                    return Ok(Json(CommandsOut { commands, next_seq: delivered.next_seq }));
                }
            }
            _ => return Ok(Json(CommandsOut { commands: Vec::new(), next_seq: poll.next_seq })),
        }
    }
}

/// [`api::Commands`] as a poll answers it: the commands shared with the
/// node's stream, written out as they are.
#[derive(Serialize)]
pub(super) struct CommandsOut {
    #[serde(serialize_with = "shared_commands")]
    commands: Vec<Arc<api::Command>>,
    next_seq: u64,
}

pub(super) fn shared_commands<S: serde::Serializer>(
    commands: &[Arc<api::Command>],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(commands.iter().map(|c| &**c))
}

/// When an empty poll is answered: a heartbeat interval from now, brought
/// back to a tick of a shared grid (a quarter of the interval, at most
/// 250 ms). Polls that come at scattered moments then end together, and
/// their agents ask again together: an idle fleet wakes the server a few
/// times a second instead of at every poll's own instant.
pub(super) fn poll_deadline(wait: Duration) -> tokio::time::Instant {
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
pub(super) async fn agent_report(
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

/// The image a running attempt's step names, pinned for the attempt
/// (Pyxis' `srun --container-image`): the node's agent pulls it for the
/// step. The registries the operator allows, the tenant's login for that
/// registry, and the same digest for every node of the attempt.
#[utoipa::path(post, path = "/v1/agent/image", tag = "agent", request_body = api::StepImage,
    responses((status = 200, body = api::StartImage),
        (status = 404, description = "The attempt does not run on the node", body = api::ErrorBody),
        (status = 422, description = "The registry is not allowed, or has no such image", body = api::ErrorBody),
        (status = 503, description = "The registry could not be reached", body = api::ErrorBody)))]
pub(super) async fn agent_image(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::StartImage>> {
    let asked: api::StepImage = parse(&body)?;
    app.node(&headers, &asked.node)?;
    let unprocessable = |e: String| ApiError::unprocessable(format!("image {}: {e}", asked.reference));
    if asked.reference.len() > 512 {
        return Err(unprocessable("longer than 512 bytes".into()));
    }
    let parsed = app.registries.check(&asked.reference).map_err(|e| unprocessable(e.to_string()))?;
    let (node, attempt, reference) = (asked.node.clone(), asked.attempt, asked.reference.clone());
    let registry = parsed.registry().to_string();
    let grant = app.ask(|reply| Msg::StepImage { node, attempt, registry, reference, reply }).await??;
    let digest = match grant.pinned {
        Some(digest) => digest,
        None => {
            let login = grant
                .login
                .as_ref()
                .map(|l| ebb_image::Login { username: l.username.clone(), password: l.password.clone() });
            let digest = match ebb_image::resolve(&app.registries, &asked.reference, login.as_ref()).await {
                Ok(digest) => digest,
                Err(e) if e.is_transient() => {
                    return Err(Refusal::unavailable(format!("image {}: {e}", asked.reference)).into())
                }
                // The error names the image.
                Err(e) => return Err(ApiError::unprocessable(e.to_string())),
            };
            let reference = asked.reference.clone();
            app.ask(|reply| Msg::PinStepImage { attempt, reference, digest, reply }).await?
        }
    };
    let login = grant.login.filter(|_| grant.login_to_node);
    Ok(Json(api::StartImage {
        reference: asked.reference,
        digest,
        username: login.as_ref().map(|l| l.username.clone()),
        password: login.map(|l| l.password),
        root: false,
    }))
}

/// The CA that signed this server's certificate, PEM: an agent joining
/// with `--ca-fingerprint` fetches it without verifying the connection,
/// then trusts it only if its SHA-256 is the fingerprint it was given. No
/// token: it is public, and the agent has none it may send yet.
#[utoipa::path(get, path = "/v1/tls/ca.crt", tag = "agent", security(()),
    responses(
        (status = 200, description = "The CA certificate, PEM", content_type = "application/x-pem-file", body = String),
        (status = 404, description = "The server serves plain HTTP, or was given a certificate without its CA", body = api::ErrorBody)))]
pub(super) async fn tls_ca(State(app): State<App>) -> ApiResult<Response> {
    match &app.tls_ca {
        Some(pem) => Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem.to_string()).into_response()),
        None => Err(ApiError::not_found(
            "this server has no CA to hand out: it serves plain HTTP, or HTTPS with --tls-cert and no ca.crt in its data dir"
                .into(),
        )),
    }
}
