//! The process: the data dir, the writer (or the lease loop on a shared
//! database), the listener and the router, until SIGINT or SIGTERM.

use super::*;

/// A panic anywhere in the server ends the process: the writer's state may
/// be ahead of the store, and a server that answers 500 for ever serves no
/// one. A supervisor (systemd, `ebb up`) restarts it from the last commit.
pub(super) fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!(
            "panic: {info}; exiting so that a supervisor restarts the server from its last commit"
        );
        eprintln!("ebb server: panic; exiting (status 70) to restart from the last commit");
        std::process::exit(70);
    }));
}

/// Why the server could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    #[error("--data-dir {}: {source}", path.display())]
    DataDir { path: std::path::PathBuf, source: std::io::Error },
    /// A file of the data directory's.
    #[error("{}: {source}", path.display())]
    File { path: std::path::PathBuf, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(
        "--tls-cert with --database: put the CA that signed the servers' certificates in {}; a server \
         verifies the leader's certificate with it when it forwards a request",
        .0.display()
    )]
    NoPeerCa(std::path::PathBuf),
    #[error("--listen {addr}: {source}")]
    Listen { addr: std::net::SocketAddr, source: std::io::Error },
    #[error(
        "--advertise: with --database, say where the other servers reach this one (--listen {0} is every \
         address)"
    )]
    Advertise(std::net::SocketAddr),
    /// The store could not be opened, or the writer could not start on it.
    #[error(transparent)]
    Open(#[from] crate::engine::OpenError),
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
    #[error("the {0} thread ended before it was ready")]
    NotReady(&'static str),
    /// The client that forwards requests to the leader.
    #[error("{what}: {source}")]
    Proxy { what: &'static str, source: reqwest::Error },
    #[error("serving: {0}")]
    Serving(std::io::Error),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// The data dir holds tenants' environments, output and the tokens: only
/// the server's user may read it. Files made before this rule are fixed.
pub(super) fn private_data_dir(dir: &std::path::Path) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    std::fs::create_dir_all(dir.join("logs"))
        .map_err(|source| ServeError::DataDir { path: dir.to_path_buf(), source })?;
    let file = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| ServeError::File { path, source }
    };
    let chmod = |path: &std::path::Path, mode: u32| -> Result<(), ServeError> {
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(file(path)(e)),
            _ => Ok(()),
        }
    };
    chmod(dir, 0o700)?;
    chmod(&dir.join("logs"), 0o700)?;
    for name in ["ebb.db", "ebb.db-wal", "ebb.db-shm", "admin.token", "join.token"] {
        chmod(&dir.join(name), 0o600)?;
    }
    let logs = dir.join("logs");
    for entry in std::fs::read_dir(&logs).map_err(file(&logs))? {
        let entry = entry.map_err(file(&logs))?;
        chmod(&entry.path(), 0o600)?;
    }
    Ok(())
}

