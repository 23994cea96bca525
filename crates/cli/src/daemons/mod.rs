//! `ebb server`, `ebb agent` and `ebb up` (a server and agents with
//! simulated GPUs on loopback, in the foreground), and the flags they
//! share: the scheduling policy, registries, TLS, limits, checkpoint
//! stores.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{usage, CliError};
use clap::Args;
use ebb_core::Span;
use ebb_server::Limits;

mod agent;
mod server;
mod up;

pub use agent::*;
pub use server::*;
pub use up::*;

fn parse_span(text: &str) -> Result<Span, CliError> {
    Span::parse(text).map_err(usage)
}

/// The scheduling policy's flags, the same for `ebb server` and `ebb up`.
#[derive(Args, Clone)]
pub struct PolicyArgs {
    /// Notice to forced kill for every drain: 300, 300s, 5m.
    #[arg(long, default_value = "300s", value_parser = parse_span)]
    pub drain_window: Span,
    /// A job preempted before is not chosen as a victim again until its new
    /// attempt has run this long, while other victims would do (it is
    /// still chosen when nothing else makes room); 0 turns this off. At
    /// most 24h.
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    pub min_runtime: Span,
    /// A tenant's usage (GPU time at on-demand prices), by which fair share
    /// orders the tenants within a tier, halves over this long. From 1s
    /// to 365 days.
    #[arg(long, default_value = "24h", value_parser = parse_span)]
    pub fair_share_half_life: Span,
    /// Fair-share preemption in the preemptible tier: a tenant whose job
    /// waits has jobs of the tenant furthest above its share drained
    /// (the ordinary window; never one younger than --min-runtime) when
    /// that tenant's usage over weight exceeds its own by more than
    /// PERCENT (default 20; at least 10, so that tenants near their
    /// shares do not trade GPUs back and forth).
    #[arg(long, value_name = "PERCENT", num_args = 0..=1, default_missing_value = "20")]
    pub fair_share_preemption: Option<u32>,
    /// A node silent this long is lost; its jobs are requeued.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub heartbeat_timeout: Span,
    /// Slurm's partitions as tiers, for sbatch --partition:
    /// spot=preemptible,gpu=on-demand. Default: the tiers' own names.
    #[arg(long, value_name = "NAME=TIER,...")]
    pub partition_map: Option<String>,
    /// The partition of Slurm jobs that name none (default: the map's
    /// first, or preemptible).
    #[arg(long, value_name = "NAME")]
    pub default_partition: Option<String>,
    /// Names a GPU model answers to besides its own, its case-blind
    /// spelling and its family's (`h100` for `H100-80GB`, where no other
    /// model's name begins so): a100=A100-SXM4-80GB,... Repeatable.
    #[arg(long, value_name = "NAME=MODEL,...")]
    pub gpu_alias: Vec<String>,
}

impl PolicyArgs {
    /// The policy's flags within the core's bounds (the writer checks
    /// again at start), before anything is written.
    pub fn check(&self) -> Result<(), CliError> {
        let (window, gap) = (self.drain_window, self.fair_share_preemption);
        ebb_server::engine::check_policy(window, self.min_runtime, self.fair_share_half_life, gap)?;
        Ok(())
    }

    pub fn gpu_names(&self) -> Result<ebb_server::gpu_names::GpuNames, CliError> {
        ebb_server::gpu_names::GpuNames::parse(&self.gpu_alias).map_err(CliError::from)
    }

