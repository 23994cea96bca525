//! Watching the cluster: the event stream and `/metrics`.

use super::*;

/// Server-sent events, one each time a batch that changed jobs, nodes or
/// money commits (`data: {"seq": N}`; the first says where the count
/// stands), for a page to read again what it shows; a comment every 15 s
/// keeps the connection open. The events carry no data: what is read
/// again is what the token may see. Read with `fetch` (an `EventSource`
/// cannot send the token).
pub(super) async fn stream(State(app): State<App>, headers: HeaderMap) -> ApiResult<Response> {
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

/// `/metrics` publishes revenue by tier, which `/v1/report` keeps to
/// operators: it takes an operator's token or the scrape token of
/// `--metrics-token-file` (Prometheus' `authorization` with a
/// `credentials_file`).
pub(super) async fn metrics(State(app): State<App>, headers: HeaderMap) -> ApiResult<Response> {
    let scraper = app.metrics_token.as_deref().is_some_and(|tokens| {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        given.is_some_and(|given| tokens.accepts(given))
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
