//! Who may speak to the server, end to end: each node has its own
//! credential and speaks only of the attempts placed on it, its event
//! times are bounded by the server's clock, and the operator revokes and
//! rotates credentials with effect at once. A real cluster (the `ebb`
//! binary as server and agent); forged calls are made with plain HTTP, as
//! an attacker holding a token would make them.

use std::time::{Duration, UNIX_EPOCH};

use crate::support::{events, now_ms, pid_alive, wait_for, Cluster, Options};
use serde_json::{json, Value};

const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;

/// One API call as anyone could make it: (status, JSON body).
fn call(c: &Cluster, method: &str, token: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let http = reqwest::blocking::Client::new();
    let url = format!("{}{path}", c.url);
    let req = match method {
        "GET" => http.get(url),
        "POST" => http.post(url),
        "DELETE" => http.delete(url),
        _ => unreachable!("{method}"),
    };
    let req = req.bearer_auth(token);
    let req = match body {
        Some(body) => req.json(&body),
        None => req,
    };
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

fn join_token(c: &Cluster) -> String {
    std::fs::read_to_string(c.dir.join("server/join.token")).unwrap().trim().to_string()
}

/// The credential the server issued to agent `node-i`, as it keeps it.
fn agent_credential(c: &Cluster, i: usize) -> String {
    let path = c.dir.join("agents").join(format!("node-{i}")).join("node.credential");
    let credential = wait_for("the agent's credential", Duration::from_secs(10), || {
        std::fs::read_to_string(&path).ok().filter(|s| !s.trim().is_empty())
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} is readable by others", path.display());
    credential.trim().to_string()
}

/// A node that is not an agent: registers with `token` and returns the
/// server's answer.
fn register(c: &Cluster, token: &str, node: &str, model: &str, gpus: u8) -> (u16, Value) {
    let body = json!({ "node": node, "gpu_model": model, "gpus": gpus, "address": "127.0.0.1" });
    call(c, "POST", token, "/v1/agent/register", Some(body))
}

fn report(c: &Cluster, token: &str, node: &str, events: Value) -> (u16, Value) {
    call(c, "POST", token, "/v1/agent/report", Some(json!({ "node": node, "events": events })))
}

fn create_tenant(c: &Cluster, name: &str) -> String {
    let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
    v["token"].as_str().unwrap().to_string()
}

/// The tenant's invoice over a period around now, as `ebb bill` prints it.
fn bill(c: &Cluster, tenant: &str) -> Value {
    let day = now_ms() / 86_400_000;
    let date = |d: u64| {
        humantime::format_rfc3339(UNIX_EPOCH + Duration::from_secs(d * 86_400)).to_string()[..10].to_string()
    };
    let (from, to) = (date(day - 1), date(day + 2));
    let out = c.ebb(&["bill", "--tenant", tenant, "--from", &from, "--to", &to, "--json"]);
    serde_json::from_str(&out).unwrap()
}

fn attempt_ref(job: &Value) -> Value {
    json!({ "job": job["id"], "attempt": job["attempt"] })
}

#[test]
fn forged_reports_for_another_nodes_attempt_are_refused_and_change_no_invoice() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let alice = create_tenant(&c, "alice");
    let id = c.submit_as(&alice, &["--tier", "on-demand", "--", "sleep", "600"]);
    let job = c.wait_state(id, "running");
    let attempt = attempt_ref(&job);
    let before = bill(&c, "alice");

    // An intruder with the join token joins as a node of its own.
    let join = join_token(&c);
    let (status, joined) = register(&c, &join, "intruder", "T4-16GB", 1);
    assert_eq!(status, 200, "{joined}");
    let intruder = joined["credential"].as_str().expect("a credential for the new node").to_string();
    let exited = json!([{ "type": "exited", "attempt": attempt, "code": 0, "signal": null,
                          "completed": true, "at_ms": now_ms() + YEAR_MS / 2 }]);
    let output = json!([{ "type": "output", "attempt": attempt, "data": "forged line\n" }]);

    // Speaking for node-0 with its own credential, or with the join token: refused.
    let (status, body) = report(&c, &intruder, "node-0", exited.clone());
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("cannot speak for node node-0"), "{body}");
    let (status, body) = report(&c, &join, "node-0", exited.clone());
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("only registers a node"), "{body}");
    // As itself, about an attempt placed on node-0: fenced, nothing applied.
    let in_a_second = json!([{ "type": "exited", "attempt": attempt, "code": 0, "signal": null,
                               "completed": true, "at_ms": now_ms() + 1000 }]);
    let (status, body) = report(&c, &intruder, "intruder", in_a_second);
    assert_eq!(status, 200, "{body}");
    let (status, body) = report(&c, &intruder, "intruder", output);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stale"], json!([attempt]), "output for another node's attempt is refused");

    let job = c.job(id);
    assert_eq!(job["state"], "running");
    assert_eq!(job["placement"][0]["node"], "node-0");
    assert!(!c.output(id).contains("forged"), "the intruder wrote into alice's log");
    assert_eq!(bill(&c, "alice"), before, "the invoice changed");
}

