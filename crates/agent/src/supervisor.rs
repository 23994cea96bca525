//! Attempts' processes: starting them, signalling them, and seeing them
//! end.
//!
//! The agent's command loop and its drains speak to a [`Supervisor`], so
//! that they can be tested without processes ([`fake`]). The real one,
//! [`Processes`], runs each attempt as a real process (no shell) in its
//! own cgroup (a process group where the agent cannot make cgroups), as
//! its tenant's user, in directories owned by that user, with its own
//! metadata endpoint, its output read and passed on ([`crate::output`]),
//! and its start and exit reported ([`crate::report`]).
//!
//! A start is on the path from a victim's exit to its preemptor's start,
//! so it makes one trip to a blocking thread, for everything that touches
//! the disk (the user's entry, the directories, a cgroup if none is idle),
//! and the exit makes one, overlapped with the last reads of the job's
//! output. What is left — putting the group back, writing the ledger —
//! happens after the exit is on its way. A preemptor's start held back
//! for its victims' GPUs runs once their groups are empty, while their
//! exits are read and reported, and is reported after them ([`holds`]).
//! Signals, cgroup events and `/proc` are kernel interfaces, not storage,
//! and are used in place.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_api::{AgentEvent, AttemptRef, StartAttempt};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Pid, Uid};
use tokio::sync::watch;

use crate::cgroup::{self, AttemptGroup};
use crate::checkpoints::{self, AttemptUploads, Checkpoints};
use crate::dirs::{self, DirError};
use crate::identity::{self, Identity};
use crate::ledger::{self, Ledger};
use crate::metadata;
use crate::notice::{Members, Notice};
use crate::output::{OutputLimits, Readers};
use crate::report::{now_ms, Reporter};
use crate::spawn;
pub use errors::{CacheUnavailable, CommandsUnavailable, ImageError, SlurmError, StartError};

mod errors;
#[cfg(test)]
pub(crate) mod fake;
mod holds;
mod image;
mod lifetime;
mod step_images;

/// SIGKILL follows a job's own requeue's SIGTERM after this.
const REQUEUE_GRACE: Duration = Duration::from_secs(10);
/// SIGKILL follows the SIGTERM at a time limit after this (Slurm's KillWait).
const TIME_LIMIT_GRACE: Duration = Duration::from_secs(30);

