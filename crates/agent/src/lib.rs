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
pub mod output;
mod report;
pub mod spawn;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ebb_api::{Action, AgentEvent, AttemptRef, DrainAttempt, Register, Registered, StartAttempt};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use crate::metadata::Notice;
use crate::output::Gate;
pub use crate::output::OutputLimits;

/// Whether the agent may remount the cgroup v2 hierarchy for faster starts.
fn agent_config_favors(config: &AgentConfig) -> bool {
    !config.keep_cgroup_mount && nix::unistd::geteuid().is_root()
}

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
    /// Leave the cgroup v2 mount as it is (no `favordynmods` remount).
    pub keep_cgroup_mount: bool,
    /// What of a job's output is passed on.
    pub output: OutputLimits,
    /// How long reports may keep failing before the node says, on its
    /// command poll, that it is unhealthy (it then gets no new work).
    pub unhealthy_after: Duration,
}

/// What a queued output event costs the agent's budget beyond its bytes:
/// a job writing a byte at a time must not fill memory with events.
const EVENT_COST: u64 = 64;

/// Reports failing in a row; what the command poll says while they do.
#[derive(Debug, Default)]
struct ReportHealth {
    failing_since: Option<Instant>,
    failures: u32,
    last_error: String,
}

impl ReportHealth {
    fn failed(&mut self, error: String, now: Instant) {
        self.failing_since.get_or_insert(now);
        self.failures += 1;
        self.last_error = error;
    }

    fn delivered(&mut self) {
        *self = ReportHealth::default();
    }

    /// Why the node is unhealthy: its reports have failed for `after` and
    /// at least three times in a row (one slow answer is not a failure).
    fn failing(&self, now: Instant, after: Duration) -> Option<String> {
        let since = self.failing_since?;
        let failing_for = now.saturating_duration_since(since);
        (self.failures >= 3 && failing_for >= after).then(|| {
            format!(
                "reports failing for {}s ({} tries): {}",
                failing_for.as_secs(),
                self.failures,
                self.last_error
            )
        })
    }
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
    /// When the leader started, in clock ticks: only where the ledger
    /// records process groups (no cgroups).
    started_ticks: Option<u64>,
    signal: i32,
    drain_file: PathBuf,
    notice: watch::Sender<Option<Notice>>,
    /// The attempt's cgroup; none where the agent cannot make cgroups.
    group: Option<cgroup::AttemptGroup>,
}

/// What survives an agent crash, so that a restarted agent can kill what
/// it left running instead of leaving stale attempts running: every cgroup
/// of its pool (written when the pool changes), or where there are no
/// cgroups, each attempt's process group (written at each start).
#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    /// (attempt, process group, the leader's start time in clock ticks).
    groups: Vec<(AttemptRef, i32, u64)>,
    #[serde(default)]
    cgroup_pool: Vec<cgroup::AttemptGroup>,
}

/// Creates `path` (and its parents) if missing, and gives it `mode` and,
/// on a root agent, the owner `who` (none: the agent's own), writing only what differs: a start
/// changes no metadata it need not. Returns whether it was created.
///
/// The directory is opened without following a symbolic link and changed
/// through that descriptor: a job that plants a link where one of its
/// directories will be (its tenant's checkpoint root is its own) gets an
/// error, never the root agent handing the link's target to its user.
fn own_dir(path: &Path, mode: u32, who: Option<&identity::Identity>) -> Result<bool, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let fail = |e: std::io::Error| format!("cannot prepare {}: {e}", path.display());
    let create = || std::fs::DirBuilder::new().mode(mode).create(path);
    let created = match create() {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.parent().unwrap_or(path);
            std::fs::create_dir_all(parent).and_then(|()| create()).map_err(fail)?;
            true
        }
        Err(e) => return Err(fail(e)),
    };
    // The agent's own directories are where the operator says, links or not.
    let no_follow = if who.is_some() { libc::O_NOFOLLOW } else { 0 };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | no_follow)
        .open(path)
        .map_err(|e| match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            format!("cannot prepare {}: it is a symbolic link, which is refused", path.display())
        }
        _ => fail(e),
    })?;
    let meta = dir.metadata().map_err(fail)?;
    if let Some(who) = who.filter(|w| w.switch) {
        if (meta.uid(), meta.gid()) != (who.uid.as_raw(), who.gid.as_raw()) {
            std::os::unix::fs::fchown(&dir, Some(who.uid.as_raw()), Some(who.gid.as_raw())).map_err(fail)?;
        }
    }
    if meta.mode() & 0o7777 != mode {
        dir.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(fail)?;
    }
    Ok(created)
}