/// Starts the single server's writer thread: it opens the store (on its
/// own thread, as a blocking database client must not run on the async
/// runtime), leads on it, and then takes messages. Returns the files the
/// engine created, once it is ready.
fn start_writer<S: Store + 'static>(
    open: impl FnOnce() -> Result<S, crate::store::StoreError> + Send + 'static,
    config: EngineConfig,
    tokens: TokenMap,
    feed: crate::engine::Feed,
    role: Arc<Role>,
    url: String,
) -> Result<Vec<String>, ServeError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ebb-writer".into())
        .spawn(move || {
            let opened = open()
                .map_err(crate::engine::OpenError::from)
                .and_then(|store| crate::leader::lead(store, config, &tokens, &feed, &role, 0, &url));
            match opened {
                Ok((engine, rx, created)) => {
                    let _ = ready_tx.send(Ok(created));
                    if let Some(e) = engine.run(rx) {
                        // Serve no state the store does not have.
                        tracing::error!("{e}; stopping");
                        std::process::exit(70);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| ServeError::Thread("writer", e))?;
    Ok(ready_rx.recv().map_err(|_| ServeError::NotReady("writer"))??)
}

pub async fn serve(config: ServerConfig) -> Result<(), ServeError> {
    exit_on_panic();
    let dir = &config.engine.data_dir;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    // Before anything in the directory is touched; held until the process ends.
    let _owner = crate::lock::lock_dir(dir, "ebb server")?;
    private_data_dir(dir)?;
    let tls = crate::tls::ServerTls::prepare(&config.tls, dir, config.listen)?;
    for path in tls.iter().flat_map(|t| &t.written) {
        eprintln!("ebb server: wrote {}", path.display());
    }
    if config.database.is_some() && tls.as_ref().is_some_and(|t| t.ca.is_none()) {
        return Err(ServeError::NoPeerCa(dir.join(crate::tls::CA_CERT)));
    }
    // A personal cluster (`ebb up`) runs every job as its own user: no news.
    let own_user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name);
    for (user, tenants) in
        config.engine.run_as.shared().into_iter().filter(|(user, _)| Some(user) != own_user.as_ref())
    {
        let who = match tenants.iter().any(|t| t == "*") {
            true => "every tenant --run-as does not name".to_string(),
            false => format!("tenants {}", tenants.join(", ")),
        };
        tracing::warn!(
            user,
            "{who} run as one Unix user, {user}: their jobs can read each other's processes, \
             environments, checkpoints and notices on a shared node"
        );
    }
    let tokens = Arc::new(RwLock::new(HashMap::new()));
    let engine_config = config.engine.clone();
    // Bound first: a server on one database with others says where it
    // answers, and `--listen 127.0.0.1:0` picks its port here.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
    let role = Arc::new(Role::default());
    let feed: crate::engine::Feed = Arc::new(tokio::sync::watch::Sender::new(0));
    let created = match &config.database {
        None => {
            let path = dir.join("ebb.db");
            let open = move || SqliteStore::open(&path);
            start_writer(open, engine_config, tokens.clone(), feed.clone(), role.clone(), url.clone())?
        }
        Some(database) => {
            let advertise = match &config.advertise {
                Some(advertise) => advertise.trim_end_matches('/').to_string(),
                None if addr.ip().is_unspecified() => return Err(ServeError::Advertise(addr)),
                None => url.clone(),
            };
            let lease = LeaseConfig { database: database.clone(), url: advertise, lease: config.lease };
            let role = role.clone();
            let (tokens, feed) = (tokens.clone(), feed.clone());
            tokio::task::spawn_blocking(move || {
                crate::leader::start(lease, engine_config, tokens, role, feed)
            })
            .await??
        }
    };
    for path in created {
        tracing::info!("created {path} (mode 0600)");
        eprintln!("ebb server: wrote {path}");
    }
    let ticks = role.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        loop {
            every.tick().await;
            if let Some(writer) = ticks.writer() {
                let _ = writer.send(Msg::Tick).await;
            }
        }
    });
    let proxy = Proxy::new(role.clone(), tls.as_ref().and_then(|t| t.ca.as_ref()).map(|ca| ca.pem.as_str()))?;
    let app = App {
        role: role.clone(),
        feed,
        tokens,
        poll_wait: Duration::from_millis(config.engine.heartbeat_interval.as_millis()),
        tls_ca: tls.as_ref().and_then(|t| t.ca.as_ref()).map(|ca| Arc::from(ca.pem.as_str())),
        streams: Arc::default(),
        metrics_token: config.metrics_token.clone(),
        registries: config.registries.clone(),
    };
    let router = router(app, role, proxy);
    let url_file = dir.join("server.url");
    std::fs::write(&url_file, format!("{url}\n"))
        .map_err(|source| ServeError::File { path: url_file, source })?;
    tracing::info!(%url, data_dir = %dir.display(), "ebb server listening");
    eprintln!("ebb server: listening on {url}");
    for line in tls.iter().flat_map(|t| t.join_hint(dir)) {
        eprintln!("ebb server: {line}");
    }
    crate::tls::serve(listener, router, tls.as_ref(), config.connections, shutdown_signal())
        .await
        .map_err(ServeError::Serving)
}

pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
