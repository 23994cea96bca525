//! The crash ledger: what survives an agent crash, so that a restarted
//! agent kills what its previous life left running instead of leaving
//! stale attempts running beside the ones the server hands out again.
//!
//! It lists every cgroup of the agent's pool (rewritten when the pool
//! changes) or, where there are no cgroups, each attempt's process group
//! with its leader's start time (rewritten at each start). Changes are
//! recorded in memory and written by one task on a blocking thread
//! ([`Ledger::write_on_change`]): a burst of changes is one write, and
//! neither a start nor an exit waits for the disk. At start, before it
//! registers, the agent kills every group named after it, recorded or not
//! ([`kill_leftovers`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::AttemptRef;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::cgroup;

/// The ledger as written (JSON, 0600).
#[derive(Clone, Default, Serialize, Deserialize)]
struct Contents {
    /// (attempt, process group, the leader's start time in clock ticks).
    groups: Vec<(AttemptRef, i32, u64)>,
    #[serde(default)]
    cgroup_pool: Vec<cgroup::AttemptGroup>,
}

/// The ledger in `data_dir`, kept written.
pub(crate) struct Ledger {
    path: PathBuf,
    contents: Mutex<Contents>,
    changed: Notify,
}

impl Ledger {
    pub(crate) fn new(data_dir: &Path) -> Arc<Ledger> {
        Arc::new(Ledger {
            path: ledger_path(data_dir),
            contents: Mutex::new(Contents::default()),
            changed: Notify::new(),
        })
    }

    /// The running attempts' process groups (no cgroups).
    pub(crate) fn record_process_groups(&self, groups: Vec<(AttemptRef, i32, u64)>) {
        self.contents.lock().expect("ledger").groups = groups;
        self.changed.notify_one();
    }

    /// Every cgroup of the pool, idle or in use.
    pub(crate) fn record_cgroups(&self, pool: Vec<cgroup::AttemptGroup>) {
        self.contents.lock().expect("ledger").cgroup_pool = pool;
        self.changed.notify_one();
    }

    /// Writes the ledger whenever it changed, for ever: on a blocking
    /// thread, the lock held only to copy what is recorded.
    pub(crate) async fn write_on_change(self: Arc<Self>) {
        loop {
            self.changed.notified().await;
            let contents = self.contents.lock().expect("ledger").clone();
            let path = self.path.clone();
            let written = tokio::task::spawn_blocking(move || write(&path, &contents))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(e) = written {
                tracing::error!("cannot record running attempts: {e}");
            }
        }
    }
}

fn ledger_path(data_dir: &Path) -> PathBuf {
    data_dir.join("attempts.json")
}

/// Writes `contents` to `path` atomically, readable by the agent alone.
fn write(path: &Path, contents: &Contents) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let bytes = serde_json::to_vec(contents).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(&bytes)?;
    std::fs::rename(&tmp, path)
}

/// Kills what a previous life of the agent with data in `data_dir` left
/// running: every cgroup under `parents` whose name starts with
/// `group_prefix`, recorded or not (it may have died between making one
/// and recording it), and the process groups its ledger names whose
/// leaders are still the processes it started. Then forgets the ledger.
/// Blocking (file system calls, and waits of up to 2 s per group).
pub(crate) fn kill_leftovers(data_dir: &Path, parents: Option<&cgroup::Parents>, group_prefix: &str) {
    let path = ledger_path(data_dir);
    let ledger: Contents =
        std::fs::read(&path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default();
    let mut groups = parents.map_or_else(Vec::new, |p| p.leftovers(group_prefix));
    for group in ledger.cgroup_pool {
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    for group in groups {
        kill_cgroup(&group);
    }
    for (attempt, pgid, started) in ledger.groups {
        // Only if the group's leader is still the process we started.
        if process_start(pgid) != Some(started) {
            continue;
        }
        if killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok() {
            tracing::warn!(
                job = %attempt.job,
                attempt = %attempt.attempt,
                pgid,
                "killed an attempt left by a previous agent"
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Kills everything in `group`, waits up to 2 s for it to empty, and
/// removes it.
fn kill_cgroup(group: &cgroup::AttemptGroup) {
    if group.populated() {
        tracing::warn!(cgroup = %group.v2.display(), "killing an attempt left by a previous agent");
    }
    group.kill();
    let deadline = Instant::now() + Duration::from_secs(2);
    while group.populated() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    group.remove();
}

/// When process `pid` started (field 22 of /proc/PID/stat), so that a
/// recycled pid is never mistaken for one of ours.
pub(crate) fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;
    use ebb_core::{Attempt, JobId};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-ledger-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn changes_are_written_off_the_runtime_and_a_restarted_agent_kills_the_recorded_groups() {
        let dir = temp_dir("kill");
        // A process group of its own, as an attempt's is.
        let mut child = std::process::Command::new("sleep").arg("600").process_group(0).spawn().unwrap();
        let pid = child.id() as i32;
        let started = process_start(pid).expect("a live process has a start time");
        let ledger = Ledger::new(&dir);
        tokio::spawn(ledger.clone().write_on_change());
        let a = AttemptRef { job: JobId(3), attempt: Attempt(1) };
        // Only the last of a burst of changes needs to reach the disk.
        ledger.record_process_groups(Vec::new());
        ledger.record_process_groups(vec![(a, pid, started)]);
        let path = ledger_path(&dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&path).is_ok_and(|t| t.contains(&pid.to_string())) {
            assert!(Instant::now() < deadline, "the ledger was never written");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let leftovers = dir.clone();
        tokio::task::spawn_blocking(move || kill_leftovers(&leftovers, None, "ebb-test-")).await.unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(!path.exists(), "the ledger is forgotten once acted on");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_recycled_pid_is_never_killed() {
        let dir = temp_dir("recycled");
        let mut child = std::process::Command::new("sleep").arg("600").process_group(0).spawn().unwrap();
        let pid = child.id() as i32;
        let started = process_start(pid).unwrap();
        let contents = Contents {
            groups: vec![(AttemptRef { job: JobId(1), attempt: Attempt(1) }, pid, started + 1)],
            cgroup_pool: Vec::new(),
        };
        write(&ledger_path(&dir), &contents).unwrap();
        kill_leftovers(&dir, None, "ebb-test-");
        assert!(child.try_wait().unwrap().is_none(), "a process the agent did not start was killed");
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