/// A registration (join token) or a report (a node's credential) with an
/// event in the year 10000 or at `u64::MAX`: the clock-skew check wrote
/// the time into its refusal, the formatter panicked and the server
/// exited; in HA every server in turn. Now each is a 400 naming the
/// field, nothing of it is applied, and the same server goes on.
#[test]
fn an_event_past_the_year_9999_is_a_400_and_the_server_goes_on() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let id = c.submit(&["--tier", "on-demand", "--", "sleep", "600"]);
    let job = c.wait_state(id, "running");
    let pid = c.server_pid();
    let join = join_token(&c);
    let node0 = agent_credential(&c, 0);
    for at_ms in [253_402_300_800_000u64, u64::MAX] {
        let exited = json!([{ "type": "exited", "attempt": attempt_ref(&job), "code": 0, "signal": null,
                              "completed": true, "at_ms": at_ms }]);
        let body = json!({ "node": "year-10000", "gpu_model": "H100-80GB", "gpus": 4,
                           "address": "127.0.0.1", "unreported": exited });
        let (status, body) = call(&c, "POST", &join, "/v1/agent/register", Some(body));
        assert_eq!(status, 400, "{at_ms}: {body}");
        assert!(body["error"].as_str().unwrap().contains("unreported[0].at_ms"), "{body}");
        let (status, body) = report(&c, &node0, "node-0", exited);
        assert_eq!(status, 400, "{at_ms}: {body}");
        assert!(body["error"].as_str().unwrap().contains("events[0].at_ms"), "{body}");
    }
    assert_eq!(c.server_exited(), None, "the server stopped");
    assert_eq!(c.server_pid(), pid);
    // Nothing was applied: the job runs on, the node never joined.
    assert_eq!(c.job(id)["state"], "running");
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    assert!(nodes.as_array().unwrap().iter().all(|n| n["name"] != "year-10000"), "{nodes}");
    let next = c.submit(&["--", "true"]);
    c.wait_state(next, "succeeded");
}

