//! Trusting an `https://` server: which CA may sign its certificate, and
//! what to say when a certificate cannot be verified. Used by the agent
//! and by the CLI.
//!
//! Nothing is trusted by default: no operating-system or built-in root
//! store. The CA is the one the operator names (`--ca FILE`, `EBB_CA`),
//! or, for an agent joining a server that made its own CA, the one it
//! fetched from the server and checked against the fingerprint the
//! operator gave it (`--ca-fingerprint sha256:HEX`), as `kubeadm join`
//! does with `--discovery-token-ca-cert-hash`. The agent keeps that copy
//! in its data directory (`ca.crt`) and verifies every later connection
//! against it, restarts included.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use sha2::{Digest, Sha256};

/// Where a server that generated its own CA hands it out (no token).
pub const CA_PATH: &str = "/v1/tls/ca.crt";

/// The SHA-256 of a certificate's DER: `sha256:` and 64 hex digits, as
/// `ebb server --tls-generate` prints it for its CA (`openssl x509
/// -fingerprint -sha256` prints the same digits, with colons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(der).into())
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sha256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// A text that is not a CA's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected sha256: and 64 hex digits, as the server prints at start")]
pub struct NotAFingerprint(String);

/// Why a CA's certificates are not PEM certificates.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("not PEM certificates: {0}")]
    NotPem(rustls_pki_types::pem::Error),
    #[error("no certificate in it (PEM expected)")]
    Empty,
}

/// Why the agent (or a client) has nothing to verify its server with:
/// the operator's mistake, named by its flag, or a CA that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// `--ca FILE` (or a client's CA) cannot be read, or holds no CA.
    #[error("{flag} {}: {why}", path.display())]
    CaFile { flag: String, path: PathBuf, why: Box<dyn std::error::Error + Send + Sync> },
    #[error("--server {0}: all https:// or all http://, not both")]
    Mixed(String),
    #[error("--ca: the server {0} is plain HTTP; give its https:// URL")]
    CaOverHttp(String),
    #[error("--ca-fingerprint: the server {0} is plain HTTP; give its https:// URL")]
    FingerprintOverHttp(String),
    #[error(
        "the server {0} is https://: pass --ca FILE (the CA that signed its certificate) or --ca-fingerprint \
         sha256:HEX (its CA's, printed by the server at start)"
    )]
    NoCa(String),
    /// The CA kept at this node's join cannot be read.
    #[error("{}: {why}", path.display())]
    Kept { path: PathBuf, why: Box<dyn std::error::Error + Send + Sync> },
    /// The server's CA was not the one the fingerprint names, or not a CA.
    #[error("{0}")]
    Fetched(String),
    #[error("cannot keep the CA in {}: {source}", path.display())]
    Keep { path: PathBuf, source: std::io::Error },
    /// The HTTP client would not take a CA's certificate.
    #[error("{source_of}: {why}")]
    Client { source_of: String, why: reqwest::Error },
}

impl FromStr for Fingerprint {
    type Err = NotAFingerprint;

    /// `sha256:HEX`; the hex in either case, with or without colons.
    fn from_str(text: &str) -> Result<Fingerprint, NotAFingerprint> {
        let wrong = || NotAFingerprint(text.to_string());
        let hex = text.trim().strip_prefix("sha256:").or_else(|| text.trim().strip_prefix("SHA256:"));
        let digits: Vec<u8> = hex.ok_or_else(wrong)?.bytes().filter(|b| *b != b':').collect();
        if digits.len() != 64 {
            return Err(wrong());
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| wrong())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| wrong())?;
        }
        Ok(Fingerprint(bytes))
    }
}

/// The CA certificates an `https://` server's certificate must chain to,
/// and where they came from, for messages.
#[derive(Clone, Debug)]
pub struct Trust {
    certs: Vec<CertificateDer<'static>>,
    /// Says where the CA came from: `the CA in ca.pem given with --ca`.
    pub source: String,
}

