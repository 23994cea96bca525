//! Checkpoints that follow the job: where the server has a checkpoint
//! store (`ebb server --checkpoint-store`), the agent restores the job's
//! latest checkpoint into its node-local checkpoint directory before an
//! attempt starts, and uploads the directory after each checkpoint the job
//! reports and once more when it exits (see `ebb_checkpoints` for what is
//! stored and why a partial upload is never the latest).
//!
//! Uploads run on a task of their own per attempt, never on the command
//! loop or the endpoint that took the report: reports that come while an
//! upload runs are folded into one upload after it. At the exit the agent
//! holds the exit's report until the last upload is stored, but never past
//! a drain's deadline: the preemptor waits no longer than the window it
//! was promised. An upload still running then goes on; it becomes the
//! latest only when its manifest is written, and a restore meanwhile takes
//! the one before. A cancelled or finished job's exit is not held.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::{AgentEvent, AttemptRef, CheckpointStoreLocation};
use ebb_checkpoints::{Credentials, JobStore, Store, UploadCache};
use ebb_core::bytes_text;
use tokio::sync::watch;

use crate::report::Reporter;

/// The node's view of the store: where the server said it is, with this
/// agent's own credentials.
pub(crate) struct Checkpoints {
    credentials: Option<Credentials>,
    store: Mutex<Option<(CheckpointStoreLocation, Store)>>,
}

impl Checkpoints {
    pub(crate) fn new(credentials: Option<Credentials>) -> Checkpoints {
        Checkpoints { credentials, store: Mutex::new(None) }
    }

    /// Takes the store the server named at registration (none: checkpoints
    /// stay in the checkpoint root). An error is for the operator: this
    /// agent cannot use the cluster's store, so it must not run jobs that
    /// would lose their checkpoints.
    pub(crate) fn configure(&self, location: Option<&CheckpointStoreLocation>) -> Result<(), Unusable> {
        let mut store = self.store.lock().expect("store");
        match location {
            None => *store = None,
            Some(l) if store.as_ref().is_some_and(|(known, _)| known == l) => {}
            Some(l) => {
                let opened = Store::open(l, self.credentials.as_ref())
                    .map_err(|source| Unusable { url: l.url.clone(), source })?;
                tracing::info!(store = l.url, "jobs' checkpoints follow them through the checkpoint store");
                *store = Some((l.clone(), opened));
            }
        }
        Ok(())
    }

    pub(crate) fn store(&self) -> Option<Store> {
        self.store.lock().expect("store").as_ref().map(|(_, s)| s.clone())
    }
}

/// The cluster's checkpoint store cannot be used by this agent.
#[derive(Debug, thiserror::Error)]
#[error("the server keeps checkpoints in {url}, which this agent cannot use: {source}")]
pub(crate) struct Unusable {
    url: String,
    source: ebb_checkpoints::StoreError,
}

/// One attempt's uploads.
pub(crate) struct AttemptUploads {
    /// How many uploads were asked for, and the step of the latest report.
    requested: watch::Sender<(u64, Option<u64>)>,
    /// How many of them are done (stored, found unchanged, or failed).
    done: watch::Receiver<u64>,
    /// Whether the attempt's exit is not reported yet: until then, what
    /// the uploads did goes into the job's log too.
    live: Arc<AtomicBool>,
}

/// What an attempt's upload task needs.
pub(crate) struct UploadTask {
    pub store: JobStore,
    pub dir: std::path::PathBuf,
    /// Whose files are taken and what one checkpoint may hold.
    pub rules: ebb_checkpoints::Rules,
    pub attempt: AttemptRef,
    pub cache: UploadCache,
    pub reporter: Arc<Reporter>,
}

