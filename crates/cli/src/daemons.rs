//! `ebb server`, `ebb agent` and `ebb up` (a server and agents with
//! simulated GPUs on loopback, in the foreground).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use ebb_core::Span;
use ebb_server::Limits;

fn parse_span(text: &str) -> Result<Span, String> {
    Span::parse(text)
}

#[derive(Args)]
pub struct ServerArgs {
    /// Where the database, tokens and job output live.
    #[arg(long, default_value = "ebb-data/server")]
    pub data_dir: PathBuf,
    /// Keep the state in PostgreSQL instead of the embedded SQLite file:
    /// postgres://USER@HOST/DB, or host=/socket/dir user=U dbname=DB.
    /// Several servers may share one database: one leads, the others
    /// forward to it and take over when it fails. From EBB_DATABASE if not
    /// given, which keeps a password off the command line.
    #[arg(long, env = "EBB_DATABASE", hide_env_values = true, value_name = "URL")]
    pub database: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub listen: std::net::SocketAddr,
    /// With --database: the URL other servers and clients reach this one
    /// at (default: http://LISTEN).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// With --database: a leader that has not renewed its lease for this
    /// long (frozen, or cut off from the database) is replaced. A leader
    /// whose process dies is replaced at once. Default 5s.
    #[arg(long, value_parser = parse_span)]
    pub lease: Option<Span>,
    /// Notice to forced kill for every drain: 300, 300s, 5m.
    #[arg(long, default_value = "300s", value_parser = parse_span)]
    pub drain_window: Span,
    /// A job preempted before is not chosen as a victim again until its new
    /// attempt has run this long, while other victims would do (it is
    /// still chosen when nothing else makes room); 0 turns this off. At
    /// most 24h.
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    pub min_runtime: Span,
    /// A node silent this long is lost; its jobs are requeued.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub heartbeat_timeout: Span,
    /// How often agents check in.
    #[arg(long, default_value = "1s", value_parser = parse_span)]
    pub heartbeat_interval: Span,
    /// How long a finished job's record stays in the server's memory; after
    /// that it is read from the database when asked for (show, logs,
    /// listing, bills: nothing changes for users). 0 drops it at once. At
    /// most 168h.
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    pub keep_finished: Span,
    /// A request's head (its line and headers) must arrive within this
    /// once a connection is ready for it; also how long an idle
    /// connection stays open. A request being answered (an agent's long
    /// poll, the dashboard's stream) is not idle.
    #[arg(long, default_value = "30s", value_parser = parse_span)]
    pub header_read_timeout: Span,
    /// Connections open at once from one client address; more are closed
    /// as they come. Each agent holds two or three; raise it for many
    /// nodes behind one address (a simulated fleet: 0, no bound).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_connections_per_address: usize,
    /// A file holding a token that may read /metrics and nothing else, for
    /// a Prometheus server (its scrape config's `authorization` with
    /// `credentials_file`); /metrics takes an operator's token too, and no
    /// other. The file should be the server's alone (0600).
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// When one node's part of a gang exits 0, how long the other parts
    /// may run on before they are stopped and the attempt fails. A gang
    /// ends when all its parts have exited; a part that fails stops the
    /// others at once.
    #[arg(long, default_value = "10m", value_parser = parse_span)]
    pub gang_exit_grace: Span,
    /// How far ahead of the server's clock a node's event times may be;
    /// a report stamped later is refused. Times are clamped to the
    /// server's now in any case.
    #[arg(long, default_value = "5s", value_parser = parse_span)]
    pub max_clock_skew: Span,
    /// On-demand price of a GPU model, dollars per GPU-hour: MODEL=USD;
    /// repeatable. Replaces the stored price at start.
    #[arg(long = "price", value_name = "MODEL=USD")]
    pub prices: Vec<String>,
    /// Reserved contract rate of a GPU model: MODEL=USD; repeatable
    /// (default: its on-demand price).
    #[arg(long = "reserved-price", value_name = "MODEL=USD")]
    pub reserved_prices: Vec<String>,
    /// On-demand price of a model that joins without one.
    #[arg(long, default_value = "2.00", value_name = "USD")]
    pub default_price: String,
    /// The preemptible discount off on-demand, percent (fixed; never a bid).
    #[arg(long, default_value_t = 50.0, value_name = "PERCENT")]
    pub preemptible_discount: f64,
    /// The Unix user that runs a tenant's jobs on the nodes: TENANT=USER;
    /// repeatable.
    #[arg(long = "run-as", value_name = "TENANT=USER")]
    pub run_as: Vec<String>,
    /// The Unix user that runs the jobs of tenants no --run-as names.
    /// Default: none; each such tenant runs as a uid of its own, which
    /// every root agent allocates from its --tenant-uids range. Naming a
    /// user here makes those tenants share it, and so each other's
    /// processes, environments and files.
    #[arg(long, value_name = "USER")]
    pub default_run_as: Option<String>,
    /// Tenants whose jobs must run in an image (ebb submit --image):
    /// `all`, or a comma-separated list. A job without one is refused at
    /// submit.
    #[arg(long, value_name = "all|TENANT,...")]
    pub require_image: Option<String>,
    /// Tenants whose jobs may run as root (uid 0) inside their image,
    /// comma-separated; everyone else's run as the tenant's user there.
    /// Root in an image is root on the node, less the capabilities the
    /// runtime drops: allow it only for tenants you trust with the node.
    #[arg(long, value_name = "TENANT,...", value_delimiter = ',')]
    pub image_root: Vec<String>,
    #[command(flatten)]
    pub registries: RegistryArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub checkpoint_store: CheckpointStoreArgs,
}

