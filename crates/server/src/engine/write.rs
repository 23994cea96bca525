//! Store writes of a batch: job records, events and output.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn event(&mut self, id: u64, kind: &str, detail: serde_json::Value) {
        let at_ms = now_ms();
        let attempt = self.jobs.get(&id).map_or(0, |j| j.attempt);
        let event = JobEvent { at: rfc3339(at_ms), at_ms, kind: kind.into(), attempt, detail };
        if let Err(e) = self.store.add_event(id, &event) {
            tracing::error!("job {id}: cannot record {kind}: {e}");
        }
        tracing::info!(job = id, attempt, kind, "{}", event.detail);
    }

    pub(super) fn save(&mut self, id: u64) {
        let job = &self.jobs[&id];
        if let Err(e) = self.store.put_job(id, job.tenant, job) {
            tracing::error!("job {id}: cannot store: {e}");
        }
    }

    pub(super) fn log_path(&self, id: u64) -> PathBuf {
        self.config.data_dir.join("logs").join(format!("{id}.log"))
    }

    pub(super) fn append_log(&mut self, id: u64, data: &str) {
        use std::io::Write;
        let path = self.log_path(id);
        let result = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(data.as_bytes()));
        if let Err(e) = result {
            tracing::error!("job {id}: cannot append output to {}: {e}", path.display());
        }
    }
}
