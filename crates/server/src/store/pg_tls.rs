//! TLS to PostgreSQL, as libpq's `sslmode` and `sslrootcert` mean it,
//! over rustls (`tokio-postgres-rustls`, with the `ring` provider the rest
//! of the server uses).
//!
//! The `postgres` crate knows `sslmode` as `disable`, `prefer` and
//! `require` only, and no `sslrootcert`; an operator writes the string
//! they would give `psql`. So the two options are taken out of the
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

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use postgres::config::SslMode as PgSslMode;
use postgres::{Client, Config, NoTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

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
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries without TLS first; here it is `prefer`.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                ))
            }
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
}

impl Target {
    /// Parses `url` (`postgres://…?sslmode=…&sslrootcert=…`, or
    /// `host=… sslmode=… sslrootcert=…`). The error names what was wrong
    /// and never repeats the string (it may hold a password).
    pub fn parse(url: &str) -> Result<Target, String> {
        let (rest, options) = take_tls_options(url)?;
        let mut mode = SslMode::Prefer;
        let mut root = None;
        for (key, value) in options {
            match key {
                TlsKey::Mode => mode = value.parse()?,
                TlsKey::RootCert if value.is_empty() => return Err("sslrootcert is empty".into()),
                TlsKey::RootCert => root = Some(PathBuf::from(value)),
            }
        }
        if root.is_none() && matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
            let name = if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" };
            return Err(format!(
                "sslmode={name} needs sslrootcert=FILE: the CA (PEM) that signed the server's certificate"
            ));
        }
        let mut config =
            Config::from_str(&rest).map_err(|e| format!("the connection string: {}", words(&e)))?;
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        });
        Ok(Target { config, mode, root })
    }

    /// The rustls configuration for this mode; `None` for `disable`.
    pub fn client_config(&self) -> Result<Option<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, &self.root) {
            (SslMode::Disable, _) => return Ok(None),
            (SslMode::Prefer, _) | (SslMode::Require, None) => Arc::new(Unchecked(provider)),
            (_, None) => unreachable!("parse refuses a verify mode without sslrootcert"),
            (mode, Some(root)) => {
                let mut roots = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(root)
                    .map_err(|e| format!("sslrootcert {}: {e}", root.display()))?;
                for cert in certs {
                    let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", root.display()))?;
                    roots.add(cert).map_err(|e| format!("sslrootcert {}: {e}", root.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("sslrootcert {}: no certificate in it", root.display()));
                }
                let webpki =
                    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("sslrootcert {}: {e}", root.display()))?;
                if mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(AnyName(webpki))
                }
            }
        };
        Ok(Some(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth()))
    }

    /// Connects as the mode asks.
    pub fn connect(&self) -> Result<Client, String> {
        let connected = match self.client_config()? {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(MakeRustlsConnect::new(tls)),
        };
        connected.map_err(|e| format!("cannot connect to PostgreSQL: {}", words(&e)))
    }
}

/// An error with its causes: `error performing TLS handshake` or `invalid
/// connection string` alone does not say why.
fn words(e: &postgres::Error) -> String {
    let mut words = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !words.contains(&more) {
            words = format!("{words}: {more}");
        }
        source = s.source();
    }
    words
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsKey {
    Mode,
    RootCert,
}

impl TlsKey {
    fn of(key: &str) -> Option<TlsKey> {
        match key {
            "sslmode" => Some(TlsKey::Mode),
            "sslrootcert" => Some(TlsKey::RootCert),
            _ => None,
        }
    }
}

/// The connection string without `sslmode` and `sslrootcert`, and their
/// values in the order written (a later one wins, as in libpq).
fn take_tls_options(url: &str) -> Result<(String, Vec<(TlsKey, String)>), String> {
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
fn key_values(s: &str) -> Result<Vec<Pair>, String> {
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
            return Err(format!("the connection string: {key:?} has no `=` and value"));
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let end = loop {
            match chars.next() {
                None if quoted => {
                    return Err(format!("the connection string: {key}'s value has no closing quote"))
                }
                None => break s.len(),
                Some((_, '\\')) => match chars.next() {
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("the connection string: {key}'s value ends in a backslash")),
                },
                Some((i, '\'')) if quoted => break i + 1,
                Some((i, c)) if !quoted && c.is_whitespace() => break i,
                Some((_, c)) => value.push(c),
            }
        };
        pairs.push(Pair { key, value, span: (start, end) });
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                return Err("the connection string: a `%` not followed by two hex digits".into());
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the connection string: a %-escape that is not UTF-8".into())
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
        ];
        for (url, expected) in cases {
            let e = Target::parse(url).unwrap_err();
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
        let e = t.client_config().unwrap_err();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem: "), "{e}");
        assert!(Target::parse("host=db sslmode=disable").unwrap().client_config().unwrap().is_none());
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
