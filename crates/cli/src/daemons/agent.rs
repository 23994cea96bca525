//! `ebb agent`: its flags, the open-file limit a simulated fleet needs,
//! and the agent started from them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ebb_core::Span;

use super::*;
use crate::error::{given, usage, CliError};

#[derive(Args)]
pub struct AgentArgs {
    /// The server's URL, e.g. http://10.0.0.1:7300, or https://... with
    /// --ca or --ca-fingerprint; or the control plane's servers,
    /// comma-separated: the agent moves to the next when one cannot be
    /// reached or does not answer in time.
    #[arg(long, env = "EBB_SERVER", hide_env_values = true, value_name = "URL[,URL...]")]
    pub server: Option<String>,
    /// For an https:// server: the CA certificate (PEM) its certificate
    /// must be signed by; nothing else is trusted.
    #[arg(long, env = "EBB_CA", value_name = "FILE", conflicts_with = "ca_fingerprint")]
    pub ca: Option<PathBuf>,
    /// For an https:// server that made its own CA (ebb server
    /// --tls-generate): the CA's fingerprint the server printed at start.
    /// The agent fetches the CA from the server, refuses it unless its
    /// SHA-256 is this, keeps it in --data-dir as ca.crt and verifies every
    /// connection with it from then on.
    #[arg(long, env = "EBB_CA_FINGERPRINT", value_name = "sha256:HEX")]
    pub ca_fingerprint: Option<ebb_agent::tls::Fingerprint>,
    /// The join token (or --join-token-file).
    #[arg(long, env = "EBB_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// A file holding the join token (the server writes its join.token);
    /// keeps the token off the command line.
    #[arg(long, value_name = "FILE")]
    pub join_token_file: Option<PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// Simulate N GPUs instead of asking NVML.
    #[arg(long, value_name = "N")]
    pub fake_gpus: Option<u8>,
    /// GPU model of the simulated GPUs.
    #[arg(long, value_name = "M")]
    pub gpu_model: Option<String>,
    /// Label for the node, K=V; repeatable (zone, rack, ...).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Working directories and the agent's state.
    #[arg(long, default_value = "ebb-data/agent")]
    pub data_dir: PathBuf,
    /// Root of the jobs' checkpoint directories: shared storage, unless
    /// the server has a --checkpoint-store (then node-local, and each
    /// job's latest checkpoint is restored into it before an attempt).
    #[arg(long)]
    pub checkpoint_root: Option<PathBuf>,
    /// This agent's credentials for the server's s3:// checkpoint store:
    /// an AWS credentials file (aws_access_key_id, aws_secret_access_key,
    /// optionally aws_session_token). Default: the AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY variables. Jobs never see them.
    #[arg(long, value_name = "FILE")]
    pub checkpoint_store_credentials: Option<PathBuf>,
    /// Where other nodes reach this one, for a gang's MASTER_ADDR
    /// (default: the host name).
    #[arg(long)]
    pub address: Option<String>,
    /// Jobs' PATH (a submission's own PATH wins). Jobs never inherit the
    /// agent's environment.
    #[arg(long, default_value = ebb_agent::identity::DEFAULT_PATH, value_name = "PATH")]
    pub job_path: String,
    /// A variable every job gets (a submission's env wins): K=V; repeatable.
    #[arg(long = "job-env", value_name = "K=V")]
    pub job_env: Vec<String>,
    /// Let a root agent run jobs as root: for a personal cluster only
    /// (`ebb up`). Otherwise a job mapped to root is refused.
    #[arg(long)]
    pub allow_root_jobs: bool,
    /// The uids a root agent runs tenants' jobs as where the server maps
    /// the tenant to no user (--run-as): FIRST-LAST, a tenant's uid being
    /// FIRST plus its number, the same on every node, with a group of the
    /// same number and a home under --data-dir/homes. No account of the
    /// node may have one (a start that would is refused).
    #[arg(long, default_value = ebb_agent::identity::DEFAULT_TENANT_UIDS, value_name = "FIRST-LAST",
          value_parser = ebb_agent::identity::parse_uid_range)]
    pub tenant_uids: std::ops::RangeInclusive<u32>,
    /// How long a finished attempt's run and default working directories
    /// are kept (checkpoints are never removed).
    #[arg(long, default_value = "24h", value_parser = parse_span)]
    pub attempt_retention: Span,
    /// Leave the cgroup v2 mount as it is. By default a root agent adds
    /// `favordynmods` to it (Linux 6.0+), so that a process joins its
    /// attempt's group without waiting ~10 ms for an RCU grace period.
    #[arg(long)]
    pub keep_cgroup_mount: bool,
    /// The most one checkpoint of a job may hold when it is stored in the
    /// cluster's checkpoint store, counting each file at its size (a
    /// sparse file is stored whole); a larger one is not stored, and the
    /// job's log says so (0: no limit).
    #[arg(long, value_name = "BYTES", default_value = "256GiB", value_parser = ebb_agent::output::parse_bytes)]
    pub max_checkpoint_bytes: u64,
    /// The OCI runtime that runs jobs in images: a path, or a name looked
    /// up in PATH. runc (1.1 and later) works on unified and hybrid cgroup
    /// hosts; crun 1.8 refuses hybrid ones.
    #[arg(long, value_name = "PATH", default_value = "runc")]
    pub oci_runtime: PathBuf,
    /// Disk the node's image cache may use (<data-dir>/images): past it,
    /// the least recently used images no attempt holds are removed.
    #[arg(long, value_name = "BYTES", default_value = "100GiB", value_parser = ebb_agent::output::parse_bytes)]
    pub image_cache_size: u64,
    /// The most a layer of an image may grow as it is unpacked, as a
    /// multiple of its compressed size (layers that unpack to under 16 MiB
    /// are not held to it): a decompression bomb stops there, with an
    /// error that names the image, before it fills the cache.
    #[arg(long, value_name = "RATIO", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub image_max_expansion: u64,
    /// How long one image's pull (download and unpack) may take: a pull
    /// holds its attempt's GPUs and is not billed, so one past this is
    /// given up and the attempt ends without starting.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = parse_span)]
    pub pull_timeout: Span,
    /// The least a pull must download a second, averaged over 30 s; a
    /// registry slower than this is given up (0: no floor).
    #[arg(long, value_name = "BYTES", default_value = "512KiB", value_parser = ebb_agent::output::parse_bytes)]
    pub pull_min_speed: u64,
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// The node's CDI spec for its GPUs, as `nvidia-ctk cdi generate
    /// --format=json` writes it: jobs in images get exactly their GPUs'
    /// device nodes, and the driver's libraries, from it. Default:
    /// /etc/cdi/nvidia.json where it exists; without one, containers get
    /// their GPUs' variables only (simulated GPUs).
    #[arg(long, value_name = "FILE")]
    pub cdi_spec: Option<PathBuf>,
    /// Output one attempt may send (0: no limit); the rest is read and
    /// dropped, with a line in its log saying so.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = ebb_agent::output::parse_bytes)]
    pub max_output_per_attempt: u64,
    /// Output one attempt may send per second, sustained (0: no limit);
    /// output over it is dropped, with a line in its log saying so.
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = ebb_agent::output::parse_bytes)]
    pub output_rate: u64,
    /// Output one attempt may send at once above --output-rate.
    #[arg(long, value_name = "BYTES", default_value = "4MiB", value_parser = ebb_agent::output::parse_bytes)]
    pub output_burst: u64,
    /// Output the agent holds while the server has not taken it, across
    /// attempts (0: no limit); when full, output is dropped, with a line
    /// in each log saying so.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = ebb_agent::output::parse_bytes)]
    pub output_buffer: u64,
    /// How long reports may keep failing before the node tells the server
    /// it is unhealthy (it then gets no new work until they get through).
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub unhealthy_after: Span,
    /// At SIGTERM (systemctl stop), the longest the agent waits for its
    /// attempts to end. The node drains first: preemptible jobs get their
    /// notice and drain window to save and are requeued, and nothing new
    /// is placed here; on-demand jobs may run to their end within this
    /// time. What still runs then is ended (SIGTERM, SIGKILL 3 s later) and
    /// requeued, not failed. A second SIGTERM or Ctrl-C ends it at once.
    /// The node takes work again when the agent starts. At most 24h. Keep
    /// systemd's TimeoutStopSec above it (deploy/ebb-agent.service: 6m30s).
    #[arg(long, default_value = "6m", value_parser = parse_span)]
    pub stop_timeout: Span,
    /// Run N simulated nodes in this one process (1 to 100000), to
    /// measure a server with a fleet a small machine could not otherwise
    /// hold; needs --fake-gpus and --gpu-model.
    ///
    /// Each registers as NAME-00000, NAME-00001, ... (NAME: --name or the
    /// host name) with --fake-gpus GPUs of --gpu-model and the --label
    /// labels, keeps its credential in --data-dir/nodes/NAME-i, and
    /// follows its command stream and reports as an agent does. Its
    /// attempts are not processes: each does what its job's environment
    /// says. EBB_SIM_DURATION: runs this long, then exits 0, complete
    /// (absent: until stopped). EBB_SIM_CHECKPOINT: reports a checkpoint
    /// every interval. EBB_SIM_SAVE: at its signal, saves this long,
    /// reports a checkpoint and exits 0. EBB_SIM_IGNORE_NOTICE=1: ignores
    /// its signal, so SIGKILL at the deadline ends it. Durations are
    /// seconds (2.5) or spans (90s, 5m). --checkpoint-root is refused
    /// (simulated jobs write no files). See docs/simulated-fleet.md.
    #[arg(long, value_name = "N")]
    pub simulate_nodes: Option<u32>,
    /// The operator's own health check, run with `sh -c` before the node
    /// takes work and every --health-interval (e.g. `dcgmi diag -r 1`).
    /// A non-zero exit takes out the GPUs it names on lines of their own
    /// (`gpu 3` or `gpu 3: why`), or drains the node when it names none.
    #[arg(long, value_name = "CMD")]
    pub health_check: Option<String>,
    /// How often the GPUs' health (NVML: Xid events, ECC errors, retired
    /// pages and remapped rows, throttling, temperature, NVLinks) is read
    /// and the --health-check run. Xid events are seen at once.
    #[arg(long, default_value = "30s", value_parser = parse_span)]
    pub health_interval: Span,
    /// How long --health-check may run before it counts as failed.
    #[arg(long, default_value = "10m", value_parser = parse_span)]
    pub health_check_timeout: Span,
    /// With --fake-gpus: the simulated GPUs' faults, a file of findings
    /// read at every --health-interval, one JSON object a line in the
    /// API's form, e.g. {"gpu":3,"kind":"xid","code":79}; a line removed
    /// clears its finding. See docs/health.md.
    #[arg(long, value_name = "FILE", requires = "fake_gpus")]
    pub fake_gpu_faults: Option<PathBuf>,
    /// Print the GPUs NVML finds and what their health readings would
    /// report, then exit (scripts/gpu-check).
    #[arg(long, conflicts_with_all = ["fake_gpus", "simulate_nodes"])]
    pub check_gpus: bool,
}

