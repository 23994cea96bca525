//! A database written by an earlier release is opened, migrated and used:
//! `fixtures/ebb-7a4d3a2.db` is what `ebb up` of commit 7a4d3a2 left after
//! `kill -9` with two jobs done (one with output), two running after a
//! preemption, and one queued.

use ebb_core::{JobId, TenantId};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ebb_api::{Event, EventKind, JobSubmission};
use ebb_core::Span;
use ebb_server::billing::Pricing;
use ebb_server::engine::{Engine, EngineConfig, Msg};
use ebb_server::store::{Scope, SqliteStore, Store};
use ebb_server::Principal;
use tokio::sync::oneshot;

const NOW: u64 = 1_900_000_000_000;

fn call<T>(engine: &mut Engine<SqliteStore>, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
    call_at(engine, NOW, make)
}

fn call_at<T>(engine: &mut Engine<SqliteStore>, now: u64, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
    let (tx, mut rx) = oneshot::channel();
    engine.batch(vec![make(tx)], now).unwrap();
    rx.try_recv().expect("answered")
}

/// A fresh directory named `name` holding the fixtures `files`, each as
/// (fixture, where in the directory).
fn from_fixtures(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (fixture, to) in files {
        std::fs::copy(fixtures.join(fixture), dir.join(to)).unwrap();
    }
    dir
}

