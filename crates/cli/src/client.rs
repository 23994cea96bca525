//! The API client the user commands share: where the server is, which
//! token to send, and errors that say what went wrong.

use std::path::PathBuf;

use crate::error::{file, usage, CliError};
use clap::Args;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How to reach the server: flags, then `EBB_SERVER` / `EBB_TOKEN` /
/// `EBB_CA`, then the config file (`$EBB_CONFIG`, or
/// `~/.config/ebb/config.json`). Flattened into each command that talks to
/// a server (global there, so `ebb tenant create NAME --server URL` works
/// too), and only those. The variables are read here rather than by clap,
/// which would count them as flags given and print them in every usage
/// line (`Usage: ebb bill --server <URL> --token <TOKEN>`) as if they were
/// still wanted.
#[derive(Args, Clone, Debug, Default)]
pub struct Connection {
    /// Server URL, e.g. http://127.0.0.1:7300; or several, comma-separated,
    /// tried in turn while one cannot be reached [env: EBB_SERVER]
    #[arg(long, global = true, value_name = "URL[,URL...]")]
    pub server: Option<String>,
    /// API token [env: EBB_TOKEN]
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// For https:// servers: the CA certificate (PEM) their certificates
    /// must be signed by; nothing else is trusted [env: EBB_CA]
    #[arg(long, global = true, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// An environment variable that is set and not empty.
fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `ebb --server URL --token T COMMAND`: the same flags given before the
/// command, as earlier releases took them. Not shown in `ebb --help`: each
/// command that talks to a server lists them itself.
#[derive(Args, Clone, Debug, Default)]
pub struct BeforeCommand {
    /// Server URL for the command that follows (as its own --server).
    #[arg(long, value_name = "URL", hide = true)]
    pub server: Option<String>,
    /// API token for the command that follows (as its own --token).
    #[arg(long, value_name = "TOKEN", hide = true)]
    pub token: Option<String>,
}

impl BeforeCommand {
    /// The command's connection, with these flags over its own (which may
    /// have come from the environment).
    pub fn or(&self, conn: Connection) -> Connection {
        Connection {
            server: self.server.clone().or(conn.server),
            token: self.token.clone().or(conn.token),
            ca: conn.ca,
        }
    }

    /// A command that talks to no server was given `--server` or `--token`.
    pub fn refuse(&self, command: &str) -> Result<(), CliError> {
        match (&self.server, &self.token) {
            (Some(_), _) => {
                Err(usage(format!("--server: {command} talks to no server; give it to a command that does")))
            }
            _ => self.refuse_token(command),
        }
    }

    /// `--token` for a command that takes none (`ebb agent` joins with its
    /// join token).
    pub fn refuse_token(&self, command: &str) -> Result<(), CliError> {
        match &self.token {
            Some(_) => Err(usage(format!("--token: {command} takes no API token"))),
            None => Ok(()),
        }
    }
}

#[derive(Default, Deserialize)]
struct ConfigFile {
    server: Option<String>,
    token: Option<String>,
    ca: Option<PathBuf>,
}

fn config_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("EBB_CONFIG") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config/ebb/config.json"))
}

/// How long a read may take (a followed log waits up to 20 s for output).
/// Why a request to the servers got no answer the command can use.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No server could be reached, or all were electing a leader: what
    /// each said. Nothing was done; sending it again may help.
    #[error("{}", .0.join("; "))]
    Unreachable(Vec<String>),
    /// A write whose answer did not come in time: it may have been applied.
    #[error(
        "{server} did not answer in {seconds}s; the request may or may not have been applied \
         (look before sending it again)"
    )]
    Unanswered { server: String, seconds: u64 },
    /// The server refused it, in its words.
    #[error("{message} (HTTP {status})")]
    Refused { status: u16, message: String },
    /// The answer is not Ebb's API.
    #[error(
        "{server} answered HTTP {status} with something that is not Ebb's API: is it an Ebb server \
         (EBB_SERVER, --server)?"
    )]
    NotEbb { server: String, status: u16 },
    /// The request could not be made (a URL the client cannot use).
    #[error("{0}")]
    Request(String),
}

