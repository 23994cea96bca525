//! Resolving a reference to its digest at submit, on the server.
//!
//! The problem: the reference is a tenant's, and the server fetches
//! what it names. A registry of the tenant's own may say any digest in a
//! header (another tenant's), redirect the request anywhere (the cloud's
//! metadata service, the server's own API), send an endless body, or put
//! what it fetched from there in an error the tenant reads.
//!
//! So the manifest is fetched (GET, never a HEAD's header alone) and its
//! digest is the SHA-256 of the bytes received, at most
//! [`MAX_MANIFEST_BYTES`]; a redirect is followed only to the same
//! scheme, host and port; a registry the operator did not name is
//! reached only at addresses [`Outbound`](ebb_http::Outbound) allows,
//! checked as it is connected to; and an error says what the registry
//! answered (its status), never what it sent. The token dance of the
//! distribution spec (a `401` with `WWW-Authenticate: Bearer realm=…`,
//! or `Basic`) is done here with the tenant's login; the token server is
//! held to the same policy.

use std::time::Duration;

use oci_client::Reference;

use crate::{ImageError, Login, Registries};

/// The largest manifest accepted, in bytes (the distribution spec's
/// registries accept at most 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// The largest answer of a token server, in bytes.
const MAX_TOKEN_BYTES: usize = 64 << 10;
/// How long resolving one reference may take, the token dance included.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Redirects followed within one registry.
const MAX_REDIRECTS: usize = 5;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// Resolves `reference` to the digest of its manifest (for a
/// multi-platform index, the index's own digest: the node picks its
/// platform's image from it, the same one every time).
pub async fn resolve(
    registries: &Registries,
    reference: &str,
    login: Option<&Login>,
) -> Result<String, ImageError> {
    let parsed = registries.check(reference)?;
    let fetch = Fetch::new(registries, &parsed, reference)?;
    match tokio::time::timeout(RESOLVE_TIMEOUT, fetch.manifest(login)).await {
        Ok(result) => result,
        Err(_) => Err(ImageError::Unreachable(
            reference.to_string(),
            format!("no manifest within {}s", RESOLVE_TIMEOUT.as_secs()),
        )),
    }
}

struct Fetch<'a> {
    reference: &'a str,
    parsed: &'a Reference,
    url: reqwest::Url,
    client: reqwest::Client,
    registries: &'a Registries,
}

