//! Several servers on one PostgreSQL database, one leader.
//!
//! Leadership is a lease row in the database (`pg.rs`): an epoch, where
//! the leader answers, its database session, and when the lease ends. The
//! leader renews it at the start of every transaction, and that renewal is
//! also the fencing check: it matches only the epoch this server took, so
//! a leader deposed while it was frozen or cut off writes nothing. A
//! server that is not the leader follows: it reads the lease a few times a
//! second, takes it when it is open (expired, or its holder's database
//! session gone), restores the engine from the database (the restart path)
//! and leads; until then it forwards every request but `/healthz` to the
//! leader. A leader whose transaction fails (deposed, or the database
//! lost) drops its engine, whose memory may be ahead of the database, and
//! follows again.
//!
//! Why a lease row and not an advisory lock alone: a session lock is held
//! as long as its connection lives, and the connection of a frozen process
//! or one behind a partition lives on, so such a leader would never be
//! replaced; a row has an end time the database's clock enforces, and
//! carries the epoch that every batch checks. The holder's session is
//! still used, as a fast path: a leader whose process died has no session,
//! and is replaced at once rather than at its lease's end.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::engine::OpenError;
use crate::http::ServeError;

use crate::engine::{Engine, EngineConfig, Feed, Lines, Msg};
use crate::store::pg::PgStore;
use crate::store::{Store, StoreError};
use crate::{ApiError, TokenMap};

/// What this server is now, shared by the handlers and the lease loop.
pub struct Role {
    now: RwLock<Now>,
    /// Bumped whenever the leadership this server sees changes.
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for Role {
    fn default() -> Self {
        Role { now: RwLock::default(), changes: tokio::sync::watch::Sender::new(0) }
    }
}

#[derive(Clone, Default)]
struct Now {
    /// The writer's queue while this server leads.
    writer: Option<mpsc::Sender<Msg>>,
    /// The writer's quiet lines while this server leads.
    lines: Option<Arc<Lines>>,
    epoch: u64,
    /// Where the leader answers: this server's own URL while it leads.
    leader: String,
}

/// `GET /healthz`.
#[derive(Serialize)]
pub struct Health {
    pub role: &'static str,
    /// The leadership's fencing epoch (0 on the embedded database, where a
    /// server is alone).
    pub epoch: u64,
    /// Where the leader answers ("" while none is known).
    pub leader: String,
}

impl Role {
    pub fn lead(&self, epoch: u64, url: &str, writer: mpsc::Sender<Msg>, lines: Arc<Lines>) {
        self.set(Now { writer: Some(writer), lines: Some(lines), epoch, leader: url.to_string() });
    }

    pub fn follow(&self, epoch: u64, leader: &str) {
        self.set(Now { writer: None, lines: None, epoch, leader: leader.to_string() });
    }