/// How image registries are reached, by the server (to resolve a tag at
/// submit) and the agents (to pull).
#[derive(Args, Clone)]
pub struct RegistryArgs {
    /// A registry (HOST:PORT, as image references begin) reached over
    /// plain HTTP rather than HTTPS: one on loopback or a trusted network.
    /// Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure: Vec<String>,
    /// The only registries images may come from (HOST[:PORT]); repeatable.
    /// Without it, a job may name any registry, and the server and nodes
    /// connect wherever a tenant's image reference points.
    #[arg(long = "allowed-registry", value_name = "HOST[:PORT]")]
    pub allowed: Vec<String>,
}

impl RegistryArgs {
    pub fn registries(&self) -> ebb_image::Registries {
        // A registry reached over plain HTTP is one the operator chose.
        let allowed = match self.allowed.is_empty() {
            true => Vec::new(),
            false => self.allowed.iter().chain(&self.insecure).cloned().collect(),
        };
        ebb_image::Registries { insecure: self.insecure.clone(), allowed }
    }
}

/// Where jobs' checkpoints are kept between attempts, so that a job
/// resumes on any node without storage shared by the nodes.
#[derive(Args)]
pub struct CheckpointStoreArgs {
    /// Keep jobs' checkpoints in this store: s3://BUCKET/PREFIX (AWS or
    /// any S3-compatible service) or file:///PATH (a directory every node
    /// sees). Agents are told it when they register; each uploads a job's
    /// checkpoint directory after each checkpoint the job reports and
    /// restores the latest before the job's next attempt, on any node.
    /// Checked at start. Without it, --checkpoint-root is shared storage.
    #[arg(long, value_name = "URL")]
    pub checkpoint_store: Option<String>,
    /// The S3-compatible service's URL, e.g. https://minio.internal:9000
    /// (default: AWS's own for the region).
    #[arg(long, value_name = "URL", requires = "checkpoint_store")]
    pub checkpoint_store_endpoint: Option<String>,
    /// The S3 region (default us-east-1).
    #[arg(long, value_name = "REGION", requires = "checkpoint_store")]
    pub checkpoint_store_region: Option<String>,
    /// The server's credentials for an s3:// store, to check it at start:
    /// an AWS credentials file (aws_access_key_id, aws_secret_access_key,
    /// optionally aws_session_token). Default: the AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY variables. Never sent to agents: each has its
    /// own.
    #[arg(long, value_name = "FILE", requires = "checkpoint_store")]
    pub checkpoint_store_credentials: Option<PathBuf>,
}

impl CheckpointStoreArgs {
    /// The store's location, once it has answered with the server's
    /// credentials: a wrong URL, a missing bucket or an endpoint that does
    /// not answer stops the server at start, naming the flag.
    async fn checked(&self) -> Result<Option<ebb_api::CheckpointStoreLocation>, String> {
        let Some(url) = &self.checkpoint_store else { return Ok(None) };
        let location = ebb_api::CheckpointStoreLocation {
            url: url.trim().to_string(),
            endpoint: self.checkpoint_store_endpoint.clone(),
            region: self.checkpoint_store_region.clone(),
        };
        let credentials = ebb_checkpoints::Credentials::load(
            "--checkpoint-store-credentials",
            self.checkpoint_store_credentials.as_deref(),
        )
        .map_err(|e| e.to_string())?;
        let store =
            ebb_checkpoints::Store::open(&location, credentials.as_ref()).map_err(|e| e.to_string())?;
        store.check(Duration::from_secs(15)).await.map_err(|e| {
            let at = location.endpoint.as_deref().map_or(String::new(), |e| format!(" at {e}"));
            format!("--checkpoint-store {url}{at}: {e}")
        })?;
        eprintln!("ebb server: jobs' checkpoints are kept in {url}");
        Ok(Some(location))
    }
}

