//! `ebb agent`: one per node. Joins the server, runs each attempt as a real
//! process in its own cgroup (see `cgroup`; a process group where the
//! agent cannot make cgroups), as the Unix user its tenant is mapped to,
//! with an environment built for it (see `identity`), and delivers the
//! drain: the job's signal, the notice file, the attempt's metadata
//! endpoint, SIGKILL at the deadline. Everything it reports names the
//! attempt, so the server can fence stale ones.

pub mod cgroup;
pub mod gpus;
pub mod identity;
mod metadata;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ebb_api::{Action, AgentEvent, AttemptRef, DrainAttempt, Register, Registered, StartAttempt};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use crate::metadata::Notice;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub server: String,
    pub join_token: String,
    pub name: String,
    pub gpus: u8,
    pub gpu_model: String,
    pub labels: BTreeMap<String, String>,
    /// Per-job working directories and the agent's own state.
    pub data_dir: PathBuf,
    /// Where each job's checkpoint directory lives; shared storage in a
    /// real cluster, so that a job resumes on any node.
    pub checkpoint_root: PathBuf,
    /// Where other nodes reach this one (a gang's `MASTER_ADDR`).
    pub address: String,
    /// Jobs' `PATH` (a submission's own `PATH` wins).
    pub job_path: String,
    /// Variables the operator adds to every job's base environment.
    pub job_env: BTreeMap<String, String>,
    /// A root agent may run jobs as root: a personal cluster (`ebb up`).
    pub allow_root_jobs: bool,
    /// How long a finished attempt's run directory and default working
    /// directory are kept.
    pub attempt_retention: Duration,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A running attempt.
struct Running {
    pgid: i32,
    started_ticks: u64,
    signal: i32,
    drain_file: PathBuf,
    notice: watch::Sender<Option<Notice>>,
    /// The attempt's cgroup; none where the agent cannot make cgroups.
    group: Option<cgroup::AttemptGroup>,
}

/// What survives an agent crash: the process groups and cgroups it
/// started, so that a restarted agent can kill them instead of leaving
/// stale attempts running.
#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    /// (attempt, process group, the leader's start time in clock ticks).
    groups: Vec<(AttemptRef, i32, u64)>,
    #[serde(default)]
    cgroups: Vec<(AttemptRef, cgroup::AttemptGroup)>,
}

/// Creates `path` (and its parents) if missing, then gives it `mode` and,
/// on a root agent, the owner `who`.
fn own_dir(path: &Path, mode: u32, who: Option<&identity::Identity>) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot prepare {}: {e}", path.display());
    std::fs::create_dir_all(path).map_err(fail)?;
    if let Some(who) = who.filter(|w| w.switch) {
        nix::unistd::chown(path, Some(who.uid), Some(who.gid)).map_err(|e| fail(e.into()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// A short stable tag for a path: the agent's cgroups carry the tag of its
/// data directory, so two agents on one host never touch each other's.
fn tag(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let hash = path
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100000001b3));
    format!("{:08x}", hash as u32)
}

/// A tenant name as a directory name: the server allows letters, digits,
/// `-` and `_`; anything else is refused rather than trusted as a path.
fn tenant_dir_name(tenant: &str) -> Result<&str, String> {
    let name = if tenant.is_empty() { "default" } else { tenant };
    if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        Ok(name)
    } else {
        Err(format!("tenant {tenant:?}: not a valid tenant name"))
    }
}

/// Sets a directory's modification time to now.
fn touch(dir: &Path) {
    if let Err(e) = std::fs::File::open(dir).and_then(|f| f.set_modified(SystemTime::now())) {
        tracing::warn!("cannot mark {} finished: {e}", dir.display());
    }
}

/// When process `pid` started (field 22 of /proc/PID/stat), so that a
/// recycled pid is never mistaken for one of ours.
fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

struct Agent {
    config: AgentConfig,
    http: reqwest::Client,
    running: Mutex<HashMap<AttemptRef, Running>>,
    events: mpsc::UnboundedSender<AgentEvent>,
    /// Starts, checkpoints and exits not yet accepted by the server, in
    /// order: a registration carries them, so a server that restarted
    /// accounts them as they happened.
    unreported: Mutex<Vec<AgentEvent>>,
    /// Where attempts' cgroups go; none: process groups only.
    cgroups: Option<cgroup::Parents>,
    /// The start of this agent's cgroup names.
    group_prefix: String,
    /// The user the agent runs as.
    me: nix::unistd::Uid,
}