impl Trust {
    /// Every certificate of a PEM file (one CA, or a bundle).
    pub fn from_pem_file(path: &Path, flag: &str) -> Result<Trust, TrustError> {
        let refused = |why: Box<dyn std::error::Error + Send + Sync>| TrustError::CaFile {
            flag: flag.to_string(),
            path: path.to_path_buf(),
            why,
        };
        let pem = std::fs::read(path).map_err(|e| refused(e.into()))?;
        Trust::from_pem(&pem, format!("the CA in {} given with {flag}", path.display()))
            .map_err(|e| refused(e.into()))
    }

    pub fn from_pem(pem: &[u8], source: String) -> Result<Trust, PemError> {
        let certs =
            CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(PemError::NotPem)?;
        if certs.is_empty() {
            return Err(PemError::Empty);
        }
        Ok(Trust { certs, source })
    }

    pub fn fingerprints(&self) -> Vec<Fingerprint> {
        self.certs.iter().map(|c| Fingerprint::of(c)).collect()
    }

    /// A client that trusts these CAs and nothing else.
    pub fn client_builder(&self) -> Result<reqwest::ClientBuilder, TrustError> {
        let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false);
        for cert in &self.certs {
            let cert = reqwest::Certificate::from_der(cert)
                .map_err(|why| TrustError::Client { source_of: self.source.clone(), why })?;
            builder = builder.add_root_certificate(cert);
        }
        Ok(builder)
    }
}

/// Whether `server` is an `https://` URL.
pub fn is_https(server: &str) -> bool {
    reqwest::Url::parse(server).is_ok_and(|url| url.scheme() == "https")
}

/// If `error` (a failed request to `server`) is the server's certificate
/// failing verification, or TLS spoken on one side only, says so in words,
/// naming the server and, where it matters, the CA it was checked against.
pub fn certificate_problem(
    server: &str,
    error: &(dyn std::error::Error + 'static),
    trust: Option<&Trust>,
) -> Option<String> {
    use rustls::CertificateError as C;
    // A TLS server answers a plain request with a TLS alert, which is no
    // HTTP at all (hyper's words for it).
    if !is_https(server) && ebb_http::causes::innermost(error) == "invalid HTTP version parsed" {
        return Some(format!(
            "cannot connect to {server}: what answered is not HTTP; does it serve https:// instead?"
        ));
    }
    let tls = rustls_error(error)?;
    let cannot = format!("cannot verify the certificate of {server}");
    let trusted = trust.map_or_else(|| "the CA given".to_string(), |t| t.source.clone());
    Some(match tls {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            format!("{cannot}: it is not signed by {trusted} ({tls})")
        }
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
            "{cannot}: it is not valid for the host in that URL ({tls}); the server's --tls-san adds names"
        ),
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => format!("{cannot}: {tls} (compare the clocks of both hosts)"),
        rustls::Error::InvalidCertificate(_) => format!("{cannot}: {tls}"),
        rustls::Error::InvalidMessage(_) => format!(
            "cannot connect to {server}: what answered does not speak TLS ({tls}); does it serve plain \
             http:// instead?"
        ),
        _ => format!("{cannot}: the TLS handshake failed ({tls})"),
    })
}

/// The rustls error behind a failed request, if one is: in the chain of
/// causes, looking inside I/O errors too (the TLS stream reports its
/// errors wrapped in one, and an I/O error's `source` skips what it wraps).
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cause = match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// Why the CA could not be fetched for a fingerprint join.
#[derive(Debug)]
pub enum FetchError {
    /// The server could not be reached, or failed: trying again may help.
    Unreachable(String),
    /// What it handed out is not the CA the fingerprint names, or it has
    /// none: trying again will not help.
    Refused(String),
}