/// HTTPS, for agents and users on other hosts. Plain HTTP without these.
#[derive(Args)]
pub struct TlsArgs {
    /// Serve HTTPS with this certificate, PEM (a chain is fine: the
    /// server's first). Agents verify it with --ca FILE, or with
    /// --ca-fingerprint if the CA's certificate is in --data-dir as ca.crt.
    #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with = "tls_generate")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve HTTPS with a certificate of the server's own: on first start
    /// it makes a CA in --data-dir (ca.crt, ca.key) and a certificate it
    /// signs (tls.crt, tls.key) for the listen address, localhost,
    /// 127.0.0.1, the host name and each --tls-san, re-issued when those
    /// change. A CA already there is used instead: copy ca.crt and ca.key
    /// from another server so that the servers of one control plane share
    /// one CA. Prints the CA's fingerprint for agents' --ca-fingerprint.
    #[arg(long)]
    pub tls_generate: bool,
    /// Another name or IP address agents and users reach the server by,
    /// for --tls-generate's certificate; repeatable.
    #[arg(long = "tls-san", value_name = "NAME_OR_IP", requires = "tls_generate")]
    pub tls_sans: Vec<String>,
}

impl TlsArgs {
    fn config(&self) -> ebb_server::tls::TlsConfig {
        use ebb_server::tls::TlsConfig;
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => TlsConfig::Files { cert: cert.clone(), key: key.clone() },
            _ if self.tls_generate => TlsConfig::Generate { extra_names: self.tls_sans.clone() },
            _ => TlsConfig::Off,
        }
    }
}

/// What one submission may carry and one tenant may have.
#[derive(Args)]
pub struct LimitArgs {
    /// One argument or one KEY=VALUE of a job's environment, bytes with its
    /// NUL (Linux refuses more than 131072 at exec).
    #[arg(long, default_value_t = Limits::default().max_argument_bytes, value_name = "BYTES")]
    pub max_argument_bytes: u64,
    /// A job's arguments and environment together, bytes.
    #[arg(long, default_value_t = Limits::default().max_command_bytes, value_name = "BYTES")]
    pub max_command_bytes: u64,
    /// Tasks of one array or sweep.
    #[arg(long, default_value_t = Limits::default().max_array_tasks, value_name = "N")]
    pub max_array_tasks: u64,
    /// A tenant's unfinished jobs (queued, waiting or running).
    #[arg(long, default_value_t = Limits::default().max_jobs, value_name = "N")]
    pub max_jobs_per_tenant: u64,
    /// What a tenant's unfinished jobs' arguments and environments may
    /// take in the server, bytes.
    #[arg(long, default_value_t = Limits::default().max_stored_bytes, value_name = "BYTES")]
    pub max_stored_bytes_per_tenant: u64,
    /// A tenant's jobs admitted to the scheduler at once (running or queued
    /// for GPUs); the rest wait their turn.
    #[arg(long, default_value_t = Limits::default().max_running_jobs, value_name = "N")]
    pub max_running_jobs: u64,
}

impl LimitArgs {
    fn limits(&self) -> Result<Limits, String> {
        let limits = Limits {
            max_argument_bytes: self.max_argument_bytes,
            max_command_bytes: self.max_command_bytes,
            max_array_tasks: self.max_array_tasks,
            max_jobs: self.max_jobs_per_tenant,
            max_stored_bytes: self.max_stored_bytes_per_tenant,
            max_running_jobs: self.max_running_jobs,
        };
        for (flag, value) in [
            ("--max-argument-bytes", limits.max_argument_bytes),
            ("--max-command-bytes", limits.max_command_bytes),
            ("--max-array-tasks", limits.max_array_tasks),
            ("--max-jobs-per-tenant", limits.max_jobs),
            ("--max-stored-bytes-per-tenant", limits.max_stored_bytes),
            ("--max-running-jobs", limits.max_running_jobs),
        ] {
            if value == 0 {
                return Err(format!("{flag}: must be at least 1"));
            }
        }
        if limits.max_argument_bytes > 128 * 1024 {
            return Err(format!(
                "--max-argument-bytes {}: Linux refuses a single argument over 131072 bytes at exec",
                limits.max_argument_bytes
            ));
        }
        Ok(limits)
    }
}

