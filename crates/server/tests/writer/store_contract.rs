//! One `Store` contract, two backends: the same writes through the embedded
//! SQLite store and through PostgreSQL (a throwaway server this test
//! starts with `initdb` and `pg_ctl`, on a unix socket in a temporary
//! directory) read back the same, fail the same, and roll back the same.

use crate::pg;
use ebb_core::{Attempt, JobId, TenantId};

use std::collections::BTreeMap;
use std::path::Path;

use ebb_api::{Event, EventKind, JobEvent, ReportId, TenantLimits};
use ebb_server::store::pg::PgStore;
use ebb_server::store::{
    JobColumns, JobPageQuery, LogState, NodeRow, PriceRow, ReservationRow, Scope, SqliteStore, Store,
    TenantRow, TokenRow, UsageRow, FINISHED_STATES, UNFINISHED_STATES,
};
use serde_json::{json, Value};

/// An event as the store keeps it: its kind and its detail's JSON.
fn event(at_ms: u64, kind: EventKind, attempt: u32, detail: Value) -> JobEvent {
    let (event, why) = Event::from_stored(kind, &detail.to_string());
    assert_eq!(why, None, "a detail of its kind");
    JobEvent { at: ebb_server::rfc3339(at_ms), at_ms, attempt, event, text: String::new() }
}

/// A job's columns: a queued single job of one GPU unless said otherwise.
fn columns(tenant: u32, state: &str) -> JobColumns<'_> {
    JobColumns {
        tenant: TenantId(tenant),
        state,
        tier: "preemptible",
        gpus: 1,
        name: None,
        array: None,
        attempt: Attempt(0),
        preemptions: 0,
        stored_state: None,
    }
}

fn usage(job: u64, attempt: u32, ended_ms: u64) -> UsageRow {
    UsageRow {
        job: JobId(job),
        attempt: Attempt(attempt),
        tenant: TenantId(2),
        tier: "preemptible".into(),
        gpu_model: "H100".into(),
        gpus: 8,
        started_ms: ended_ms - 60_000,
        ended_ms,
        seconds: 60,
        rate: 1_800_000,
        on_demand_rate: 3_600_000,
        amount: 240_000,
        drain_gpu_seconds: 0,
        lost_gpu_seconds: 12,
        outcome: "preempted".into(),
        follows_preemption: attempt > 1,
        within_min_runtime: attempt > 2,
        segments: Vec::new(),
    }
}

