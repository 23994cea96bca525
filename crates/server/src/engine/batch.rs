//! The batch loop: messages in, one transaction, then replies and wake-ups.

use super::*;

impl<S: Store> Engine<S> {
    /// Runs the writer loop until every sender is gone.
    pub fn run(mut self, mut rx: tokio::sync::mpsc::Receiver<Msg>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(msg) => batch.push(msg),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.batch(batch, now_ms()) {
                // Nothing of this batch is acknowledged; callers see the error
                // as a dropped reply. Memory is ahead of the store now, so stop
                // rather than serve state the store does not have.
                tracing::error!("{e}; stopping");
                std::process::exit(70);
            }
        }
    }

    /// Handles one batch of messages at `now` as one store transaction:
    /// apply them, schedule until settled, commit, then answer and wake.
    /// On a failed commit nothing of the batch is answered and the engine
    /// must not be used again.
    pub fn batch(&mut self, batch: Vec<Msg>, now: u64) -> Result<(), String> {
        self.store.begin().map_err(|e| format!("cannot begin a transaction: {e}"))?;
        for msg in batch {
            self.handle(msg, now);
        }
        self.schedule(now);
        match self.store.commit() {
            Ok(()) => {
                for reply in self.after_commit.drain(..) {
                    reply();
                }
                for node in std::mem::take(&mut self.woken) {
                    if let Some(ch) = self.channels.get(&node) {
                        ch.notify.send_replace(ch.next_seq);
                    }
                }
                Ok(())
            }
            Err(e) => {
                self.after_commit.clear();
                let _ = self.store.rollback();
                Err(format!("commit failed: {e}"))
            }
        }
    }

    /// Handles a batch but dies before committing it, as a `kill -9` in
    /// the middle of a batch would: nothing of it reaches the store or any
    /// caller. For tests of crash safety.
    pub fn crash_during(mut self, batch: Vec<Msg>, now: u64) {
        if self.store.begin().is_ok() {
            for msg in batch {
                self.handle(msg, now);
            }
            self.schedule(now);
        }
        self.after_commit.clear();
        drop(self);
    }

    pub(super) fn reply<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.after_commit.push(Box::new(move || {
            let _ = tx.send(value);
        }));
    }
}
