//! Gangs: a gang waits for its last part, is stopped when a part fails
//! or outruns the grace, and is requeued when its rendezvous port is
//! taken; registry logins ride only with their tenant's starts.

use ebb_api::{Action, AgentEvent, AttemptRef, EventKind, JobSubmission, StartAttempt};
use ebb_core::{Attempt, JobId, TenantId};
use ebb_server::engine::Msg;
use ebb_server::store::Scope;
use ebb_server::Principal;

use crate::harness::*;

/// The starts nodes `a` and `b` are told of, by rank.
fn gang_starts(env: &mut TestEnv) -> Vec<(String, StartAttempt)> {
    let mut starts = Vec::new();
    for node in ["a", "b"] {
        for action in env.commands(node) {
            if let Action::Start(start) = action {
                starts.push((node.to_string(), start));
            }
        }
    }
    starts.sort_by_key(|(_, s)| s.env["NODE_RANK"].clone());
    starts
}

/// A gang of two 8-GPU nodes placed and started: its attempt, and where
/// each rank runs (rank 0 first).
fn gang(env: &mut TestEnv) -> (AttemptRef, Vec<(String, StartAttempt)>) {
    let id = env.submit(16);
    let starts = gang_starts(env);
    assert_eq!(starts.len(), 2, "a gang over both nodes");
    let attempt = starts[0].1.attempt;
    assert_eq!(attempt.job, JobId(id.0));
    for (node, _) in &starts {
        let at_ms = env.now;
        env.report(node, vec![AgentEvent::Started { attempt, pid: 1, at_ms }]);
    }
    (attempt, starts)
}

fn stops(actions: &[Action]) -> usize {
    actions.iter().filter(|a| matches!(a, Action::Stop { .. })).count()
}

fn two_nodes(name: &str) -> TestEnv {
    let mut env = TestEnv::new(name);
    env.register("a", Vec::new(), Vec::new());
    env.register("b", Vec::new(), Vec::new());
    env
}

/// When one node's part exited 0 the server stopped the other at once, and
/// torchrun's other node was killed in its own shutdown; the job then
/// succeeded though a part had been killed. A gang ends when all its
/// parts have: one that exits 0 leaves the others the grace to finish.
#[test]
fn a_gang_waits_for_its_last_part_and_succeeds_only_if_every_part_did() {
    let mut env = two_nodes("gang-waits");
    let (attempt, starts) = gang(&mut env);
    let (rank0, rank1) = (starts[0].0.clone(), starts[1].0.clone());
    env.now += 1_000;
    let at = env.now;
    env.report(&rank1, vec![exited(attempt, 0, at)]);
    assert_eq!(stops(&env.commands(&rank0)), 0, "rank 0 was stopped while saving its weights");
    assert_eq!(env.job(JobId(attempt.job.0)).unwrap().state, "running");
    env.now += 3_000;
    let at = env.now;
    env.report(&rank0, vec![exited(attempt, 0, at)]);
    assert_eq!(env.job(JobId(attempt.job.0)).unwrap().state, "succeeded");

    // A part killed by a signal after another exited 0 is a failure.
    let (attempt, starts) = gang(&mut env);
    let at = env.now;
    env.report(&starts[1].0, vec![exited(attempt, 0, at)]);
    let killed = AgentEvent::Exited {
        attempt,
        code: None,
        signal: Some(15),
        completed: false,
        at_ms: at,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
        ended_by: None,
    };
    env.report(&starts[0].0, vec![killed]);
    assert_eq!(env.job(JobId(attempt.job.0)).unwrap().state, "failed", "rank 0 was killed: no success");
}

