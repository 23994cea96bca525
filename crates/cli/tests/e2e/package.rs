//! The Debian package (`scripts/package`, cargo-deb): made from the
//! binary under test, installed with dpkg into a fresh root (`dpkg --root`,
//! its maintainer scripts run against that root), and what it put there
//! checked: the binary runs, the units pass `systemd-analyze verify`, the
//! `ebb` user and the data directories exist, the manual pages and
//! completions are in place; purged, its configuration goes and its data
//! stays. `scripts/test` installs cargo-deb into target/tools.

use std::path::Path;
use std::process::Command;

use crate::support::repo_root;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

#[test]
fn the_deb_installs_into_a_fresh_root_with_its_user_units_manual_and_completions() {
    let scratch = std::env::temp_dir().join(format!("ebb-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let tools = repo_root().join("target/tools/bin");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap());
    run(Command::new(repo_root().join("scripts/package"))
        .args(["--profile", "dev", "--out"])
        .arg(scratch.join("out"))
        .env("PATH", &path));
    let deb = std::fs::read_dir(scratch.join("out")).unwrap().next().unwrap().unwrap().path();
    assert!(deb.to_str().unwrap().ends_with("_amd64.deb"), "{}", deb.display());
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    for file in [
        "./usr/bin/ebb",
        "./lib/systemd/system/ebb-server.service",
        "./lib/systemd/system/ebb-agent.service",
        "./usr/lib/sysusers.d/ebb.conf",
        "./etc/ebb/server.env",
        "./usr/share/man/man1/ebb.1.gz",
        "./usr/share/man/man1/ebb-submit.1.gz",
        "./usr/share/bash-completion/completions/ebb",
        "./usr/share/zsh/vendor-completions/_ebb",
        "./usr/share/fish/vendor_completions.d/ebb.fish",
    ] {
        assert!(listing.lines().any(|l| l.ends_with(file)), "{file} is not in the package:\n{listing}");
    }
    let info = run(Command::new("dpkg-deb").arg("-f").arg(&deb));
    assert!(info.contains("Recommends: sqlite3"), "backups use sqlite3: {info}");

    // A fresh root with an empty dpkg database: dpkg installs into it and
    // runs the postinst with DPKG_ROOT set (its dependencies, libc among
    // them, are the host's: not in that database).
    let root = scratch.join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    for file in ["var/lib/dpkg/status", "var/lib/dpkg/available"] {
        std::fs::write(root.join(file), "").unwrap();
    }
    let dpkg = |args: &[&str]| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends", "--log=/dev/null"])
            .args(args))
    };
    dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(dpkg(&["-s", "ebb"]).contains("Status: install ok installed"));
    let version = run(Command::new(root.join("usr/bin/ebb")).arg("--version"));
    assert_eq!(version.trim(), format!("ebb {}", env!("CARGO_PKG_VERSION")));

    // The user the server runs as, and the data directories.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let user =
        passwd.lines().find(|l| l.starts_with("ebb:")).unwrap_or_else(|| panic!("no ebb user: {passwd}"));
    let uid: u32 = user.split(':').nth(2).unwrap().parse().unwrap();
    assert!(user.ends_with(":/var/lib/ebb:/usr/sbin/nologin"), "{user}");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let data = std::fs::metadata(root.join("var/lib/ebb")).unwrap();
    assert_eq!((data.uid(), data.permissions().mode() & 0o777), (uid, 0o700));
    let agent = std::fs::metadata(root.join("var/lib/ebb-agent")).unwrap();
    assert_eq!(agent.permissions().mode() & 0o777, 0o711);
    let env = std::fs::metadata(root.join("etc/ebb/agent.env")).unwrap();
    assert_eq!(env.permissions().mode() & 0o777, 0o600);

    // The units as installed, each ExecStart pointed at the unpacked
    // binary: systemd finds nothing to say about them.
    let units = scratch.join("units");
    std::fs::create_dir_all(&units).unwrap();
    let mut verify = Command::new("systemd-analyze");
    verify.arg("verify");
    for unit in ["ebb-server.service", "ebb-agent.service"] {
        let text = std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
        assert!(text.contains("ExecStart=/usr/bin/ebb "), "{unit}: {text}");
        let text = text.replace(
            "ExecStart=/usr/bin/ebb ",
            &format!("ExecStart={} ", root.join("usr/bin/ebb").display()),
        );
        std::fs::write(units.join(unit), text).unwrap();
        verify.arg(units.join(unit));
    }
    assert_eq!(run(&mut verify), "", "systemd-analyze verify");

    // The manual and the completions are the binary's own.
    let page = run(Command::new("zcat").arg(root.join("usr/share/man/man1/ebb-submit.1.gz")));
    assert!(page.contains(".TH ebb-submit") && page.contains("\\-\\-tier"), "{page}");
    let bash = std::fs::read_to_string(root.join("usr/share/bash-completion/completions/ebb")).unwrap();
    assert!(bash.contains("complete -F _ebb") && bash.contains("capacity"), "bash completion");

    // Purged: the configuration goes, the data stays.
    dpkg(&["--purge", "ebb"]);
    assert!(!root.join("usr/bin/ebb").exists() && !root.join("etc/ebb/server.env").exists());
    assert!(Path::new(&root.join("var/lib/ebb")).is_dir(), "purge removed the server's data");
    let _ = std::fs::remove_dir_all(&scratch);
}
