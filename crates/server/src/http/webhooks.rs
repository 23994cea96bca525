//! Webhooks: a tenant's on its jobs' events, the operators' on nodes'.

use super::*;

/// Add a webhook: a tenant's (its own, or any with an operator's token)
/// for its jobs' events, or, with an operator's token and no tenant, the
/// operators' for nodes' events. The answer holds its signing secret, shown
/// this once.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = api::WebhookRequest,
    responses((status = 201, body = api::Webhook), (status = 400, body = api::ErrorBody),
        (status = 404, description = "No such tenant", body = api::ErrorBody),
        (status = 409, description = "Too many webhooks", body = api::ErrorBody),
        (status = 422, description = "A field is wrong, and which", body = api::ErrorBody)))]
pub(super) async fn create_webhook(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::Webhook>)> {
    let principal = app.tenant(&headers)?;
    let req: api::WebhookRequest = parse(&body)?;
    let created = app.ask(|reply| Msg::CreateWebhook { principal, req, reply }).await??;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(serde::Deserialize)]
pub(super) struct WebhooksQuery {
    #[serde(default)]
    tenant: Option<String>,
}

/// The webhooks the caller may see: a tenant's own; an operator's, every
/// one, or one tenant's with `tenant`. Secrets are never listed.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    params(("tenant" = Option<String>, Query, description = "only this tenant's")),
    responses((status = 200, body = [api::Webhook]), (status = 404, body = api::ErrorBody)))]
pub(super) async fn list_webhooks(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<WebhooksQuery>,
) -> ApiResult<Json<Vec<api::Webhook>>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Webhooks { principal, tenant: q.tenant, reply }).await??))
}

/// Remove a webhook, with what it had still to deliver and its log.
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", params(("id" = u64, Path)),
    responses((status = 200, body = api::Webhook), (status = 404, body = api::ErrorBody)))]
pub(super) async fn delete_webhook(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::Webhook>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::DeleteWebhook { principal, id, reply }).await??))
}

/// A webhook's latest tries, newest first: delivered, failed (tried again
/// later), given up or dropped, with the receiver's status or the error.
#[utoipa::path(get, path = "/v1/webhooks/{id}/log", tag = "webhooks", params(("id" = u64, Path)),
    responses((status = 200, body = api::WebhookLog), (status = 404, body = api::ErrorBody)))]
pub(super) async fn webhook_log(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::WebhookLog>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::WebhookLog { principal, id, reply }).await??))
}
