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
}

impl Postgres {
    pub fn start(name: &str) -> Postgres {
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
        let pg = Postgres { dir, user };
        pg.run(
            "initdb",
            &["-D", pg.data().to_str().unwrap(), "-U", "ebb", "--auth=trust", "-E", "UTF8", "--no-sync"],
        );
        let options = format!("-c listen_addresses='' -k {} -c fsync=off", pg.dir.join("sock").display());
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
        format!("host={} user=ebb dbname={name}", self.dir.join("sock").display())
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