#[test]
fn a_database_written_by_the_release_before_is_migrated_and_everything_in_it_kept() {
    let dir = from_fixtures("migrate", &[("ebb-7a4d3a2.db", "ebb.db"), ("ebb-7a4d3a2-1.log", "logs/1.log")]);
    let config = EngineConfig {
        drain_window: Span(300_000),
        heartbeat_timeout: Span(10_000),
        keep_finished: Span(300_000),
        pricing: Pricing { prices: Vec::new(), default_price: 2_000_000, discount_bps: 5_000 },
        ..EngineConfig::for_tests(&dir)
    };
    let mut store = SqliteStore::open(&dir.join("ebb.db")).unwrap();
    let usage = store.usage(None, 0, u64::MAX).unwrap();
    assert_eq!(usage.len(), 4, "every usage record is kept");
    // Running job 2's log is a file (as logs were before the store kept
    // output), and a batch that never committed wrote past its committed
    // 6 bytes: the takeover cuts it back.
    std::fs::write(dir.join("logs/2.log"), "saved\nnever committed\n").unwrap();
    store.put_log_state(JobId(2), &ebb_server::store::LogState { bytes: 6, file: true }).unwrap();
    let tokens = Arc::new(RwLock::new(HashMap::new()));
    let (mut engine, created) =
        Engine::open(store, config.clone(), tokens.clone(), NOW).map_err(|e| e.to_string()).unwrap();
    assert!(created.is_empty(), "no new tokens for a database that has them");
    assert_eq!(std::fs::read_to_string(dir.join("logs/2.log")).unwrap(), "saved\n", "cut to what committed");
    let admin = Principal::tenant(Scope::Admin, TenantId(1), "default");

    let page = call(&mut engine, |reply| Msg::Jobs {
        principal: admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 10, ..Default::default() },
        reply,
    })
    .unwrap();
    let states: Vec<(u64, &str, u32, u32)> =
        page.jobs.iter().map(|j| (j.id, j.state.as_str(), j.attempt, j.preemptions)).collect();
    assert_eq!(
        states,
        vec![
            (1, "succeeded", 1, 0),
            (2, "running", 2, 1),
            (3, "running", 2, 1),
            (4, "succeeded", 1, 0),
            (5, "queued", 0, 0),
        ]
    );
    let victim =
        call(&mut engine, |reply| Msg::Job { principal: admin.clone(), id: JobId(2), reply }).unwrap();
    let kinds: Vec<EventKind> = victim.events.iter().map(|e| e.kind()).collect();
    assert!(kinds.starts_with(&[
        EventKind::Submitted,
        EventKind::Placed,
        EventKind::Started,
        EventKind::DrainNotice
    ]));
    // Its events, as 7a4d3a2 wrote them, read as their typed details.
    let Event::DrainNotice(notice) = &victim.events[3].event else { panic!("{:?}", victim.events[3]) };
    assert_eq!((notice.detail.by, notice.reason.as_str()), (Some(4), "preempted by job 4"));
    let Event::Started(started) = &victim.events[2].event else { panic!("{:?}", victim.events[2]) };
    assert_eq!(started.node, "node-0");
    let requeued = victim.events.iter().find_map(|e| match &e.event {
        Event::Requeued(r) => Some(r),
        _ => None,
    });
    let requeued = requeued.expect("requeued");
    assert_eq!((requeued.reason.as_str(), requeued.preemptions), ("preempted", Some(1)));
    assert!(requeued.lost_gpu_seconds.is_some_and(|s| s > 4.0), "{requeued:?}");
    assert!(kinds.contains(&EventKind::Requeued));
    assert_eq!(victim.usage.len(), 1, "the preempted attempt's record");

    // The finished jobs stay in the database only (step 8 gave it their
    // states, tiers and names as columns): listed by state, shown, counted.
    let query = ebb_server::engine::JobQuery {
        cursor: Some(0),
        limit: 10,
        states: Some(vec![ebb_server::engine::JobState::Succeeded]),
        ..Default::default()
    };
    let page = call(&mut engine, |reply| Msg::Jobs { principal: admin.clone(), query, reply }).unwrap();
    assert_eq!(page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![1, 4]);
    let done = call(&mut engine, |reply| Msg::Job { principal: admin.clone(), id: JobId(4), reply }).unwrap();
    assert_eq!((done.state.as_str(), done.usage.len()), ("succeeded", 1));
    let metrics = call(&mut engine, |reply| Msg::Metrics { reply });
    let succeeded: u64 =
        metrics.jobs.iter().filter(|((_, state), _)| *state == "succeeded").map(|(_, n)| n).sum();
    assert_eq!(succeeded, 2, "finished jobs are counted from the database");

    // The log of a job from before logs were tracked is read whole.
    let log = call(&mut engine, |reply| Msg::LogFile {
        principal: admin.clone(),
        id: JobId(1),
        offset: 0,
        sources: false,
        reply,
    })
    .unwrap();
    assert_eq!(log.committed, "hello from the old main\n".len() as u64);
    assert!(log.stored.is_none(), "a log from before the store kept output stays its file");

    // Step 9 renumbered nothing: an old job's timeline is as it was, and
    // what happens to it now comes after it.
    let before =
        call(&mut engine, |reply| Msg::Job { principal: admin.clone(), id: JobId(5), reply }).unwrap().events;
    let req = ebb_api::CancelRequest::default();
    let cancelled =
        call(&mut engine, |reply| Msg::Cancel { principal: admin.clone(), id: JobId(5), req, reply })
            .unwrap();
    assert_eq!(cancelled.state, "cancelled");
    let after =
        call(&mut engine, |reply| Msg::Job { principal: admin.clone(), id: JobId(5), reply }).unwrap().events;
    assert!(!before.is_empty());
    assert_eq!(
        after[..before.len()].iter().map(|e| e.kind()).collect::<Vec<_>>(),
        before.iter().map(|e| e.kind()).collect::<Vec<_>>()
    );
    assert_eq!(after.last().map(|e| e.kind()), Some(EventKind::Cancelled));

    // It goes on: new jobs get the next ids.
    let spec = JobSubmission { argv: vec!["true".into()], ..Default::default() };
    let ids =
        call(&mut engine, |reply| Msg::Submit { principal: admin.clone(), spec: Box::new(spec), reply })
            .unwrap();
    assert_eq!(ids, vec![JobId(6)]);
    drop(engine);

    // At the latest schema step; opening again changes nothing.
    let conn = rusqlite::Connection::open(dir.join("ebb.db")).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, 13);
    drop(conn);
    let store = SqliteStore::open(&dir.join("ebb.db")).unwrap();
    let (mut engine, _) = Engine::open(store, config, tokens, NOW).map_err(|e| e.to_string()).unwrap();
    let page = call(&mut engine, |reply| Msg::Jobs {
        principal: admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 10, ..Default::default() },
        reply,
    })
    .unwrap();
    assert_eq!(page.jobs.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fixtures/ebb-1706fbc.db` is what `ebb up` of commit 1706fbc left after
/// `kill -9` (`--export NONE`-like environments, 2 nodes of 8 GPUs): job 1
/// succeeded and job 2 failed (one usage record each), job 3 draining for
/// job 5 (a notice in the form before typed notices), job 4 a
/// `--restart always` service, job 5 holding job 3's GPUs with its start
/// staged, job 6 waiting on job 5, job 7 cancelled while queued, job 8
/// queued.
#[test]
fn a_database_written_before_typed_records_opens_with_every_job_attempt_and_usage_record() {
    let dir = from_fixtures("migrate-typed", &[("ebb-1706fbc.db", "ebb.db")]);
    // The fixture's clock: a minute after its notice, inside the drain.
    let now = 1_796_537_998_981;
    let config = EngineConfig {
        drain_window: Span(300_000),
        heartbeat_timeout: Span(10_000),
        keep_finished: Span(300_000),
        ..EngineConfig::for_tests(&dir)
    };
    let read_records = || {
        let conn = rusqlite::Connection::open(dir.join("ebb.db")).unwrap();
        let mut stmt = conn.prepare("SELECT record FROM jobs ORDER BY id").unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
        rows.map(|r| serde_json::from_str::<serde_json::Value>(&r.unwrap()).unwrap()).collect::<Vec<_>>()
    };
    let before = read_records();
    assert_eq!(before[2]["notice"][2], "preempted by job 5", "the fixture has a notice of the old form");

    let mut store = SqliteStore::open(&dir.join("ebb.db")).unwrap();
    assert_eq!(store.usage(None, 0, u64::MAX).unwrap().len(), 2, "both usage records are kept");
    let tokens = Arc::new(RwLock::new(HashMap::new()));
    let (mut engine, _) =
        Engine::open(store, config.clone(), tokens.clone(), now).map_err(|e| e.to_string()).unwrap();
    let admin = Principal::tenant(Scope::Admin, TenantId(1), "default");
    let job = |engine: &mut Engine<SqliteStore>, id: u64| {
        let principal = admin.clone();
        call_at(engine, now, |reply| Msg::Job { principal, id: JobId(id), reply }).unwrap()
    };
    let expect = [
        (1, "succeeded", 1, 1),
        (2, "failed", 1, 1),
        (3, "draining", 1, 0),
        (4, "running", 1, 0),
        (5, "queued", 0, 0),
        (6, "queued", 0, 0),
        (7, "cancelled", 0, 0),
        (8, "queued", 0, 0),
    ];
    let check = |engine: &mut Engine<SqliteStore>| {
        for (id, state, attempt, usage) in expect {
            let j = job(engine, id);
            assert_eq!(
                (j.id, j.state.as_str(), j.attempt, j.usage.len()),
                (id, state, attempt, usage),
                "job {id}"
            );
            assert_eq!(j.events.first().map(|e| e.kind()), Some(EventKind::Submitted), "job {id}'s timeline");
        }
        let victim = job(engine, 3);
        let Some(Event::DrainNotice(notice)) = victim.events.last().map(|e| &e.event) else { panic!() };
        assert_eq!((notice.detail.by, notice.reason.as_str()), (Some(5), "preempted by job 5"));
        assert_eq!(victim.placement.len(), 1);
        let preemptor = job(engine, 5);
        assert_eq!(
            preemptor.pending_reason,
            Some(ebb_api::PendingReason::VictimsDraining),
            "its hold restored"
        );
        assert_eq!(job(engine, 6).pending_reason, Some(ebb_api::PendingReason::Dependency));
    };
    check(&mut engine);
    drop(engine);

    // The notice is stored in its typed form now, and only so.
    let after = read_records();
    assert_eq!(after.len(), 8);
    assert!(after[2].get("notice").is_none(), "{}", after[2]);
    assert_eq!(after[2]["drain"]["cause"], serde_json::json!({"kind": "preempted", "by": 5}));
    assert_eq!(after[2]["drain"]["reason"], "preempted by job 5");
    assert_eq!(after[2]["drain"]["deadline_ms"], before[2]["notice"][1]);
    assert_eq!(after[3]["spec"]["restart"], "always");

    // Opened again from the new form, it is the same.
    let store = SqliteStore::open(&dir.join("ebb.db")).unwrap();
    let (mut engine, _) = Engine::open(store, config, tokens, now).map_err(|e| e.to_string()).unwrap();
    check(&mut engine);
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
