//! Webhooks in the writer: who may add which, refusals by name, the
//! deliveries a job's and a node's events make, in order, in the outbox
//! until the receiver takes them, handed over again after a restart; what
//! the deliverer says of a try is logged. The HTTP side is tested end to
//! end (`crates/cli/tests/e2e/webhooks.rs`).

use ebb_api::{AgentEvent, WebhookRequest};
use ebb_core::TenantId;
use ebb_server::engine::Msg;
use ebb_server::store::{Scope, SqliteStore};
use ebb_server::webhooks::{Command, Tried};
use ebb_server::Principal;
use tokio::sync::mpsc;

use crate::harness::{exited, TestEnv};

fn request(tenant: Option<&str>, events: &[&str]) -> WebhookRequest {
    WebhookRequest {
        tenant: tenant.map(String::from),
        url: "http://receiver.test:9/hook".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        format: None,
    }
}

/// What the deliverer was handed: (delivery id, event, body as JSON).
fn sent(rx: &mut mpsc::UnboundedReceiver<Command>) -> Vec<(u64, String, serde_json::Value)> {
    let mut out = Vec::new();
    while let Ok(command) = rx.try_recv() {
        if let Command::Send(d) = command {
            out.push((d.id, d.event.clone(), serde_json::from_str(&d.body).unwrap()));
        }
    }
    out
}

#[test]
fn who_may_add_which_webhook_and_bad_ones_are_refused_by_name() {
    let mut env = TestEnv::new("webhook-refusals");
    let alice = Principal::tenant(Scope::Tenant, TenantId(1), "default");
    let admin = env.admin.clone();
    let add = |env: &mut TestEnv, who: &Principal, req: WebhookRequest| {
        let principal = who.clone();
        env.call(|reply| Msg::CreateWebhook { principal, req, reply })
    };
    let made = add(&mut env, &alice, request(None, &["preempted", "succeeded", "preempted"])).unwrap();
    assert_eq!(
        (made.tenant.as_deref(), made.events.len()),
        (Some("default"), 2),
        "a tenant's own, events once each"
    );
    assert!(made.secret.as_deref().is_some_and(|s| s.starts_with("whsec_")), "the secret, shown once");
    let cases = [
        (
            &alice,
            request(None, &["gpu_out"]),
            422,
            "events: \"gpu_out\" is not an event a tenant's webhook takes",
        ),
        (
            &admin,
            request(None, &["preempted"]),
            422,
            "events: \"preempted\" is not an event an operators' webhook takes",
        ),
        (&alice, request(None, &[]), 422, "events: at least one of preempted"),
        (
            &alice,
            WebhookRequest { url: "http://169.254.169.254/".into(), ..request(None, &["failed"]) },
            422,
            "url: ",
        ),
        (
            &alice,
            WebhookRequest { format: Some("xml".into()), ..request(None, &["failed"]) },
            422,
            "format: json or slack",
        ),
        (&alice, request(Some("nobody"), &["failed"]), 422, "tenant: unknown tenant"),
    ];
    for (who, req, status, said) in cases {
        let e = add(&mut env, who, req).unwrap_err();
        assert_eq!(ebb_server::http::status(e.kind), status, "{}", e.message);
        assert!(e.message.starts_with(said), "{}", e.message);
    }
    let ops = add(&mut env, &admin, request(None, &["gpu_out", "node_lost"])).unwrap();
    assert_eq!(ops.tenant, None, "an operator's token without a tenant: the operators' webhook");
    for _ in 1..ebb_api::MAX_WEBHOOKS {
        add(&mut env, &alice, request(None, &["failed"])).unwrap();
    }
    let e = add(&mut env, &alice, request(None, &["failed"])).unwrap_err();
    assert_eq!(ebb_server::http::status(e.kind), 409, "{}", e.message);
    // A tenant sees and removes only its own.
    let seen = env.call(|reply| Msg::Webhooks { principal: alice.clone(), tenant: None, reply }).unwrap();
    assert_eq!(seen.len(), ebb_api::MAX_WEBHOOKS);
    assert!(seen.iter().all(|h| h.secret.is_none()), "secrets are never listed");
    let e = env.call(|reply| Msg::DeleteWebhook { principal: alice.clone(), id: ops.id, reply }).unwrap_err();
    assert_eq!(
        (ebb_server::http::status(e.kind), e.message.as_str()),
        (404, format!("webhook {}: not found", ops.id).as_str())
    );
    env.call(|reply| Msg::DeleteWebhook { principal: admin.clone(), id: ops.id, reply }).unwrap();
}

