//! The embedded store: one SQLite file in the data directory, in WAL mode
//! with `synchronous=FULL`, its schema brought up by numbered migrations,
//! and a checkpointer thread that copies the log back off the writer's
//! thread.

use ebb_api::JobEvent;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::*;

pub struct SqliteStore {
    conn: Connection,
    /// Copies committed pages from the log back into the database, on a
    /// thread of its own.
    checkpoints: Checkpointer,
}

/// The page cache, KiB: the pages a fleet's worth of job records touch.
const PAGE_CACHE_KIB: i64 = 64 * 1024;

/// How long after a commit the checkpointer copies the log back: the
/// commits of that while share one copy of each page they rewrote.
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// The log's length, in pages, at which a commit copies back what the
/// checkpointer has not yet (SQLite's own checkpoint, in the writer's
/// thread). Under a load that never pauses, the log starts again from its
/// beginning only once a copy has caught up with the last commit, which
/// the checkpointer cannot do while the writer keeps committing: this is
/// the log's bound, and that copy is short.
const WAL_BOUND_PAGES: i64 = 10_000;

impl SqliteStore {
    pub fn open(path: &Path) -> Result<SqliteStore> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // SQLite's default page cache is 2 MiB: a batch that writes
        // thousands of job records then reads most of their pages back from
        // the OS and spills dirty ones to the WAL before it commits.
        conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)?;
        // Copying the log back is the checkpointer's, off the writer's
        // thread: a copy in a commit (SQLite's default, every 1,000 pages)
        // held up every caller of that batch, and a fleet's fill spent a
        // twentieth of the writer's time there. The writer copies what is
        // left when the log reaches its bound.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_BOUND_PAGES)?;
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        let checkpoints = Checkpointer::start(path)?;
        Ok(SqliteStore { conn, checkpoints })
    }
}