/// What the agent needs of attempts' processes.
pub(crate) trait Supervisor: Send + Sync + 'static {
    /// The attempts running now.
    fn running(&self) -> Vec<AttemptRef>;

    fn is_running(&self, attempt: AttemptRef) -> bool;

    /// Whether the attempt runs here under a notice with this deadline:
    /// not a part of the same attempt started here again since (an
    /// elastic job grown back onto a node it left), which no notice has
    /// reached.
    fn under_notice(&self, attempt: AttemptRef, deadline_ms: u64) -> bool;

    /// Whether a start marked `when_gpus_free` is held back until no other
    /// attempt here holds its GPUs (else the server never sends one).
    const STARTS_WHEN_FREE: bool = false;

    /// A start to be held back until its GPUs are free has come for
    /// `attempt`: from now until its process runs (or it fails, or is
    /// withdrawn) it is waiting, and a stop withdraws it, while it is
    /// still being prepared too.
    fn hold_back(&self, attempt: AttemptRef) {
        let _ = attempt;
    }

    /// The start for `attempt` waits no longer: its process runs, or it
    /// could not start, or it was withdrawn.
    fn let_go(&self, attempt: AttemptRef) {
        let _ = attempt;
    }

    /// The starts held back until their GPUs are free, not withdrawn.
    fn waiting(&self) -> Vec<AttemptRef> {
        Vec::new()
    }

    /// Withdraws a start held back until its GPUs are free: it returns
    /// without starting anything. False if none is waiting.
    fn withdraw(&self, attempt: AttemptRef) -> bool {
        let _ = attempt;
        false
    }

    /// Gives up a start still pulling its image (a stop, a cancel or a
    /// drain came): its start fails saying `why`, and nothing runs. False
    /// if it is not pulling.
    fn abandon(&self, attempt: AttemptRef, why: &str) -> bool {
        let _ = (attempt, why);
        false
    }

    /// Starts an attempt; returns once its process runs, having reported
    /// the start, and reports its output and exit as they come. An error
    /// says why it could not start: then nothing runs and nothing was
    /// reported.
    fn start(self: &Arc<Self>, start: StartAttempt) -> impl Future<Output = Result<(), StartError>> + Send;

    /// Sends `signal` to every process of the attempt (nothing if it is
    /// not running).
    fn signal(&self, attempt: AttemptRef, signal: Signal);

    /// Ends the attempt because the agent stops: SIGTERM now, SIGKILL
    /// after `grace`; where the exit can say so, it says
    /// `ended_by: node_stopping`.
    fn stop_for_shutdown(self: &Arc<Self>, attempt: AttemptRef, grace: Duration)
    where
        Self: Sized,
    {
        crate::drain::stop(self, attempt, grace);
    }

    /// A signal the job's owner sent (`scancel --signal`): a Slurm job's
    /// batch step passes it where `route` says (its steps' tasks, its
    /// batch shell, or both with the shell's children); any other job's
    /// processes all get it.
    fn pass_signal(&self, attempt: AttemptRef, signal: Signal, route: crate::slurm::Route) {
        let _ = route;
        self.signal(attempt, signal);
    }

    /// Whether a gang's rendezvous port is free on this node, for its
    /// first node's processes to listen on: bound and let go at once (on
    /// every address, as torchrun's store listens). A simulated node's
    /// attempts listen on nothing.
    fn port_free(&self, port: u16) -> bool {
        std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
    }

    /// Puts the notice (a drain's or a cancel's) on the attempt's metadata
    /// endpoint. None if the attempt is not running or already has a
    /// notice this one does not supersede (a repeated command after a
    /// reconnect); else where the notice file goes and the signal the job
    /// asked for.
    fn post_notice(&self, attempt: AttemptRef, notice: Notice) -> Option<NoticeTarget>;

    /// Puts an elastic attempt's change of nodes on its endpoint. None if
    /// the attempt is not running here or already has this change or a
    /// later one; else where its members file goes.
    fn post_members(&self, attempt: AttemptRef, members: Members) -> Option<MembersTarget>;

    /// Writes a notice's file, atomically, in a directory the job owns.
    fn write_notice(&self, file: &Path, body: &[u8]) -> std::io::Result<()> {
        crate::dirs::write_job_file(file, body)
    }

    /// Makes ready what the next notices need: called once a poll's
    /// commands have all been carried out, so that no notice, and no
    /// start that came with it, waits for it.
    fn ready_notices(&self) {}
}

/// Where a notice goes beyond the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NoticeTarget {
    /// The attempt's notice file (`EBB_DRAIN_FILE`); none where attempts
    /// have no files (a simulated node's).
    pub drain_file: Option<PathBuf>,
    pub signal: Signal,
}

/// Where a change of an elastic attempt's nodes goes beyond the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MembersTarget {
    /// The attempt's members file (`EBB_MEMBERS_FILE`); none where
    /// attempts have no files (a simulated node's).
    pub file: Option<PathBuf>,
}

/// What the real supervisor needs of the agent's configuration.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// The node's name, as jobs see it (`EBB_NODE`).
    pub node: String,
    pub data_dir: PathBuf,
    pub checkpoint_root: PathBuf,
    pub job_path: String,
    pub job_env: BTreeMap<String, String>,
    /// Who jobs run as.
    pub users: identity::Users,
    /// The most one checkpoint of a job may hold in the store (0: no limit).
    pub max_checkpoint_bytes: u64,
    pub output: OutputLimits,
    /// How jobs in images run; their cache is [`Processes::images`].
    pub images: crate::container::ImageConfig,
    /// Each GPU's device minor (`/dev/nvidiaN`), by index: an attempt may
    /// open its own GPUs' and no other's.
    pub gpu_minors: Vec<u32>,
    /// The node's CDI spec for its GPUs (JSON), where it has one.
    pub cdi_spec: Option<PathBuf>,
}