#[test]
fn a_jobs_events_are_delivered_in_order_kept_until_taken_and_sent_again_after_a_restart() {
    outbox_survives(TestEnv::new("webhook-outbox"));
}

/// The same on PostgreSQL, where a "restart" is what a new leader does: a
/// writer opened afresh on the database the old one wrote.
#[test]
fn on_postgres_a_new_leader_hands_over_what_the_outbox_holds() {
    let server = crate::pg::Postgres::start("webhooks");
    let url = server.url();
    outbox_survives(TestEnv::with_store("pg-webhook-outbox", move |_| {
        Box::new(move || ebb_server::store::pg::PgStore::open(&url).unwrap())
    }));
}

fn outbox_survives<S: ebb_server::store::Store>(mut env: TestEnv<S>) {
    env.config.drain_window = ebb_core::Span(60_000);
    env.restart();
    env.register("node-0", Vec::new(), Vec::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    env.engine().deliver_webhooks(tx);
    let admin = env.admin.clone();
    let hook = env
        .call(|reply| Msg::CreateWebhook {
            principal: admin.clone(),
            req: request(Some("default"), &["preempted", "requeued", "succeeded"]),
            reply,
        })
        .unwrap();
    let ops = env
        .call(|reply| Msg::CreateWebhook {
            principal: admin.clone(),
            req: request(None, &["node_drained"]),
            reply,
        })
        .unwrap();

    // A job runs on the whole node; an on-demand job preempts it.
    let victim = env.submit(8);
    let started = env.poll("node-0");
    let attempt = started[0];
    let at_ms = env.now;
    env.report("node-0", vec![AgentEvent::Started { attempt, pid: 7, at_ms }]);
    let spec = ebb_api::JobSubmission {
        gpus: Some(8),
        tier: Some("on-demand".into()),
        argv: vec!["serve".into()],
        ..Default::default()
    };
    let on_demand =
        env.call(|reply| Msg::Submit { principal: admin.clone(), spec: Box::new(spec), reply }).unwrap()[0];
    env.now += 1_000;
    let at_ms = env.now;
    env.report("node-0", vec![exited(attempt, 0, at_ms)]);
    let got = sent(&mut rx);
    let events: Vec<&str> = got.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(events, ["preempted", "requeued"], "in the order they happened");
    let (first, _, body) = &got[0];
    assert_eq!(body["event"], "preempted");
    assert_eq!(body["job"]["id"], victim.0);
    assert_eq!(body["tenant"], "default");
    assert_eq!(body["webhook"], hook.id);
    assert_eq!(body["delivery"], *first);
    assert!(body["text"].as_str().unwrap().contains(&format!("preempted by job {on_demand}")), "{body}");
    assert!(got[0].0 < got[1].0, "delivery ids rise");

    // The receiver took the first; the second failed once and waits.
    let tried = |env: &mut TestEnv<S>, delivery: u64, tried: Tried| {
        let at_ms = env.now;
        env.call_quiet(Msg::WebhookTried { delivery, attempt: 1, tried, at_ms });
    };
    tried(&mut env, got[0].0, Tried::Delivered { status: 204 });
    tried(&mut env, got[1].0, Tried::Failed { status: Some(500), error: "the receiver answered 500".into() });
    let log = env.call(|reply| Msg::WebhookLog { principal: admin.clone(), id: hook.id, reply }).unwrap();
    assert_eq!(log.webhook.pending, 1);
    let outcomes: Vec<(&str, Option<u16>)> =
        log.deliveries.iter().map(|d| (d.outcome.as_str(), d.status)).collect();
    assert_eq!(outcomes, [("failed", Some(500)), ("delivered", Some(204))], "newest first");

    // kill -9: the outbox holds what was not taken; a new writer hands it over again.
    env.restart();
    let (tx, mut rx) = mpsc::unbounded_channel();
    env.engine().deliver_webhooks(tx);
    let again = sent(&mut rx);
    assert_eq!(
        again.iter().map(|(id, e, _)| (*id, e.as_str())).collect::<Vec<_>>(),
        [(got[1].0, "requeued")]
    );
    assert_eq!(again[0].2, got[1].2, "the same body, so the same signature over it");

    // A node event, for the operators' webhook; a delivery id past every one before.
    env.register("node-0", Vec::new(), Vec::new());
    env.call(|reply| Msg::DrainNode { name: "node-0".into(), reply }).unwrap();
    // The on-demand job, which the fake agent did not say it runs after
    // the restart, was requeued as lost: its tenant's webhook hears of it.
    let (node, jobs): (Vec<_>, Vec<_>) =
        sent(&mut rx).into_iter().partition(|(_, e, _)| e.starts_with("node"));
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].2["job"]["id"].as_u64(), Some(on_demand.0));
    assert!(
        jobs[0].2["text"].as_str().unwrap().starts_with("lost; "),
        "as ebb show says it: {}",
        jobs[0].2["text"]
    );
    assert_eq!(node.len(), 1, "{node:?}");
    assert_eq!((node[0].1.as_str(), node[0].2["webhook"].as_u64()), ("node_drained", Some(ops.id)));
    assert_eq!(node[0].2["node"], "node-0");
    assert!(node[0].0 > got[1].0, "ids go on past the old server's");

    // Removing the webhook drops what it had to deliver.
    env.call(|reply| Msg::DeleteWebhook { principal: admin.clone(), id: hook.id, reply }).unwrap();
    env.restart();
    let (tx, mut rx) = mpsc::unbounded_channel();
    env.engine().deliver_webhooks(tx);
    let left: Vec<String> = sent(&mut rx).into_iter().map(|(_, e, _)| e).collect();
    assert_eq!(left, ["node_drained"]);
}