impl<'a> Fetch<'a> {
    fn new(
        registries: &'a Registries,
        parsed: &'a Reference,
        reference: &'a str,
    ) -> Result<Fetch<'a>, ImageError> {
        let host = parsed.resolve_registry().to_string();
        let scheme = if registries.plain_http(parsed.registry()) { "http" } else { "https" };
        let target = parsed
            .digest()
            .map(str::to_string)
            .unwrap_or_else(|| parsed.tag().unwrap_or("latest").to_string());
        let url = format!("{scheme}://{host}/v2/{}/manifests/{target}", parsed.repository());
        let url = reqwest::Url::parse(&url)
            .map_err(|e| ImageError::Invalid(reference.to_string(), format!("not a registry URL ({e})")))?;
        let trusted = registries.trusts(parsed.registry());
        if !trusted {
            registries.outbound.check_url(&url).map_err(|why| refused_address(reference, &why))?;
        }
        let (home_scheme, home_host, home_port) =
            (url.scheme().to_string(), url.host_str().unwrap_or("").to_string(), url.port_or_known_default());
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            let to = attempt.url();
            let same = to.scheme() == home_scheme
                && to.host_str() == Some(home_host.as_str())
                && to.port_or_known_default() == home_port;
            let elsewhere = to.host_str().unwrap_or("").to_string();
            if !same {
                attempt.error(format!("a redirect to another host ({elsewhere})"))
            } else if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(20))
            .redirect(redirects)
            .user_agent(concat!("ebb/", env!("CARGO_PKG_VERSION")));
        if !trusted {
            builder = builder.dns_resolver(registries.outbound.resolver());
        }
        let client = builder.build().map_err(|e| ImageError::Other(reference.to_string(), e.to_string()))?;
        Ok(Fetch { reference, parsed, url, client, registries })
    }

    async fn manifest(&self, login: Option<&Login>) -> Result<String, ImageError> {
        let first = self.get(None).await?;
        let answer = match first.status().as_u16() {
            401 => {
                let challenge = first
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let authorization = self.authorize(&challenge, login).await?;
                self.get(Some(&authorization)).await?
            }
            _ => first,
        };
        let status = answer.status();
        if !status.is_success() {
            return Err(self.answered(status.as_u16()));
        }
        let header =
            answer.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = read_capped(answer, MAX_MANIFEST_BYTES)
            .await
            .map_err(|why| ImageError::Other(self.reference.to_string(), format!("its manifest {why}")))?;
        manifest_digest(&body, header.as_deref(), self.parsed.digest())
            .map_err(|why| ImageError::Other(self.reference.to_string(), why))
    }

    async fn get(&self, authorization: Option<&str>) -> Result<reqwest::Response, ImageError> {
        let mut request = self.client.get(self.url.clone()).header(reqwest::header::ACCEPT, MANIFEST_TYPES);
        if let Some(a) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, a);
        }
        request.send().await.map_err(|e| self.unreachable(&e))
    }

    /// The `Authorization` a `401` with `challenge` asks for.
    async fn authorize(&self, challenge: &str, login: Option<&Login>) -> Result<String, ImageError> {
        let refused = |why: &str| ImageError::Refused(self.reference.to_string(), why.to_string());
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let login =
                login.ok_or_else(|| refused("the registry asks for a login (ebb tenant registry-login)"))?;
            return Ok(basic(login));
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(refused("the registry answered 401"));
        }
        let param = |name: &str| challenge_param(params, name);
        let realm = param("realm").ok_or_else(|| refused("the registry answered 401 with no token realm"))?;
        let mut realm = reqwest::Url::parse(&realm).map_err(|_| {
            ImageError::Other(self.reference.to_string(), "its token realm is not a URL".into())
        })?;
        if !matches!(realm.scheme(), "http" | "https") {
            return Err(ImageError::Other(
                self.reference.to_string(),
                "its token realm is not http(s)".into(),
            ));
        }
        if !self.registries.trusts(self.parsed.registry()) {
            self.registries
                .outbound
                .check_url(&realm)
                .map_err(|why| refused_address(self.reference, &why))?;
        }
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = param("service") {
                query.append_pair("service", &service);
            }
            let scope =
                param("scope").unwrap_or_else(|| format!("repository:{}:pull", self.parsed.repository()));
            query.append_pair("scope", &scope);
        }
        let mut request = self.client.get(realm);
        if let Some(login) = login {
            request = request.header(reqwest::header::AUTHORIZATION, basic(login));
        }
        let answer = request.send().await.map_err(|e| self.unreachable(&e))?;
        if !answer.status().is_success() {
            return Err(match answer.status().as_u16() {
                401 | 403 => refused(&format!("its token server answered {}", answer.status().as_u16())),
                code => self.answered(code),
            });
        }
        let body = read_capped(answer, MAX_TOKEN_BYTES)
            .await
            .map_err(|why| ImageError::Other(self.reference.to_string(), format!("its token {why}")))?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body).map_err(|_| {
            ImageError::Other(self.reference.to_string(), "its token server sent no token".into())
        })?;
        let token = token.token.or(token.access_token).filter(|t| !t.is_empty());
        let token = token.ok_or_else(|| {
            ImageError::Other(self.reference.to_string(), "its token server sent no token".into())
        })?;
        Ok(format!("Bearer {token}"))
    }

    fn answered(&self, code: u16) -> ImageError {
        let r = self.reference.to_string();
        match code {
            404 => ImageError::NotFound(r),
            401 | 403 => ImageError::Refused(r, format!("the registry answered {code}")),
            429 | 500..=599 => ImageError::Unreachable(r, format!("the registry answered {code}")),
            _ => ImageError::Other(r, format!("the registry answered {code}")),
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> ImageError {
        let why = crate::request_error(e);
        // The policy's resolver refused every address of the name.
        match why.contains("--outbound-allow") {
            true => refused_address(self.reference, &why.rsplit(": ").next().unwrap_or(&why)),
            false => ImageError::Unreachable(self.reference.to_string(), why),
        }
    }
}

impl Registries {
    /// Whether the operator named `registry` (allowed, or reached over
    /// plain HTTP): the address policy is for the others.
    pub fn trusts(&self, registry: &str) -> bool {
        self.insecure.iter().chain(&self.allowed).any(|h| h == registry)
    }
}

fn refused_address(reference: &str, why: &dyn std::fmt::Display) -> ImageError {
    ImageError::Invalid(
        reference.to_string(),
        format!("its registry is at an address this cluster does not reach: {why}"),
    )
}

fn basic(login: &Login) -> String {
    use base64::Engine;
    let pair = format!("{}:{}", login.username, login.password);
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
}

/// The value of `name` in a challenge's `k="v", k2="v2"` list.
fn challenge_param(params: &str, name: &str) -> Option<String> {
    let mut rest = params;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().trim_start_matches(',').trim();
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').map_or((after, ""), |(v, a)| (v, a)),
        };
        if key.eq_ignore_ascii_case(name) {
            return Some(value.trim().to_string());
        }
        rest = after.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
    }
    None
}