    fn set(&self, new: Now) {
        let mut now = self.now.write().expect("role");
        let changed = now.writer.is_some() != new.writer.is_some() || now.leader != new.leader;
        *now = new;
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// The writer's queue, while this server leads.
    pub fn writer(&self) -> Option<mpsc::Sender<Msg>> {
        self.now.read().expect("role").writer.clone()
    }

    /// The writer's quiet lines, while this server leads.
    pub fn lines(&self) -> Option<Arc<Lines>> {
        self.now.read().expect("role").lines.clone()
    }

    pub fn health(&self) -> Health {
        let now = self.now.read().expect("role");
        Health {
            role: if now.writer.is_some() { "leader" } else { "follower" },
            epoch: now.epoch,
            leader: now.leader.clone(),
        }
    }

    /// The leader's URL while another server leads.
    fn elsewhere(&self) -> Result<Option<String>, ()> {
        let now = self.now.read().expect("role");
        match (&now.writer, now.leader.as_str()) {
            (Some(_), _) => Ok(None),
            (None, "") => Err(()),
            (None, url) => Ok(Some(url.to_string())),
        }
    }
}

/// How the lease is held and watched.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The database, as `--database` gave it.
    pub database: String,
    /// Where other servers and clients reach this one.
    pub url: String,
    /// The lease's length: a leader that has not renewed it for this long
    /// (frozen, cut off from the database) is replaced.
    pub lease: Duration,
}

impl LeaseConfig {
    /// How often a follower reads the lease.
    fn watch(&self) -> Duration {
        (self.lease / 10).clamp(Duration::from_millis(50), Duration::from_millis(250))
    }
}

/// Starts the lease loop on a thread of its own (it becomes the writer
/// while this server leads) and returns once the first decision is made:
/// leading, with the files the engine created, or following. An error
/// before that (the database unreachable, the engine failing to load) is
/// the server's start failing.
pub fn start(
    lease: LeaseConfig,
    engine: EngineConfig,
    tokens: TokenMap,
    role: Arc<Role>,
    feed: Feed,
) -> Result<Vec<String>, ServeError> {
    let first = PgStore::open(&lease.database).map_err(OpenError::from)?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ebb-lease".into())
        .spawn(move || run(lease, engine, tokens, role, feed, first, ready_tx))
        .map_err(|e| ServeError::Thread("lease", e))?;
    Ok(ready_rx.recv().map_err(|_| ServeError::NotReady("lease"))??)
}

type Ready = std::sync::mpsc::Sender<Result<Vec<String>, OpenError>>;

fn run(
    lease: LeaseConfig,
    engine: EngineConfig,
    tokens: TokenMap,
    role: Arc<Role>,
    feed: Feed,
    first: PgStore,
    ready: Ready,
) {
    let mut ready = Some(ready);
    let mut store = Some(first);
    loop {
        let mut db = match store.take().map_or_else(|| PgStore::open(&lease.database), Ok) {
            Ok(db) => db,
            Err(e) => {
                tracing::warn!("{e}; trying again");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let epoch = match follow(&mut db, &lease, &role, &mut ready) {
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::warn!("the lease: {e}; connecting again");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        tokens.write().expect("token map").clear();
        let loading = std::time::Instant::now();
        match lead(db, engine.clone(), &tokens, &feed, &role, epoch, &lease.url) {
            Ok((writer, rx, created)) => {
                let loaded = loading.elapsed().as_secs_f64();
                tracing::info!(epoch, url = %lease.url, load_seconds = loaded, "leading");
                eprintln!("ebb server: leading at epoch {epoch} (the state loaded in {loaded:.2} s)");
                match ready.take() {
                    Some(ready) => {
                        let _ = ready.send(Ok(created));
                    }
                    None => created.iter().for_each(|path| tracing::info!("created {path}")),
                }
                let ended = writer.run(rx);
                role.follow(epoch, "");
                tokens.write().expect("token map").clear();
                match ended {
                    Some(e) => {
                        tracing::warn!("{e}; following");
                        eprintln!("ebb server: no longer leading ({e}); following");
                    }
                    None => return,
                }
            }
            Err(e) => {
                role.follow(epoch, "");
                tracing::error!("cannot lead: {e}");
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(e));
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// A writer ready to run: the engine, the channel its messages come by,
/// and the files it created.
pub(crate) type Leading<S> = (Engine<S>, mpsc::Receiver<Msg>, Vec<String>);

/// Makes this server the writer on `store`, for the single server and for
/// a leader alike: restores the engine from the store, publishes its
/// commits to `feed`, and hands the handlers the channel its messages come
/// by. Returns the engine (to `run` on the caller's thread), that channel's
/// receiving end, and the files the engine created.
pub(crate) fn lead<S: Store>(
    store: S,
    config: EngineConfig,
    tokens: &TokenMap,
    feed: &Feed,
    role: &Role,
    epoch: u64,
    url: &str,
) -> Result<Leading<S>, OpenError> {
    let outbound = config.outbound.clone();
    let (mut engine, created) = Engine::open(store, config, tokens.clone(), crate::engine::now_ms())?;
    engine.feed(feed.clone());
    let (tx, rx) = mpsc::channel(1 << 16);
    // Deliveries leave through the deliverer, which does not keep the
    // writer alive: a writer that stops leading takes it with it.
    engine.deliver_webhooks(crate::webhooks::start(tx.downgrade(), outbound));
    role.lead(epoch, url, tx, engine.lines());
    Ok((engine, rx, created))
}

/// Follows the leader until the lease is open, then takes it. Returns the
/// new epoch.
fn follow(
    db: &mut PgStore,
    lease: &LeaseConfig,
    role: &Role,
    ready: &mut Option<Ready>,
) -> Result<u64, StoreError> {
    let ms = lease.lease.as_millis() as u64;
    loop {
        let seen = db.lease()?;
        if seen.open {
            if let Some(epoch) = db.take_lease(&lease.url, ms)? {
                return Ok(epoch);
            }
            continue;
        }
        role.follow(seen.epoch, &seen.url);
        if let Some(ready) = ready.take() {
            tracing::info!(epoch = seen.epoch, leader = %seen.url, "following");
            eprintln!("ebb server: following the leader at {} (epoch {})", seen.url, seen.epoch);
            let _ = ready.send(Ok(Vec::new()));
        }
        std::thread::sleep(lease.watch());
    }
}

/// `GET /healthz`: who leads, from any server.
pub async fn healthz(State(role): State<Arc<Role>>) -> Json<Health> {
    Json(role.health())
}

/// Every request (but `/healthz` and the CA) to a server that does not lead is forwarded to the one
/// that does, and its answer returned as it came. A proxy rather than a
/// redirect: every client works unchanged (HTTP clients drop the
/// `Authorization` header when a redirect changes the host), and an agent
/// or CLI that reaches any server is answered.
///
/// A 503 means the request was not forwarded (no leader known, or the
/// leader could not be reached): nothing was done, and it may be sent
/// again. A 502 means it was sent and no answer came: it may or may not
/// have been applied.
pub async fn forward(State(proxy): State<Proxy>, request: Request, next: Next) -> Response {
    // Every server answers these itself: who leads, and the CA they share.
    if ["/healthz", "/v1/tls/ca.crt"].contains(&request.uri().path()) {
        return next.run(request).await;
    }
    match proxy.role.elsewhere() {
        Ok(None) => next.run(request).await,
        // Forwarded once already: the servers' views of the lease differ for
        // a moment, and a request is never passed round between them.
        Ok(Some(_)) if request.headers().contains_key(FORWARDED) => {
            unavailable("this server is not leading now; nothing was done, try again in a moment".into())
        }
        Ok(Some(leader)) => proxy.send(&leader, request).await,
        Err(()) => unavailable("no leader yet: the servers are electing one; try again in a moment".into()),
    }
}

/// Marks a request one server forwarded to another.
const FORWARDED: &str = "x-ebb-forwarded";

#[derive(Clone)]
pub struct Proxy {
    pub role: Arc<Role>,
    pub http: reqwest::Client,
}

impl Proxy {
    /// Forwards over HTTPS trusting `ca` (PEM) alone: the servers of one
    /// control plane share their CA.
    pub fn new(role: Arc<Role>, ca: Option<&str>) -> Result<Proxy, ServeError> {
        let mut http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(20))
            .redirect(reqwest::redirect::Policy::none())
            .tls_built_in_root_certs(false);
        if let Some(pem) = ca {
            let cert = reqwest::Certificate::from_pem(pem.as_bytes())
                .map_err(|source| ServeError::Proxy { what: "the CA", source })?;
            http = http.add_root_certificate(cert);
        }
        let http =
            http.build().map_err(|source| ServeError::Proxy { what: "the forwarding client", source })?;
        Ok(Proxy { role, http })
    }

    async fn send(&self, leader: &str, request: Request) -> Response {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{}{path}", leader.trim_end_matches('/'));
        let body = match axum::body::to_bytes(body, ebb_api::MAX_REQUEST_BYTES).await {
            Ok(body) => body,
            Err(_) => {
                return ApiError { status: 413, message: "body: over the 2 MiB limit".into() }.into_response()
            }
        };
        let mut out = self.http.request(parts.method, &url).header(FORWARDED, "1").body(body);
        for name in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
            if let Some(value) = parts.headers.get(&name) {
                out = out.header(name, value);
            }
        }
        // A leader replaced while it holds the request (frozen, cut off) may
        // never answer; the request is given up then, its outcome unknown:
        // the old leader may have committed it before it stopped.
        let mut changes = self.role.changes.subscribe();
        let sent = tokio::select! {
            sent = out.send() => sent,
            _ = changes.changed() => {
                return ApiError {
                    status: 502,
                    message: format!(
                        "the leader at {leader} was replaced while it held the request; \
                         it may or may not have been applied"
                    ),
                }
                .into_response()
            }
        };
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) if e.is_connect() => {
                return unavailable(format!(
                    "the leader at {leader} cannot be reached ({}); nothing was done, try again in a moment",
                    ebb_http::causes::innermost(&e)
                ))
            }
            Err(e) => {
                return ApiError {
                    status: 502,
                    message: format!(
                        "the leader at {leader} did not answer ({}); the request may or may not have been applied",
                        ebb_http::causes::innermost(&e)
                    ),
                }
                .into_response()
            }
        };
        let status = answer.status();
        let mut response = Response::builder().status(status.as_u16());
        for name in [header::CONTENT_TYPE, header::ALLOW, header::RETRY_AFTER, header::CACHE_CONTROL] {
            if let Some(value) = answer.headers().get(&name) {
                response = response.header(name, value);
            }
        }
        // Passed on as it comes: a live page's event stream never ends.
        response.body(Body::from_stream(answer.bytes_stream())).unwrap_or_else(|e| {
            ApiError::internal(format!("forwarding the leader's answer: {e}")).into_response()
        })
    }
}

fn unavailable(message: String) -> Response {
    let mut response = ApiError { status: 503, message }.into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}