/// Secrets at rest: a registry password and a webhook's secret are in
/// the database only sealed (a copy of the file gives neither away), come
/// back whole after a restart, and a server given another key refuses to
/// start rather than run without them. What an earlier release stored in
/// the clear is sealed at the next start.
#[test]
fn registry_passwords_and_webhook_secrets_are_sealed_in_the_store() {
    let mut env = TestEnv::new("sealed");
    let admin = env.admin.clone();
    let login = ebb_api::RegistryLogin { username: "alice".into(), password: "hunter2-registry".into() };
    let set = Some(("registry.example.com".to_string(), Some(login)));
    env.call(|reply| Msg::RegistryLogins { principal: admin.clone(), tenant: "default".into(), set, reply })
        .unwrap();
    let req = request(Some("default"), &["failed"]);
    let hook = env.call(|reply| Msg::CreateWebhook { principal: admin.clone(), req, reply });
    let secret = hook.unwrap().secret.unwrap();
    let stored = || {
        let mut bytes = std::fs::read(env_db(&env)).unwrap();
        bytes.extend(std::fs::read(env_db(&env).with_extension("db-wal")).unwrap_or_default());
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let file = stored();
    assert!(!file.contains("hunter2-registry") && !file.contains(&secret), "a secret in the clear");
    assert!(file.contains("ebb-sealed:v1:"));

    env.restart();
    let kept = env.call(|reply| Msg::RegistryLoginFor {
        tenant: TenantId(1),
        registry: "registry.example.com".into(),
        reply,
    });
    assert_eq!(kept.map(|l| l.password), Some("hunter2-registry".to_string()));
    // The deliverer signs with the secret as it was given.
    let (tx, mut rx) = mpsc::unbounded_channel();
    env.engine().deliver_webhooks(tx);
    env.register("n1", Vec::new(), Vec::new());
    let attempt = env.running("n1");
    let at_ms = env.now;
    env.report("n1", vec![exited(attempt, 1, at_ms)]);
    let mut secrets = Vec::new();
    while let Ok(command) = rx.try_recv() {
        if let Command::Send(d) = command {
            secrets.push(d.secret);
        }
    }
    assert_eq!(
        secrets,
        std::slice::from_ref(&secret),
        "one delivery, of the failure, signed with the secret given"
    );

    // Another key: refused, by name.
    env.config.secret_key = ebb_server::sealed::SecretKey::from_bytes([9; 32]);
    let open = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| env.restart()));
    let said = match open {
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
        Ok(()) => String::new(),
    };
    assert!(said.contains("give every server of the cluster the same key file"), "{said:?}");
}