/// `--run-as TENANT=USER` flags and the default user, each checked.
fn run_as_flags(pairs: &[String], default: Option<&str>) -> Result<ebb_server::RunAs, String> {
    let mut by_tenant = BTreeMap::new();
    for pair in pairs {
        let (tenant, user) = pair
            .split_once('=')
            .filter(|(t, u)| !t.is_empty() && !u.is_empty())
            .ok_or_else(|| format!("--run-as {pair}: expected TENANT=USER"))?;
        if by_tenant.insert(tenant.to_string(), user.to_string()).is_some() {
            return Err(format!("--run-as {pair}: tenant {tenant} is mapped twice"));
        }
    }
    if default.is_some_and(str::is_empty) {
        return Err("--default-run-as: a user name".into());
    }
    Ok(ebb_server::RunAs { by_tenant, default: default.map(str::to_string) })
}

/// `--price MODEL=USD` flags to micro-dollars, each checked.
fn price_flags(flag: &str, pairs: &[String], discount_bps: u32) -> Result<Vec<(String, i64)>, String> {
    pairs
        .iter()
        .map(|pair| {
            let (model, usd) =
                pair.split_once('=').ok_or_else(|| format!("{flag} {pair}: expected MODEL=USD"))?;
            let micro = ebb_server::billing::parse_price(flag, usd, discount_bps).map_err(|e| e.message)?;
            Ok((model.to_string(), micro))
        })
        .collect()
}

/// The longest `--min-runtime`: a day. Longer would spare a job preempted
/// before for most of its life, which is no longer a rule against thrash
/// (and most likely a slip of the unit).
const MAX_MIN_RUNTIME: Span = Span(24 * 3_600_000);

/// The longest `--keep-finished`: a week. Memory grows with the jobs that
/// finish within it, and the database answers for them as well after it.
const MAX_KEEP_FINISHED: Span = Span(7 * 24 * 3_600_000);

fn check_keep_finished(keep: Span) -> Result<(), String> {
    if keep > MAX_KEEP_FINISHED {
        return Err(format!(
            "--keep-finished {}: at most 168h, a week (finished jobs are read from the database after it; 0 drops \
             them from memory at once)",
            keep.human()
        ));
    }
    Ok(())
}

fn check_min_runtime(min_runtime: Span) -> Result<(), String> {
    if min_runtime > MAX_MIN_RUNTIME {
        return Err(format!("--min-runtime {}: at most 24h (0 turns the rule off)", min_runtime.human()));
    }
    Ok(())
}

