//! The PostgreSQL backend of [`Store`]: the same contract as the embedded
//! SQLite store, for a control plane whose database outlives any one host.
//! A synchronous client (`postgres`), as the writer is one thread; every
//! batch is one transaction. Records are the same JSON text as in SQLite.

use std::collections::{BTreeMap, HashMap};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, Statement};
use serde::{Deserialize, Serialize};

use ebb_api::JobEvent;
use ebb_core::{Attempt, JobId, TenantId};

use crate::store::{
    job_page_sql, scope_name, scope_of, DeliveryRow, FinishedCount, JobColumns, JobPageQuery, JobRow,
    JobRows, LogState, NodeRow, PageArg, PriceRow, ReservationRow, Result, Snapshot, Store, StoreError,
    TaskRow, TenantRow, TokenRow, UsageRow, WebhookRow, WEBHOOK_LOG_KEPT,
};

impl From<postgres::Error> for StoreError {
    /// With the server's own words where it gave them: `db error` alone
    /// says nothing of what failed.
    fn from(e: postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => StoreError::Database(format!("{e}: {} ({})", db.message(), db.code().code())),
            None if e.is_closed() => StoreError::Connection(e.to_string()),
            None => StoreError::Database(e.to_string()),
        }
    }
}

mod lease;
mod migrations;
pub use lease::Lease;

/// A takeover's load of the unfinished jobs: in order from their own
/// index (`jobs_unfinished`), however many have finished.
pub const LOAD_JOBS: &str = "SELECT record FROM jobs WHERE finished IS NULL ORDER BY id";

pub struct PgStore {
    /// The connection, shared with the thread that writes ahead.
    session: Arc<Mutex<Session>>,
    /// The leadership this connection writes under, once it holds the
    /// lease: every transaction checks it and renews the lease.
    lease: Option<Held>,
    /// Writes held back to go in one statement each (see [`Pending`]).
    pending: Pending,
    /// Chunks of them sent ahead while the transaction goes on (see
    /// [`Ahead`]); started with the first.
    ahead: Option<Ahead>,
}

/// The connection and the statements prepared on it, by their text.
struct Session {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

/// Rows held back at which they are sent ahead, on a thread of their own:
/// PostgreSQL writes them while the writer goes on with the batch (a fill
/// of the fleet places thousands of jobs in one batch, and the writer's
/// work and the database's were taken in turn). A chunk of this many is
/// written in a few milliseconds, few enough to wait for at the commit.
const AHEAD_ROWS: usize = 512;

/// The thread that writes chunks sent ahead, in the order sent, on the
/// transaction in progress, and what it has done: the store waits for it
/// (`settle`) before anything else uses the connection, so that whatever
/// runs next sees the chunks as if written in place, and the first
/// chunk's error fails the transaction there.
struct Ahead {
    chunks: mpsc::Sender<Pending>,
    done: Arc<(Mutex<AheadState>, Condvar)>,
}

#[derive(Default)]
struct AheadState {
    sent: u64,
    written: u64,
    failed: Option<StoreError>,
}

impl Ahead {
    fn start(session: Arc<Mutex<Session>>) -> Ahead {
        let (chunks, rx) = mpsc::channel::<Pending>();
        let done = Arc::new((Mutex::new(AheadState::default()), Condvar::new()));
        let state = done.clone();
        std::thread::Builder::new()
            .name("ebb-pg-ahead".into())
            .spawn(move || {
                // Until the store is dropped. A panic in a write is the
                // transaction's error, not a store waiting forever.
                for chunk in rx {
                    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        session.lock().unwrap_or_else(|e| e.into_inner()).write(chunk)
                    }))
                    .unwrap_or_else(|_| Err(StoreError::Io("writing rows sent ahead panicked".into())));
                    let (state, cv) = &*state;
                    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                    state.written += 1;
                    if let Err(e) = written {
                        state.failed.get_or_insert(e);
                    }
                    cv.notify_all();
                }
            })
            .expect("a thread for the store's writes");
        Ahead { chunks, done }
    }
}

/// The connection, the writes held back sent first: what is read or
/// written next through it sees them.
struct Db<'a>(MutexGuard<'a, Session>);

impl std::ops::Deref for Db<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.0.client
    }
}

impl std::ops::DerefMut for Db<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.0.client
    }
}