/// Attempts as real processes.
pub(crate) struct Processes {
    config: Config,
    /// The user the agent runs as.
    me: Uid,
    /// Jobs' users, looked up at most every few seconds.
    identities: identity::IdentityCache,
    /// Where attempts' cgroups come from; none: process groups only.
    cgroups: Option<Arc<cgroup::Pool>>,
    running: Mutex<HashMap<AttemptRef, Running>>,
    reporter: Arc<Reporter>,
    ledger: Arc<Ledger>,
    /// The cluster's checkpoint store, if it has one.
    checkpoints: Arc<Checkpoints>,
    /// The tenants whose jobs ran here as each uid: two on one uid are
    /// warned of, once.
    tenants_by_uid: Mutex<HashMap<u32, Vec<String>>>,
    /// The node's image cache; none where it could not be opened (why).
    images: Result<Arc<ebb_image::Cache>, CacheUnavailable>,
    /// The Slurm commands' directory, made at the first Slurm job's start.
    slurm_commands: std::sync::OnceLock<Result<PathBuf, CommandsUnavailable>>,
    /// Each attempt's GPUs, for the starts held back until they are free.
    gpus: holds::GpuHolds,
    /// Starts held back until their GPUs are free, from their command
    /// until their process runs, and whether each has been withdrawn.
    waiting: Mutex<HashMap<AttemptRef, bool>>,
    /// Starts pulling their image, each with what gives it up.
    pulling: Mutex<HashMap<AttemptRef, watch::Sender<Option<String>>>>,
    /// The device programs loaded, for the attempts' groups.
    device_programs: crate::devices::Programs,
    /// Notices' files, made ahead.
    notice_files: dirs::NoticeFiles,
    /// The server, once reached: step images are pinned there.
    server: std::sync::OnceLock<Arc<crate::client::Client>>,
    /// The images running attempts' steps were shown, by attempt.
    step_views: Mutex<HashMap<AttemptRef, Vec<step_images::StepView>>>,
    /// Held while an image is shown to a step of the attempt: one at a
    /// time for an attempt, attempts side by side.
    showing: Mutex<HashMap<AttemptRef, Arc<tokio::sync::Mutex<()>>>>,
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
    /// An elastic attempt's latest change of nodes, on its endpoint.
    members: watch::Sender<Option<Members>>,
    /// The attempt's cgroup; none where the agent cannot make cgroups.
    group: Option<AttemptGroup>,
    /// A Slurm job: its main process is the batch step, which routes the
    /// signals it is sent with [`crate::slurm::Route`].
    slurm: bool,
    /// A Slurm job's `--signal`: a drain's goes to the batch step, which
    /// routes it, not to every process.
    routed: bool,
    /// The agent ended it: the job asked to be requeued, or it ran past
    /// its time limit.
    ended_by: Option<ebb_api::EndedBy>,
}

/// Where an attempt runs, prepared before its process starts.
struct Prepared {
    who: Identity,
    workdir: PathBuf,
    /// The job's default working directory, where it set none.
    default_workdir: Option<PathBuf>,
    checkpoint_dir: PathBuf,
    run_dir: PathBuf,
    cgroup: Option<cgroup::Ready>,
    /// A Slurm job's batch step command line and the commands' directory.
    slurm: Option<(Vec<String>, PathBuf)>,
    /// The node's other GPUs refused to its processes.
    devices: Option<crate::devices::Filter>,
}

impl Prepared {
    /// Its group, for the pool again: its device program detached first,
    /// so that the next attempt in the group is not refused its GPUs.
    fn release_group(&mut self) -> Option<AttemptGroup> {
        drop(self.devices.take());
        self.cgroup.take().map(|ready| ready.group)
    }
}

/// An attempt's container, as its end needs it: where its shim says why
/// a container never ran, and its id in the runtime's state.
struct Shim {
    error_file: PathBuf,
    id: String,
}

/// What an attempt's end needs once its process has started.
struct Ending {
    pid: i32,
    group: Option<AttemptGroup>,
    peak: cgroup::Peak,
    run_dir: PathBuf,
    default_workdir: Option<PathBuf>,
    output: Readers,
    /// Uploads of its checkpoints, where there is a store.
    uploads: Option<Arc<AttemptUploads>>,
    /// Its image, held until it ends, and its container's shim.
    image: Option<(ebb_image::Lease, Shim)>,
    /// Its device program, detached before its group is used again.
    devices: Option<crate::devices::Filter>,
}

impl Processes {
    pub(crate) fn new(
        config: Config,
        cgroups: Option<Arc<cgroup::Pool>>,
        reporter: Arc<Reporter>,
        ledger: Arc<Ledger>,
        checkpoints: Arc<Checkpoints>,
        images: Result<Arc<ebb_image::Cache>, CacheUnavailable>,
    ) -> Processes {
        Processes {
            images,
            notice_files: dirs::NoticeFiles::new(config.data_dir.join("notices")),
            config,
            me: nix::unistd::geteuid(),
            identities: identity::IdentityCache::new(),
            cgroups,
            running: Mutex::new(HashMap::new()),
            reporter,
            ledger,
            checkpoints,
            tenants_by_uid: Mutex::new(HashMap::new()),
            slurm_commands: std::sync::OnceLock::new(),
            gpus: holds::GpuHolds::default(),
            waiting: Mutex::new(HashMap::new()),
            pulling: Mutex::new(HashMap::new()),
            device_programs: Default::default(),
            server: std::sync::OnceLock::new(),
            step_views: Mutex::new(HashMap::new()),
            showing: Mutex::new(HashMap::new()),
        }
    }

