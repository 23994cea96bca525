//! The embedded store: one SQLite file in the data directory, in WAL mode
//! with `synchronous=FULL`, its schema brought up by numbered migrations,
//! and a checkpointer thread that copies the log back off the writer's
//! thread.

use ebb_api::JobEvent;
use ebb_core::{Attempt, JobId, TenantId};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
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

/// How long after a commit the checkpointer looks at the log: the commits
/// of that while share one copy of each page they rewrote.
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// The log's length, in pages, from which the checkpointer copies it back.
/// Shorter, it is left as it is: the commit after a copy starts the log
/// again from its beginning, and that writes and syncs the log's header
/// before its own pages, a second sync. A server that commits now and then
/// (a preemption after a quiet while) would pay it at nearly every commit
/// if every commit were copied back; the log is then at most this long
/// while quiet (4 MiB).
const CHECKPOINT_PAGES: i64 = 1_000;

/// The log's length, in pages, at which a commit copies back what the
/// checkpointer has not yet (in the writer's thread, as SQLite's own
/// checkpoint would). Under a load that never pauses, the log starts again
/// from its beginning only once a copy has caught up with the last commit,
/// which the checkpointer cannot do while the writer keeps committing: this
/// is the log's bound, and that copy is short.
const WAL_BOUND_PAGES: i64 = 10_000;

/// The log's length, in frames, that the store writes ahead when it
/// opens: a quiet server's log starts again from its beginning a little
/// after [`CHECKPOINT_PAGES`], so it then stays within them.
const PRESIZED_LOG_FRAMES: u64 = 2 * CHECKPOINT_PAGES as u64;

/// Writes zeros past the end of the write-ahead log up to
/// [`PRESIZED_LOG_FRAMES`] frames, as PostgreSQL fills its log's segments
/// before it uses them (`wal_init_zero`). A commit that appends to a file
/// changes its size, and its sync then writes the file's inode too, a
/// second write the disk finishes before the sync returns; one that
/// overwrites written blocks syncs only them (a third less time per commit
/// here). SQLite never shortens its log while it is open (no
/// `journal_size_limit`), so only the first pass through it appended: the
/// first minutes of every server's life, and all of a short one's.
///
/// Only past the log's end, holding SQLite's write lock (no connection
/// appends meanwhile): what the log holds is untouched, and a recovery
/// reads frames from its beginning up to the first whose salt and
/// checksum do not match its header's, which zeros never do.
fn presize_log(conn: &Connection, path: &Path) -> Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let written = write_log_ahead(conn, path);
    // The transaction wrote nothing: it only held the lock.
    conn.execute_batch("ROLLBACK")?;
    written
}

