//! The batch loop: messages in, one transaction, then replies and wake-ups.

use super::*;

/// The most messages one transaction takes.
const BATCH_MESSAGES: usize = 1024;

impl<S: Store> Engine<S> {
    /// Committed changes are counted on `feed` from now on.
    pub fn feed(&mut self, feed: Feed) {
        self.outbox.feed = Some(feed);
    }

    /// Runs the writer loop until every sender is gone (`None`), or until
    /// a batch fails: then nothing of it was acknowledged, memory is ahead
    /// of the store, and the engine is dropped with the reason returned.
    /// A batch that stopped scheduling at its bound is followed at once by
    /// the next, with whatever messages came meanwhile, until the core
    /// settles.
    pub fn run(mut self, mut rx: tokio::sync::mpsc::Receiver<Msg>) -> Option<String> {
        // One buffer for every batch: grown anew each time, it was a
        // fiftieth of the writer's time in a fleet's fill.
        let mut batch = Vec::with_capacity(BATCH_MESSAGES);
        loop {
            if !self.unsettled {
                batch.push(rx.blocking_recv()?);
            }
            while batch.len() < BATCH_MESSAGES {
                match rx.try_recv() {
                    Ok(msg) => batch.push(msg),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.batch(batch.drain(..), now_ms()) {
                // Callers see the error as a dropped reply.
                return Some(e);
            }
        }
    }

    /// Handles one batch of messages at `now` as one store transaction:
    /// apply them, schedule until settled, commit, then answer and wake.
    /// If any store write fails, or the commit does, the transaction is
    /// rolled back, nothing of the batch is answered or sent to an agent,
    /// and the engine must not be used again.
    pub fn batch(&mut self, batch: impl IntoIterator<Item = Msg>, now: u64) -> Result<(), String> {
        self.now = now;
        self.store.begin().map_err(|e| format!("cannot begin a transaction: {e}"))?;
        let applied = self.apply(batch, now).map_err(|e| format!("a write failed, nothing committed: {e}"));
        let committed = applied.and_then(|()| self.store.commit().map_err(|e| format!("commit failed: {e}")));
        match committed {
            Ok(()) => {
                self.outbox.deliver();
                Ok(())
            }
            Err(e) => {
                self.outbox.discard();
                let _ = self.store.rollback();
                Err(e)
            }
        }
    }

    /// Every message of the batch, then the core's plans until it settles.
    fn apply(&mut self, batch: impl IntoIterator<Item = Msg>, now: u64) -> Written {
        for msg in batch {
            self.handle(msg, now)?;
        }
        self.schedule(now)?;
        self.prune_finished(now);
        Ok(())
    }

    /// The invariants of what the writer holds, checked whole: the core's
    /// (`State::sanity_check`), and that every job the core knows has a
    /// record that is not final. Tests call it after every batch.
    pub fn sanity_check(&self) -> Result<(), String> {
        self.core.sanity_check()?;
        for (id, job) in &self.jobs {
            if job.state.is_final() && self.core.job(JobId(*id)).is_some() {
                return Err(format!("job {id}: {} in its record, still in the core", job.state.as_str()));
            }
        }
        Ok(())
    }

    /// Handles a batch but dies before committing it, as a `kill -9` in
    /// the middle of a batch would: nothing of it reaches the store or any
    /// caller. For tests of crash safety.
    pub fn crash_during(mut self, batch: Vec<Msg>, now: u64) {
        self.now = now;
        if self.store.begin().is_ok() {
            let _ = self.apply(batch, now);
        }
        self.outbox.discard();
        drop(self);
    }

    /// Answers `tx` with `result` after the commit, unless the store
    /// failed: then the batch is abandoned and nobody is answered.
    pub(super) fn answer<T: Send + 'static, E: Into<Fail>>(
        &mut self,
        tx: oneshot::Sender<Result<T, ApiError>>,
        result: Result<T, E>,
    ) -> Written {
        match result.map_err(Into::into) {
            Ok(value) => self.outbox.reply(tx, Ok(value)),
            Err(Fail::Refused(e)) => self.outbox.reply(tx, Err(e)),
            Err(Fail::Store(e)) => return Err(e),
        }
        Ok(())
    }
}