    /// Warns, once per tenant, of a tenant whose jobs run as a uid another
    /// tenant's did: they can read each other's processes and files.
    fn note_user(&self, tenant: &str, who: &Identity) {
        if !who.switch {
            return; // a personal cluster: every job is its user's
        }
        let mut seen = self.tenants_by_uid.lock().expect("tenants by uid");
        let tenants = seen.entry(who.uid.as_raw()).or_default();
        if tenants.iter().any(|t| t == tenant) {
            return;
        }
        tenants.push(tenant.to_string());
        if tenants.len() > 1 {
            tracing::warn!(
                uid = who.uid.as_raw(),
                user = who.user,
                tenants = ?tenants,
                "tenants share a Unix user on this node: their jobs can read each other's processes, \
                 environments and files (the server's --run-as or --default-run-as maps them so)"
            );
        }
    }

    /// Makes idle cgroups for the starts to come, on a blocking thread.
    pub(crate) fn fill_pool(&self) {
        if let Some(pool) = self.cgroups.clone() {
            let ledger = self.ledger.clone();
            tokio::task::spawn_blocking(move || {
                pool.fill();
                record_pool(&pool, &ledger);
            });
        }
    }

    /// Removes the idle cgroups (the agent is stopping).
    pub(crate) async fn clear_pool(&self) {
        if let Some(pool) = self.cgroups.clone() {
            let _ = tokio::task::spawn_blocking(move || pool.clear()).await;
        }
    }