pub async fn server(args: ServerArgs) -> Result<(), String> {
    raise_open_files();
    let discount = args.preemptible_discount;
    if !(0.0..100.0).contains(&discount) || (discount * 100.0).fract() != 0.0 {
        return Err(format!(
            "--preemptible-discount {discount}: a percentage from 0 to below 100, at most two decimals"
        ));
    }
    let discount_bps = (discount * 100.0) as u32;
    let (interval, timeout) = (args.heartbeat_interval, args.heartbeat_timeout);
    if interval.as_millis() == 0 {
        return Err(format!("--heartbeat-interval {}: more than 0", interval.human()));
    }
    if timeout.as_millis() < 2 * interval.as_millis() {
        return Err(format!(
            "--heartbeat-timeout {} with --heartbeat-interval {}: the timeout must be at least twice the \
             interval, or a node that misses one check-in is lost (e.g. --heartbeat-timeout {})",
            timeout.human(),
            interval.human(),
            Span::from_millis(interval.as_millis() * 3).human()
        ));
    }
    check_min_runtime(args.min_runtime)?;
    check_keep_finished(args.keep_finished)?;
    let on_demand = price_flags("--price", &args.prices, discount_bps)?;
    let reserved = price_flags("--reserved-price", &args.reserved_prices, discount_bps)?;
    if let Some((model, _)) = reserved.iter().find(|(m, _)| !on_demand.iter().any(|(o, _)| o == m)) {
        return Err(format!(
            "--reserved-price {model}=...: give its on-demand price too (--price {model}=USD)"
        ));
    }
    let prices = on_demand
        .into_iter()
        .map(|(model, price)| {
            let r = reserved.iter().find(|(m, _)| *m == model).map(|(_, p)| *p);
            (model, price, r)
        })
        .collect();
    let default_price =
        ebb_server::billing::parse_price("--default-price", &args.default_price, discount_bps)
            .map_err(|e| e.message)?;
    let run_as = run_as_flags(&args.run_as, args.default_run_as.as_deref())?;
    if args.database.is_none() {
        for (flag, given) in [("--advertise", args.advertise.is_some()), ("--lease", args.lease.is_some())] {
            if given {
                return Err(format!(
                    "{flag}: only with --database (servers sharing a PostgreSQL database); \
                     a server on its embedded database is alone"
                ));
            }
        }
    }
    if !(100..=3_600_000).contains(&args.header_read_timeout.as_millis()) {
        return Err(format!("--header-read-timeout {}: from 100ms to 1h", args.header_read_timeout.human()));
    }
    let metrics_token = match &args.metrics_token_file {
        None => None,
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .map_err(|e| format!("--metrics-token-file {}: {e}", path.display()))?;
            let token = token.trim().to_string();
            if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "--metrics-token-file {}: a token of at least 16 characters on one line, no spaces",
                    path.display()
                ));
            }
            Some(token)
        }
    };
    let lease = args.lease.unwrap_or(Span::from_secs(5));
    if !(500..=600_000).contains(&lease.as_millis()) {
        return Err(format!("--lease {}: from 500ms to 10m", lease.human()));
    }
    if let Some(url) = &args.advertise {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("--advertise {url}: a URL, e.g. http://10.0.0.2:7300"));
        }
    }
    let engine = ebb_server::EngineConfig {
        data_dir: args.data_dir,
        drain_window: args.drain_window,
        min_runtime: args.min_runtime,
        heartbeat_timeout: args.heartbeat_timeout,
        heartbeat_interval: args.heartbeat_interval,
        keep_finished: args.keep_finished,
        max_clock_skew: args.max_clock_skew,
        gang_exit_grace: args.gang_exit_grace,
        pricing: ebb_server::billing::Pricing { prices, default_price, discount_bps },
        limits: args.limits.limits()?,
        run_as,
        checkpoint_store: args.checkpoint_store.checked().await?,
        images: ebb_server::Images {
            required: match args.require_image.as_deref().map(str::trim) {
                None | Some("") => ebb_server::Required::Nobody,
                Some("all") => ebb_server::Required::Everyone,
                Some(list) => ebb_server::Required::Tenants(
                    list.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect(),
                ),
            },
            root: args.image_root.iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect(),
        },
    };
    ebb_server::serve(ebb_server::ServerConfig {
        engine,
        database: args.database,
        listen: args.listen,
        advertise: args.advertise,
        lease: Duration::from_millis(lease.as_millis()),
        tls: args.tls.config(),
        connections: ebb_http::Limits {
            header_read_timeout: Duration::from_millis(args.header_read_timeout.as_millis()),
            per_address: args.max_connections_per_address,
            total: 0,
        },
        metrics_token,
        registries: args.registries.registries(),
    })
    .await
}

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
}

/// The most nodes one `ebb agent --simulate-nodes` runs.
const MAX_SIMULATED_NODES: u32 = 100_000;

/// Descriptors an agent or server needs beyond one per connection (its
/// files, its listeners, the runtime's own).
const SPARE_FILES: u64 = 256;

/// Raises this process's open-file soft limit to its hard limit: every
/// node's command poll is a socket on both sides, so a server with ten
/// thousand nodes holds ten thousand. Returns the limit now in force.
fn raise_open_files() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!("cannot read the open-file limit: {e}");
            return 1024;
        }
    };
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
            return soft;
        }
    }
    tracing::info!("open-file limit: {hard} (the hard limit; ulimit -Hn raises it)");
    hard
}

/// Refuses `--simulate-nodes n` that the agent's flags or the open-file
/// limit `files` cannot hold.
fn check_simulated_fleet(n: u32, args: &AgentArgs, files: u64) -> Result<(), String> {
    if !(1..=MAX_SIMULATED_NODES).contains(&n) {
        return Err(format!("--simulate-nodes {n}: from 1 to {MAX_SIMULATED_NODES}"));
    }
    if args.fake_gpus.is_none() {
        return Err(format!(
            "--simulate-nodes {n} needs --fake-gpus N --gpu-model M: simulated nodes have no GPUs to discover"
        ));
    }
    if args.checkpoint_root.is_some() {
        return Err(format!(
            "--simulate-nodes {n} with --checkpoint-root: simulated jobs write no files, checkpoints \
             included (they are reports to the server only)"
        ));
    }
    // Each node's command poll holds a socket for as long as it waits.
    let needed = u64::from(n) + SPARE_FILES;
    if needed > files {
        return Err(format!(
            "--simulate-nodes {n}: the open-file limit is {files}, and {n} nodes need {needed} (a socket \
             each for its command poll, and some to spare); raise it (ulimit -n {}, or LimitNOFILE= for \
             a systemd unit) or simulate fewer nodes",
            2 * u64::from(n) + SPARE_FILES
        ));
    }
    // What is left is the reports' to share (the fleet logs how many).
    Ok(())
}