#[test]
fn event_times_are_bounded_by_the_servers_clock() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let alice = create_tenant(&c, "alice");
    let id = c.submit_as(&alice, &["--tier", "on-demand", "--", "sleep", "600"]);
    let job = c.wait_state(id, "running");
    let before = bill(&c, "alice");

    // The node's own credential, its own attempt, an exit a year ahead:
    // refused whole, nothing applied.
    let node0 = agent_credential(&c, 0);
    let events = json!([{ "type": "exited", "attempt": attempt_ref(&job), "code": 0, "signal": null,
                          "completed": true, "at_ms": now_ms() + YEAR_MS }]);
    let (status, body) = report(&c, &node0, "node-0", events.clone());
    assert_eq!(status, 422, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(message.contains("events[0].at_ms") && message.contains("exited"), "{message}");
    // Nor through a registration's unreported events.
    let body = json!({ "node": "node-0", "gpu_model": "H100-80GB", "gpus": 4, "address": "127.0.0.1",
                       "running": [attempt_ref(&job)], "unreported": events });
    let (status, body) = call(&c, "POST", &node0, "/v1/agent/register", Some(body));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("unreported[0].at_ms"), "{body}");
    assert_eq!(c.job(id)["state"], "running");
    assert_eq!(bill(&c, "alice"), before, "the invoice changed");

    // A node whose times are in the distant past: an attempt that
    // "started" at 1 ms after the epoch is billed from its placement.
    let join = join_token(&c);
    let (_, joined) = register(&c, &join, "oldclock", "T4-16GB", 1);
    let credential = joined["credential"].as_str().unwrap().to_string();
    let epoch = joined["epoch"].as_u64().unwrap();
    let after = joined["next_seq"].as_u64().unwrap();
    let submitted_ms = now_ms();
    let id = c.submit_as(&alice, &["--tier", "on-demand", "--gpu-model", "T4-16GB", "--", "true"]);
    let path = format!("/v1/agent/commands?node=oldclock&epoch={epoch}&after={after}");
    let start = wait_for("the start command", Duration::from_secs(20), || {
        let (status, body) = call(&c, "GET", &credential, &path, None);
        assert_eq!(status, 200, "{body}");
        body["commands"].as_array()?.iter().find(|cmd| cmd["action"]["type"] == "start").cloned()
    });
    let attempt = start["action"]["attempt"].clone();
    let started = json!([{ "type": "started", "attempt": attempt, "pid": 1, "at_ms": 1 }]);
    assert_eq!(report(&c, &credential, "oldclock", started).0, 200);
    std::thread::sleep(Duration::from_millis(1500)); // the attempt "runs"
    let exited = json!([{ "type": "exited", "attempt": attempt, "code": 0, "signal": null,
                          "completed": true, "at_ms": now_ms() }]);
    assert_eq!(report(&c, &credential, "oldclock", exited).0, 200);
    let done = c.wait_state(id, "succeeded");
    let usage = &done["usage"][0];
    let (started_ms, ended_ms) = (usage["started_ms"].as_u64().unwrap(), usage["ended_ms"].as_u64().unwrap());
    assert!(started_ms >= submitted_ms, "billed from {started_ms}, before the job was submitted: {usage}");
    let seconds = usage["seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&seconds), "billed {seconds} s for a 1.5 s attempt: {usage}");
    assert!(ended_ms <= now_ms());

    // An exit stamped before the attempt started ends it at its start, not before.
    let id = c.submit_as(&alice, &["--tier", "on-demand", "--gpu-model", "T4-16GB", "--", "true"]);
    let after = start["seq"].as_u64().unwrap();
    let path = format!("/v1/agent/commands?node=oldclock&epoch={epoch}&after={after}");
    let start = wait_for("the second start command", Duration::from_secs(20), || {
        let (_, body) = call(&c, "GET", &credential, &path, None);
        body["commands"].as_array()?.iter().find(|cmd| cmd["action"]["type"] == "start").cloned()
    });
    let attempt = start["action"]["attempt"].clone();
    let events = json!([
        { "type": "started", "attempt": attempt, "pid": 1, "at_ms": now_ms() },
        { "type": "exited", "attempt": attempt, "code": 0, "signal": null, "completed": true, "at_ms": 1 },
    ]);
    assert_eq!(report(&c, &credential, "oldclock", events).0, 200);
    let done = c.wait_state(id, "succeeded");
    let usage = &done["usage"][0];
    assert!(usage["ended_ms"].as_u64() >= usage["started_ms"].as_u64(), "{usage}");
    assert!(usage["started_ms"].as_u64().unwrap() >= submitted_ms, "{usage}");
}

