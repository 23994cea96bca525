//! SQLite's schema, one numbered step at a time, and what brings a
//! database to the latest.

use rusqlite::Connection;

use super::{Result, StoreError};

/// The schema, one numbered step at a time: step N brings a database at
/// `user_version` N-1 to N, in one transaction. Steps are never edited
/// once released; a change is a new step. Step 1 is written so that it
/// also adopts a database created before steps were numbered.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // 12: when a finished job's output goes (--keep-output), and when it
    // went; the jobs still due, by when.
    "CREATE TABLE output_expiry (job INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, removed_ms INTEGER);
     CREATE INDEX output_expiry_due ON output_expiry(at_ms) WHERE removed_ms IS NULL;",
    // 13: webhooks, the outbox of their deliveries, and the log of tries.
    "CREATE TABLE webhooks (id INTEGER PRIMARY KEY, record TEXT NOT NULL);
     CREATE TABLE webhook_outbox (id INTEGER PRIMARY KEY, webhook INTEGER NOT NULL, record TEXT NOT NULL);
     CREATE TABLE webhook_log (seq INTEGER PRIMARY KEY, webhook INTEGER NOT NULL, record TEXT NOT NULL);
     CREATE INDEX webhook_log_by_hook ON webhook_log(webhook, seq);",
];

/// Brings the database to the latest step of `MIGRATIONS`
/// (`rusqlite_migration`, which tracks the step in `PRAGMA user_version`
/// and runs each in its own transaction).
pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if usize::try_from(version).unwrap_or(0) > MIGRATIONS.len() {
        return Err(StoreError::Unreadable(format!(
            "the database is at schema version {version}, newer than this ebb ({}): upgrade ebb",
            MIGRATIONS.len()
        )));
    }
    let steps = MIGRATIONS.iter().map(|sql| rusqlite_migration::M::up(sql)).collect();
    rusqlite_migration::Migrations::new(steps)
        .to_latest(conn)
        .map_err(|e| StoreError::Database(format!("schema migration: {e}")))
}
