//! Containment of an attempt in its own cgroup.
//!
//! A process group does not hold a job: a `setsid` child or a
//! double-forked daemon leaves it, survives cancel, the drain deadline and
//! fencing, and — holding the job's stdout — kept the attempt "running"
//! long after its main process was killed. A cgroup holds every process a
//! job starts, whatever it does with sessions: each attempt gets a cgroup
//! v2 group under the agent's own, its child joins it before `exec`,
//! signals go to every process in it, SIGKILL is `cgroup.kill`, and the
//! attempt ends when the group is empty (`populated 0`), never when some
//! pipe closes.
//!
//! The v2 hierarchy is wherever `/proc/self/mountinfo` says `cgroup2` is
//! mounted: `/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
//! hybrid ones. On hybrid hosts memory is accounted in the v1 `memory`
//! hierarchy, so the attempt also joins a parallel v1 memory group, which
//! gives its peak memory; on unified hosts `memory.peak` gives it where the
//! memory controller reaches the group.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// One line of `/proc/self/mountinfo` that mounts a cgroup hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    /// The root of the hierarchy that this mount shows (field 4).
    pub root: String,
    pub mount_point: PathBuf,
    /// `cgroup2`, or `cgroup` (v1).
    pub fstype: String,
    /// The v1 controllers (from the super options), empty for v2.
    pub controllers: Vec<String>,
    /// Mounted with `favordynmods` (see [`favor_dynamic_changes`]).
    pub favordynmods: bool,
}

/// The cgroup mounts in a mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split_whitespace().collect();
            let mut rest = right.split_whitespace();
            let fstype = rest.next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let _source = rest.next();
            let options = rest.next().unwrap_or("");
            let controllers = if fstype == "cgroup" {
                options
                    .split(',')
                    .filter(|o| !o.contains('=') && *o != "rw" && *o != "ro")
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            };
            Some(CgroupMount {
                root: unescape(fields.get(3)?),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                fstype: fstype.to_string(),
                controllers,
                favordynmods: options.split(',').any(|o| o == "favordynmods"),
            })
        })
        .collect()
}

/// mountinfo writes spaces and the like as octal escapes (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("x"), 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's groups from a `/proc/self/cgroup` text: the v2 path
/// (`0::/path`) and the v1 `memory` path (`N:memory:/path`), if any.
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut memory = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            memory = Some(path.to_string());
        }
    }
    (v2, memory)
}

/// Where group `path` of a hierarchy lies on disk under `mount`.
fn on_disk(mount: &CgroupMount, path: &str) -> PathBuf {
    let relative = if mount.root != "/" { path.strip_prefix(&mount.root).unwrap_or(path) } else { path };
    match relative.trim_start_matches('/') {
        "" => mount.mount_point.clone(),
        relative => mount.mount_point.join(relative),
    }
}

/// Why the agent's cgroups could not be found, made or used again.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NoV2Hierarchy,
    #[error("this process is in no cgroup v2 group (no 0:: line in /proc/self/cgroup)")]
    NoV2Group,
    /// A file of the kernel's could not be read, opened or written.
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    #[error("cannot create a cgroup in {}: {source}", parent.display())]
    Probe { parent: PathBuf, source: std::io::Error },
    #[error("{} has no cgroup.kill (kernel older than 5.14)", .0.display())]
    NoKill(PathBuf),
    #[error("cannot create cgroup {}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("mount -o remount,favordynmods {}: {why}", mount.display())]
    Remount { mount: PathBuf, why: String },
    /// An ended attempt's group holds too much memory to be used again.
    #[error("it holds {0} bytes")]
    Holds(u64),
    #[error("cannot reset {}: {source}", path.display())]
    Reset { path: PathBuf, source: std::io::Error },
}

/// A file error of `path`'s.
fn file(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::File { path: path.to_path_buf(), source }
}

/// The directories under which the agent makes its attempts' groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parents {
    /// The agent's own v2 group.
    pub v2: PathBuf,
    /// The agent's own v1 memory group (hybrid hosts).
    pub memory_v1: Option<PathBuf>,
}

/// The agent's own groups, from the texts of mountinfo and
/// `/proc/self/cgroup`.
pub fn discover(mountinfo: &str, proc_cgroup: &str) -> Result<Parents, CgroupError> {
    let mounts = parse_mountinfo(mountinfo);
    let (v2_path, memory_path) = parse_proc_cgroup(proc_cgroup);
    let v2_mount = mounts.iter().find(|m| m.fstype == "cgroup2").ok_or(CgroupError::NoV2Hierarchy)?;
    let v2_path = v2_path.ok_or(CgroupError::NoV2Group)?;
    let memory_v1 = memory_path.and_then(|path| {
        let mount =
            mounts.iter().find(|m| m.fstype == "cgroup" && m.controllers.iter().any(|c| c == "memory"))?;
        Some(on_disk(mount, &path))
    });
    Ok(Parents { v2: on_disk(v2_mount, &v2_path), memory_v1 })
}

