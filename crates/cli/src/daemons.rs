//! `ebb server`, `ebb agent` and `ebb up` (a server and agents with
//! simulated GPUs on loopback, in the foreground).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use ebb_core::Span;

fn parse_span(text: &str) -> Result<Span, String> {
    Span::parse(text)
}

#[derive(Args)]
pub struct ServerArgs {
    /// Where the database, tokens and job output live.
    #[arg(long, default_value = "ebb-data/server")]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub listen: std::net::SocketAddr,
    /// Notice to forced kill for every drain: 300, 300s, 5m.
    #[arg(long, default_value = "300s", value_parser = parse_span)]
    pub drain_window: Span,
    /// A node silent this long is lost; its jobs are requeued.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub heartbeat_timeout: Span,
    /// How often agents check in.
    #[arg(long, default_value = "1s", value_parser = parse_span)]
    pub heartbeat_interval: Span,
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

pub async fn server(args: ServerArgs) -> Result<(), String> {
    let discount = args.preemptible_discount;
    if !(0.0..100.0).contains(&discount) || (discount * 100.0).fract() != 0.0 {
        return Err(format!(
            "--preemptible-discount {discount}: a percentage from 0 to below 100, at most two decimals"
        ));
    }
    let discount_bps = (discount * 100.0) as u32;
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
    ebb_server::serve(ebb_server::ServerConfig {
        data_dir: args.data_dir,
        listen: args.listen,
        drain_window: args.drain_window,
        heartbeat_timeout: args.heartbeat_timeout,
        heartbeat_interval: args.heartbeat_interval,
        max_clock_skew: args.max_clock_skew,
        pricing: ebb_server::billing::Pricing { prices, default_price, discount_bps },
    })
    .await
}

#[derive(Args)]
pub struct AgentArgs {
    /// The join token (or --join-token-file).
    #[arg(long, env = "EBB_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    #[arg(long)]
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
    /// Root of the jobs' checkpoint directories (shared storage).
    #[arg(long)]
    pub checkpoint_root: Option<PathBuf>,
    /// Where other nodes reach this one, for a gang's MASTER_ADDR
    /// (default: the host name).
    #[arg(long)]
    pub address: Option<String>,
}

pub async fn agent(server: Option<String>, args: AgentArgs) -> Result<(), String> {
    let server = server.ok_or("no server: pass --server URL or set EBB_SERVER")?;
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
    let mut labels = BTreeMap::new();
    for pair in &args.labels {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("--label {pair}: expected K=V"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let checkpoint_root = args.checkpoint_root.unwrap_or_else(|| args.data_dir.join("checkpoints"));
    ebb_agent::run(ebb_agent::AgentConfig {
        server,
        join_token: join_token.trim().to_string(),
        name,
        gpus: gpus.count,
        gpu_model: gpus.model,
        labels,
        data_dir: args.data_dir,
        checkpoint_root,
        address,
    })
    .await
}

#[derive(Args)]
pub struct UpArgs {
    /// Agents (nodes) to start.
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Simulated GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u8,
    #[arg(long, default_value = "H100-80GB")]
    pub gpu_model: String,
    #[arg(long, default_value = "300s", value_parser = parse_span)]
    pub drain_window: Span,
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub heartbeat_timeout: Span,
    /// Server, agents, checkpoints and logs go here.
    #[arg(long, default_value = "ebb-data")]
    pub data_dir: PathBuf,
    /// Loopback port for the server (0: any free port).
    #[arg(long, default_value_t = 7300)]
    pub port: u16,
}

struct Child {
    name: String,
    process: tokio::process::Child,
}

fn spawn(name: &str, args: &[String], log: &Path) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let process = tokio::process::Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Child { name: name.to_string(), process })
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

pub async fn up(args: UpArgs) -> Result<(), String> {
    if args.nodes == 0 || args.gpus_per_node == 0 {
        return Err("--nodes and --gpus-per-node must be at least 1".into());
    }
    let data = &args.data_dir;
    std::fs::create_dir_all(data).map_err(|e| format!("--data-dir {}: {e}", data.display()))?;
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
    let mut server = spawn(
        "ebb server",
        &[
            "server".into(),
            "--data-dir".into(),
            server_dir.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", args.port),
            "--drain-window".into(),
            format!("{}ms", args.drain_window.as_millis()),
            "--heartbeat-timeout".into(),
            format!("{}ms", args.heartbeat_timeout.as_millis()),
        ],
        &server_log,
    )?;
    let url = wait_for_file(&server_dir.join("server.url"), &mut server, &server_log).await?;
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
            ],
            &log,
        )?);
    }
    // Ready when every agent has joined.
    let conn = crate::client::Connection { server: Some(url.clone()), token: Some(admin.clone()) };
    let client = conn.client()?;
    let mut joined = 0;
    for _ in 0..400 {
        let nodes: Vec<ebb_api::Node> = client.get("/v1/nodes").await.unwrap_or_default();
        joined = nodes.iter().filter(|n| n.status == "up").count();
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
    println!("logs in {}; Ctrl-C stops the cluster", logs.display());
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let exited = async {
        loop {
            for child in children.iter_mut().chain(std::iter::once(&mut server)) {
                if let Ok(Some(status)) = child.process.try_wait() {
                    return format!("{} exited unexpectedly ({status})", child.name);
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
