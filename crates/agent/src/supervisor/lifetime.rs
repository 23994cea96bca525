//! An attempt's life once started: watched until its group is empty,
//! its exit read and reported, and ended at its time limit.

use super::*;

impl Processes {
    /// Waits for the attempt to end, and reports how it did.
    pub(super) async fn watch(self: Arc<Self>, a: AttemptRef, ending: Ending) {
        let Ending { pid, group, peak, run_dir, default_workdir, output, uploads, image, devices } = ending;
        let status = spawn::wait(pid).await;
        kill_remains(pid, group.as_ref()).await;
        if group.is_some() && uploads.is_none() && image.is_none() {
            // Its group is empty: no process of its holds a GPU any more,
            // and a start waiting for them may run while this exit is read
            // and reported (its start is reported after). Not where the
            // exit waits for uploads, nor a container's, whose runtime is
            // not done with it yet.
            self.gpus.gone(a);
            if !self.waiting.lock().expect("waiting").is_empty() {
                // A waiting start was woken onto this thread, behind this
                // task: it goes first, and the exit's steps after it.
                tokio::task::yield_now().await;
            }
        }
        output.finish().await;
        if let Some(uploads) = uploads {
            // What the job left is uploaded; a drained job's exit waits for
            // it, up to the deadline (see `checkpoints`).
            let notice =
                self.running.lock().expect("running").get(&a).and_then(|r| r.notice.borrow().clone());
            uploads.finish(checkpoints::hold_exit_until(notice.as_ref())).await;
        }
        // A few calls on local files: here, with no trip to another thread
        // before the exit is reported.
        let (peak_memory_bytes, completed) = exit_facts(&peak, &run_dir, default_workdir.as_deref());
        let (code, signal) = match status {
            Ok(ended) => (ended.code, ended.signal),
            Err(e) => {
                tracing::error!(job = %a.job, attempt = %a.attempt, "cannot wait for pid {pid}: {e}");
                (None, None)
            }
        };
        // A container that never ran: why, for the timeline.
        let start_error = match (&image, code) {
            (Some((_, shim)), Some(crate::container::NOT_STARTED)) => {
                std::fs::read_to_string(&shim.error_file)
                    .ok()
                    .map(|e| e.chars().take(ebb_api::MAX_START_ERROR_CHARS).collect::<String>())
            }
            _ => None,
        };
        // Without cgroups, the ledger is rewritten at the next start;
        // until then a stale entry is harmless (its start time no longer
        // matches).
        let ended_by = self.running.lock().expect("running").remove(&a).and_then(|r| r.ended_by);
        // A Slurm job whose step port was taken as it started.
        let port_in_use = std::fs::read_to_string(run_dir.join(crate::slurm::STEP_PORT_TAKEN))
            .ok()
            .and_then(|p| p.trim().parse::<u16>().ok());
        tracing::info!(
            job = %a.job,
            attempt = %a.attempt,
            ?code,
            ?signal,
            ?peak_memory_bytes,
            ?ended_by,
            "exited"
        );
        let at_ms = now_ms();
        self.reporter.send(AgentEvent::Exited {
            attempt: a,
            code,
            signal,
            completed,
            at_ms,
            peak_memory_bytes,
            start_error,
            port_in_use,
            ended_by,
        });
        // The exit is on its way first: a start waiting for these GPUs
        // is reported after it.
        self.gpus.reported(a);
        if let Some((lease, shim)) = image {
            // After the exit is on its way. A shim killed with its attempt
            // (the deadline, a cancel) left the runtime's record of the
            // container; the image is let go once that is removed.
            let state = self.config.data_dir.join("runc");
            let runtime = self.config.images.runtime.clone();
            crate::blocking(move || {
                if state.join(&shim.id).exists() {
                    let _ = std::process::Command::new(&runtime)
                        .arg("--root")
                        .arg(&state)
                        .args(["delete", "--force", &shim.id])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                }
                drop(lease);
            })
            .await;
        }
        self.forget_step_images(a).await;
        drop(devices);
        // After the exit is on its way: a waiting preemptor need not wait
        // for the group to be put back. Made idle here (a few of the
        // kernel's files read and written: a trip to another thread would
        // cost more); removed, which may wait for the kernel, on a
        // blocking thread.
        if let (Some(pool), Some(group)) = (self.cgroups.clone(), group) {
            if let Err(group) = pool.reuse(group) {
                let ledger = self.ledger.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    pool.remove(&group);
                    record_pool(&pool, &ledger);
                })
                .await;
            }
        }
    }

    /// The attempt's time limit: its `warn` signal (a Slurm job's
    /// `--signal=SIG@SECS`) that long before it, then the end.
    pub(super) async fn limit_time(self: Arc<Self>, a: AttemptRef, limit_ms: u64, warn: Option<(u64, i32)>) {
        let started = tokio::time::Instant::now();
        let limit = Duration::from_millis(limit_ms);
        if let Some((before_ms, signal)) = warn.filter(|(before_ms, _)| *before_ms < limit_ms) {
            tokio::time::sleep_until(started + Duration::from_millis(limit_ms - before_ms)).await;
            if !self.is_running(a) {
                return;
            }
            if let Ok(signal) = Signal::try_from(signal) {
                self.signal(a, signal);
            }
        }
        tokio::time::sleep_until(started + limit).await;
        if self.is_running(a) {
            self.end(a, ebb_api::EndedBy::TimeLimit, TIME_LIMIT_GRACE);
        }
    }
}

/// Whatever the main process left behind goes too; the attempt ends when
/// its cgroup is empty.
async fn kill_remains(pid: i32, group: Option<&AttemptGroup>) {
    match group {
        // Usually the main process was the last: nothing to kill.
        Some(group) if group.populated() => {
            group.kill();
            group.emptied().await;
        }
        Some(_) => {}
        None => {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The attempt's peak memory and whether the job marked itself complete;
/// its directories are marked used now, since the retention period counts
/// from the attempt's end. Blocking.
fn exit_facts(peak: &cgroup::Peak, run_dir: &Path, default_workdir: Option<&Path>) -> (Option<u64>, bool) {
    let completed = run_dir.join(crate::dirs::COMPLETION_FILE).exists();
    for dir in std::iter::once(run_dir).chain(default_workdir) {
        dirs::touch(dir);
    }
    (peak.read(), completed)
}