/// The body, or why not: longer than `cap`, or cut.
async fn read_capped(mut answer: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    if answer.content_length().is_some_and(|n| n > cap as u64) {
        return Err(format!("is larger than {} KiB", cap >> 10));
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        answer.chunk().await.map_err(|e| format!("was cut off: {}", crate::request_error(&e)))?
    {
        if body.len() + chunk.len() > cap {
            return Err(format!("is larger than {} KiB", cap >> 10));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The digest of a manifest the registry sent as `body`, with `header`
/// its `Docker-Content-Digest`, for a reference that named `named` (if
/// it named one): the SHA-256 of the bytes, or why they are refused.
fn manifest_digest(body: &[u8], header: Option<&str>, named: Option<&str>) -> Result<String, String> {
    let digest = format!("sha256:{}", crate::sha256_hex(body));
    if let Some(named) = named.filter(|n| *n != digest) {
        return Err(format!("the registry sent manifest {digest} for digest {named}"));
    }
    if let Some(said) = header.filter(|h| h.starts_with("sha256:") && *h != digest) {
        return Err(format!("the registry says digest {said} for a manifest whose digest is {digest}"));
    }
    #[derive(serde::Deserialize)]
    struct Versioned {
        #[serde(rename = "schemaVersion")]
        schema_version: u32,
    }
    match serde_json::from_slice::<Versioned>(body) {
        Ok(v) if v.schema_version == 2 => Ok(digest),
        _ => Err("what the registry sent is not an image manifest (schema 2)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenges_parameters_are_read_quoted_or_not() {
        let c = r#"realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#;
        assert_eq!(challenge_param(c, "realm").as_deref(), Some("https://auth.example.com/token"));
        assert_eq!(challenge_param(c, "service").as_deref(), Some("registry.example.com"));
        assert_eq!(challenge_param(c, "scope").as_deref(), Some("repository:a/b:pull"));
        assert_eq!(challenge_param("realm=x, service=y", "service").as_deref(), Some("y"));
        assert_eq!(challenge_param(c, "missing"), None);
    }

    use proptest::prelude::Strategy;

    proptest::proptest! {
        /// Whatever a registry sends as a manifest and its header, the
        /// digest is the hash of the bytes or the manifest is refused in
        /// words; never the header's word alone.
        #[test]
        fn any_manifest_body_and_header_is_hashed_or_refused(
            body in proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
                proptest::string::string_regex(r#"\{"schemaVersion": ?[0-9]{1,12}(, "x": ".{0,20}")?\}"#).unwrap().prop_map(|s: String| s.into_bytes()),
            ],
            header in proptest::option::of(proptest::string::string_regex("(sha256:)?[0-9a-f]{0,70}").unwrap()),
            named in proptest::option::of(proptest::string::string_regex("sha256:[0-9a-f]{64}").unwrap()),
        ) {
            let truth = format!("sha256:{}", crate::sha256_hex(&body));
            match manifest_digest(&body, header.as_deref(), named.as_deref()) {
                Ok(digest) => {
                    proptest::prop_assert_eq!(&digest, &truth);
                    proptest::prop_assert!(named.is_none_or(|n| n == truth));
                }
                Err(why) => proptest::prop_assert!(!why.is_empty()),
            }
        }

        /// A registry's challenge header is the registry's: any text is
        /// read without panicking.
        #[test]
        fn any_challenge_is_read_without_panicking(text in ".{0,200}", name in "[a-z]{1,8}") {
            let _ = challenge_param(&text, &name);
        }
    }
}
