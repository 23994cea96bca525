//! A real cluster for end-to-end tests: the `ebb` binary as server and
//! agents on loopback, real processes for jobs, the CLI as a user runs it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod plane;
pub mod tls;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Options {
    pub nodes: u32,
    pub gpus: u8,
    pub drain_window: &'static str,
    pub heartbeat_timeout: &'static str,
    /// How often agents poll (`ebb server --heartbeat-interval`).
    pub heartbeat_interval: &'static str,
    /// Who runs the jobs. `None`: as `ebb up` does, the user running the
    /// tests (root may run jobs as root), with the tests' PATH.
    pub run_as: Option<RunAs>,
    /// More flags for every agent.
    pub agent_args: Vec<&'static str>,
    /// `ebb server --database URL`: PostgreSQL instead of SQLite.
    pub database: Option<String>,
    /// Each of the `nodes` agents is a simulated fleet of this many nodes
    /// (`ebb agent --simulate-nodes`), named `node-{i}-{j:05}`; 0: real
    /// agents.
    pub simulated_nodes: u32,
    /// More flags for the server.
    pub server_args: Vec<String>,
    /// Each agent has a checkpoint root of its own
    /// (`checkpoints-node-{i}`), as nodes without shared storage do.
    pub own_checkpoint_roots: bool,
    /// More environment for every agent.
    pub agent_env: Vec<(String, String)>,
    /// Every real agent's open-file limit, soft and hard (`None`: the
    /// tests' own), as `ulimit -n` or systemd's `LimitNOFILE=` sets it.
    pub agent_open_files: Option<u64>,
    /// Each real agent reads its simulated GPUs' faults from a file and
    /// runs a health check, every 300 ms: see [`Cluster::set_gpu_faults`]
    /// and [`Cluster::fail_health_check`].
    pub health: bool,
    /// The agents' GPU model (default [`DEFAULT_GPU_MODEL`]).
    pub gpu_model: Option<&'static str>,
}

/// An operator's mapping of tenants to Unix users, and the default user
/// (the server's own default, `nobody`, when `None`).
pub struct RunAs {
    pub tenants: Vec<(&'static str, &'static str)>,
    pub default: Option<&'static str>,
}

/// The agents' GPU model unless told otherwise.
pub const DEFAULT_GPU_MODEL: &str = "H100-80GB";

/// Every agent's environment carries this variable; no job may see it.
pub const AGENT_CANARY: &str = "EBB_TEST_AGENT_CANARY";

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 1,
            gpus: 4,
            drain_window: "30s",
            heartbeat_timeout: "10s",
            heartbeat_interval: "200ms",
            run_as: None,
            agent_args: Vec::new(),
            database: None,
            simulated_nodes: 0,
            server_args: Vec::new(),
            own_checkpoint_roots: false,
            agent_env: Vec::new(),
            agent_open_files: None,
            health: false,
            gpu_model: None,
        }
    }
}

/// The host's BLAS settings, as `--job-env` flags: a job's numerics match
/// those of the same script run directly by a test (the node's image would
/// set them for its jobs).
fn blas_settings() -> Vec<String> {
    std::env::vars()
        .filter(|(k, _)| ["OPENBLAS_", "OMP_", "MKL_"].iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| format!("--job-env={k}={v}"))
        .collect()
}

fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub struct Cluster {
    pub dir: PathBuf,
    opts: Options,
    server: Option<Child>,
    agents: Vec<Option<Child>>,
    /// Agents' GPU model, where not the default.
    gpu_models: std::collections::BTreeMap<usize, &'static str>,
    pub url: String,
    pub admin: String,
}

/// The repository, for the examples and the SDK.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

pub fn ebb_exe() -> &'static str {
    env!("CARGO_BIN_EXE_ebb")
}

/// The wall clock, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    ebb_core::time::unix_ms(std::time::SystemTime::now())
}