/// The most nodes one `ebb agent --simulate-nodes` runs.
const MAX_SIMULATED_NODES: u32 = 100_000;

/// The longest `--stop-timeout`: a day.
const MAX_STOP_TIMEOUT: Span = Span(86_400_000);

/// Descriptors an agent or server needs beyond one per connection (its
/// files, its listeners, the runtime's own).
const SPARE_FILES: u64 = 256;

/// Refuses `--simulate-nodes n` that the agent's flags or the open-file
/// limit `files` cannot hold.
fn check_simulated_fleet(n: u32, args: &AgentArgs, files: u64) -> Result<(), CliError> {
    if !(1..=MAX_SIMULATED_NODES).contains(&n) {
        return Err(usage(format!("--simulate-nodes {n}: from 1 to {MAX_SIMULATED_NODES}")));
    }
    if args.fake_gpus.is_none() {
        return Err(usage(format!(
            "--simulate-nodes {n} needs --fake-gpus N --gpu-model M: simulated nodes have no GPUs to discover"
        )));
    }
    if args.checkpoint_root.is_some() {
        return Err(usage(format!(
            "--simulate-nodes {n} with --checkpoint-root: simulated jobs write no files, checkpoints \
             included (they are reports to the server only)"
        )));
    }
    // Each node's command poll holds a socket for as long as it waits.
    let needed = u64::from(n) + SPARE_FILES;
    if needed > files {
        return Err(usage(format!(
            "--simulate-nodes {n}: the open-file limit is {files}, and {n} nodes need {needed} (a socket \
             each for its command poll, and some to spare); raise it (ulimit -n {}, or LimitNOFILE= for \
             a systemd unit) or simulate fewer nodes",
            2 * u64::from(n) + SPARE_FILES
        )));
    }
    // What is left is the reports' to share (the fleet logs how many).
    Ok(())
}