/// Fetches the CA certificate `server` hands out, without verifying the
/// connection, and returns it (PEM) only if its fingerprint is `expected`.
pub async fn fetch_ca(server: &str, expected: Fingerprint) -> Result<Vec<u8>, FetchError> {
    let server = server.trim_end_matches('/');
    let url = format!("{server}{CA_PATH}");
    // Unverified on purpose: what comes back is checked against the
    // fingerprint instead, and nothing else is sent or believed.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| FetchError::Refused(e.to_string()))?;
    let unreachable = |e: reqwest::Error| {
        let text = certificate_problem(server, &e, None).unwrap_or_else(|| in_words(&e));
        FetchError::Unreachable(format!("cannot fetch the CA from {url}: {text}"))
    };
    let resp = http.get(&url).send().await.map_err(unreachable)?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(unreachable)?;
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(FetchError::Refused(format!(
            "{server} hands out no CA ({url}: 404): it serves plain HTTP, or its certificate is the \
             operator's; give this agent --ca FILE instead of --ca-fingerprint"
        )));
    }
    if !status.is_success() {
        let text = format!("cannot fetch the CA from {url}: HTTP {}", status.as_u16());
        return Err(match status.is_server_error() {
            true => FetchError::Unreachable(text),
            false => FetchError::Refused(text),
        });
    }
    let certs = CertificateDer::pem_slice_iter(&body).collect::<Result<Vec<_>, _>>();
    let [cert] = certs.as_deref().unwrap_or_default() else {
        return Err(FetchError::Refused(format!("{url}: not one PEM certificate")));
    };
    let got = Fingerprint::of(cert);
    if got != expected {
        return Err(FetchError::Refused(format!(
            "--ca-fingerprint: the CA certificate {server} hands out has fingerprint {got}, not {expected}; \
             refusing to trust it (compare with the fingerprint the server printed at start: another \
             server, or something between this host and it, answered)"
        )));
    }
    Ok(body.to_vec())
}