/// Writes `body` to `path` in a directory the job owns, atomically (a
/// temporary file, then a rename), through no link the job may have put
/// there: a fresh file replaces whatever has the temporary name.
fn write_job_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // create_new (O_EXCL) follows no link, dangling or not.
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
    file.write_all(body)?;
    std::fs::rename(&tmp, path)
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
    /// Where attempts' cgroups come from; none: process groups only.
    cgroups: Option<Arc<cgroup::Pool>>,
    /// The start of this agent's cgroup names.
    group_prefix: String,
    /// The user the agent runs as.
    me: nix::unistd::Uid,
    /// Output queued for the server, in bytes plus [`EVENT_COST`] per
    /// event; bounded by `config.output.buffer`.
    queued_output: Arc<AtomicU64>,
    health: Mutex<ReportHealth>,
    /// This node's own credential, once the server has issued it: every
    /// call but the first registration carries it instead of the join
    /// token.
    credential: Mutex<Option<String>>,
}

#[derive(Debug)]
enum CallError {
    /// The server answered 409: register again.
    Reregister(String),
    /// The server refused the request as it is (400, 413, 422, ...):
    /// sending it again would be refused again.
    Refused(String),
    /// The server answered 401 to this node's credential: it was revoked
    /// (`ebb nodes remove`) or is unknown to the server.
    Unauthorized(String),
    Other(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Reregister(e)
            | CallError::Refused(e)
            | CallError::Unauthorized(e)
            | CallError::Other(e) => f.write_str(e),
        }
    }
}

/// Where the node's credential is kept, in the agent's data dir (0600).
fn credential_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("node.credential")
}