/// The rows a transaction writes most (jobs, their events and output,
/// nodes' contacts and last reports), held back and sent as one statement
/// per table (`unnest` of arrays) just before anything else is read or
/// written and at the commit, or, from [`AHEAD_ROWS`] of them, ahead of
/// that on a thread of their own: a batch of 10,000 submissions is then a
/// few round trips, not 20,000 (each about as long as the insert itself).
/// Whatever runs next sees them, as if each had been sent alone.
#[derive(Default)]
struct Pending {
    /// The last row of each job, in the order first written; `at` finds a
    /// job's (one statement may not upsert a row twice).
    jobs: Vec<JobValues>,
    at: HashMap<u64, usize>,
    events: Vec<(i64, i64, &'static str, i64, String)>,
    /// Nodes' last contact and last report, the latest of each: every
    /// busy node's poll writes the first, every report the second.
    heard: BTreeMap<String, i64>,
    reports: BTreeMap<String, (i64, i64)>,
    /// Pieces of jobs' output: (job, start, data, node).
    output: Vec<(i64, i64, Vec<u8>, Option<String>)>,
}

struct JobValues {
    id: i64,
    tenant: i64,
    record: String,
    state: String,
    tier: String,
    gpus: i64,
    name: Option<String>,
    array_id: Option<i64>,
    array_index: Option<i64>,
    attempt: i64,
    preemptions: i64,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    fn rows(&self) -> usize {
        self.jobs.len() + self.events.len() + self.heard.len() + self.reports.len() + self.output.len()
    }

    fn clear(&mut self) {
        *self = Pending::default();
    }
}

const UPSERT_JOBS: &str = "INSERT INTO jobs
         (id, tenant, record, state, tier, gpus, name, array_id, array_index, attempt, preemptions)
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[],
                          $7::text[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[])
     ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant, record = EXCLUDED.record,
         state = EXCLUDED.state, tier = EXCLUDED.tier, gpus = EXCLUDED.gpus, name = EXCLUDED.name,
         array_id = EXCLUDED.array_id, array_index = EXCLUDED.array_index,
         attempt = EXCLUDED.attempt, preemptions = EXCLUDED.preemptions";

const INSERT_OUTPUT: &str = "INSERT INTO output (job, start, data, node)
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::text[])";

const UPSERT_HEARD: &str = "INSERT INTO heard (node, at_ms) SELECT * FROM unnest($1::text[], $2::bigint[])
     ON CONFLICT (node) DO UPDATE SET at_ms = EXCLUDED.at_ms";

const UPSERT_REPORTS: &str = "INSERT INTO reports (node, session, seq)
     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
     ON CONFLICT (node) DO UPDATE SET session = EXCLUDED.session, seq = EXCLUDED.seq";

/// In the order written: `seq` numbers them as they came.
const INSERT_EVENTS: &str = "INSERT INTO events (job, at_ms, kind, attempt, detail)
     SELECT job, at_ms, kind, attempt, detail
     FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])
         WITH ORDINALITY AS e(job, at_ms, kind, attempt, detail, n)
     ORDER BY n";

