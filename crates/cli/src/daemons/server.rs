//! `ebb server`: its flags, checked, and the server started from them.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ebb_core::Span;

use super::*;
use crate::error::{given, usage, CliError};

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
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// How often agents check in.
    #[arg(long, default_value = "1s", value_parser = parse_span)]
    pub heartbeat_interval: Span,
    /// How long a finished job's record stays in the server's memory; after
    /// that it is read from the database when asked for (show, logs,
    /// listing, bills: nothing changes for users). 0 drops it at once. At
    /// most 168h.
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    pub keep_finished: Span,
    /// How long a finished job's output stays in the database (720h, 30
    /// days, by default; 0 keeps it for ever); then it is removed, a
    /// thousand jobs' a minute at most. The job, its timeline and its
    /// bills stay; `ebb logs` says when the output went.
    #[arg(long, default_value = "720h", value_parser = parse_span)]
    pub keep_output: Span,
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
    /// A file holding tokens that may read /metrics and nothing else, one a
    /// line, for a Prometheus server (its scrape config's `authorization`
    /// with `credentials_file`); /metrics takes an operator's token too, and
    /// no other. Read again when it changes: rotate by adding the new
    /// token, moving the scrapers over, then removing the old. The file
    /// should be the server's alone (0600).
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
    /// Addresses the server's own requests may reach although they are
    /// refused by default (ADDRESS or ADDRESS/BITS, comma-separated or
    /// repeated): webhooks' receivers, and registries not named with
    /// --insecure-registry or --allowed-registry. Refused by default:
    /// loopback, unspecified, link-local (a cloud's metadata service),
    /// multicast, in every IPv6 form, and the server's own address.
    #[arg(long = "outbound-allow", value_name = "CIDR", value_delimiter = ',')]
    pub outbound_allow: Vec<String>,
    /// The key that seals tenants' registry passwords and webhooks' secrets
    /// in the database: 64 hex digits on one line, made (0600) if the file
    /// does not exist. Default: <data-dir>/secret.key. Servers sharing a
    /// PostgreSQL database must all be given the same file.
    #[arg(long, value_name = "FILE")]
    pub secret_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub checkpoint_store: CheckpointStoreArgs,
}

pub async fn server(args: ServerArgs) -> Result<(), CliError> {
    raise_open_files();
    let discount = args.preemptible_discount;
    if !(0.0..100.0).contains(&discount) || (discount * 100.0).fract() != 0.0 {
        return Err(usage(format!(
            "--preemptible-discount {discount}: a percentage from 0 to below 100, at most two decimals"
        )));
    }
    let discount_bps = (discount * 100.0) as u32;
    // Every bound before anything is written (the writer checks again).
    let policy = &args.policy;
    policy.check()?;
    let (interval, timeout) = (args.heartbeat_interval, policy.heartbeat_timeout);
    ebb_server::engine::check_times(interval, timeout, args.keep_finished)?;
    let limits = args.limits.limits();
    limits.validate()?;
    let on_demand = price_flags("--price", &args.prices, discount_bps)?;
    let reserved = price_flags("--reserved-price", &args.reserved_prices, discount_bps)?;
    if let Some((model, _)) = reserved.iter().find(|(m, _)| !on_demand.iter().any(|(o, _)| o == m)) {
        return Err(usage(format!(
            "--reserved-price {model}=...: give its on-demand price too (--price {model}=USD)"
        )));
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
            .map_err(|e| usage(e.message))?;
    let run_as = run_as_flags(&args.run_as, args.default_run_as.as_deref())?;
    if args.database.is_none() {
        for (flag, given) in [("--advertise", args.advertise.is_some()), ("--lease", args.lease.is_some())] {
            if given {
                return Err(usage(format!(
                    "{flag}: only with --database (servers sharing a PostgreSQL database); \
                     a server on its embedded database is alone"
                )));
            }
        }
    }
    if !(100..=3_600_000).contains(&args.header_read_timeout.as_millis()) {
        return Err(usage(format!(
            "--header-read-timeout {}: from 100ms to 1h",
            args.header_read_timeout.human()
        )));
    }
    let metrics_token = args
        .metrics_token_file
        .as_deref()
        .map(ebb_server::http::scrape::ScrapeTokens::from_file)
        .transpose()?
        .map(std::sync::Arc::new);
    let lease = args.lease.unwrap_or(Span::from_secs(5));
    if !(500..=600_000).contains(&lease.as_millis()) {
        return Err(usage(format!("--lease {}: from 500ms to 10m", lease.human())));
    }
    if let Some(url) = &args.advertise {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(usage(format!("--advertise {url}: a URL, e.g. http://10.0.0.2:7300")));
        }
    }
    let outbound = ebb_http::Outbound::new(&args.outbound_allow)?.with_own(args.listen.ip());
    let secret_key_file = match args.secret_key_file {
        Some(file) => file,
        None => {
            std::fs::create_dir_all(&args.data_dir).map_err(given("--data-dir", &args.data_dir))?;
            args.data_dir.join("secret.key")
        }
    };
    let secret_key = ebb_server::sealed::SecretKey::load_or_create(&secret_key_file)?;
    let tls = args.tls.config();
    // Registry passwords travel to the agents with a start only where
    // nobody can read them on the way.
    let logins_to_nodes = !matches!(tls, ebb_server::tls::TlsConfig::Off) || args.listen.ip().is_loopback();
    if !logins_to_nodes {
        tracing::warn!(
            "plain HTTP on {}: tenants' registry passwords are not sent to the agents, so jobs in private \
             images cannot be pulled (serve HTTPS: --tls-generate, or --tls-cert and --tls-key)",
            args.listen
        );
    }
    let engine = ebb_server::EngineConfig {
        outbound: outbound.clone(),
        secret_key,
        logins_to_nodes,
        data_dir: args.data_dir,
        drain_window: args.policy.drain_window,
        min_runtime: args.policy.min_runtime,
        fair_share_half_life: args.policy.fair_share_half_life,
        fair_share_preemption: args.policy.fair_share_preemption,
        heartbeat_timeout: args.policy.heartbeat_timeout,
        heartbeat_interval: args.heartbeat_interval,
        keep_finished: args.keep_finished,
        keep_output: args.keep_output,
        max_clock_skew: args.max_clock_skew,
        gang_exit_grace: args.gang_exit_grace,
        pricing: ebb_server::billing::Pricing { prices, default_price, discount_bps },
        limits,
        run_as,
        checkpoint_store: args.checkpoint_store.checked().await?,
        partitions: args.policy.partitions()?,
        gpu_names: args.policy.gpu_names()?,
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
        tls,
        connections: ebb_http::Limits {
            header_read_timeout: Duration::from_millis(args.header_read_timeout.as_millis()),
            per_address: args.max_connections_per_address,
            total: 0,
        },
        metrics_token,
        registries: ebb_image::Registries { outbound, ..args.registries.registries() },
    })
    .await?;
    Ok(())
}