impl ClientError {
    /// Whether sending the same request again may succeed: no server was
    /// reachable, or the server refused for now (it is unavailable, or the
    /// caller is over a limit that time lifts).
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Unreachable(_) => true,
            ClientError::Refused { status, .. } => matches!(status, 429 | 502 | 503),
            ClientError::Unanswered { .. } | ClientError::NotEbb { .. } | ClientError::Request(_) => false,
        }
    }

    /// The HTTP status the server refused with, if it did.
    pub fn refused_with(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a write may take before the command gives up on its answer.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a command waits for the servers to elect a leader.
const ELECTION: std::time::Duration = std::time::Duration::from_secs(20);

pub struct Client {
    /// Tried in order; the next only when one cannot be reached at all
    /// (the request never left) or did nothing with it (503), so nothing
    /// is ever applied twice.
    servers: Vec<String>,
    token: String,
    http: reqwest::Client,
    /// The CA `https://` servers are verified with, for messages.
    trust: Option<ebb_agent::tls::Trust>,
}

impl Connection {
    pub fn client(&self) -> Result<Client, CliError> {
        let with_env = Connection {
            server: self.server.clone().or_else(|| env_value("EBB_SERVER")),
            token: self.token.clone().or_else(|| env_value("EBB_TOKEN")),
            ca: self.ca.clone().or_else(|| env_value("EBB_CA").map(PathBuf::from)),
        };
        with_env.resolve()
    }

    /// The client for these settings, the config file filling what they lack.
    fn resolve(&self) -> Result<Client, CliError> {
        let config: ConfigFile = match config_path() {
            Some(path) if path.is_file() => {
                let text = std::fs::read_to_string(&path).map_err(file(&path))?;
                serde_json::from_str(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?
            }
            _ => ConfigFile::default(),
        };
        let server = self.server.clone().or(config.server).ok_or_else(|| {
            usage("no server: pass --server URL, set EBB_SERVER, or put \"server\" in ~/.config/ebb/config.json")
        })?;
        let token = self.token.clone().or(config.token).ok_or_else(|| {
            usage(
                "no token: pass --token TOKEN, set EBB_TOKEN, or put \"token\" in ~/.config/ebb/config.json",
            )
        })?;
        let servers =
            server.split(',').map(|s| check_url(s.trim())).collect::<Result<Vec<String>, CliError>>()?;
        let trust = self.trust(config.ca, &servers)?;
        let builder = match &trust {
            Some(trust) => trust.client_builder()?,
            None => reqwest::Client::builder(),
        };
        // Idle connections are dropped before the server closes them (its
        // header-read timeout, 30 s by default).
        let http = builder
            .connect_timeout(std::time::Duration::from_secs(5))
            .pool_idle_timeout(std::time::Duration::from_secs(20))
            .build()
            .map_err(|e| ClientError::Request(e.to_string()))?;
        Ok(Client { servers, token: token.trim().to_string(), http, trust })
    }

    /// The CA `https://` servers are verified with: `--ca`, `EBB_CA` or the
    /// config file's `ca`. Needed for an `https://` server. `--ca` or
    /// `EBB_CA` with a plain `http://` server is refused: whoever gave it
    /// would think the server verified.
    fn trust(
        &self,
        file: Option<PathBuf>,
        servers: &[String],
    ) -> Result<Option<ebb_agent::tls::Trust>, CliError> {
        let Some(path) = self.ca.clone().or(file) else {
            return match servers.iter().find(|s| ebb_agent::tls::is_https(s)) {
                Some(server) => Err(usage(format!(
                    "server {server} is https://: pass --ca FILE, set EBB_CA, or put \"ca\" in \
                     ~/.config/ebb/config.json (the CA that signed its certificate)"
                ))),
                None => Ok(None),
            };
        };
        if let Some(server) =
            servers.iter().find(|s| !ebb_agent::tls::is_https(s)).filter(|_| self.ca.is_some())
        {
            return Err(usage(format!(
                "--ca: server {server} is plain http://, not verified; give its https:// URL"
            )));
        }
        Ok(Some(ebb_agent::tls::Trust::from_pem_file(&path, "--ca")?))
    }
}

/// The server's URL, or an error saying what it should look like: a
/// scheme is needed (`127.0.0.1:7300` and `localhost:7300` are not URLs).
fn check_url(server: &str) -> Result<String, CliError> {
    let parsed =
        reqwest::Url::parse(server).ok().filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
    match parsed {
        Some(_) => Ok(server.trim_end_matches('/').to_string()),
        None if server.contains("://") => {
            Err(usage(format!("server {server:?}: not an http:// or https:// URL")))
        }
        None => Err(usage(format!("server {server:?}: not a URL; did you mean http://{server}?"))),
    }
}

/// Why a request got no answer, in words: the innermost cause (`connection
/// refused`), not the HTTP library's wrapping of it; for a certificate that
/// could not be verified, why, and against which CA.
fn unreachable(server: &str, e: &reqwest::Error, trust: Option<&ebb_agent::tls::Trust>) -> String {
    if let Some(problem) = ebb_agent::tls::certificate_problem(server, e, trust) {
        return problem;
    }
    if e.is_timeout() {
        return format!("cannot connect to {server}: no answer in time");
    }
    let text = ebb_http::causes::innermost(e);
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    let mut words = text.chars();
    let text = match words.next() {
        Some(first) => first.to_lowercase().chain(words).collect(),
        None => text,
    };
    format!("cannot connect to {server}: {text}")
}

impl Client {
    /// Sends the request `build` makes for a server's base URL to each
    /// server in turn until one answers. A server that cannot be reached,
    /// or answers 503 (it is not leading and could not forward the
    /// request: nothing was done), is passed over; while the servers are
    /// electing a leader (some answered 503), the round is tried again for
    /// a while.
    async fn send<T: DeserializeOwned>(
        &self,
        build: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let deadline = std::time::Instant::now() + ELECTION;
        loop {
            let mut passed = Vec::new();
            let mut electing = false;
            for server in &self.servers {
                let mut request = build(server)
                    .bearer_auth(&self.token)
                    .build()
                    .map_err(|e| ClientError::Request(e.to_string()))?;
                // A read is the same on any server: one that holds it too long
                // (frozen, cut off) is passed over. A write is not sent twice.
                let read = request.method() == reqwest::Method::GET;
                *request.timeout_mut() = Some(if read { READ_TIMEOUT } else { WRITE_TIMEOUT });
                match self.http.execute(request).await {
                    // 503: not forwarded, nothing done. 502 to a read: the leader
                    // went while it held it; a read is asked again.
                    Ok(resp)
                        if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
                            || (read && resp.status() == reqwest::StatusCode::BAD_GATEWAY) =>
                    {
                        electing = true;
                        passed.push(
                            self.answer::<serde_json::Value>(server, resp).await.unwrap_err().to_string(),
                        );
                    }
                    Ok(resp) => return self.answer(server, resp).await,
                    // Not connected: the request never left; the next may answer.
                    Err(e) if e.is_connect() || (read && e.is_timeout()) => {
                        passed.push(unreachable(server, &e, self.trust.as_ref()))
                    }
                    Err(e) if e.is_timeout() => {
                        let (server, seconds) = (server.clone(), WRITE_TIMEOUT.as_secs());
                        return Err(ClientError::Unanswered { server, seconds });
                    }
                    Err(e) => {
                        return Err(ClientError::Unreachable(vec![unreachable(
                            server,
                            &e,
                            self.trust.as_ref(),
                        )]))
                    }
                }
            }
            if !electing || std::time::Instant::now() >= deadline {
                return Err(ClientError::Unreachable(passed));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    async fn answer<T: DeserializeOwned>(
        &self,
        server: &str,
        resp: reqwest::Response,
    ) -> Result<T, ClientError> {
        let status = resp.status().as_u16();
        let body = resp
            .text()
            .await
            .map_err(|e| ClientError::Unreachable(vec![unreachable(server, &e, self.trust.as_ref())]))?;
        let not_ebb = || ClientError::NotEbb { server: server.to_string(), status };
        if !(200..300).contains(&status) {
            return match serde_json::from_str::<ebb_api::ErrorBody>(&body) {
                Ok(e) => Err(ClientError::Refused { status, message: e.error }),
                Err(_) => Err(not_ebb()),
            };
        }
        serde_json::from_str(&body).map_err(|_| not_ebb())
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(|base| self.http.get(format!("{base}{path}"))).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(|base| self.http.post(format!("{base}{path}")).json(body)).await
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(|base| self.http.put(format!("{base}{path}")).json(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(|base| self.http.delete(format!("{base}{path}"))).await
    }

    /// GET with query parameters, encoded.
    pub async fn get_query<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        self.send(|base| self.http.get(format!("{base}{path}")).query(query)).await
    }
}