/// Waits for `check` to give a value, polling; panics with `what` after
/// `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Cluster {
    pub fn start(opts: Options) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "ebb-e2e-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let mut cluster = Cluster {
            dir,
            opts,
            server: None,
            agents: Vec::new(),
            gpu_models: Default::default(),
            url: String::new(),
            admin: String::new(),
        };
        cluster.start_server();
        for i in 0..cluster.opts.nodes {
            cluster.agents.push(None);
            cluster.start_agent(i as usize);
        }
        cluster.wait_nodes_up(cluster.opts.nodes as usize * cluster.opts.simulated_nodes.max(1) as usize);
        cluster
    }

    fn log(&self, name: &str) -> Stdio {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join(format!("{name}.log")))
            .unwrap();
        Stdio::from(file)
    }

    pub fn start_server(&mut self) {
        let server_dir = self.dir.join("server");
        let _ = std::fs::remove_file(server_dir.join("server.url"));
        // Reuse the port across restarts so agents find the server again.
        let listen = if self.url.is_empty() {
            "127.0.0.1:0".to_string()
        } else {
            self.url.trim_start_matches("http://").to_string()
        };
        let run_as: Vec<String> = match &self.opts.run_as {
            None => vec!["--default-run-as".into(), current_user()],
            Some(r) => r
                .tenants
                .iter()
                .flat_map(|(t, u)| ["--run-as".to_string(), format!("{t}={u}")])
                .chain(r.default.iter().flat_map(|u| ["--default-run-as".to_string(), u.to_string()]))
                .collect(),
        };
        let child = Command::new(ebb_exe())
            .args(["server", "--data-dir", server_dir.to_str().unwrap(), "--listen", &listen])
            .args(&run_as)
            .args([
                "--drain-window",
                self.opts.drain_window,
                "--heartbeat-timeout",
                self.opts.heartbeat_timeout,
            ])
            .args(["--heartbeat-interval", self.opts.heartbeat_interval])
            .args(self.opts.database.iter().flat_map(|url| ["--database", url.as_str()]))
            // A simulated fleet's nodes all connect from 127.0.0.1.
            .args(match self.opts.simulated_nodes > 100 {
                true => &["--max-connections-per-address", "0"][..],
                false => &[][..],
            })
            .args(&self.opts.server_args)
            .stdout(self.log("server"))
            .stderr(self.log("server"))
            .spawn()
            .unwrap();
        self.server = Some(child);
        self.url = wait_for("server.url", Duration::from_secs(20), || {
            std::fs::read_to_string(server_dir.join("server.url")).ok().filter(|s| !s.trim().is_empty())
        })
        .trim()
        .to_string();
        self.admin = std::fs::read_to_string(server_dir.join("admin.token")).unwrap().trim().to_string();
    }

    /// `/metrics` as an operator scrapes it (it takes an operator's token
    /// or the scrape token).
    pub fn metrics(&self) -> String {
        let answer = reqwest::blocking::Client::new()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(&self.admin)
            .send()
            .unwrap();
        assert_eq!(answer.status(), 200, "/metrics");
        answer.text().unwrap()
    }

    /// The batches the writer has committed (`ebb_writer_batches_total`).
    pub fn writer_batches(&self) -> u64 {
        let metrics = self.metrics();
        let line =
            metrics.lines().find(|l| l.starts_with("ebb_writer_batches_total ")).expect("the batch count");
        line.rsplit(' ').next().unwrap().parse().expect("a count")
    }

    /// Waits until the writer has committed `n` more batches than now,
    /// each with a scheduling pass (a tick's at least every 250 ms): what
    /// the scheduler would do with what it holds now, it has done.
    pub fn after_passes(&self, n: u64) {
        let from = self.writer_batches();
        wait_for("the writer's next batches", Duration::from_secs(20), || {
            (self.writer_batches() >= from + n).then_some(())
        });
    }

    /// The server's process, while this cluster runs it: the same pid
    /// before and after a request says the request did not stop it.
    pub fn server_pid(&self) -> u32 {
        self.server.as_ref().expect("server running").id()
    }

    /// Whether the server process has exited (and how), without waiting.
    pub fn server_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.server.as_mut().expect("server running").try_wait().unwrap()
    }

    pub fn kill_server(&mut self) {
        let mut child = self.server.take().expect("server running");
        child.kill().unwrap(); // SIGKILL: no chance to flush anything
        child.wait().unwrap();
    }

    /// Starts agent `i`: as the options say for the first `nodes`, a real
    /// one for those added after them ([`Cluster::add_real_agent`]).
    pub fn start_agent(&mut self, i: usize) {
        if self.opts.simulated_nodes > 0 && i < self.opts.nodes as usize {
            return self.start_simulated_fleet(i);
        }
        let name = format!("node-{i}");
        let personal: Vec<String> = match &self.opts.run_as {
            None => vec!["--allow-root-jobs".into(), "--job-path".into(), std::env::var("PATH").unwrap()],
            Some(_) => Vec::new(),
        };
        let mut command = Command::new(ebb_exe());
        if let Some(files) = self.opts.agent_open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe and touches only the child.
            unsafe {
                command.pre_exec(move || {
                    use nix::sys::resource::{setrlimit, Resource};
                    setrlimit(Resource::RLIMIT_NOFILE, files, files).map_err(std::io::Error::from)
                });
            }
        }
        let health: Vec<String> = match self.opts.health {
            true => {
                let check = self.health_file(i, "check");
                let runs = self.health_file(i, "runs");
                vec![
                    "--fake-gpu-faults".into(),
                    self.health_file(i, "faults").display().to_string(),
                    "--health-check".into(),
                    format!(
                        "echo >> {1}; if [ -s {0} ]; then cat {0}; exit 1; fi",
                        check.display(),
                        runs.display()
                    ),
                    "--health-interval".into(),
                    "300ms".into(),
                ]
            }
            false => Vec::new(),
        };
        // A test's cluster stops at its end: its agents' jobs are ended
        // 1 s after the drain begins, not the default 6 minutes.
        let stop: &[&str] = match self.opts.agent_args.contains(&"--stop-timeout") {
            true => &[],
            false => &["--stop-timeout", "1s"],
        };
        let child = command
            .args(["agent", "--server", &self.url, "--name", &name])
            .args(&personal)
            .args(&health)
            .args(stop)
            .args(&self.opts.agent_args)
            .args(blas_settings())
            .args(["--join-token-file", self.dir.join("server/join.token").to_str().unwrap()])
            .args(["--fake-gpus", &self.opts.gpus.to_string()])
            .args(["--gpu-model", self.gpu_model(i)])
            .args(["--data-dir", self.dir.join("agents").join(&name).to_str().unwrap()])
            .args(["--checkpoint-root", self.checkpoint_root(i).to_str().unwrap()])
            .args(["--address", "127.0.0.1"])
            // A node with the SDK installed, as a workload's image would have it.
            .arg(format!("--job-env=PYTHONPATH={}", repo_root().join("sdk/python").display()))
            .env(AGENT_CANARY, "agent-only")
            .envs(self.opts.agent_env.iter().cloned())
            .stdout(self.log(&name))
            .stderr(self.log(&name))
            .spawn()
            .unwrap();
        self.agents[i] = Some(child);
    }

    /// Agent `i`'s health file `what` (`faults`, `check`).
    fn health_file(&self, i: usize, what: &str) -> PathBuf {
        let dir = self.dir.join("health");
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(format!("{what}-node-{i}"))
    }

    /// Agent `i`'s simulated GPUs have these faults now (JSON lines in
    /// the API's form; none: every fault cleared).
    pub fn set_gpu_faults(&self, i: usize, findings: &[&str]) {
        let path = self.health_file(i, "faults");
        let fresh = path.with_extension("new");
        std::fs::write(&fresh, findings.iter().map(|f| format!("{f}\n")).collect::<String>()).unwrap();
        std::fs::rename(fresh, path).unwrap();
    }

    /// How many times agent `i` has run its health check (each run comes
    /// with a reading of its GPUs).
    pub fn health_checks(&self, i: usize) -> usize {
        std::fs::read_to_string(self.health_file(i, "runs")).map_or(0, |runs| runs.lines().count())
    }

    /// Agent `i`'s health check fails, printing `output`, or passes (None).
    pub fn fail_health_check(&self, i: usize, output: Option<&str>) {
        let path = self.health_file(i, "check");
        let fresh = path.with_extension("new");
        std::fs::write(&fresh, output.unwrap_or_default()).unwrap();
        std::fs::rename(fresh, path).unwrap();
    }

    /// Agent `i`'s checkpoint root: shared by all, unless each has its own.
    pub fn checkpoint_root(&self, i: usize) -> PathBuf {
        match self.opts.own_checkpoint_roots {
            true => self.dir.join(format!("checkpoints-node-{i}")),
            false => self.dir.join("checkpoints"),
        }
    }

    /// Agent `i` as a simulated fleet: its nodes' attempts are tasks that
    /// do what their `EBB_SIM_*` variables say.
    fn start_simulated_fleet(&mut self, i: usize) {
        let name = format!("node-{i}");
        let child = Command::new(ebb_exe())
            .args(["agent", "--server", &self.url, "--name", &name])
            .args(["--simulate-nodes", &self.opts.simulated_nodes.to_string()])
            .args(&self.opts.agent_args)
            .args(["--join-token-file", self.dir.join("server/join.token").to_str().unwrap()])
            .args(["--fake-gpus", &self.opts.gpus.to_string(), "--gpu-model", self.gpu_model(i)])
            .args(["--data-dir", self.dir.join("agents").join(&name).to_str().unwrap()])
            .args(["--address", "127.0.0.1"])
            .env(AGENT_CANARY, "agent-only")
            .stdout(self.log(&name))
            .stderr(self.log(&name))
            .spawn()
            .unwrap();
        self.agents[i] = Some(child);
    }

    /// Agent `i`'s GPU model.
    fn gpu_model(&self, i: usize) -> &'static str {
        self.gpu_models.get(&i).copied().or(self.opts.gpu_model).unwrap_or(DEFAULT_GPU_MODEL)
    }

    /// Starts one more agent, a real one whatever the options say, with
    /// GPUs of `gpu_model` (a job asking for it runs there), and returns
    /// its index.
    pub fn add_real_agent(&mut self, gpu_model: &'static str) -> usize {
        self.agents.push(None);
        let i = self.agents.len() - 1;
        self.gpu_models.insert(i, gpu_model);
        self.start_agent(i);
        i
    }

    /// The process id of agent `i`.
    pub fn agent_pid(&self, i: usize) -> u32 {
        self.agents[i].as_ref().expect("agent running").id()
    }

    /// Agent `i`'s exit status, once it has exited (it is then gone).
    pub fn agent_exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let status = self.agents[i].as_mut().expect("agent running").try_wait().unwrap()?;
        self.agents[i] = None;
        Some(status)
    }

    pub fn kill_agent(&mut self, i: usize) {
        let mut child = self.agents[i].take().expect("agent running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Freezes (`true`) or thaws an agent: a partition, as far as the
    /// server can tell.
    pub fn freeze_agent(&self, i: usize, frozen: bool) {
        let pid = self.agents[i].as_ref().expect("agent running").id().to_string();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    pub fn wait_nodes_up(&self, n: usize) {
        wait_for("nodes to join", Duration::from_secs(20), || {
            let out = self.ebb_as(&self.admin, &["nodes", "--json"]);
            let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
            (nodes.as_array()?.iter().filter(|n| n["status"] == "up").count() == n).then_some(())
        });
    }

    pub fn ebb_as(&self, token: &str, args: &[&str]) -> Output {
        Command::new(ebb_exe())
            .args(args)
            .current_dir(self.submit_dir())
            .env("EBB_SERVER", &self.url)
            .env("EBB_TOKEN", token)
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    }

    /// Where the tests' CLI runs, and so where jobs run unless they say
    /// otherwise (`ebb submit` takes the submitter's directory): writable
    /// by every tenant's user, as /tmp is.
    pub fn submit_dir(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir.join("submit");
        if !dir.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        }
        dir
    }

    /// Runs a CLI command as the admin and returns its standard output.
    pub fn ebb(&self, args: &[&str]) -> String {
        let out = self.ebb_as(&self.admin, args);
        assert!(out.status.success(), "ebb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn submit_as(&self, token: &str, args: &[&str]) -> u64 {
        let mut full = vec!["submit", "--json"];
        full.extend_from_slice(args);
        let out = self.ebb_as(token, &full);
        assert!(out.status.success(), "submit {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["id"].as_u64().unwrap()
    }

    pub fn submit(&self, args: &[&str]) -> u64 {
        self.submit_as(&self.admin, args)
    }

    pub fn job(&self, id: u64) -> Value {
        serde_json::from_str(&self.ebb(&["show", &id.to_string(), "--json"])).unwrap()
    }

    pub fn jobs(&self) -> Vec<Value> {
        serde_json::from_str::<Value>(&self.ebb(&["jobs", "--json"])).unwrap().as_array().unwrap().clone()
    }

    pub fn wait_job(&self, id: u64, what: &str, timeout: Duration, check: impl Fn(&Value) -> bool) -> Value {
        wait_for(&format!("job {id}: {what}"), timeout, || {
            let job = self.job(id);
            check(&job).then_some(job)
        })
    }

    pub fn wait_state(&self, id: u64, state: &str) -> Value {
        self.wait_job(id, state, Duration::from_secs(30), |j| j["state"] == state)
    }

    /// A preemptible job that records each attempt's pid in its checkpoint
    /// directory and then sleeps.
    pub fn submit_sleeper(&self, gpus: u32) -> u64 {
        let gpus = gpus.to_string();
        let script = r#"echo $$ > "$EBB_CHECKPOINT_DIR/pid-$EBB_ATTEMPT"; exec sleep 600"#;
        self.submit(&["--gpus", &gpus, "--", "bash", "-c", script])
    }

    /// The pid of a sleeper's attempt, once it has started.
    pub fn sleeper_pid(&self, id: u64, attempt: u32) -> i32 {
        let file = self.checkpoints(id).join(format!("pid-{attempt}"));
        wait_for(&format!("job {id} attempt {attempt}'s pid"), Duration::from_secs(20), || {
            std::fs::read_to_string(&file).ok()?.trim().parse().ok()
        })
    }

    /// What the job has printed so far (the server's copy of its output).
    /// Job `id`'s output so far, as `ebb logs` gives it.
    pub fn output(&self, id: u64) -> String {
        self.ebb(&["logs", &id.to_string()])
    }

    /// Job `id`'s checkpoint directory, under its tenant's
    /// (`default` until the job has started).
    pub fn checkpoints(&self, id: u64) -> PathBuf {
        let root = self.dir.join("checkpoints");
        std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|tenant| tenant.path().join(id.to_string()))
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| root.join("default").join(id.to_string()))
    }

    /// The agent's arguments and the join token: what no job may see.
    pub fn join_token(&self) -> String {
        std::fs::read_to_string(self.dir.join("server/join.token")).unwrap().trim().to_string()
    }

    /// No GPU of any node is given to two live attempts.
    pub fn assert_no_double_booking(&self) {
        let mut seen = std::collections::BTreeSet::new();
        for job in self.jobs() {
            for p in job["placement"].as_array().unwrap() {
                for gpu in p["gpus"].as_array().unwrap() {
                    let key = (p["node"].as_str().unwrap().to_string(), gpu.as_u64().unwrap());
                    assert!(seen.insert(key.clone()), "GPU {key:?} held by two attempts");
                }
            }
        }
    }
}

/// `ebb up` stops its cluster on SIGTERM, as on Ctrl-C.
impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix_term(&self.child);
            let _ = self.child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Agents end their jobs on SIGTERM; then the server.
        for child in self.agents.iter_mut().flatten() {
            let _ = nix_term(child);
        }
        for child in self.agents.iter_mut().flatten() {
            let _ = child.wait();
        }
        if let Some(mut server) = self.server.take() {
            let _ = nix_term(&server);
            let _ = server.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("cluster files kept in {}", self.dir.display());
        }
    }
}