#[test]
fn a_removed_node_is_refused_at_once_its_attempts_requeued_and_it_may_rejoin() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let id = c.submit_sleeper(1);
    c.wait_state(id, "running");
    let pid = c.sleeper_pid(id, 1);
    let credential = agent_credential(&c, 0);

    // Someone with the join token cannot take node-0's name.
    let (status, body) = register(&c, &join_token(&c), "node-0", "H100-80GB", 4);
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("ebb nodes remove node-0"), "{body}");
    assert_eq!(c.job(id)["state"], "running");

    let removed: Value = serde_json::from_str(&c.ebb(&["nodes", "remove", "node-0", "--json"])).unwrap();
    assert_eq!(removed["requeued"], json!([id]), "{removed}");
    assert_eq!(removed["credential_revoked"], true);
    // Refused at once, saying why.
    let path = "/v1/agent/commands?node=node-0&epoch=0&after=0";
    let (status, body) = call(&c, "GET", &credential, path, None);
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("revoked"), "{body}");
    let job = c.job(id);
    assert_eq!(job["state"], "queued", "{job}");
    assert!(events(&job).contains(&"requeued".to_string()));
    // The agent says what happened and stops what it ran.
    let log = c.dir.join("logs/node-0.log");
    wait_for("the agent to report its refused credential", Duration::from_secs(20), || {
        std::fs::read_to_string(&log).ok()?.contains("refused node node-0's credential").then_some(())
    });
    wait_for("the removed node's attempt to be killed", Duration::from_secs(20), || {
        (!pid_alive(pid)).then_some(())
    });

    // It stays out across a server restart.
    c.kill_server();
    c.start_server();
    let nodes: Value = serde_json::from_str(&c.ebb(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["status"], "lost", "{nodes}");
    assert_eq!(c.job(id)["state"], "queued");

    // The operator lets it rejoin: a fresh agent with the join token.
    c.kill_agent(0);
    std::fs::remove_file(c.dir.join("agents/node-0/node.credential")).unwrap();
    c.start_agent(0);
    c.wait_nodes_up(1);
    assert_ne!(agent_credential(&c, 0), credential, "a fresh credential");
    let job = c.wait_state(id, "running");
    assert_eq!(job["attempt"], 2);
}

#[test]
fn a_rotated_join_token_is_refused_and_joined_nodes_keep_working() {
    let mut c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let old = join_token(&c);
    let rotated: Value = serde_json::from_str(&c.ebb(&["nodes", "join-token", "rotate", "--json"])).unwrap();
    let new = rotated["token"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(join_token(&c), new, "the server's join.token holds the new one");
    assert_eq!(rotated["revoked"], 1);

    let (status, body) = register(&c, &old, "late", "T4-16GB", 1);
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("rotated"), "{body}");
    let (status, body) = register(&c, &new, "late", "T4-16GB", 1);
    assert_eq!(status, 200, "{body}");

    // node-0 goes on with its own credential, also after a restart of its agent.
    let id = c.submit(&["--gpu-model", "H100-80GB", "--", "true"]);
    c.wait_state(id, "succeeded");
    c.kill_agent(0);
    c.start_agent(0);
    let id = c.submit(&["--gpu-model", "H100-80GB", "--", "true"]);
    c.wait_state(id, "succeeded");
}

#[test]
fn rotated_and_revoked_tenant_tokens_are_refused_at_once() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let old = create_tenant(&c, "bob");
    assert!(c.ebb_as(&old, &["jobs", "--json"]).status.success());

    let rotated: Value =
        serde_json::from_str(&c.ebb(&["tenant", "token", "rotate", "bob", "--json"])).unwrap();
    let new = rotated["token"].as_str().unwrap().to_string();
    assert_eq!(rotated["revoked"], 1);
    let refused = c.ebb_as(&old, &["jobs", "--json"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("HTTP 401") && stderr.contains("rotated"), "{stderr}");
    c.submit_as(&new, &["--", "true"]);

    let revoked: Value =
        serde_json::from_str(&c.ebb(&["tenant", "token", "revoke", "bob", "--json"])).unwrap();
    assert_eq!(revoked["revoked"], 1);
    assert_eq!(revoked["token"], Value::Null);
    let refused = c.ebb_as(&new, &["jobs", "--json"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("HTTP 401") && stderr.contains("revoked"),
        "{stderr}"
    );
    // The operator is not affected.
    assert!(c.ebb_as(&c.admin, &["jobs", "--json"]).status.success());
}
