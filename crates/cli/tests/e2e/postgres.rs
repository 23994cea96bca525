//! `ebb server --database` on PostgreSQL: a real cluster (server, agent,
//! jobs) whose state is in a throwaway PostgreSQL, through a `kill -9` of
//! the server; and a second server on the database following the first.

use std::process::Command;
use std::time::Duration;

use crate::pg;
use crate::support;
use crate::support::{Cluster, Options};

#[test]
fn a_cluster_on_postgres_keeps_its_jobs_through_a_kill_9_and_a_second_server_follows() {
    let pg = pg::Postgres::start("e2e");
    let mut c = Cluster::start(Options { nodes: 1, gpus: 2, database: Some(pg.url()), ..Options::default() });
    let done = c.submit(&["--", "true"]);
    c.wait_state(done, "succeeded");
    let running = c.submit(&["--", "sleep", "600"]);
    c.wait_state(running, "running");

    // kill -9: the restarted server reads everything back from PostgreSQL.
    c.kill_server();
    c.start_server();
    c.wait_nodes_up(1);
    assert_eq!(c.job(done)["state"], "succeeded");
    let job = c.wait_state(running, "running");
    assert_eq!(job["attempt"], 1, "the running job was restarted: {job}");
    let next = c.submit(&["--", "true"]);
    assert!(next > running, "job ids went back: {next} after {running}");
    c.wait_state(next, "succeeded");
    let usage = c.job(done)["usage"].as_array().unwrap().len();
    assert_eq!(usage, 1, "one usage record for the finished job");

    // A second server on the same database follows the first, and answers
    // for it: a request to it is the leader's.
    let other = c.dir.join("other");
    let mut follower = Command::new(support::ebb_exe())
        .args(["server", "--data-dir", other.to_str().unwrap(), "--listen", "127.0.0.1:0", "--database"])
        .arg(pg.url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = support::wait_for("the follower's url", Duration::from_secs(20), || {
        std::fs::read_to_string(other.join("server.url")).ok().filter(|s| !s.trim().is_empty())
    });
    let health: serde_json::Value =
        reqwest::blocking::get(format!("{}/healthz", url.trim())).unwrap().json().unwrap();
    assert_eq!(health["role"], "follower", "{health}");
    assert_eq!(health["leader"], c.url.as_str(), "{health}");
    let out = Command::new(support::ebb_exe())
        .args(["show", &done.to_string(), "--json"])
        .env("EBB_SERVER", url.trim())
        .env("EBB_TOKEN", &c.admin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["state"], "succeeded");
    let _ = follower.kill();
    let _ = follower.wait();
    // And an unreachable database is said plainly.
    let out = Command::new(support::ebb_exe())
        .args(["server", "--data-dir", other.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--database", "host=/nonexistent-ebb-socket user=ebb"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database: cannot connect to PostgreSQL"));
    c.ebb(&["cancel", &running.to_string()]);
    c.wait_job(running, "cancelled", Duration::from_secs(30), |j| j["state"] == "cancelled");
}

/// Two servers sharing one database and one CA, over HTTPS: the follower
/// forwards to the leader verifying its certificate with the shared CA,
/// and the CLI, trusting that CA alone, is answered through either.
#[test]
fn servers_sharing_a_ca_forward_to_each_other_over_https() {
    let pg = pg::Postgres::start("https");
    let dir = std::env::temp_dir().join(format!("ebb-https-plane-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = |name: &str| {
        let data = dir.join(name);
        let child = Command::new(support::ebb_exe())
            .args(["server", "--data-dir", data.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(["--database", &pg.url(), "--tls-generate"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let url = support::wait_for("server.url", Duration::from_secs(20), || {
            std::fs::read_to_string(data.join("server.url")).ok().filter(|s| !s.trim().is_empty())
        });
        (child, url.trim().to_string())
    };
    let (mut leader, leader_url) = start("a");
    assert!(leader_url.starts_with("https://"), "{leader_url}");
    // The second server is given the first one's CA before its first start.
    std::fs::create_dir_all(dir.join("b")).unwrap();
    for file in ["ca.crt", "ca.key"] {
        std::fs::copy(dir.join("a").join(file), dir.join("b").join(file)).unwrap();
    }
    let (mut follower, follower_url) = start("b");
    let admin = std::fs::read_to_string(dir.join("a/admin.token")).unwrap();
    let ca = dir.join("a/ca.crt");
    let ebb = |server: &str, args: &[&str]| {
        Command::new(support::ebb_exe())
            .args(args)
            .env("EBB_SERVER", server)
            .env("EBB_TOKEN", admin.trim())
            .env("EBB_CA", &ca)
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    };
    let out = ebb(&follower_url, &["tenant", "create", "through-the-follower", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ebb(&leader_url, &["tenant", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("through-the-follower"));
    // The follower says who leads, over HTTPS too.
    let http = reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap())
        .build()
        .unwrap();
    let health: serde_json::Value =
        http.get(format!("{follower_url}/healthz")).send().unwrap().json().unwrap();
    assert_eq!(
        (health["role"].as_str(), health["leader"].as_str()),
        (Some("follower"), Some(leader_url.as_str()))
    );
    for child in [&mut leader, &mut follower] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
