//! The leader's lease: a row, renewed inside every transaction of the
//! leader's, taken over when it expires or its holder's session is gone.

use super::*;

/// The leader's lease as a server not holding it sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// 0 before the first leader.
    pub epoch: u64,
    /// Where the leader answers ("" before the first).
    pub url: String,
    /// A new leader may take over: the lease ran out, or the leader's
    /// database session has ended (its process died).
    pub open: bool,
}

/// The lease row, and whether it is open: expired, never taken, or its
/// leader's session gone from the server (a process that died closes its
/// connection at once; a pid that was reused only delays the takeover to
/// the lease's end).
const LEASE: &str = "SELECT epoch, url,
        epoch = 0 OR expires_at < clock_timestamp()
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = leader.pid)
     FROM leader WHERE id = 1";

impl PgStore {
    /// The lease as it stands.
    pub fn lease(&mut self) -> Result<Lease> {
        let row = self.db()?.query_one(LEASE, &[])?;
        Ok(Lease { epoch: row.get::<_, i64>(0) as u64, url: row.get(1), open: row.get(2) })
    }

    /// Takes the lease if it is open, as the leader reached at `url`, for
    /// `ms` milliseconds at a time: the epoch goes up by one, and from
    /// then on every transaction of this store checks it. Returns the new
    /// epoch, or `None` while another leader holds the lease.
    ///
    /// The row is locked for the decision, so two servers cannot both take
    /// it, and a takeover waits for the leader's transaction in flight: a
    /// batch the old leader began before it lost the lease is either in the
    /// database before the new leader loads it, or refused.
    pub fn take_lease(&mut self, url: &str, ms: u64) -> Result<Option<u64>> {
        let ms = big(ms);
        // A session that stops talking in the middle of a transaction (its
        // process frozen) must not hold the lease's row forever.
        let mut db = self.db()?;
        db.batch_execute(&format!("SET idle_in_transaction_session_timeout = {ms}"))?;
        let mut tx = db.transaction()?;
        let row = tx.query_one(&format!("{LEASE} FOR UPDATE OF leader"), &[])?;
        let (epoch, open): (i64, bool) = (row.get(0), row.get(2));
        if !open {
            return Ok(None);
        }
        tx.execute(
            "UPDATE leader SET epoch = $1, url = $2, pid = pg_backend_pid(),
                 expires_at = clock_timestamp() + $3 * interval '1 millisecond'
             WHERE id = 1",
            &[&(epoch + 1), &url, &(ms as f64)],
        )?;
        tx.commit()?;
        drop(db);
        self.lease = Some(Held { epoch: epoch + 1, ms });
        Ok(Some(epoch as u64 + 1))
    }
}