/// The write-ahead log of the database at `db`: SQLite names it so.
fn log_path(db: &Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

fn write_log_ahead(conn: &Connection, path: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let page_size: u64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
    let name = log_path(path);
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", name.display()));
    // SQLite made the log at its first read: absent, it is left to SQLite.
    let log = match std::fs::OpenOptions::new().write(true).open(&name) {
        Ok(log) => log,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    let (header, frame_header) = (32, 24);
    let want = header + PRESIZED_LOG_FRAMES * (frame_header + page_size);
    let len = log.metadata().map_err(io)?.len();
    if len >= want {
        return Ok(());
    }
    let zeros = vec![0u8; 256 * 1024];
    let mut at = len;
    let written = loop {
        if at >= want {
            break log.sync_data();
        }
        let n = zeros.len().min((want - at) as usize);
        if let Err(e) = log.write_all_at(&zeros[..n], at) {
            break Err(e);
        }
        at += n as u64;
    };
    if let Err(e) = written {
        // A disk that is nearly full: its space is the database's, not
        // a head start's.
        let _ = log.set_len(len);
        return Err(io(e));
    }
    Ok(())
}

thread_local! {
    /// The log's length, in pages, after the last commit on this thread
    /// that wrote any: SQLite's commit hook says it.
    static LOG_PAGES: Cell<i64> = const { Cell::new(0) };
}

/// After a commit that wrote pages: note the log's length, and copy it
/// back here once it reaches its bound. A failed copy is not the
/// commit's failure (that has happened): the next commit tries again.
fn on_commit(wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    let pages = i64::from(pages);
    LOG_PAGES.set(pages);
    if pages >= WAL_BOUND_PAGES {
        if let Err(e) = wal.checkpoint() {
            tracing::warn!("copying the write-ahead log into the database at its bound: {e}");
        }
    }
    Ok(())
}

impl SqliteStore {
    /// The server's store: every commit synced to the disk before it is
    /// acknowledged.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_synced(path, "FULL")
    }

    /// The same store without syncs, for the writer's in-process tests:
    /// what a restart of the process finds is the same (the operating
    /// system has every write), only a crash of the machine could lose
    /// commits. The server never opens it so; the durability tests use
    /// [`SqliteStore::open`].
    pub fn open_unsynced(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_synced(path, "OFF")
    }

    fn open_synced(path: &Path, synchronous: &str) -> Result<SqliteStore> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", synchronous)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // SQLite's default page cache is 2 MiB: a batch that writes
        // thousands of job records then reads most of their pages back from
        // the OS and spills dirty ones to the WAL before it commits.
        conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)?;
        // Copying the log back is the checkpointer's, off the writer's
        // thread: a copy in a commit (SQLite's default, every 1,000 pages)
        // held up every caller of that batch, and a fleet's fill spent a
        // twentieth of the writer's time there. The writer copies what is
        // left when the log reaches its bound (`on_commit`, which takes
        // the place of SQLite's own checkpoint).
        conn.wal_hook(Some(on_commit));
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        if synchronous != "OFF" {
            if let Err(e) = presize_log(&conn, path) {
                // Only the first pass through the log is slower for it.
                tracing::warn!("writing the write-ahead log's first {PRESIZED_LOG_FRAMES} frames ahead: {e}");
            }
            if !conn.is_autocommit() {
                return Err(StoreError::Io("the write-ahead log's lock was not given back".into()));
            }
        }
        let checkpoints = Checkpointer::start(path, synchronous)?;
        Ok(SqliteStore { conn, checkpoints })
    }
}