pub async fn agent(args: AgentArgs) -> Result<(), CliError> {
    if args.check_gpus {
        return check_gpus();
    }
    if args.health_interval.as_millis() == 0 {
        return Err(usage("--health-interval must be more than 0"));
    }
    if args.stop_timeout.as_millis() > MAX_STOP_TIMEOUT.as_millis() {
        return Err(usage(format!(
            "--stop-timeout {}: at most {} (to wait for on-demand jobs however long, drain the node \
             first: ebb drain NODE)",
            args.stop_timeout.human(),
            MAX_STOP_TIMEOUT.human()
        )));
    }
    let files = raise_open_files();
    if let Some(n) = args.simulate_nodes {
        check_simulated_fleet(n, &args, files)?;
    }
    let server =
        args.server.clone().ok_or_else(|| usage("no server: pass --server URL or set EBB_SERVER"))?;
    for url in server.split(',').map(str::trim) {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(usage(format!(
                "--server {url:?}: a URL, e.g. http://10.0.0.1:7300 (several: comma-separated)"
            )));
        }
    }
    let join_token = match (&args.join_token, &args.join_token_file) {
        (Some(token), _) => token.clone(),
        (None, Some(path)) => std::fs::read_to_string(path).map_err(given("--join-token-file", path))?,
        (None, None) => return Err(usage("no join token: pass --join-token or --join-token-file")),
    };
    let gpus = match (args.fake_gpus, &args.gpu_model) {
        (Some(0), _) => return Err(usage("--fake-gpus must be at least 1")),
        (Some(n), Some(model)) => ebb_agent::gpus::Gpus::simulated(n, model),
        (Some(_), None) => return Err(usage("--fake-gpus needs --gpu-model M")),
        (None, _) => ebb_agent::gpus::discover()?,
    };
    let hostname = || -> Result<String, CliError> {
        let name =
            nix::unistd::gethostname().map_err(|e| usage(format!("the host's name: {e} (pass --name)")))?;
        Ok(name.to_string_lossy().into_owned())
    };
    let name = match args.name {
        Some(name) => name,
        None => hostname()?,
    };
    let address = match args.address {
        Some(address) => address,
        None => hostname()?,
    };
    let pairs = |flag: &str, list: &[String]| -> Result<BTreeMap<String, String>, CliError> {
        list.iter()
            .map(|pair| {
                let (k, v) =
                    pair.split_once('=').ok_or_else(|| usage(format!("{flag} {pair}: expected K=V")))?;
                Ok((k.to_string(), v.to_string()))
            })
            .collect()
    };
    let labels = pairs("--label", &args.labels)?;
    let job_env = pairs("--job-env", &args.job_env)?;
    let checkpoint_root = args.checkpoint_root.unwrap_or_else(|| args.data_dir.join("checkpoints"));
    // Before the agent kills what it finds in its ledger as left over.
    let _owner = ebb_server::lock::lock_dir(&args.data_dir, "ebb agent")?;
    if args.pull_timeout.as_millis() < 1000 {
        return Err(usage(format!("--pull-timeout {}: at least 1s", args.pull_timeout.human())));
    }
    let config = ebb_agent::AgentConfig {
        server,
        join_token: join_token.trim().to_string(),
        ca: args.ca,
        ca_fingerprint: args.ca_fingerprint,
        name,
        gpus: gpus.count,
        gpu_minors: gpus.minors,
        gpu_model: gpus.model,
        labels,
        data_dir: args.data_dir,
        checkpoint_root,
        address,
        job_path: args.job_path,
        job_env,
        allow_root_jobs: args.allow_root_jobs,
        tenant_uids: args.tenant_uids,
        max_checkpoint_bytes: args.max_checkpoint_bytes,
        images: ebb_agent::ImageConfig {
            runtime: args.oci_runtime,
            cache: ebb_image::Limits {
                max_expansion: args.image_max_expansion,
                ..ebb_image::Limits::within(args.image_cache_size)
            },
            pull: ebb_agent::PullLimits {
                timeout: std::time::Duration::from_millis(args.pull_timeout.as_millis()),
                min_bytes_per_s: args.pull_min_speed,
                ..ebb_agent::PullLimits::default()
            },
            registries: args.registries.registries(),
        },
        cdi_spec: args.cdi_spec.or_else(|| {
            let default = PathBuf::from("/etc/cdi/nvidia.json");
            default.is_file().then_some(default)
        }),
        attempt_retention: Duration::from_millis(args.attempt_retention.as_millis()),
        keep_cgroup_mount: args.keep_cgroup_mount,
        output: ebb_agent::OutputLimits {
            max_per_attempt: args.max_output_per_attempt,
            rate: args.output_rate,
            burst: args.output_burst,
            buffer: args.output_buffer,
        },
        unhealthy_after: std::time::Duration::from_millis(args.unhealthy_after.as_millis()),
        checkpoint_credentials: ebb_checkpoints::Credentials::load(
            "--checkpoint-store-credentials",
            args.checkpoint_store_credentials.as_deref(),
        )?,
        health: ebb_agent::health::HealthConfig {
            interval: Duration::from_millis(args.health_interval.as_millis()),
            check: args.health_check,
            check_timeout: Duration::from_millis(args.health_check_timeout.as_millis()),
            fake_faults: args.fake_gpu_faults,
        },
        real_gpus: args.fake_gpus.is_none(),
        stop_timeout: Duration::from_millis(args.stop_timeout.as_millis()),
    };
    let ran = match args.simulate_nodes {
        Some(n) => ebb_agent::simulate(config, n, files).await,
        None => ebb_agent::run(config).await,
    };
    Ok(ran?)
}

/// `ebb agent --check-gpus`: what discovery finds and what the health
/// readings would report now, in words and as the agent sends them.
fn check_gpus() -> Result<(), CliError> {
    let gpus = ebb_agent::gpus::discover()?;
    println!("{} x {}", gpus.count, gpus.model);
    let readings = ebb_agent::gpus::NvmlReadings::open()?;
    for line in readings.describe() {
        println!("  {line}");
    }
    let findings = readings.read();
    if findings.is_empty() {
        println!("health: nothing found wrong");
    }
    for f in &findings {
        println!("health: {} ({})", f.describe(), f.class().name());
    }
    let event = ebb_api::AgentEvent::Health {
        findings,
        at_ms: ebb_core::time::unix_ms(std::time::SystemTime::now()),
    };
    println!("{}", serde_json::to_string(&event).expect("an event is JSON"));
    Ok(())
}
