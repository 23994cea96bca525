//! The dashboard: a page and its assets, built into the binary from
//! `crates/server/web/`, served from the server's own origin. Nothing is
//! fetched from anywhere else: the chart library, uPlot, is vendored in
//! `web/vendor/` (`scripts/vendor-uplot`).

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// Every asset: its name under `/assets/`, its type, its bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../web/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../web/app.css")),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../web/vendor/uPlot.iife.min.js"),
    ),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../web/vendor/uPlot.min.css")),
];

const INDEX: &[u8] = include_bytes!("../web/index.html");

/// What every page and asset is sent with: nothing but this origin's own
/// scripts, styles and API, and no framing.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// `GET /`: the dashboard.
pub async fn index() -> Response {
    secured(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response())
}

/// `GET /assets/NAME`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, bytes)) => secured(([(header::CONTENT_TYPE, *kind)], *bytes).into_response()),
        None => crate::ApiError::not_found(format!("no asset {name:?}")).into_response(),
    }
}