/// Writes the credential atomically, readable by the agent's user alone.
fn write_credential(path: &std::path::Path, credential: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(credential.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// How long to wait before trying again with a refused credential: the
/// operator has to act, so there is no point in asking often.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

impl Agent {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.config.server.trim_end_matches('/'), path)
    }

    /// The node's credential, or the join token before it has one.
    fn bearer(&self) -> String {
        let credential = self.credential.lock().expect("credential");
        credential.clone().unwrap_or_else(|| self.config.join_token.clone())
    }

    async fn call<T: for<'de> Deserialize<'de>>(&self, req: reqwest::RequestBuilder) -> Result<T, CallError> {
        let resp =
            req.bearer_auth(self.bearer()).send().await.map_err(|e| CallError::Other(e.to_string()))?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(|e| CallError::Other(e.to_string()));
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ebb_api::ErrorBody>(&body).map_or(body, |e| e.error);
        match status.as_u16() {
            409 => Err(CallError::Reregister(message)),
            401 if self.credential.lock().expect("credential").is_some() => {
                Err(CallError::Unauthorized(message))
            }
            // Credentials may be fixed by the operator; the request itself
            // was not at fault.
            401 | 403 => Err(CallError::Other(format!("{status}: {message}"))),
            400..=499 => Err(CallError::Refused(format!("{status}: {message}"))),
            _ => Err(CallError::Other(format!("{status}: {message}"))),
        }
    }

    /// Queues an event for the server, remembering it until accepted
    /// unless it is output (whose bytes count against the budget instead).
    fn send(&self, event: AgentEvent) {
        send_event(&self.events, &self.queued_output, &self.unreported, event);
    }

    fn ledger_path(&self) -> PathBuf {
        self.config.data_dir.join("attempts.json")
    }

    fn write_ledger(&self, running: &HashMap<AttemptRef, Running>) {
        let ledger = match &self.cgroups {
            Some(pool) => Ledger { groups: Vec::new(), cgroup_pool: pool.all() },
            None => Ledger {
                groups: running.iter().filter_map(|(a, r)| Some((*a, r.pgid, r.started_ticks?))).collect(),
                cgroup_pool: Vec::new(),
            },
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
        let mut groups =
            self.cgroups.as_ref().map_or_else(Vec::new, |c| c.parents().leftovers(&self.group_prefix));
        let ledger: Ledger = std::fs::read(self.ledger_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        for group in ledger.cgroup_pool {
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
        let registered: Registered =
            self.call(self.http.post(self.url("/v1/agent/register")).json(&body)).await?;
        if let Some(credential) = &registered.credential {
            // Kept before it is used: a node whose credential is lost
            // cannot rejoin without the operator.
            let path = credential_path(&self.config.data_dir);
            write_credential(&path, credential).map_err(|e| {
                CallError::Other(format!("cannot keep the node credential in {}: {e}", path.display()))
            })?;
            tracing::info!(path = %path.display(), "node credential issued by the server and kept (0600)");
            *self.credential.lock().expect("credential") = Some(credential.clone());
        }
        Ok(registered)
    }

    /// The server refused this node's credential: it was revoked, so the
    /// server no longer holds anything this agent runs. Says what the
    /// operator must do, and stops the attempts (they were requeued
    /// elsewhere).
    fn credential_refused(&self, why: &str) {
        let path = credential_path(&self.config.data_dir);
        tracing::error!(
            "the server refused node {}'s credential: {why}. This agent cannot take part until the operator \
             acts: to rejoin, delete {} and restart the agent, which then registers with the join token \
             (after `ebb nodes remove {}` if the server still holds a credential for it). Retrying every {}s",
            self.config.name,
            path.display(),
            self.config.name,
            REFUSED_RETRY.as_secs(),
        );
        let running: Vec<AttemptRef> = self.running.lock().expect("running").keys().copied().collect();
        self.kill_stale(&running, "the node's credential was revoked and its attempts requeued");
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
            let body = serde_json::to_vec_pretty(&notice).expect("notice serialises");
            if let Err(e) = write_job_file(&r.drain_file, &body) {
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
        // Retention counts from the last use: a requeued job's old working
        // directory is in use again (a new one is new enough).
        let owned = |p: PathBuf, in_use: bool| {
            let created = own_dir(&p, 0o700, Some(&who))?;
            if in_use && !created {
                touch(&p);
            }
            Ok::<_, String>(p)
        };
        let workdir = match &s.workdir {
            Some(w) => PathBuf::from(w),
            None => owned(self.config.data_dir.join("work").join(a.job.to_string()), true)?,
        };
        let tenant_root = owned(self.config.checkpoint_root.join(tenant_dir_name(&s.tenant)?), false)?;
        let checkpoint_dir = owned(tenant_root.join(a.job.to_string()), false)?;
        let run_dir = owned(self.config.data_dir.join("run").join(format!("{}-{}", a.job, a.attempt)), true)?;
        let drain_file = run_dir.join("drain.json");
        let completion_file = run_dir.join("complete");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("metadata endpoint: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let (group, join_files, peak) = match self.cgroups.as_ref().map(|pool| pool.take()).transpose()? {
            Some(cgroup::Ready { group, join, peak }) => (Some(group), Some(join), peak),
            None => (None, None, cgroup::Peak::None),
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
        let join = join_files.as_ref().map_or_else(Vec::new, cgroup::JoinFiles::fds);
        let request = spawn::Request { argv: &s.argv, env: &env, cwd: &workdir, who: &who, join: &join };
        let child = match spawn::spawn(&request) {
            Ok(child) => child,
            Err(e) => {
                if let (Some(pool), Some(group)) = (&self.cgroups, group) {
                    pool.recycle(group);
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
        let pid = child.pid;
        {
            let mut running = self.running.lock().expect("running");
            let started_ticks = if self.cgroups.is_none() { process_start(pid) } else { None };
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
            if self.cgroups.as_ref().is_none_or(|pool| pool.changed()) {
                self.write_ledger(&running);
            }
        }
        self.send(AgentEvent::Started { attempt: a, pid: pid as u32, at_ms: now_ms() });
        // A pipe tokio cannot watch is dropped: the job's writes to it fail
        // (EPIPE), and the log says why.
        let pipes = [child.stdout, child.stderr].map(|fd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).inspect_err(|e| {
                tracing::error!(job = a.job, attempt = a.attempt, "cannot read the job's output: {e}")
            })
        });
        // Both pipes share the attempt's limits; every byte is read, so the
        // job never blocks on a full pipe, and what is over them is dropped.
        let gate = Arc::new(Mutex::new(Gate::new(self.config.output, Instant::now())));
        let readers: Vec<_> = pipes
            .into_iter()
            .flatten()
            .map(|mut pipe| {
                let agent = self.clone();
                let gate = gate.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = pipe.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        agent.forward_output(a, &gate, &buf[..n]);
                    }
                })
            })
            .collect();
        let agent = self.clone();
        let default_workdir = s.workdir.is_none().then_some(workdir);
        tokio::spawn(async move {
            let status = spawn::wait(pid).await;
            // Whatever the main process left behind goes too; the attempt
            // ends when its cgroup is empty.
            match &group {
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
            // With the group empty every writer of the pipes is gone; a
            // process that escaped a process group may still hold them, so
            // the readers get a short, bounded wait, never the attempt's end.
            let until = tokio::time::Instant::now() + Duration::from_millis(500);
            for mut reader in readers {
                if tokio::time::timeout_at(until, &mut reader).await.is_err() {
                    reader.abort();
                }
            }
            let peak_memory_bytes = peak.read();
            let summary = gate.lock().expect("gate").summary();
            if let Some(line) = summary {
                agent.send(AgentEvent::Output { attempt: a, data: line });
            }
            let (code, signal) = match status {
                Ok(ended) => (ended.code, ended.signal),
                Err(e) => {
                    tracing::error!(job = a.job, attempt = a.attempt, "cannot wait for pid {pid}: {e}");
                    (None, None)
                }
            };
            let completed = completion_file.exists();
            // The retention period counts from the end of the attempt.
            for dir in completion_file.parent().into_iter().chain(default_workdir.as_deref()) {
                touch(dir);
            }
            // Without cgroups, the ledger is rewritten at the next start;
            // until then a stale entry is harmless (its start time no
            // longer matches).
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
            // After the exit is on its way: a waiting preemptor need not
            // wait for the group to be put back.
            if let (Some(pool), Some(group)) = (agent.cgroups.clone(), group) {
                let _ = tokio::task::spawn_blocking(move || pool.recycle(group)).await;
                if agent.cgroups.as_ref().is_some_and(|pool| pool.changed()) {
                    agent.write_ledger(&agent.running.lock().expect("running"));
                }
            }
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

    /// Passes on what the gate lets through of `data`, read from attempt
    /// `a`, and the gate's marker if it has one.
    fn forward_output(&self, a: AttemptRef, gate: &Mutex<Gate>, data: &[u8]) {
        let queued = self.queued_output.load(Ordering::Relaxed);
        let free = self.config.output.buffer.saturating_sub(queued);
        // Under the lock: stdout and stderr's markers stay in order.
        let mut gate = gate.lock().expect("gate");
        let verdict = gate.admit(data, Instant::now(), free.saturating_sub(EVENT_COST));
        if verdict.keep > 0 {
            let data = String::from_utf8_lossy(&data[..verdict.keep]).into_owned();
            self.send(AgentEvent::Output { attempt: a, data });
        }
        if let Some(marker) = verdict.marker {
            self.send(AgentEvent::Output { attempt: a, data: marker });
        }
    }

    /// Sends events to the server in order, in reports sized under the
    /// server's limit, retrying until each is accepted.
    async fn report_loop(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<AgentEvent>) {
        while let Some(first) = rx.recv().await {
            // What has piled up, to a few reports' worth at a time.
            let mut events = vec![first];
            let mut weight = report::encoded_len(&events[0]);
            while weight < 4 * ebb_api::MAX_REPORT_BYTES {
                let Ok(next) = rx.try_recv() else { break };
                weight += report::encoded_len(&next);
                events.push(next);
            }
            let cost: u64 = events.iter().map(output_cost).sum();
            for batch in report::pack(&self.config.name, events, ebb_api::MAX_REPORT_BYTES) {
                self.deliver(batch).await;
            }
            self.queued_output.fetch_sub(cost, Ordering::Relaxed);
        }
    }

    /// Delivers one report, retrying with back-off while the server cannot
    /// be reached or fails. A report it refuses as it is (too large, or
    /// malformed) would be refused for ever: its output is dropped, with a
    /// marker in each attempt's log, then the markers too if need be; the
    /// starts, checkpoints and exits are always delivered.
    async fn deliver(&self, mut events: Vec<AgentEvent>) {
        let mut backoff = Duration::from_millis(50);
        let mut refusals = 0;
        loop {
            let report = ebb_api::Report { node: self.config.name.clone(), events };
            let req = self.http.post(self.url("/v1/agent/report")).json(&report);
            let result = self.call::<ebb_api::ReportReply>(req).await;
            events = report.events;
            match result {
                Ok(reply) => {
                    self.health.lock().expect("health").delivered();
                    self.kill_stale(&reply.stale, "the server fenced this stale attempt");
                    // Reports go out in order, so the events this one
                    // carried are the oldest ones remembered.
                    let delivered = events.iter().filter(|e| !matches!(e, AgentEvent::Output { .. })).count();
                    let mut unreported = self.unreported.lock().expect("unreported");
                    let delivered = delivered.min(unreported.len());
                    unreported.drain(..delivered);
                    return;
                }
                Err(CallError::Refused(e)) if refusals < 2 && events.iter().any(is_output) => {
                    tracing::error!("the server refused a report ({e}): dropping its output");
                    self.health.lock().expect("health").failed(e.clone(), Instant::now());
                    events = if refusals == 0 {
                        drop_output(events, &e)
                    } else {
                        events.into_iter().filter(|e| !is_output(e)).collect()
                    };
                    refusals += 1;
                }
                Err(e) => {
                    tracing::warn!("report not delivered, retrying: {e}");
                    self.health.lock().expect("health").failed(e.to_string(), Instant::now());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Register, then follow the command stream; register again whenever
    /// the server says so (it restarted, or declared this node lost).
    async fn command_loop(self: Arc<Self>) {
        let mut pending = HashMap::new();
        loop {
            let registered = match self.register().await {
                Ok(r) => r,
                Err(CallError::Unauthorized(why)) => {
                    self.credential_refused(&why);
                    tokio::time::sleep(REFUSED_RETRY).await;
                    continue;
                }
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
                let mut req = self.http.get(url).timeout(poll_timeout);
                // The poll is the heartbeat: it says when reports keep failing.
                let failing =
                    self.health.lock().expect("health").failing(Instant::now(), self.config.unhealthy_after);
                if let Some(why) = failing {
                    tracing::warn!("telling the server this node is unhealthy: {why}");
                    req = req.query(&[("failing", why)]);
                }
                match self.call::<ebb_api::Commands>(req).await {
                    Ok(commands) => {
                        // A start never holds up the next poll.
                        for command in commands.commands {
                            after = command.seq;
                            self.execute(command.action, &mut pending);
                        }
                    }
                    Err(CallError::Reregister(why)) => {
                        tracing::warn!("registering again: {why}");
                        break;
                    }
                    Err(CallError::Unauthorized(why)) => {
                        self.credential_refused(&why);
                        tokio::time::sleep(REFUSED_RETRY).await;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("command poll failed: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    /// Carries out a command of the server's without waiting for it: starts
    /// run side by side, and a command for an attempt whose earlier command
    /// is still under way (its start, above all) runs after it, so that a
    /// drain finds its attempt running. `pending` holds the commands under
    /// way, by attempt.
    fn execute(
        self: &Arc<Self>,
        action: Action,
        pending: &mut HashMap<AttemptRef, tokio::task::JoinHandle<()>>,
    ) {
        pending.retain(|_, task| !task.is_finished());
        let attempt = match &action {
            Action::Start(start) => start.attempt,
            Action::Drain(drain) => drain.attempt,
            Action::Stop { attempt, .. } => *attempt,
        };
        let before = match (pending.remove(&attempt), action) {
            // The common case: at once.
            (None, Action::Drain(drain)) => return self.drain(drain),
            (None, Action::Stop { attempt, grace_ms }) => {
                return self.stop(attempt, Duration::from_millis(grace_ms))
            }
            (before, action) => (before, action),
        };
        let agent = self.clone();
        let task = tokio::spawn(async move {
            let (before, action) = before;
            if let Some(before) = before {
                let _ = before.await;
            }
            match action {
                Action::Start(start) => agent.start(start).await,
                Action::Drain(drain) => agent.drain(drain),
                Action::Stop { attempt, grace_ms } => agent.stop(attempt, Duration::from_millis(grace_ms)),
            }
        });
        pending.insert(attempt, task);
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

fn is_output(event: &AgentEvent) -> bool {
    matches!(event, AgentEvent::Output { .. })
}

/// What an event costs the budget for unsent output.
fn output_cost(event: &AgentEvent) -> u64 {
    match event {
        AgentEvent::Output { data, .. } => data.len() as u64 + EVENT_COST,
        _ => 0,
    }
}

/// Queues `event`: output counts against the budget for unsent output,
/// anything else is remembered until the server accepts it.
fn send_event(
    events: &mpsc::UnboundedSender<AgentEvent>,
    queued_output: &AtomicU64,
    unreported: &Mutex<Vec<AgentEvent>>,
    event: AgentEvent,
) {
    if is_output(&event) {
        queued_output.fetch_add(output_cost(&event), Ordering::Relaxed);
    } else {
        unreported.lock().expect("unreported").push(event.clone());
    }
    let _ = events.send(event);
}

/// `events` with each attempt's output replaced by one marker saying how
/// much was dropped and why.
fn drop_output(events: Vec<AgentEvent>, why: &str) -> Vec<AgentEvent> {
    let mut kept = Vec::new();
    let mut dropped: Vec<(AttemptRef, usize)> = Vec::new();
    for event in events {
        match event {
            AgentEvent::Output { attempt, data } => match dropped.iter_mut().find(|(a, _)| *a == attempt) {
                Some((_, n)) => *n += data.len(),
                None => dropped.push((attempt, data.len())),
            },
            other => kept.push(other),
        }
    }
    let markers = dropped.into_iter().map(|(attempt, n)| AgentEvent::Output {
        attempt,
        data: format!("\n[ebb: {n} bytes of output dropped: the server refused them ({why})]\n"),
    });
    markers.chain(kept).collect()
}

/// The credential a previous life of this agent was issued, if any: with
/// it the node rejoins as itself; without it, with the join token.
fn load_credential(data_dir: &std::path::Path) -> Result<Option<String>, String> {
    let path = credential_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            tracing::info!(path = %path.display(), "registering with the node credential kept here");
            Ok(Some(text.trim().to_string()))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
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
    let probed = if std::env::var_os("EBB_X_NOCG").is_some() {
        Err("x".to_string())
    } else {
        cgroup::Parents::probe()
    };
    let cgroups = match probed {
        Ok(mut parents) => {
            if std::env::var_os("EBB_X_NOV1").is_some() {
                parents.memory_v1 = None;
            }
            if agent_config_favors(&config) {
                match std::fs::read_to_string("/proc/self/mountinfo")
                    .map_err(|e| e.to_string())
                    .and_then(|m| cgroup::favor_dynamic_changes(&m))
                {
                    Ok(true) => tracing::info!(
                        "cgroup v2 remounted with favordynmods: a process joins its attempt's group without \
                         waiting for an RCU grace period"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        "{e}: each attempt may wait ~10 ms more to start (ebb agent --keep-cgroup-mount to not try)"
                    ),
                }
            }
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
    // Idle groups for as many attempts as the node can start at once.
    let cgroups = cgroups.map(|parents| {
        Arc::new(cgroup::Pool::new(parents, &group_prefix, usize::from(config.gpus).clamp(2, 64)))
    });
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let (events, rx) = mpsc::unbounded_channel();
    let credential = load_credential(&config.data_dir)?;
    let agent = Arc::new(Agent {
        config,
        http,
        running: Mutex::new(HashMap::new()),
        events,
        unreported: Mutex::new(Vec::new()),
        cgroups,
        group_prefix,
        me,
        queued_output: Arc::new(AtomicU64::new(0)),
        health: Mutex::new(ReportHealth::default()),
        credential: Mutex::new(credential),
    });
    agent.kill_leftovers();
    if let Some(pool) = agent.cgroups.clone() {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            pool.fill();
            if pool.changed() {
                agent.write_ledger(&agent.running.lock().expect("running"));
            }
        });
    }
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
    if let Some(pool) = &agent.cgroups {
        pool.clear();
    }
    // Give the reporter a moment to deliver the exits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use axum::extract::{Query, State};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};

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

    /// A server whose reports fail while `broken`, refuses output with 413
    /// while `refuse_output`, and records what the agent says.
    #[derive(Default)]
    struct Fake {
        broken: AtomicBool,
        refuse_output: AtomicBool,
        /// The `failing` parameter of each poll, in order.
        polls: Mutex<Vec<Option<String>>>,
        delivered: Mutex<Vec<AgentEvent>>,
    }

    async fn register(Json(_): Json<ebb_api::Register>) -> Json<Registered> {
        Json(Registered {
            heartbeat_interval_ms: 50,
            kill: Vec::new(),
            next_seq: 0,
            epoch: 1,
            credential: None,
        })
    }

    async fn commands(
        State(fake): State<Arc<Fake>>,
        Query(q): Query<HashMap<String, String>>,
    ) -> Json<ebb_api::Commands> {
        fake.polls.lock().unwrap().push(q.get("failing").cloned());
        tokio::time::sleep(Duration::from_millis(20)).await;
        Json(ebb_api::Commands { commands: Vec::new(), next_seq: 1 })
    }

    async fn report(
        State(fake): State<Arc<Fake>>,
        Json(r): Json<ebb_api::Report>,
    ) -> Result<Json<ebb_api::ReportReply>, StatusCode> {
        if fake.broken.load(Ordering::SeqCst) {
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
        if fake.refuse_output.load(Ordering::SeqCst) && r.events.iter().any(is_output) {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        fake.delivered.lock().unwrap().extend(r.events);
        Ok(Json(ebb_api::ReportReply { stale: Vec::new() }))
    }

    /// An agent following a fake server.
    async fn start(fake: Arc<Fake>) -> Arc<Agent> {
        let app = Router::new()
            .route("/v1/agent/register", post(register))
            .route("/v1/agent/commands", get(commands))
            .route("/v1/agent/report", post(report))
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = std::env::temp_dir().join(format!("ebb-agent-test-{}-{}", std::process::id(), now_ms()));
        let config = AgentConfig {
            server,
            join_token: "t".into(),
            name: "node-1".into(),
            gpus: 1,
            gpu_model: "H100".into(),
            labels: BTreeMap::new(),
            data_dir: dir.clone(),
            checkpoint_root: dir,
            address: "127.0.0.1".into(),
            output: OutputLimits::default(),
            unhealthy_after: Duration::from_millis(300),
            job_path: identity::DEFAULT_PATH.into(),
            job_env: BTreeMap::new(),
            allow_root_jobs: false,
            attempt_retention: Duration::from_secs(3600),
            keep_cgroup_mount: true,
        };
        let (events, rx) = mpsc::unbounded_channel();
        let agent = Arc::new(Agent {
            config,
            http: reqwest::Client::new(),
            running: Mutex::new(HashMap::new()),
            events,
            unreported: Mutex::new(Vec::new()),
            queued_output: Arc::new(AtomicU64::new(0)),
            health: Mutex::new(ReportHealth::default()),
            cgroups: None,
            group_prefix: "ebb-test-".into(),
            me: nix::unistd::geteuid(),
            credential: Mutex::new(None),
        });
        tokio::spawn(agent.clone().report_loop(rx));
        tokio::spawn(agent.clone().command_loop());
        agent
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    const A: AttemptRef = AttemptRef { job: 1, attempt: 1 };

    #[tokio::test]
    async fn failing_reports_make_the_poll_say_unhealthy_until_they_get_through() {
        let fake = Arc::new(Fake::default());
        fake.broken.store(true, Ordering::SeqCst);
        let agent = start(fake.clone()).await;
        agent.send(AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 });
        until("a poll says unhealthy", || fake.polls.lock().unwrap().iter().any(Option::is_some)).await;
        let why = fake.polls.lock().unwrap().iter().flatten().next().cloned().unwrap();
        assert!(why.contains("reports failing for") && why.contains("503"), "{why}");

        fake.broken.store(false, Ordering::SeqCst);
        until("the start is delivered", || !fake.delivered.lock().unwrap().is_empty()).await;
        let seen = fake.polls.lock().unwrap().len();
        until("a poll says healthy", || fake.polls.lock().unwrap()[seen..].iter().any(Option::is_none)).await;
        assert!(agent.unreported.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_refused_report_drops_its_output_but_never_the_exit() {
        let fake = Arc::new(Fake::default());
        fake.refuse_output.store(true, Ordering::SeqCst);
        let agent = start(fake.clone()).await;
        agent.send(AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 });
        agent.send(AgentEvent::Output { attempt: A, data: "refused\n".into() });
        agent.send(AgentEvent::Exited {
            attempt: A,
            code: Some(0),
            signal: None,
            completed: true,
            at_ms: 2,
            peak_memory_bytes: None,
        });
        let exited = |e: &AgentEvent| matches!(e, AgentEvent::Exited { .. });
        until("the exit is delivered", || fake.delivered.lock().unwrap().iter().any(exited)).await;
        assert!(!fake.delivered.lock().unwrap().iter().any(is_output));
        until("nothing is left unreported", || agent.unreported.lock().unwrap().is_empty()).await;
        until("the output's budget is back", || agent.queued_output.load(Ordering::SeqCst) == 0).await;

        // With output accepted again, the marker says what was dropped.
        fake.refuse_output.store(false, Ordering::SeqCst);
        let events =
            drop_output(vec![AgentEvent::Output { attempt: A, data: "xyz".into() }], "413 Payload Too Large");
        assert_eq!(
            events,
            vec![AgentEvent::Output {
                attempt: A,
                data: "\n[ebb: 3 bytes of output dropped: the server refused them (413 Payload Too Large)]\n"
                    .into()
            }]
        );
    }

    #[test]
    fn health_needs_repeated_failures_over_time_and_one_delivery_restores_it() {
        let t = Instant::now();
        let after = Duration::from_secs(10);
        let mut h = ReportHealth::default();
        h.failed("503".into(), t);
        assert_eq!(h.failing(t + Duration::from_secs(60), after), None, "one failure is not a pattern");
        h.failed("503".into(), t + Duration::from_secs(1));
        h.failed("connection refused".into(), t + Duration::from_secs(2));
        assert_eq!(h.failing(t + Duration::from_secs(9), after), None, "not for long enough yet");
        let why = h.failing(t + Duration::from_secs(10), after).unwrap();
        assert_eq!(why, "reports failing for 10s (3 tries): connection refused");
        h.delivered();
        assert_eq!(h.failing(t + Duration::from_secs(60), after), None);
    }
}
