//! Extractors: path, query and body, each refusing with a JSON error that
//! names what was wrong.

use super::*;

/// A path parameter. One that does not parse (`/v1/jobs/abc`) is a JSON 400
/// like every other refusal, never axum's plain-text one.
pub(super) struct ApiPath<T>(pub(super) T);

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
pub(super) struct ApiQuery<T>(pub(super) T);

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
pub(super) struct Body(pub(super) Bytes);

/// axum's default body limit, which every route keeps.
pub(super) const BODY_LIMIT: &str = "2 MiB";

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
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
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

pub(super) fn body_error(path: String, inner: impl std::fmt::Display) -> ApiError {
    if path == "." || path.is_empty() {
        ApiError::bad_request(format!("body: {inner}"))
    } else {
        ApiError::bad_request(format!("{path}: {inner}"))
    }
}

pub(super) fn integral_floats_as_integers(value: &mut serde_json::Value) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