pub async fn agent(args: AgentArgs) -> Result<(), String> {
    let files = raise_open_files();
    if let Some(n) = args.simulate_nodes {
        check_simulated_fleet(n, &args, files)?;
    }
    let server = args.server.clone().ok_or("no server: pass --server URL or set EBB_SERVER")?;
    for url in server.split(',').map(str::trim) {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "--server {url:?}: a URL, e.g. http://10.0.0.1:7300 (several: comma-separated)"
            ));
        }
    }
    let join_token = match (&args.join_token, &args.join_token_file) {
        (Some(token), _) => token.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).map_err(|e| format!("--join-token-file {}: {e}", path.display()))?
        }
        (None, None) => return Err("no join token: pass --join-token or --join-token-file".into()),
    };
    let gpus = match (args.fake_gpus, &args.gpu_model) {
        (Some(0), _) => return Err("--fake-gpus must be at least 1".into()),
        (Some(n), Some(model)) => ebb_agent::gpus::Gpus { count: n, model: model.clone() },
        (Some(_), None) => return Err("--fake-gpus needs --gpu-model M".into()),
        (None, _) => ebb_agent::gpus::discover()?,
    };
    let hostname = || -> Result<String, String> {
        Ok(nix::unistd::gethostname().map_err(|e| e.to_string())?.to_string_lossy().into_owned())
    };
    let name = match args.name {
        Some(name) => name,
        None => hostname()?,
    };
    let address = match args.address {
        Some(address) => address,
        None => hostname()?,
    };
    let pairs = |flag: &str, list: &[String]| -> Result<BTreeMap<String, String>, String> {
        list.iter()
            .map(|pair| {
                let (k, v) = pair.split_once('=').ok_or_else(|| format!("{flag} {pair}: expected K=V"))?;
                Ok((k.to_string(), v.to_string()))
            })
            .collect()
    };
    let labels = pairs("--label", &args.labels)?;
    let job_env = pairs("--job-env", &args.job_env)?;
    let checkpoint_root = args.checkpoint_root.unwrap_or_else(|| args.data_dir.join("checkpoints"));
    // Before the agent kills what it finds in its ledger as left over.
    let _owner = ebb_server::lock::lock_dir(&args.data_dir, "ebb agent")?;
    let config = ebb_agent::AgentConfig {
        server,
        join_token: join_token.trim().to_string(),
        ca: args.ca,
        ca_fingerprint: args.ca_fingerprint,
        name,
        gpus: gpus.count,
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
            cache_bytes: args.image_cache_size,
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
        )
        .map_err(|e| e.to_string())?,
    };
    match args.simulate_nodes {
        Some(n) => ebb_agent::simulate(config, n, files).await,
        None => ebb_agent::run(config).await,
    }
}

/// The user who runs `ebb up`: a personal cluster runs jobs as them.
fn invoking_user() -> Result<(String, u32), String> {
    let uid = nix::unistd::geteuid();
    let user = nix::unistd::User::from_uid(uid)
        .map_err(|e| format!("cannot look up uid {uid}: {e}"))?
        .ok_or_else(|| format!("uid {uid} has no user name; ebb up runs jobs as the user who starts it"))?;
    Ok((user.name, uid.as_raw()))
}

#[derive(Args)]
pub struct UpArgs {
    /// Agents (nodes) to start.
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Simulated GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u8,
    /// GPU model of the simulated GPUs.
    #[arg(long, default_value = "H100-80GB")]
    pub gpu_model: String,
    /// Notice to forced kill for every drain: 300, 300s, 5m.
    #[arg(long, default_value = "300s", value_parser = parse_span)]
    pub drain_window: Span,
    /// A job preempted before is not chosen as a victim again until its new
    /// attempt has run this long, while other victims would do; 0 turns
    /// this off (as ebb server --min-runtime).
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    pub min_runtime: Span,
    /// A node silent this long is lost; its jobs are requeued.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub heartbeat_timeout: Span,
    /// Server, agents, checkpoints and logs go here.
    #[arg(long, default_value = "ebb-data")]
    pub data_dir: PathBuf,
    /// Loopback port for the server (0: any free port).
    #[arg(long, default_value_t = 7300)]
    pub port: u16,
    #[command(flatten)]
    pub registries: RegistryArgs,
}

