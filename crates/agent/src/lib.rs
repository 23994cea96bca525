//! `ebb agent`: one per node. Joins the server, runs each attempt as a real
//! process in its own cgroup (see `cgroup`; a process group where the
//! agent cannot make cgroups), as the Unix user its tenant is mapped to,
//! with an environment built for it (see `identity`), and delivers the
//! drain: the job's signal, the notice file, the attempt's metadata
//! endpoint, SIGKILL at the deadline. Everything it reports names the
//! attempt, so the server can fence stale ones.
//!
//! The parts, by responsibility: `client` (calls to the server), `retry`
//! (jittered waits between tries), `commands` (the command loop),
//! `supervisor` (attempts' processes, behind a trait), `drain` (drains,
//! stops, kills), `output` and `report` (what reaches the server),
//! `ledger` (what a crash leaves to kill), `dirs` (jobs' directories).
//! `fleet` and `simulated` are `--simulate-nodes N`: N nodes in one
//! process, speaking the protocol as this agent does, whose attempts are
//! tasks rather than processes. This file only wires them together.

pub mod cgroup;
mod checkpoints;
mod client;
mod commands;
pub mod container;
pub mod devices;
mod dirs;
mod drain;
mod fleet;
pub mod gpus;
pub mod health;
mod host;
pub mod identity;
mod ledger;
mod metadata;
mod notice;
pub mod output;
mod report;
mod retry;
mod simulated;
pub mod slurm;
pub mod spawn;
mod supervisor;
#[cfg(test)]
mod testing;
pub mod tls;
mod views;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use container::{ImageConfig, PullLimits};
use std::sync::Arc;
use std::time::Duration;

use ebb_api::AgentEvent;

use crate::commands::{Agent, Node};
use crate::ledger::Ledger;
pub use crate::output::OutputLimits;
use crate::report::Reporter;
use crate::supervisor::{Processes, Supervisor};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The server's URL, or the control plane's servers comma-separated.
    pub server: String,
    pub join_token: String,
    /// The CA an `https://` server's certificate must chain to (`--ca`).
    pub ca: Option<PathBuf>,
    /// Or the fingerprint of the CA to fetch from the server and keep.
    pub ca_fingerprint: Option<tls::Fingerprint>,
    pub name: String,
    pub gpus: u8,
    /// Each GPU's device minor (`/dev/nvidiaN`), by index: NVML's, or
    /// the index itself for simulated GPUs.
    pub gpu_minors: Vec<u32>,
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
    /// The uids a root agent gives tenants the operator mapped to no user
    /// (`--tenant-uids`): the first plus the tenant's number.
    pub tenant_uids: std::ops::RangeInclusive<u32>,
    /// The most one checkpoint of a job may hold in the cluster's store
    /// (`--max-checkpoint-bytes`; 0: no limit).
    pub max_checkpoint_bytes: u64,
    /// Jobs in images: the runtime, the cache's budget, the registries.
    pub images: ImageConfig,
    /// The node's CDI spec for its GPUs (`nvidia-ctk cdi generate
    /// --format=json`), given to containers; none: containers get their
    /// GPUs' variables only.
    pub cdi_spec: Option<PathBuf>,
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
    /// This agent's credentials for the cluster's checkpoint store, if
    /// the server names an S3 one (`--checkpoint-store-credentials`, or
    /// the standard `AWS_*` variables).
    pub checkpoint_credentials: Option<ebb_checkpoints::Credentials>,
    /// How the node's health is read.
    pub health: health::HealthConfig,
    /// The GPUs are NVML's, not `--fake-gpus`.
    pub real_gpus: bool,
    /// At SIGTERM the node drains (preemptible work saves in its window)
    /// and the agent waits this long at most for its attempts to end
    /// before it ends what remains (requeued, not failed).
    pub stop_timeout: Duration,
}

