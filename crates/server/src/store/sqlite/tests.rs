//! The SQLite store's own tests: its indices, its migrations from older
//! databases' layouts, and its checkpointer.

use super::*;

/// A directory of the test's own for a database file, removed when the
/// test is done with it.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn db(&self) -> std::path::PathBuf {
        self.0.join("ebb.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("ebb-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Every lookup the writer makes while it runs (loads at start read
/// whole tables) searches an index or a primary key: none scans a
/// table that grows with the jobs.
#[test]
fn every_lookup_searches_an_index() {
    let dir = scratch("plans");
    let store = SqliteStore::open(&dir.db()).unwrap();
    let lookups = [
        "SELECT at_ms, kind, attempt, detail FROM events WHERE job = 1 ORDER BY seq",
        "SELECT record FROM logs WHERE job = 1",
        "SELECT session, seq FROM reports WHERE node = 'a'",
        "SELECT COALESCE(MAX(start + length(data)), 0) FROM output WHERE job = 1",
        "SELECT start, data FROM output WHERE job = 1 AND start < 10 AND start + length(data) > 0 ORDER BY start",
        "SELECT record FROM usage WHERE tenant = 1 AND ended_ms >= 0 AND ended_ms < 10 \
         ORDER BY ended_ms, job, attempt",
        "SELECT record FROM usage WHERE ended_ms >= 0 AND ended_ms < 10 ORDER BY ended_ms, job, attempt",
        "SELECT record FROM usage WHERE job = 1 ORDER BY attempt",
        "SELECT MAX(id) FROM jobs",
    ];
    let mut lookups: Vec<String> = lookups.iter().map(|s| s.to_string()).collect();
    lookups.extend([
        "SELECT record FROM jobs WHERE id = 1".to_string(),
        // As the writer has them, the array bound: the index of
        // arrays' tasks alone serves `array_id = ?` whatever is bound.
        "SELECT state, COUNT(*) FROM jobs WHERE array_id = ?1 GROUP BY state ORDER BY state".into(),
        "SELECT id, array_index, state, attempt, preemptions FROM jobs WHERE array_id = ?1 ORDER BY id"
            .into(),
    ]);
    // The listing, in every shape a page can take.
    let states = || Some(vec!["queued".to_string(), "running".to_string()]);
    for desc in [false, true] {
        for tenant in [None, Some(TenantId(2))] {
            for collapse in [false, true] {
                for q in [
                    JobPageQuery { states: states(), ..Default::default() },
                    JobPageQuery { tier: Some("preemptible".into()), ..Default::default() },
                    JobPageQuery { name: Some("train".into()), ..Default::default() },
                    JobPageQuery { cursor: Some(JobId(7)), ..Default::default() },
                    JobPageQuery {
                        states: states(),
                        tier: Some("on-demand".into()),
                        name: Some("x".into()),
                        ..Default::default()
                    },
                ] {
                    let q = JobPageQuery { desc, tenant, collapse, limit: 50, ..q };
                    let (sql, args) = job_page_sql(&q, false).expect("a query");
                    let mut sql = sql;
                    // Bound as literals, as EXPLAIN is given them here.
                    for (i, arg) in args.iter().enumerate().rev() {
                        let value = match arg {
                            PageArg::Int(n) => n.to_string(),
                            PageArg::Text(t) => format!("'{t}'"),
                        };
                        sql = sql.replace(&format!("?{}", i + 1), &value);
                    }
                    lookups.push(sql);
                }
            }
        }
    }
    for sql in lookups {
        let mut stmt = store.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let args = std::iter::repeat_n(1, stmt.parameter_count());
        let plan: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(plan.iter().all(|step| !step.starts_with("SCAN")), "{sql}: scans a table: {plan:?}");
    }
}

/// The store's names of finished and unfinished states are the
/// writer's: a job it loads is one it keeps in memory.
#[test]
fn the_finished_states_are_the_final_ones() {
    for state in crate::engine::JobState::ALL {
        assert_eq!(FINISHED_STATES.contains(&state.as_str()), state.is_final(), "{state:?}");
        assert_eq!(UNFINISHED_STATES.contains(&state.as_str()), !state.is_final(), "{state:?}");
    }
}

/// A database of the release before the job columns (schema step 7)
/// gets them filled from its records, and its finished jobs counted
/// and left out of the load.
#[test]
fn jobs_from_before_the_job_columns_get_them_from_their_records() {
    let dir = scratch("job-columns");
    let path = dir.db();
    {
        let mut conn = Connection::open(&path).unwrap();
        let steps = MIGRATIONS[..7].iter().map(|sql| rusqlite_migration::M::up(sql)).collect();
        rusqlite_migration::Migrations::new(steps).to_latest(&mut conn).unwrap();
        conn.execute_batch(
            r#"INSERT INTO tenants (id, name) VALUES (1, 'default'), (2, 'acme');
             INSERT INTO jobs (id, tenant, record) VALUES
             (1, 1, '{"id":1,"state":"succeeded","tier":"on-demand","gpus":2,"attempt":1,"preemptions":0,
                      "spec":{"name":"train","argv":["true"]}}'),
             (2, 2, '{"id":2,"state":"queued","tier":"preemptible","gpus":1,"attempt":0,"preemptions":0,
                      "spec":{"argv":["true"]},"array":{"id":2,"index":0,"tasks":2}}'),
             (3, 2, '{"id":3,"state":"cancelled","tier":"preemptible","gpus":1,"attempt":3,"preemptions":2,
                      "spec":{"argv":["true"]},"array":{"id":2,"index":1,"tasks":2}}');"#,
        )
        .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    let page = |store: &mut SqliteStore, q: JobPageQuery| -> Vec<i64> {
        let q = JobPageQuery { limit: 10, ..q };
        store
            .job_page::<serde_json::Value>(&q)
            .unwrap()
            .rows
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(page(&mut store, JobPageQuery { name: Some("train".into()), ..Default::default() }), [1]);
    assert_eq!(
        page(&mut store, JobPageQuery { tenant: Some(TenantId(2)), collapse: true, ..Default::default() }),
        [2]
    );
    let cancelled = Some(vec!["cancelled".to_string()]);
    assert_eq!(page(&mut store, JobPageQuery { states: cancelled, ..Default::default() }), [3]);
    let tasks = store.array_tasks(JobId(2)).unwrap();
    assert_eq!(
        tasks
            .iter()
            .map(|t| (t.id.0, t.index, t.state.as_str(), t.attempt.0, t.preemptions))
            .collect::<Vec<_>>(),
        [(2, 0, "queued", 0, 0), (3, 1, "cancelled", 3, 2)]
    );
    let counts = store.finished_counts().unwrap();
    assert_eq!(
        counts.iter().map(|c| (c.tier.as_str(), c.state.as_str(), c.jobs, c.gpus)).collect::<Vec<_>>(),
        [("on-demand", "succeeded", 1, 2), ("preemptible", "cancelled", 1, 1)]
    );
    let loaded = store.load::<serde_json::Value>().unwrap().jobs;
    assert_eq!(loaded.iter().map(|j| j["id"].as_i64().unwrap()).collect::<Vec<_>>(), [2]);
}

#[test]
fn logs_from_before_the_store_kept_output_are_marked_files() {
    let dir = scratch("logs-in-files");
    let path = dir.db();
    {
        let mut conn = Connection::open(&path).unwrap();
        let steps = MIGRATIONS[..6].iter().map(|sql| rusqlite_migration::M::up(sql)).collect();
        rusqlite_migration::Migrations::new(steps).to_latest(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO tenants (id, name) VALUES (1, 'default');
             INSERT INTO jobs (id, tenant, record) VALUES (3, 1, '{}'), (4, 1, '{}');
             INSERT INTO logs (job, record) VALUES (3, '{\"bytes\":42}');",
        )
        .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.log_state(JobId(3)).unwrap(), Some(LogState { bytes: 42, file: true }));
    // A log begun now is the store's, and says nothing of files.
    store.put_log_state(JobId(4), &LogState { bytes: 7, file: false }).unwrap();
    let record: String =
        store.conn.query_row("SELECT record FROM logs WHERE job = 4", [], |r| r.get(0)).unwrap();
    assert_eq!(record, r#"{"bytes":7}"#);
    assert_eq!(store.log_state(JobId(4)).unwrap(), Some(LogState { bytes: 7, file: false }));
}

/// A database made before the schema steps were numbered (its tokens
/// have no node column) is adopted and brought to the latest step,
/// keeping what it holds.
#[test]
fn a_database_from_before_numbered_migrations_is_migrated() {
    let dir = scratch("old");
    let path = dir.db();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tenants (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
             CREATE TABLE tokens (
                 hash TEXT PRIMARY KEY, tenant INTEGER REFERENCES tenants(id), scope TEXT NOT NULL);
             INSERT INTO tenants (id, name) VALUES (1, 'default');
             INSERT INTO tokens (hash, tenant, scope) VALUES ('old', 1, 'admin');",
        )
        .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    let node = TokenRow { hash: "n".into(), tenant: None, scope: Scope::Node, node: Some("node-1".into()) };
    store.put_token(&node).unwrap();
    let snapshot = store.load::<serde_json::Value>().unwrap();
    let admin = TokenRow { hash: "old".into(), tenant: Some(TenantId(1)), scope: Scope::Admin, node: None };
    assert_eq!(snapshot.tokens.len(), 2);
    assert!(snapshot.tokens.contains(&admin) && snapshot.tokens.contains(&node));
    store.delete_token("n").unwrap();
    assert_eq!(store.load::<serde_json::Value>().unwrap().tokens, vec![admin]);
    drop(store);
    // Opening again runs no step twice.
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, MIGRATIONS.len() as i64);
    drop(conn);
    SqliteStore::open(&path).unwrap();
}

/// The checkpointer leaves a short log as it is (copied back, the next
/// commit would start it again and sync its header, a second sync), and
/// copies one of `CHECKPOINT_PAGES` or more back into the database file a
/// while after, without the writer: the file alone, copied without its
/// log, then has what was committed; and the next commit starts the log
/// from its beginning.
#[test]
fn the_checkpointer_copies_a_long_log_into_the_database_file_and_leaves_a_short_one() {
    let dir = scratch("checkpointer");
    let path = dir.db();
    let mut store = SqliteStore::open(&path).unwrap();
    let token = |hash: &str| TokenRow { hash: hash.into(), tenant: None, scope: Scope::Admin, node: None };
    store.begin().unwrap();
    store.put_token(&token("committed")).unwrap();
    store.commit().unwrap();
    assert!(LOG_PAGES.get() < CHECKPOINT_PAGES, "{} pages", LOG_PAGES.get());
    let copy = path.with_file_name("copy.db");
    let in_file = || {
        let _ = std::fs::remove_file(copy.with_extension("db-wal"));
        std::fs::copy(&path, &copy).ok()?;
        let conn = Connection::open(&copy).ok()?;
        conn.query_row("SELECT count(*) FROM tokens WHERE hash = 'committed'", [], |r| r.get::<_, i64>(0))
            .ok()
    };
    std::thread::sleep(CHECKPOINT_AFTER * 3);
    assert_ne!(in_file(), Some(1), "a short log was copied back");

    // A commit that makes the log long.
    store.begin().unwrap();
    store.conn.execute_batch("CREATE TABLE filler (b BLOB)").unwrap();
    for _ in 0..CHECKPOINT_PAGES + 100 {
        store.conn.execute("INSERT INTO filler (b) VALUES (zeroblob(4000))", []).unwrap();
    }
    store.commit().unwrap();
    assert!(LOG_PAGES.get() >= CHECKPOINT_PAGES, "{} pages", LOG_PAGES.get());
    assert!(store.checkpoints.due.load(std::sync::atomic::Ordering::Acquire), "no copy due");
    let copied = |tokens: i64| {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let count = || {
            let _ = std::fs::remove_file(copy.with_extension("db-wal"));
            std::fs::copy(&path, &copy).ok()?;
            let conn = Connection::open(&copy).ok()?;
            conn.query_row("SELECT count(*) FROM tokens", [], |r| r.get::<_, i64>(0)).ok()
        };
        while count() != Some(tokens) {
            assert!(std::time::Instant::now() < give_up, "the commit never reached the database file");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    copied(1);
    assert_eq!(in_file(), Some(1));
    store.begin().unwrap();
    store.put_token(&token("next")).unwrap();
    store.commit().unwrap();
    assert!(LOG_PAGES.get() < 10, "the log did not start again: {} pages", LOG_PAGES.get());

    // Once copied, a long log is due again: commits that follow one
    // another, each found the log long, make one copy due.
    for round in 0..3 {
        store.begin().unwrap();
        for _ in 0..CHECKPOINT_PAGES / 2 + 60 {
            store.conn.execute("INSERT INTO filler (b) VALUES (zeroblob(4000))", []).unwrap();
        }
        store.put_token(&token(&format!("round {round}"))).unwrap();
        store.commit().unwrap();
    }
    assert!(LOG_PAGES.get() >= CHECKPOINT_PAGES, "{} pages", LOG_PAGES.get());
    copied(5);
    drop(store);
}

/// The store writes its log's first frames ahead when it opens, and what
/// is committed into them is what a recovery finds: a copy of the files
/// as a crash would leave them (the database and its log, no index of
/// the log) has every commit and nothing after, the zeros past the last
/// frame read as the log's end.
#[test]
fn the_log_is_written_ahead_and_a_crash_recovers_every_commit_from_it() {
    let dir = scratch("presized");
    let path = dir.db();
    let log = log_path;
    let mut store = SqliteStore::open(&path).unwrap();
    let presized = std::fs::metadata(log(&path)).unwrap().len();
    assert!(presized >= PRESIZED_LOG_FRAMES * 4096, "the log is {presized} bytes");
    let token = |hash: String| TokenRow { hash, tenant: None, scope: Scope::Admin, node: None };
    for i in 0..50 {
        store.begin().unwrap();
        store.put_token(&token(format!("t{i}"))).unwrap();
        store.commit().unwrap();
    }
    assert_eq!(std::fs::metadata(log(&path)).unwrap().len(), presized, "the commits grew the log");

    let copy = path.with_file_name("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(log(&path), log(&copy)).unwrap();
    let conn = Connection::open(&copy).unwrap();
    let count: i64 = conn.query_row("SELECT count(*) FROM tokens", [], |r| r.get(0)).unwrap();
    assert_eq!(count, 50);
    drop(conn);

    // Closed, SQLite copies the log back and removes it; opened again,
    // the store writes it ahead again.
    drop(store);
    assert!(!log(&path).exists(), "the log outlived the store");
    let reopened = SqliteStore::open(&path).unwrap();
    let count: i64 = reopened.conn.query_row("SELECT count(*) FROM tokens", [], |r| r.get(0)).unwrap();
    assert_eq!(count, 50);
    assert_eq!(std::fs::metadata(log(&path)).unwrap().len(), presized);
}

/// A disk with no room for the zeros: a clear error that names the log
/// (the store warns and goes on without them).
#[test]
fn a_full_disk_fails_the_write_ahead_with_the_logs_name() {
    let dir = scratch("presize-full");
    let path = dir.db();
    std::os::unix::fs::symlink("/dev/full", log_path(&path)).unwrap();
    let conn = Connection::open_in_memory().unwrap();
    let error = presize_log(&conn, &path).unwrap_err().to_string();
    assert!(error.contains("ebb.db-wal") && error.contains("No space left"), "{error}");
}

/// The write ahead at its extremes: no log yet is left to SQLite to
/// make; a log already as long or longer is untouched; a short one keeps
/// every byte it had and gets zeros after them up to the length.
#[test]
fn the_write_ahead_touches_nothing_the_log_holds() {
    let dir = scratch("presize-extremes");
    let path = dir.db();
    let log = log_path(&path);
    let conn = Connection::open_in_memory().unwrap();
    let want = 32 + PRESIZED_LOG_FRAMES * (24 + 4096);

    presize_log(&conn, &path).unwrap();
    assert!(!log.exists(), "a log was made where SQLite had none");

    let long: Vec<u8> = (0..want + 1).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&log, &long).unwrap();
    presize_log(&conn, &path).unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), long);

    let short: Vec<u8> = (0..100u8).map(|i| i | 1).collect();
    std::fs::write(&log, &short).unwrap();
    presize_log(&conn, &path).unwrap();
    let written = std::fs::read(&log).unwrap();
    assert_eq!(written.len() as u64, want);
    assert_eq!(&written[..100], &short[..]);
    assert!(written[100..].iter().all(|&b| b == 0));
    assert!(conn.is_autocommit(), "the write lock was kept");
}
