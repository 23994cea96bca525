//! HTTPS between the server, its agents and the CLI.
//!
//! The first test runs agents on other hosts, as far as the network can
//! tell: each in a network namespace of its own, joined to this one by a
//! veth pair (made and removed here), with the server listening on the
//! host side's address with a certificate it generated. The agents join
//! by the CA's fingerprint; the CLI verifies with the CA's file. It needs
//! root (CAP_NET_ADMIN), as the end-to-end tests do, and fails saying so
//! where it cannot make namespaces. The others run on loopback.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::tls::{
    agent_in, another_ca, log, netns_of, read_log, temp_dir, Namespaces, Processes, Server,
};
use crate::support::{ebb_exe, wait_for};
use ebb_agent::tls::Fingerprint;
use ebb_server::tls::{ServerTls, TlsConfig};
use serde_json::Value;

#[test]
fn agents_in_their_own_network_namespaces_join_over_tls_by_fingerprint_and_run_a_job_the_cli_submits() {
    let dir = temp_dir("netns");
    // Declared first, dropped last: the processes in them end first.
    let net = Namespaces::make(3);
    let mut processes = Processes(Vec::new());
    let server = Server::start(&dir, &format!("{}:0", net.pairs[0].host), &mut processes);
    assert!(server.url.starts_with(&format!("https://{}:", net.pairs[0].host)), "{}", server.url);

    // What the server printed is its CA's fingerprint.
    let fingerprint = server.printed_fingerprint();
    let ca = ebb_agent::tls::Trust::from_pem_file(&server.ca(), "--ca").unwrap();
    assert_eq!(ca.fingerprints(), [fingerprint.parse::<Fingerprint>().unwrap()]);

    // Two agents, each in its namespace, reach the server's address through
    // their veth pair.
    for i in 0..2 {
        let pair = &net.pairs[i];
        let trust = ["--ca-fingerprint", fingerprint.as_str()];
        processes.0.push(agent_in(&pair.ns, &dir, &server.url, &format!("node-{i}"), pair.inside, &trust));
        let agent = processes.0.last().unwrap().id();
        // `ip netns exec` enters the namespace, then becomes the agent.
        wait_for(&format!("node-{i} in its own namespace"), Duration::from_secs(5), || {
            (netns_of(agent) != netns_of(std::process::id())).then_some(())
        });
    }
    wait_for("both agents to join over TLS", Duration::from_secs(30), || {
        (server.nodes_up().len() == 2).then_some(())
    });
    for i in 0..2 {
        let kept = dir.join(format!("agents/node-{i}/ca.crt"));
        assert_eq!(
            std::fs::read(&kept).unwrap(),
            std::fs::read(server.ca()).unwrap(),
            "node-{i} kept the CA"
        );
        let log = read_log(&dir, &format!("node-{i}"));
        assert!(log.contains("fetched the server's CA, checked its fingerprint and kept it"), "{log}");
    }

    // The CLI, from this namespace, submits with the CA's file; the job runs
    // on a namespaced node and its output comes back over TLS.
    let out = server.ebb(
        &server.ca(),
        &["submit", "--json", "--gpus", "2", "--", "sh", "-c", "echo over TLS on $EBB_NODE"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap().to_string();
    let job = wait_for("the job to succeed", Duration::from_secs(30), || {
        let job = server.json(&["show", &id, "--json"]);
        (job["state"] == "succeeded").then_some(job)
    });
    let node = job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "placed").unwrap()["detail"]
        ["placement"][0]["node"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = server.ebb(&server.ca(), &["logs", &id]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout).trim(), format!("over TLS on {node}"));
    let jobs = server.json(&["jobs", "--json"]);
    let listed =
        jobs.as_array().unwrap().iter().find(|j| j["id"].as_u64().map(|n| n.to_string()) == Some(id.clone()));
    assert_eq!(listed.expect("the job in ebb jobs")["state"], "succeeded");
    let shown = server.ebb(&server.ca(), &["show", &id]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("succeeded"));
    for i in 0..2 {
        assert!(net.received(i) > 0, "nothing crossed node-{i}'s veth");
    }

    // An agent given another fingerprint is refused, naming both, and ends.
    let wrong = Fingerprint::of(b"another CA").to_string();
    let pair = &net.pairs[2];
    processes.0.push(agent_in(
        &pair.ns,
        &dir,
        &server.url,
        "wrong-print",
        pair.inside,
        &["--ca-fingerprint", &wrong],
    ));
    let refused = processes.0.last_mut().unwrap();
    let status = wait_for("the agent with a wrong fingerprint to exit", Duration::from_secs(30), || {
        refused.try_wait().unwrap()
    });
    assert!(!status.success());
    let said = read_log(&dir, "wrong-print");
    assert!(
        said.contains(&format!(
            "--ca-fingerprint: the CA certificate {} hands out has fingerprint {fingerprint}, not {wrong}; refusing to trust it",
            server.url
        )),
        "{said}"
    );
    assert!(!dir.join("agents/wrong-print/ca.crt").exists());

    // An agent and the CLI given another CA cannot verify the server's
    // certificate, and say so.
    let other = another_ca(&dir);
    processes.0.push(agent_in(
        &pair.ns,
        &dir,
        &server.url,
        "wrong-ca",
        pair.inside,
        &["--ca", other.to_str().unwrap()],
    ));
    let expected = format!(
        "cannot verify the certificate of {}: it is not signed by the CA in {} given with --ca",
        server.url,
        other.display()
    );
    wait_for("the agent with another CA to say why it cannot register", Duration::from_secs(20), || {
        read_log(&dir, "wrong-ca").contains(&expected).then_some(())
    });
    let out = server.ebb(&other, &["jobs"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&expected),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut up = server.nodes_up();
    up.sort();
    assert_eq!(up, ["node-0", "node-1"], "neither refused agent joined");

    drop(processes);
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plain-HTTP server, as `ebb up` runs one.
fn plain_server(dir: &Path, processes: &mut Processes) -> String {
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let server_dir = dir.join("server");
    processes.0.push(
        Command::new(ebb_exe())
            .args(["server", "--data-dir", server_dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .stdout(log(dir, "server"))
            .stderr(log(dir, "server"))
            .spawn()
            .unwrap(),
    );
    wait_for("server.url", Duration::from_secs(20), || {
        std::fs::read_to_string(server_dir.join("server.url")).ok().filter(|s| !s.trim().is_empty())
    })
    .trim()
    .to_string()
}

fn stderr(out: &Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_cli_verifies_an_https_server_with_its_ca_alone_and_says_why_it_cannot() {
    let (dir, plain_dir) = (temp_dir("cli"), temp_dir("cli-plain"));
    let mut processes = Processes(Vec::new());
    let server = Server::start(&dir, "127.0.0.1:0", &mut processes);
    let plain = plain_server(&plain_dir, &mut processes);
    assert!(server.url.starts_with("https://127.0.0.1:") && plain.starts_with("http://"));
    let ebb = |server_url: &str, ca: Option<&Path>, args: &[&str]| {
        let mut command = Command::new(ebb_exe());
        command
            .args(args)
            .env("EBB_SERVER", server_url)
            .env("EBB_TOKEN", &server.admin)
            .env_remove("EBB_CONFIG");
        match ca {
            Some(ca) => command.env("EBB_CA", ca),
            None => command.env_remove("EBB_CA"),
        };
        command.output().unwrap()
    };

    // Its own CA: verified, by address and by name.
    assert!(server.json(&["nodes", "--json"]).is_array());
    let by_name = server.url.replace("127.0.0.1", "localhost");
    assert!(ebb(&by_name, Some(&server.ca()), &["nodes"]).status.success());

    // Another CA, or none: refused before any request is sent, saying why.
    let other = another_ca(&dir);
    let err = stderr(&ebb(&server.url, Some(&other), &["nodes"]));
    assert!(
        err.contains(&format!(
            "cannot verify the certificate of {}: it is not signed by the CA in {} given with --ca",
            server.url,
            other.display()
        )),
        "{err}"
    );
    let err = stderr(&ebb(&server.url, None, &["nodes"]));
    assert!(err.contains(&format!("server {} is https://: pass --ca FILE, set EBB_CA", server.url)), "{err}");

    // A CA with a plain-HTTP server is refused rather than left unchecked.
    let err = stderr(&ebb(&plain, Some(&server.ca()), &["nodes"]));
    assert!(err.contains(&format!("--ca: server {plain} is plain http://, not verified")), "{err}");

    // TLS spoken on one side only.
    let err = stderr(&ebb(&plain.replace("http://", "https://"), Some(&server.ca()), &["nodes"]));
    assert!(
        err.contains("does not speak TLS") && err.contains("does it serve plain http:// instead?"),
        "{err}"
    );
    let err = stderr(&ebb(&server.url.replace("https://", "http://"), None, &["nodes"]));
    assert!(err.contains("what answered is not HTTP; does it serve https:// instead?"), "{err}");

    // The operator's own certificate and key: the CA that signed them
    // verifies the server, which hands out no CA.
    let (own, own_dir) = (temp_dir("cli-own"), temp_dir("cli-own-server"));
    let config = TlsConfig::Generate { extra_names: Vec::new() };
    ServerTls::prepare(&config, &own, "127.0.0.1:0".parse().unwrap()).unwrap();
    std::fs::create_dir_all(own_dir.join("logs")).unwrap();
    processes.0.push(
        Command::new(ebb_exe())
            .args([
                "server",
                "--data-dir",
                own_dir.join("server").to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ])
            .args([
                "--tls-cert",
                own.join("tls.crt").to_str().unwrap(),
                "--tls-key",
                own.join("tls.key").to_str().unwrap(),
            ])
            .stdout(log(&own_dir, "server"))
            .stderr(log(&own_dir, "server"))
            .spawn()
            .unwrap(),
    );
    let own_url = wait_for("server.url", Duration::from_secs(20), || {
        std::fs::read_to_string(own_dir.join("server/server.url")).ok().filter(|s| !s.trim().is_empty())
    });
    let own_url = own_url.trim();
    let own_admin = std::fs::read_to_string(own_dir.join("server/admin.token")).unwrap();
    let out = Command::new(ebb_exe())
        .args([
            "nodes",
            "--server",
            own_url,
            "--token",
            own_admin.trim(),
            "--ca",
            own.join("ca.crt").to_str().unwrap(),
        ])
        .env_remove("EBB_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(read_log(&own_dir, "server").contains("agents and the CLI verify this server with --ca FILE"));

    drop(processes);
    for dir in [dir, plain_dir, own, own_dir] {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn an_agent_trusts_the_ca_a_server_hands_out_only_if_it_has_the_fingerprint_given() {
    let (dir, plain_dir) = (temp_dir("fetch"), temp_dir("fetch-plain"));
    let mut processes = Processes(Vec::new());
    let server = Server::start(&dir, "127.0.0.1:0", &mut processes);
    let plain = plain_server(&plain_dir, &mut processes);
    let fingerprint: Fingerprint = server.printed_fingerprint().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    use ebb_agent::tls::{fetch_ca, FetchError};

    let pem = runtime.block_on(fetch_ca(&server.url, fingerprint)).unwrap();
    assert_eq!(pem, std::fs::read(server.ca()).unwrap());

    let wrong = Fingerprint::of(b"another CA");
    match runtime.block_on(fetch_ca(&server.url, wrong)) {
        Err(FetchError::Refused(why)) => assert!(
            why.contains(&format!("has fingerprint {fingerprint}, not {wrong}; refusing to trust it")),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // A plain server has no CA to hand out; a server not there yet may be.
    match runtime.block_on(fetch_ca(&plain, fingerprint)) {
        Err(FetchError::Refused(why)) => assert!(why.contains("hands out no CA"), "{why}"),
        other => panic!("{other:?}"),
    }
    match runtime.block_on(fetch_ca("https://127.0.0.1:9", fingerprint)) {
        Err(FetchError::Unreachable(why)) => assert!(why.contains("connection refused"), "{why}"),
        other => panic!("{other:?}"),
    }

    drop(processes);
    for dir in [dir, plain_dir] {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