    /// Removes finished attempts' directories older than `retention`, for
    /// ever, a quarter of it apart (1 s to 10 min).
    pub(crate) async fn sweep_every(self: Arc<Self>, retention: Duration) {
        let every = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(600));
        loop {
            let running = self.running();
            let data_dir = self.config.data_dir.clone();
            let _ = tokio::task::spawn_blocking(move || dirs::sweep(&data_dir, retention, &running)).await;
            tokio::time::sleep(every).await;
        }
    }

    /// Starts attempt `s`: its directories and cgroup, its metadata
    /// endpoint, its process, then what watches it.
    async fn launch(self: &Arc<Self>, s: StartAttempt) -> Result<(), StartError> {
        // A start held back for its GPUs waits from its command on
        // (`hold_back`) until the task that runs this lets it go.
        if s.when_gpus_free && self.waiting.lock().expect("waiting").get(&s.attempt) == Some(&true) {
            return Ok(()); // withdrawn before it began
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(StartError::Endpoint)?;
        let port = listener.local_addr().map_err(StartError::Endpoint)?.port();
        let secret = metadata::Secret::new().map_err(StartError::Secret)?;
        let image = match &s.image {
            Some(image) => Some(self.pull_unless_abandoned(s.attempt, image).await?),
            None => None,
        };
        let this = self.clone();
        let (prepared, s) = crate::blocking(move || (this.prepare(&s), s)).await;
        let mut prepared = prepared?;
        let (restored, notes, uploads) = self.restore_checkpoint(&s, &prepared).await;
        let a = s.attempt;
        let withdrawn = || self.waiting.lock().expect("waiting").get(&a).copied().unwrap_or(true);
        if s.when_gpus_free && !self.gpus.free_for(a, &s.gpus, withdrawn).await {
            // Withdrawn: its hold went before its victims did.
            tracing::info!(job = %a.job, attempt = %a.attempt, "start withdrawn before its GPUs were free");
            self.give_back(prepared.release_group());
            return Ok(());
        }
        let (notice, notice_rx) = watch::channel(None);
        let (members, members_rx) = watch::channel(None);
        let endpoint = format!("127.0.0.1:{port}/{}", secret.as_str());
        let this = Arc::downgrade(self);
        let requeue: metadata::Requeue = Arc::new(move || {
            this.upgrade().is_some_and(|p| p.end(a, ebb_api::EndedBy::Requeue, REQUEUE_GRACE))
        });
        let (this, who, gpus) = (Arc::downgrade(self), prepared.who.clone(), s.gpus.clone());
        let images: metadata::ShowImage = Arc::new(move |reference| {
            let (this, who, gpus) = (this.clone(), who.clone(), gpus.clone());
            Box::pin(async move {
                match this.upgrade() {
                    Some(p) => p.show_step_image(a, (&who, &gpus), reference).await,
                    None => Err((503, "the agent is stopping".into())),
                }
            })
        });
        let node = self.config.node.clone();
        tokio::spawn(metadata::serve(
            listener,
            secret,
            metadata::Attempt { job: a.job, attempt: a.attempt, node, requeue, images },
            metadata::Posted { notice: notice_rx, members: members_rx },
            self.reporter.clone(),
            uploads.clone(),
        ));
        let spawned = match &image {
            Some(lease) => self.spawn_container(&s, &prepared, &endpoint, lease),
            None => self.spawn(&s, &prepared, &endpoint).map(|child| (child, None)),
        };
        let (child, error_file) = match spawned {
            Ok(child) => child,
            Err(e) => {
                self.give_back(prepared.release_group());
                return Err(e);
            }
        };
        let Prepared { run_dir, default_workdir, cgroup, devices, .. } = prepared;
        let (group, peak) =
            cgroup.map_or((None, cgroup::Peak::None), |ready| (Some(ready.group), ready.peak));
        self.record(&s, child.pid, run_dir.join(dirs::DRAIN_FILE), (notice, members), group.clone());
        if let Some(limit_ms) = s.time_limit_ms {
            // A Slurm job's --signal comes SECS before the limit (60 s by default).
            let warn = s
                .slurm
                .as_ref()
                .filter(|b| b.routed_signal)
                .map(|b| (u64::from(b.signal_before_s.unwrap_or(60)) * 1000, s.signal));
            tokio::spawn(self.clone().limit_time(a, limit_ms, warn));
        }
        if s.when_gpus_free {
            self.gpus.reported_for(a, &s.gpus).await;
        }
        // Restored before the start, and so in the timeline.
        if let Some(restored) = restored {
            self.reporter.send(restored);
        }
        self.reporter.send(AgentEvent::Started { attempt: a, pid: child.pid as u32, at_ms: now_ms() });
        for data in notes {
            self.reporter.send(AgentEvent::Output { attempt: a, data });
        }
        let output = Readers::start(a, self.config.output, &self.reporter, [child.stdout, child.stderr]);
        let image = image.zip(error_file);
        let ending =
            Ending { pid: child.pid, group, peak, run_dir, default_workdir, output, uploads, image, devices };
        tokio::spawn(self.clone().watch(a, ending));
        Ok(())
    }

    /// Where the cluster has a checkpoint store: puts the job's latest
    /// checkpoint into its directory, and starts the attempt's uploads.
    /// Returns the report of the checkpoint restored, for the timeline, and
    /// the lines for the job's log, to follow its start.
    async fn restore_checkpoint(
        &self,
        s: &StartAttempt,
        p: &Prepared,
    ) -> (Option<AgentEvent>, Vec<String>, Option<Arc<AttemptUploads>>) {
        let Some(store) = self.checkpoints.store() else { return (None, Vec::new(), None) };
        let job_store = match store.job(&s.tenant, s.attempt.job.0) {
            Ok(job_store) => job_store,
            Err(e) => return (None, vec![format!("ebb: checkpoint store: {e}\n")], None),
        };
        let owner = p.who.switch.then(|| (p.who.uid.as_raw(), p.who.gid.as_raw()));
        let checkpoints::Restore { lines, cache, restored } =
            checkpoints::restore(&job_store, store.url(), s.attempt, &p.checkpoint_dir, owner).await;
        let uploads = AttemptUploads::start(checkpoints::UploadTask {
            store: job_store,
            dir: p.checkpoint_dir.clone(),
            rules: ebb_checkpoints::Rules { owner, max_bytes: self.config.max_checkpoint_bytes },
            attempt: s.attempt,
            cache,
            reporter: self.reporter.clone(),
        });
        (restored, lines, Some(uploads))
    }

    /// Who the attempt runs as, its directories, and its cgroup: all the
    /// file system work of a start, on a blocking thread.
    ///
    /// The attempt's own directories belong to its user, closed to others;
    /// the tenant's checkpoint root too, so tenants cannot see each
    /// other's. Retention counts from the last use: a requeued job's old
    /// working directory is in use again (a new one is new enough).
    fn prepare(&self, s: &StartAttempt) -> Result<Prepared, StartError> {
        let a = s.attempt;
        let who = self.identities.resolve(
            s.run_as.as_deref(),
            (&s.tenant, s.tenant_id),
            self.me,
            &self.config.users,
        )?;
        self.note_user(&s.tenant, &who);
        if who.allocated {
            // The tenant's own home, made as its other directories are.
            dirs::own_dir(&who.home, 0o700, Some(&who))?;
        }
        let owned = |p: PathBuf, in_use: bool| {
            let created = dirs::own_dir(&p, 0o700, Some(&who))?;
            if in_use && !created {
                dirs::touch(&p);
            }
            Ok::<_, DirError>(p)
        };
        let (workdir, default_workdir) = match &s.workdir {
            Some(w) => (PathBuf::from(w), None),
            None => {
                let dir = owned(dirs::default_workdir(&self.config.data_dir, a.job), true)?;
                (dir.clone(), Some(dir))
            }
        };
        let tenant_root = owned(self.config.checkpoint_root.join(dirs::tenant_dir_name(&s.tenant)?), false)?;
        let checkpoint_dir = owned(tenant_root.join(a.job.to_string()), false)?;
        let run_dir = owned(dirs::run_dir(&self.config.data_dir, a), true)?;
        dirs::clear_earlier_part(&run_dir)?;
        let slurm = match &s.slurm {
            Some(batch) => Some(self.prepare_slurm(s, batch, &run_dir, &who)?),
            None => None,
        };
        let cgroup = self.cgroups.as_ref().map(|pool| pool.take()).transpose()?;
        let devices = cgroup.as_ref().filter(|_| self.me.is_root()).and_then(|ready| {
            let denied = crate::devices::denied(&self.config.gpu_minors, &s.gpus);
            match self.device_programs.attach(&ready.group.v2, &denied) {
                Ok(filter) => Some(filter),
                Err(e) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        tracing::error!(
                            "cannot attach a device program to attempts' cgroups ({e}): jobs on this node can \
                             open every GPU's device node"
                        )
                    });
                    None
                }
            }
        });
        Ok(Prepared { who, workdir, default_workdir, checkpoint_dir, run_dir, cgroup, slurm, devices })
    }

    /// A Slurm job's script in its run directory, and its batch step's
    /// command line; the Slurm commands installed on the node if they are
    /// not yet.
    fn prepare_slurm(
        &self,
        s: &StartAttempt,
        batch: &ebb_api::SlurmBatch,
        run_dir: &Path,
        who: &Identity,
    ) -> Result<(Vec<String>, PathBuf), StartError> {
        let exe = std::env::current_exe().map_err(StartError::OwnProgram)?;
        let commands = self
            .slurm_commands
            .get_or_init(|| crate::slurm::install_commands(&self.config.data_dir, &exe))
            .clone()
            .map_err(SlurmError::from)?;
        let (script, steps) = crate::slurm::write_script(run_dir, batch, who)?;
        Ok((crate::slurm::batch_argv(&exe, &script, &steps, s, batch), commands))
    }

    /// Starts the attempt's process, with its metadata endpoint at
    /// `endpoint` (`HOST:PORT/SECRET`).
    fn spawn(&self, s: &StartAttempt, p: &Prepared, endpoint: &str) -> Result<spawn::Child, StartError> {
        let mut env = self.job_env(s, p, endpoint);
        let argv = match &p.slurm {
            Some((argv, commands)) => {
                let path = env.get("PATH").cloned().unwrap_or_default();
                env.insert("PATH".into(), format!("{}:{path}", commands.display()));
                argv
            }
            None => &s.argv,
        };
        let join = p.cgroup.as_ref().map_or_else(Vec::new, |ready| ready.join.fds());
        let request = spawn::Request { argv, env: &env, cwd: &p.workdir, who: &p.who, join: &join };
        spawn::spawn(&request).map_err(|e| StartError::Spawn {
            program: s.argv.first().cloned().unwrap_or_default(),
            cause: e.cause(),
            user: p.who.user.clone(),
            uid: p.who.uid,
            workdir: p.workdir.clone(),
        })
    }

    /// The job's whole environment: see [`identity::job_env`]. The
    /// metadata endpoint's secret is in the path every variable that names
    /// the endpoint gives (see [`metadata`]).
    fn job_env(&self, s: &StartAttempt, p: &Prepared, endpoint: &str) -> BTreeMap<String, String> {
        let a = s.attempt;
        let gpus: Vec<String> = s.gpus.iter().map(|g| g.to_string()).collect();
        let path = |p: &Path| p.display().to_string();
        let metadata_url = format!("http://{endpoint}");
        let ebb = [
            ("CUDA_VISIBLE_DEVICES", gpus.join(",")),
            ("EBB_JOB_ID", a.job.to_string()),
            ("EBB_ATTEMPT", a.attempt.to_string()),
            ("EBB_TIER", s.tier.clone()),
            ("EBB_NODE", self.config.node.clone()),
            ("EBB_CHECKPOINT_DIR", path(&p.checkpoint_dir)),
            ("EBB_DRAIN_FILE", path(&p.run_dir.join(dirs::DRAIN_FILE))),
            ("EBB_MEMBERS_FILE", path(&p.run_dir.join(dirs::MEMBERS_FILE))),
            ("EBB_COMPLETION_FILE", path(&p.run_dir.join(dirs::COMPLETION_FILE))),
            ("EBB_DRAIN_SIGNAL", s.signal.to_string()),
            ("EBB_METADATA_URL", metadata_url.clone()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", format!("{metadata_url}/")),
            ("GCE_METADATA_HOST", endpoint.to_string()),
        ];
        identity::job_env(&self.config.job_path, &p.who, &self.config.job_env, &s.env, &ebb)
    }

    /// Records the attempt as running, in memory and in the ledger.
    fn record(
        &self,
        s: &StartAttempt,
        pid: i32,
        drain_file: PathBuf,
        (notice, members): (watch::Sender<Option<Notice>>, watch::Sender<Option<Members>>),
        group: Option<AttemptGroup>,
    ) {
        let started_ticks = if self.cgroups.is_none() { ledger::process_start(pid) } else { None };
        let routed = s.slurm.as_ref().is_some_and(|slurm| slurm.routed_signal);
        let slurm = s.slurm.is_some();
        let running = Running {
            pgid: pid,
            started_ticks,
            signal: s.signal,
            drain_file,
            notice,
            members,
            group,
            slurm,
            routed,
            ended_by: None,
        };
        self.gpus.hold(s.attempt, &s.gpus);
        let mut attempts = self.running.lock().expect("running");
        attempts.insert(s.attempt, running);
        match &self.cgroups {
            Some(pool) => record_pool(pool, &self.ledger),
            None => self.ledger.record_process_groups(
                attempts.iter().filter_map(|(a, r)| Some((*a, r.pgid, r.started_ticks?))).collect(),
            ),
        }
    }

    /// Ends attempt `a` for `why`: SIGTERM to every process now, SIGKILL
    /// after `grace`; its exit says why. False if it is not running.
    fn end(self: &Arc<Self>, a: AttemptRef, why: ebb_api::EndedBy, grace: Duration) -> bool {
        use ebb_api::EndedBy;
        {
            let mut running = self.running.lock().expect("running");
            let Some(r) = running.get_mut(&a) else { return false };
            // A requeue the job asked for wins over its time limit and the
            // agent's stop; otherwise the first reason stands.
            if r.ended_by.is_none() || why == EndedBy::Requeue {
                r.ended_by = Some(why);
            }
        }
        tracing::info!(job = %a.job, attempt = %a.attempt, ?why, "ending the attempt");
        self.signal_all(a, Signal::SIGTERM);
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if this.is_running(a) {
                this.signal_all(a, Signal::SIGKILL);
            }
        });
        true
    }

    /// Every process of the attempt, whatever its job routes: in a
    /// cgroup, every process the group holds as the signal comes (its list
    /// read before any is signalled, so that a process the job's handler
    /// starts on the signal, a trap's command or the upload of its save, is
    /// not sent it too).
    fn signal_all(&self, a: AttemptRef, signal: Signal) {
        let target = self.running.lock().expect("running").get(&a).map(|r| (r.pgid, r.group.clone()));
        match target {
            Some((_, Some(group))) => group.signal(signal),
            Some((pgid, None)) => {
                let _ = killpg(Pid::from_raw(pgid), signal);
            }
            None => {}
        }
    }

    /// Puts back the cgroup of an attempt that did not start.
    fn give_back(&self, group: Option<AttemptGroup>) {
        if let (Some(pool), Some(group)) = (self.cgroups.clone(), group) {
            let ledger = self.ledger.clone();
            tokio::task::spawn_blocking(move || {
                pool.recycle(group);
                record_pool(&pool, &ledger);
            });
        }
    }
}