/// The parts left running past the gang exit grace are stopped, and the
/// attempt fails saying why, whatever they exit with; so does a gang one
/// of whose parts failed, at once.
#[test]
fn a_gang_whose_parts_outrun_the_grace_or_whose_part_failed_is_stopped_and_fails() {
    let mut env = two_nodes("gang-grace");
    let (attempt, starts) = gang(&mut env);
    let (rank0, rank1) = (starts[0].0.clone(), starts[1].0.clone());
    let at = env.now;
    env.report(&rank1, vec![exited(attempt, 0, at)]);
    // The nodes keep polling (their heartbeat) while the grace runs.
    let mut rank0_stops = 0;
    for _ in 0..20 {
        env.now += 29_900;
        rank0_stops += stops(&env.commands(&rank0));
        env.commands(&rank1);
    }
    assert_eq!(rank0_stops, 0, "within the grace");
    // A restart keeps the grace's end.
    env.restart();
    for node in ["a", "b"] {
        let running = if rank0.as_str() == node { vec![attempt] } else { vec![] };
        env.register(node, running, Vec::new());
    }
    env.now += 3_000;
    let now = env.now;
    env.engine().batch(vec![Msg::Tick], now).unwrap();
    assert_eq!(stops(&env.commands(&rank0)), 1, "past the grace: stopped");
    let at = env.now;
    env.report(&rank0, vec![exited(attempt, 0, at)]);
    let job = env.job(JobId(attempt.job.0)).unwrap();
    assert_eq!(job.state, "failed", "a part Ebb stopped is no success, even one that exited 0");
    let failed = job.events.iter().find(|e| e.kind() == EventKind::Failed).unwrap();
    let why = detail(failed)["reason"].as_str().unwrap().to_string();
    assert!(why.contains("had not exited within the gang exit grace of 10m"), "{why}");
    assert!(job.events.iter().any(|e| e.kind() == EventKind::GangStopped));

    let (attempt, starts) = gang(&mut env);
    let at = env.now;
    env.report(&starts[1].0, vec![exited(attempt, 3, at)]);
    assert_eq!(stops(&env.commands(&starts[0].0)), 1, "a failed part stops the others at once");
    let at = env.now + 500;
    env.report(&starts[0].0, vec![exited(attempt, 0, at)]);
    let job = env.job(JobId(attempt.job.0)).unwrap();
    assert_eq!(job.state, "failed");
    let failed = job.events.iter().find(|e| e.kind() == EventKind::Failed).unwrap();
    assert!(detail(failed)["reason"].as_str().unwrap().contains("exited with code 3"), "{failed:?}");
}

/// `MASTER_PORT` was the lowest port from 29500 that Ebb's own gangs did
/// not use, never checked free: with another program on it the gang
/// failed with EADDRINUSE. The first node's agent checks it now; a taken
/// port requeues the gang (no failure, no preemption) with another port.
#[test]
fn a_gang_whose_rendezvous_port_is_taken_is_requeued_with_another() {
    let mut env = two_nodes("gang-port");
    let id = env.submit(16);
    let starts = gang_starts(&mut env);
    let (rank0, start0) = starts[0].clone();
    let port = start0.rendezvous_port.expect("rank 0 is told to check its port");
    assert_eq!(start0.env["MASTER_PORT"], port.to_string());
    assert_eq!(starts[1].1.rendezvous_port, None, "only rank 0 listens");
    let attempt = start0.attempt;
    let at = env.now;
    env.report(&starts[1].0, vec![AgentEvent::Started { attempt, pid: 1, at_ms: at }]);
    let taken = AgentEvent::Exited {
        attempt,
        code: None,
        signal: None,
        completed: false,
        at_ms: at,
        peak_memory_bytes: None,
        start_error: Some(format!("port {port} in use")),
        port_in_use: Some(port),
        ended_by: None,
    };
    env.report(&rank0, vec![taken]);
    assert_eq!(stops(&env.commands(&starts[1].0)), 1, "the other rank is stopped at once");
    let at = env.now + 200;
    env.report(&starts[1].0, vec![exited(attempt, 1, at)]);
    let job = env.job(id).unwrap();
    assert_eq!((job.attempt, job.retries, job.preemptions), (2, 0, 0), "neither a failure nor a preemption");
    let requeued = job.events.iter().rfind(|e| e.kind() == EventKind::Requeued).unwrap();
    assert!(detail(requeued)["reason"].as_str().unwrap().contains("rendezvous port"), "{requeued:?}");
    // The next attempt meets on another port.
    let again: Vec<StartAttempt> = gang_starts(&mut env).into_iter().map(|(_, s)| s).collect();
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|s| s.attempt.attempt == Attempt(2) && s.env["MASTER_PORT"] != port.to_string()),
        "{again:?}"
    );
}

