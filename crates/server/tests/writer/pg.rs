//! A PostgreSQL server of a test's own: `initdb` and `pg_ctl` in a
//! temporary directory, listening only on a unix socket there. Shared by
//! the server's store tests and the CLI's end-to-end tests (`#[path]`).

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// PostgreSQL's programs: `EBB_PG_BIN`, or Debian's PostgreSQL 15.
fn pg_bin(program: &str) -> PathBuf {
    let dir = std::env::var_os("EBB_PG_BIN")
        .map_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"), PathBuf::from);
    dir.join(program)
}

/// A PostgreSQL server of its own, stopped and removed when dropped.
/// `initdb` refuses to run as root, so as root it runs as `postgres`.
pub struct Postgres {
    dir: PathBuf,
    user: Option<(u32, u32)>,
    /// The loopback port, for a server started with TLS.
    pub port: Option<u16>,
}

impl Postgres {
    pub fn start(name: &str) -> Postgres {
        Postgres::start_with(name, None)
    }

    /// A server that also listens on 127.0.0.1 with `ssl=on`, with this
    /// certificate and key (PEM), and accepts connections there only over
    /// TLS (`hostssl`; `hostnossl` is rejected). The role `certified`
    /// signs in there only with a client certificate for its name signed
    /// by `client_ca_pem` (the `cert` method); every other role as it is.
    pub fn start_tls(name: &str, cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> Postgres {
        Postgres::start_with(name, Some((cert_pem, key_pem, client_ca_pem)))
    }

    fn start_with(name: &str, tls: Option<(&str, &str, &str)>) -> Postgres {
        let dir = std::env::temp_dir().join(format!("ebb-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sock")).unwrap();
        let user = nix::unistd::Uid::effective().is_root().then(|| {
            let pg =
                nix::unistd::User::from_name("postgres").unwrap().expect("a postgres user to run initdb as");
            nix::unistd::chown(&dir, Some(pg.uid), Some(pg.gid)).unwrap();
            nix::unistd::chown(&dir.join("sock"), Some(pg.uid), Some(pg.gid)).unwrap();
            (pg.uid.as_raw(), pg.gid.as_raw())
        });
        let mut pg = Postgres { dir, user, port: None };
        pg.run(
            "initdb",
            &["-D", pg.data().to_str().unwrap(), "-U", "ebb", "--auth=trust", "-E", "UTF8", "--no-sync"],
        );
        let mut options = format!("-c listen_addresses='' -k {} -c fsync=off", pg.dir.join("sock").display());
        if let Some((cert, key, client_ca)) = tls {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            pg.port = Some(port);
            let hba = "local all all trust\nhostssl all certified 127.0.0.1/32 cert\n\
                       hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n";
            let files =
                [("server.crt", cert), ("server.key", key), ("clients.crt", client_ca), ("pg_hba.conf", hba)];
            for (file, text) in files {
                let path = pg.data().join(file);
                std::fs::write(&path, text).unwrap();
                std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
                if let Some((uid, gid)) = pg.user {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
                }
            }
            options = format!(
                "-c listen_addresses='127.0.0.1' -p {port} -k {} -c fsync=off -c ssl=on -c ssl_ca_file=clients.crt",
                pg.dir.join("sock").display()
            );
        }
        let log = pg.dir.join("log");
        pg.run(
            "pg_ctl",
            &["-D", pg.data().to_str().unwrap(), "-o", &options, "-l", log.to_str().unwrap(), "-w", "start"],
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn run(&self, program: &str, args: &[&str]) {
        let mut cmd = Command::new(pg_bin(program));
        cmd.args(args).current_dir(&self.dir);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// A connection string for database `name` on this server.
    pub fn url_for(&self, name: &str) -> String {
        let port = self.port.map(|p| format!(" port={p}")).unwrap_or_default();
        format!("host={}{port} user=ebb dbname={name}", self.dir.join("sock").display())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data();
        let mut cmd = Command::new(pg_bin("pg_ctl"));
        cmd.args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"]);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        let _ = cmd.output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