impl AttemptUploads {
    /// Starts the attempt's upload task.
    pub(crate) fn start(task: UploadTask) -> Arc<AttemptUploads> {
        let (requested, mut asked) = watch::channel((0u64, None));
        let (done_tx, done) = watch::channel(0u64);
        let live = Arc::new(AtomicBool::new(true));
        let log = live.clone();
        let uploads = Arc::new(AttemptUploads { requested, done, live });
        tokio::spawn(async move {
            let UploadTask { store, dir, rules, attempt: a, mut cache, reporter } = task;
            while asked.changed().await.is_ok() {
                let (n, step) = *asked.borrow_and_update();
                let began = Instant::now();
                let line = match store.upload(&dir, rules, a.attempt.0, step, &mut cache).await {
                    Ok(Some(up)) => {
                        let m = &up.manifest;
                        tracing::info!(
                            job = %a.job,
                            attempt = %a.attempt,
                            manifest = m.key(),
                            sent_bytes = up.sent_bytes,
                            seconds = up.seconds,
                            "checkpoint stored"
                        );
                        Some(format!(
                            "ebb: checkpoint store: stored {}: {} files, {} ({} sent) in {:.2}s\n",
                            m.describe(),
                            m.files.len(),
                            bytes_text(m.bytes()),
                            bytes_text(up.sent_bytes),
                            up.seconds
                        ))
                    }
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(job = %a.job, attempt = %a.attempt, "checkpoint upload failed: {e}");
                        Some(format!(
                            "ebb: checkpoint store: upload failed after {:.1}s: {e}; the store's latest \
                             checkpoint is still the one before\n",
                            began.elapsed().as_secs_f64()
                        ))
                    }
                };
                // Output is the attempt's only while it runs: once its exit
                // is reported, what is left goes to the agent's log alone.
                if let Some(data) = line.filter(|_| log.load(Ordering::SeqCst)) {
                    reporter.send(AgentEvent::Output { attempt: a, data });
                }
                let _ = done_tx.send(n);
            }
        });
        uploads
    }

    /// The job reported a checkpoint: upload it (after the upload under
    /// way, if any).
    pub(crate) fn checkpointed(&self, step: Option<u64>) {
        self.requested.send_modify(|(n, s)| {
            *n += 1;
            *s = step.or(*s);
        });
    }

    /// The attempt exited: uploads what its directory holds now and waits
    /// for that, until `until` at the latest (none: does not wait). The
    /// upload goes on after it, on its own.
    pub(crate) async fn finish(self: Arc<Self>, until: Option<Instant>) {
        self.requested.send_modify(|(n, s)| {
            *n += 1;
            *s = None;
        });
        let Some(until) = until else {
            self.live.store(false, Ordering::SeqCst);
            return;
        };
        let wanted = self.requested.borrow().0;
        let mut done = self.done.clone();
        let wait = done.wait_for(|n| *n >= wanted);
        let left = until.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, wait).await.is_err() {
            tracing::warn!(
                "checkpoint upload still running at the drain deadline: the exit is reported now; the upload \
                 becomes the latest checkpoint only if it completes"
            );
        }
        self.live.store(false, Ordering::SeqCst);
    }
}

/// How long an exit may be held for its last upload: until the drain's
/// deadline, if the attempt was drained (it will resume); not at all
/// otherwise.
pub(crate) fn hold_exit_until(notice: Option<&crate::notice::Notice>) -> Option<Instant> {
    let notice = notice.filter(|n| n.action == crate::notice::NoticeAction::Preempt)?;
    let left = notice.deadline_ms.saturating_sub(crate::report::now_ms());
    Some(Instant::now() + Duration::from_millis(left))
}

/// What a restore before an attempt's start did.
pub(crate) struct Restore {
    /// For the job's log: what was restored, what was refused and why.
    pub lines: Vec<String>,
    /// Primed with what the directory holds now.
    pub cache: UploadCache,
    /// For the job's timeline: the checkpoint put in place, if any.
    pub restored: Option<AgentEvent>,
}

/// Restores the job's latest checkpoint into `dir` before `attempt`
/// starts.
pub(crate) async fn restore(
    store: &JobStore,
    url: &str,
    attempt: AttemptRef,
    dir: &std::path::Path,
    owner: Option<(u32, u32)>,
) -> Restore {
    let mut cache = UploadCache::default();
    let mut lines = Vec::new();
    let mut event = None;
    match store.restore(dir, owner, &mut cache).await {
        Ok(restored) => {
            for note in &restored.notes {
                tracing::warn!("checkpoint store: {note}");
                lines.push(format!("ebb: checkpoint store: {note}\n"));
            }
            if let Some(m) = &restored.manifest {
                lines.push(format!(
                    "ebb: checkpoint store: restored {}: {} files, {} in {:.2}s\n",
                    m.describe(),
                    m.files.len(),
                    bytes_text(m.bytes()),
                    restored.seconds
                ));
                event = Some(AgentEvent::Restored {
                    attempt,
                    from_attempt: m.attempt,
                    upload: m.seq,
                    step: m.step,
                    files: m.files.len() as u64,
                    bytes: m.bytes(),
                    duration_ms: (restored.seconds * 1000.0).round() as u64,
                    at_ms: crate::report::now_ms(),
                });
            }
        }
        Err(e) => {
            tracing::error!("checkpoint store {url}: cannot restore: {e}");
            lines.push(format!(
                "ebb: checkpoint store: cannot restore: {e}; the attempt starts with what this node's \
                 checkpoint directory holds\n"
            ));
        }
    }
    Restore { lines, cache, restored: event }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_drain_holds_the_exit_for_the_upload() {
        let drain = crate::notice::Notice::new(0, crate::report::now_ms() + 60_000, "preempted".into());
        let held = hold_exit_until(Some(&drain)).expect("held");
        assert!(held > Instant::now() + Duration::from_secs(50));
        let mut cancel = drain.clone();
        cancel.action = crate::notice::NoticeAction::Cancel;
        assert_eq!(hold_exit_until(Some(&cancel)), None);
        assert_eq!(hold_exit_until(None), None);
    }
}