struct Child {
    name: String,
    process: tokio::process::Child,
}

fn spawn(name: &str, args: &[String], log: &Path) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let up = std::process::id();
    let mut command = tokio::process::Command::new(exe);
    command.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: between fork and exec the closure makes two system calls,
    // no allocation, no lock.
    unsafe {
        command.pre_exec(move || die_with_parent(up));
    }
    let process = command.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Child { name: name.to_string(), process })
}

/// In a child of `ebb up` (pid `up`) before exec: SIGTERM when `ebb up`
/// goes, however it goes (`kill -9` included), so that nothing of the
/// cluster is left holding its port and directories. SIGTERM, not SIGKILL,
/// so that an agent ends its jobs first. If `ebb up` is already gone, exit.
fn die_with_parent(up: u32) -> std::io::Result<()> {
    // The signal comes when the thread that forked exits: tokio's worker
    // threads live as long as `ebb up` does.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(std::io::Error::from)?;
    if nix::unistd::getppid().as_raw() as u32 != up {
        return Err(std::io::Error::other("ebb up is gone"));
    }
    Ok(())
}

async fn wait_for_file(path: &Path, child: &mut Child, log: &Path) -> Result<String, String> {
    for _ in 0..400 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.trim().is_empty() {
                return Ok(text.trim().to_string());
            }
        }
        if let Ok(Some(status)) = child.process.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{} exited ({status}):\n{}", child.name, tail.trim()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{} did not write {} within 20 s", child.name, path.display()))
}

/// `ebb up` restarts a server that exits, unless it exits this many times
/// within the window.
const SERVER_RESTARTS: usize = 3;
const SERVER_RESTART_WINDOW: Duration = Duration::from_secs(60);

