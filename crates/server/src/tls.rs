//! HTTPS for the API, so that agents on other hosts join safely.
//!
//! The server's certificate comes from files the operator gives
//! (`--tls-cert`, `--tls-key`), or is generated in the data directory
//! (`--tls-generate`): a CA (`ca.crt`, `ca.key`) made on the first start, or
//! the one found there, and a server certificate it signs (`tls.crt`,
//! `tls.key`) for the names agents and users reach the server by. Each
//! start re-issues the server certificate when those names changed, when it
//! is not the CA's, or when it is within 30 days of its end; the CA is
//! never replaced. Two servers of one control plane share a CA by copying
//! `ca.crt` and `ca.key` from one data directory to the other before the
//! second first starts.
//!
//! Agents that have no copy of the CA fetch it from `GET /v1/tls/ca.crt`
//! without verification and check it against the SHA-256 fingerprint the
//! operator gives them (`ebb agent --ca-fingerprint`), as `kubeadm join`
//! checks the cluster's CA hash; this module computes the fingerprint the
//! server prints at start.
//!
//! rustls with the `ring` provider, chosen explicitly (no process-wide
//! default), and `rcgen` for generation: pure Rust with ring's small C and
//! assembly core, no OpenSSL, no cmake.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// How the server speaks to its clients.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsConfig {
    /// Plain HTTP (the default; `ebb up` on loopback).
    #[default]
    Off,
    /// HTTPS with the operator's certificate (a chain is fine) and key,
    /// PEM. A `ca.crt` in the data directory, if there is one, is served
    /// to joining agents.
    Files { cert: PathBuf, key: PathBuf },
    /// HTTPS with a certificate generated in the data directory, valid for
    /// the listen address, `localhost`, 127.0.0.1, the host name and these
    /// names or addresses.
    Generate { extra_names: Vec<String> },
}

/// The CA certificate the server hands to joining agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownCa {
    pub pem: String,
    /// `sha256:` and the SHA-256 of the certificate's DER, in hex.
    pub fingerprint: String,
}

/// Why HTTPS could not be set up at start: the file (with the flag that
/// named it, where the operator gave it) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or written.
    #[error("{file}: {source}")]
    File { file: String, source: std::io::Error },
    /// What a file holds is not what it should be.
    #[error("{file}: {what}{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Content { file: String, what: &'static str, source: Option<Box<dyn std::error::Error + Send + Sync>> },
    #[error(
        "{} is there without {}: copy both from the server whose CA this is, or remove it to make a new CA",
        there.display(),
        missing.display()
    )]
    HalfCa { there: PathBuf, missing: PathBuf },
    #[error("{} is not the key of {}", key.display(), cert.display())]
    NotItsKey { key: PathBuf, cert: PathBuf },
    #[error("--tls-san {0:?}: not an IP address or a DNS name")]
    Name(String),
    /// A key or certificate could not be made.
    #[error("cannot {what}: {source}")]
    Generate { what: &'static str, source: rcgen::Error },
    #[error("TLS: {0}")]
    Config(rustls::Error),
    #[error("TLS: the certificate and key do not go together: {0}")]
    Pair(rustls::Error),
}

/// A file error of `path`'s, named by `flag` where the operator gave it.
fn file_error(flag: Option<&str>, path: &Path) -> impl FnOnce(std::io::Error) -> TlsError {
    let file = shown(flag, path);
    move |source| TlsError::File { file, source }
}

fn content(
    flag: Option<&str>,
    path: &Path,
    what: &'static str,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> TlsError {
    let file = shown(flag, path);
    move |source| TlsError::Content { file, what, source: Some(source) }
}

/// `--flag path`, or the path.
fn shown(flag: Option<&str>, path: &Path) -> String {
    match flag {
        Some(flag) => format!("{flag} {}", path.display()),
        None => path.display().to_string(),
    }
}

/// What HTTPS needs at run time, and what preparing it did.
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    pub ca: Option<KnownCa>,
    /// Files written at this start (a new CA, a re-issued certificate).
    pub written: Vec<PathBuf>,
    /// The names a generated certificate is valid for.
    pub names: BTreeSet<String>,
}

/// The files `--tls-generate` keeps in the data directory.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const SERVER_CERT: &str = "tls.crt";
pub const SERVER_KEY: &str = "tls.key";