/// The innermost cause in words, as the CLI says it: `connection refused`.
fn in_words(e: &(dyn std::error::Error + 'static)) -> String {
    let text = ebb_http::causes::innermost(e);
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    chars.next().map(|first| first.to_lowercase().chain(chars).collect()).unwrap_or_default()
}

/// Where an agent keeps the CA it fetched by fingerprint.
pub fn kept_ca_path(data_dir: &Path) -> PathBuf {
    data_dir.join("ca.crt")
}

/// Writes the fetched CA atomically (0644: a certificate is public).
pub(crate) fn keep_ca(path: &Path, pem: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
    file.write_all(pem)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// What an agent verifies its server with: `--ca FILE`; else, with
/// `--ca-fingerprint`, the CA kept from an earlier join if it is that one,
/// or the one the server hands out if it is (then kept); else the CA kept
/// from an earlier join. `None` for a plain `http://` server. The
/// operator's mistakes (a wrong fingerprint, no CA for an `https://`
/// server) are errors; a server that cannot be reached yet is waited for.
pub(crate) async fn agent_trust(
    server: &str,
    ca: Option<&Path>,
    fingerprint: Option<Fingerprint>,
    data_dir: &Path,
) -> Result<Option<Trust>, TrustError> {
    // The servers of one control plane (a comma-separated list) share a CA.
    let servers: Vec<&str> = server.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if servers.iter().any(|s| is_https(s)) && !servers.iter().all(|s| is_https(s)) {
        return Err(TrustError::Mixed(server.to_string()));
    }
    if !is_https(server) {
        return match (ca, fingerprint) {
            (None, None) => Ok(None),
            (Some(_), _) => Err(TrustError::CaOverHttp(server.to_string())),
            (_, Some(_)) => Err(TrustError::FingerprintOverHttp(server.to_string())),
        };
    }
    if let Some(path) = ca {
        return Trust::from_pem_file(path, "--ca").map(Some);
    }
    let kept_path = kept_ca_path(data_dir);
    let unreadable =
        |why: Box<dyn std::error::Error + Send + Sync>| TrustError::Kept { path: kept_path.clone(), why };
    let kept = match std::fs::read(&kept_path) {
        Ok(pem) => Some(
            Trust::from_pem(&pem, format!("the CA kept in {} at this node's join", kept_path.display()))
                .map_err(|e| unreadable(e.into()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(unreadable(e.into())),
    };
    let Some(expected) = fingerprint else {
        return kept.map(Some).ok_or_else(|| TrustError::NoCa(server.to_string()));
    };
    if let Some(kept) = kept.filter(|k| k.fingerprints() == [expected]) {
        tracing::info!(path = %kept_path.display(), "verifying the server with the CA kept at this node's join");
        return Ok(Some(kept));
    }
    let mut waits = crate::retry::REGISTRATION.delays();
    let pem = 'fetched: loop {
        for server in &servers {
            match fetch_ca(server, expected).await {
                Ok(pem) => break 'fetched pem,
                Err(FetchError::Refused(why)) => return Err(TrustError::Fetched(why)),
                Err(FetchError::Unreachable(why)) => tracing::warn!("{why}"),
            }
        }
        tokio::time::sleep(waits.next().unwrap_or(Duration::from_secs(3))).await;
    };
    let path = kept_path.clone();
    let kept = pem.clone();
    tokio::task::spawn_blocking(move || keep_ca(&path, &kept))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|source| TrustError::Keep { path: kept_path.clone(), source })?;
    tracing::info!(
        path = %kept_path.display(),
        fingerprint = %expected,
        "fetched the server's CA, checked its fingerprint and kept it: every connection is verified with it"
    );
    Trust::from_pem(&pem, format!("the CA kept in {} at this node's join", kept_path.display()))
        .map(Some)
        .map_err(|e| unreadable(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_as_the_server_prints_it_and_as_openssl_does() {
        let der = b"not really a certificate";
        let printed = Fingerprint::of(der).to_string();
        assert!(printed.starts_with("sha256:") && printed.len() == 7 + 64, "{printed}");
        assert_eq!(printed.parse::<Fingerprint>().unwrap(), Fingerprint::of(der));
        let openssl: String = printed[7..]
            .to_uppercase()
            .as_bytes()
            .chunks(2)
            .map(|p| std::str::from_utf8(p).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(format!("sha256:{openssl}").parse::<Fingerprint>().unwrap(), Fingerprint::of(der));
        for wrong in
            ["", "sha256:", "md5:00", &printed[7..], &printed[..70], &format!("{}zz", &printed[..69])]
        {
            let err = wrong.parse::<Fingerprint>().unwrap_err().to_string();
            assert!(err.contains("expected sha256: and 64 hex digits"), "{wrong:?}: {err}");
        }
    }

    /// As the TLS stream reports a failed handshake: an I/O error wrapping
    /// rustls's, itself wrapped (an I/O error's `source` skips what it
    /// wraps).
    fn failed_handshake(tls: rustls::Error) -> std::io::Error {
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        std::io::Error::other(inner)
    }

    #[test]
    fn a_certificate_that_fails_verification_is_said_in_words_naming_the_server_and_the_ca() {
        use rustls::CertificateError as C;
        let server = "https://10.0.0.1:7300";
        let trust = Trust { certs: Vec::new(), source: "the CA in ca.pem given with --ca".into() };
        let said = |tls: rustls::Error| {
            certificate_problem(server, &failed_handshake(tls), Some(&trust)).expect("a certificate problem")
        };
        let cannot = "cannot verify the certificate of https://10.0.0.1:7300: ";
        for (tls, why) in [
            (C::UnknownIssuer, "it is not signed by the CA in ca.pem given with --ca"),
            (C::BadSignature, "it is not signed by the CA in ca.pem given with --ca"),
            (C::NotValidForName, "it is not valid for the host in that URL"),
            (C::Expired, "invalid peer certificate: Expired (compare the clocks of both hosts)"),
        ] {
            let text = said(rustls::Error::InvalidCertificate(tls));
            assert!(text.starts_with(&format!("{cannot}{why}")), "{text}");
        }
        let text = said(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType));
        assert!(text.ends_with("does it serve plain http:// instead?"), "{text}");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(certificate_problem(server, &refused, Some(&trust)), None);
        assert_eq!(in_words(&std::io::Error::from_raw_os_error(111)), "connection refused");
    }

    /// A CA certificate (made with `openssl req -x509`) and its fingerprint
    /// as `openssl x509 -fingerprint -sha256` printed it.
    const FIXTURE_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBpzCCAU2gAwIBAgIUOiw+B8m5clc0eOM0dT+ftqNFGaYwCgYIKoZIzj0EAwIw
KDEMMAoGA1UECgwDRWJiMRgwFgYDVQQDDA90ZXN0IGZpeHR1cmUgQ0EwIBcNMjYx
MTMwMTM0MTQ5WhgPMjEyNjExMDYxMzQxNDlaMCgxDDAKBgNVBAoMA0ViYjEYMBYG
A1UEAwwPdGVzdCBmaXh0dXJlIENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
1dcd+upeCYR0Dn3BJjhslzazr16RZDMkp42VmuLuCefrNsegsHuQrJ0/rkfKsUGO
FjzfQkvE96D8HPAfllwNDaNTMFEwHQYDVR0OBBYEFHopwailLuCuPZn+R4xvlbhu
mvoRMB8GA1UdIwQYMBaAFHopwailLuCuPZn+R4xvlbhumvoRMA8GA1UdEwEB/wQF
MAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAI8aPPASVeanlfEhWRpNVjC9IX7gY50m
h9VNWqujxDcjAiB9lE9tGMCpRyNRrcpcBDlMDuAFte8Rry1BSPpX8c8UzQ==
-----END CERTIFICATE-----\n";
    const FIXTURE_FINGERPRINT: &str =
        "sha256:89:FA:C9:E0:DF:83:3D:15:F1:9B:11:B9:B0:AD:21:01:0B:AC:C4:66:04:70:58:FE:03:AF:52:B2:A6:54:AE:3F";

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-agent-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn an_agent_needs_a_ca_for_an_https_server_and_none_for_a_plain_one() {
        let dir = temp_dir("trust");
        let fingerprint: Fingerprint = FIXTURE_FINGERPRINT.parse().unwrap();
        let ca = dir.join("given.pem");
        std::fs::write(&ca, FIXTURE_CA).unwrap();
        assert!(agent_trust("http://10.0.0.1:7300", None, None, &dir).await.unwrap().is_none());
        let err = agent_trust("http://10.0.0.1:7300", Some(&ca), None, &dir).await.unwrap_err();
        assert!(matches!(&err, TrustError::CaOverHttp(s) if s == "http://10.0.0.1:7300"), "{err:?}");
        assert_eq!(
            err.to_string(),
            "--ca: the server http://10.0.0.1:7300 is plain HTTP; give its https:// URL"
        );
        let err =
            agent_trust("http://10.0.0.1:7300", None, Some(fingerprint), &dir).await.unwrap_err().to_string();
        assert!(err.starts_with("--ca-fingerprint: the server http://10.0.0.1:7300 is plain HTTP"), "{err}");
        let err = agent_trust("https://10.0.0.1:7300", None, None, &dir).await.unwrap_err().to_string();
        assert!(err.contains("pass --ca FILE") && err.contains("--ca-fingerprint sha256:HEX"), "{err}");

        let given = agent_trust("https://10.0.0.1:7300", Some(&ca), None, &dir).await.unwrap().unwrap();
        assert_eq!(given.fingerprints(), [fingerprint]);

        // A CA kept at an earlier join is used, with or without its
        // fingerprint, without asking the server (none is listening here).
        keep_ca(&kept_ca_path(&dir), FIXTURE_CA.as_bytes()).unwrap();
        for again in [Some(fingerprint), None] {
            let kept = agent_trust("https://127.0.0.1:9", None, again, &dir).await.unwrap().unwrap();
            assert_eq!(kept.fingerprints(), [fingerprint]);
            assert!(kept.source.starts_with("the CA kept in "), "{}", kept.source);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_naming_it() {
        let err = Trust::from_pem(b"hello", "x".into()).unwrap_err();
        assert!(matches!(err, PemError::Empty) && err.to_string().contains("no certificate"), "{err}");
        let missing = Path::new("/nonexistent/ca.pem");
        let err = Trust::from_pem_file(missing, "--ca").unwrap_err().to_string();
        assert!(err.starts_with("--ca /nonexistent/ca.pem: "), "{err}");
    }
}
