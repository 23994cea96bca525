//! Container images: naming one, resolving its tag to the digest every
//! attempt runs, and the node's cache of unpacked images.
//!
//! The registry protocol (the OCI distribution API, its token and basic
//! authentication, manifests and image indexes) is `oci-client`'s; what is
//! Ebb's own is the cache: layers verified by digest and kept by it, one
//! unpacked root file system per image shared by every job of the node,
//! concurrent pulls of one image or one layer made once, and a disk budget
//! that evicts the least recently used image no attempt holds.

mod cache;
mod resolve;
pub mod testing;
mod unpack;

use std::fmt;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};

pub use cache::{Cache, Lease, Progress};
pub use resolve::{resolve, MAX_MANIFEST_BYTES};
pub use unpack::{apply_layer, Limits, UnpackError, Used};

/// The longest image reference accepted, in bytes (the distribution
/// spec's names are at most 255 characters; a tag 128, a digest 71).
pub const MAX_REFERENCE_BYTES: usize = 512;

/// A registry login: what a tenant gave for one registry host.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Login {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Login {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Login({}, <password>)", self.username)
    }
}

/// Why an image cannot be used, in words that name it.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {0:?}: {1}")]
    Invalid(String, String),
    #[error("image {0}: not found in the registry")]
    NotFound(String),
    #[error("image {0}: the registry refused the credentials ({1})")]
    Refused(String, String),
    #[error("image {0}: the registry cannot be reached: {1}")]
    Unreachable(String, String),
    #[error("image {0}: layer {1} does not match its digest: {2}")]
    DigestMismatch(String, String, String),
    #[error("image {0}: {1}")]
    Other(String, String),
}

impl ImageError {
    /// Whether a later try may succeed (the registry was down, a pull was
    /// cut): the job waits. Otherwise it fails with this as its cause.
    pub fn is_transient(&self) -> bool {
        matches!(self, ImageError::Unreachable(..))
    }
}

/// An image reference as a tenant wrote it, checked: `HOST[:PORT]/NAME`
/// with `:TAG` or `@sha256:DIGEST`. A name without a host is refused
/// rather than sent to Docker Hub behind the tenant's back.
pub fn parse(reference: &str) -> Result<Reference, ImageError> {
    let invalid = |why: &str| ImageError::Invalid(reference.to_string(), why.to_string());
    if reference.is_empty() || reference.len() > MAX_REFERENCE_BYTES {
        return Err(invalid(&format!("a reference is 1 to {MAX_REFERENCE_BYTES} bytes")));
    }
    if reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("a reference has no spaces or control characters"));
    }
    let first = reference.split('/').next().unwrap_or("");
    let names_host =
        reference.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if !names_host {
        return Err(invalid(
            "name the registry: HOST[:PORT]/NAME[:TAG] (e.g. registry.example.com/team/train:v3)",
        ));
    }
    let parsed: Reference = reference.parse().map_err(|e: oci_client::ParseError| invalid(&e.to_string()))?;
    if let Some(digest) = parsed.digest() {
        let hex =
            digest.strip_prefix("sha256:").ok_or_else(|| invalid("a digest is sha256:<64 hex digits>"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(invalid("a digest is sha256:<64 lowercase hex digits>"));
        }
    }
    Ok(parsed)
}

/// The same image, named by its digest.
pub fn pinned(reference: &Reference, digest: &str) -> Reference {
    Reference::with_digest(
        reference.registry().to_string(),
        reference.repository().to_string(),
        digest.to_string(),
    )
}

/// The registries a cluster reaches: over HTTPS, but for the hosts named
/// insecure (one on a trusted network) and those on loopback, as Docker
/// and containerd reach them; only those of `allowed`, where it names any.
#[derive(Clone, Debug, Default)]
pub struct Registries {
    pub insecure: Vec<String>,
    /// The only registries images may come from (empty: any). Without it,
    /// a tenant can make the server and the nodes connect to any host and
    /// port it names, and tell from the error whether something answers.
    pub allowed: Vec<String>,
    /// Where the server may connect for a registry the operator did not
    /// name (see [`resolve`]).
    pub outbound: ebb_http::Outbound,
}

impl Registries {
    /// `reference`, checked and allowed.
    pub fn check(&self, reference: &str) -> Result<Reference, ImageError> {
        let parsed = parse(reference)?;
        if !self.allowed.is_empty() && !self.allowed.iter().any(|a| a == parsed.registry()) {
            return Err(ImageError::Invalid(
                reference.to_string(),
                format!(
                    "registry {} is not one this cluster pulls from (it allows {})",
                    parsed.registry(),
                    self.allowed.join(", ")
                ),
            ));
        }
        Ok(parsed)
    }

