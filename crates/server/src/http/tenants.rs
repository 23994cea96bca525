//! Tenants (admin), their tokens, limits and registry logins.

use super::*;

/// Give a tenant a new token and revoke every older one (admin). The new
/// token is shown once.
#[utoipa::path(post, path = "/v1/tenants/{name}/tokens", tag = "operator", params(("name" = String, Path)),
    responses((status = 200, body = api::TenantTokens), (status = 401, body = api::ErrorBody),
        (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub(super) async fn rotate_tenant_token(
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
pub(super) async fn revoke_tenant_tokens(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::TenantTokens>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::TenantTokens { name, issue: false, reply }).await??))
}

/// Create a tenant and its first token (admin). The token is shown once.
#[utoipa::path(post, path = "/v1/tenants", tag = "operator", request_body = api::TenantRequest,
    responses((status = 201, body = api::TenantCreated), (status = 409, description = "The tenant exists", body = api::ErrorBody)))]
pub(super) async fn create_tenant(
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
pub(super) async fn list_tenants(
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
pub(super) async fn get_tenant_limits(
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
pub(super) async fn list_registry_logins(
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
pub(super) async fn set_registry_login(
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
pub(super) async fn delete_registry_login(
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
pub(super) async fn set_tenant_limits(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(tenant): ApiPath<String>,
    Body(body): Body,
) -> ApiResult<Json<api::TenantUsage>> {
    let principal = app.require(&headers, Scope::Admin)?;
    let set: api::TenantLimits = parse(&body)?;
    Ok(Json(app.ask(|reply| Msg::TenantLimits { principal, tenant, set: Some(set), reply }).await??))
}