/// Moving a process into a group takes a lock every fork in the host reads;
/// by default the kernel makes the first move after a quiet spell wait for
/// an RCU grace period (about 10 ms here), and every attempt's process
/// moves once, right before it starts: a preemptor would wait that long
/// after its victim left. The `favordynmods` mount option (Linux 6.0)
/// trades this for slightly dearer forks, which is what a node whose
/// purpose is starting jobs wants. Whether the mount was changed.
pub fn favor_dynamic_changes(mountinfo: &str) -> Result<bool, CgroupError> {
    let mounts = parse_mountinfo(mountinfo);
    let v2 = mounts.iter().find(|m| m.fstype == "cgroup2").ok_or(CgroupError::NoV2Hierarchy)?;
    let remount = |why: String| CgroupError::Remount { mount: v2.mount_point.clone(), why };
    if v2.favordynmods {
        return Ok(false);
    }
    let out = std::process::Command::new("mount")
        .arg("-o")
        .arg("remount,favordynmods")
        .arg(&v2.mount_point)
        .output()
        .map_err(|e| remount(e.to_string()))?;
    if !out.status.success() {
        return Err(remount(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(true)
}

impl Parents {
    /// This process's groups, checked by making (and removing) one.
    pub fn probe() -> Result<Parents, CgroupError> {
        let read = |p: &str| std::fs::read_to_string(p).map_err(file(Path::new(p)));
        let mut parents = discover(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?)?;
        let test = parents.v2.join(format!("ebb-probe-{}", std::process::id()));
        std::fs::create_dir(&test)
            .map_err(|source| CgroupError::Probe { parent: parents.v2.clone(), source })?;
        let kill_file = test.join("cgroup.kill").exists();
        let _ = std::fs::remove_dir(&test);
        if !kill_file {
            return Err(CgroupError::NoKill(parents.v2));
        }
        parents.enable_memory();
        if let Some(memory) = &parents.memory_v1 {
            let test = memory.join(format!("ebb-probe-{}", std::process::id()));
            if std::fs::create_dir(&test).is_ok() {
                let _ = std::fs::remove_dir(&test);
            } else {
                parents.memory_v1 = None;
            }
        }
        Ok(parents)
    }

    /// Memory accounting in the attempts' v2 groups, where the memory
    /// controller reaches the agent's group. A group with processes of its
    /// own cannot hand controllers to its children (cgroup v2's "no
    /// internal processes"), so an agent started in a group of its own (a
    /// systemd service) first moves itself into a leaf beside its attempts.
    fn enable_memory(&self) {
        let controllers = std::fs::read_to_string(self.v2.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return; // hybrid hosts: the v1 memory group accounts instead
        }
        let control = self.v2.join("cgroup.subtree_control");
        if std::fs::write(&control, "+memory").is_ok() {
            return;
        }
        let leaf = self.v2.join("ebb-agent");
        let moved = std::fs::create_dir_all(&leaf)
            .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()));
        match moved.and_then(|()| std::fs::write(&control, "+memory")) {
            Ok(()) => {
                tracing::info!(leaf = %leaf.display(), "moved into a leaf group to account attempts' memory")
            }
            Err(e) => tracing::warn!("no memory accounting for attempts in {}: {e}", self.v2.display()),
        }
    }

    /// A new group for an attempt (and its v1 memory group where there is
    /// one), empty: a leftover of the same name is killed first.
    pub fn create(&self, name: &str) -> Result<AttemptGroup, CgroupError> {
        let group =
            AttemptGroup { v2: self.v2.join(name), memory_v1: self.memory_v1.as_ref().map(|m| m.join(name)) };
        if group.v2.exists() {
            group.kill();
            group.remove();
        }
        std::fs::create_dir(&group.v2)
            .map_err(|source| CgroupError::Create { path: group.v2.clone(), source })?;
        if let Some(memory) = &group.memory_v1 {
            if let Err(e) = std::fs::create_dir(memory) {
                tracing::warn!("cannot create memory cgroup {}: {e}", memory.display());
            }
        }
        Ok(group)
    }

    /// The groups left under the agent's whose names start with `prefix`.
    pub fn leftovers(&self, prefix: &str) -> Vec<AttemptGroup> {
        let Ok(entries) = std::fs::read_dir(&self.v2) else { return Vec::new() };
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix) && e.path().is_dir())
            .map(|e| AttemptGroup {
                v2: e.path(),
                memory_v1: self.memory_v1.as_ref().map(|m| m.join(e.file_name())),
            })
            .collect()
    }
}