/// How long a generated CA and server certificate are valid. A server
/// certificate is re-issued at a start within `RENEW_BEFORE` of its end.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);
const SERVER_VALIDITY: Duration = Duration::from_secs(2 * 365 * 86_400);
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);
/// Certificates start a day in the past: a host whose clock is behind the
/// server's still accepts one issued a moment ago.
const BACKDATE: Duration = Duration::from_secs(86_400);

/// `sha256:` and the hex SHA-256 of a certificate's DER: what `openssl x509
/// -fingerprint -sha256` prints, without the colons.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", ebb_api::hex(&Sha256::digest(der)))
}

impl ServerTls {
    /// Loads or generates what `tls` asks for; `None` for plain HTTP.
    /// Blocking (files and key generation), at start only.
    pub fn prepare(
        tls: &TlsConfig,
        data_dir: &Path,
        listen: SocketAddr,
    ) -> Result<Option<ServerTls>, TlsError> {
        match tls {
            TlsConfig::Off => Ok(None),
            TlsConfig::Files { cert, key } => {
                let chain = read_chain(cert, "--tls-cert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| content(Some("--tls-key"), key, "no private key in PEM")(e.into()))?;
                let ca_path = data_dir.join(CA_CERT);
                let ca = match std::fs::read(&ca_path) {
                    Ok(pem) => Some(known_ca(&pem, &ca_path)?),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(file_error(None, &ca_path)(e)),
                };
                let config = server_config(chain, key)?;
                Ok(Some(ServerTls { config, ca, written: Vec::new(), names: BTreeSet::new() }))
            }
            TlsConfig::Generate { extra_names } => {
                let names = names(listen, extra_names, host_name().as_deref())?;
                let mut written = Vec::new();
                let (issuer, ca) = ca(data_dir, &mut written)?;
                let cert_path = data_dir.join(SERVER_CERT);
                let key_path = data_dir.join(SERVER_KEY);
                if !server_cert_current(&cert_path, &key_path, &ca, &names)? {
                    issue_server_cert(&issuer, &names, &cert_path, &key_path)?;
                    written.extend([key_path.clone(), cert_path.clone()]);
                }
                private_key_mode(&key_path)?;
                let chain = read_chain(&cert_path, "--tls-generate")?;
                let key = PrivateKeyDer::from_pem_file(&key_path)
                    .map_err(|e| content(None, &key_path, "no private key in PEM")(e.into()))?;
                Ok(Some(ServerTls { config: server_config(chain, key)?, ca: Some(ca), written, names }))
            }
        }
    }

    /// What the server tells the operator at start, a line each, once it
    /// listens: how agents on other hosts verify it, and by which names
    /// they may reach it.
    pub fn join_hint(&self, data_dir: &Path) -> Vec<String> {
        let mut lines = vec![match &self.ca {
            Some(ca) => format!(
                "agents join with --ca-fingerprint {} (and the join token in {}), or --ca {}",
                ca.fingerprint,
                data_dir.join("join.token").display(),
                data_dir.join(CA_CERT).display()
            ),
            None => {
                "agents and the CLI verify this server with --ca FILE, the CA that signed --tls-cert".into()
            }
        }];
        if !self.names.is_empty() {
            let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
            lines.push(format!(
                "its certificate is valid for {}; reach it by one of these (--tls-san adds names)",
                names.join(", ")
            ));
        }
        lines
    }
}

/// The certificates of a PEM file, leaf first.
fn read_chain(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| match e {
            rustls_pki_types::pem::Error::Io(e) => file_error(Some(flag), path)(e),
            e => TlsError::Content { file: shown(Some(flag), path), what: "not PEM", source: Some(e.into()) },
        })?;
    if chain.is_empty() {
        let file = shown(Some(flag), path);
        return Err(TlsError::Content { file, what: "no certificate in it (PEM expected)", source: None });
    }
    Ok(chain)
}

fn known_ca(pem: &[u8], path: &Path) -> Result<KnownCa, TlsError> {
    let der = CertificateDer::from_pem_slice(pem)
        .map_err(|e| content(None, path, "not a PEM certificate")(e.into()))?;
    let pem = String::from_utf8(pem.to_vec()).map_err(|e| content(None, path, "not PEM text")(e.into()))?;
    Ok(KnownCa { pem, fingerprint: fingerprint(&der) })
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Pair)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn host_name() -> Option<String> {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok())
}

