//! The fleet (admin): nodes, the join token, reclaiming capacity.

use super::*;

/// What the cluster has and what a job of each tier could get now, per
/// GPU model: counts for anyone with a token, no one's jobs.
#[utoipa::path(get, path = "/v1/capacity", tag = "jobs", responses((status = 200, body = api::Capacity)))]
pub(super) async fn capacity(State(app): State<App>, headers: HeaderMap) -> ApiResult<Json<api::Capacity>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Capacity { principal, reply }).await?))
}

/// Nodes and their GPUs. A tenant (`sinfo`) sees each node's model,
/// GPUs, state and how many are in use, as Slurm shows every user; not
/// which jobs run there, what is held for whom, or why a node is unhealthy.
#[utoipa::path(get, path = "/v1/nodes", tag = "operator", responses((status = 200, body = [api::Node])))]
pub(super) async fn list_nodes(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<api::Node>>> {
    let principal = app.tenant(&headers)?;
    let mut nodes = app.ask(|reply| Msg::Nodes { reply }).await?;
    if principal.scope != Scope::Admin {
        for node in &mut nodes {
            node.jobs.clear();
            node.placements.clear();
            node.held.clear();
            node.unhealthy = None;
        }
    }
    Ok(Json(nodes))
}

/// Drain a node for maintenance (admin): it takes no new work, its
/// preemptible jobs get the drain window, others finish.
#[utoipa::path(post, path = "/v1/nodes/{name}/drain", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::Node), (status = 404, description = "No such node", body = api::ErrorBody),
        (status = 409, description = "The node cannot be drained now", body = api::ErrorBody)))]
pub(super) async fn drain_node(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::Node>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::DrainNode { name, reply }).await??))
}

#[derive(serde::Deserialize)]
pub(super) struct UndrainQuery {
    #[serde(default)]
    gpu: Option<u8>,
}

/// Put a drained node back into service, with every GPU of it out of
/// service; or, with `gpu`, that one GPU only (admin).
#[utoipa::path(post, path = "/v1/nodes/{name}/undrain", tag = "operator",
    params(("name" = String, Path),
        ("gpu" = Option<u8>, Query, maximum = 63, description = "return only this GPU (its index on the node) to service")),
    responses((status = 200, body = api::Node), (status = 400, body = api::ErrorBody),
        (status = 404, description = "No such node", body = api::ErrorBody),
        (status = 409, description = "The node is not drained, or the GPU is in service", body = api::ErrorBody),
        (status = 422, description = "The node has no such GPU", body = api::ErrorBody)))]
pub(super) async fn undrain_node(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<UndrainQuery>,
) -> ApiResult<Json<api::Node>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::UndrainNode { name, gpu: q.gpu, reply }).await??))
}

/// Remove a node (admin): its credential is revoked at once and its live
/// attempts are requeued as lost. It may join again with the join token.
#[utoipa::path(delete, path = "/v1/nodes/{name}", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::NodeRemoved), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub(super) async fn remove_node(
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
pub(super) async fn rotate_join_token(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<api::JoinToken>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::RotateJoinToken { reply }).await??))
}

/// Take back N GPUs of preemptible capacity with the drain window (admin).
#[utoipa::path(post, path = "/v1/reclaim", tag = "operator", request_body = api::ReclaimRequest,
    responses((status = 200, body = api::ReclaimReply), (status = 409, description = "No node has joined yet", body = api::ErrorBody),
        (status = 422, description = "An unknown GPU model, or none named when nodes have several", body = api::ErrorBody)))]
pub(super) async fn reclaim(
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
pub(super) async fn release_reclaim(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<api::ReclaimReleased>> {
    app.require(&headers, Scope::Admin)?;
    let req: api::ReclaimRelease = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::ReleaseReclaim { req, reply }).await??))
}