/// A group whose attempt ended is used again if it holds no more memory
/// than this (page cache its processes left), so that the next attempt's
/// peak memory starts from at most this much.
pub const RECYCLE_MAX_BYTES: u64 = 16 << 20;

/// The agent's attempt groups. Each attempt runs in a group nothing else
/// runs in; a group whose attempt has ended, empty and holding little
/// memory, is used again rather than removed and made anew. Making and
/// removing groups cost a short job's agent about a fifth of its time, and
/// every removed memory group that still holds page cache lingers in the
/// kernel ("dying" memory cgroups) and slows every later group operation.
/// Groups are made ahead of the starts that take them, off their path.
pub struct Pool {
    parents: Parents,
    /// The start of every group's name: the agent's prefix and pid.
    prefix: String,
    /// Idle groups kept, at most.
    keep: usize,
    idle: Mutex<Vec<Ready>>,
    /// Every group of the pool's, idle or in use: the agent's ledger.
    all: Mutex<BTreeSet<AttemptGroup>>,
    /// Whether `all` changed since `changed` was last asked.
    changed: AtomicBool,
    made: AtomicU64,
    /// Whether the groups have v2's memory controller (the same for all
    /// of them, under the same parents), once a group has been reset.
    v2_memory: std::sync::OnceLock<bool>,
}