/// The names a generated certificate is valid for, each once, in order:
/// IP addresses as `IpAddr` prints them, DNS names in lower case.
pub fn names(listen: SocketAddr, extra: &[String], host: Option<&str>) -> Result<BTreeSet<String>, TlsError> {
    let mut names = BTreeSet::from(["localhost".to_string(), "127.0.0.1".to_string()]);
    if !listen.ip().is_unspecified() {
        names.insert(listen.ip().to_string());
    }
    if let Some(host) = host.filter(|h| is_dns_name(h)) {
        names.insert(host.to_ascii_lowercase());
    }
    for name in extra {
        let name = name.trim();
        if let Ok(ip) = name.parse::<IpAddr>() {
            names.insert(ip.to_string());
        } else if is_dns_name(name) {
            names.insert(name.to_ascii_lowercase());
        } else {
            return Err(TlsError::Name(name.to_string()));
        }
    }
    Ok(names)
}

/// A host name a certificate can name: dot-separated labels of letters,
/// digits and hyphens (the first may be `*`).
fn is_dns_name(name: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let mut labels = name.split('.');
    let first = labels.next().unwrap_or("");
    name.len() <= 253
        && (first == "*" || label(first))
        && labels.all(label)
        && name.parse::<IpAddr>().is_err()
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// The data directory's CA: the one there, or a new one. Both files or
/// neither: a lone `ca.key` or `ca.crt` is the operator's half-done copy.
fn ca(dir: &Path, written: &mut Vec<PathBuf>) -> Result<(Issuer<'static, KeyPair>, KnownCa), TlsError> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            private_key_mode(&key_path)?;
            let pem = std::fs::read(&cert_path).map_err(file_error(None, &cert_path))?;
            let ca = known_ca(&pem, &cert_path)?;
            let key_pem = std::fs::read_to_string(&key_path).map_err(file_error(None, &key_path))?;
            let key = KeyPair::from_pem(&key_pem).map_err(|e| {
                content(None, &key_path, "not a private key this server can sign with")(e.into())
            })?;
            let der = CertificateDer::from_pem_slice(&pem)
                .map_err(|e| content(None, &cert_path, "not a PEM certificate")(e.into()))?;
            let (_, parsed) = x509_parser::parse_x509_certificate(&der)
                .map_err(|e| content(None, &cert_path, "not an X.509 certificate")(e.to_string().into()))?;
            if parsed.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
                return Err(TlsError::NotItsKey { key: key_path, cert: cert_path });
            }
            let issuer = Issuer::from_ca_cert_der(&der, key)
                .map_err(|e| content(None, &cert_path, "cannot issue certificates with it")(e.into()))?;
            Ok((issuer, ca))
        }
        (false, false) => {
            let key = KeyPair::generate()
                .map_err(|source| TlsError::Generate { what: "generate the CA's key", source })?;
            let mut params = CertificateParams::default();
            let mut dn = DistinguishedName::new();
            dn.push(DnType::OrganizationName, "Ebb");
            dn.push(DnType::CommonName, format!("Ebb CA {}", host_name().unwrap_or_default()).trim());
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = now() - BACKDATE;
            params.not_after = now() + CA_VALIDITY;
            let cert = params
                .self_signed(&key)
                .map_err(|source| TlsError::Generate { what: "make the CA certificate", source })?;
            // The key first: a start interrupted between the two leaves a
            // lone key, which the next start refuses rather than replaces.
            write_private(&key_path, key.serialize_pem().as_bytes())?;
            write_private(&cert_path, cert.pem().as_bytes())?;
            written.extend([key_path, cert_path]);
            let ca = KnownCa { pem: cert.pem(), fingerprint: fingerprint(cert.der()) };
            Ok((Issuer::new(params, key), ca))
        }
        (true, false) => Err(TlsError::HalfCa { there: cert_path, missing: key_path }),
        (false, true) => Err(TlsError::HalfCa { there: key_path, missing: cert_path }),
    }
}

