//! `ebb up`: a server and agents with simulated GPUs as child processes
//! on loopback, in the foreground, the server restarted if it dies.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clap::Args;

use super::*;
use crate::error::{file, given, usage, CliError};

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
    #[command(flatten)]
    pub policy: PolicyArgs,
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

fn spawn(name: &str, args: &[String], log: &Path) -> Result<Child, CliError> {
    let cannot = |source| CliError::Spawn { what: name.to_string(), source };
    let exe = std::env::current_exe().map_err(cannot)?;
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(file(log))?;
    let err = out.try_clone().map_err(file(log))?;
    let up = std::process::id();
    let mut command = tokio::process::Command::new(exe);
    command.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: between fork and exec the closure makes two system calls,
    // no allocation, no lock.
    unsafe {
        command.pre_exec(move || die_with_parent(up));
    }
    let process = command.spawn().map_err(cannot)?;
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

async fn wait_for_file(path: &Path, child: &mut Child, log: &Path) -> Result<String, CliError> {
    for _ in 0..400 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.trim().is_empty() {
                return Ok(text.trim().to_string());
            }
        }
        if let Ok(Some(status)) = child.process.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            return Err(CliError::Daemon(format!("{} exited ({status}):\n{}", child.name, tail.trim())));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(CliError::Daemon(format!("{} did not write {} within 20 s", child.name, path.display())))
}

/// `ebb up` restarts a server that exits, unless it exits this many times
/// within the window.
const SERVER_RESTARTS: usize = 3;
const SERVER_RESTART_WINDOW: Duration = Duration::from_secs(60);

