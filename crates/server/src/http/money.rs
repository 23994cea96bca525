//! Prices, reservations, bills and the operator's report.

use super::*;

/// The price book: per GPU model, on-demand, preemptible (the fixed
/// discount off on-demand) and reserved prices per GPU-hour.
#[utoipa::path(get, path = "/v1/prices", tag = "billing", responses((status = 200, body = api::PriceBook)))]
pub(super) async fn list_prices(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<api::PriceBook>> {
    app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Prices { reply }).await?))
}

/// Set a GPU model's prices (admin). Attempts already running keep the
/// rate they started with.
#[utoipa::path(put, path = "/v1/prices/{model}", tag = "billing", params(("model" = String, Path)), request_body = api::PriceUpdate,
    responses((status = 200, body = api::Price),
        (status = 422, description = "An unknown GPU model, or a price the preemptible discount cannot take to a whole micro-dollar", body = api::ErrorBody)))]
pub(super) async fn set_price(
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
pub(super) async fn create_reservation(
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
pub(super) async fn list_reservations(
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
pub(super) async fn delete_reservation(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<u64>,
) -> ApiResult<Json<api::Reservation>> {
    app.require(&headers, Scope::Admin)?;
    Ok(Json(app.ask(|reply| Msg::DeleteReservation { id, reply }).await??))
}

#[derive(Deserialize)]
pub(super) struct PeriodQuery {
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
pub(super) async fn bill(
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
pub(super) async fn operator_report(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<PeriodQuery>,
) -> ApiResult<Json<api::OperatorReport>> {
    app.require(&headers, Scope::Admin)?;
    let PeriodQuery { from, to, .. } = q;
    Ok(Json(app.ask(|reply| Msg::OperatorReport { from, to, reply }).await??))
}

#[derive(Deserialize)]
pub(super) struct SeriesQuery {
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
pub(super) async fn operator_report_series(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<SeriesQuery>,
) -> ApiResult<Json<api::ReportSeries>> {
    app.require(&headers, Scope::Admin)?;
    let SeriesQuery { from, to, step } = q;
    Ok(Json(app.ask(|reply| Msg::OperatorReportSeries { from, to, step, reply }).await??))
}
