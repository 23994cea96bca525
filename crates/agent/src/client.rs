//! The agent's calls to the server: registration, the command poll and
//! reports, each carrying the node's credential (or, before the server has
//! issued one, the join token), and what a failed call means for the
//! caller ([`CallError`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use ebb_api::{Commands, Register, Registered, Report, ReportReply};
use serde::Deserialize;

/// Why a call to the server failed, by what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The server answered 409: register again.
    #[error("{0}")]
    Reregister(String),
    /// The server refused the request as it is (400, 413, 422, ...):
    /// sending it again would be refused again.
    #[error("{0}")]
    Refused(String),
    /// The server answered 401 to this node's credential: it was revoked
    /// (`ebb nodes remove`) or is unknown to the server.
    #[error("{0}")]
    Unauthorized(String),
    /// The server could not be reached, or failed: trying again may help.
    #[error("{0}")]
    Other(String),
}

/// The server's agent API, as this node.
pub(crate) struct Client {
    http: reqwest::Client,
    /// The control plane's servers, any of which answers (one leads, the
    /// others forward to it).
    servers: Vec<String>,
    /// The one calls go to, until it cannot be reached or does not
    /// answer in time; then the next.
    current: std::sync::atomic::AtomicUsize,
    join_token: String,
    /// This node's own credential, once the server has issued it: every
    /// call but the first registration carries it instead of the join
    /// token.
    credential: Mutex<Option<String>>,
    /// Where the credential is kept (0600).
    credential_path: PathBuf,
    /// The CA an `https://` server is verified with, for messages.
    trust: Option<crate::tls::Trust>,
}

impl Client {
    /// A client for `servers` (comma-separated URLs), with the credential
    /// a previous life of this agent kept in `data_dir` if any (see
    /// [`load_credential`]).
    pub(crate) fn new(
        http: reqwest::Client,
        servers: &str,
        join_token: &str,
        data_dir: &Path,
        credential: Option<String>,
    ) -> Client {
        Client {
            http,
            servers: servers
                .split(',')
                .map(|s| s.trim().trim_end_matches('/').to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            current: Default::default(),
            join_token: join_token.to_string(),
            credential: Mutex::new(credential),
            credential_path: credential_path(data_dir),
            trust: None,
        }
    }

    /// Says, when a certificate cannot be verified, which CA it was
    /// verified with.
    pub(crate) fn trusting(mut self, trust: Option<crate::tls::Trust>) -> Client {
        self.trust = trust;
        self
    }

    /// The server calls go to now.
    pub(crate) fn server(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.servers[i % self.servers.len()]
    }

    /// Calls go to the next server from now on.
    fn next_server(&self, from: &str) {
        if self.servers.len() > 1 && self.server() == from {
            self.current.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("{from} cannot be reached; trying {}", self.server());
        }
    }

    pub(crate) fn credential_path(&self) -> &Path {
        &self.credential_path
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server())
    }

    /// The node's credential, or the join token before it has one.
    fn bearer(&self) -> String {
        let credential = self.credential.lock().expect("credential");
        credential.clone().unwrap_or_else(|| self.join_token.clone())
    }

    fn has_credential(&self) -> bool {
        self.credential.lock().expect("credential").is_some()
    }

    async fn call<T: for<'de> Deserialize<'de>>(&self, req: reqwest::RequestBuilder) -> Result<T, CallError> {
        let server = self.server().to_string();
        let resp = req.bearer_auth(self.bearer()).send().await.map_err(|e| {
            if e.is_connect() || e.is_timeout() {
                self.next_server(&server);
            }
            CallError::Other(
                crate::tls::certificate_problem(&server, &e, self.trust.as_ref())
                    .unwrap_or_else(|| ebb_http::causes::chain(&e)),
            )
        })?;
        let status = resp.status();
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            // A server that is not leading and cannot reach the leader: the
            // next may be the one that leads now.
            self.next_server(&server);
        }
        if status.is_success() {
            return resp.json().await.map_err(|e| CallError::Other(e.to_string()));
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ebb_api::ErrorBody>(&body).map_or(body, |e| e.error);
        match status.as_u16() {
            409 => Err(CallError::Reregister(message)),
            401 if self.has_credential() => Err(CallError::Unauthorized(message)),
            // Credentials may be fixed by the operator; the request itself
            // was not at fault.
            401 | 403 => Err(CallError::Other(format!("{status}: {message}"))),
            400..=499 => Err(CallError::Refused(format!("{status}: {message}"))),
            _ => Err(CallError::Other(format!("{status}: {message}"))),
        }
    }

    /// Registers the node; a credential the server issues is kept on disk
    /// before it is used: a node whose credential is lost cannot rejoin
    /// without the operator.
    pub(crate) async fn register(&self, body: &Register) -> Result<Registered, CallError> {
        let registered: Registered =
            self.call(self.http.post(self.url("/v1/agent/register")).json(body)).await?;
        if let Some(credential) = &registered.credential {
            let path = self.credential_path.clone();
            let kept = credential.clone();
            let written = tokio::task::spawn_blocking(move || write_credential(&path, &kept))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            written.map_err(|e| {
                CallError::Other(format!(
                    "cannot keep the node credential in {}: {e}",
                    self.credential_path.display()
                ))
            })?;
            tracing::info!(
                path = %self.credential_path.display(),
                "node credential issued by the server and kept (0600)"
            );
            *self.credential.lock().expect("credential") = Some(credential.clone());
        }
        Ok(registered)
    }

    /// The commands after `after`; the poll is the node's heartbeat, and
    /// says why the node is unhealthy if it is (`failing`).
    pub(crate) async fn poll(
        &self,
        node: &str,
        epoch: u64,
        after: u64,
        timeout: Duration,
        failing: Option<String>,
    ) -> Result<Commands, CallError> {
        let url = self.url(&format!("/v1/agent/commands?node={node}&epoch={epoch}&after={after}"));
        let mut req = self.http.get(url).timeout(timeout);
        if let Some(why) = failing {
            req = req.query(&[("failing", why)]);
        }
        self.call(req).await
    }

    /// The image a running attempt's step names, pinned for the attempt.
    pub(crate) async fn step_image(
        &self,
        asked: &ebb_api::StepImage,
    ) -> Result<ebb_api::StartImage, CallError> {
        self.call(self.http.post(self.url("/v1/agent/image")).json(asked)).await
    }

    pub(crate) async fn report(&self, report: &Report) -> Result<ReportReply, CallError> {
        self.call(self.http.post(self.url("/v1/agent/report")).json(report)).await
    }
}

/// Where the node's credential is kept, in the agent's data dir (0600).
fn credential_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.credential")
}

/// Writes the credential atomically, readable by the agent's user alone.
fn write_credential(path: &Path, credential: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(credential.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The credential a previous life of this agent was issued, if any: with
/// it the node rejoins as itself; without it, with the join token.
/// Blocking (reads a file).
pub(crate) fn load_credential(data_dir: &Path) -> Result<Option<String>, crate::AgentError> {
    let path = credential_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            tracing::info!(path = %path.display(), "registering with the node credential kept here");
            Ok(Some(text.trim().to_string()))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(crate::AgentError::Credential { path, source }),
    }
}