#[derive(Clone, Copy, Debug)]
struct Held {
    epoch: i64,
    /// The lease's length, milliseconds.
    ms: i64,
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host/db`, or a `host=/socket/dir`
    /// key-value string; TLS as libpq's `sslmode` and `sslrootcert` ask,
    /// see [`pg_tls`](super::pg_tls)) and brings its schema to this ebb's.
    pub fn open(url: &str) -> Result<PgStore> {
        let target = super::pg_tls::Target::parse(url).map_err(|e| StoreError::Target(Box::new(e)))?;
        let client = target.connect().map_err(|e| StoreError::Connection(format!("--database: {e}")))?;
        let session = Arc::new(Mutex::new(Session { client, prepared: HashMap::new() }));
        let mut store = PgStore { session, lease: None, pending: Pending::default(), ahead: None };
        store.migrate()?;
        Ok(store)
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement> {
        self.db()?.0.statement(sql)
    }

    /// The connection, the writes held back sent first (those sent ahead
    /// written, then the rest here): what is read or written next sees
    /// them.
    fn db(&mut self) -> Result<Db<'_>> {
        self.settle()?;
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        session.write(std::mem::take(&mut self.pending))?;
        Ok(Db(session))
    }

    /// Waits for the chunks sent ahead to be written; the first one's
    /// error, if one failed.
    fn settle(&mut self) -> Result<()> {
        let Some(ahead) = &self.ahead else { return Ok(()) };
        let (state, cv) = &*ahead.done;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        while state.written < state.sent {
            state = cv.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match state.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A write was held back: the rows are sent ahead once there are
    /// [`AHEAD_ROWS`] of them.
    fn held(&mut self) {
        if self.pending.rows() < AHEAD_ROWS {
            return;
        }
        let session = &self.session;
        let ahead = self.ahead.get_or_insert_with(|| Ahead::start(session.clone()));
        ahead.done.0.lock().unwrap_or_else(|e| e.into_inner()).sent += 1;
        if let Err(mpsc::SendError(chunk)) = ahead.chunks.send(std::mem::take(&mut self.pending)) {
            // The thread is gone (it cannot be while the store holds its
            // sender): the rows are written at the next use of the
            // connection instead.
            ahead.done.0.lock().unwrap_or_else(|e| e.into_inner()).sent -= 1;
            self.pending = chunk;
        }
    }

    fn exec(&mut self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> Result<()> {
        let stmt = self.statement(sql)?;
        self.db()?.execute(&stmt, params)?;
        Ok(())
    }

    /// Rows of one JSON `record` column.
    fn records<T: for<'de> Deserialize<'de>>(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<T>> {
        let stmt = self.statement(sql)?;
        let rows = self.db()?.query(&stmt, params)?;
        rows.iter().map(|r| Ok(serde_json::from_str(r.get::<_, &str>(0))?)).collect()
    }
}

impl Session {
    fn statement(&mut self, sql: &'static str) -> Result<Statement> {
        if let Some(stmt) = self.prepared.get(sql) {
            return Ok(stmt.clone());
        }
        let stmt = self.client.prepare(sql)?;
        self.prepared.insert(sql, stmt.clone());
        Ok(stmt)
    }

    /// Writes rows held back, a statement per table: the jobs' rows
    /// before the events and output that refer to them.
    fn write(&mut self, pending: Pending) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let Pending { jobs, events, heard, reports, output, .. } = pending;
        if !heard.is_empty() {
            let stmt = self.statement(UPSERT_HEARD)?;
            let (nodes, at): (Vec<&str>, Vec<i64>) = heard.iter().map(|(n, at)| (n.as_str(), *at)).unzip();
            self.client.execute(&stmt, &[&nodes, &at])?;
        }
        if !reports.is_empty() {
            let stmt = self.statement(UPSERT_REPORTS)?;
            let nodes: Vec<&str> = reports.keys().map(String::as_str).collect();
            let sessions: Vec<i64> = reports.values().map(|r| r.0).collect();
            let seqs: Vec<i64> = reports.values().map(|r| r.1).collect();
            self.client.execute(&stmt, &[&nodes, &sessions, &seqs])?;
        }
        if !jobs.is_empty() {
            let stmt = self.statement(UPSERT_JOBS)?;
            let column = |f: fn(&JobValues) -> i64| jobs.iter().map(f).collect::<Vec<i64>>();
            let text = |f: fn(&JobValues) -> &str| jobs.iter().map(f).collect::<Vec<&str>>();
            let names: Vec<Option<&str>> = jobs.iter().map(|j| j.name.as_deref()).collect();
            let array_ids: Vec<Option<i64>> = jobs.iter().map(|j| j.array_id).collect();
            let array_indices: Vec<Option<i64>> = jobs.iter().map(|j| j.array_index).collect();
            self.client.execute(
                &stmt,
                &[
                    &column(|j| j.id),
                    &column(|j| j.tenant),
                    &text(|j| &j.record),
                    &text(|j| &j.state),
                    &text(|j| &j.tier),
                    &column(|j| j.gpus),
                    &names,
                    &array_ids,
                    &array_indices,
                    &column(|j| j.attempt),
                    &column(|j| j.preemptions),
                ],
            )?;
        }
        if !events.is_empty() {
            let stmt = self.statement(INSERT_EVENTS)?;
            let jobs: Vec<i64> = events.iter().map(|e| e.0).collect();
            let at: Vec<i64> = events.iter().map(|e| e.1).collect();
            let kinds: Vec<&str> = events.iter().map(|e| e.2).collect();
            let attempts: Vec<i64> = events.iter().map(|e| e.3).collect();
            let details: Vec<&str> = events.iter().map(|e| e.4.as_str()).collect();
            self.client.execute(&stmt, &[&jobs, &at, &kinds, &attempts, &details])?;
        }
        if !output.is_empty() {
            let stmt = self.statement(INSERT_OUTPUT)?;
            let jobs: Vec<i64> = output.iter().map(|o| o.0).collect();
            let starts: Vec<i64> = output.iter().map(|o| o.1).collect();
            let data: Vec<&[u8]> = output.iter().map(|o| o.2.as_slice()).collect();
            let nodes: Vec<Option<&str>> = output.iter().map(|o| o.3.as_deref()).collect();
            self.client.execute(&stmt, &[&jobs, &starts, &data, &nodes])?;
        }
        Ok(())
    }
}

/// Milliseconds and ids as PostgreSQL's BIGINT.
fn big(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

impl Store for PgStore {
    /// Under a lease, the transaction first renews it, which is also the
    /// fencing check: it renews only the epoch this store took. A leader
    /// deposed while it was stopped or cut off finds a later epoch and
    /// writes nothing; its successor's takeover waits for this
    /// transaction, which holds the row.
    fn begin(&mut self) -> Result<()> {
        let lease = self.lease;
        let mut db = self.db()?;
        db.batch_execute("BEGIN")?;
        if let Some(held) = lease {
            let stmt = db.0.statement(
                "UPDATE leader SET expires_at = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE id = 1 AND epoch = $1 RETURNING epoch",
            )?;
            if db.query_opt(&stmt, &[&held.epoch, &(held.ms as f64)])?.is_none() {
                let now: i64 = db.query_one("SELECT epoch FROM leader WHERE id = 1", &[])?.get(0);
                let _ = db.batch_execute("ROLLBACK");
                return Err(StoreError::Deposed(format!(
                    "this server led at epoch {}, and the database is at epoch {now}",
                    held.epoch
                )));
            }
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.db()?.batch_execute("COMMIT")?;
        Ok(())
    }

    /// Chunks sent ahead are waited for first (their errors are the
    /// transaction's, ended here), then nothing of it stays.
    fn rollback(&mut self) -> Result<()> {
        let _ = self.settle();
        self.pending.clear();
        self.session.lock().unwrap_or_else(|e| e.into_inner()).client.batch_execute("ROLLBACK")?;
        Ok(())
    }

    fn load<J: JobRow>(&mut self) -> Result<Snapshot<J>> {
        let mut c = self.db()?;
        let tenants = c.query("SELECT id, name FROM tenants ORDER BY id", &[])?;
        let tokens = c.query("SELECT hash, tenant, scope, node FROM tokens", &[])?;
        let nodes = c.query("SELECT record FROM nodes ORDER BY name", &[])?;
        let mut snapshot = Snapshot {
            tenants: tenants
                .iter()
                .map(|r| TenantRow { id: TenantId(r.get::<_, i64>(0) as u32), name: r.get(1) })
                .collect(),
            tokens: tokens
                .iter()
                .map(|r| TokenRow {
                    hash: r.get(0),
                    tenant: r.get::<_, Option<i64>>(1).map(|t| TenantId(t as u32)),
                    scope: scope_of(r.get(2)),
                    node: r.get(3),
                })
                .collect(),
            nodes: nodes
                .iter()
                .map(|r| serde_json::from_str(r.get::<_, &str>(0)))
                .collect::<serde_json::Result<_>>()?,
            ..Snapshot::empty()
        };
        // Row by row, each sharing what it has in common with the one
        // before, as SQLite's `load` does, into room made for them all (a
        // vector doubling its way to 100,000 records copied them twice).
        // From their index, in its order, whatever the planner guesses: a
        // takeover often comes before the table has statistics (a database
        // just filled, or restarted), when it guessed a few thousand rows
        // and sorted every row on disk.
        c.batch_execute("SET enable_sort = off; SET enable_bitmapscan = off")?;
        let loaded = (|| -> Result<()> {
            let count: i64 = c.query_one("SELECT count(*) FROM jobs WHERE finished IS NULL", &[])?.get(0);
            snapshot.jobs.reserve_exact(usize::try_from(count).unwrap_or(0));
            let none: [&(dyn ToSql + Sync); 0] = [];
            let mut rows = c.query_raw(LOAD_JOBS, none)?;
            while let Some(row) = rows.next()? {
                let mut job: J = serde_json::from_str(row.get::<_, &str>(0))?;
                if let Some(previous) = snapshot.jobs.last() {
                    job.share_with(previous);
                }
                snapshot.jobs.push(job);
            }
            Ok(())
        })();
        c.batch_execute("RESET enable_sort; RESET enable_bitmapscan")?;
        loaded?;
        drop(c);
        snapshot.prices = self.records("SELECT record FROM prices ORDER BY model", &[])?;
        snapshot.reservations = self.records("SELECT record FROM reservations ORDER BY id", &[])?;
        let mut c = self.db()?;
        snapshot.heard = c
            .query("SELECT node, at_ms FROM heard", &[])?
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
            .collect();
        for r in c.query("SELECT tenant, record FROM tenant_limits ORDER BY tenant", &[])? {
            snapshot
                .tenant_limits
                .push((TenantId(r.get::<_, i64>(0) as u32), serde_json::from_str(r.get::<_, &str>(1))?));
        }
        for r in
            c.query("SELECT tenant, registry, record FROM registry_logins ORDER BY tenant, registry", &[])?
        {
            snapshot.registry_logins.push((
                TenantId(r.get::<_, i64>(0) as u32),
                r.get(1),
                serde_json::from_str(r.get::<_, &str>(2))?,
            ));
        }
        snapshot.reclaims = c
            .query("SELECT model, preemptible_limit FROM reclaims ORDER BY model", &[])?
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as u32))
            .collect();
        drop(c);
        snapshot.webhooks = self.records("SELECT record FROM webhooks ORDER BY id", &[])?;
        snapshot.deliveries = self.records("SELECT record FROM webhook_outbox ORDER BY id", &[])?;
        Ok(snapshot)
    }

    fn put_webhook(&mut self, hook: &WebhookRow) -> Result<()> {
        let record = serde_json::to_string(hook)?;
        self.exec(
            "INSERT INTO webhooks (id, record) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
            &[&(hook.id as i64), &record],
        )
    }

    fn delete_webhook(&mut self, id: u64) -> Result<()> {
        let id = id as i64;
        self.exec("DELETE FROM webhooks WHERE id = $1", &[&id])?;
        self.exec("DELETE FROM webhook_outbox WHERE webhook = $1", &[&id])?;
        self.exec("DELETE FROM webhook_log WHERE webhook = $1", &[&id])
    }

    fn put_delivery(&mut self, d: &DeliveryRow) -> Result<()> {
        let record = serde_json::to_string(d)?;
        self.exec(
            "INSERT INTO webhook_outbox (id, webhook, record) VALUES ($1, $2, $3)",
            &[&(d.id as i64), &(d.webhook as i64), &record],
        )
    }

    fn delete_delivery(&mut self, id: u64) -> Result<()> {
        self.exec("DELETE FROM webhook_outbox WHERE id = $1", &[&(id as i64)])
    }

    fn add_webhook_log(&mut self, webhook: u64, entry: &ebb_api::WebhookDelivery) -> Result<()> {
        let record = serde_json::to_string(entry)?;
        let webhook = webhook as i64;
        self.exec("INSERT INTO webhook_log (webhook, record) VALUES ($1, $2)", &[&webhook, &record])?;
        self.exec(
            "DELETE FROM webhook_log WHERE webhook = $1 AND seq <= (
                 SELECT seq FROM webhook_log WHERE webhook = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
            &[&webhook, &WEBHOOK_LOG_KEPT],
        )
    }

    fn webhook_log(&mut self, webhook: u64) -> Result<Vec<ebb_api::WebhookDelivery>> {
        self.records(
            "SELECT record FROM webhook_log WHERE webhook = $1 ORDER BY seq DESC",
            &[&(webhook as i64)],
        )
    }

    fn put_tenant(&mut self, t: &TenantRow) -> Result<()> {
        self.exec(
            "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name",
            &[&i64::from(t.id.0), &t.name],
        )
    }

    fn put_token(&mut self, t: &TokenRow) -> Result<()> {
        self.exec(
            "INSERT INTO tokens (hash, tenant, scope, node) VALUES ($1, $2, $3, $4)
             ON CONFLICT (hash) DO UPDATE SET tenant = EXCLUDED.tenant, scope = EXCLUDED.scope, node = EXCLUDED.node",
            &[&t.hash, &t.tenant.map(|t| i64::from(t.0)), &scope_name(t.scope), &t.node],
        )
    }

    fn delete_token(&mut self, hash: &str) -> Result<()> {
        self.exec("DELETE FROM tokens WHERE hash = $1", &[&hash])
    }

    fn put_node(&mut self, node: &NodeRow) -> Result<()> {
        self.exec(
            "INSERT INTO nodes (name, record) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
            &[&node.name, &serde_json::to_string(node)?],
        )
    }

    fn put_job<J: Serialize>(&mut self, id: JobId, c: &JobColumns, job: &J) -> Result<()> {
        let row = JobValues {
            id: big(id.0),
            tenant: i64::from(c.tenant.0),
            record: serde_json::to_string(job)?,
            state: c.state.to_string(),
            tier: c.tier.to_string(),
            gpus: i64::from(c.gpus),
            name: c.name.map(str::to_string),
            array_id: c.array.map(|(array, _)| big(array.0)),
            array_index: c.array.map(|(_, index)| big(index)),
            attempt: i64::from(c.attempt.0),
            preemptions: i64::from(c.preemptions),
        };
        match self.pending.at.get(&id.0) {
            Some(&i) => self.pending.jobs[i] = row,
            None => {
                self.pending.at.insert(id.0, self.pending.jobs.len());
                self.pending.jobs.push(row);
            }
        }
        self.held();
        Ok(())
    }

    fn job<J: JobRow>(&mut self, id: JobId) -> Result<Option<J>> {
        Ok(self.records("SELECT record FROM jobs WHERE id = $1", &[&big(id.0)])?.pop())
    }

    fn job_page<J: JobRow>(&mut self, query: &JobPageQuery) -> Result<JobRows<J>> {
        let Some((sql, args)) = job_page_sql(query, true) else {
            return Ok(JobRows { rows: Vec::new(), cut: false });
        };
        let args: Vec<Box<dyn ToSql + Sync>> = args
            .into_iter()
            .map(|a| -> Box<dyn ToSql + Sync> {
                match a {
                    PageArg::Int(n) => Box::new(n),
                    PageArg::Text(t) => Box::new(t),
                }
            })
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a.as_ref()).collect();
        // Row by row as they arrive, not the whole answer at once.
        let mut db = self.db()?;
        let mut rows = db.query_raw(sql.as_str(), params)?;
        let records = std::iter::from_fn(|| match rows.next() {
            Ok(Some(row)) => Some(row.try_get::<_, String>(0).map_err(StoreError::from)),
            Ok(None) => None,
            Err(e) => Some(Err(StoreError::from(e))),
        });
        JobRows::read(records, query)
    }

    fn array_states(&mut self, array: JobId) -> Result<Vec<(String, u64)>> {
        let stmt = self.statement(
            "SELECT state, COUNT(*) FROM jobs WHERE array_id = $1 GROUP BY state ORDER BY state",
        )?;
        let rows = self.db()?.query(&stmt, &[&big(array.0)])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get::<_, i64>(1) as u64)).collect())
    }

    fn array_tasks(&mut self, array: JobId) -> Result<Vec<TaskRow>> {
        let stmt = self.statement(
            "SELECT id, array_index, state, attempt, preemptions FROM jobs WHERE array_id = $1 ORDER BY id",
        )?;
        let rows = self.db()?.query(&stmt, &[&big(array.0)])?;
        Ok(rows
            .iter()
            .map(|r| TaskRow {
                id: JobId(r.get::<_, i64>(0) as u64),
                index: r.get::<_, i64>(1) as u64,
                state: r.get(2),
                attempt: Attempt(r.get::<_, i64>(3) as u32),
                preemptions: r.get::<_, i64>(4) as u32,
            })
            .collect())
    }

    fn finished_counts(&mut self) -> Result<Vec<FinishedCount>> {
        let rows = self.db()?.query(
            "SELECT tier, finished, COUNT(*), COALESCE(SUM(gpus), 0)::BIGINT FROM jobs
             WHERE finished IS NOT NULL GROUP BY tier, finished ORDER BY tier, finished",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| FinishedCount {
                tier: r.get(0),
                state: r.get(1),
                jobs: r.get::<_, i64>(2) as u64,
                gpus: r.get::<_, i64>(3) as u64,
            })
            .collect())
    }

    fn add_event(&mut self, job: JobId, e: &JobEvent) -> Result<()> {
        let row = (big(job.0), big(e.at_ms), e.kind().as_str(), i64::from(e.attempt), e.event.detail_json());
        self.pending.events.push(row);
        self.held();
        Ok(())
    }

    fn events(&mut self, job: JobId) -> Result<Vec<JobEvent>> {
        let stmt =
            self.statement("SELECT at_ms, kind, attempt, detail FROM events WHERE job = $1 ORDER BY seq")?;
        let mut events = Vec::new();
        for r in self.db()?.query(&stmt, &[&big(job.0)])? {
            let at_ms = r.get::<_, i64>(0) as u64;
            let kind = r.get::<_, &str>(1).parse().map_err(StoreError::Unreadable)?;
            let event = crate::store::stored_event(job.0, kind, r.get::<_, &str>(3));
            events.push(JobEvent {
                at: crate::rfc3339(at_ms),
                at_ms,
                attempt: r.get::<_, i64>(2) as u32,
                event,
                text: String::new(),
            });
        }
        Ok(events)
    }

    fn max_job_id(&mut self) -> Result<JobId> {
        let row = self.db()?.query_one("SELECT MAX(id) FROM jobs", &[])?;
        Ok(JobId(row.get::<_, Option<i64>>(0).unwrap_or(0) as u64))
    }

    fn heard(&mut self, node: &str, at_ms: u64) -> Result<()> {
        self.pending.heard.insert(node.to_string(), big(at_ms));
        self.held();
        Ok(())
    }

    fn put_price(&mut self, p: &PriceRow) -> Result<()> {
        self.exec(
            "INSERT INTO prices (model, record) VALUES ($1, $2) ON CONFLICT (model) DO UPDATE SET record = EXCLUDED.record",
            &[&p.gpu_model, &serde_json::to_string(p)?],
        )
    }

    fn put_reservation(&mut self, r: &ReservationRow) -> Result<()> {
        self.exec(
            "INSERT INTO reservations (id, record) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
            &[&big(r.id), &serde_json::to_string(r)?],
        )
    }

    fn delete_reservation(&mut self, id: u64) -> Result<()> {
        self.exec("DELETE FROM reservations WHERE id = $1", &[&big(id)])
    }

    fn add_usage(&mut self, u: &UsageRow) -> Result<()> {
        self.exec(
            "INSERT INTO usage (job, attempt, tenant, ended_ms, record) VALUES ($1, $2, $3, $4, $5)",
            &[
                &big(u.job.0),
                &i64::from(u.attempt.0),
                &i64::from(u.tenant.0),
                &big(u.ended_ms),
                &serde_json::to_string(u)?,
            ],
        )
    }

    fn usage(&mut self, tenant: Option<TenantId>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>> {
        let tenant = tenant.map(|t| t.0);
        let (from, to) = (big(from_ms), big(to_ms));
        match tenant {
            Some(t) => self.records(
                "SELECT record FROM usage WHERE tenant = $1 AND ended_ms >= $2 AND ended_ms < $3 ORDER BY ended_ms, job, attempt",
                &[&i64::from(t), &from, &to],
            ),
            None => self.records(
                "SELECT record FROM usage WHERE ended_ms >= $1 AND ended_ms < $2 ORDER BY ended_ms, job, attempt",
                &[&from, &to],
            ),
        }
    }

    fn job_usage(&mut self, job: JobId) -> Result<Vec<UsageRow>> {
        self.records("SELECT record FROM usage WHERE job = $1 ORDER BY attempt", &[&big(job.0)])
    }

    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Result<()> {
        self.exec(
            "INSERT INTO tenant_limits (tenant, record) VALUES ($1, $2)
             ON CONFLICT (tenant) DO UPDATE SET record = EXCLUDED.record",
            &[&i64::from(tenant.0), &serde_json::to_string(limits)?],
        )
    }

    fn put_registry_login(
        &mut self,
        tenant: TenantId,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<()> {
        match login {
            Some(login) => self.exec(
                "INSERT INTO registry_logins (tenant, registry, record) VALUES ($1, $2, $3)
                 ON CONFLICT (tenant, registry) DO UPDATE SET record = EXCLUDED.record",
                &[&i64::from(tenant.0), &registry, &serde_json::to_string(login)?],
            ),
            None => self.exec(
                "DELETE FROM registry_logins WHERE tenant = $1 AND registry = $2",
                &[&i64::from(tenant.0), &registry],
            ),
        }
    }

    fn log_state(&mut self, job: JobId) -> Result<Option<LogState>> {
        Ok(self.records("SELECT record FROM logs WHERE job = $1", &[&big(job.0)])?.pop())
    }

    fn file_logs(&mut self) -> Result<Vec<(JobId, LogState)>> {
        let mut logs = Vec::new();
        for row in self.db()?.query("SELECT job, record FROM logs", &[])? {
            let state: LogState = serde_json::from_str(row.get::<_, &str>(1))?;
            if state.file {
                logs.push((JobId(row.get::<_, i64>(0) as u64), state));
            }
        }
        Ok(logs)
    }

    fn put_log_state(&mut self, job: JobId, state: &LogState) -> Result<()> {
        self.exec(
            "INSERT INTO logs (job, record) VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET record = EXCLUDED.record",
            &[&big(job.0), &serde_json::to_string(state)?],
        )
    }

    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Result<()> {
        match limit {
            Some(limit) => self.exec(
                "INSERT INTO reclaims (model, preemptible_limit) VALUES ($1, $2)
                 ON CONFLICT (model) DO UPDATE SET preemptible_limit = EXCLUDED.preemptible_limit",
                &[&model, &i64::from(limit)],
            ),
            None => self.exec("DELETE FROM reclaims WHERE model = $1", &[&model]),
        }
    }

    fn last_reports(&mut self) -> Result<Vec<(String, ebb_api::ReportId)>> {
        let rows = self.db()?.query("SELECT node, session, seq FROM reports ORDER BY node", &[])?;
        Ok(rows
            .iter()
            .map(|r| {
                let id =
                    ebb_api::ReportId { session: r.get::<_, i64>(1) as u64, seq: r.get::<_, i64>(2) as u64 };
                (r.get(0), id)
            })
            .collect())
    }

    fn put_output(&mut self, job: JobId, offset: u64, data: &[u8], node: Option<&str>) -> Result<()> {
        self.pending.output.push((big(job.0), big(offset), data.to_vec(), node.map(str::to_string)));
        self.held();
        Ok(())
    }

    fn output_sources(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<(u64, String)>> {
        let stmt = self.statement(
            "SELECT start, node FROM output
             WHERE job = $1 AND start < $3 AND start + length(data) > $2 AND node IS NOT NULL ORDER BY start",
        )?;
        let rows = self.db()?.query(&stmt, &[&big(job.0), &big(from), &big(to)])?;
        Ok(rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, String>(1))).collect())
    }

    fn output_len(&mut self, job: JobId) -> Result<u64> {
        let stmt =
            self.statement("SELECT COALESCE(MAX(start + length(data)), 0) FROM output WHERE job = $1")?;
        let len: i64 = self.db()?.query_one(&stmt, &[&big(job.0)])?.get(0);
        Ok(len as u64)
    }

    fn expire_output(&mut self, job: JobId, at_ms: u64) -> Result<()> {
        let stmt = self.statement(
            "INSERT INTO output_expiry (job, at_ms, removed_ms) VALUES ($1, $2, NULL)
             ON CONFLICT (job) DO UPDATE SET at_ms = EXCLUDED.at_ms, removed_ms = NULL",
        )?;
        self.db()?.execute(&stmt, &[&big(job.0), &big(at_ms)])?;
        Ok(())
    }

    fn prune_output(&mut self, now_ms: u64, limit: usize) -> Result<Vec<JobId>> {
        let stmt = self.statement(
            "SELECT job FROM output_expiry WHERE removed_ms IS NULL AND at_ms <= $1 ORDER BY at_ms LIMIT $2",
        )?;
        let due: Vec<i64> =
            self.db()?.query(&stmt, &[&big(now_ms), &big(limit as u64)])?.iter().map(|r| r.get(0)).collect();
        if !due.is_empty() {
            let delete = self.statement("DELETE FROM output WHERE job = ANY($1)")?;
            self.db()?.execute(&delete, &[&due])?;
            let mark = self.statement("UPDATE output_expiry SET removed_ms = $2 WHERE job = ANY($1)")?;
            self.db()?.execute(&mark, &[&due, &big(now_ms)])?;
        }
        Ok(due.into_iter().map(|j| JobId(j as u64)).collect())
    }

    fn output_removed(&mut self, job: JobId) -> Result<Option<u64>> {
        let stmt = self.statement("SELECT removed_ms FROM output_expiry WHERE job = $1")?;
        let row = self.db()?.query_opt(&stmt, &[&big(job.0)])?;
        Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).map(|ms| ms as u64))
    }

    fn output(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<u8>> {
        let stmt = self.statement(
            "SELECT start, data FROM output
             WHERE job = $1 AND start < $3 AND start + length(data) > $2 ORDER BY start",
        )?;
        let mut out = Vec::new();
        for row in self.db()?.query(&stmt, &[&big(job.0), &big(from), &big(to)])? {
            let (start, data): (i64, &[u8]) = (row.get(0), row.get(1));
            if !crate::store::append_piece(&mut out, from, to, start as u64, data) {
                break;
            }
        }
        Ok(out)
    }

    fn put_last_report(&mut self, node: &str, id: ebb_api::ReportId) -> Result<()> {
        self.pending.reports.insert(node.to_string(), (big(id.session), big(id.seq)));
        self.held();
        Ok(())
    }
}