/// Every write the contract has, then everything read back, as text.
fn exercise(store: &mut impl Store) -> String {
    let mut seen = Vec::new();
    store.begin().unwrap();
    store.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    store.put_tenant(&TenantRow { id: TenantId(2), name: "acme".into() }).unwrap();
    for (hash, tenant, scope, node) in [
        ("h-admin", Some(TenantId(1)), Scope::Admin, None),
        ("h-acme", Some(TenantId(2)), Scope::Tenant, None),
        ("h-join", None, Scope::Agent, None),
        ("h-node", None, Scope::Node, Some("node-0".to_string())),
        ("h-gone", Some(TenantId(2)), Scope::Tenant, None),
    ] {
        store.put_token(&TokenRow { hash: hash.into(), tenant, scope, node }).unwrap();
    }
    store.delete_token("h-gone").unwrap();
    let node = NodeRow {
        name: "node-0".into(),
        gpu_model: "H100".into(),
        gpus: 8,
        labels: BTreeMap::from([("rack".to_string(), "a".to_string())]),
        drained: false,
        address: Some("10.0.0.1".into()),
        joined_ms: 1_000,
        interruptions: 0,
        removed: false,
        drained_for: None,
        gpus_out: Vec::new(),
        gpu_faults: Vec::new(),
        health: Vec::new(),
        cpus: None,
        memory_mib: None,
    };
    store.put_node(&node).unwrap();
    // A node's health travels whole: what was found, the GPU it took out.
    let node = NodeRow {
        drained_for: Some("GPU 1: NVLink 2 down".into()),
        gpus_out: vec![ebb_server::store::GpuOut {
            gpu: 3,
            reason: "GPU 3: Xid 79 (fallen off the bus)".into(),
            since_ms: 2_000,
            until_returned: true,
        }],
        gpu_faults: vec![(3, 1_000), (3, 2_000)],
        health: vec![ebb_api::GpuFinding { gpu: Some(3), finding: ebb_api::Finding::Xid { code: 79 } }],
        ..node
    };
    store.put_node(&NodeRow { drained: true, ..node }).unwrap();
    for id in [3u64, 4, 5] {
        store.put_job(JobId(id), &columns(2, "queued"), &json!({ "id": id, "state": "queued" })).unwrap();
    }
    store
        .put_job(
            JobId(4),
            &columns(2, "running"),
            &json!({ "id": 4, "state": "running", "env": { "K": "v w" } }),
        )
        .unwrap();
    store
        .add_event(JobId(4), &event(5_000, EventKind::Submitted, 0, json!({ "tier": "preemptible" })))
        .unwrap();
    store
        .add_event(
            JobId(4),
            &event(
                6_000,
                EventKind::Placed,
                1,
                json!({ "placement": [{ "node": "node-0", "gpus": [0] }], "from_hold": false }),
            ),
        )
        .unwrap();
    store.heard("node-0", 7_000).unwrap();
    store.heard("node-0", 8_000).unwrap();
    store
        .put_price(&PriceRow { gpu_model: "H100".into(), on_demand: 3_600_000, reserved: 2_000_000 })
        .unwrap();
    for id in [1u64, 2] {
        store
            .put_reservation(&ReservationRow {
                id,
                tenant: TenantId(2),
                gpu_model: "H100".into(),
                gpus: 8,
                start_ms: 0,
                end_ms: 86_400_000,
                rate: 2_000_000,
                deleted_ms: None,
            })
            .unwrap();
    }
    store.delete_reservation(2).unwrap();
    store.add_usage(&usage(4, 1, 100_000)).unwrap();
    store.add_usage(&usage(4, 2, 200_000)).unwrap();
    store.add_usage(&usage(3, 1, 150_000)).unwrap();
    store.put_tenant_limits(TenantId(2), &TenantLimits { max_jobs: Some(10), ..Default::default() }).unwrap();
    store.put_log_state(JobId(4), &LogState { bytes: 42, file: false }).unwrap();
    store.put_log_state(JobId(4), &LogState { bytes: 84, file: true }).unwrap();
    store.put_log_state(JobId(3), &LogState { bytes: 7, file: false }).unwrap();
    store.put_reclaim("H100", Some(4)).unwrap();
    store.put_reclaim("A100", Some(0)).unwrap();
    store.put_reclaim("A100", None).unwrap();
    store.put_last_report("node-0", ReportId { session: 9, seq: 1 }).unwrap();
    store.put_last_report("node-0", ReportId { session: 9, seq: 2 }).unwrap();
    store.commit().unwrap();

    // Usage is never counted twice; the failed write leaves the rest.
    store.begin().unwrap();
    assert!(store.add_usage(&usage(4, 1, 100_000)).is_err(), "a second usage record for one attempt");
    store.rollback().unwrap();
    // A rolled-back batch leaves nothing.
    store.begin().unwrap();
    store.put_job(JobId(6), &columns(2, "queued"), &json!({ "id": 6 })).unwrap();
    store.add_event(JobId(4), &event(9_000, EventKind::Cancelled, 1, json!({}))).unwrap();
    store.rollback().unwrap();

    // Webhooks and their outbox; the log keeps the latest tries only.
    let hook = |id: u64, tenant: Option<TenantId>| ebb_server::store::WebhookRow {
        id,
        tenant,
        url: format!("https://example.com/{id}"),
        events: vec!["preempted".into()],
        format: "json".into(),
        secret: "whsec_x".into(),
        created_ms: 1_000,
    };
    store.put_webhook(&hook(1, Some(TenantId(2)))).unwrap();
    store.put_webhook(&hook(2, None)).unwrap();
    store.put_webhook(&hook(3, Some(TenantId(2)))).unwrap();
    for (id, webhook) in [(10u64, 1u64), (11, 1), (12, 3), (13, 2)] {
        let delivery = ebb_server::store::DeliveryRow {
            id,
            webhook,
            event: "preempted".into(),
            job: Some(JobId(4)),
            node: None,
            body: format!("{{\"delivery\":{id}}}"),
            created_ms: 2_000,
        };
        store.put_delivery(&delivery).unwrap();
    }
    store.delete_delivery(11).unwrap();
    for attempt in 1..=205u32 {
        let entry = ebb_api::WebhookDelivery {
            delivery: 10,
            event: "preempted".into(),
            job: Some(4),
            node: None,
            attempt,
            at: "2026-12-04T00:00:00.000Z".into(),
            outcome: "failed".into(),
            status: Some(500),
            error: Some("the receiver answered 500".into()),
        };
        store.add_webhook_log(1, &entry).unwrap();
    }
    let first = store.webhook_log(1).unwrap()[0].clone();
    store.add_webhook_log(3, &ebb_api::WebhookDelivery { attempt: 1, ..first }).unwrap();
    store.delete_webhook(3).unwrap();
    let log = store.webhook_log(1).unwrap();
    seen.push(format!("log {} newest {} oldest {}", log.len(), log[0].attempt, log[log.len() - 1].attempt));
    seen.push(format!("gone {:?}", store.webhook_log(3).unwrap()));

    let mut snapshot = store.load::<Value>().unwrap();
    snapshot.tokens.sort_by(|a, b| a.hash.cmp(&b.hash));
    snapshot.heard.sort();
    seen.push(format!("{snapshot:?}"));
    seen.push(format!("{:?}", store.events(JobId(4)).unwrap()));
    seen.push(format!("{:?}", store.events(JobId(99)).unwrap()));
    seen.push(format!("{:?}", store.usage(Some(TenantId(2)), 100_000, 200_000).unwrap()));
    seen.push(format!("{:?}", store.usage(None, 0, u64::MAX).unwrap()));
    seen.push(format!("{:?}", store.usage(Some(TenantId(1)), 0, u64::MAX).unwrap()));
    seen.push(format!("{:?}", store.job_usage(JobId(4)).unwrap()));
    seen.push(format!("{:?} {:?}", store.log_state(JobId(4)).unwrap(), store.log_state(JobId(5)).unwrap()));
    seen.push(format!("file logs {:?}", store.file_logs().unwrap()));
    seen.push(format!("last reports {:?}", store.last_reports().unwrap()));
    seen.push(format!("max job {}", store.max_job_id().unwrap()));
    seen.join("\n")
}