fn nix_term(child: &Child) -> std::io::Result<()> {
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().map(|_| ())
}

/// `KEY=value` lines of a file written by `env`.
pub fn read_env(path: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// The job's first event of `kind`.
pub fn event<'a>(job: &'a Value, kind: &str) -> &'a Value {
    job["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == kind)
        .unwrap_or_else(|| panic!("{kind}: {job}"))
}

pub fn events(job: &Value) -> Vec<String> {
    job["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

/// A running `ebb up` on `dir` and what it printed for the user.
pub struct Up {
    pub child: Child,
    pub env: Vec<(String, String)>,
    /// Where its CLI commands run: the directory holding its data dir.
    dir: PathBuf,
    /// What it printed after the export line, as it comes.
    lines: mpsc::Receiver<String>,
}

impl Up {
    pub fn start(dir: &Path) -> Up {
        Up::start_with(dir, 1)
    }

    pub fn start_with(dir: &Path, nodes: u32) -> Up {
        Up::start_args(dir, &["--nodes", &nodes.to_string(), "--gpus-per-node", "2"])
    }

    /// `ebb up` with its defaults (2 nodes x 8 GPUs), as the README runs it.
    pub fn start_default(dir: &Path) -> Up {
        Up::start_args(dir, &[])
    }

    fn start_args(dir: &Path, args: &[&str]) -> Up {
        let mut child = Command::new(ebb_exe())
            .arg("up")
            .args(args)
            .args(["--port", "0", "--data-dir"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        let export = wait_for("ebb up's export line", Duration::from_secs(60), || {
            let line = lines.recv_timeout(Duration::from_millis(100)).ok()?;
            line.trim().strip_prefix("export ").map(str::to_string)
        });
        let env = export
            .split_whitespace()
            .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).unwrap())
            .collect();
        let dir = dir.parent().unwrap_or(Path::new("/")).to_path_buf();
        Up { child, env, dir, lines }
    }

    /// Waits for a line of its output containing `text`.
    pub fn says(&self, text: &str) -> String {
        wait_for(&format!("ebb up to say {text:?}"), Duration::from_secs(10), || {
            self.lines.recv_timeout(Duration::from_millis(100)).ok().filter(|l| l.contains(text))
        })
    }

    pub fn ebb(&self, args: &[&str]) -> std::process::Output {
        Command::new(ebb_exe()).args(args).envs(self.env.clone()).current_dir(&self.dir).output().unwrap()
    }

    /// A job that sleeps, once it runs: its id and pid.
    pub fn sleeper(&self) -> (String, i32) {
        let out = self.ebb(&["submit", "--json", "--", "sleep", "600"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap().to_string();
        let pid = wait_for("the job to start", Duration::from_secs(30), || {
            let shown: Value = serde_json::from_slice(&self.ebb(&["show", &id, "--json"]).stdout).ok()?;
            let events = shown["events"].as_array()?.clone();
            events.iter().find(|e| e["kind"] == "started").and_then(|e| e["detail"]["pid"].as_i64())
        });
        (id, pid as i32)
    }
}