    /// A client for one tenant's requests. oci-client keeps the first
    /// credentials a client is given for a registry and uses them for
    /// every later request there, whoever makes it: never share one
    /// between tenants.
    pub fn client(&self, registry: &str) -> Client {
        let mut plain = self.insecure.clone();
        if on_loopback(registry) {
            plain.push(registry.to_string());
        }
        let protocol = match plain.is_empty() {
            true => ClientProtocol::Https,
            false => ClientProtocol::HttpsExcept(plain),
        };
        Client::new(ClientConfig {
            protocol,
            // A registry that does not answer is a clear error, not a
            // submit or a start that hangs.
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            user_agent: concat!("ebb/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        })
    }
}

impl Registries {
    /// Whether `registry` is reached over plain HTTP: one the operator
    /// named insecure, or one on loopback. Plain HTTP is not trust: a
    /// tenant's reference to a loopback registry still meets the address
    /// policy (see [`Registries::trusts`]).
    pub fn plain_http(&self, registry: &str) -> bool {
        self.insecure.iter().any(|h| h == registry) || on_loopback(registry)
    }
}

/// Whether a registry (`HOST[:PORT]`, `[V6]:PORT`) is on loopback:
/// 127.0.0.0/8, `::1`, or `localhost`, which names them.
pub fn on_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => match registry.rsplit_once(':') {
            Some((host, _)) if !host.contains(':') => host,
            _ => registry,
        },
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn auth(login: Option<&Login>) -> RegistryAuth {
    match login {
        Some(l) => RegistryAuth::Basic(l.username.clone(), l.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// The registry's answer, as one of Ebb's causes.
pub(crate) fn classify(reference: &str, e: OciDistributionError) -> ImageError {
    let r = reference.to_string();
    use OciDistributionError as E;
    match e {
        E::ImageManifestNotFoundError(_) => ImageError::NotFound(r),
        E::AuthenticationFailure(why) => ImageError::Refused(r, why),
        E::UnauthorizedError { url } => ImageError::Refused(r, format!("401 from {url}")),
        E::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope.errors.iter().map(|e| format!("{:?}", e.code)).collect();
            let text = codes.join(", ");
            if text.contains("Unknown") || text.contains("NameUnknown") || text.contains("ManifestUnknown") {
                ImageError::NotFound(r)
            } else if text.contains("Unauthorized") || text.contains("Denied") {
                ImageError::Refused(r, text)
            } else {
                ImageError::Other(r, format!("the registry said {text}"))
            }
        }
        E::ServerError { code: 404, .. } => ImageError::NotFound(r),
        E::ServerError { code, message, .. } if code == 401 || code == 403 => ImageError::Refused(r, message),
        E::ServerError { code, message, .. } => ImageError::Unreachable(r, format!("{code}: {message}")),
        E::RequestError(e) => ImageError::Unreachable(r, request_error(&e)),
        E::DigestError(e) => ImageError::Other(r, e.to_string()),
        other => ImageError::Other(r, other.to_string()),
    }
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// An error and its causes, as one line (an HTTP client's errors say
/// little without their causes: `error sending request` alone).
pub fn request_error(e: &dyn std::error::Error) -> String {
    ebb_http::causes::chain(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Docker and containerd: a registry on loopback is reached over
    /// plain HTTP without being named insecure; any other only when named.
    #[test]
    fn a_registry_on_loopback_is_plain_http_and_no_other_unless_named() {
        let none = Registries::default();
        for loopback in ["127.0.0.1:5000", "127.8.9.1", "localhost:5000", "LOCALHOST", "[::1]:5000", "::1"] {
            assert!(none.plain_http(loopback), "{loopback}");
        }
        for other in [
            "10.0.0.1:5000",
            "registry.example.com",
            "[::2]:5000",
            "localhost.example.com:5000",
            "0.0.0.0:80",
        ] {
            assert!(!none.plain_http(other), "{other}");
        }
        let named = Registries { insecure: vec!["10.0.0.1:5000".into()], ..Registries::default() };
        assert!(named.plain_http("10.0.0.1:5000") && !named.plain_http("10.0.0.1:5001"));
        assert!(!none.trusts("127.0.0.1:5000"), "plain HTTP is not trust: the address policy still holds");
    }

    #[test]
    fn a_reference_names_its_registry_and_a_well_formed_tag_or_digest() {
        assert!(parse("127.0.0.1:5000/train:v9").is_ok());
        assert!(parse("registry.example.com/team/train@sha256:".to_string().as_str()).is_err());
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(parse(&format!("localhost/x@{digest}")).unwrap().digest(), Some(digest.as_str()));
        for bad in ["", "ubuntu:22.04", "team/train:v3", "a b/c", "host.io/x@sha256:ABC", "host.io/X:1"] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, ImageError::Invalid(..)), "{bad}: {e}");
        }
        assert!(parse(&format!("host.io/{}", "a".repeat(MAX_REFERENCE_BYTES))).is_err());
    }

    proptest::proptest! {
        /// Whatever a tenant writes, `parse` answers without panicking;
        /// what it accepts names a registry, is at most the bound, and
        /// pins back to the same host and name.
        #[test]
        fn any_reference_is_parsed_or_refused_in_words(reference in proptest::prop_oneof![
            proptest::string::string_regex("[a-z0-9.:/@_-]{0,80}").unwrap(),
            proptest::string::string_regex("[a-z]{1,10}\\.[a-z]{2,3}(:[0-9]{1,6})?/[a-z0-9/_.-]{1,40}(:[A-Za-z0-9_.-]{1,130}|@sha256:[0-9a-f]{60,68})?").unwrap(),
            proptest::prelude::any::<String>(),
            proptest::string::string_regex(".{500,600}").unwrap(),
        ]) {
            match parse(&reference) {
                Ok(parsed) => {
                    proptest::prop_assert!(reference.len() <= MAX_REFERENCE_BYTES);
                    proptest::prop_assert!(!parsed.registry().is_empty());
                    let digest = format!("sha256:{}", "0".repeat(64));
                    let again = pinned(&parsed, &digest);
                    proptest::prop_assert_eq!(again.registry(), parsed.registry());
                    proptest::prop_assert_eq!(again.repository(), parsed.repository());
                    proptest::prop_assert_eq!(again.digest(), Some(digest.as_str()));
                }
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("image "), "{e}"),
            }
        }
    }

    #[test]
    fn a_login_is_never_printed() {
        let login = Login { username: "alice".into(), password: "hunter2".into() };
        assert!(!format!("{login:?}").contains("hunter2"));
    }
}
