//! TLS to PostgreSQL: a throwaway server with `ssl=on` and a certificate
//! this test makes, which refuses connections without TLS; each `sslmode`
//! connects, or is refused with the reason, as libpq's would be; and a
//! role that signs in with a client certificate only.

use ebb_server::store::pg::PgStore;
use ebb_server::store::pg_tls::Target;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

use crate::pg::Postgres;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { pem, issuer: Issuer::new(params, key) }
}

/// A certificate for `localhost` only (no address), and its key.
fn server_cert(ca: &Ca) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::DnsName("localhost".try_into().unwrap())];
    (params.signed_by(&key, &ca.issuer).unwrap().pem(), key.serialize_pem())
}

/// A client certificate for role `name`, and its key.
fn client_cert(ca: &Ca, name: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    (params.signed_by(&key, &ca.issuer).unwrap().pem(), key.serialize_pem())
}

/// Whether the session runs over TLS, as the server sees it.
fn server_sees_tls(url: &str) -> Result<bool, String> {
    let mut client = Target::parse(url).and_then(|t| t.connect()).map_err(|e| e.to_string())?;
    let row = client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).unwrap();
    Ok(row.get(0))
}

#[test]
fn postgres_over_tls_connects_as_each_sslmode_asks_and_refuses_what_it_must() {
    let (ca, other) = (ca("the database's CA"), ca("another CA"));
    let (cert, key) = server_cert(&ca);
    let pg = Postgres::start_tls("tls", &cert, &key, &ca.pem);
    let port = pg.port.unwrap();
    let dir = std::env::temp_dir().join(format!("ebb-pg-tls-cas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_file, other_file) = (dir.join("ca.pem"), dir.join("other.pem"));
    std::fs::write(&ca_file, &ca.pem).unwrap();
    std::fs::write(&other_file, &other.pem).unwrap();
    let at = |host: &str, opts: &str| format!("host={host} port={port} user=ebb dbname=postgres {opts}");
    let ca_opt = format!("sslrootcert={}", ca_file.display());

    // Encrypted, whether or not the certificate is checked.
    assert_eq!(server_sees_tls(&at("localhost", "sslmode=require")), Ok(true));
    assert_eq!(server_sees_tls(&at("127.0.0.1", "sslmode=require")), Ok(true));
    assert_eq!(server_sees_tls(&at("localhost", "")), Ok(true), "prefer: TLS where the server offers it");
    assert_eq!(server_sees_tls(&at("localhost", &format!("sslmode=verify-full {ca_opt}"))), Ok(true));
    let url = format!(
        "postgres://ebb@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        ca_file.display().to_string().replace('/', "%2F")
    );
    assert_eq!(server_sees_tls(&url), Ok(true));
    // verify-ca checks the chain and not the name: 127.0.0.1 is not in
    // the certificate.
    assert_eq!(server_sees_tls(&at("127.0.0.1", &format!("sslmode=verify-ca {ca_opt}"))), Ok(true));

    // Refused, with the reason.
    let refused = |url: String, why: &str| {
        let e = server_sees_tls(&url).unwrap_err();
        assert!(e.contains(why), "{url}: {e}");
    };
    refused(
        at("127.0.0.1", &format!("sslmode=verify-full {ca_opt}")),
        "certificate not valid for name \"127.0.0.1\"",
    );
    refused(
        at("localhost", &format!("sslmode=verify-full sslrootcert={}", other_file.display())),
        "invalid peer certificate: UnknownIssuer",
    );
    refused(
        at("localhost", &format!("sslmode=verify-ca sslrootcert={}", other_file.display())),
        "invalid peer certificate: UnknownIssuer",
    );
    refused(at("localhost", "sslmode=disable"), "pg_hba.conf rejects connection");
    refused(at("localhost", "sslmode=verify-full"), "sslmode=verify-full needs sslrootcert=FILE");

    // The store itself, as a server opens it: migrated over verify-full.
    let mut store = PgStore::open(&at("localhost", &format!("sslmode=verify-full {ca_opt}"))).unwrap();
    assert_eq!(store.lease().unwrap().epoch, 0);
    let e = PgStore::open(&at("127.0.0.1", &format!("sslmode=verify-full {ca_opt}"))).err().unwrap();
    assert!(
        e.to_string().contains("--database: cannot connect to PostgreSQL: error performing TLS handshake"),
        "{e}"
    );

    // A role that signs in with a client certificate only (`cert` in
    // pg_hba.conf): its certificate and key, one signed by another CA, and
    // one for another name.
    let mut admin = Target::parse(&at("localhost", "sslmode=require")).unwrap().connect().unwrap();
    admin.batch_execute("CREATE ROLE certified LOGIN").unwrap();
    admin.batch_execute("CREATE DATABASE certified OWNER certified").unwrap();
    let write_pair = |name: &str, (cert, key): (String, String)| {
        let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        format!("sslcert={} sslkey={}", c.display(), k.display())
    };
    let mine = write_pair("certified", client_cert(&ca, "certified"));
    let foreign = write_pair("foreign", client_cert(&other, "certified"));
    let misnamed = write_pair("misnamed", client_cert(&ca, "someone-else"));
    let as_certified = |opts: &str| {
        format!(
            "host=localhost port={port} user=certified dbname=certified sslmode=verify-full {ca_opt} {opts}"
        )
    };
    let user_of = |url: &str| -> Result<String, String> {
        let mut client = Target::parse(url).and_then(|t| t.connect()).map_err(|e| e.to_string())?;
        Ok(client.query_one("SELECT current_user::text", &[]).unwrap().get(0))
    };
    assert_eq!(user_of(&as_certified(&mine)), Ok("certified".to_string()));
    assert_eq!(server_sees_tls(&as_certified(&mine)), Ok(true));
    let refused_as = |url: String, why: &str| {
        let e = user_of(&url).unwrap_err();
        assert!(e.contains(why), "{url}: {e}");
    };
    refused_as(as_certified(""), "connection requires a valid client certificate");
    refused_as(
        as_certified(&foreign),
        "received fatal alert: UnknownCA (the database refused the client certificate: the CA that \
         signed it is not in the database's ssl_ca_file)",
    );
    refused_as(as_certified(&misnamed), "certificate authentication failed for user \"certified\"");
    // The store, as a server with a certificate opens it.
    let mut store = PgStore::open(&as_certified(&mine)).unwrap();
    assert_eq!(store.lease().unwrap().epoch, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
