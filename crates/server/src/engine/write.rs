//! Store writes of a batch: job records, events and output. Each returns
//! the store's error, and the batch that made it is abandoned.

use std::io::Write as _;

use super::*;

impl<S: Store> Engine<S> {
    /// Records that `kind` happened to job `id` at the batch's instant.
    pub(super) fn event(&mut self, id: u64, kind: EventKind, detail: serde_json::Value) -> Written {
        let at_ms = self.now;
        let attempt = self.jobs.get(&id).map_or(0, |j| j.attempt);
        let event = JobEvent { at: rfc3339(at_ms), at_ms, kind, attempt, detail };
        self.store.add_event(id, &event)?;
        tracing::info!(job = id, attempt, kind = kind.as_str(), "{}", event.detail);
        Ok(())
    }

    pub(super) fn save(&mut self, id: u64) -> Written {
        let job = &self.jobs[&id];
        self.store.put_job(id, job.tenant, job)
    }

    pub(super) fn log_path(&self, id: u64) -> PathBuf {
        self.config.data_dir.join("logs").join(format!("{id}.log"))
    }

    /// Appends `node`'s output of `attempt` to the job's log. `offset` is
    /// where `data` starts in that node's stream of the attempt: what was
    /// taken before (a report retried after its reply was lost) is not
    /// taken again. The length the log has after this is committed with
    /// the batch; output past the committed length, from a batch that
    /// never committed, is cut off before the next append.
    pub(super) fn append_output(
        &mut self,
        node: &str,
        attempt: AttemptRef,
        offset: Option<u64>,
        data: &str,
    ) -> Written {
        let id = attempt.job;
        let mut state = match self.logs.get(&id) {
            Some(state) => state.clone(),
            None => {
                let state = self.store.log_state(id)?.unwrap_or_default();
                self.cut_uncommitted(id, state.bytes)?;
                state
            }
        };
        if state.attempt != attempt.attempt {
            state.attempt = attempt.attempt;
            state.taken.clear();
        }
        let taken = state.taken.get(node).copied().unwrap_or(0);
        let data = match offset {
            // Already taken, whole or in part.
            Some(offset) if offset < taken => {
                let skip = (taken - offset) as usize;
                match data.get(skip..) {
                    Some(rest) => rest,
                    None => "",
                }
            }
            _ => data,
        };
        let end = offset.map_or(taken, |o| o.max(taken)) + data.len() as u64;
        if data.is_empty() {
            return Ok(());
        }
        let path = self.log_path(id);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(data.as_bytes()))
            .map_err(|e| StoreError(format!("job {id}: cannot append output to {}: {e}", path.display())))?;
        state.bytes += data.len() as u64;
        state.taken.insert(node.to_string(), end);
        self.store.put_log_state(id, &state)?;
        self.logs.insert(id, state);
        Ok(())
    }

    /// The log of job `id` is cut back to `committed` bytes if a batch
    /// that never committed wrote past it.
    fn cut_uncommitted(&self, id: u64, committed: u64) -> Written {
        let path = self.log_path(id);
        let cut = || -> std::io::Result<()> {
            let file = std::fs::OpenOptions::new().write(true).open(&path)?;
            if file.metadata()?.len() > committed {
                tracing::warn!(job = id, committed, "output past the last commit cut from the log");
                file.set_len(committed)?;
            }
            Ok(())
        };
        match cut() {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError(format!("job {id}: cannot cut {}: {e}", path.display())))
            }
            _ => Ok(()),
        }
    }
}