/// A small file of the kernel's (a group's state or counter), read whole
/// without the `statx` and `lseek` that `std::fs::read_to_string` sizes
/// its buffer with: an attempt's end reads several.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = File::open(path)?;
    let mut buf = [0u8; 256];
    let mut text = Vec::new();
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => text.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8(text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// An idle group, ready for an attempt: the files that join it open, and
/// its peak memory counter reset.
pub struct Ready {
    pub group: AttemptGroup,
    pub join: JoinFiles,
    pub peak: Peak,
}

/// Where an attempt's peak memory is read.
#[derive(Debug)]
pub enum Peak {
    /// No memory accounting for the group.
    None,
    /// A counter file read by path: v1 `memory.max_usage_in_bytes` (reset
    /// by writing 0), or v2 `memory.peak` of a group never used before.
    Path(PathBuf),
    /// v2 `memory.peak` reset through this descriptor (Linux 6.12), which
    /// reads the peak since that reset.
    Reset(File),
}

impl Peak {
    pub fn read(&self) -> Option<u64> {
        let text = match self {
            Peak::None => return None,
            Peak::Path(path) => read_small(path).ok()?,
            Peak::Reset(file) => {
                use std::os::unix::fs::FileExt;
                let mut buf = [0u8; 32];
                let n = file.read_at(&mut buf, 0).ok()?;
                String::from_utf8_lossy(&buf[..n]).into_owned()
            }
        };
        text.trim().parse().ok()
    }
}

impl Pool {
    /// A pool under `parents` keeping up to `keep` idle groups, named
    /// `prefix`, the agent's pid and a number.
    pub fn new(parents: Parents, prefix: &str, keep: usize) -> Pool {
        Pool {
            parents,
            prefix: format!("{prefix}{}-", std::process::id()),
            keep,
            idle: Mutex::new(Vec::new()),
            all: Mutex::new(BTreeSet::new()),
            changed: AtomicBool::new(false),
            made: AtomicU64::new(0),
            v2_memory: std::sync::OnceLock::new(),
        }
    }

    pub fn parents(&self) -> &Parents {
        &self.parents
    }

    /// Every group the pool has made and not removed.
    pub fn all(&self) -> Vec<AttemptGroup> {
        self.all.lock().expect("pool").iter().cloned().collect()
    }

    /// Whether groups were made or removed since the last call.
    pub fn changed(&self) -> bool {
        self.changed.swap(false, Ordering::AcqRel)
    }

    /// An empty group for an attempt: an idle one, or one made now.
    pub fn take(&self) -> Result<Ready, CgroupError> {
        if let Some(ready) = self.idle.lock().expect("pool").pop() {
            return Ok(ready);
        }
        self.make()
    }

    fn make(&self) -> Result<Ready, CgroupError> {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let group = self.parents.create(&format!("{}{n}", self.prefix))?;
        self.all.lock().expect("pool").insert(group.clone());
        self.changed.store(true, Ordering::Release);
        let join = match group.join_files() {
            Ok(join) => join,
            Err(e) => {
                self.remove(&group);
                return Err(e);
            }
        };
        let peak = if group.v2.join("memory.peak").exists() {
            Peak::Path(group.v2.join("memory.peak"))
        } else if let Some(memory) = &group.memory_v1 {
            Peak::Path(memory.join("memory.max_usage_in_bytes"))
        } else {
            Peak::None
        };
        Ok(Ready { group, join, peak })
    }

    /// Makes groups until `keep` are idle (file system calls: blocking).
    pub fn fill(&self) {
        while self.idle.lock().expect("pool").len() < self.keep {
            match self.make() {
                Ok(ready) => self.idle.lock().expect("pool").push(ready),
                Err(e) => {
                    tracing::warn!("cannot make a cgroup ahead: {e}");
                    break;
                }
            }
        }
    }

    /// Takes back the group of an attempt that has ended (its processes
    /// gone): idle again if it is empty, holds little memory and its peak
    /// can be reset, else removed.
    pub fn recycle(&self, group: AttemptGroup) {
        if let Err(group) = self.reuse(group) {
            self.remove(&group);
        }
    }

    /// Makes the group of an ended attempt idle again if it can be (a few
    /// reads and writes of the kernel's files, which never wait); else
    /// gives it back, for [`Pool::remove`] (which may wait for the kernel
    /// to let go of it).
    pub fn reuse(&self, group: AttemptGroup) -> Result<(), AttemptGroup> {
        // The lock is not held while the group's files are read.
        let full = self.idle.lock().expect("pool").len() >= self.keep;
        if full || group.populated() {
            return Err(group);
        }
        match self.reset(&group) {
            Ok(ready) => {
                self.idle.lock().expect("pool").push(ready);
                Ok(())
            }
            Err(why) => {
                tracing::debug!(cgroup = %group.v2.display(), "not used again: {why}");
                Err(group)
            }
        }
    }

    fn reset(&self, group: &AttemptGroup) -> Result<Ready, CgroupError> {
        let read = |p: PathBuf| read_small(&p).ok()?.trim().parse::<u64>().ok();
        let v2_memory = *self.v2_memory.get_or_init(|| group.v2.join("memory.current").exists());
        let held = if v2_memory {
            read(group.v2.join("memory.current"))
        } else {
            group.memory_v1.as_ref().and_then(|m| read(m.join("memory.usage_in_bytes")))
        };
        if held.is_some_and(|held| held > RECYCLE_MAX_BYTES) {
            return Err(CgroupError::Holds(held.unwrap_or(0)));
        }
        let peak = if v2_memory {
            let path = group.v2.join("memory.peak");
            let mut file =
                std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(file(&path))?;
            let reset = |source| CgroupError::Reset { path: path.clone(), source };
            file.write_all(b"reset\n").map_err(reset)?;
            Peak::Reset(file)
        } else if let Some(memory) = &group.memory_v1 {
            let path = memory.join("memory.max_usage_in_bytes");
            std::fs::write(&path, "0").map_err(|source| CgroupError::Reset { path: path.clone(), source })?;
            Peak::Path(path)
        } else {
            Peak::None
        };
        Ok(Ready { group: group.clone(), join: group.join_files()?, peak })
    }

    /// Removes a group of the pool's for good.
    pub fn remove(&self, group: &AttemptGroup) {
        group.remove();
        self.all.lock().expect("pool").remove(group);
        self.changed.store(true, Ordering::Release);
    }

    /// Removes the idle groups (the agent is stopping).
    pub fn clear(&self) {
        let idle: Vec<Ready> = self.idle.lock().expect("pool").drain(..).collect();
        for ready in idle {
            self.remove(&ready.group);
        }
    }
}

/// One attempt's groups.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct AttemptGroup {
    pub v2: PathBuf,
    pub memory_v1: Option<PathBuf>,
}

/// What the child writes its pid into, opened before it starts: writing
/// "0" to `cgroup.procs` moves the writer.
pub struct JoinFiles(Vec<File>);

impl JoinFiles {
    /// The descriptors the child writes to, between clone and exec.
    pub fn fds(&self) -> Vec<RawFd> {
        self.0.iter().map(AsRawFd::as_raw_fd).collect()
    }
}