impl Supervisor for Processes {
    fn stop_for_shutdown(self: &Arc<Self>, attempt: AttemptRef, grace: Duration) {
        self.end(attempt, ebb_api::EndedBy::NodeStopping, grace);
    }

    fn running(&self) -> Vec<AttemptRef> {
        self.running.lock().expect("running").keys().copied().collect()
    }

    fn is_running(&self, attempt: AttemptRef) -> bool {
        self.running.lock().expect("running").contains_key(&attempt)
    }

    fn under_notice(&self, attempt: AttemptRef, deadline_ms: u64) -> bool {
        let running = self.running.lock().expect("running");
        running
            .get(&attempt)
            .is_some_and(|r| r.notice.borrow().as_ref().is_some_and(|n| n.deadline_ms == deadline_ms))
    }

    const STARTS_WHEN_FREE: bool = true;

    fn hold_back(&self, attempt: AttemptRef) {
        self.waiting.lock().expect("waiting").entry(attempt).or_insert(false);
    }

    fn let_go(&self, attempt: AttemptRef) {
        self.waiting.lock().expect("waiting").remove(&attempt);
    }

    fn waiting(&self) -> Vec<AttemptRef> {
        let waiting = self.waiting.lock().expect("waiting");
        waiting.iter().filter(|(_, withdrawn)| !**withdrawn).map(|(a, _)| *a).collect()
    }

