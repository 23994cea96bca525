//! TLS to PostgreSQL, as libpq's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` mean it, over rustls (`tokio-postgres-rustls`, with the `ring`
//! provider the rest of the server uses).
//!
//! The `postgres` crate knows `sslmode` as `disable`, `prefer` and
//! `require` only, and none of the files; an operator writes the string
//! they would give `psql`. So these options are taken out of the
//! connection string here (a `postgres://` URL's query, or a key-value
//! string), the rest is parsed by `postgres`, and the connector does what
//! the mode asks:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow`, `prefer` (the default) | if the server offers it | not checked (as libpq) |
//! | `require` | always | not checked, unless `sslrootcert` is given: then as `verify-ca` (as libpq) |
//! | `verify-ca` | always | signed by the CA in `sslrootcert` |
//! | `verify-full` | always | signed by that CA, and valid for the host connected to |
//!
//! The verify modes need `sslrootcert=FILE` (PEM); libpq's default file
//! (`~/.postgresql/root.crt`) and `system` are not read. A unix-socket
//! host never uses TLS (PostgreSQL offers none there).
//!
//! `sslcert` and `sslkey` (PEM, both or neither) are the client's own
//! certificate and key, for a server that asks for one (`pg_hba.conf`'s
//! `cert` method, or `clientcert=verify-ca`/`verify-full`); as with libpq,
//! a key file must not be readable by group or others, unless root owns
//! it and only its group may read it. libpq's default files
//! (`~/.postgresql/postgresql.crt`, `.key`) are not read.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use postgres::config::SslMode as PgSslMode;
use postgres::{Client, Config, NoTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Why a connection string's TLS options cannot be used, or the database
/// not reached. Never repeats the string (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("sslmode={0:?} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    Mode(String),
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("sslcert needs sslkey=FILE: the key of the client's certificate")]
    CertWithoutKey,
    #[error("sslkey needs sslcert=FILE: the client's certificate")]
    KeyWithoutCert,
    #[error("sslcert and sslkey need TLS, and sslmode=disable turns it off")]
    ClientWithoutTls,
    #[error("sslmode={0} needs sslrootcert=FILE: the CA (PEM) that signed the server's certificate")]
    NoRoot(&'static str),
    /// The connection string's syntax, or what postgres makes of it.
    #[error("the connection string: {0}")]
    Syntax(String),
    /// A file an option names (`sslrootcert`, `sslcert`, `sslkey`).
    #[error("{option} {}: {why}", path.display())]
    File { option: &'static str, path: PathBuf, why: Box<dyn std::error::Error + Send + Sync> },
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    #[error("sslcert {} and sslkey {}: {source}", cert.display(), key.display())]
    ClientAuth { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("cannot connect to PostgreSQL: {words}{hint}")]
    Connect { words: String, hint: &'static str },
}

/// The error of a file `option` names.
fn file_error(
    option: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> TargetError {
    let path = path.to_path_buf();
    move |why| TargetError::File { option, path, why }
}

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, TargetError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries without TLS first; here it is `prefer`.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(TargetError::Mode(other.to_string())),
        })
    }
}

/// A connection string taken apart: what `postgres` parses, and the TLS
/// options it does not know.
#[derive(Debug)]
pub struct Target {
    pub config: Config,
    pub mode: SslMode,
    pub root: Option<PathBuf>,
    /// The client's certificate chain and key (`sslcert`, `sslkey`).
    pub client: Option<(PathBuf, PathBuf)>,
}