impl AttemptGroup {
    pub fn join_files(&self) -> Result<JoinFiles, CgroupError> {
        let open = |dir: &Path| {
            let path = dir.join("cgroup.procs");
            std::fs::OpenOptions::new().write(true).open(&path).map_err(file(&path))
        };
        let mut files = vec![open(&self.v2)?];
        if let Some(memory) = self.memory_v1.as_deref().filter(|m| m.exists()) {
            files.push(open(memory)?);
        }
        Ok(JoinFiles(files))
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.v2.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sends `signal` to every process in the group, as listed before the
    /// first is signalled; SIGKILL is `kill`.
    pub fn signal(&self, signal: Signal) {
        if signal == Signal::SIGKILL {
            return self.kill();
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILL to everything in the group, at once (`cgroup.kill`), or pid
    /// by pid where the kernel has no `cgroup.kill`.
    pub fn kill(&self) {
        if std::fs::write(self.v2.join("cgroup.kill"), "1").is_err() {
            // Processes fork while we read: go round until none is left.
            for _ in 0..100 {
                let pids = self.pids();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
    }

    /// Whether any process is still in the group (a group that is gone
    /// is empty).
    pub fn populated(&self) -> bool {
        match read_small(&self.v2.join("cgroup.events")) {
            Ok(events) => events.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => false,
        }
    }

    /// Waits until the group is empty: at once in the common case (the
    /// main process was the last), else polling from 0.2 ms up to 10 ms,
    /// since a waiting preemptor starts only after this.
    pub async fn emptied(&self) {
        let mut wait = Duration::from_micros(200);
        while self.populated() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(10));
        }
    }

    /// Removes the (empty) groups; the kernel may take a moment to let go.
    pub fn remove(&self) {
        for dir in std::iter::once(&self.v2).chain(self.memory_v1.as_ref()) {
            // A container's groups below it (see `container`) first.
            remove_children(dir);
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Removes the (empty) groups below `dir`, deepest first.
fn remove_children(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_children(&entry.path());
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_file_is_read_whole_past_one_read() {
        let dir = crate::testing::temp_dir("read-small");
        let path = dir.join("counter");
        let text: String = (0..200).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_small(&path).unwrap(), text);
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(read_small(&path).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        assert!(read_small(&dir.join("missing")).is_err());
    }

    #[test]
    fn favordynmods_is_read_from_the_super_options() {
        let line =
            |options: &str| format!("41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 {options}\n");
        assert!(!parse_mountinfo(&line("rw,nsdelegate"))[0].favordynmods);
        assert!(parse_mountinfo(&line("rw,nsdelegate,favordynmods"))[0].favordynmods);
        assert!(
            matches!(favor_dynamic_changes(&line("rw,favordynmods")), Ok(false)),
            "already set: nothing to do"
        );
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const HYBRID_SELF: &str = "\
9:name=systemd:/
4:memory:/process_api/2fd0
1:cpu:/
0::/
";

    #[test]
    fn hybrid_hosts_use_the_unified_mount_and_the_v1_memory_group() {
        let parents = discover(HYBRID, HYBRID_SELF).unwrap();
        assert_eq!(parents.v2, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(parents.memory_v1, Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/2fd0")));
    }

    #[test]
    fn unified_hosts_nest_under_the_agents_own_group() {
        let mountinfo = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let parents = discover(mountinfo, "0::/system.slice/ebb-agent.service\n").unwrap();
        assert_eq!(parents.v2, PathBuf::from("/sys/fs/cgroup/system.slice/ebb-agent.service"));
        assert_eq!(parents.memory_v1, None);
    }

    #[test]
    fn a_mount_of_a_subtree_is_joined_below_its_root() {
        // A container that sees only its own part of the hierarchy.
        let mountinfo = "700 690 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
        let parents = discover(mountinfo, "0::/kubepods/pod1/agent\n").unwrap();
        assert_eq!(parents.v2, PathBuf::from("/sys/fs/cgroup/agent"));
    }

    #[test]
    fn escaped_mount_points_are_read_back() {
        let mounts = parse_mountinfo("41 31 0:38 / /mnt/my\\040cgroup rw - cgroup2 none rw\n");
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroup"));
    }

    #[test]
    fn without_a_v2_hierarchy_there_is_no_containment() {
        let v1_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let err = discover(v1_only, "4:memory:/\n").unwrap_err();
        assert!(
            matches!(err, CgroupError::NoV2Hierarchy) && err.to_string().contains("no cgroup v2 hierarchy")
        );
        let err = discover(HYBRID, "4:memory:/x\n").unwrap_err();
        assert!(matches!(err, CgroupError::NoV2Group) && err.to_string().contains("0::"), "{err}");
    }
}
