//! Ebb's wire formats: the REST API that users and the CLI speak, and the
//! protocol between the server and its agents. JSON over HTTP; times are
//! RFC 3339 strings for people and milliseconds since the Unix epoch
//! (`*_ms`) for programs. This crate is an API boundary: change it only in
//! ways old clients can read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
use utoipa::ToSchema;

mod agent;
pub mod events;
mod fleet;
mod health;
mod jobs;
mod money;
mod webhooks;

pub use agent::*;
pub use events::{Event, EventKind, JobEvent, PendingReason};
pub use fleet::*;
pub use health::*;
pub use jobs::*;
pub use money::*;
pub use webhooks::*;

/// The largest request body the server reads, in bytes; larger ones are
/// refused with 413. Named here so that agents size their reports under it.
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// The largest report body an agent sends: half the server's limit, so
/// that an estimate a little off never meets a 413.
pub const MAX_REPORT_BYTES: usize = MAX_REQUEST_BYTES / 2;

// ---- limits the server enforces, as the API document states them ----------

/// A time given by a person: RFC 3339 (`2026-12-01T08:00:00Z`, `Z` or
/// `+00:00` optional, `T` or a space) or a date (`2026-12-01`, midnight
/// UTC), from 1970. Days past the 28th are valid but not stated here.
pub const TIME_PATTERN: &str = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$";
/// Dollars as a decimal string, at most six decimals (micro-dollars).
pub const USD_PATTERN: &str = r"^[0-9]{1,12}(\.[0-9]{0,6})?$";
/// A series' step: a whole number of seconds, minutes, hours or days
/// (`15m`, `1h`, `1d`). The server takes any `humantime` duration
/// (`1h 30m`); this is the form every client can rely on.
pub const STEP_PATTERN: &str = r"^[0-9]{1,6}(s|m|h|d)$";
/// A string without NUL bytes (arguments, environment values).
const NO_NUL_PATTERN: &str = r"^[^\u0000]*$";
/// An environment variable a job may set: not Ebb's own (`EBB_*`,
/// `CUDA_VISIBLE_DEVICES`).
const ENV_NAME_PATTERN: &str = r"^(?!EBB_)(?!CUDA_VISIBLE_DEVICES$)[A-Za-z_][A-Za-z0-9_]*$";

fn no_nul_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(NO_NUL_PATTERN))
}

/// `argv`: a program and its arguments, none with a NUL byte.
fn argv_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(no_nul_string())
        .min_items(Some(1))
        .description(Some("Program and arguments, run directly (never through a shell)."))
}

/// `env`: variable names and values.
fn env_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(ObjectBuilder::new().schema_type(Type::String).pattern(Some(ENV_NAME_PATTERN))))
        .additional_properties(Some(no_nul_string()))
        .description(Some("Environment of the job, on top of what Ebb sets (EBB_*, CUDA_VISIBLE_DEVICES)."))
}

/// A sweep parameter's values: at least one, each at most 4096 characters.
fn sweep_values_schema() -> ArrayBuilder {
    ArrayBuilder::new().items(no_nul_string().max_length(Some(4096))).min_items(Some(1))
}

/// `bytes` in lowercase hex, two digits a byte, in one allocation: the
/// form tokens, secrets, SHA-256 digests and signatures take on the wire.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(char::from(DIGITS[usize::from(b >> 4)]));
        hex.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    hex
}

#[cfg(test)]
mod hex_tests {
    use proptest::prelude::*;

    proptest! {
        /// Any bytes, any length: two lowercase digits each, as `{:02x}`
        /// writes them.
        #[test]
        fn hex_is_two_lowercase_digits_a_byte(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(super::hex(&bytes), expected);
        }
    }
}