impl Target {
    /// Parses `url` (`postgres://…?sslmode=…&sslrootcert=…`, or
    /// `host=… sslmode=… sslrootcert=…`). The error names what was wrong
    /// and never repeats the string (it may hold a password).
    pub fn parse(url: &str) -> Result<Target, TargetError> {
        let (rest, options) = take_tls_options(url)?;
        let mut mode = SslMode::Prefer;
        let (mut root, mut cert, mut key_file) = (None, None, None);
        for (key, value) in options {
            if key != TlsKey::Mode && value.is_empty() {
                return Err(TargetError::Empty(key.name()));
            }
            match key {
                TlsKey::Mode => mode = value.parse()?,
                TlsKey::RootCert => root = Some(PathBuf::from(value)),
                TlsKey::Cert => cert = Some(PathBuf::from(value)),
                TlsKey::Key => key_file = Some(PathBuf::from(value)),
            }
        }
        let client = match (cert, key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => return Err(TargetError::CertWithoutKey),
            (None, Some(_)) => return Err(TargetError::KeyWithoutCert),
        };
        if client.is_some() && mode == SslMode::Disable {
            return Err(TargetError::ClientWithoutTls);
        }
        if root.is_none() && matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
            let name = if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" };
            return Err(TargetError::NoRoot(name));
        }
        let mut config =
            Config::from_str(&rest).map_err(|e| TargetError::Syntax(ebb_http::causes::chain(&e)))?;
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        });
        Ok(Target { config, mode, root, client })
    }

    /// The rustls configuration for this mode; `None` for `disable`.
    pub fn client_config(&self) -> Result<Option<rustls::ClientConfig>, TargetError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TargetError::Tls)?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, &self.root) {
            (SslMode::Disable, _) => return Ok(None),
            (SslMode::Prefer, _) | (SslMode::Require, None) => Arc::new(Unchecked(provider)),
            (_, None) => unreachable!("parse refuses a verify mode without sslrootcert"),
            (mode, Some(root)) => {
                let mut roots = rustls::RootCertStore::empty();
                let refused =
                    |why: Box<dyn std::error::Error + Send + Sync>| file_error("sslrootcert", root)(why);
                let certs = CertificateDer::pem_file_iter(root).map_err(|e| refused(e.into()))?;
                for cert in certs {
                    let cert = cert.map_err(|e| refused(e.into()))?;
                    roots.add(cert).map_err(|e| refused(e.into()))?;
                }
                if roots.is_empty() {
                    return Err(refused("no certificate in it".into()));
                }
                let webpki =
                    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| refused(e.into()))?;
                if mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(AnyName(webpki))
                }
            }
        };
        let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
        let Some((cert_file, key_file)) = &self.client else {
            return Ok(Some(builder.with_no_client_auth()));
        };
        let (chain, key) = client_identity(cert_file, key_file)?;
        builder.with_client_auth_cert(chain, key).map(Some).map_err(|source| TargetError::ClientAuth {
            cert: cert_file.clone(),
            key: key_file.clone(),
            source,
        })
    }

    /// Connects as the mode asks.
    pub fn connect(&self) -> Result<Client, TargetError> {
        let connected = match self.client_config()? {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(MakeRustlsConnect::new(tls)),
        };
        connected.map_err(|e| {
            let words = ebb_http::causes::chain(&e);
            // The database's alert alone does not say it was about the
            // certificate this side sent.
            let hint = if self.client.is_some() && words.contains("received fatal alert: UnknownCA") {
                " (the database refused the client certificate: the CA that signed it is not in the \
                 database's ssl_ca_file)"
            } else {
                ""
            };
            TargetError::Connect { words, hint }
        })
    }
}

