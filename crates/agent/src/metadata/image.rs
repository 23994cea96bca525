//! A step's image on the attempt's endpoint (`POST /ebb/v1/image`, Pyxis'
//! `srun --container-image`): what the agent shows the attempt of it, or
//! why not.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;

use super::Endpoint;

/// Shows the attempt an image its step names (`POST /ebb/v1/image`):
/// what the step's container needs of it, or the status to answer and
/// why not.
pub(crate) type ShowImage = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Result<serde_json::Value, (u16, String)>> + Send>>
        + Send
        + Sync,
>;

/// A step's image (Pyxis' `srun --container-image`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageRequest {
    reference: String,
}

/// The longest image reference a step may name, as at submit.
const MAX_REFERENCE: usize = 512;

pub(super) async fn native_image(Extension(e): Extension<Endpoint>, body: Bytes) -> Response {
    let answer = |status: u16, m: String| {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(json!({ "error": m }))).into_response()
    };
    if let Some(over) = e.over_rate() {
        return over;
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let asked: ImageRequest = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(err) => {
            let path = err.path().to_string();
            return answer(400, format!("{path}: {}", err.into_inner()));
        }
    };
    if asked.reference.is_empty() || asked.reference.len() > MAX_REFERENCE {
        return answer(400, format!("reference: 1 to {MAX_REFERENCE} bytes, got {}", asked.reference.len()));
    }
    match (e.images)(asked.reference).await {
        Ok(shown) => Json(shown).into_response(),
        Err((status, why)) => answer(status, why),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{served, Served};
    use super::*;

    /// A step's image: what the agent shows, or why not, and a clear
    /// refusal of any other body.
    #[tokio::test]
    async fn a_step_asks_for_its_image_and_hears_why_not() {
        let Served { base, notice: _notice, .. } = served("metadata-image", 1).await;
        let http = reqwest::Client::new();
        let ask = |body: String| http.post(format!("{base}/ebb/v1/image")).body(body).send();
        let shown = ask(r#"{"reference": "reg/ok:v1"}"#.into()).await.unwrap();
        assert_eq!(shown.status(), 200);
        assert_eq!(shown.json::<serde_json::Value>().await.unwrap()["rootfs"], "/views/4-1/abc");
        let missing = ask(r#"{"reference": "reg/gone:v1"}"#.into()).await.unwrap();
        assert_eq!(missing.status(), 422);
        assert!(missing.text().await.unwrap().contains("not found in the registry"));
        let long = format!(r#"{{"reference": "{}"}}"#, "r".repeat(MAX_REFERENCE + 1));
        for (body, says) in [
            ("{}".to_string(), "missing field `reference`"),
            (r#"{"reference": ""}"#.to_string(), "1 to 512 bytes"),
            (long, "1 to 512 bytes"),
            (r#"{"reference": "reg/ok:v1", "root": true}"#.to_string(), "unknown field `root`"),
            ("\u{0}".to_string(), "expected value"),
        ] {
            let refused = ask(body.clone()).await.unwrap();
            assert_eq!(refused.status(), 400, "{body}");
            assert!(refused.text().await.unwrap().contains(says), "{body}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]
        /// Any body a job sends for an image: an answer, never a panic,
        /// and never a 5xx of the endpoint's own.
        #[test]
        fn any_image_request_is_answered(body in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let status = runtime.block_on(async {
                let Served { base, notice: _notice, .. } = served("metadata-image-any", 1).await;
                reqwest::Client::new().post(format!("{base}/ebb/v1/image")).body(body).send().await.unwrap().status()
            });
            proptest::prop_assert!([200, 400, 422, 429].contains(&status.as_u16()), "{status}");
        }
    }
}