/// Whether the server certificate there can be kept: it and its key go
/// together, it is signed by the CA, names exactly `names`, and is not
/// within `RENEW_BEFORE` of its end.
fn server_cert_current(
    cert_path: &Path,
    key_path: &Path,
    ca: &KnownCa,
    names: &BTreeSet<String>,
) -> Result<bool, TlsError> {
    let (Ok(pem), Ok(key_pem)) = (std::fs::read(cert_path), std::fs::read_to_string(key_path)) else {
        return Ok(false);
    };
    let (Ok(der), Ok(ca_der), Ok(key)) = (
        CertificateDer::from_pem_slice(&pem),
        CertificateDer::from_pem_slice(ca.pem.as_bytes()),
        KeyPair::from_pem(&key_pem),
    ) else {
        return Ok(false);
    };
    let (Ok((_, cert)), Ok((_, ca_cert))) =
        (x509_parser::parse_x509_certificate(&der), x509_parser::parse_x509_certificate(&ca_der))
    else {
        return Ok(false);
    };
    let renew_at = (now() + RENEW_BEFORE).unix_timestamp();
    Ok(cert.public_key().subject_public_key.data.as_ref() == key.der_bytes()
        && cert.verify_signature(Some(ca_cert.public_key())).is_ok()
        && cert.validity().not_after.timestamp() > renew_at
        && cert_names(&cert) == *names)
}

/// The names a certificate is valid for, as [`names`] writes them.
pub fn cert_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> BTreeSet<String> {
    use x509_parser::extensions::GeneralName;
    let Ok(Some(san)) = cert.subject_alternative_name() else { return BTreeSet::new() };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
            GeneralName::IPAddress(&[a, b, c, d]) => Some(IpAddr::from([a, b, c, d]).to_string()),
            GeneralName::IPAddress(bytes) => {
                <[u8; 16]>::try_from(*bytes).ok().map(|octets| IpAddr::from(octets).to_string())
            }
            _ => None,
        })
        .collect()
}

fn issue_server_cert(
    issuer: &Issuer<'_, KeyPair>,
    names: &BTreeSet<String>,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), TlsError> {
    let key = KeyPair::generate()
        .map_err(|source| TlsError::Generate { what: "generate the server's key", source })?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = names
        .iter()
        .map(|name| match name.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => name.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Generate { what: "name the server certificate (--tls-san)", source })?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Ebb");
    dn.push(
        DnType::CommonName,
        host_name().filter(|h| is_dns_name(h)).unwrap_or_else(|| "ebb server".into()),
    );
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now() - BACKDATE;
    params.not_after = now() + SERVER_VALIDITY;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|source| TlsError::Generate { what: "issue the server certificate", source })?;
    write_private(key_path, key.serialize_pem().as_bytes())?;
    write_private(cert_path, cert.pem().as_bytes())
}

/// Writes a file readable by the server's user alone, whole or not at all.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(file_error(None, path))
}

/// A private key in the data directory is the server's alone (0600), as
/// every file there is.
fn private_key_mode(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(file_error(None, path))
}

/// Handshakes in progress at once; more connections wait to be accepted.
const MAX_HANDSHAKES: usize = 1024;
/// A client that has not finished its handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown`, over TLS when `tls` is
/// given, else plain HTTP.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<&ServerTls>,
    connections: ebb_http::Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Each connection shares the router's routes (an `Arc`): served as a
    // plain `Router` by `axum::serve`, axum made them again for every
    // connection (about 26 KB each, held as long as the connection:
    // 10,000 agents' long polls held 265 MB of routers).
    match tls {
        None => ebb_http::serve(listener, router, connections, shutdown).await,
        Some(tls) => {
            let listener = TlsListener::new(listener, tls.config.clone())?;
            ebb_http::serve(listener, router, connections, shutdown).await
        }
    }
    Ok(())
}

/// Connections whose TLS handshake has completed. Handshakes run side by
/// side, each on its own task with a deadline, so a client that connects
/// and says nothing holds up no one.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `tcp` from now on, until the listener is dropped.
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
                let accepted = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = tcp.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        accept_error(e).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            drop(permit);
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => {
                            tracing::info!(%peer, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}")
                        }
                    }
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

