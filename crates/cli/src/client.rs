//! The API client the user commands share: where the server is, which
//! token to send, and errors that say what went wrong.

use std::path::PathBuf;

use clap::Args;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How to reach the server: flags, then `EBB_SERVER` / `EBB_TOKEN`, then
/// the config file (`$EBB_CONFIG`, or `~/.config/ebb/config.json`).
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// Server URL, e.g. http://127.0.0.1:7300.
    #[arg(long, env = "EBB_SERVER", global = true, hide_env_values = true)]
    pub server: Option<String>,
    /// API token.
    #[arg(long, env = "EBB_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Default, Deserialize)]
struct ConfigFile {
    server: Option<String>,
    token: Option<String>,
}

fn config_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("EBB_CONFIG") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config/ebb/config.json"))
}

pub struct Client {
    server: String,
    token: String,
    http: reqwest::Client,
}

impl Connection {
    pub fn client(&self) -> Result<Client, String> {
        let file: ConfigFile = match config_path() {
            Some(path) if path.is_file() => {
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            _ => ConfigFile::default(),
        };
        let server = self.server.clone().or(file.server).ok_or(
            "no server: pass --server URL, set EBB_SERVER, or put \"server\" in ~/.config/ebb/config.json",
        )?;
        let token = self.token.clone().or(file.token).ok_or(
            "no token: pass --token TOKEN, set EBB_TOKEN, or put \"token\" in ~/.config/ebb/config.json",
        )?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Client { server: server.trim_end_matches('/').to_string(), token: token.trim().to_string(), http })
    }
}

impl Client {
    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, String> {
        let resp = req.bearer_auth(&self.token).send().await.map_err(|e| format!("{}: {e}", self.server))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            let message = serde_json::from_str::<ebb_api::ErrorBody>(&body).map_or(body, |e| e.error);
            return Err(format!("{message} (HTTP {})", status.as_u16()));
        }
        serde_json::from_str(&body).map_err(|e| format!("unexpected answer from the server: {e}"))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.send(self.http.get(format!("{}{path}", self.server))).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, String> {
        self.send(self.http.post(format!("{}{path}", self.server)).json(body)).await
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, String> {
        self.send(self.http.put(format!("{}{path}", self.server)).json(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.send(self.http.delete(format!("{}{path}", self.server))).await
    }

    /// GET with query parameters, encoded.
    pub async fn get_query<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, String> {
        self.send(self.http.get(format!("{}{path}", self.server)).query(query)).await
    }
}
