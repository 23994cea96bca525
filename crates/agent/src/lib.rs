//! `ebb agent`: one per node. Joins the server, runs each attempt as a real
//! process in its own process group, and delivers the drain: the job's
//! signal, the notice file, the attempt's metadata endpoint, SIGKILL at the
//! deadline. Everything it reports names the attempt, so the server can
//! fence stale ones.

pub mod gpus;
mod metadata;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
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
}

/// What survives an agent crash: the process groups it started, so that a
/// restarted agent can kill them instead of leaving stale attempts running.
#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    /// (attempt, process group, the leader's start time in clock ticks).
    groups: Vec<(AttemptRef, i32, u64)>,
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
    /// This node's own credential, once the server has issued it: every
    /// call but the first registration carries it instead of the join
    /// token.
    credential: Mutex<Option<String>>,
}

#[derive(Debug)]
enum CallError {
    /// The server answered 409: register again.
    Reregister(String),
    /// The server answered 401 to this node's credential: it was revoked
    /// (`ebb nodes remove`) or is unknown to the server.
    Unauthorized(String),
    Other(String),
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
        if status.as_u16() == 409 {
            Err(CallError::Reregister(message))
        } else if status.as_u16() == 401 && self.credential.lock().expect("credential").is_some() {
            Err(CallError::Unauthorized(message))
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
        let ledger = Ledger { groups: running.iter().map(|(a, r)| (*a, r.pgid, r.started_ticks)).collect() };
        let tmp = self.ledger_path().with_extension("tmp");
        let written = serde_json::to_vec(&ledger)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, self.ledger_path()));
        if let Err(e) = written {
            tracing::error!("cannot record running attempts: {e}");
        }
    }

    /// Kills what a previous life of this agent left running.
    fn kill_leftovers(&self) {
        let Ok(bytes) = std::fs::read(self.ledger_path()) else { return };
        let ledger: Ledger = serde_json::from_slice(&bytes).unwrap_or_default();
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

    fn signal(&self, attempt: AttemptRef, signal: Signal) {
        if let Some(r) = self.running.lock().expect("running").get(&attempt) {
            let _ = killpg(Pid::from_raw(r.pgid), signal);
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
                });
            }
        }
    }

    async fn spawn(self: &Arc<Self>, s: &StartAttempt) -> Result<(), String> {
        let a = s.attempt;
        let dir = |p: PathBuf| -> Result<PathBuf, String> {
            std::fs::create_dir_all(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
            Ok(p)
        };
        let workdir = match &s.workdir {
            Some(w) => PathBuf::from(w),
            None => dir(self.config.data_dir.join("work").join(a.job.to_string()))?,
        };
        let checkpoint_dir = dir(self.config.checkpoint_root.join(a.job.to_string()))?;
        let run_dir = dir(self.config.data_dir.join("run").join(format!("{}-{}", a.job, a.attempt)))?;
        let drain_file = run_dir.join("drain.json");
        let completion_file = run_dir.join("complete");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("metadata endpoint: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
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
        let mut cmd = tokio::process::Command::new(&s.argv[0]);
        cmd.args(&s.argv[1..])
            .envs(&s.env)
            .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
            .env("EBB_JOB_ID", a.job.to_string())
            .env("EBB_ATTEMPT", a.attempt.to_string())
            .env("EBB_TIER", &s.tier)
            .env("EBB_NODE", &self.config.name)
            .env("EBB_CHECKPOINT_DIR", &checkpoint_dir)
            .env("EBB_DRAIN_FILE", &drain_file)
            .env("EBB_COMPLETION_FILE", &completion_file)
            .env("EBB_DRAIN_SIGNAL", s.signal.to_string())
            .env("EBB_METADATA_URL", &metadata_url)
            .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", format!("{metadata_url}/"))
            .env("GCE_METADATA_HOST", format!("127.0.0.1:{port}"))
            .current_dir(&workdir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("cannot start {:?}: {e}", s.argv[0]))?;
        let pid = child.id().ok_or("the process exited before it could be tracked")? as i32;
        {
            let mut running = self.running.lock().expect("running");
            let started_ticks = process_start(pid).unwrap_or(0);
            running.insert(
                a,
                Running { pgid: pid, started_ticks, signal: s.signal, drain_file, notice: notice_tx },
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
        tokio::spawn(async move {
            let status = child.wait().await;
            // Whatever the main process left behind in its group goes too.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            for reader in readers {
                let _ = reader.await;
            }
            use std::os::unix::process::ExitStatusExt;
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let completed = completion_file.exists();
            // The ledger is rewritten at the next start; until then a stale
            // entry is harmless (its start time no longer matches).
            agent.running.lock().expect("running").remove(&a);
            tracing::info!(job = a.job, attempt = a.attempt, ?code, ?signal, "exited");
            agent.send(AgentEvent::Exited { attempt: a, code, signal, completed, at_ms: now_ms() });
        });
        Ok(())
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
                    Err(CallError::Unauthorized(why)) => {
                        self.credential_refused(&why);
                        tokio::time::sleep(REFUSED_RETRY).await;
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
        credential: Mutex::new(credential),
    });
    agent.kill_leftovers();
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