/// The client's certificate chain and private key, from PEM files; the
/// key refused where others may read it (libpq's rule).
fn client_identity(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TargetError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error("sslcert", cert)(e.into()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error("sslcert", cert)(e.into()))?;
    if chain.is_empty() {
        return Err(file_error("sslcert", cert)("no certificate in it".into()));
    }
    let meta = std::fs::metadata(key).map_err(|e| file_error("sslkey", key)(e.into()))?;
    key_file_private(meta.mode(), meta.uid()).map_err(|why| file_error("sslkey", key)(why.into()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("sslkey", key)(e.into()))?;
    Ok((chain, key))
}

/// libpq's rule for a client key file: owned by anyone but root, no
/// access for group or others (0600 at most); owned by root, read by its
/// group at most (0640), so that a group the server's user is in may hold
/// it.
fn key_file_private(mode: u32, owner: u32) -> Result<(), KeyOpen> {
    let (limit, allowed) = if owner == 0 { (0o037, "u=rw,g=r (0640)") } else { (0o077, "u=rw (0600)") };
    if mode & limit != 0 {
        return Err(KeyOpen { mode: mode & 0o7777, allowed });
    }
    Ok(())
}

/// A client key file others than its owner may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("its permissions are {mode:04o}, open to others than its owner; allow at most {allowed}")]
struct KeyOpen {
    mode: u32,
    allowed: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsKey {
    Mode,
    RootCert,
    Cert,
    Key,
}

impl TlsKey {
    fn of(key: &str) -> Option<TlsKey> {
        match key {
            "sslmode" => Some(TlsKey::Mode),
            "sslrootcert" => Some(TlsKey::RootCert),
            "sslcert" => Some(TlsKey::Cert),
            "sslkey" => Some(TlsKey::Key),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TlsKey::Mode => "sslmode",
            TlsKey::RootCert => "sslrootcert",
            TlsKey::Cert => "sslcert",
            TlsKey::Key => "sslkey",
        }
    }
}

/// The connection string without the TLS options, and their
/// values in the order written (a later one wins, as in libpq).
fn take_tls_options(url: &str) -> Result<(String, Vec<(TlsKey, String)>), TargetError> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if is_url {
        let Some((head, query)) = url.split_once('?') else { return Ok((url.to_string(), Vec::new())) };
        let (mut kept, mut taken) = (Vec::new(), Vec::new());
        for pair in query.split('&') {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            match TlsKey::of(&percent_decode(key)?) {
                Some(k) => {
                    let value = pair.split_once('=').map_or("", |(_, v)| v);
                    taken.push((k, percent_decode(value)?));
                }
                None => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() { head.to_string() } else { format!("{head}?{}", kept.join("&")) };
        return Ok((rest, taken));
    }
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    for pair in key_values(url)? {
        match TlsKey::of(&pair.key) {
            Some(k) => taken.push((k, pair.value)),
            None => kept.push(&url[pair.span.0..pair.span.1]),
        }
    }
    Ok((kept.join(" "), taken))
}

struct Pair {
    key: String,
    value: String,
    /// Where the pair was in the string, as written.
    span: (usize, usize),
}

/// libpq's key-value form: `key = value` pairs apart by spaces; a value
/// in single quotes may hold spaces; a backslash escapes the next
/// character, in quotes or not.
fn key_values(s: &str) -> Result<Vec<Pair>, TargetError> {
    let mut pairs = Vec::new();
    let mut chars = s.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else { return Ok(pairs) };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            return Err(TargetError::Syntax(format!("{key:?} has no `=` and value")));
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let end = loop {
            match chars.next() {
                None if quoted => {
                    return Err(TargetError::Syntax(format!("{key}'s value has no closing quote")))
                }
                None => break s.len(),
                Some((_, '\\')) => match chars.next() {
                    Some((_, c)) => value.push(c),
                    None => return Err(TargetError::Syntax(format!("{key}'s value ends in a backslash"))),
                },
                Some((i, '\'')) if quoted => break i + 1,
                Some((i, c)) if !quoted && c.is_whitespace() => break i,
                Some((_, c)) => value.push(c),
            }
        };
        pairs.push(Pair { key, value, span: (start, end) });
    }
}

fn percent_decode(s: &str) -> Result<String, TargetError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                return Err(TargetError::Syntax("a `%` not followed by two hex digits".into()));
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| TargetError::Syntax("a %-escape that is not UTF-8".into()))
}