/// As axum does for a plain listener: an error that concerns one
/// connection is passed over; one of the process (out of descriptors) is
/// logged and waited out.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::error!("accept: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task is gone only once this listener is.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::{ServerName, UnixTime};

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn generate(dir: &Path, extra: &[&str]) -> Result<ServerTls, TlsError> {
        let config = TlsConfig::Generate { extra_names: extra.iter().map(|n| n.to_string()).collect() };
        ServerTls::prepare(&config, dir, "10.213.0.1:7300".parse().unwrap()).map(Option::unwrap)
    }

    fn read(path: PathBuf) -> Vec<u8> {
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Whether `cert` (PEM) verifies for `name`, now, with `ca` (PEM) as
    /// the only root: what an agent's connection checks.
    fn verify(ca: &[u8], cert: &[u8], name: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca).unwrap()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert).unwrap();
        let name = ServerName::try_from(name.to_string()).unwrap();
        verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now()).map(|_| ())
    }

    fn names_in(cert_pem: &[u8]) -> BTreeSet<String> {
        let der = CertificateDer::from_pem_slice(cert_pem).unwrap();
        cert_names(&x509_parser::parse_x509_certificate(&der).unwrap().1)
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_generated_certificate_names_every_address_is_signed_by_the_ca_and_its_keys_are_private() {
        let dir = dir("generate");
        let tls = generate(&dir, &["Ebb.Example.org", "10.9.8.7", "::1"]).unwrap();
        let mut expected =
            set(&["localhost", "127.0.0.1", "10.213.0.1", "ebb.example.org", "10.9.8.7", "::1"]);
        expected.extend(host_name().filter(|h| is_dns_name(h)).map(|h| h.to_ascii_lowercase()));
        let (ca, cert) = (read(dir.join(CA_CERT)), read(dir.join(SERVER_CERT)));
        assert_eq!(names_in(&cert), expected);
        assert_eq!(tls.names, expected);
        let hint = tls.join_hint(&dir);
        assert!(
            hint[1].starts_with("its certificate is valid for 10.213.0.1, 10.9.8.7, 127.0.0.1, ::1, "),
            "{hint:?}"
        );
        for name in &expected {
            verify(&ca, &cert, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(verify(&ca, &cert, "other.example.org").is_err());
        for file in [CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY] {
            let mode = std::fs::metadata(dir.join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file}");
        }
        let written: Vec<_> = tls.written.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(written, [CA_KEY, CA_CERT, SERVER_KEY, SERVER_CERT]);
        let known = tls.ca.unwrap();
        assert_eq!(known.pem.as_bytes(), ca);
        assert_eq!(known.fingerprint, fingerprint(&CertificateDer::from_pem_slice(&ca).unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_later_start_keeps_the_ca_and_certificate_and_reissues_the_certificate_when_its_names_change() {
        let dir = dir("reuse");
        generate(&dir, &["a.example.org"]).unwrap();
        let (ca, ca_key, cert) =
            (read(dir.join(CA_CERT)), read(dir.join(CA_KEY)), read(dir.join(SERVER_CERT)));
        let again = generate(&dir, &["a.example.org"]).unwrap();
        assert!(again.written.is_empty(), "{:?}", again.written);
        assert_eq!(read(dir.join(SERVER_CERT)), cert);

        // A name added, then one taken away: a new certificate each time,
        // from the same CA.
        let added = generate(&dir, &["a.example.org", "b.example.org"]).unwrap();
        assert_eq!(added.written, [dir.join(SERVER_KEY), dir.join(SERVER_CERT)]);
        let cert = read(dir.join(SERVER_CERT));
        assert!(names_in(&cert).contains("b.example.org"));
        verify(&ca, &cert, "b.example.org").unwrap();
        generate(&dir, &["b.example.org"]).unwrap();
        assert!(!names_in(&read(dir.join(SERVER_CERT))).contains("a.example.org"));
        assert_eq!((read(dir.join(CA_CERT)), read(dir.join(CA_KEY))), (ca, ca_key));

        // A key too open is made private again.
        std::fs::set_permissions(dir.join(CA_KEY), std::fs::Permissions::from_mode(0o644)).unwrap();
        generate(&dir, &["b.example.org"]).unwrap();
        assert_eq!(std::fs::metadata(dir.join(CA_KEY)).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ca_copied_from_another_server_signs_this_servers_certificate() {
        let (first, second) = (dir("ca-first"), dir("ca-second"));
        let tls_first = generate(&first, &[]).unwrap();
        for file in [CA_CERT, CA_KEY] {
            std::fs::copy(first.join(file), second.join(file)).unwrap();
        }
        let tls_second = generate(&second, &["second.example.org"]).unwrap();
        assert_eq!(tls_second.written, [second.join(SERVER_KEY), second.join(SERVER_CERT)]);
        assert_eq!(tls_second.ca.unwrap().fingerprint, tls_first.ca.unwrap().fingerprint);
        verify(&read(first.join(CA_CERT)), &read(second.join(SERVER_CERT)), "second.example.org").unwrap();

        // The first server's certificate put in the second's directory is
        // replaced: it does not name what the second is reached by.
        let third = dir("ca-third");
        generate(&third, &[]).unwrap();
        for file in [SERVER_CERT, SERVER_KEY] {
            std::fs::copy(third.join(file), first.join(file)).unwrap();
        }
        let reissued = generate(&first, &[]).unwrap();
        assert_eq!(
            reissued.written,
            [first.join(SERVER_KEY), first.join(SERVER_CERT)],
            "not the CA's: re-issued"
        );
        verify(&read(first.join(CA_CERT)), &read(first.join(SERVER_CERT)), "localhost").unwrap();
        for dir in [first, second, third] {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn half_a_ca_or_a_key_of_another_ca_is_refused_naming_the_files() {
        let (one, other) = (dir("half-one"), dir("half-other"));
        generate(&one, &[]).unwrap();
        generate(&other, &[]).unwrap();
        std::fs::remove_file(one.join(CA_CERT)).unwrap();
        let err = generate(&one, &[]).err().unwrap();
        assert!(matches!(&err, TlsError::HalfCa { there, .. } if there.ends_with("ca.key")), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("ca.key is there without") && err.contains("ca.crt"), "{err}");
        std::fs::copy(other.join(CA_CERT), one.join(CA_CERT)).unwrap();
        let err = generate(&one, &[]).err().unwrap().to_string();
        assert!(
            err.ends_with(&format!(
                "{} is not the key of {}",
                one.join(CA_KEY).display(),
                one.join(CA_CERT).display()
            )),
            "{err}"
        );
        for dir in [one, other] {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn the_names_are_the_listen_address_loopback_the_host_and_each_one_given() {
        let listen = |addr: &str| addr.parse::<SocketAddr>().unwrap();
        let got =
            names(listen("0.0.0.0:7300"), &["node.example.org".into(), "10.0.0.5".into()], Some("Gpu-01"))
                .unwrap();
        assert_eq!(got, set(&["localhost", "127.0.0.1", "gpu-01", "node.example.org", "10.0.0.5"]));
        let got = names(listen("[fd00::1]:7300"), &[], Some("not a host name")).unwrap();
        assert_eq!(got, set(&["localhost", "127.0.0.1", "fd00::1"]));
        for bad in ["under_score.example.org", "a..b", "-a.example.org", "http://x"] {
            let err = names(listen("127.0.0.1:1"), &[bad.to_string()], None).unwrap_err();
            assert!(matches!(&err, TlsError::Name(name) if name == bad), "{err:?}");
            assert_eq!(err.to_string(), format!("--tls-san {bad:?}: not an IP address or a DNS name"));
        }
    }

    #[test]
    fn the_operators_files_are_read_and_a_missing_one_is_named_with_its_flag() {
        let dir = dir("files");
        let generated = self::dir("files-generated");
        generate(&generated, &[]).unwrap();
        let files =
            |cert: &str, key: &str| TlsConfig::Files { cert: generated.join(cert), key: generated.join(key) };
        let listen = "127.0.0.1:0".parse().unwrap();
        let tls = ServerTls::prepare(&files(SERVER_CERT, SERVER_KEY), &dir, listen).unwrap().unwrap();
        assert!(tls.ca.is_none() && tls.written.is_empty());
        assert!(tls.join_hint(&dir)[0].contains("--ca FILE"));
        // Its CA put in the data dir is handed to joining agents.
        std::fs::copy(generated.join(CA_CERT), dir.join(CA_CERT)).unwrap();
        let tls = ServerTls::prepare(&files(SERVER_CERT, SERVER_KEY), &dir, listen).unwrap().unwrap();
        assert!(tls.join_hint(&dir)[0].contains(&tls.ca.unwrap().fingerprint));
        let err = ServerTls::prepare(&files("missing.crt", SERVER_KEY), &dir, listen).err().unwrap();
        assert!(matches!(err, TlsError::File { .. }), "{err:?}");
        let err = err.to_string();
        assert!(
            err.starts_with(&format!("--tls-cert {}: ", generated.join("missing.crt").display())),
            "{err}"
        );
        let err = ServerTls::prepare(&files(SERVER_CERT, CA_KEY), &dir, listen).err().unwrap();
        assert!(matches!(err, TlsError::Pair(_)) && err.to_string().contains("do not go together"), "{err}");
        for dir in [dir, generated] {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