pub async fn up(args: UpArgs) -> Result<(), String> {
    if args.nodes == 0 || args.gpus_per_node == 0 {
        return Err("--nodes and --gpus-per-node must be at least 1".into());
    }
    check_min_runtime(args.min_runtime)?;
    // Before anything is written: a port in use would only show as the
    // server failing after the directory was set up.
    if args.port != 0 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.port));
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(format!(
                "--port {}: cannot listen on {addr}: {e} (another ebb up? pass --port 0 for any free port)",
                args.port
            ));
        }
    }
    let data = &args.data_dir;
    // Before anything in it is touched: a second `ebb up` here would reuse
    // the first one's node names, database and logs.
    let _owner = ebb_server::lock::lock_dir(data, "ebb up")?;
    let data = &std::fs::canonicalize(data).map_err(|e| format!("--data-dir {}: {e}", data.display()))?;
    let logs = data.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("--data-dir {}: {e}", data.display()))?;
    let server_dir = data.join("server");
    let _ = std::fs::remove_file(server_dir.join("server.url"));
    if !server_dir.join("ebb.db").exists() {
        // A new server knows no node credential: the agents join afresh
        // with its join token rather than present ones it never issued.
        for i in 0..args.nodes {
            let _ =
                std::fs::remove_file(data.join("agents").join(format!("node-{i}")).join("node.credential"));
        }
    }
    let server_log = logs.join("server.log");
    let (user, uid) = invoking_user()?;
    let registries: Vec<String> =
        (args.registries.insecure.iter().flat_map(|r| ["--insecure-registry".to_string(), r.clone()]))
            .chain(args.registries.allowed.iter().flat_map(|r| ["--allowed-registry".to_string(), r.clone()]))
            .collect();
    let mut server_args: Vec<String> = vec![
        "server".into(),
        "--data-dir".into(),
        server_dir.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{}", args.port),
        "--drain-window".into(),
        format!("{}ms", args.drain_window.as_millis()),
        "--min-runtime".into(),
        format!("{}ms", args.min_runtime.as_millis()),
        "--heartbeat-timeout".into(),
        format!("{}ms", args.heartbeat_timeout.as_millis()),
        "--default-run-as".into(),
        user.clone(),
    ];
    server_args.extend(registries.iter().cloned());
    let _ = std::fs::remove_file(&server_log);
    let mut server = spawn("ebb server", &server_args, &server_log)?;
    let url = wait_for_file(&server_dir.join("server.url"), &mut server, &server_log).await?;
    // A restarted server listens where the agents and the user found it.
    server_args[4] = url.trim_start_matches("http://").to_string();
    let admin = wait_for_file(&server_dir.join("admin.token"), &mut server, &server_log).await?;
    let mut children = Vec::new();
    for i in 0..args.nodes {
        let name = format!("node-{i}");
        let log = logs.join(format!("{name}.log"));
        children.push(spawn(
            &format!("ebb agent {name}"),
            &[
                "agent".into(),
                "--server".into(),
                url.clone(),
                "--join-token-file".into(),
                server_dir.join("join.token").display().to_string(),
                "--name".into(),
                name.clone(),
                "--fake-gpus".into(),
                args.gpus_per_node.to_string(),
                "--gpu-model".into(),
                args.gpu_model.clone(),
                "--data-dir".into(),
                data.join("agents").join(&name).display().to_string(),
                "--checkpoint-root".into(),
                data.join("checkpoints").display().to_string(),
                "--address".into(),
                "127.0.0.1".into(),
                // A personal cluster: the user's own jobs, with their PATH.
                "--allow-root-jobs".into(),
                "--job-path".into(),
                std::env::var("PATH").unwrap_or_else(|_| ebb_agent::identity::DEFAULT_PATH.into()),
            ]
            .into_iter()
            .chain(registries.iter().cloned())
            .collect::<Vec<String>>(),
            &log,
        )?);
    }
    // Ready when every agent has joined.
    let conn = crate::client::Connection { server: Some(url.clone()), token: Some(admin.clone()), ca: None };
    let client = conn.client()?;
    // Joined: up, or drained by the operator before a restart (it stays
    // drained, and is said so below).
    let mut joined = 0;
    let mut nodes: Vec<ebb_api::Node> = Vec::new();
    for _ in 0..400 {
        nodes = client.get("/v1/nodes").await.unwrap_or_default();
        joined = nodes.iter().filter(|n| n.status == "up" || n.status == "draining").count();
        if joined == args.nodes as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if joined != args.nodes as usize {
        return Err(format!("only {joined} of {} agents joined; see {}", args.nodes, logs.display()));
    }
    println!(
        "ebb up: {} nodes x {} simulated {} GPUs, drain window {}, server {url}",
        args.nodes, args.gpus_per_node, args.gpu_model, args.drain_window
    );
    println!("point the CLI at it:\n  export EBB_SERVER={url} EBB_TOKEN={admin}");
    println!("jobs run as {user} (uid {uid}), the user who started this cluster");
    println!("logs in {}; Ctrl-C stops the cluster", logs.display());
    for node in nodes.iter().filter(|n| n.status == "draining") {
        println!("{} is drained: it takes no new work (ebb undrain {} puts it back)", node.name, node.name);
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    // The server exits on a panic or a failed commit, to restart from its
    // last commit: it is restarted (agents re-register by themselves) unless
    // it keeps failing. An agent that exits stops the cluster.
    let exited = async {
        let mut restarts: Vec<std::time::Instant> = Vec::new();
        loop {
            for child in &mut children {
                if let Ok(Some(status)) = child.process.try_wait() {
                    return format!("{} exited unexpectedly ({status})", child.name);
                }
            }
            if let Ok(Some(status)) = server.process.try_wait() {
                restarts.retain(|t| t.elapsed() < SERVER_RESTART_WINDOW);
                if restarts.len() >= SERVER_RESTARTS {
                    return format!(
                        "ebb server exited ({status}) {} times within {} s; see {}",
                        SERVER_RESTARTS + 1,
                        SERVER_RESTART_WINDOW.as_secs(),
                        server_log.display()
                    );
                }
                restarts.push(std::time::Instant::now());
                println!(
                    "ebb up: the server exited ({status}); restarting it from its last commit (see {})",
                    server_log.display()
                );
                match spawn("ebb server", &server_args, &server_log) {
                    Ok(child) => server = child,
                    Err(e) => return format!("cannot restart the server: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let outcome = tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = term.recv() => Ok(()),
        why = exited => Err(why),
    };
    println!("ebb up: stopping");
    // Agents first (they end their jobs and report), then the server.
    for child in &children {
        if let Some(pid) = child.process.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for child in &mut children {
        let _ = tokio::time::timeout(Duration::from_secs(10), child.process.wait()).await;
        let _ = child.process.start_kill();
    }
    if let Some(pid) = server.process.id() {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), server.process.wait()).await;
    let _ = server.process.start_kill();
    outcome
}