/// `require` without a CA: the channel is encrypted and the handshake's
/// signatures checked, the certificate is not (libpq's `require`).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain to the CA is checked, the name is not.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(leaf, intermediates, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn taken(url: &str) -> (String, Vec<(TlsKey, String)>) {
        take_tls_options(url).unwrap()
    }

    #[test]
    fn the_tls_options_leave_a_key_value_string_and_the_rest_is_kept_as_written() {
        let (rest, opts) =
            taken("host=db.example.org sslmode = verify-full  user=ebb sslrootcert='/etc/ebb/my ca.pem'");
        assert_eq!(rest, "host=db.example.org user=ebb");
        assert_eq!(
            opts,
            [(TlsKey::Mode, "verify-full".to_string()), (TlsKey::RootCert, "/etc/ebb/my ca.pem".to_string())]
        );
        let (rest, opts) = taken(r"password='it\'s' sslmode=require");
        assert_eq!(rest, r"password='it\'s'");
        assert_eq!(opts, [(TlsKey::Mode, "require".to_string())]);
    }

    #[test]
    fn the_tls_options_leave_a_url_query_and_are_percent_decoded() {
        let (rest, opts) = taken(
            "postgres://ebb:pw@db:5432/ebb?connect_timeout=5&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://ebb:pw@db:5432/ebb?connect_timeout=5");
        assert_eq!(
            opts,
            [(TlsKey::Mode, "verify-ca".to_string()), (TlsKey::RootCert, "/etc/ca.pem".to_string())]
        );
        assert_eq!(taken("postgresql://db/ebb?sslmode=disable").0, "postgresql://db/ebb");
        assert_eq!(taken("postgres://db/ebb").0, "postgres://db/ebb");
    }

    #[test]
    fn a_target_says_what_was_wrong_and_never_repeats_the_password() {
        let cases = [
            ("host=db password=hunter2 sslmode=verify-full", "sslmode=verify-full needs sslrootcert=FILE"),
            ("host=db password=hunter2 sslmode=verify-ca", "sslmode=verify-ca needs sslrootcert=FILE"),
            ("host=db password=hunter2 sslmode=sometimes", r#"sslmode="sometimes" is not one of"#),
            ("host=db password='hunter2", "password's value has no closing quote"),
            ("host=db password=hunter2\\", "password's value ends in a backslash"),
            ("host=db password", "\"password\" has no `=` and value"),
            ("postgres://u:hunter2@db/x?sslmode=%zz", "a `%` not followed by two hex digits"),
            ("host=db sslrootcert=''", "sslrootcert is empty"),
            ("host=db password=hunter2 colour=blue", "invalid connection string: unknown option `colour`"),
            ("host=db password=hunter2 sslcert=/c.pem", "sslcert needs sslkey=FILE"),
            ("postgres://u:hunter2@db/x?sslkey=%2Fk.pem", "sslkey needs sslcert=FILE"),
            ("host=db sslcert='' sslkey=/k.pem", "sslcert is empty"),
            ("host=db sslcert=/c.pem sslkey=''", "sslkey is empty"),
            ("host=db sslmode=disable sslcert=/c.pem sslkey=/k.pem", "sslmode=disable turns it off"),
        ];
        for (url, expected) in cases {
            let e = Target::parse(url).unwrap_err().to_string();
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
    }

    #[test]
    fn each_mode_asks_postgres_for_tls_as_libpq_does() {
        for (url, mode, pg) in [
            ("host=db", SslMode::Prefer, PgSslMode::Prefer),
            ("host=db sslmode=disable", SslMode::Disable, PgSslMode::Disable),
            ("host=db sslmode=allow", SslMode::Prefer, PgSslMode::Prefer),
            ("host=db sslmode=require", SslMode::Require, PgSslMode::Require),
            ("host=db sslmode=verify-ca sslrootcert=/x", SslMode::VerifyCa, PgSslMode::Require),
            ("postgres://db/ebb?sslmode=verify-full&sslrootcert=/x", SslMode::VerifyFull, PgSslMode::Require),
        ] {
            let t = Target::parse(url).unwrap();
            assert_eq!((t.mode, t.config.get_ssl_mode()), (mode, pg), "{url}");
        }
        let t = Target::parse("host=db sslmode=verify-full sslrootcert=/nonexistent/ca.pem").unwrap();
        let e = t.client_config().unwrap_err().to_string();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem: "), "{e}");
        assert!(Target::parse("host=db sslmode=disable").unwrap().client_config().unwrap().is_none());
    }

    #[test]
    fn a_client_certificate_and_key_are_read_and_a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ebb-pg-client-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ebb".to_string()]).unwrap().self_signed(&key).unwrap();
        let (cert_file, key_file, empty) = (dir.join("c.pem"), dir.join("k.pem"), dir.join("empty.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        std::fs::write(&empty, "not PEM at all\n").unwrap();
        let mode = |path: &std::path::Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        mode(&key_file, 0o600);
        mode(&empty, 0o600);
        let target = |cert: &std::path::Path, key: &std::path::Path| {
            let url =
                format!("host=db sslmode=require sslcert='{}' sslkey='{}'", cert.display(), key.display());
            Target::parse(&url).unwrap()
        };
        let t = target(&cert_file, &key_file);
        assert_eq!(t.client, Some((cert_file.clone(), key_file.clone())));
        assert!(t.client_config().unwrap().unwrap().client_auth_cert_resolver.has_certs());

        let refused = |cert: &std::path::Path, key: &std::path::Path, why: &str| {
            let e = target(cert, key).client_config().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        };
        refused(&dir.join("none.pem"), &key_file, "none.pem: ");
        refused(&empty, &key_file, "empty.pem: no certificate in it");
        refused(&cert_file, &dir.join("none.pem"), "sslkey");
        refused(&cert_file, &empty, "empty.pem: ");
        // A root-owned key may be read by its group; the tests' files are
        // their user's, so no access beyond the owner's is allowed.
        mode(&key_file, 0o640);
        let owner = std::fs::metadata(&key_file).unwrap().uid();
        if owner != 0 {
            refused(&cert_file, &key_file, "its permissions are 0640, open to others than its owner");
        }
        mode(&key_file, 0o604);
        refused(&cert_file, &key_file, "its permissions are 0604, open to others than its owner");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_file_may_be_read_by_its_owner_and_by_roots_group_only() {
        assert_eq!(key_file_private(0o100600, 1000), Ok(()));
        assert_eq!(key_file_private(0o100400, 1000), Ok(()));
        assert!(key_file_private(0o100640, 1000).unwrap_err().to_string().contains("0640"));
        assert!(key_file_private(0o100644, 1000).unwrap_err().to_string().contains("at most u=rw (0600)"));
        assert_eq!(key_file_private(0o100640, 0), Ok(()));
        assert!(key_file_private(0o100660, 0).unwrap_err().to_string().contains("at most u=rw,g=r (0640)"));
        assert!(key_file_private(0o100604, 0).is_err());
    }

    proptest! {
        /// Any string: an answer, never a panic; the options a string had
        /// are gone from what `postgres` is given.
        #[test]
        fn any_connection_string_is_parsed_or_refused(s in "\\PC{0,80}") {
            if let Ok((rest, _)) = take_tls_options(&s) {
                if let Ok(again) = take_tls_options(&rest) {
                    prop_assert!(again.1.is_empty(), "{s:?} -> {rest:?}");
                }
            }
            let _ = Target::parse(&s);
        }

        /// Any file names for the client's certificate and key: taken as
        /// written, or refused naming the option; reading them is an error
        /// naming the file, never a panic.
        #[test]
        fn any_client_certificate_files_are_taken_or_refused_by_name(
            cert in "\\PC{0,40}",
            key in "\\PC{0,40}",
            mode in prop::sample::select(vec!["disable", "prefer", "require", "verify-full"]),
        ) {
            let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
            let url = format!(
                "host=db sslmode={mode} sslrootcert=/nonexistent/ca.pem sslcert={} sslkey={}",
                quote(&cert),
                quote(&key)
            );
            match Target::parse(&url) {
                Ok(t) => {
                    prop_assert!(!cert.is_empty() && !key.is_empty() && mode != "disable");
                    prop_assert_eq!(&t.client, &Some((PathBuf::from(&cert), PathBuf::from(&key))));
                    let e = t.client_config().unwrap_err().to_string();
                    prop_assert!(e.starts_with("sslrootcert ") || e.starts_with("sslcert "), "{}", e);
                }
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(
                        e.contains("sslcert") || e.contains("sslkey") || e.contains("sslmode=disable"),
                        "{}",
                        e
                    )
                }
            }
        }

        /// Key-value strings of quoted and escaped values come apart into
        /// the values written.
        #[test]
        fn quoted_values_come_back_as_written(
            values in proptest::collection::vec("[ -~]{0,12}", 1..5),
            mode in "[a-z-]{1,12}",
        ) {
            let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
            let mut s = format!("sslmode={}", quote(&mode));
            for (i, v) in values.iter().enumerate() {
                s.push_str(&format!(" k{i} = {}", quote(v)));
            }
            let pairs = key_values(&s).unwrap();
            prop_assert_eq!(pairs.len(), values.len() + 1);
            prop_assert_eq!(&pairs[0].value, &mode);
            for (pair, v) in pairs[1..].iter().zip(&values) {
                prop_assert_eq!(&pair.value, v);
            }
            let (rest, opts) = take_tls_options(&s).unwrap();
            prop_assert_eq!(opts, vec![(TlsKey::Mode, mode.clone())]);
            prop_assert_eq!(key_values(&rest).unwrap().len(), values.len());
        }
    }
}