    pub fn partitions(&self) -> Result<ebb_server::partitions::Partitions, CliError> {
        ebb_server::partitions::Partitions::parse(
            self.partition_map.as_deref(),
            self.default_partition.as_deref(),
        )
        .map_err(CliError::from)
    }
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
        ebb_image::Registries { insecure: self.insecure.clone(), allowed, outbound: Default::default() }
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
    async fn checked(&self) -> Result<Option<ebb_api::CheckpointStoreLocation>, CliError> {
        let Some(url) = &self.checkpoint_store else { return Ok(None) };
        let location = ebb_api::CheckpointStoreLocation {
            url: url.trim().to_string(),
            endpoint: self.checkpoint_store_endpoint.clone(),
            region: self.checkpoint_store_region.clone(),
        };
        let credentials = ebb_checkpoints::Credentials::load(
            "--checkpoint-store-credentials",
            self.checkpoint_store_credentials.as_deref(),
        )?;
        let store = ebb_checkpoints::Store::open(&location, credentials.as_ref())?;
        store.check(Duration::from_secs(15)).await.map_err(|source| {
            let at = location.endpoint.as_deref().map_or(String::new(), |e| format!(" at {e}"));
            CliError::CheckpointStore { store: format!("{url}{at}"), source }
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
    /// Times one job may requeue itself outside a drain (`scontrol
    /// requeue`, its endpoint's requeue); the next fails it. Each comes
    /// after the restart back-off when the attempt ran under 10 s.
    #[arg(long, default_value_t = Limits::default().max_requeues, value_name = "N")]
    pub max_requeues: u64,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_argument_bytes: self.max_argument_bytes,
            max_command_bytes: self.max_command_bytes,
            max_array_tasks: self.max_array_tasks,
            max_jobs: self.max_jobs_per_tenant,
            max_stored_bytes: self.max_stored_bytes_per_tenant,
            max_running_jobs: self.max_running_jobs,
            max_requeues: self.max_requeues,
        }
    }
}

/// `--run-as TENANT=USER` flags and the default user, each checked.
fn run_as_flags(pairs: &[String], default: Option<&str>) -> Result<ebb_server::RunAs, CliError> {
    let mut by_tenant = BTreeMap::new();
    for pair in pairs {
        let (tenant, user) = pair
            .split_once('=')
            .filter(|(t, u)| !t.is_empty() && !u.is_empty())
            .ok_or_else(|| usage(format!("--run-as {pair}: expected TENANT=USER")))?;
        if by_tenant.insert(tenant.to_string(), user.to_string()).is_some() {
            return Err(usage(format!("--run-as {pair}: tenant {tenant} is mapped twice")));
        }
    }
    if default.is_some_and(str::is_empty) {
        return Err(usage("--default-run-as: a user name"));
    }
    Ok(ebb_server::RunAs { by_tenant, default: default.map(str::to_string) })
}

/// `--price MODEL=USD` flags to micro-dollars, each checked.
fn price_flags(flag: &str, pairs: &[String], discount_bps: u32) -> Result<Vec<(String, i64)>, CliError> {
    pairs
        .iter()
        .map(|pair| {
            let (model, usd) =
                pair.split_once('=').ok_or_else(|| usage(format!("{flag} {pair}: expected MODEL=USD")))?;
            let micro =
                ebb_server::billing::parse_price(flag, usd, discount_bps).map_err(|e| usage(e.message))?;
            Ok((model.to_string(), micro))
        })
        .collect()
}

/// Raises this process's open-file soft limit to its hard limit: every
/// node's command poll is a socket on both sides, so a server with ten
/// thousand nodes holds ten thousand. Returns the limit now in force.
pub(super) fn raise_open_files() -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_flag_is_refused_by_its_name_before_the_server_starts() {
        let bps = ebb_core::PriceBook::DEFAULT_DISCOUNT_BPS;
        let refused = |pair: &str| price_flags("--price", &[pair.to_string()], bps).unwrap_err().to_string();
        assert!(refused("H100=-1").starts_with("--price"), "{}", refused("H100=-1"));
        assert_eq!(refused("H100"), "--price H100: expected MODEL=USD");
        assert_eq!(
            price_flags("--price", &["H100=2".into()], bps).unwrap(),
            vec![("H100".to_string(), 2_000_000)]
        );
    }
}
