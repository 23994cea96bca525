//! Store writes of a batch: job records, events and output. Each returns
//! the store's error, and the batch that made it is abandoned.

use std::io::Write as _;

use super::*;

impl<S: Store> Engine<S> {
    /// Writes job `id`'s record, and counts it as it is now. A job that
    /// has just finished leaves memory `keep_finished` from now.
    pub(super) fn save(&mut self, id: JobId) -> Written {
        let Parts { jobs, fx: mut writes, .. } = self.parts();
        effects::save(jobs, &mut writes, id)
    }

    /// Removes the output of finished jobs kept `keep_output`, once a
    /// minute and at most a thousand jobs' at a time, so that no batch
    /// waits on a large deletion.
    pub(super) fn prune_output(&mut self, now: u64) -> Written {
        if self.config.keep_output.as_millis() == 0 || now < self.output_pruned_ms.saturating_add(60_000) {
            return Ok(());
        }
        self.output_pruned_ms = now;
        let pruned = self.store.prune_output(now, 1000)?;
        if !pruned.is_empty() {
            tracing::info!(jobs = pruned.len(), "removed finished jobs' output kept past --keep-output");
        }
        Ok(())
    }

    /// Finished jobs kept `keep_finished` by `now` leave memory: the store
    /// has all of them, and the tally keeps counting them.
    pub(super) fn prune_finished(&mut self, now: u64) {
        let Some(cutoff) = now.checked_sub(self.config.keep_finished.as_millis()) else { return };
        while let Some((finished_ms, id)) = self.jobs.finished.pop_due(cutoff) {
            if self.jobs.get(&id).is_some_and(|j| j.state.is_final()) {
                let job = self.jobs.remove(&id).expect("just seen");
                // What its tenant was counted for keeping, given back as it
                // leaves memory; a record only read back for a request
                // (stamped 0) was never counted.
                if finished_ms != 0 {
                    let load = self.admission.load.entry(job.tenant).or_default();
                    load.bytes = load.bytes.saturating_sub(job.spec.stored_bytes());
                }
            }
        }
    }

    pub(super) fn log_path(&self, id: JobId) -> PathBuf {
        self.config.data_dir.join("logs").join(format!("{id}.log"))
    }

    /// Appends output of job `id` to its log; the length the log has
    /// after this is committed with the batch. (A report sent again after
    /// its reply was lost is not applied again: see `report`.)
    /// `node`: the node of a gang that wrote it (its agent sends whole
    /// lines), kept with the piece for `ebb logs --label`.
    pub(super) fn append_output(&mut self, id: JobId, data: &str, node: Option<&str>) -> Written {
        if data.is_empty() {
            return Ok(());
        }
        let mut state = self.log_state(id)?;
        if state.file {
            let path = self.log_path(id);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(data.as_bytes()))
                .map_err(|e| {
                    StoreError::Io(format!("job {id}: cannot append output to {}: {e}", path.display()))
                })?;
            state.bytes += data.len() as u64;
            self.store.put_log_state(id, &state)?;
        } else {
            self.store.put_output(id, state.bytes, data.as_bytes(), node)?;
            state.bytes += data.len() as u64;
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            job.no_output = false;
        }
        self.jobs.logs.insert(id, state);
        Ok(())
    }

    /// How long job `id`'s log is, and where. The first time this server
    /// looks at a log that is a file, output past its committed length
    /// (of a batch that never committed) is cut from it.
    pub(super) fn log_state(&mut self, id: JobId) -> Written<crate::store::LogState> {
        if let Some(state) = self.jobs.logs.get(&id) {
            return Ok(state.clone());
        }
        if self.jobs.get(&id).is_some_and(|j| j.no_output) {
            return Ok(crate::store::LogState::default());
        }
        let state = match self.store.log_state(id)? {
            Some(state) if state.file => state,
            // A job from before logs were tracked: its log file is as it is.
            None if !self.jobs[&id].log_tracked && self.log_path(id).exists() => {
                let bytes = std::fs::metadata(self.log_path(id)).map_or(0, |m| m.len());
                crate::store::LogState { bytes, file: true }
            }
            _ => crate::store::LogState { bytes: self.store.output_len(id)?, file: false },
        };
        if state.file {
            self.cut_uncommitted(id, state.bytes)?;
        }
        // Kept while output can still come; a finished job's is read again.
        if !self.jobs[&id].state.is_final() {
            self.jobs.logs.insert(id, state.clone());
        }
        Ok(state)
    }

    /// The log file of job `id` is cut back to `committed` bytes if a
    /// batch that never committed wrote past it.
    pub(super) fn cut_uncommitted(&self, id: JobId, committed: u64) -> Written {
        let path = self.log_path(id);
        let cut = || -> std::io::Result<()> {
            let file = std::fs::OpenOptions::new().write(true).open(&path)?;
            if file.metadata()?.len() > committed {
                tracing::warn!(job = id.0, committed, "output past the last commit cut from the log");
                file.set_len(committed)?;
            }
            Ok(())
        };
        match cut() {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError::Io(format!("job {id}: cannot cut {}: {e}", path.display())))
            }
            _ => Ok(()),
        }
    }
}