/// A thread with a connection of its own that copies the write-ahead log
/// back into the database a while after commits once it is long enough
/// (`PASSIVE`: it never waits for the writer, nor the writer for it).
/// Stops when the store is dropped.
struct Checkpointer {
    /// Rows the writer had changed at its last commit that changed any.
    changes: u64,
    /// A copy is due (the thread is waiting out [`CHECKPOINT_AFTER`]):
    /// later commits need not wake it. Every commit did while the log was
    /// long, a context switch each for nothing.
    due: std::sync::Arc<std::sync::atomic::AtomicBool>,
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path, synchronous: &str) -> Result<Checkpointer> {
        let conn = Connection::open(path)?;
        // Its copies are synced as the writer's commits are.
        conn.pragma_update(None, "synchronous", synchronous)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let due = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let is_due = due.clone();
        let thread = std::thread::Builder::new()
            .name("ebb-checkpoint".into())
            .spawn(move || Checkpointer::run(&conn, &woken, &is_due))
            .map_err(|e| StoreError::Io(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer { changes: 0, due, wake: Some(wake), thread: Some(thread) })
    }

    /// A commit happened, the writer's connection having changed
    /// `changes` rows since it opened: one that changed none wrote nothing
    /// to the log. A long enough log is copied back a while later.
    fn committed(&mut self, changes: u64) {
        if changes == self.changes {
            return;
        }
        self.changes = changes;
        if LOG_PAGES.get() < CHECKPOINT_PAGES {
            return;
        }
        if self.due.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return; // a copy is already due
        }
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }

    fn run(conn: &Connection, woken: &std::sync::mpsc::Receiver<()>, due: &std::sync::atomic::AtomicBool) {
        use std::sync::mpsc::RecvTimeoutError;
        while woken.recv().is_ok() {
            let at = std::time::Instant::now() + CHECKPOINT_AFTER;
            // Nothing is sent while the copy is due: only the store's drop
            // (the channel closed) ends this wait early.
            loop {
                match woken.recv_timeout(at.saturating_duration_since(std::time::Instant::now())) {
                    Ok(()) => continue,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            // Before the copy: a commit during it makes the next one due.
            due.store(false, std::sync::atomic::Ordering::Release);
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                // The next long commit's wake tries again; the log's bound
                // holds meanwhile.
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
            .query_map([], |r| Ok(TenantRow { id: TenantId(r.get(0)?), name: r.get(1)? }))?
            .collect::<rusqlite::Result<_>>()?;
        let mut stmt = self.conn.prepare("SELECT hash, tenant, scope, node FROM tokens")?;
        snapshot.tokens = stmt
            .query_map([], |r| {
                let scope = scope_of(&r.get::<_, String>(2)?);
                Ok(TokenRow {
                    hash: r.get(0)?,
                    tenant: r.get::<_, Option<u32>>(1)?.map(TenantId),
                    scope,
                    node: r.get(3)?,
                })
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
            snapshot.tenant_limits.push((TenantId(tenant), serde_json::from_str(&record)?));
        }
        let mut stmt = self
            .conn
            .prepare("SELECT tenant, registry, record FROM registry_logins ORDER BY tenant, registry")?;
        let logins: Vec<(u32, String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (tenant, registry, record) in logins {
            snapshot.registry_logins.push((TenantId(tenant), registry, serde_json::from_str(&record)?));
        }
        let mut stmt = self.conn.prepare("SELECT model, preemptible_limit FROM reclaims ORDER BY model")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?;
        for row in rows {
            snapshot.reclaims.push(row?);
        }
        snapshot.webhooks = self.records("SELECT record FROM webhooks ORDER BY id", [])?;
        snapshot.deliveries = self.records("SELECT record FROM webhook_outbox ORDER BY id", [])?;
        Ok(snapshot)
    }

    fn put_webhook(&mut self, hook: &WebhookRow) -> Result<()> {
        let record = serde_json::to_string(hook)?;
        self.run(
            "INSERT OR REPLACE INTO webhooks (id, record) VALUES (?1, ?2)",
            params![hook.id as i64, record],
        )?;
        Ok(())
    }

    fn delete_webhook(&mut self, id: u64) -> Result<()> {
        self.run("DELETE FROM webhooks WHERE id = ?1", params![id as i64])?;
        self.run("DELETE FROM webhook_outbox WHERE webhook = ?1", params![id as i64])?;
        self.run("DELETE FROM webhook_log WHERE webhook = ?1", params![id as i64])?;
        Ok(())
    }

    fn put_delivery(&mut self, d: &DeliveryRow) -> Result<()> {
        let record = serde_json::to_string(d)?;
        self.run(
            "INSERT INTO webhook_outbox (id, webhook, record) VALUES (?1, ?2, ?3)",
            params![d.id as i64, d.webhook as i64, record],
        )?;
        Ok(())
    }

    fn delete_delivery(&mut self, id: u64) -> Result<()> {
        self.run("DELETE FROM webhook_outbox WHERE id = ?1", params![id as i64])?;
        Ok(())
    }

    fn add_webhook_log(&mut self, webhook: u64, entry: &ebb_api::WebhookDelivery) -> Result<()> {
        let record = serde_json::to_string(entry)?;
        self.run(
            "INSERT INTO webhook_log (webhook, record) VALUES (?1, ?2)",
            params![webhook as i64, record],
        )?;
        self.run(
            "DELETE FROM webhook_log WHERE webhook = ?1 AND seq <= (
                 SELECT seq FROM webhook_log WHERE webhook = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
            params![webhook as i64, WEBHOOK_LOG_KEPT],
        )?;
        Ok(())
    }

    fn webhook_log(&mut self, webhook: u64) -> Result<Vec<ebb_api::WebhookDelivery>> {
        self.records(
            "SELECT record FROM webhook_log WHERE webhook = ?1 ORDER BY seq DESC",
            params![webhook as i64],
        )
    }

    fn put_tenant(&mut self, t: &TenantRow) -> Result<()> {
        self.run("INSERT OR REPLACE INTO tenants (id, name) VALUES (?1, ?2)", params![t.id.0, t.name])?;
        Ok(())
    }

    fn put_token(&mut self, t: &TokenRow) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO tokens (hash, tenant, scope, node) VALUES (?1, ?2, ?3, ?4)",
            params![t.hash, t.tenant.map(|t| t.0), scope_name(t.scope), t.node],
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

    fn put_job<J: Serialize>(&mut self, id: JobId, c: &JobColumns, job: &J) -> Result<()> {
        let id = id.0;
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
                    params![id as i64, record, c.tier, c.attempt.0, c.preemptions, c.state],
                )?
            } else {
                self.run(
                    "UPDATE jobs SET record = ?2, tier = ?3, attempt = ?4, preemptions = ?5, state = ?6
                     WHERE id = ?1",
                    params![id as i64, record, c.tier, c.attempt.0, c.preemptions, c.state],
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
                c.tenant.0,
                record,
                c.state,
                c.tier,
                c.gpus,
                c.name,
                c.array.map(|(array, _)| array.0 as i64),
                c.array.map(|(_, index)| index.min(i64::MAX as u64) as i64),
                c.attempt.0,
                c.preemptions
            ],
        )?;
        Ok(())
    }

    fn job<J: JobRow>(&mut self, id: JobId) -> Result<Option<J>> {
        let id = id.0;
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

    fn array_states(&mut self, array: JobId) -> Result<Vec<(String, u64)>> {
        let array = array.0;
        let mut stmt = self.conn.prepare_cached(
            "SELECT state, COUNT(*) FROM jobs WHERE array_id = ?1 GROUP BY state ORDER BY state",
        )?;
        let rows = stmt.query_map(params![array as i64], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn array_tasks(&mut self, array: JobId) -> Result<Vec<TaskRow>> {
        let array = array.0;
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, array_index, state, attempt, preemptions FROM jobs WHERE array_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![array as i64], |r| {
            Ok(TaskRow {
                id: JobId(r.get::<_, i64>(0)? as u64),
                index: r.get::<_, i64>(1)? as u64,
                state: r.get(2)?,
                attempt: Attempt(r.get(3)?),
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

    fn add_event(&mut self, job: JobId, e: &JobEvent) -> Result<()> {
        let job = job.0;
        self.run(
            "INSERT INTO events (job, at_ms, kind, attempt, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![job as i64, e.at_ms as i64, e.kind().as_str(), e.attempt, e.event.detail_json()],
        )?;
        Ok(())
    }

    fn events(&mut self, job: JobId) -> Result<Vec<JobEvent>> {
        let job = job.0;
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
            let kind = kind.parse().map_err(StoreError::Unreadable)?;
            let event = stored_event(job, kind, &detail);
            events.push(JobEvent { at: crate::rfc3339(at_ms), at_ms, attempt, event, text: String::new() });
        }
        Ok(events)
    }

    fn log_state(&mut self, job: JobId) -> Result<Option<LogState>> {
        let job = job.0;
        Ok(self.records("SELECT record FROM logs WHERE job = ?1", params![job as i64])?.pop())
    }

    fn file_logs(&mut self) -> Result<Vec<(JobId, LogState)>> {
        let mut stmt = self.conn.prepare_cached("SELECT job, record FROM logs")?;
        let rows = stmt.query_map([], |r| Ok((JobId(r.get::<_, i64>(0)? as u64), r.get::<_, String>(1)?)))?;
        let mut logs = Vec::new();
        for row in rows {
            let (job, record) = row?;
            let state: LogState = serde_json::from_str(&record)?;
            if state.file {
                logs.push((job, state));
            }
        }
        Ok(logs)
    }

    fn put_log_state(&mut self, job: JobId, state: &LogState) -> Result<()> {
        let job = job.0;
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

    fn last_reports(&mut self) -> Result<Vec<(String, ebb_api::ReportId)>> {
        let mut stmt = self.conn.prepare_cached("SELECT node, session, seq FROM reports ORDER BY node")?;
        let rows = stmt.query_map([], |r| {
            let id =
                ebb_api::ReportId { session: r.get::<_, i64>(1)? as u64, seq: r.get::<_, i64>(2)? as u64 };
            Ok((r.get::<_, String>(0)?, id))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn put_last_report(&mut self, node: &str, id: ebb_api::ReportId) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("INSERT OR REPLACE INTO reports (node, session, seq) VALUES (?1, ?2, ?3)")?;
        stmt.execute(params![node, id.session as i64, id.seq as i64])?;
        Ok(())
    }

    fn put_output(&mut self, job: JobId, offset: u64, data: &[u8], node: Option<&str>) -> Result<()> {
        let job = job.0;
        let mut stmt = self
            .conn
            .prepare_cached("INSERT INTO output (job, start, data, node) VALUES (?1, ?2, ?3, ?4)")?;
        stmt.execute(params![job as i64, offset as i64, data, node])?;
        Ok(())
    }

    fn output_sources(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<(u64, String)>> {
        let job = job.0;
        let mut stmt = self.conn.prepare_cached(
            "SELECT start, node FROM output
             WHERE job = ?1 AND start < ?3 AND start + length(data) > ?2 AND node IS NOT NULL ORDER BY start",
        )?;
        let rows = stmt.query_map(params![job as i64, from as i64, to as i64], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get::<_, String>(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn output_len(&mut self, job: JobId) -> Result<u64> {
        let job = job.0;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(start + length(data)), 0) FROM output WHERE job = ?1")?;
        Ok(stmt.query_row(params![job as i64], |row| row.get::<_, i64>(0))? as u64)
    }

    fn expire_output(&mut self, job: JobId, at_ms: u64) -> Result<()> {
        let job = job.0;
        self.run(
            "INSERT OR REPLACE INTO output_expiry (job, at_ms, removed_ms) VALUES (?1, ?2, NULL)",
            params![job as i64, at_ms.min(i64::MAX as u64) as i64],
        )?;
        Ok(())
    }

    fn prune_output(&mut self, now_ms: u64, limit: usize) -> Result<Vec<JobId>> {
        let now = now_ms.min(i64::MAX as u64) as i64;
        let due: Vec<i64> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT job FROM output_expiry WHERE removed_ms IS NULL AND at_ms <= ?1 ORDER BY at_ms LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![now, limit as i64], |row| row.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        for &job in &due {
            self.run("DELETE FROM output WHERE job = ?1", params![job])?;
            self.run("UPDATE output_expiry SET removed_ms = ?2 WHERE job = ?1", params![job, now])?;
        }
        Ok(due.into_iter().map(|j| JobId(j as u64)).collect())
    }

    fn output_removed(&mut self, job: JobId) -> Result<Option<u64>> {
        let job = job.0;
        let mut stmt = self.conn.prepare_cached("SELECT removed_ms FROM output_expiry WHERE job = ?1")?;
        let removed: Option<Option<i64>> =
            stmt.query_row(params![job as i64], |row| row.get(0)).optional()?;
        Ok(removed.flatten().map(|ms| ms as u64))
    }

    fn output(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<u8>> {
        let job = job.0;
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

    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Result<()> {
        let tenant = tenant.0;
        let mut stmt = self
            .conn
            .prepare_cached("INSERT OR REPLACE INTO tenant_limits (tenant, record) VALUES (?1, ?2)")?;
        stmt.execute(params![tenant, serde_json::to_string(limits)?])?;
        Ok(())
    }

    fn put_registry_login(
        &mut self,
        tenant: TenantId,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<()> {
        let tenant = tenant.0;
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
            params![u.job.0 as i64, u.attempt.0, u.tenant.0, u.ended_ms as i64, serde_json::to_string(u)?],
        )?;
        Ok(())
    }

    fn usage(&mut self, tenant: Option<TenantId>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>> {
        let tenant = tenant.map(|t| t.0);
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

    fn job_usage(&mut self, job: JobId) -> Result<Vec<UsageRow>> {
        let job = job.0;
        self.records("SELECT record FROM usage WHERE job = ?1 ORDER BY attempt", params![job as i64])
    }

    fn max_job_id(&mut self) -> Result<JobId> {
        let id: Option<i64> =
            self.conn.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0)).optional()?.flatten();
        Ok(JobId(id.unwrap_or(0) as u64))
    }
}

mod migrations;
use migrations::migrate;
#[cfg(test)]
use migrations::MIGRATIONS;

#[cfg(test)]
mod tests;
