//! `ebb server --database` on PostgreSQL: a real cluster (server, agent,
//! jobs) whose state is in a throwaway PostgreSQL, through a `kill -9` of
//! the server; and one server per database.

mod cluster;
#[path = "../../server/tests/pg/mod.rs"]
mod pg;

use std::process::Command;
use std::time::Duration;

use cluster::{Cluster, Options};

#[test]
fn a_cluster_on_postgres_keeps_its_jobs_through_a_kill_9_and_a_second_server_is_refused() {
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

    // A second server on the same database is refused at start.
    let other = c.dir.join("other");
    let out = Command::new(cluster::ebb_exe())
        .args(["server", "--data-dir", other.to_str().unwrap(), "--listen", "127.0.0.1:0", "--database"])
        .arg(pg.url())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another ebb server is using this database"), "{err}");
    // And an unreachable database is said plainly.
    let out = Command::new(cluster::ebb_exe())
        .args(["server", "--data-dir", other.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--database", "host=/nonexistent-ebb-socket user=ebb"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database: cannot connect to PostgreSQL"));
    c.ebb(&["cancel", &running.to_string()]);
    c.wait_job(running, "cancelled", Duration::from_secs(30), |j| j["state"] == "cancelled");
}