#[derive(Debug)]
enum CallError {
    /// The server answered 409: register again.
    Reregister(String),
    Other(String),
}

impl Agent {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.config.server.trim_end_matches('/'), path)
    }

    async fn call<T: for<'de> Deserialize<'de>>(&self, req: reqwest::RequestBuilder) -> Result<T, CallError> {
        let resp = req
            .bearer_auth(&self.config.join_token)
            .send()
            .await
            .map_err(|e| CallError::Other(e.to_string()))?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(|e| CallError::Other(e.to_string()));
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ebb_api::ErrorBody>(&body).map_or(body, |e| e.error);
        if status.as_u16() == 409 {
            Err(CallError::Reregister(message))
        } else {
            Err(CallError::Other(format!("{status}: {message}")))
        }
    }

    /// Queues an event for the server, remembering it until accepted
    /// unless it is output.
    fn send(&self, event: AgentEvent) {
        if !matches!(event, AgentEvent::Output { .. }) {
            self.unreported.lock().expect("unreported").push(event.clone());
        }
        let _ = self.events.send(event);
    }

    fn ledger_path(&self) -> PathBuf {
        self.config.data_dir.join("attempts.json")
    }

    fn write_ledger(&self, running: &HashMap<AttemptRef, Running>) {
        let ledger = Ledger {
            groups: running.iter().map(|(a, r)| (*a, r.pgid, r.started_ticks)).collect(),
            cgroups: running.iter().filter_map(|(a, r)| Some((*a, r.group.clone()?))).collect(),
        };
        let tmp = self.ledger_path().with_extension("tmp");
        let write = |bytes: Vec<u8>| {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file =
                std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            file.write_all(&bytes)
        };
        let written = serde_json::to_vec(&ledger)
            .map_err(std::io::Error::other)
            .and_then(write)
            .and_then(|()| std::fs::rename(&tmp, self.ledger_path()));
        if let Err(e) = written {
            tracing::error!("cannot record running attempts: {e}");
        }
    }

    /// Kills what a previous life of this agent left running.
    fn kill_leftovers(&self) {
        // Every cgroup of this agent's: recorded or not (it may have died
        // between making one and recording it), none is running now.
        let mut groups = self.cgroups.as_ref().map_or_else(Vec::new, |c| c.leftovers(&self.group_prefix));
        let ledger: Ledger = std::fs::read(self.ledger_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        for (_, group) in ledger.cgroups {
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        for group in groups {
            if group.populated() {
                tracing::warn!(cgroup = %group.v2.display(), "killing an attempt left by a previous agent");
            }
            group.kill();
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while group.populated() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            group.remove();
        }
        for (attempt, pgid, started) in ledger.groups {
            // Only if the group's leader is still the process we started.
            if process_start(pgid) != Some(started) {
                continue;
            }
            if killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok() {
                tracing::warn!(
                    job = attempt.job,
                    attempt = attempt.attempt,
                    pgid,
                    "killed an attempt left by a previous agent"
                );
            }
        }
        let _ = std::fs::remove_file(self.ledger_path());
    }

    async fn register(&self) -> Result<Registered, CallError> {
        let running: Vec<AttemptRef> = self.running.lock().expect("running").keys().copied().collect();
        let body = Register {
            node: self.config.name.clone(),
            gpu_model: self.config.gpu_model.clone(),
            gpus: self.config.gpus,
            labels: self.config.labels.clone(),
            running,
            address: Some(self.config.address.clone()),
            unreported: self.unreported.lock().expect("unreported").clone(),
        };
        self.call(self.http.post(self.url("/v1/agent/register")).json(&body)).await
    }

    /// Signals every process of the attempt: all of its cgroup, or its
    /// process group where there is no cgroup.
    fn signal(&self, attempt: AttemptRef, signal: Signal) {
        if let Some(r) = self.running.lock().expect("running").get(&attempt) {
            match &r.group {
                Some(group) => group.signal(signal),
                None => {
                    let _ = killpg(Pid::from_raw(r.pgid), signal);
                }
            }
        }
    }

    /// Ends an attempt that is not being drained (cancelled, or the rest of
    /// a gang): SIGTERM, as `scancel` does, then SIGKILL after `grace`.
    /// Kills attempts the server says must not run.
    fn kill_stale(&self, attempts: &[AttemptRef], why: &str) {
        for attempt in attempts {
            tracing::warn!(job = attempt.job, attempt = attempt.attempt, "{why}: killing it");
            self.signal(*attempt, Signal::SIGKILL);
        }
    }

    fn stop(self: &Arc<Self>, attempt: AttemptRef, grace: Duration) {
        self.signal(attempt, Signal::SIGTERM);
        let agent = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            agent.signal(attempt, Signal::SIGKILL);
        });
    }

    fn drain(self: &Arc<Self>, d: DrainAttempt) {
        let (signal, drain_file) = {
            let running = self.running.lock().expect("running");
            let Some(r) = running.get(&d.attempt) else { return };
            if r.notice.borrow().is_some() {
                return; // delivered already (a repeated command after a reconnect)
            }
            let notice = Notice::new(d.notice_at_ms, d.deadline_ms, d.reason.clone());
            // The file and the endpoint first, so that a job woken by the
            // signal finds the notice wherever it looks.
            let tmp = r.drain_file.with_extension("tmp");
            let body = serde_json::to_vec_pretty(&notice).expect("notice serialises");
            if let Err(e) = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, &r.drain_file)) {
                tracing::error!("cannot write the drain file {}: {e}", r.drain_file.display());
            }
            r.notice.send_replace(Some(notice));
            (Signal::try_from(r.signal).unwrap_or(Signal::SIGTERM), r.drain_file.clone())
        };
        tracing::info!(job = d.attempt.job, attempt = d.attempt.attempt, deadline = d.deadline_ms, file = %drain_file.display(), "drain notice");
        self.signal(d.attempt, signal);
        let agent = self.clone();
        let wait = Duration::from_millis(d.deadline_ms.saturating_sub(now_ms()));
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if agent.running.lock().expect("running").contains_key(&d.attempt) {
                tracing::warn!(job = d.attempt.job, attempt = d.attempt.attempt, "deadline reached: SIGKILL");
                agent.signal(d.attempt, Signal::SIGKILL);
            }
        });
    }

    async fn start(self: &Arc<Self>, s: StartAttempt) {
        let a = s.attempt;
        if self.running.lock().expect("running").contains_key(&a) {
            return; // a repeated command
        }
        match self.spawn(&s).await {
            Ok(()) => {}
            Err(message) => {
                tracing::error!(job = a.job, attempt = a.attempt, "{message}");
                self.send(AgentEvent::Output { attempt: a, data: format!("ebb: {message}\n") });
                let at_ms = now_ms();
                self.send(AgentEvent::Exited {
                    attempt: a,
                    code: Some(127),
                    signal: None,
                    completed: false,
                    at_ms,
                    peak_memory_bytes: None,
                });
            }
        }
    }

    async fn spawn(self: &Arc<Self>, s: &StartAttempt) -> Result<(), String> {
        let a = s.attempt;
        let who = identity::resolve(s.run_as.as_deref(), self.me, self.config.allow_root_jobs)?;
        // The attempt's own directories belong to its user, closed to others;
        // the tenant's checkpoint root too, so tenants cannot see each other's.
        let owned = |p: PathBuf| own_dir(&p, 0o700, Some(&who)).map(|()| p);
        let workdir = match &s.workdir {
            Some(w) => PathBuf::from(w),
            None => owned(self.config.data_dir.join("work").join(a.job.to_string()))?,
        };
        let tenant_root = owned(self.config.checkpoint_root.join(tenant_dir_name(&s.tenant)?))?;
        let checkpoint_dir = owned(tenant_root.join(a.job.to_string()))?;
        let run_dir = owned(self.config.data_dir.join("run").join(format!("{}-{}", a.job, a.attempt)))?;
        // Retention counts from the last use: a requeued job's old working
        // directory is in use again.
        for dir in std::iter::once(&run_dir).chain(s.workdir.is_none().then_some(&workdir)) {
            touch(dir);
        }
        let drain_file = run_dir.join("drain.json");
        let completion_file = run_dir.join("complete");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("metadata endpoint: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let group = match &self.cgroups {
            Some(parents) => Some(parents.create(&format!("{}{}-{}", self.group_prefix, a.job, a.attempt))?),
            None => None,
        };
        let join = match group.as_ref().map(cgroup::AttemptGroup::join_files).transpose() {
            Ok(join) => join,
            Err(e) => {
                group.iter().for_each(cgroup::AttemptGroup::remove);
                return Err(e);
            }
        };
        let metadata_url = format!("http://127.0.0.1:{port}");
        let (notice_tx, notice_rx) = watch::channel(None);
        tokio::spawn(metadata::serve(
            listener,
            a.job,
            a.attempt,
            self.config.name.clone(),
            notice_rx,
            self.events.clone(),
        ));

        let gpus: Vec<String> = s.gpus.iter().map(|g| g.to_string()).collect();
        let path = |p: &Path| p.display().to_string();
        let ebb = [
            ("CUDA_VISIBLE_DEVICES", gpus.join(",")),
            ("EBB_JOB_ID", a.job.to_string()),
            ("EBB_ATTEMPT", a.attempt.to_string()),
            ("EBB_TIER", s.tier.clone()),
            ("EBB_NODE", self.config.name.clone()),
            ("EBB_CHECKPOINT_DIR", path(&checkpoint_dir)),
            ("EBB_DRAIN_FILE", path(&drain_file)),
            ("EBB_COMPLETION_FILE", path(&completion_file)),
            ("EBB_DRAIN_SIGNAL", s.signal.to_string()),
            ("EBB_METADATA_URL", metadata_url.clone()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", format!("{metadata_url}/")),
            ("GCE_METADATA_HOST", format!("127.0.0.1:{port}")),
        ];
        let env = identity::job_env(&self.config.job_path, &who, &self.config.job_env, &s.env, &ebb);
        let workdir_c = {
            use std::os::unix::ffi::OsStrExt;
            std::ffi::CString::new(workdir.as_os_str().as_bytes())
                .map_err(|_| format!("workdir {}: contains a NUL byte", workdir.display()))?
        };
        let mut cmd = tokio::process::Command::new(&s.argv[0]);
        cmd.args(&s.argv[1..])
            .env_clear()
            .envs(&env)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child_who = who.clone();
        // SAFETY: between fork and exec the closure only writes to files
        // opened before the fork and makes plain system calls (setgroups,
        // setgid, setuid, chdir): no allocation, no lock.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(join) = &join {
                    join.join()?;
                }
                child_who.assume()?;
                // As the user: a directory the user cannot enter fails here.
                nix::unistd::chdir(workdir_c.as_c_str())?;
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                if let Some(group) = &group {
                    group.remove();
                }
                return Err(format!(
                    "cannot start {:?} as {} (uid {}) in {}: {e}",
                    s.argv[0],
                    who.user,
                    who.uid,
                    workdir.display()
                ));
            }
        };
        let pid = child.id().ok_or("the process exited before it could be tracked")? as i32;
        {
            let mut running = self.running.lock().expect("running");
            let started_ticks = process_start(pid).unwrap_or(0);
            running.insert(
                a,
                Running {
                    pgid: pid,
                    started_ticks,
                    signal: s.signal,
                    drain_file,
                    notice: notice_tx,
                    group: group.clone(),
                },
            );
            self.write_ledger(&running);
        }
        self.send(AgentEvent::Started { attempt: a, pid: pid as u32, at_ms: now_ms() });
        type Pipe = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
        let stdout = child.stdout.take().map(|p| Box::new(p) as Pipe);
        let stderr = child.stderr.take().map(|p| Box::new(p) as Pipe);
        let readers: Vec<_> = [stdout, stderr]
            .into_iter()
            .flatten()
            .map(|mut pipe| {
                let events = self.events.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = pipe.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let data = String::from_utf8_lossy(&buf[..n]).into_owned();
                        let _ = events.send(AgentEvent::Output { attempt: a, data });
                    }
                })
            })
            .collect();
        let agent = self.clone();
        let default_workdir = s.workdir.is_none().then_some(workdir);
        tokio::spawn(async move {
            let status = child.wait().await;
            // Whatever the main process left behind goes too; the attempt
            // ends when its cgroup is empty.
            match &group {
                Some(group) => {
                    group.kill();
                    group.emptied().await;
                }
                None => {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            // With the group empty every writer of the pipes is gone; a
            // process that escaped a process group may still hold them, so
            // the readers get a short, bounded wait, never the attempt's end.
            let until = tokio::time::Instant::now() + Duration::from_millis(500);
            for mut reader in readers {
                if tokio::time::timeout_at(until, &mut reader).await.is_err() {
                    reader.abort();
                }
            }
            let peak_memory_bytes = group.as_ref().and_then(cgroup::AttemptGroup::peak_memory);
            if let Some(group) = &group {
                group.remove();
            }
            use std::os::unix::process::ExitStatusExt;
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let completed = completion_file.exists();
            // The retention period counts from the end of the attempt.
            for dir in completion_file.parent().into_iter().chain(default_workdir.as_deref()) {
                touch(dir);
            }
            // The ledger is rewritten at the next start; until then a stale
            // entry is harmless (its start time no longer matches, its
            // cgroup is gone).
            agent.running.lock().expect("running").remove(&a);
            tracing::info!(job = a.job, attempt = a.attempt, ?code, ?signal, ?peak_memory_bytes, "exited");
            agent.send(AgentEvent::Exited {
                attempt: a,
                code,
                signal,
                completed,
                at_ms: now_ms(),
                peak_memory_bytes,
            });
        });
        Ok(())
    }

    /// Removes the run directories and default working directories of
    /// attempts that ended more than the retention period ago; never a
    /// checkpoint directory, never a running attempt's.
    fn sweep(&self) {
        let running: Vec<AttemptRef> = self.running.lock().expect("running").keys().copied().collect();
        let cutoff = SystemTime::now().checked_sub(self.config.attempt_retention).unwrap_or(UNIX_EPOCH);
        let run_names: Vec<String> = running.iter().map(|a| format!("{}-{}", a.job, a.attempt)).collect();
        let work_names: Vec<String> = running.iter().map(|a| a.job.to_string()).collect();
        for (parent, in_use) in [("run", run_names), ("work", work_names)] {
            let Ok(entries) = std::fs::read_dir(self.config.data_dir.join(parent)) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < cutoff);
                if old && !in_use.contains(&name) {
                    match std::fs::remove_dir_all(entry.path()) {
                        Ok(()) => {
                            tracing::info!(dir = %entry.path().display(), "removed a finished attempt's directory")
                        }
                        Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
                    }
                }
            }
        }
    }

    /// Sends events to the server in order, batching what has piled up, and
    /// retrying until they are accepted.
    async fn report_loop(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<AgentEvent>) {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while let Ok(next) = rx.try_recv() {
                match (batch.last_mut(), next) {
                    (
                        Some(AgentEvent::Output { attempt: last, data }),
                        AgentEvent::Output { attempt, data: more },
                    ) if *last == attempt && data.len() < (1 << 20) => data.push_str(&more),
                    (_, next) => batch.push(next),
                }
                if batch.len() >= 512 {
                    break;
                }
            }
            let report = ebb_api::Report { node: self.config.name.clone(), events: batch };
            let mut backoff = Duration::from_millis(50);
            loop {
                let req = self.http.post(self.url("/v1/agent/report")).json(&report);
                match self.call::<ebb_api::ReportReply>(req).await {
                    Ok(reply) => {
                        self.kill_stale(&reply.stale, "the server fenced this stale attempt");
                        // Reports go out in order, so the events this one
                        // carried are the oldest ones remembered.
                        let delivered =
                            report.events.iter().filter(|e| !matches!(e, AgentEvent::Output { .. })).count();
                        let mut unreported = self.unreported.lock().expect("unreported");
                        let delivered = delivered.min(unreported.len());
                        unreported.drain(..delivered);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("report not delivered, retrying: {e:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }

    /// Register, then follow the command stream; register again whenever
    /// the server says so (it restarted, or declared this node lost).
    async fn command_loop(self: Arc<Self>) {
        loop {
            let registered = match self.register().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("cannot register with {}: {e:?}", self.config.server);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
            };
            tracing::info!(node = self.config.name, gpus = self.config.gpus, "registered");
            self.kill_stale(&registered.kill, "the server no longer runs this attempt");
            let mut after = registered.next_seq;
            loop {
                let url = self.url(&format!(
                    "/v1/agent/commands?node={}&epoch={}&after={after}",
                    self.config.name, registered.epoch
                ));
                let poll_timeout =
                    Duration::from_millis(registered.heartbeat_interval_ms) + Duration::from_secs(10);
                match self.call::<ebb_api::Commands>(self.http.get(url).timeout(poll_timeout)).await {
                    Ok(commands) => {
                        // Starts run side by side; any other command waits for
                        // the starts before it, so it finds its attempt running.
                        let mut starting = tokio::task::JoinSet::new();
                        for command in commands.commands {
                            after = command.seq;
                            if !matches!(command.action, Action::Start(_)) {
                                while starting.join_next().await.is_some() {}
                            }
                            match command.action {
                                Action::Start(start) => {
                                    let agent = self.clone();
                                    starting.spawn(async move { agent.start(start).await });
                                }
                                Action::Drain(drain) => self.drain(drain),
                                Action::Stop { attempt, grace_ms } => {
                                    self.stop(attempt, Duration::from_millis(grace_ms))
                                }
                            }
                        }
                        while starting.join_next().await.is_some() {}
                    }
                    Err(CallError::Reregister(why)) => {
                        tracing::warn!("registering again: {why}");
                        break;
                    }
                    Err(CallError::Other(e)) => {
                        tracing::warn!("command poll failed: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    /// Stops every attempt: the job's signal, then SIGKILL after `grace`.
    async fn stop_all(self: &Arc<Self>, grace: Duration) {
        let attempts: Vec<AttemptRef> = self.running.lock().expect("running").keys().copied().collect();
        for a in &attempts {
            self.stop(*a, grace);
        }
        let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(1);
        while !self.running.lock().expect("running").is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM, then stops its attempts.
pub async fn run(mut config: AgentConfig) -> Result<(), String> {
    // Jobs run in their own directories: every path they are given is absolute.
    let absolute = |dir: &PathBuf, flag: &str| -> Result<PathBuf, String> {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::canonicalize(dir))
            .map_err(|e| format!("{flag} {}: {e}", dir.display()))
    };
    config.data_dir = absolute(&config.data_dir, "--data-dir")?;
    config.checkpoint_root = absolute(&config.checkpoint_root, "--checkpoint-root")?;
    // Jobs may pass through these to their own directories, and see no
    // other's: traversable, not listable.
    for dir in [
        config.data_dir.clone(),
        config.data_dir.join("work"),
        config.data_dir.join("run"),
        config.checkpoint_root.clone(),
    ] {
        own_dir(&dir, 0o711, None)?;
    }
    let me = nix::unistd::geteuid();
    let cgroups = match cgroup::Parents::probe() {
        Ok(parents) => {
            tracing::info!(
                cgroup = %parents.v2.display(),
                memory = ?parents.memory_v1,
                "each attempt runs in its own cgroup"
            );
            Some(parents)
        }
        Err(why) => {
            let warning = format!(
                "warning: no cgroups ({why}): attempts run in process groups, so a job's setsid child or \
                 daemon can escape cancel, the drain deadline and fencing, and no peak memory is reported"
            );
            tracing::warn!("{warning}");
            eprintln!("ebb agent: {warning}");
            None
        }
    };
    let group_prefix = format!(
        "ebb-{}-{}-",
        config
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .collect::<String>(),
        tag(&config.data_dir)
    );
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let (events, rx) = mpsc::unbounded_channel();
    let agent = Arc::new(Agent {
        config,
        http,
        running: Mutex::new(HashMap::new()),
        events,
        unreported: Mutex::new(Vec::new()),
        cgroups,
        group_prefix,
        me,
    });
    agent.kill_leftovers();
    let sweeper = agent.clone();
    tokio::spawn(async move {
        let every =
            (sweeper.config.attempt_retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(600));
        loop {
            sweeper.sweep();
            tokio::time::sleep(every).await;
        }
    });
    tokio::spawn(agent.clone().report_loop(rx));
    let commands = tokio::spawn(agent.clone().command_loop());
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    commands.abort();
    tracing::info!("stopping: ending running attempts");
    agent.stop_all(Duration::from_secs(3)).await;
    // Give the reporter a moment to deliver the exits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_name_never_leaves_the_checkpoint_root() {
        assert_eq!(tenant_dir_name("team-a_1"), Ok("team-a_1"));
        assert_eq!(tenant_dir_name(""), Ok("default"));
        for bad in ["..", "../etc", "a/b", "."] {
            assert!(tenant_dir_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn agents_with_different_data_directories_name_their_cgroups_apart() {
        assert_ne!(tag(Path::new("/var/lib/ebb/a")), tag(Path::new("/var/lib/ebb/b")));
        assert_eq!(tag(Path::new("/var/lib/ebb/a")), tag(Path::new("/var/lib/ebb/a")));
    }
}
