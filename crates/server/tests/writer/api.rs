//! The REST API in-process: the server's own router over a `TestEnv`'s
//! writer. Each request is served with `tower::ServiceExt::oneshot`, and
//! whatever the handler asks the writer is handled as one batch at the
//! harness's instant, with `Engine::sanity_check` after it. A test reads
//! what a client reads (the status and the JSON) with no listener, no
//! process and no sleep, and moves time itself (`env.now`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use ebb_server::engine::Msg;
use ebb_server::leader::Role;
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::harness::TestEnv;

/// An operator's scrape token for `/metrics`, as `--metrics-token-file`.
pub const SCRAPE_TOKEN: &str = "ebb_scrape-token-of-the-tests";

pub struct Api {
    pub env: TestEnv,
    /// The bootstrap operator's token, as `admin.token` holds it.
    pub admin: String,
    rx: mpsc::Receiver<Msg>,
    role: Arc<Role>,
    rt: tokio::runtime::Runtime,
}

/// A response as a client sees it: the status and the body, as JSON where
/// it is JSON and as a string where it is not.
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The refusal's message (`ErrorBody.error`), or the whole body.
    pub fn error(&self) -> String {
        match self.body["error"].as_str() {
            Some(message) => message.to_string(),
            None => self.body.to_string(),
        }
    }
}

impl Api {
    /// A writer in a fresh directory, configured by `tune` from the tests'
    /// defaults (`EngineConfig::for_tests`).
    pub fn new(name: &str, tune: impl FnOnce(&mut ebb_server::EngineConfig)) -> Api {
        let mut env = TestEnv::new(&format!("api-{name}"));
        tune(&mut env.config);
        env.restart();
        let admin = std::fs::read_to_string(env.dir.join("admin.token")).unwrap().trim().to_string();
        let (tx, rx) = mpsc::channel(1024);
        let role = Arc::new(Role::default());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut api = Api { env, admin, rx, role, rt };
        api.lead(tx);
        api
    }

    /// The server restarts on its store: a new writer from what it holds,
    /// and the router's queue to it.
    pub fn restart(&mut self) {
        self.env.restart();
        let (tx, rx) = mpsc::channel(1024);
        self.rx = rx;
        self.lead(tx);
    }

    /// The role leads with this writer: its queue and its quiet lines.
    fn lead(&mut self, tx: mpsc::Sender<Msg>) {
        let lines = self.env.engine().lines();
        self.role.lead(0, "http://in-process", tx, lines);
    }

    /// `node` joins with `gpus` GPUs of `model` and polls once.
    pub fn node(&mut self, node: &str, model: &str, gpus: u8) {
        self.env.register_node(node, model, gpus, Vec::new(), Vec::new());
    }

    /// One request, with `token` as its bearer where given and `body` as
    /// its JSON. The writer handles what the handler sends it meanwhile.
    pub fn call(&mut self, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(body).unwrap())),
            None => request.body(Body::empty()),
        }
        .unwrap();
        self.raw(request)
    }

    /// One request as given, bytes and all.
    pub fn raw(&mut self, request: Request<Body>) -> Answer {
        let router = ebb_server::http::in_process(
            self.role.clone(),
            self.env.tokens.clone(),
            Arc::new(tokio::sync::watch::Sender::new(0)),
            Some(SCRAPE_TOKEN),
        );
        let (env, rx) = (&mut self.env, &mut self.rx);
        let response = self.rt.block_on(async {
            let served = router.oneshot(request);
            tokio::pin!(served);
            loop {
                tokio::select! {
                    biased;
                    response = &mut served => break response.unwrap(),
                    Some(first) = rx.recv() => {
                        let mut batch = vec![first];
                        while let Ok(msg) = rx.try_recv() {
                            batch.push(msg);
                        }
                        let now = env.now;
                        env.engine().batch(batch, now).unwrap();
                        env.engine().sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
                    }
                }
            }
        });
        let status = response.status().as_u16();
        let bytes = self.rt.block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).unwrap();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Answer { status, body }
    }

    pub fn get(&mut self, token: &str, path: &str) -> Answer {
        self.call("GET", path, Some(token), None)
    }

    pub fn post(&mut self, token: &str, path: &str, body: &Value) -> Answer {
        self.call("POST", path, Some(token), Some(body))
    }

    pub fn put(&mut self, token: &str, path: &str, body: &Value) -> Answer {
        self.call("PUT", path, Some(token), Some(body))
    }

    /// A tenant made by the operator: its token.
    pub fn tenant(&mut self, name: &str) -> String {
        let admin = self.admin.clone();
        let made = self.post(&admin, "/v1/tenants", &serde_json::json!({ "name": name }));
        assert_eq!(made.status, 201, "{}", made.body);
        made.body["token"].as_str().unwrap().to_string()
    }

    /// A job submitted as `token`: its id.
    pub fn submit(&mut self, token: &str, spec: &Value) -> u64 {
        let made = self.post(token, "/v1/jobs", spec);
        assert_eq!(made.status, 201, "{spec}: {}", made.body);
        made.body["id"].as_u64().unwrap()
    }

    /// Job `id` as the operator sees it.
    pub fn job(&mut self, id: u64) -> Value {
        let admin = self.admin.clone();
        let shown = self.get(&admin, &format!("/v1/jobs/{id}"));
        assert_eq!(shown.status, 200, "{}", shown.body);
        shown.body
    }

    /// Every job the operator sees, by id, page by page.
    pub fn all_ids(&mut self) -> Vec<u64> {
        let admin = self.admin.clone();
        let (mut ids, mut cursor) = (Vec::new(), 0);
        loop {
            let page = self.get(&admin, &format!("/v1/jobs?limit=500&cursor={cursor}"));
            assert_eq!(page.status, 200, "{}", page.body);
            ids.extend(page.body["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
            match page.body["next_cursor"].as_u64() {
                Some(next) => cursor = next,
                None => return ids,
            }
        }
    }
}