/// Why the agent (or a simulated fleet) could not start or run: its
/// directories, its server's trust, its client, signals.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// One of the agent's directories (named by its flag) cannot be made.
    #[error("{flag} {}: {source}", path.display())]
    Directory { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Dir(#[from] dirs::DirError),
    /// The credential of the node's previous life cannot be read.
    #[error("{}: {source}", path.display())]
    Credential { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Trust(#[from] tls::TrustError),
    #[error("the HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("cannot wait for signals: {0}")]
    Signals(std::io::Error),
    /// A task of the agent's own panicked or was cancelled.
    #[error("a task of the agent's: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What the agent finds before it starts: its directories made absolute,
/// its cgroups, the credential of its previous life.
struct Found {
    config: AgentConfig,
    cgroups: Option<cgroup::Parents>,
    group_prefix: String,
    credential: Option<String>,
}

/// Runs the agent until SIGINT or SIGTERM, then stops its attempts.
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    private_files();
    let found = tokio::task::spawn_blocking(move || find(config)).await??;
    let Found { config, cgroups, group_prefix, credential } = found;
    // Before anything else talks to the server, and before any attempt is
    // started: an agent that cannot verify its server must not join it.
    let trust =
        tls::agent_trust(&config.server, config.ca.as_deref(), config.ca_fingerprint, &config.data_dir)
            .await?;
    let (reporter, queue) = Reporter::new(config.output.buffer);
    let ledger = Ledger::new(&config.data_dir);
    tokio::spawn(ledger.clone().write_on_change());
    // Idle groups for as many attempts as the node can start at once.
    let keep = usize::from(config.gpus).clamp(2, 64);
    let pool = cgroups.map(|parents| Arc::new(cgroup::Pool::new(parents, &group_prefix, keep)));
    let checkpoints = Arc::new(checkpoints::Checkpoints::new(config.checkpoint_credentials.clone()));
    let images = open_images(&config).await;
    // What an agent before this one showed its attempts' steps.
    let data_dir = config.data_dir.clone();
    blocking(move || views::remove_all(&data_dir)).await;
    let supervisor = Arc::new(Processes::new(
        supervisor_config(&config),
        pool,
        reporter.clone(),
        ledger,
        checkpoints.clone(),
        images,
    ));
    supervisor.fill_pool();
    tokio::spawn(supervisor.clone().sweep_every(config.attempt_retention));
    let client = Arc::new(
        client::Client::new(
            http_client(trust.as_ref())?,
            &config.server,
            &config.join_token,
            &config.data_dir,
            credential,
        )
        .trusting(trust),
    );
    supervisor.reach_server(client.clone());
    let fenced = supervisor.clone();
    tokio::spawn(reporter.clone().run(queue, client.clone(), config.name.clone(), move |stale| {
        drain::kill_stale(&*fenced, stale, "the server fenced this stale attempt")
    }));
    // Read before the node takes work: its first registration says what
    // is wrong with it.
    let health = health::Monitor::new(config.health.clone(), config.gpus, config.real_gpus);
    health.poll(&reporter).await;
    tokio::spawn(health.clone().run(reporter.clone()));
    let agent = Arc::new(Agent {
        node: node(&config),
        client,
        reporter,
        supervisor: supervisor.clone(),
        registrations: Default::default(),
        checkpoints: Some(checkpoints),
        health: Some(health),
    });
    let commands = tokio::spawn(agent.clone().follow());
    until_told_to_stop().await?;
    // The node drains: the server sends preemptible attempts their notice
    // (the command stream keeps running for it) and places nothing new
    // here; on-demand ones get the stop timeout to end on their own.
    let timeout = config.stop_timeout;
    tracing::info!(
        running = supervisor.running().len(),
        "stopping: the node drains; waiting up to {} for its attempts to end (SIGTERM or Ctrl-C again: now)",
        humantime::format_duration(timeout)
    );
    agent.reporter.send(AgentEvent::Stopping {
        stop_timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        at_ms: report::now_ms(),
    });
    tokio::select! {
        _ = until_idle(&*supervisor, timeout) => {}
        _ = until_told_to_stop() => tracing::info!("told again: ending the attempts now"),
    }
    commands.abort();
    // Nothing starts from here on: starts held back for their GPUs go.
    for attempt in supervisor.waiting() {
        supervisor.withdraw(attempt);
    }
    if !supervisor.running().is_empty() {
        tracing::info!(running = supervisor.running().len(), "stopping: ending what still runs");
    }
    drain::stop_all(&supervisor, Duration::from_secs(3)).await;
    supervisor.clear_pool().await;
    // Give the reporter a moment to deliver the exits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// Runs `nodes` simulated nodes (see `fleet`) until SIGINT or SIGTERM,
/// then stops their attempts. `config.name` names the fleet, each node's
/// data directory is under `config.data_dir`; what concerns processes
/// (checkpoint root, jobs' PATH and environment, cgroups, retention) is
/// not used. `files` is the open-file limit the fleet's connections stay
/// within.
pub async fn simulate(config: AgentConfig, nodes: u32, files: u64) -> Result<(), AgentError> {
    private_files();
    fleet::run(config, nodes, files).await
}

/// What the agent makes is its own unless it says otherwise (a root
/// agent's files in a shared checkpoint store were 0644): umask 0077.
/// Directories jobs pass through and files they read are given their
/// modes explicitly; a job's process starts with [`spawn::JOB_UMASK`].
fn private_files() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Makes the agent's directories, finds its cgroups and its credential,
/// and kills what a previous life left running. Blocking.
fn find(mut config: AgentConfig) -> Result<Found, AgentError> {
    // Jobs run in their own directories: every path they are given is absolute.
    let absolute = |dir: &Path, flag: &'static str| -> Result<PathBuf, AgentError> {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::canonicalize(dir))
            .map_err(|source| AgentError::Directory { flag, path: dir.to_path_buf(), source })
    };
    config.data_dir = absolute(&config.data_dir, "--data-dir")?;
    config.checkpoint_root = absolute(&config.checkpoint_root, "--checkpoint-root")?;
    // Jobs may pass through these to their own directories, and see no
    // other's: traversable, not listable.
    for dir in [
        config.data_dir.clone(),
        config.data_dir.join("work"),
        config.data_dir.join("run"),
        config.data_dir.join("homes"),
        config.checkpoint_root.clone(),
    ] {
        dirs::own_dir(&dir, 0o711, None)?;
    }
    let cgroups = probe_cgroups(&config);
    let group_prefix = group_prefix(&config);
    let credential = client::load_credential(&config.data_dir)?;
    // Before it registers: the server must not hear of attempts that a
    // previous life left running as if they were this one's.
    ledger::kill_leftovers(&config.data_dir, cgroups.as_ref(), &group_prefix);
    Ok(Found { config, cgroups, group_prefix, credential })
}

/// The agent's cgroups, if it can make them; says why not, where not.
fn probe_cgroups(config: &AgentConfig) -> Option<cgroup::Parents> {
    let probed = if std::env::var_os("EBB_X_NOCG").is_some() {
        Err(cgroup::CgroupError::NoV2Hierarchy)
    } else {
        cgroup::Parents::probe()
    };
    match probed {
        Ok(mut parents) => {
            if std::env::var_os("EBB_X_NOV1").is_some() {
                parents.memory_v1 = None;
            }
            if !config.keep_cgroup_mount && nix::unistd::geteuid().is_root() {
                favor_dynamic_changes();
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
    }
}

/// Remounts the cgroup v2 hierarchy with `favordynmods` (see
/// [`cgroup::favor_dynamic_changes`]).
fn favor_dynamic_changes() {
    let mountinfo = std::path::Path::new("/proc/self/mountinfo");
    match std::fs::read_to_string(mountinfo)
        .map_err(|source| cgroup::CgroupError::File { path: mountinfo.to_path_buf(), source })
        .and_then(|m| cgroup::favor_dynamic_changes(&m))
    {
        Ok(true) => tracing::info!(
            "cgroup v2 remounted with favordynmods: a process joins its attempt's group without waiting for \
             an RCU grace period"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            "{e}: each attempt may wait ~10 ms more to start (ebb agent --keep-cgroup-mount to not try)"
        ),
    }
}

/// The start of this agent's cgroup names: its node name and the tag of
/// its data directory.
fn group_prefix(config: &AgentConfig) -> String {
    let name: String =
        config.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("ebb-{name}-{}-", tag(&config.data_dir))
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

/// The node's image cache, after removing what containers of an earlier
/// run of the agent left in the runtime's state (their processes went
/// with their cgroups).
async fn open_images(config: &AgentConfig) -> Result<Arc<ebb_image::Cache>, supervisor::CacheUnavailable> {
    let (data_dir, images) = (config.data_dir.clone(), config.images.clone());
    blocking(move || {
        let state = data_dir.join("runc");
        for id in std::fs::read_dir(&state).into_iter().flatten().flatten() {
            let _ = std::process::Command::new(&images.runtime)
                .arg("--root")
                .arg(&state)
                .args(["delete", "--force"])
                .arg(id.file_name())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
        let dir = data_dir.join("images");
        ebb_image::Cache::open(&dir, images.cache, &images.registries).map_err(|e| {
            tracing::error!(
                "the image cache {} cannot be opened: {e}; jobs in images will fail",
                dir.display()
            );
            supervisor::CacheUnavailable { dir: dir.clone(), source: Arc::new(e) }
        })
    })
    .await
}

fn supervisor_config(config: &AgentConfig) -> supervisor::Config {
    supervisor::Config {
        node: config.name.clone(),
        data_dir: config.data_dir.clone(),
        checkpoint_root: config.checkpoint_root.clone(),
        job_path: config.job_path.clone(),
        job_env: config.job_env.clone(),
        users: identity::Users {
            allow_root: config.allow_root_jobs,
            tenant_uids: config.tenant_uids.clone(),
            homes: config.data_dir.join("homes"),
        },
        max_checkpoint_bytes: config.max_checkpoint_bytes,
        output: config.output,
        images: config.images.clone(),
        gpu_minors: config.gpu_minors.clone(),
        cdi_spec: config.cdi_spec.clone(),
    }
}

fn node(config: &AgentConfig) -> Node {
    Node {
        name: config.name.clone(),
        gpu_model: config.gpu_model.clone(),
        gpus: config.gpus,
        labels: config.labels.clone(),
        address: config.address.clone(),
        unhealthy_after: config.unhealthy_after,
    }
}

/// The agent's client: for an `https://` server, trusting `trust` alone.
fn http_client(trust: Option<&tls::Trust>) -> Result<reqwest::Client, AgentError> {
    let builder = match trust {
        Some(trust) => trust.client_builder()?,
        None => reqwest::Client::builder(),
    };
    // Idle connections are dropped before the server closes them (its
    // header-read timeout, 30 s by default), so none is reused as it goes.
    builder
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(20))
        .build()
        .map_err(AgentError::Client)
}

/// Returns once no attempt runs, or `timeout` has passed.
async fn until_idle<S: Supervisor>(supervisor: &S, timeout: Duration) {
    let now = tokio::time::Instant::now();
    // A timeout past what an instant can hold waits as long as it takes.
    let deadline = now.checked_add(timeout);
    while !supervisor.running().is_empty() && deadline.is_none_or(|d| tokio::time::Instant::now() < d) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Returns at SIGINT or SIGTERM.
async fn until_told_to_stop() -> Result<(), AgentError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// Runs blocking file I/O off the async scheduling: on a multi-threaded
/// runtime, on this very worker lent to blocking (`block_in_place`: its
/// other tasks move to the other workers, and no trip between threads adds
/// to a start's or a drain's latency); else (tests' single thread) on the
/// blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => tokio::task::spawn_blocking(f).await.expect("a blocking task panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_with_different_data_directories_name_their_cgroups_apart() {
        assert_ne!(tag(Path::new("/var/lib/ebb/a")), tag(Path::new("/var/lib/ebb/b")));
        assert_eq!(tag(Path::new("/var/lib/ebb/a")), tag(Path::new("/var/lib/ebb/a")));
    }
}