/// A part's exit names a taken port (a Slurm job's first batch step that
/// found its step port taken as it listened writes it for its agent): only
/// the attempt's own port requeues it; any other is the job's word about
/// ports not its own, and its exit stands.
#[test]
fn only_the_attempts_own_port_taken_requeues_it() {
    let mut env = two_nodes("gang-port-own");
    let id = env.submit(16);
    let starts = gang_starts(&mut env);
    let (rank0, start0) = starts[0].clone();
    let port = start0.rendezvous_port.expect("rank 0 is told to check its port");
    let attempt = start0.attempt;
    let at = env.now;
    for (node, _) in &starts {
        env.report(node, vec![AgentEvent::Started { attempt, pid: 1, at_ms: at }]);
    }
    let claims_another = AgentEvent::Exited {
        attempt,
        code: Some(1),
        signal: None,
        completed: false,
        at_ms: at + 10,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: Some(port.wrapping_add(1)),
        ended_by: None,
    };
    env.report(&rank0, vec![claims_another]);
    env.report(&starts[1].0, vec![exited(attempt, 1, at + 20)]);
    let job = env.job(id).unwrap();
    assert_eq!(
        job.state,
        "failed",
        "{:#?}",
        job.events.iter().map(|e| (e.kind(), e.text.clone())).collect::<Vec<_>>()
    );
    assert!(!job.events.iter().any(|e| e.kind() == EventKind::Requeued), "{:?}", job.events);
}

/// Registry logins are a tenant's own, survive a restart, and reach a
/// node only in the start of that tenant's job from that registry; a
/// tenant the operator requires images of is refused without one.
#[test]
fn registry_logins_are_the_tenants_own_and_ride_only_with_its_starts() {
    let mut env = TestEnv::new("registry-logins");
    env.config.images = ebb_server::Images {
        required: ebb_server::Required::Tenants(["alice".to_string()].into()),
        root: ["alice".to_string()].into(),
    };
    env.restart();
    env.call(|reply| Msg::CreateTenant { name: "alice".into(), reply }).unwrap();
    env.call(|reply| Msg::CreateTenant { name: "bob".into(), reply }).unwrap();
    let alice = Principal::tenant(Scope::Tenant, TenantId(2), "alice");
    let bob = Principal::tenant(Scope::Tenant, TenantId(3), "bob");
    let submit = |env: &mut TestEnv, who: &Principal, spec: JobSubmission| {
        let principal = who.clone();
        env.call(|reply| Msg::Submit { principal, spec: Box::new(spec), reply })
    };
    let bare = JobSubmission { argv: vec!["train".into()], ..Default::default() };
    let refused = submit(&mut env, &alice, bare.clone()).unwrap_err();
    assert_eq!(ebb_server::http::status(refused.kind), 422);
    assert!(refused.message.contains("tenant alice's jobs must name an image"), "{}", refused.message);
    submit(&mut env, &bob, bare.clone()).expect("bob is not required to");

    let login =
        |username: &str| ebb_api::RegistryLogin { username: username.into(), password: "s3cret".into() };
    let set = |env: &mut TestEnv,
               who: &Principal,
               tenant: &str,
               registry: &str,
               l: Option<ebb_api::RegistryLogin>| {
        let (principal, tenant, set) = (who.clone(), tenant.to_string(), Some((registry.to_string(), l)));
        env.call(|reply| Msg::RegistryLogins { principal, tenant, set, reply })
    };
    let listed = set(&mut env, &alice, "alice", "127.0.0.1:5000", Some(login("alice"))).unwrap();
    assert_eq!(
        listed,
        vec![ebb_api::RegistryLoginInfo { registry: "127.0.0.1:5000".into(), username: "alice".into() }]
    );
    let e = set(&mut env, &bob, "alice", "127.0.0.1:5000", Some(login("bob"))).unwrap_err();
    assert_eq!(ebb_server::http::status(e.kind), 404, "another tenant's logins are as good as absent");
    for (registry, l, field) in [
        ("not a host", Some(login("a")), "registry"),
        ("127.0.0.1:5000/path", Some(login("a")), "registry"),
        ("127.0.0.1:5000", Some(login("a:b")), "username"),
        (
            "127.0.0.1:5000",
            Some(ebb_api::RegistryLogin { username: "a".into(), password: "x".repeat(4097) }),
            "password",
        ),
    ] {
        let e = set(&mut env, &alice, "alice", registry, l).unwrap_err();
        assert_eq!(ebb_server::http::status(e.kind), 422, "{registry}");
        assert!(e.message.starts_with(field), "{}", e.message);
    }
    env.restart();
    let kept = env.call(|reply| Msg::RegistryLoginFor {
        tenant: TenantId(2),
        registry: "127.0.0.1:5000".into(),
        reply,
    });
    assert_eq!(kept.map(|l| l.username), Some("alice".to_string()), "kept across a restart");
    assert!(env
        .call(|reply| Msg::RegistryLoginFor { tenant: TenantId(3), registry: "127.0.0.1:5000".into(), reply })
        .is_none());

    // Alice's job in an image from that registry starts with her login and
    // as root inside (the operator allowed it); bob's from the same
    // registry carries no login.
    let digest = format!("sha256:{}", "ab".repeat(32));
    let in_image = JobSubmission {
        image: Some("127.0.0.1:5000/train:v1".into()),
        image_digest: Some(digest.clone()),
        ..bare.clone()
    };
    let hers = submit(&mut env, &alice, in_image.clone()).unwrap()[0];
    let his = submit(&mut env, &bob, in_image.clone()).unwrap()[0];
    let unresolved = JobSubmission { image_digest: None, ..in_image };
    assert_eq!(submit(&mut env, &alice, unresolved).unwrap_err().kind, ebb_server::Refused::Unacceptable);
    env.register("n1", Vec::new(), Vec::new());
    let starts: Vec<ebb_api::StartAttempt> = env
        .commands("n1")
        .into_iter()
        .filter_map(|a| match a {
            Action::Start(s) => Some(s),
            _ => None,
        })
        .collect();
    let image_of =
        |id: u64| starts.iter().find(|s| s.attempt.job == JobId(id)).and_then(|s| s.image.clone()).unwrap();
    let (h, b) = (image_of(hers.0), image_of(his.0));
    assert_eq!(
        (h.digest.as_str(), h.username.as_deref(), h.password.as_deref(), h.root),
        (digest.as_str(), Some("alice"), Some("s3cret"), true)
    );
    assert_eq!((b.username, b.password, b.root), (None, None, false));
    assert!(!format!("{h:?}").contains("s3cret"), "a start's Debug never shows the password");
    let shown = env.job(JobId(hers.0)).unwrap();
    assert_eq!(shown.image.unwrap().digest, digest);

    // Removed: gone, and after a restart too.
    assert!(set(&mut env, &alice, "alice", "127.0.0.1:5000", None).unwrap().is_empty());
    env.restart();
    assert!(env
        .call(|reply| Msg::RegistryLoginFor { tenant: TenantId(2), registry: "127.0.0.1:5000".into(), reply })
        .is_none());
}

