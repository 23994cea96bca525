//! Jobs' output into their log files, off the writer thread.
//!
//! On SQLite each job's output is a file in the data dir, and the length
//! each log has is committed with the batch that wrote it (`LogState`). A
//! fleet starting thousands of attempts makes thousands of files in a
//! batch, and creating a file costs more than the rest of what a start
//! does; so the writer hands appends to a thread of their own and goes on
//! with the batch, and waits for them only before it commits (`flush`):
//! a committed length is never longer than its file, as before. What a
//! batch wrote and did not commit is cut from the log when it is next
//! read (`Engine::cut_uncommitted`).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::mpsc;

use crate::store::StoreError;

/// Files kept open between appends: the jobs writing most often.
const OPEN_FILES: usize = 256;

enum Op {
    Append {
        job: u64,
        path: PathBuf,
        data: Vec<u8>,
    },
    /// Answers with the first error since the last flush, once every
    /// append before it is written.
    Flush(mpsc::SyncSender<Option<String>>),
}

/// The log writer: a thread and the appends on their way to it.
pub(super) struct LogFiles {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Appends sent since the last flush.
    pending: usize,
}

impl LogFiles {
    pub fn start() -> LogFiles {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ebb-logs".into())
            .spawn(move || write_all(rx))
            .expect("a thread for jobs' log files");
        LogFiles { tx: Some(tx), thread: Some(thread), pending: 0 }
    }

    /// Appends `data` to job `job`'s log at `path`, soon.
    pub fn append(&mut self, job: u64, path: PathBuf, data: Vec<u8>) {
        self.pending += 1;
        let tx = self.tx.as_ref().expect("running");
        if tx.send(Op::Append { job, path, data }).is_err() {
            // The thread is gone: the flush says so and fails the batch.
        }
    }

    /// Waits until every append so far is in its file; the first that
    /// failed fails the batch.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if std::mem::take(&mut self.pending) == 0 {
            return Ok(());
        }
        let (done, wait) = mpsc::sync_channel(1);
        let sent = self.tx.as_ref().expect("running").send(Op::Flush(done));
        match sent.ok().and_then(|()| wait.recv().ok()) {
            Some(None) => Ok(()),
            Some(Some(e)) => Err(StoreError(e)),
            None => Err(StoreError("the log writer has stopped".into())),
        }
    }
}

impl Drop for LogFiles {
    /// Every append sent is written before the engine is gone, so that a
    /// writer opened next on the same data dir finds the files settled.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_all(rx: mpsc::Receiver<Op>) {
    let mut open: HashMap<u64, File> = HashMap::new();
    let mut failed: Option<String> = None;
    while let Ok(op) = rx.recv() {
        match op {
            Op::Append { job, path, data } => {
                if failed.is_some() {
                    continue;
                }
                if !open.contains_key(&job) && open.len() >= OPEN_FILES {
                    open.clear();
                }
                let file = match open.entry(job) {
                    std::collections::hash_map::Entry::Occupied(file) => file.into_mut(),
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                            Ok(file) => slot.insert(file),
                            Err(e) => {
                                failed = Some(format!(
                                    "job {job}: cannot append output to {}: {e}",
                                    path.display()
                                ));
                                continue;
                            }
                        }
                    }
                };
                if let Err(e) = file.write_all(&data) {
                    failed = Some(format!("job {job}: cannot append output to {}: {e}", path.display()));
                    open.remove(&job);
                }
            }
            Op::Flush(done) => {
                let _ = done.send(failed.take());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_are_in_their_files_at_the_flush_and_a_failed_one_fails_it() {
        let dir = std::env::temp_dir().join(format!("ebb-logfiles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut logs = LogFiles::start();
        for (job, data) in [(1, "a\n"), (2, "b\n"), (1, "c\n")] {
            logs.append(job, dir.join(format!("{job}.log")), data.as_bytes().to_vec());
        }
        logs.flush().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("1.log")).unwrap(), "a\nc\n");
        assert_eq!(std::fs::read_to_string(dir.join("2.log")).unwrap(), "b\n");

        logs.append(3, dir.join("missing").join("3.log"), b"x".to_vec());
        logs.append(1, dir.join("1.log"), b"d\n".to_vec());
        let err = logs.flush().unwrap_err();
        assert!(err.0.starts_with("job 3: cannot append output to"), "{}", err.0);
        // The next batch starts afresh.
        logs.append(2, dir.join("2.log"), b"e\n".to_vec());
        logs.flush().unwrap();
        drop(logs);
        assert_eq!(std::fs::read_to_string(dir.join("2.log")).unwrap(), "b\ne\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