    fn withdraw(&self, attempt: AttemptRef) -> bool {
        let mut waiting = self.waiting.lock().expect("waiting");
        match waiting.get_mut(&attempt) {
            Some(withdrawn) => {
                *withdrawn = true;
                drop(waiting);
                self.gpus.wake();
                true
            }
            None => false,
        }
    }

    fn abandon(&self, attempt: AttemptRef, why: &str) -> bool {
        match self.pulling.lock().expect("pulling").get(&attempt) {
            Some(abandon) => {
                abandon.send_replace(Some(why.to_string()));
                true
            }
            None => false,
        }
    }

    fn start(self: &Arc<Self>, start: StartAttempt) -> impl Future<Output = Result<(), StartError>> + Send {
        self.launch(start)
    }

    /// Every process of the attempt: all of its cgroup, or its process
    /// group where there is no cgroup.
    fn signal(&self, attempt: AttemptRef, signal: Signal) {
        let routed = self.running.lock().expect("running").get(&attempt).and_then(|r| {
            (r.routed && signal as i32 == r.signal && signal != Signal::SIGKILL).then_some(r.pgid)
        });
        match routed {
            // A Slurm job's --signal: its batch step passes it on.
            Some(pid) => crate::slurm::Route::Drain.send(pid, signal),
            None => self.signal_all(attempt, signal),
        }
    }