pub async fn up(args: UpArgs) -> Result<(), CliError> {
    if args.nodes == 0 || args.gpus_per_node == 0 {
        return Err(usage("--nodes and --gpus-per-node must be at least 1"));
    }
    args.policy.check()?;
    args.policy.partitions()?;
    args.policy.gpu_names()?;
    let data = &args.data_dir;
    // A directory in use says so first, with where its cluster is: a second
    // `ebb up` here would reuse the first one's node names, database and
    // logs (and its port is taken too, which is not the news).
    let held = if data.exists() { Some(lock(data)?) } else { None };
    // Before anything is written: a port in use would only show as the
    // server failing after the directory was set up.
    if args.port != 0 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.port));
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(usage(format!(
                "--port {}: cannot listen on {addr}: {e} (another ebb up? pass --port 0 for any free port)",
                args.port
            )));
        }
    }
    let _owner = match held {
        Some(owner) => owner,
        None => lock(data)?,
    };
    let data = &std::fs::canonicalize(data).map_err(given("--data-dir", data))?;
    let logs = data.join("logs");
    std::fs::create_dir_all(&logs).map_err(given("--data-dir", &logs))?;
    std::fs::create_dir_all(data.join("faults")).map_err(given("--data-dir", data.join("faults")))?;
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
        format!("{}ms", args.policy.drain_window.as_millis()),
        "--min-runtime".into(),
        format!("{}ms", args.policy.min_runtime.as_millis()),
        "--fair-share-half-life".into(),
        format!("{}ms", args.policy.fair_share_half_life.as_millis()),
        "--heartbeat-timeout".into(),
        format!("{}ms", args.policy.heartbeat_timeout.as_millis()),
        // A cluster on one machine: its webhooks' receivers and its
        // registries are on loopback too.
        "--outbound-allow".into(),
        "127.0.0.0/8,::1".into(),
    ];
    // Jobs run as the user who started the cluster: a personal cluster.
    // Started by root, only the operator's own tenant's (`default`) do;
    // every other tenant's run as a uid of its own, as `ebb server`
    // gives them, never root.
    match uid {
        0 => server_args.extend(["--run-as".to_string(), format!("default={user}")]),
        _ => server_args.extend(["--default-run-as".to_string(), user.clone()]),
    }
    server_args.extend(registries.iter().cloned());
    if let Some(threshold) = args.policy.fair_share_preemption {
        server_args.push(format!("--fair-share-preemption={threshold}"));
    }
    for (flag, value) in [
        ("--partition-map", &args.policy.partition_map),
        ("--default-partition", &args.policy.default_partition),
    ] {
        if let Some(value) = value {
            server_args.extend([flag.to_string(), value.clone()]);
        }
    }
    for alias in &args.policy.gpu_alias {
        server_args.extend(["--gpu-alias".to_string(), alias.clone()]);
    }
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
                // Faults to try the GPU health path with: a line in
                // ebb-data/faults/node-N is a finding of that node's GPUs.
                "--fake-gpu-faults".into(),
                data.join("faults").join(&name).display().to_string(),
                "--health-interval".into(),
                "2s".into(),
                // Stopping `ebb up` (or its death: each child gets SIGTERM)
                // ends the jobs at once, as it always did; they are
                // requeued, not failed, and the node drains for the next
                // start to undo.
                "--stop-timeout".into(),
                "0s".into(),
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
    // drained, and is said so below). A node drained as its agent stopped
    // (the last `ebb up` ended) is back once its agent registers.
    let drained = |n: &ebb_api::Node| {
        n.status == "draining"
            && !n.drained_for.as_deref().is_some_and(|why| why.starts_with(ebb_api::DRAINED_FOR_AGENT_STOP))
    };
    let mut joined = 0;
    let mut nodes: Vec<ebb_api::Node> = Vec::new();
    for _ in 0..400 {
        nodes = client.get("/v1/nodes").await.unwrap_or_default();
        joined = nodes.iter().filter(|n| n.status == "up" || drained(n)).count();
        if joined == args.nodes as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if joined != args.nodes as usize {
        return Err(usage(format!("only {joined} of {} agents joined; see {}", args.nodes, logs.display())));
    }
    println!("{}", banner(args.nodes, args.gpus_per_node, &args.gpu_model, args.policy.drain_window, &url));
    println!(
        "dashboard: {url}/ (sign in with the admin token, in {})",
        server_dir.join("admin.token").display()
    );
    println!("point the CLI at it:\n  export EBB_SERVER={url} EBB_TOKEN={admin}");
    match uid {
        0 => println!(
            "the default tenant's jobs run as {user} (uid {uid}), who started this cluster; other tenants' \
             as uids of their own (from 2000000, the agents' --tenant-uids), never root"
        ),
        _ => println!("jobs run as {user} (uid {uid}), the user who started this cluster"),
    }
    println!("logs in {}; Ctrl-C stops the cluster", logs.display());
    for node in nodes.iter().filter(|n| drained(n)) {
        println!("{} is drained: it takes no new work (ebb undrain {} puts it back)", node.name, node.name);
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(CliError::Signals)?;
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
        why = exited => Err(CliError::Daemon(why)),
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

/// The user who runs `ebb up`: a personal cluster runs jobs as them.
fn invoking_user() -> Result<(String, u32), CliError> {
    let uid = nix::unistd::geteuid();
    let user = nix::unistd::User::from_uid(uid)
        .map_err(|e| CliError::Daemon(format!("cannot look up uid {uid}: {e}")))?
        .ok_or_else(|| {
            CliError::Daemon(format!(
                "uid {uid} has no user name; ebb up runs jobs as the user who starts it"
            ))
        })?;
    Ok((user.name, uid.as_raw()))
}

/// Takes the data directory for this cluster; one already in use is said
/// once, with the address of the cluster running from it.
fn lock(data: &Path) -> Result<ebb_server::lock::DirLock, CliError> {
    ebb_server::lock::lock_dir(data, "ebb up").map_err(|e| {
        let url = std::fs::read_to_string(data.join("server").join("server.url"));
        match (&e, url) {
            (ebb_server::lock::LockError::InUse { .. }, Ok(url)) => CliError::Daemon(format!(
                "{e}; the cluster running from it serves {} (its admin token is in {})",
                url.trim(),
                data.join("server").join("admin.token").display()
            )),
            _ => CliError::Lock(e),
        }
    })
}

/// The line that says what came up: `2 nodes x 8 simulated H100-80GB
/// GPUs`, one node and one GPU in the singular.
fn banner(
    nodes: impl Into<u64>,
    gpus: impl Into<u64>,
    model: &str,
    window: impl std::fmt::Display,
    url: &str,
) -> String {
    let nodes = ebb_core::count(nodes.into(), "node");
    let gpus = ebb_core::count(gpus.into(), &format!("simulated {model} GPU"));
    format!("ebb up: {nodes} x {gpus}, drain window {window}, server {url}")
}

#[cfg(test)]
mod banner_tests {
    #[test]
    fn one_node_and_one_gpu_are_singular() {
        let url = "http://127.0.0.1:7300";
        assert_eq!(
            super::banner(2u32, 8u8, "H100-80GB", "300s", url),
            "ebb up: 2 nodes x 8 simulated H100-80GB GPUs, drain window 300s, server http://127.0.0.1:7300"
        );
        assert_eq!(
            super::banner(1u32, 1u8, "H100-80GB", "300s", url),
            "ebb up: 1 node x 1 simulated H100-80GB GPU, drain window 300s, server http://127.0.0.1:7300"
        );
    }
}
