//! `ebb server`: the control plane.
//!
//! HTTP handlers authenticate and parse, then hand every read and write to
//! the single writer thread (`engine`), which owns the scheduling core and
//! the store. See ARCHITECTURE.md.

pub mod billing;
pub mod engine;
pub mod gpu_names;
pub mod http;
pub mod leader;
pub mod lock;
pub mod metrics;
pub mod partitions;
pub mod refusal;
pub mod sealed;
pub mod store;
pub mod tls;
mod validate;
mod web;
pub mod webhooks;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

pub use engine::{now_ms, EngineConfig, Images, Required, RunAs};
pub use http::ApiError;
pub use refusal::{Refusal, Refused};
pub use validate::{parse_signal, Limits};

use ebb_core::TenantId;

use crate::store::Scope;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub scope: Scope,
    /// (id, name) of the tenant whose jobs this token acts on.
    pub tenant: Option<(TenantId, String)>,
    /// The node a node credential speaks for.
    pub node: Option<String>,
}

/// What a token's hash stands for in the server's memory. A revoked token
/// is remembered (until the server restarts) so that its holder is told
/// why it is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenState {
    Valid(Principal),
    Revoked(String),
}

/// Token hashes to who they are: what every request is authenticated
/// against. The writer changes it as it handles a grant or revocation,
/// before the call is answered: a revoked token is refused from then on,
/// and a new one is known to no one until its reply, after the commit.
pub type TokenMap = Arc<RwLock<HashMap<String, TokenState>>>;

impl Principal {
    pub fn tenant(scope: Scope, id: TenantId, name: &str) -> Principal {
        Principal { scope, tenant: Some((id, name.to_string())), node: None }
    }

    pub fn join() -> Principal {
        Principal { scope: Scope::Agent, tenant: None, node: None }
    }

    pub fn node(name: &str) -> Principal {
        Principal { scope: Scope::Node, tenant: None, node: Some(name.to_string()) }
    }

    /// Admins see every tenant's jobs; a tenant only its own.
    pub fn may_see(&self, tenant: TenantId) -> bool {
        self.scope == Scope::Admin || self.tenant.as_ref().is_some_and(|(id, _)| *id == tenant)
    }
}

/// A fresh secret: `ebb_` and 32 random bytes in hex.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS has randomness");
    format!("ebb_{}", ebb_api::hex(&bytes))
}

/// Tokens are stored only as their SHA-256. Every request's token is
/// hashed to be looked up.
pub fn hash_token(token: &str) -> String {
    ebb_api::hex(&Sha256::digest(token.trim().as_bytes()))
}

/// RFC 3339 in UTC, millisecond precision; never panics.
pub use ebb_core::time::rfc3339_millis as rfc3339;

/// A server: its writer's configuration, and how the process around it
/// listens, stores and leads.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The writer's: the data dir, the drain window, prices, limits, ...
    pub engine: EngineConfig,
    /// PostgreSQL instead of `<data_dir>/ebb.db`; several servers may
    /// share it, one leading.
    pub database: Option<String>,
    pub listen: SocketAddr,
    /// Where other servers and clients reach this one (default: the
    /// listen address).
    pub advertise: Option<String>,
    /// The leader's lease on a shared database.
    pub lease: std::time::Duration,
    /// Plain HTTP, or HTTPS with which certificate.
    pub tls: tls::TlsConfig,
    /// How the API's connections are bounded: the header-read (and idle)
    /// timeout, connections per client address.
    pub connections: ebb_http::Limits,
    /// Tokens that may read `/metrics` (and nothing else), as well as an
    /// operator's: `--metrics-token-file`, read again when it changes.
    pub metrics_token: Option<std::sync::Arc<http::scrape::ScrapeTokens>>,
    /// How the registries of jobs' images are reached (to resolve tags).
    pub registries: ebb_image::Registries,
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn serve(config: ServerConfig) -> Result<(), http::ServeError> {
    http::serve(config).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_token_hashes_to_its_sha256_in_hex() {
        // SHA-256 of "abc" (FIPS 180-2's example); the token is trimmed.
        assert_eq!(
            super::hash_token(" abc\n"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