/// A step's image (Pyxis' `srun --container-image`): asked by a node the
/// attempt runs on, pinned once for the attempt (the first digest wins,
/// so every node runs the same image), refused for a node or attempt that
/// is not the live one, and forgotten once the attempt has ended.
#[test]
fn a_steps_image_is_pinned_once_per_attempt_for_the_nodes_it_runs_on() {
    let mut env = two_nodes("step-images");
    env.register("c", Vec::new(), Vec::new());
    let (attempt, _) = gang(&mut env);
    let (reference, registry) = ("reg.example/tools:v1".to_string(), "reg.example".to_string());
    let ask = |env: &mut TestEnv, node: &str, attempt: AttemptRef| {
        let (node, registry, reference) = (node.to_string(), registry.clone(), reference.clone());
        env.call(|reply| Msg::StepImage { node, attempt, registry, reference, reply })
    };
    let pin = |env: &mut TestEnv, attempt: AttemptRef, digest: &str| {
        let (reference, digest) = (reference.clone(), digest.to_string());
        env.call(|reply| Msg::PinStepImage { attempt, reference, digest, reply })
    };
    let grant = ask(&mut env, "a", attempt).expect("node a runs the attempt");
    assert_eq!(grant.pinned, None);
    assert_eq!(pin(&mut env, attempt, "sha256:first"), "sha256:first");
    // The tag moved before node b asked: b runs what a runs.
    assert_eq!(pin(&mut env, attempt, "sha256:moved"), "sha256:first");
    assert_eq!(ask(&mut env, "b", attempt).unwrap().pinned.as_deref(), Some("sha256:first"));
    let refused = ask(&mut env, "c", attempt).unwrap_err();
    assert!(refused.message.contains("does not run on node c"), "{}", refused.message);
    let other = AttemptRef { job: attempt.job, attempt: Attempt(attempt.attempt.0 + 1) };
    assert!(ask(&mut env, "a", other).is_err(), "only the live attempt");
    for node in ["a", "b"] {
        let at_ms = env.now;
        env.report(node, vec![exited(attempt, 0, at_ms)]);
    }
    assert_eq!(env.state(attempt.job), "succeeded");
    assert!(ask(&mut env, "a", attempt).is_err(), "an ended attempt runs no steps");
}
