//! The dashboard in a real browser: `web-tests/dashboard.mjs` drives
//! headless Chromium (Debian's `chromium`, through playwright-core) against
//! a real `ebb up` of this build. It checks that the operator sees a
//! preemption live (draining cells with a countdown, then the preemptor on
//! them, without a reload), that a tenant sees only its own jobs and the
//! amounts `ebb bill --json` gives, and that axe-core finds no serious
//! accessibility violations. The npm packages are installed from the
//! lockfile on first use (`npm ci`).

use std::path::Path;
use std::process::Command;

#[test]
fn dashboard_in_a_browser() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tests = root.join("web-tests");
    let chromium = std::env::var("EBB_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "no Chromium at {chromium}: the dashboard's browser tests need Debian's chromium \
         (apt-get install chromium; .ci/run installs it) or EBB_CHROMIUM=PATH"
    );
    if !tests.join("node_modules").exists() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&tests)
            .status()
            .expect("npm: the dashboard's browser tests need Node.js and npm");
        assert!(status.success(), "npm ci in web-tests failed: {status}");
    }
    let output = Command::new("node")
        .arg(tests.join("dashboard.mjs"))
        .env("EBB", env!("CARGO_BIN_EXE_ebb"))
        .env("EBB_CHROMIUM", &chromium)
        .env_remove("EBB_SCREENSHOTS")
        .output()
        .expect("node: the dashboard's browser tests need Node.js");
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the dashboard's browser tests failed ({}): see their output above",
        output.status
    );
}