fn sqlite(dir: &Path) -> SqliteStore {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    SqliteStore::open(&dir.join("ebb.db")).unwrap()
}

#[test]
fn both_backends_keep_the_same_contract() {
    let pg = pg::Postgres::start("contract");
    let dir = std::env::temp_dir().join(format!("ebb-contract-{}", std::process::id()));
    let on_sqlite = exercise(&mut sqlite(&dir));
    let on_postgres = exercise(&mut PgStore::open(&pg.url()).unwrap());
    assert_eq!(on_postgres, on_sqlite);
    // What was read is what was written.
    assert!(on_sqlite.contains("max job 5"), "{on_sqlite}");
    assert!(on_sqlite.contains("Some(LogState { bytes: 84, file: true }) None"), "{on_sqlite}");
    assert!(
        on_sqlite.contains("file logs [(JobId(4), LogState { bytes: 84, file: true })]\n"),
        "{on_sqlite}"
    );
    assert!(
        on_sqlite.contains(r#"last reports [("node-0", ReportId { session: 9, seq: 2 })]"#),
        "{on_sqlite}"
    );
    assert!(!on_sqlite.contains("h-gone") && !on_sqlite.contains("cancelled"), "{on_sqlite}");
    assert!(on_sqlite.contains(r#"reclaims: [("H100", 4)]"#), "{on_sqlite}");
    assert!(on_sqlite.contains("log 200 newest 205 oldest 6\ngone []"), "{on_sqlite}");
    assert!(
        on_sqlite.contains("deliveries: [DeliveryRow { id: 10, webhook: 1,")
            && on_sqlite.contains("DeliveryRow { id: 13, webhook: 2,")
            && !on_sqlite.contains("id: 11,")
            && !on_sqlite.contains("id: 12,"),
        "{on_sqlite}"
    );
    assert!(
        on_sqlite.contains(r#"gpus_out: [GpuOut { gpu: 3, reason: "GPU 3: Xid 79 (fallen off the bus)""#)
            && on_sqlite.contains("gpu_faults: [(3, 1000), (3, 2000)]"),
        "{on_sqlite}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_postgres_database_is_migrated_once_and_a_newer_one_is_refused() {
    let pg = pg::Postgres::start("migrate");
    let mut first = PgStore::open(&pg.url()).unwrap();
    first.begin().unwrap();
    first.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    first.commit().unwrap();
    // A second server on the same database finds it migrated and its rows.
    let mut second = PgStore::open(&pg.url()).unwrap();
    assert_eq!(
        second.load::<Value>().unwrap().tenants,
        vec![TenantRow { id: TenantId(1), name: "default".into() }]
    );
    let mut client = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    client.batch_execute("UPDATE ebb_schema SET version = version + 1").unwrap();
    let err = PgStore::open(&pg.url()).err().expect("a newer schema is refused");
    assert!(err.to_string().contains("newer than this ebb"), "{err}");
    // A database that cannot be reached is said plainly.
    let err = PgStore::open("host=/nonexistent-ebb-socket user=ebb").err().expect("no server there");
    assert!(err.to_string().contains("--database: cannot connect to PostgreSQL"), "{err}");
}

/// On PostgreSQL a job's changes of state before it ends (placed,
/// started, drained, requeued) are updated in place: heap-only tuples, no
/// new entry in any index of `jobs`, as no index holds the state (schema
/// step 10). Its end is not (the finished jobs are found by state), and
/// neither is any change of an index's column.
#[test]
fn a_postgres_job_is_updated_in_place_until_it_ends() {
    let pg = pg::Postgres::start("inplace");
    let mut store = PgStore::open(&pg.url()).unwrap();
    let write = |store: &mut PgStore, state: &str| {
        store.begin().unwrap();
        store.put_job(JobId(1), &columns(1, state), &json!({ "id": 1, "state": state })).unwrap();
        store.commit().unwrap();
    };
    store.begin().unwrap();
    store.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    store.commit().unwrap();
    for state in ["queued", "starting", "running", "draining", "queued", "starting", "running", "succeeded"] {
        write(&mut store, state);
    }
    // A session's counts reach the statistics when it ends.
    drop(store);
    let mut client = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let mut counts = (0, 0);
    for _ in 0..200 {
        let row = client
            .query_one("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'", &[])
            .unwrap();
        counts = (row.get::<_, i64>(0), row.get::<_, i64>(1));
        if counts.0 == 7 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(counts, (7, 6), "(updates, of which in place): every one but the end's");
    let indices: Vec<String> = client
        .query("SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs' ORDER BY indexname", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(indices.iter().all(|i| !i.contains("state")), "{indices:?}");
    let listed = store_listing(&pg.url(), "succeeded");
    assert_eq!(listed, vec![1]);

    // Every state a job can be in is finished or not as the server says
    // (the generated column knows each final state).
    let mut store = PgStore::open(&pg.url()).unwrap();
    store.begin().unwrap();
    let every = FINISHED_STATES.iter().chain(UNFINISHED_STATES.iter());
    for (i, state) in every.clone().enumerate() {
        let id = 100 + i as u64;
        store.put_job(JobId(id), &columns(1, state), &json!({ "id": id, "state": state })).unwrap();
    }
    store.commit().unwrap();
    for (i, state) in every.enumerate() {
        let listed: Vec<u64> = store_listing(&pg.url(), state).into_iter().filter(|&id| id >= 100).collect();
        assert_eq!(listed, vec![100 + i as u64], "{state}");
    }
    let loaded: Vec<u64> =
        store.load::<Value>().unwrap().jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
    let unfinished: Vec<u64> =
        (0..UNFINISHED_STATES.len()).map(|i| (100 + FINISHED_STATES.len() + i) as u64).collect();
    assert_eq!(loaded, unfinished);
    client.batch_execute("DELETE FROM jobs WHERE id >= 100").unwrap();

    // Among many finished jobs, a takeover reads the unfinished ones from
    // their own index, in order, and the finished are listed from theirs.
    let mut store = PgStore::open(&pg.url()).unwrap();
    store.begin().unwrap();
    for id in 2..=5000u64 {
        let state = match id % 1000 {
            0 => "running",
            1 => "failed",
            _ => "succeeded",
        };
        store.put_job(JobId(id), &columns(1, state), &json!({ "id": id, "state": state })).unwrap();
    }
    store.commit().unwrap();
    let loaded: Vec<u64> =
        store.load::<Value>().unwrap().jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(loaded, vec![1000, 2000, 3000, 4000, 5000]);
    client.batch_execute("ANALYZE jobs").unwrap();
    let plan = |client: &mut postgres::Client, sql: &str| -> String {
        let rows = client.query(&format!("EXPLAIN {sql}"), &[]).unwrap();
        rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
    };
    let load = plan(&mut client, ebb_server::store::pg::LOAD_JOBS);
    assert!(load.contains("Index Scan using jobs_unfinished") && !load.contains("Sort"), "{load}");
    let failed = plan(
        &mut client,
        "SELECT record FROM jobs WHERE id >= 0 AND finished IN ('failed') ORDER BY id LIMIT 10",
    );
    assert!(failed.contains("jobs_finished"), "{failed}");
}

/// The jobs in `state`, as a server on `url` lists them.
fn store_listing(url: &str, state: &str) -> Vec<u64> {
    let q = JobPageQuery { states: Some(vec![state.to_string()]), limit: 10, ..Default::default() };
    let rows = PgStore::open(url).unwrap().job_page::<Value>(&q).unwrap().rows;
    rows.iter().map(|j| j["id"].as_u64().unwrap()).collect()
}

#[test]
fn the_lease_goes_to_one_server_and_fences_off_a_deposed_one() {
    let pg = pg::Postgres::start("lease");
    let mut a = PgStore::open(&pg.url()).unwrap();
    let mut b = PgStore::open(&pg.url()).unwrap();
    assert_eq!(a.lease().unwrap(), pg_lease(0, "", true), "no leader yet");
    assert_eq!(a.take_lease("http://a", 60_000).unwrap(), Some(1));
    // Held and renewed: the other cannot take it.
    assert_eq!(b.lease().unwrap(), pg_lease(1, "http://a", false));
    assert_eq!(b.take_lease("http://b", 60_000).unwrap(), None);
    a.begin().unwrap();
    a.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    a.commit().unwrap();

    // The leader's lease runs out (here: made to): the other takes it, and
    // the deposed leader's next transaction is refused before it writes.
    let mut admin = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    admin.batch_execute("UPDATE leader SET expires_at = now() - interval '1 second'").unwrap();
    assert!(b.lease().unwrap().open);
    assert_eq!(b.take_lease("http://b", 60_000).unwrap(), Some(2));
    let err = a.begin().expect_err("a deposed leader's transaction is refused");
    assert!(
        err.to_string().contains("deposed: this server led at epoch 1, and the database is at epoch 2"),
        "{err}"
    );
    b.begin().unwrap();
    b.put_tenant(&TenantRow { id: TenantId(2), name: "second".into() }).unwrap();
    b.commit().unwrap();

    // A leader whose session ends (its process died) is replaced at once,
    // its lease notwithstanding.
    assert_eq!(a.lease().unwrap(), pg_lease(2, "http://b", false));
    drop(b);
    let open = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        a.lease().unwrap().open
    });
    assert!(open, "the lease of a leader whose session ended stayed closed");
    assert_eq!(a.take_lease("http://a", 60_000).unwrap(), Some(3));
    a.begin().unwrap();
    a.commit().unwrap();
}

fn pg_lease(epoch: u64, url: &str, open: bool) -> ebb_server::store::pg::Lease {
    ebb_server::store::pg::Lease { epoch, url: url.into(), open }
}

/// Output, in pieces, read back across them, with what did not commit
/// absent: the same through both stores.
fn keeps_output<S: Store>(store: &mut S, mut reopen: impl FnMut() -> S) {
    store.begin().unwrap();
    store.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    store.put_job(JobId(7), &columns(1, "queued"), &serde_json::json!({"id": 7})).unwrap();
    store.put_output(JobId(7), 0, b"hello ", None).unwrap();
    store.put_output(JobId(7), 6, b"world\n", None).unwrap();
    // A gang's pieces say which node wrote them.
    store.put_job(JobId(8), &columns(1, "running"), &serde_json::json!({"id": 8})).unwrap();
    store.put_output(JobId(8), 0, b"rank 1\n", Some("node-1")).unwrap();
    store.put_output(JobId(8), 7, b"rank 0\nsaved\n", Some("node-0")).unwrap();
    store.commit().unwrap();
    // Output of a transaction that did not commit is not there.
    store.begin().unwrap();
    store.put_output(JobId(7), 12, b"lost", None).unwrap();
    store.rollback().unwrap();
    let mut other = reopen();
    assert_eq!(other.output(JobId(7), 0, 12).unwrap(), b"hello world\n");
    assert_eq!(other.output(JobId(7), 3, 9).unwrap(), b"lo wor", "a range across pieces");
    assert_eq!(other.output(JobId(7), 12, 100).unwrap(), b"", "nothing past the log");
    assert_eq!(other.output(JobId(9), 0, 100).unwrap(), b"", "no such job");
    assert_eq!(
        (other.output_len(JobId(7)).unwrap(), other.output_len(JobId(9)).unwrap()),
        (12, 0),
        "a log's length"
    );
    assert_eq!(other.output_sources(JobId(7), 0, 100).unwrap(), vec![], "a job on one node has no sources");
    let both = vec![(0, "node-1".to_string()), (7, "node-0".to_string())];
    assert_eq!(other.output_sources(JobId(8), 0, 100).unwrap(), both);
    assert_eq!(other.output_sources(JobId(8), 9, 100).unwrap(), both[1..], "the piece a range starts in");
    assert_eq!(other.output(JobId(8), 0, 100).unwrap(), b"rank 1\nrank 0\nsaved\n");

    // Retention: each job's output goes when its time comes, soonest
    // first, at most `limit` jobs at a time, and says when it went.
    other.begin().unwrap();
    other.expire_output(JobId(7), 5_000).unwrap();
    other.expire_output(JobId(8), 9_000).unwrap();
    other.expire_output(JobId(8), 6_000).unwrap(); // set again: the later call holds
    assert_eq!(other.prune_output(4_999, 10).unwrap(), Vec::<JobId>::new(), "none due yet");
    assert_eq!(other.prune_output(u64::MAX, 1).unwrap(), vec![JobId(7)], "the soonest, one at a time");
    other.commit().unwrap();
    let mut third = reopen();
    assert_eq!(
        (third.output_len(JobId(7)).unwrap(), third.output(JobId(7), 0, 100).unwrap()),
        (0, Vec::new())
    );
    assert_eq!(
        third.output_removed(JobId(7)).unwrap(),
        Some(i64::MAX as u64),
        "when, as far as a column holds"
    );
    assert_eq!(
        (third.output_removed(JobId(8)).unwrap(), third.output_len(JobId(8)).unwrap()),
        (None, 20),
        "not yet"
    );
    third.begin().unwrap();
    assert_eq!(third.prune_output(6_000, 10).unwrap(), vec![JobId(8)]);
    assert_eq!(third.prune_output(7_000, 10).unwrap(), Vec::<JobId>::new(), "each job once");
    third.commit().unwrap();
    assert_eq!(third.output_removed(JobId(8)).unwrap(), Some(6_000));
    assert_eq!(third.output_removed(JobId(9)).unwrap(), None, "no such job");
}

#[test]
fn both_stores_keep_output_and_postgres_for_whichever_server_leads() {
    let dir = std::env::temp_dir().join(format!("ebb-output-sqlite-{}", std::process::id()));
    keeps_output(&mut sqlite(&dir), || SqliteStore::open(&dir.join("ebb.db")).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    let pg = pg::Postgres::start("output");
    keeps_output(&mut PgStore::open(&pg.url()).unwrap(), || PgStore::open(&pg.url()).unwrap());
}

/// The listing, arrays' progress and the finished counts, read from the
/// columns `put_job` writes: the same through both stores.
fn lists_jobs<S: Store>(store: &mut S) {
    store.begin().unwrap();
    store.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    store.put_tenant(&TenantRow { id: TenantId(2), name: "acme".into() }).unwrap();
    // (id, tenant, state, tier, gpus, name, array)
    type Listed = (u64, u32, &'static str, &'static str, u32, Option<&'static str>, Option<(u64, u64)>);
    let jobs: [Listed; 9] = [
        (1, 1, "succeeded", "on-demand", 2, Some("train-a"), None),
        (2, 2, "failed", "preemptible", 4, None, None),
        (3, 1, "queued", "preemptible", 1, Some("sweep"), Some((3, 0))),
        (4, 1, "succeeded", "preemptible", 1, Some("sweep"), Some((3, 1))),
        (5, 1, "cancelled", "preemptible", 1, Some("sweep"), Some((3, 2))),
        (6, 1, "running", "preemptible", 1, Some("sweep"), Some((3, 3))),
        (7, 2, "running", "reserved", 8, Some("train-b"), None),
        (8, 1, "cancelled", "on-demand", 3, Some("x"), None),
        (9, 1, "queued", "on-demand", 1, None, None),
    ];
    for (id, tenant, state, tier, gpus, name, array) in jobs {
        let columns = JobColumns {
            tenant: TenantId(tenant),
            state,
            tier,
            gpus,
            name,
            array: array.map(|(first, index)| (JobId(first), index)),
            attempt: Attempt(id as u32 % 3),
            preemptions: 1,
            stored_state: Some("queued"),
        };
        // Written twice, as a record changes: the columns follow. The
        // second write's hint of what is stored is right for some jobs and
        // wrong for others (the new state; another one): the result is the
        // same.
        store
            .put_job(
                JobId(id),
                &JobColumns { state: "queued", stored_state: None, ..columns },
                &json!({ "id": id }),
            )
            .unwrap();
        let hint = match id % 3 {
            0 => Some("queued"),
            1 => Some(state),
            _ => Some("draining"),
        };
        store
            .put_job(
                JobId(id),
                &JobColumns { stored_state: hint, ..columns },
                &json!({ "id": id, "state": state }),
            )
            .unwrap();
    }
    store.commit().unwrap();

    let ids = |store: &mut S, q: JobPageQuery| -> Vec<u64> {
        store.job_page::<Value>(&q).unwrap().rows.iter().map(|j| j["id"].as_u64().unwrap()).collect()
    };
    let all = JobPageQuery { limit: 100, ..Default::default() };
    assert_eq!(ids(store, all.clone()), (1..=9).collect::<Vec<_>>());
    assert_eq!(ids(store, JobPageQuery { cursor: Some(JobId(3)), limit: 2, ..all.clone() }), vec![4, 5]);
    assert_eq!(ids(store, JobPageQuery { desc: true, limit: 3, ..all.clone() }), vec![9, 8, 7]);
    assert_eq!(ids(store, JobPageQuery { desc: true, cursor: Some(JobId(3)), ..all.clone() }), vec![2, 1]);
    assert_eq!(ids(store, JobPageQuery { cursor: Some(JobId(u64::MAX)), ..all.clone() }), Vec::<u64>::new());
    assert_eq!(ids(store, JobPageQuery { tenant: Some(TenantId(2)), ..all.clone() }), vec![2, 7]);
    let finished = Some(vec!["succeeded".to_string(), "failed".into(), "cancelled".into()]);
    assert_eq!(ids(store, JobPageQuery { states: finished.clone(), ..all.clone() }), vec![1, 2, 4, 5, 8]);
    assert_eq!(ids(store, JobPageQuery { states: Some(Vec::new()), ..all.clone() }), Vec::<u64>::new());
    let unfinished = Some(vec!["queued".to_string(), "running".into()]);
    assert_eq!(ids(store, JobPageQuery { states: unfinished, ..all.clone() }), vec![3, 6, 7, 9]);
    let mixed = Some(vec!["running".to_string(), "failed".into()]);
    assert_eq!(ids(store, JobPageQuery { states: mixed.clone(), ..all.clone() }), vec![2, 6, 7]);
    assert_eq!(ids(store, JobPageQuery { states: mixed, desc: true, limit: 2, ..all.clone() }), vec![7, 6]);
    let unknown = Some(vec!["bogus".to_string()]);
    assert_eq!(ids(store, JobPageQuery { states: unknown, ..all.clone() }), Vec::<u64>::new());
    assert_eq!(ids(store, JobPageQuery { tier: Some("on-demand".into()), ..all.clone() }), vec![1, 8, 9]);
    // A byte bound stops the page after the row that passes it, and says
    // more may follow; the last row read to its end is not a cut.
    let records = store.job_page::<Value>(&all).unwrap().rows;
    let first_two = records[0].to_string().len() + records[1].to_string().len();
    let bounded = JobPageQuery { max_bytes: first_two, ..all.clone() };
    let read = store.job_page::<Value>(&bounded).unwrap();
    assert_eq!((read.rows.len(), read.cut), (2, true));
    let tail = store.job_page::<Value>(&JobPageQuery { cursor: Some(JobId(7)), ..bounded.clone() }).unwrap();
    assert_eq!((tail.rows.len(), tail.cut), (2, false));
    let one = store.job_page::<Value>(&JobPageQuery { max_bytes: 1, ..all.clone() }).unwrap();
    assert_eq!((one.rows.len(), one.cut), (1, true), "a page holds at least one job");
    assert_eq!(ids(store, JobPageQuery { name: Some("train".into()), ..all.clone() }), vec![1, 7]);
    assert_eq!(
        ids(store, JobPageQuery { name: Some("".into()), ..all.clone() }),
        (1..=9).collect::<Vec<_>>()
    );
    // Collapsed, an array is its first task, listed when any task matches.
    let collapsed = JobPageQuery { collapse: true, ..all.clone() };
    assert_eq!(ids(store, collapsed.clone()), vec![1, 2, 3, 7, 8, 9]);
    let succeeded = Some(vec!["succeeded".to_string()]);
    assert_eq!(ids(store, JobPageQuery { states: succeeded.clone(), ..collapsed.clone() }), vec![1, 3]);
    let failed = Some(vec!["failed".to_string()]);
    assert_eq!(ids(store, JobPageQuery { states: failed, ..collapsed.clone() }), vec![2]);
    assert_eq!(
        ids(
            store,
            JobPageQuery { tenant: Some(TenantId(1)), states: succeeded, desc: true, ..collapsed.clone() }
        ),
        vec![3, 1]
    );
    let running = Some(vec!["running".to_string()]);
    assert_eq!(ids(store, JobPageQuery { states: running, ..collapsed }), vec![3, 7]);

    let states = store.array_states(JobId(3)).unwrap();
    let expected = [("cancelled", 1), ("queued", 1), ("running", 1), ("succeeded", 1)];
    assert_eq!(states, expected.map(|(s, n)| (s.to_string(), n)).to_vec());
    assert_eq!(store.array_states(JobId(99)).unwrap(), Vec::new());
    let tasks = store.array_tasks(JobId(3)).unwrap();
    assert_eq!(
        tasks.iter().map(|t| (t.id.0, t.index, t.state.as_str(), t.attempt.0)).collect::<Vec<_>>(),
        vec![(3, 0, "queued", 0), (4, 1, "succeeded", 1), (5, 2, "cancelled", 2), (6, 3, "running", 0)]
    );
    let counts = store.finished_counts().unwrap();
    let counts: Vec<(&str, &str, u64, u64)> =
        counts.iter().map(|c| (c.tier.as_str(), c.state.as_str(), c.jobs, c.gpus)).collect();
    assert_eq!(
        counts,
        vec![
            ("on-demand", "cancelled", 1, 3),
            ("on-demand", "succeeded", 1, 2),
            ("preemptible", "cancelled", 1, 1),
            ("preemptible", "failed", 1, 4),
            ("preemptible", "succeeded", 1, 1),
        ]
    );
    assert_eq!(store.job::<Value>(JobId(8)).unwrap(), Some(json!({ "id": 8, "state": "cancelled" })));
    assert_eq!(store.job::<Value>(JobId(10)).unwrap(), None);
    // Only unfinished jobs are loaded; finished ones stay here.
    let loaded: Vec<u64> =
        store.load::<Value>().unwrap().jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(loaded, vec![3, 6, 7, 9]);
    assert_eq!(store.max_job_id().unwrap(), JobId(9));
}

#[test]
fn both_stores_list_count_and_load_jobs_by_their_columns() {
    let dir = std::env::temp_dir().join(format!("ebb-lists-sqlite-{}", std::process::id()));
    lists_jobs(&mut sqlite(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    let pg = pg::Postgres::start("lists");
    lists_jobs(&mut PgStore::open(&pg.url()).unwrap());
}

/// A PostgreSQL database of the release before the job columns (schema
/// step 3) gets them filled from its records when a server opens it.
#[test]
fn a_postgres_database_from_before_the_job_columns_gets_them_from_its_records() {
    let pg = pg::Postgres::start("columns");
    drop(PgStore::open(&pg.url()).unwrap());
    let mut client = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    // Back to step 3: without what steps 4 to 10 add.
    client
        .batch_execute(
            "DROP INDEX jobs_unfinished; DROP INDEX jobs_finished; DROP INDEX jobs_by_tenant; DROP INDEX jobs_by_array;
             ALTER TABLE jobs DROP COLUMN finished;
             ALTER TABLE jobs RESET (fillfactor);
             ALTER TABLE jobs DROP COLUMN state, DROP COLUMN tier, DROP COLUMN gpus, DROP COLUMN name,
                 DROP COLUMN array_id, DROP COLUMN array_index, DROP COLUMN attempt, DROP COLUMN preemptions;
             ALTER TABLE output DROP COLUMN node;
             DROP TABLE registry_logins;
             DROP TABLE output_expiry;
             DROP TABLE webhooks; DROP TABLE webhook_outbox; DROP TABLE webhook_log;
             UPDATE ebb_schema SET version = 3;
             INSERT INTO tenants (id, name) VALUES (1, 'default');",
        )
        .unwrap();
    for (id, record) in [
        (
            1i64,
            json!({ "id": 1, "state": "succeeded", "tier": "on-demand", "gpus": 2, "attempt": 1,
                       "preemptions": 0, "spec": { "name": "a", "argv": ["true"] } }),
        ),
        (
            2,
            json!({ "id": 2, "state": "queued", "tier": "preemptible", "gpus": 1, "attempt": 0,
                    "preemptions": 0, "spec": { "argv": ["true"] },
                    "array": { "id": 2, "index": 0, "tasks": 2 } }),
        ),
        (
            3,
            json!({ "id": 3, "state": "failed", "tier": "preemptible", "gpus": 1, "attempt": 2,
                    "preemptions": 1, "spec": { "argv": ["true"] },
                    "array": { "id": 2, "index": 1, "tasks": 2 } }),
        ),
    ] {
        client
            .execute("INSERT INTO jobs (id, tenant, record) VALUES ($1, 1, $2)", &[&id, &record.to_string()])
            .unwrap();
    }
    let mut store = PgStore::open(&pg.url()).unwrap();
    let named = JobPageQuery { name: Some("a".into()), limit: 10, ..Default::default() };
    assert_eq!(store.job_page::<Value>(&named).unwrap().rows.len(), 1);
    let tasks = store.array_tasks(JobId(2)).unwrap();
    assert_eq!(
        tasks
            .iter()
            .map(|t| (t.id.0, t.index, t.state.as_str(), t.attempt.0, t.preemptions))
            .collect::<Vec<_>>(),
        vec![(2, 0, "queued", 0, 0), (3, 1, "failed", 2, 1)]
    );
    let counts = store.finished_counts().unwrap();
    assert_eq!(
        counts.iter().map(|c| (c.tier.as_str(), c.state.as_str(), c.jobs, c.gpus)).collect::<Vec<_>>(),
        vec![("on-demand", "succeeded", 1, 2), ("preemptible", "failed", 1, 1)]
    );
    let loaded = store.load::<Value>().unwrap().jobs;
    assert_eq!(loaded.iter().map(|j| j["id"].as_i64().unwrap()).collect::<Vec<_>>(), vec![2]);
}

/// A transaction of more rows than PostgreSQL's store holds back is
/// written ahead, chunk by chunk, while it goes on: what the transaction
/// reads in between sees every write before it, a job written again after
/// its first row went ahead keeps the later, events keep their order, a
/// rollback leaves nothing of the chunks, and a chunk's failure fails the
/// commit with the database's words.
#[test]
fn a_large_postgres_transaction_is_written_ahead_in_order() {
    let pg = pg::Postgres::start("ahead");
    let mut store = PgStore::open(&pg.url()).unwrap();
    store.begin().unwrap();
    store.put_tenant(&TenantRow { id: TenantId(1), name: "default".into() }).unwrap();
    store.commit().unwrap();
    let submitted = |at| event(at, EventKind::Submitted, 0, json!({ "tier": "preemptible" }));

    store.begin().unwrap();
    for id in 1..=3000u64 {
        store.put_job(JobId(id), &columns(1, "queued"), &json!({ "id": id, "state": "queued" })).unwrap();
        store.add_event(JobId(id), &submitted(id)).unwrap();
        if id == 1500 {
            assert_eq!(store.max_job_id().unwrap(), JobId(1500), "every job so far, read mid-transaction");
            assert_eq!(
                store.job::<Value>(JobId(1500)).unwrap(),
                Some(json!({ "id": 1500, "state": "queued" }))
            );
            assert_eq!(store.events(JobId(1)).unwrap(), vec![submitted(1)]);
        }
    }
    store.put_job(JobId(1), &columns(1, "running"), &json!({ "id": 1, "state": "running" })).unwrap();
    store
        .add_event(JobId(1), &event(9_000, EventKind::Started, 1, json!({ "node": "n1", "pid": 7 })))
        .unwrap();
    store.commit().unwrap();

    let mut other = PgStore::open(&pg.url()).unwrap();
    assert_eq!(other.max_job_id().unwrap(), JobId(3000));
    assert_eq!(other.job::<Value>(JobId(1)).unwrap(), Some(json!({ "id": 1, "state": "running" })));
    assert_eq!(
        other.events(JobId(1)).unwrap(),
        vec![submitted(1), event(9_000, EventKind::Started, 1, json!({ "node": "n1", "pid": 7 }))]
    );
    let queued = JobPageQuery { states: Some(vec!["queued".into()]), limit: 5000, ..Default::default() };
    assert_eq!(other.job_page::<Value>(&queued).unwrap().rows.len(), 2999);

    // Rolled back after chunks went ahead: none of them stays.
    store.begin().unwrap();
    for id in 3001..=4500u64 {
        store.put_job(JobId(id), &columns(1, "queued"), &json!({ "id": id })).unwrap();
    }
    store.rollback().unwrap();
    assert_eq!(other.max_job_id().unwrap(), JobId(3000));

    // A chunk the database refuses (a tenant it does not have) fails the
    // transaction: at the commit at the latest, saying why.
    store.begin().unwrap();
    let mut failed = None;
    for id in 5001..=6000u64 {
        if let Err(e) = store.put_job(JobId(id), &columns(99, "queued"), &json!({ "id": id })) {
            failed = Some(e);
            break;
        }
    }
    let err = match failed {
        Some(e) => e,
        None => store.commit().expect_err("a chunk of jobs of no tenant is refused"),
    };
    assert!(err.to_string().contains("foreign key"), "{err}");
    store.rollback().unwrap();
    assert_eq!(other.max_job_id().unwrap(), JobId(3000));
    // The store goes on after the rollback.
    store.begin().unwrap();
    store.put_job(JobId(3001), &columns(1, "queued"), &json!({ "id": 3001 })).unwrap();
    store.commit().unwrap();
    assert_eq!(other.max_job_id().unwrap(), JobId(3001));
}