/// A thread with a connection of its own that copies the write-ahead log
/// back into the database a while after commits (`PASSIVE`: it never
/// waits for the writer, nor the writer for it). Stops when the store is
/// dropped.
struct Checkpointer {
    /// Rows the writer had changed at its last commit that changed any.
    changes: u64,
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Checkpointer> {
        let conn = Connection::open(path)?;
        // Its copies are synced as the writer's commits are.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("ebb-checkpoint".into())
            .spawn(move || Checkpointer::run(&conn, &woken))
            .map_err(|e| StoreError(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer { changes: 0, wake: Some(wake), thread: Some(thread) })
    }

    /// A commit happened, the writer's connection having changed
    /// `changes` rows since it opened: one that changed none wrote nothing
    /// to the log.
    fn committed(&mut self, changes: u64) {
        if changes == self.changes {
            return;
        }
        self.changes = changes;
        if let Some(wake) = &self.wake {
            // Full: a copy is already due.
            let _ = wake.try_send(());
        }
    }

    fn run(conn: &Connection, woken: &std::sync::mpsc::Receiver<()>) {
        use std::sync::mpsc::RecvTimeoutError;
        while woken.recv().is_ok() {
            let due = std::time::Instant::now() + CHECKPOINT_AFTER;
            loop {
                match woken.recv_timeout(due.saturating_duration_since(std::time::Instant::now())) {
                    Ok(()) => continue,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                // The next commit's wake tries again; the log's bound holds
                // meanwhile.
                tracing::warn!("copying the write-ahead log into the database: {e}");
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.wake = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The schema, one numbered step at a time: step N brings a database at
/// `user_version` N-1 to N, in one transaction. Steps are never edited
/// once released; a change is a new step. Step 1 is written so that it
/// also adopts a database created before steps were numbered.
const MIGRATIONS: &[&str] = &[
    // 1: the original schema.
    "CREATE TABLE IF NOT EXISTS tenants (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
     CREATE TABLE IF NOT EXISTS tokens (
         hash TEXT PRIMARY KEY, tenant INTEGER REFERENCES tenants(id), scope TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS jobs (
         id INTEGER PRIMARY KEY, tenant INTEGER NOT NULL REFERENCES tenants(id), record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS events (
         seq INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL REFERENCES jobs(id),
         at_ms INTEGER NOT NULL, kind TEXT NOT NULL, attempt INTEGER NOT NULL, detail TEXT NOT NULL);
     CREATE INDEX IF NOT EXISTS events_by_job ON events(job, seq);
     CREATE TABLE IF NOT EXISTS prices (model TEXT PRIMARY KEY, record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS reservations (id INTEGER PRIMARY KEY, record TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS usage (
         job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL,
         tenant INTEGER NOT NULL, ended_ms INTEGER NOT NULL, record TEXT NOT NULL,
         PRIMARY KEY (job, attempt));
     CREATE INDEX IF NOT EXISTS usage_by_end ON usage(ended_ms);
     CREATE TABLE IF NOT EXISTS heard (node TEXT PRIMARY KEY, at_ms INTEGER NOT NULL);",
    // 2: per-node credentials: a token may be bound to one node.
    "ALTER TABLE tokens ADD COLUMN node TEXT;",
    // 3: limits the operator set for single tenants.
    "CREATE TABLE tenant_limits (tenant INTEGER PRIMARY KEY REFERENCES tenants(id), record TEXT NOT NULL);",
    // 4: how much of each job's log is committed.
    "CREATE TABLE logs (job INTEGER PRIMARY KEY REFERENCES jobs(id), record TEXT NOT NULL);",
    // 5: the last report applied from each node (its agent's session and
    // the report's number), so that a report sent again is applied once.
    "CREATE TABLE reports (node TEXT PRIMARY KEY, session INTEGER NOT NULL, seq INTEGER NOT NULL);",
    // 6: operators' reclaims of preemptible capacity, by model: the most
    // GPUs preemptible work of that model may hold.
    "CREATE TABLE reclaims (model TEXT PRIMARY KEY, preemptible_limit INTEGER NOT NULL);",
    // 7: jobs' output, in the database as every other record is (a file
    // per job cost a file creation per start: at a fleet's scale, most of
    // the writer's time). One row per piece, by where it starts in the
    // log. Logs written before stay files, marked so.
    "CREATE TABLE output (
         job INTEGER NOT NULL REFERENCES jobs(id), start INTEGER NOT NULL, data BLOB NOT NULL,
         PRIMARY KEY (job, start)) WITHOUT ROWID;
     UPDATE logs SET record = json_set(record, '$.file', json('true'));",
    // 8: what the listing, arrays' progress and the finished jobs' counts
    // read, as columns beside the record, filled from the records there
    // are: finished jobs stay only here, never in the writer's memory.
    "ALTER TABLE jobs ADD COLUMN state TEXT;
     ALTER TABLE jobs ADD COLUMN tier TEXT;
     ALTER TABLE jobs ADD COLUMN gpus INTEGER;
     ALTER TABLE jobs ADD COLUMN name TEXT;
     ALTER TABLE jobs ADD COLUMN array_id INTEGER;
     ALTER TABLE jobs ADD COLUMN array_index INTEGER;
     ALTER TABLE jobs ADD COLUMN attempt INTEGER;
     ALTER TABLE jobs ADD COLUMN preemptions INTEGER;
     UPDATE jobs SET
         state = json_extract(record, '$.state'),
         tier = json_extract(record, '$.tier'),
         gpus = json_extract(record, '$.gpus'),
         name = json_extract(record, '$.spec.name'),
         array_id = json_extract(record, '$.array.id'),
         array_index = json_extract(record, '$.array.index'),
         attempt = json_extract(record, '$.attempt'),
         preemptions = json_extract(record, '$.preemptions');
     CREATE INDEX jobs_by_state ON jobs(state, id);
     CREATE INDEX jobs_by_tenant ON jobs(tenant, id);
     CREATE INDEX jobs_by_array ON jobs(array_id, state);",
    // 9: events numbered by their row, no longer by an AUTOINCREMENT
    // sequence (a write of the sequence's own row per event: a quarter of
    // an event's cost; events are never deleted, so the row's number still
    // only grows); and the array index of arrays' tasks alone, so that a
    // state change of any other job no longer moves an entry there.
    "CREATE TABLE events_numbered (
         seq INTEGER PRIMARY KEY, job INTEGER NOT NULL REFERENCES jobs(id),
         at_ms INTEGER NOT NULL, kind TEXT NOT NULL, attempt INTEGER NOT NULL, detail TEXT NOT NULL);
     INSERT INTO events_numbered (seq, job, at_ms, kind, attempt, detail)
         SELECT seq, job, at_ms, kind, attempt, detail FROM events;
     DROP TABLE events;
     DELETE FROM sqlite_sequence WHERE name = 'events';
     ALTER TABLE events_numbered RENAME TO events;
     CREATE INDEX events_by_job ON events(job, seq);
     DROP INDEX jobs_by_array;
     CREATE INDEX jobs_by_array ON jobs(array_id, state) WHERE array_id IS NOT NULL;",
    // 10: which node wrote each piece of a gang's output (its pieces are
    // whole lines of one node's), for `ebb logs --label`.
    "ALTER TABLE output ADD COLUMN node TEXT;",
    // 11: tenants' registry logins, for their images' pulls.
    "CREATE TABLE registry_logins (tenant INTEGER NOT NULL REFERENCES tenants(id), registry TEXT NOT NULL,
         record TEXT NOT NULL, PRIMARY KEY (tenant, registry));",
];

/// Brings the database to the latest step of `MIGRATIONS`
/// (`rusqlite_migration`, which tracks the step in `PRAGMA user_version`
/// and runs each in its own transaction).
fn migrate(conn: &mut Connection) -> Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if usize::try_from(version).unwrap_or(0) > MIGRATIONS.len() {
        return Err(StoreError(format!(
            "the database is at schema version {version}, newer than this ebb ({}): upgrade ebb",
            MIGRATIONS.len()
        )));
    }
    let steps = MIGRATIONS.iter().map(|sql| rusqlite_migration::M::up(sql)).collect();
    rusqlite_migration::Migrations::new(steps)
        .to_latest(conn)
        .map_err(|e| StoreError(format!("schema migration: {e}")))
}

impl SqliteStore {
    /// Runs one statement, prepared once and kept: a statement parsed and
    /// planned again for every job of a 10,000-job batch cost more than
    /// writing it.
    fn run(&self, sql: &str, args: impl rusqlite::Params) -> Result<usize> {
        Ok(self.conn.prepare_cached(sql)?.execute(args)?)
    }

    /// Rows of one JSON `record` column.
    fn records<T: for<'de> Deserialize<'de>>(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
    ) -> Result<Vec<T>> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows: Vec<String> = stmt.query_map(args, |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(rows.iter().map(|r| serde_json::from_str(r)).collect::<serde_json::Result<_>>()?)
    }
}

impl Store for SqliteStore {
    /// Deferred: the server's connection is the database's only writer
    /// (the data dir's lock; the checkpointer's only copies the log back),
    /// so a batch takes the write lock at its first write, and one that
    /// writes nothing (an idle heartbeat, a read) commits without touching
    /// the file.
    fn begin(&mut self) -> Result<()> {
        self.run("BEGIN", [])?;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.run("COMMIT", [])?;
        self.checkpoints.committed(self.conn.total_changes());
        Ok(())
    }

    fn rollback(&mut self) -> Result<()> {
        self.conn.execute_batch("ROLLBACK")?;
        Ok(())
    }

    fn load<J: JobRow>(&mut self) -> Result<Snapshot<J>> {
        let mut snapshot = Snapshot::empty();
        let mut stmt = self.conn.prepare("SELECT id, name FROM tenants ORDER BY id")?;
        snapshot.tenants = stmt
            .query_map([], |r| Ok(TenantRow { id: r.get(0)?, name: r.get(1)? }))?
            .collect::<rusqlite::Result<_>>()?;
        let mut stmt = self.conn.prepare("SELECT hash, tenant, scope, node FROM tokens")?;
        snapshot.tokens = stmt
            .query_map([], |r| {
                let scope = scope_of(&r.get::<_, String>(2)?);
                Ok(TokenRow { hash: r.get(0)?, tenant: r.get(1)?, scope, node: r.get(3)? })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut stmt = self.conn.prepare("SELECT record FROM nodes ORDER BY name")?;
        let nodes: Vec<String> = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        snapshot.nodes = nodes.iter().map(|n| serde_json::from_str(n)).collect::<serde_json::Result<_>>()?;
        // Row by row, each sharing what it has in common with the one
        // before (an array's tasks, one environment): a large array never
        // has every copy in memory at once.
        let mut stmt =
            self.conn.prepare("SELECT record FROM jobs WHERE state IN (?1, ?2, ?3, ?4) ORDER BY id")?;
        let mut rows = stmt.query(UNFINISHED_STATES)?;
        while let Some(row) = rows.next()? {
            let text: String = row.get(0)?;
            let mut job: J = serde_json::from_str(&text)?;
            if let Some(previous) = snapshot.jobs.last() {
                job.share_with(previous);
            }
            snapshot.jobs.push(job);
        }
        snapshot.prices = self.records("SELECT record FROM prices ORDER BY model", [])?;
        snapshot.reservations = self.records("SELECT record FROM reservations ORDER BY id", [])?;
        let mut stmt = self.conn.prepare("SELECT node, at_ms FROM heard")?;
        snapshot.heard = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut stmt = self.conn.prepare("SELECT tenant, record FROM tenant_limits ORDER BY tenant")?;
        let limits: Vec<(u32, String)> =
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        for (tenant, record) in limits {
            snapshot.tenant_limits.push((tenant, serde_json::from_str(&record)?));
        }
        let mut stmt = self
            .conn
            .prepare("SELECT tenant, registry, record FROM registry_logins ORDER BY tenant, registry")?;
        let logins: Vec<(u32, String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (tenant, registry, record) in logins {
            snapshot.registry_logins.push((tenant, registry, serde_json::from_str(&record)?));
        }
        let mut stmt = self.conn.prepare("SELECT model, preemptible_limit FROM reclaims ORDER BY model")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?;
        for row in rows {
            snapshot.reclaims.push(row?);
        }
        Ok(snapshot)
    }

    fn put_tenant(&mut self, t: &TenantRow) -> Result<()> {
        self.run("INSERT OR REPLACE INTO tenants (id, name) VALUES (?1, ?2)", params![t.id, t.name])?;
        Ok(())
    }

    fn put_token(&mut self, t: &TokenRow) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO tokens (hash, tenant, scope, node) VALUES (?1, ?2, ?3, ?4)",
            params![t.hash, t.tenant, scope_name(t.scope), t.node],
        )?;
        Ok(())
    }

    fn delete_token(&mut self, hash: &str) -> Result<()> {
        self.run("DELETE FROM tokens WHERE hash = ?1", params![hash])?;
        Ok(())
    }

    fn put_node(&mut self, node: &NodeRow) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO nodes (name, record) VALUES (?1, ?2)",
            params![node.name, serde_json::to_string(node)?],
        )?;
        Ok(())
    }

    fn put_job<J: Serialize>(&mut self, id: u64, c: &JobColumns, job: &J) -> Result<()> {
        let record = serde_json::to_string(job)?;
        // A job's tenant, GPUs, name and array never change once it is
        // stored: an update sets only what can, and its state only when
        // that changed (SQLite rewrites the entries of every index whose
        // column is set, whatever the value). When the hint is wrong, the
        // update finds no row and the upsert below writes it whole.
        if let Some(stored) = c.stored_state {
            let updated = if stored == c.state {
                self.run(
                    "UPDATE jobs SET record = ?2, tier = ?3, attempt = ?4, preemptions = ?5
                     WHERE id = ?1 AND state = ?6",
                    params![id as i64, record, c.tier, c.attempt, c.preemptions, c.state],
                )?
            } else {
                self.run(
                    "UPDATE jobs SET record = ?2, tier = ?3, attempt = ?4, preemptions = ?5, state = ?6
                     WHERE id = ?1",
                    params![id as i64, record, c.tier, c.attempt, c.preemptions, c.state],
                )?
            };
            if updated > 0 {
                return Ok(());
            }
        }
        self.run(
            "INSERT INTO jobs
                 (id, tenant, record, state, tier, gpus, name, array_id, array_index, attempt, preemptions)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, record = excluded.record,
                 state = excluded.state, tier = excluded.tier, gpus = excluded.gpus, name = excluded.name,
                 array_id = excluded.array_id, array_index = excluded.array_index,
                 attempt = excluded.attempt, preemptions = excluded.preemptions",
            params![
                id as i64,
                c.tenant,
                record,
                c.state,
                c.tier,
                c.gpus,
                c.name,
                c.array.map(|(array, _)| array as i64),
                c.array.map(|(_, index)| index.min(i64::MAX as u64) as i64),
                c.attempt,
                c.preemptions
            ],
        )?;
        Ok(())
    }

    fn job<J: JobRow>(&mut self, id: u64) -> Result<Option<J>> {
        Ok(self.records("SELECT record FROM jobs WHERE id = ?1", params![id as i64])?.pop())
    }

    fn job_page<J: JobRow>(&mut self, query: &JobPageQuery) -> Result<JobRows<J>> {
        let Some((sql, args)) = job_page_sql(query, false) else {
            return Ok(JobRows { rows: Vec::new(), cut: false });
        };
        let args: Vec<Box<dyn rusqlite::ToSql>> = args
            .into_iter()
            .map(|a| -> Box<dyn rusqlite::ToSql> {
                match a {
                    PageArg::Int(n) => Box::new(n),
                    PageArg::Text(t) => Box::new(t),
                }
            })
            .collect();
        let mut stmt = self.conn.prepare_cached(&sql)?;
        // Row by row: SQLite reads a row only when it is asked for.
        let records = stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(0))?;
        JobRows::read(records.map(|r| r.map_err(StoreError::from)), query)
    }

    fn array_states(&mut self, array: u64) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT state, COUNT(*) FROM jobs WHERE array_id = ?1 GROUP BY state ORDER BY state",
        )?;
        let rows = stmt.query_map(params![array as i64], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn array_tasks(&mut self, array: u64) -> Result<Vec<TaskRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, array_index, state, attempt, preemptions FROM jobs WHERE array_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![array as i64], |r| {
            Ok(TaskRow {
                id: r.get::<_, i64>(0)? as u64,
                index: r.get::<_, i64>(1)? as u64,
                state: r.get(2)?,
                attempt: r.get(3)?,
                preemptions: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn finished_counts(&mut self) -> Result<Vec<FinishedCount>> {
        let mut stmt = self.conn.prepare(
            "SELECT tier, state, COUNT(*), COALESCE(SUM(gpus), 0) FROM jobs
             WHERE state IN (?1, ?2, ?3) GROUP BY tier, state ORDER BY tier, state",
        )?;
        let rows = stmt.query_map(FINISHED_STATES, |r| {
            Ok(FinishedCount {
                tier: r.get(0)?,
                state: r.get(1)?,
                jobs: r.get::<_, i64>(2)? as u64,
                gpus: r.get::<_, i64>(3)? as u64,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn add_event(&mut self, job: u64, e: &JobEvent) -> Result<()> {
        self.run(
            "INSERT INTO events (job, at_ms, kind, attempt, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![job as i64, e.at_ms as i64, e.kind().as_str(), e.attempt, e.event.detail_json()],
        )?;
        Ok(())
    }

    fn events(&mut self, job: u64) -> Result<Vec<JobEvent>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT at_ms, kind, attempt, detail FROM events WHERE job = ?1 ORDER BY seq")?;
        let rows = stmt.query_map(params![job as i64], |r| {
            let at_ms: i64 = r.get(0)?;
            let detail: String = r.get(3)?;
            Ok((at_ms as u64, r.get::<_, String>(1)?, r.get::<_, u32>(2)?, detail))
        })?;
        let mut events = Vec::new();
        for row in rows {
            let (at_ms, kind, attempt, detail) = row?;
            let kind = kind.parse().map_err(StoreError)?;
            let event = stored_event(job, kind, &detail);
            events.push(JobEvent { at: crate::rfc3339(at_ms), at_ms, attempt, event });
        }
        Ok(events)
    }

    fn log_state(&mut self, job: u64) -> Result<Option<LogState>> {
        Ok(self.records("SELECT record FROM logs WHERE job = ?1", params![job as i64])?.pop())
    }

    fn put_log_state(&mut self, job: u64, state: &LogState) -> Result<()> {
        let mut stmt =
            self.conn.prepare_cached("INSERT OR REPLACE INTO logs (job, record) VALUES (?1, ?2)")?;
        stmt.execute(params![job as i64, serde_json::to_string(state)?])?;
        Ok(())
    }

    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Result<()> {
        match limit {
            Some(limit) => self.run(
                "INSERT OR REPLACE INTO reclaims (model, preemptible_limit) VALUES (?1, ?2)",
                params![model, limit],
            )?,
            None => self.run("DELETE FROM reclaims WHERE model = ?1", params![model])?,
        };
        Ok(())
    }

    fn last_report(&mut self, node: &str) -> Result<Option<ebb_api::ReportId>> {
        let mut stmt = self.conn.prepare_cached("SELECT session, seq FROM reports WHERE node = ?1")?;
        let id = stmt
            .query_row(params![node], |r| {
                Ok(ebb_api::ReportId { session: r.get::<_, i64>(0)? as u64, seq: r.get::<_, i64>(1)? as u64 })
            })
            .optional()?;
        Ok(id)
    }

    fn put_last_report(&mut self, node: &str, id: ebb_api::ReportId) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("INSERT OR REPLACE INTO reports (node, session, seq) VALUES (?1, ?2, ?3)")?;
        stmt.execute(params![node, id.session as i64, id.seq as i64])?;
        Ok(())
    }

    fn put_output(&mut self, job: u64, offset: u64, data: &[u8], node: Option<&str>) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("INSERT INTO output (job, start, data, node) VALUES (?1, ?2, ?3, ?4)")?;
        stmt.execute(params![job as i64, offset as i64, data, node])?;
        Ok(())
    }

    fn output_sources(&mut self, job: u64, from: u64, to: u64) -> Result<Vec<(u64, String)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT start, node FROM output
             WHERE job = ?1 AND start < ?3 AND start + length(data) > ?2 AND node IS NOT NULL ORDER BY start",
        )?;
        let rows = stmt.query_map(params![job as i64, from as i64, to as i64], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get::<_, String>(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn output_len(&mut self, job: u64) -> Result<u64> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(start + length(data)), 0) FROM output WHERE job = ?1")?;
        Ok(stmt.query_row(params![job as i64], |row| row.get::<_, i64>(0))? as u64)
    }

    fn output(&mut self, job: u64, from: u64, to: u64) -> Result<Vec<u8>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT start, data FROM output
             WHERE job = ?1 AND start < ?3 AND start + length(data) > ?2 ORDER BY start",
        )?;
        let pieces = stmt.query_map(params![job as i64, from as i64, to as i64], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get::<_, Vec<u8>>(1)?))
        })?;
        let mut out = Vec::new();
        for piece in pieces {
            let (start, data) = piece?;
            if !append_piece(&mut out, from, to, start, &data) {
                break;
            }
        }
        Ok(out)
    }

    fn put_tenant_limits(&mut self, tenant: u32, limits: &ebb_api::TenantLimits) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("INSERT OR REPLACE INTO tenant_limits (tenant, record) VALUES (?1, ?2)")?;
        stmt.execute(params![tenant, serde_json::to_string(limits)?])?;
        Ok(())
    }

    fn put_registry_login(
        &mut self,
        tenant: u32,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<()> {
        match login {
            Some(login) => self
                .run(
                    "INSERT OR REPLACE INTO registry_logins (tenant, registry, record) VALUES (?1, ?2, ?3)",
                    params![tenant, registry, serde_json::to_string(login)?],
                )
                .map(drop),
            None => self
                .run(
                    "DELETE FROM registry_logins WHERE tenant = ?1 AND registry = ?2",
                    params![tenant, registry],
                )
                .map(drop),
        }
    }

    fn heard(&mut self, node: &str, at_ms: u64) -> Result<()> {
        let mut stmt =
            self.conn.prepare_cached("INSERT OR REPLACE INTO heard (node, at_ms) VALUES (?1, ?2)")?;
        stmt.execute(params![node, at_ms as i64])?;
        Ok(())
    }

    fn put_price(&mut self, p: &PriceRow) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO prices (model, record) VALUES (?1, ?2)",
            params![p.gpu_model, serde_json::to_string(p)?],
        )?;
        Ok(())
    }

    fn put_reservation(&mut self, r: &ReservationRow) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO reservations (id, record) VALUES (?1, ?2)",
            params![r.id as i64, serde_json::to_string(r)?],
        )?;
        Ok(())
    }

    fn delete_reservation(&mut self, id: u64) -> Result<()> {
        self.run("DELETE FROM reservations WHERE id = ?1", params![id as i64])?;
        Ok(())
    }

    fn add_usage(&mut self, u: &UsageRow) -> Result<()> {
        self.run(
            "INSERT INTO usage (job, attempt, tenant, ended_ms, record) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![u.job as i64, u.attempt, u.tenant, u.ended_ms as i64, serde_json::to_string(u)?],
        )?;
        Ok(())
    }

    fn usage(&mut self, tenant: Option<u32>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>> {
        let clamp = |ms: u64| ms.min(i64::MAX as u64) as i64;
        let (from, to) = (clamp(from_ms), clamp(to_ms));
        match tenant {
            Some(t) => self.records(
                "SELECT record FROM usage WHERE tenant = ?1 AND ended_ms >= ?2 AND ended_ms < ?3 ORDER BY ended_ms, job, attempt",
                params![t, from, to],
            ),
            None => self.records(
                "SELECT record FROM usage WHERE ended_ms >= ?1 AND ended_ms < ?2 ORDER BY ended_ms, job, attempt",
                params![from, to],
            ),
        }
    }

    fn job_usage(&mut self, job: u64) -> Result<Vec<UsageRow>> {
        self.records("SELECT record FROM usage WHERE job = ?1 ORDER BY attempt", params![job as i64])
    }

    fn max_job_id(&mut self) -> Result<u64> {
        let id: Option<i64> =
            self.conn.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0)).optional()?.flatten();
        Ok(id.unwrap_or(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("ebb.db")
    }

    /// Every lookup the writer makes while it runs (loads at start read
    /// whole tables) searches an index or a primary key: none scans a
    /// table that grows with the jobs.
    #[test]
    fn every_lookup_searches_an_index() {
        let store = SqliteStore::open(&scratch("plans")).unwrap();
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
            for tenant in [None, Some(2)] {
                for collapse in [false, true] {
                    for q in [
                        JobPageQuery { states: states(), ..Default::default() },
                        JobPageQuery { tier: Some("preemptible".into()), ..Default::default() },
                        JobPageQuery { name: Some("train".into()), ..Default::default() },
                        JobPageQuery { cursor: Some(7), ..Default::default() },
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
        let path = scratch("job-columns");
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
            page(&mut store, JobPageQuery { tenant: Some(2), collapse: true, ..Default::default() }),
            [2]
        );
        let cancelled = Some(vec!["cancelled".to_string()]);
        assert_eq!(page(&mut store, JobPageQuery { states: cancelled, ..Default::default() }), [3]);
        let tasks = store.array_tasks(2).unwrap();
        assert_eq!(
            tasks
                .iter()
                .map(|t| (t.id, t.index, t.state.as_str(), t.attempt, t.preemptions))
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
        let path = scratch("logs-in-files");
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
        assert_eq!(store.log_state(3).unwrap(), Some(LogState { bytes: 42, file: true }));
        // A log begun now is the store's, and says nothing of files.
        store.put_log_state(4, &LogState { bytes: 7, file: false }).unwrap();
        let record: String =
            store.conn.query_row("SELECT record FROM logs WHERE job = 4", [], |r| r.get(0)).unwrap();
        assert_eq!(record, r#"{"bytes":7}"#);
        assert_eq!(store.log_state(4).unwrap(), Some(LogState { bytes: 7, file: false }));
    }

    /// A database made before the schema steps were numbered (its tokens
    /// have no node column) is adopted and brought to the latest step,
    /// keeping what it holds.
    #[test]
    fn a_database_from_before_numbered_migrations_is_migrated() {
        let path = scratch("old");
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
        let node =
            TokenRow { hash: "n".into(), tenant: None, scope: Scope::Node, node: Some("node-1".into()) };
        store.put_token(&node).unwrap();
        let snapshot = store.load::<serde_json::Value>().unwrap();
        let admin = TokenRow { hash: "old".into(), tenant: Some(1), scope: Scope::Admin, node: None };
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

    /// A commit reaches the database file without the writer copying the
    /// log back (its own copy waits for a log of `WAL_BOUND_PAGES`): the
    /// checkpointer copies it a while after. The file alone, copied
    /// without its log, has what was committed.
    #[test]
    fn the_checkpointer_copies_commits_into_the_database_file() {
        let path = scratch("checkpointer");
        let mut store = SqliteStore::open(&path).unwrap();
        store.begin().unwrap();
        let token = TokenRow { hash: "committed".into(), tenant: None, scope: Scope::Admin, node: None };
        store.put_token(&token).unwrap();
        store.commit().unwrap();
        let copy = path.with_file_name("copy.db");
        let in_file = || {
            let _ = std::fs::remove_file(copy.with_extension("db-wal"));
            std::fs::copy(&path, &copy).ok()?;
            let conn = Connection::open(&copy).ok()?;
            conn.query_row("SELECT count(*) FROM tokens WHERE hash = 'committed'", [], |r| r.get::<_, i64>(0))
                .ok()
        };
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while in_file() != Some(1) {
            assert!(std::time::Instant::now() < give_up, "the commit never reached the database file");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        drop(store);
    }
}