    fn pass_signal(&self, attempt: AttemptRef, signal: Signal, route: crate::slurm::Route) {
        let slurm = self.running.lock().expect("running").get(&attempt).filter(|r| r.slurm).map(|r| r.pgid);
        match slurm {
            Some(pid) => route.send(pid, signal),
            None => self.signal_all(attempt, signal),
        }
    }

    fn post_notice(&self, attempt: AttemptRef, notice: Notice) -> Option<NoticeTarget> {
        let running = self.running.lock().expect("running");
        let r = running.get(&attempt)?;
        if !notice.supersedes(r.notice.borrow().as_ref()) {
            return None;
        }
        r.notice.send_replace(Some(notice));
        let signal = Signal::try_from(r.signal).unwrap_or(Signal::SIGTERM);
        Some(NoticeTarget { drain_file: Some(r.drain_file.clone()), signal })
    }

    fn post_members(&self, attempt: AttemptRef, members: Members) -> Option<MembersTarget> {
        let running = self.running.lock().expect("running");
        let r = running.get(&attempt)?;
        if !members.supersedes(r.members.borrow().as_ref()) {
            return None;
        }
        r.members.send_replace(Some(members));
        Some(MembersTarget { file: Some(r.drain_file.with_file_name(dirs::MEMBERS_FILE)) })
    }

    fn write_notice(&self, file: &Path, body: &[u8]) -> std::io::Result<()> {
        self.notice_files.write(file, body)
    }

    fn ready_notices(&self) {
        self.notice_files.refill();
    }
}

/// Records the pool's groups in the ledger if they changed.
fn record_pool(pool: &cgroup::Pool, ledger: &Ledger) {
    if pool.changed() {
        ledger.record_cgroups(pool.all());
    }
}