/// Where the test's writer keeps its database.
fn env_db(env: &TestEnv) -> std::path::PathBuf {
    env.dir.join("ebb.db")
}

/// A registry password an earlier release stored in the clear is sealed
/// at the next start, and still works.
#[test]
fn a_password_stored_in_the_clear_is_sealed_at_the_next_start() {
    use ebb_server::store::Store;
    let mut env = TestEnv::new("sealed-later");
    env.engine = None;
    {
        let mut store = SqliteStore::open_unsynced(&env_db(&env)).unwrap();
        let login = ebb_api::RegistryLogin { username: "alice".into(), password: "clear-password-1".into() };
        store.begin().unwrap();
        store.put_registry_login(TenantId(1), "registry.example.com", Some(&login)).unwrap();
        store.commit().unwrap();
    }
    env.restart();
    let kept = env.call(|reply| Msg::RegistryLoginFor {
        tenant: TenantId(1),
        registry: "registry.example.com".into(),
        reply,
    });
    assert_eq!(kept.map(|l| l.password), Some("clear-password-1".to_string()));
    env.engine = None;
    let mut store = SqliteStore::open_unsynced(&env_db(&env)).unwrap();
    let snapshot = store.load::<ebb_server::engine::JobRecord>().unwrap();
    let (_, _, stored) = &snapshot.registry_logins[0];
    assert!(stored.password.starts_with("ebb-sealed:v1:"), "{}", stored.password);
}

/// Over plain HTTP off loopback a registry password would cross the
/// network in the clear: such a server sends starts without it.
#[test]
fn a_registry_password_goes_to_nodes_only_where_it_cannot_be_read_on_the_way() {
    for (to_nodes, expected) in [(true, Some("s3cret-pw")), (false, None)] {
        let mut env = TestEnv::new(&format!("logins-to-nodes-{to_nodes}"));
        env.config.logins_to_nodes = to_nodes;
        env.restart();
        let admin = env.admin.clone();
        let login = ebb_api::RegistryLogin { username: "u".into(), password: "s3cret-pw".into() };
        let set = Some(("127.0.0.1:5000".to_string(), Some(login)));
        env.call(|reply| Msg::RegistryLogins {
            principal: admin.clone(),
            tenant: "default".into(),
            set,
            reply,
        })
        .unwrap();
        let spec = ebb_api::JobSubmission {
            argv: vec!["train".into()],
            gpus: Some(1),
            image: Some("127.0.0.1:5000/train:v1".into()),
            image_digest: Some(format!("sha256:{}", "ab".repeat(32))),
            ..Default::default()
        };
        env.call(|reply| Msg::Submit { principal: admin.clone(), spec: Box::new(spec), reply }).unwrap();
        env.register("n1", Vec::new(), Vec::new());
        let starts: Vec<_> = env
            .commands("n1")
            .into_iter()
            .filter_map(|a| match a {
                ebb_api::Action::Start(s) => s.image,
                _ => None,
            })
            .collect();
        assert_eq!(starts.len(), 1);
        assert_eq!(starts[0].password.as_deref(), expected, "logins_to_nodes {to_nodes}");
    }
}
