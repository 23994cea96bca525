//! The writer's test harness: a `TestEnv` owns an `Engine` over a store
//! that can be told to fail one write (`Faulty`), speaks for fake agents
//! (register, poll, report) as `ebb agent` does, drives batches at
//! explicit instants, and reopens the store as a restarted server would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ebb_api::{
    Action, AgentEvent, AttemptRef, CancelRequest, JobEvent, JobSubmission, Register, Report, ReportId,
};
use ebb_core::{JobId, TenantId};
use ebb_server::engine::{Engine, EngineConfig, Msg};
use ebb_server::store::{
    FinishedCount, JobColumns, JobPageQuery, LogState, NodeRow, PriceRow, ReservationRow, Scope, Snapshot,
    SqliteStore, Store, StoreError, TaskRow, TenantRow, TokenRow, UsageRow,
};
use ebb_server::Principal;
use serde::Serialize;
use tokio::sync::oneshot;

/// An instant far from the wall clock of any machine running this.
pub const T0: u64 = 1_900_000_000_000;

/// A store that fails the `n`-th call (from 1) of one write once armed.
pub struct Faulty<S: Store> {
    pub inner: S,
    pub armed: Arc<Mutex<Option<(&'static str, u32)>>>,
}

impl<S: Store> Faulty<S> {
    pub fn trip(&self, op: &'static str) -> Result<(), StoreError> {
        let mut armed = self.armed.lock().unwrap();
        match &mut *armed {
            Some((name, n)) if *name == op => {
                *n -= 1;
                if *n == 0 {
                    *armed = None;
                    return Err(StoreError::Io(format!("injected failure of {op}")));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl<S: Store> Store for Faulty<S> {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.inner.begin()
    }
    fn commit(&mut self) -> Result<(), StoreError> {
        self.trip("commit")?;
        self.inner.commit()
    }
    fn rollback(&mut self) -> Result<(), StoreError> {
        self.inner.rollback()
    }
    fn load<J: ebb_server::store::JobRow>(&mut self) -> Result<Snapshot<J>, StoreError> {
        self.inner.load()
    }
    fn put_tenant(&mut self, tenant: &TenantRow) -> Result<(), StoreError> {
        self.trip("put_tenant")?;
        self.inner.put_tenant(tenant)
    }
    fn put_token(&mut self, token: &TokenRow) -> Result<(), StoreError> {
        self.trip("put_token")?;
        self.inner.put_token(token)
    }
    fn delete_token(&mut self, hash: &str) -> Result<(), StoreError> {
        self.trip("delete_token")?;
        self.inner.delete_token(hash)
    }
    fn put_node(&mut self, node: &NodeRow) -> Result<(), StoreError> {
        self.trip("put_node")?;
        self.inner.put_node(node)
    }
    fn put_job<J: Serialize>(&mut self, id: JobId, columns: &JobColumns, job: &J) -> Result<(), StoreError> {
        self.trip("put_job")?;
        self.inner.put_job(id, columns, job)
    }
    fn job<J: ebb_server::store::JobRow>(&mut self, id: JobId) -> Result<Option<J>, StoreError> {
        self.inner.job(id)
    }
    fn job_page<J: ebb_server::store::JobRow>(
        &mut self,
        query: &JobPageQuery,
    ) -> Result<ebb_server::store::JobRows<J>, StoreError> {
        self.inner.job_page(query)
    }
    fn array_states(&mut self, array: JobId) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.array_states(array)
    }
    fn array_tasks(&mut self, array: JobId) -> Result<Vec<TaskRow>, StoreError> {
        self.inner.array_tasks(array)
    }
    fn finished_counts(&mut self) -> Result<Vec<FinishedCount>, StoreError> {
        self.inner.finished_counts()
    }
    fn add_event(&mut self, job: JobId, event: &JobEvent) -> Result<(), StoreError> {
        self.trip("add_event")?;
        self.inner.add_event(job, event)
    }
    fn events(&mut self, job: JobId) -> Result<Vec<JobEvent>, StoreError> {
        self.inner.events(job)
    }
    fn max_job_id(&mut self) -> Result<JobId, StoreError> {
        self.inner.max_job_id()
    }
    fn heard(&mut self, node: &str, at_ms: u64) -> Result<(), StoreError> {
        self.trip("heard")?;
        self.inner.heard(node, at_ms)
    }
    fn put_price(&mut self, price: &PriceRow) -> Result<(), StoreError> {
        self.trip("put_price")?;
        self.inner.put_price(price)
    }
    fn put_reservation(&mut self, reservation: &ReservationRow) -> Result<(), StoreError> {
        self.trip("put_reservation")?;
        self.inner.put_reservation(reservation)
    }
    fn delete_reservation(&mut self, id: u64) -> Result<(), StoreError> {
        self.trip("delete_reservation")?;
        self.inner.delete_reservation(id)
    }
    fn add_usage(&mut self, usage: &UsageRow) -> Result<(), StoreError> {
        self.trip("add_usage")?;
        self.inner.add_usage(usage)
    }
    fn usage(
        &mut self,
        tenant: Option<TenantId>,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<UsageRow>, StoreError> {
        self.inner.usage(tenant, from_ms, to_ms)
    }
    fn job_usage(&mut self, job: JobId) -> Result<Vec<UsageRow>, StoreError> {
        self.inner.job_usage(job)
    }
    fn put_tenant_limits(
        &mut self,
        tenant: TenantId,
        limits: &ebb_api::TenantLimits,
    ) -> Result<(), StoreError> {
        self.trip("put_tenant_limits")?;
        self.inner.put_tenant_limits(tenant, limits)
    }
    fn put_registry_login(
        &mut self,
        tenant: TenantId,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<(), StoreError> {
        self.trip("put_registry_login")?;
        self.inner.put_registry_login(tenant, registry, login)
    }
    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Result<(), StoreError> {
        self.trip("put_reclaim")?;
        self.inner.put_reclaim(model, limit)
    }
    fn put_webhook(&mut self, hook: &ebb_server::store::WebhookRow) -> Result<(), StoreError> {
        self.trip("put_webhook")?;
        self.inner.put_webhook(hook)
    }
    fn delete_webhook(&mut self, id: u64) -> Result<(), StoreError> {
        self.trip("delete_webhook")?;
        self.inner.delete_webhook(id)
    }
    fn put_delivery(&mut self, delivery: &ebb_server::store::DeliveryRow) -> Result<(), StoreError> {
        self.trip("put_delivery")?;
        self.inner.put_delivery(delivery)
    }
    fn delete_delivery(&mut self, id: u64) -> Result<(), StoreError> {
        self.trip("delete_delivery")?;
        self.inner.delete_delivery(id)
    }
    fn add_webhook_log(&mut self, webhook: u64, entry: &ebb_api::WebhookDelivery) -> Result<(), StoreError> {
        self.trip("add_webhook_log")?;
        self.inner.add_webhook_log(webhook, entry)
    }
    fn webhook_log(&mut self, webhook: u64) -> Result<Vec<ebb_api::WebhookDelivery>, StoreError> {
        self.inner.webhook_log(webhook)
    }
    fn last_reports(&mut self) -> Result<Vec<(String, ReportId)>, StoreError> {
        self.inner.last_reports()
    }
    fn put_last_report(&mut self, node: &str, id: ReportId) -> Result<(), StoreError> {
        self.trip("put_last_report")?;
        self.inner.put_last_report(node, id)
    }
    fn log_state(&mut self, job: JobId) -> Result<Option<LogState>, StoreError> {
        self.inner.log_state(job)
    }
    fn file_logs(&mut self) -> Result<Vec<(JobId, LogState)>, StoreError> {
        self.inner.file_logs()
    }
    fn put_log_state(&mut self, job: JobId, state: &LogState) -> Result<(), StoreError> {
        self.trip("put_log_state")?;
        self.inner.put_log_state(job, state)
    }
    fn put_output(
        &mut self,
        job: JobId,
        offset: u64,
        data: &[u8],
        node: Option<&str>,
    ) -> Result<(), StoreError> {
        self.trip("put_output")?;
        self.inner.put_output(job, offset, data, node)
    }
    fn output_sources(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<(u64, String)>, StoreError> {
        self.inner.output_sources(job, from, to)
    }
    fn output(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.output(job, from, to)
    }
    fn expire_output(&mut self, job: JobId, at_ms: u64) -> Result<(), StoreError> {
        self.trip("expire_output")?;
        self.inner.expire_output(job, at_ms)
    }
    fn prune_output(&mut self, now_ms: u64, limit: usize) -> Result<Vec<JobId>, StoreError> {
        self.trip("prune_output")?;
        self.inner.prune_output(now_ms, limit)
    }
    fn output_removed(&mut self, job: JobId) -> Result<Option<u64>, StoreError> {
        self.inner.output_removed(job)
    }
    fn output_len(&mut self, job: JobId) -> Result<u64, StoreError> {
        self.inner.output_len(job)
    }
}

/// One fake agent's view of its command stream.
pub struct Agent {
    pub epoch: u64,
    pub after: u64,
}

/// The writer, its store's directory and the fake agents.
/// Where the writer keeps its state: opened afresh at every (re)start.
pub type Open<S> = Box<dyn Fn() -> S>;

pub struct TestEnv<S: Store = SqliteStore> {
    pub dir: PathBuf,
    pub open_store: Open<S>,
    pub engine: Option<Engine<Faulty<S>>>,
    pub armed: Arc<Mutex<Option<(&'static str, u32)>>>,
    pub agents: BTreeMap<String, Agent>,
    pub admin: Principal,
    pub now: u64,
    /// The writer's configuration, at the next (re)start.
    pub config: EngineConfig,
    /// The tokens the writer knows, as the router reads them.
    pub tokens: ebb_server::TokenMap,
    /// The agents say they hold a start back until its GPUs are free, and
    /// which they hold (`staged`).
    pub starts_when_free: bool,
    pub waiting: Vec<AttemptRef>,
}

pub fn config(dir: &Path) -> EngineConfig {
    EngineConfig::for_tests(dir)
}

impl TestEnv<SqliteStore> {
    /// A writer on SQLite, a file in the test's directory, unsynced: a
    /// restart here is the process's, never the machine's (the store's
    /// durability has tests of its own).
    pub fn new(name: &str) -> TestEnv<SqliteStore> {
        TestEnv::with_store(name, |dir| {
            let path = dir.join("ebb.db");
            Box::new(move || SqliteStore::open_unsynced(&path).unwrap())
        })
    }
}

/// A test that passes leaves nothing behind; one that fails keeps its
/// directory (the database and the logs) to look at.
impl<S: Store> Drop for TestEnv<S> {
    fn drop(&mut self) {
        self.engine = None;
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl<S: Store> TestEnv<S> {
    pub fn with_store(name: &str, open_store: impl FnOnce(&Path) -> Open<S>) -> TestEnv<S> {
        let dir = std::env::temp_dir().join(format!("ebb-writer-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let open_store = open_store(&dir);
        let config = config(&dir);
        let mut env = TestEnv {
            dir,
            open_store,
            engine: None,
            armed: Arc::new(Mutex::new(None)),
            agents: BTreeMap::new(),
            admin: Principal::tenant(Scope::Admin, TenantId(1), "default"),
            now: T0,
            config,
            tokens: Default::default(),
            starts_when_free: false,
            waiting: Vec::new(),
        };
        env.restart();
        env
    }

    /// A fresh writer over the same database, as after `kill -9`: the
    /// agents must register again.
    pub fn restart(&mut self) {
        self.engine = None;
        let inner = (self.open_store)();
        let store = Faulty { inner, armed: self.armed.clone() };
        self.tokens = Arc::new(RwLock::new(HashMap::new()));
        let (engine, _) = Engine::open(store, self.config.clone(), self.tokens.clone(), self.now)
            .map_err(|e| e.to_string())
            .unwrap();
        self.engine = Some(engine);
    }

    pub fn engine(&mut self) -> &mut Engine<Faulty<S>> {
        self.engine.as_mut().expect("running")
    }

    /// Fails the `n`-th `op` from now on.
    pub fn fail(&self, op: &'static str, n: u32) {
        *self.armed.lock().unwrap() = Some((op, n));
    }

    /// One batch of one message, answered.
    pub fn call<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> T {
        self.ask(make).expect("answered after the commit")
    }

    /// One batch of one message: its answer, if the batch gave one (a
    /// poll with nothing new waits for the next commit).
    pub fn ask<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Option<T> {
        let (tx, mut rx) = oneshot::channel();
        self.batch(vec![make(tx)]);
        rx.try_recv().ok()
    }

    /// One batch of `msgs` at `now`: it must commit and leave the writer
    /// sane.
    pub fn batch(&mut self, msgs: Vec<Msg>) {
        let now = self.now;
        self.engine()
            .batch(msgs, now)
            .unwrap_or_else(|e| panic!("a batch failed, which stops the server: {e}"));
        self.engine().sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
    }

    /// One batch of one message that has no answer.
    pub fn call_quiet(&mut self, msg: Msg) {
        self.batch(vec![msg]);
    }

    pub fn register(&mut self, node: &str, running: Vec<AttemptRef>, unreported: Vec<AgentEvent>) {
        self.register_node(node, "H100", 8, running, unreported);
    }

    /// `node` (re)registers with `gpus` of `model`, saying what it runs.
    pub fn register_node(
        &mut self,
        node: &str,
        model: &str,
        gpus: u8,
        running: Vec<AttemptRef>,
        unreported: Vec<AgentEvent>,
    ) {
        let reg = Register {
            node: node.into(),
            gpu_model: model.into(),
            gpus,
            labels: BTreeMap::new(),
            running,
            address: None,
            unreported,
            starts_when_free: self.starts_when_free,
            waiting: self.waiting.clone(),
            cpus: None,
            memory_mib: None,
        };
        self.try_register(reg).unwrap();
    }

    /// A registration the writer may refuse: the node's stream starts
    /// where the answer says if it does not.
    pub fn try_register(&mut self, reg: Register) -> Result<(), ebb_server::Refusal> {
        // The join token the first time; the node's own credential after.
        let node = reg.node.clone();
        let principal = match self.agents.contains_key(&node) {
            true => Principal::node(&node),
            false => Principal::join(),
        };
        let registered = self.call(|reply| Msg::Register { principal, reg, reply })?;
        self.agents.insert(node, Agent { epoch: registered.epoch, after: registered.next_seq });
        Ok(())
    }

    /// One poll of `node`'s stream: the attempts it is told to start.
    /// The writer's tick at `now`.
    pub fn tick(&mut self) {
        let now = self.now;
        self.engine().batch(vec![Msg::Tick], now).expect("tick");
    }

    pub fn poll(&mut self, node: &str) -> Vec<AttemptRef> {
        self.poll_saying(node, None)
    }

    /// One poll saying how the node's reports fare (`commands_saying`):
    /// the attempts it is told to start.
    pub fn poll_saying(&mut self, node: &str, health: Option<Option<String>>) -> Vec<AttemptRef> {
        let actions = self.commands_saying(node, health);
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(s) => Some(s.attempt),
                _ => None,
            })
            .collect()
    }

    /// One poll of `node`'s stream: every command it is given.
    pub fn commands(&mut self, node: &str) -> Vec<Action> {
        self.commands_saying(node, None)
    }

    /// One poll of `node`'s stream saying how its reports fare (`health`:
    /// `Some(Some(why))` failing, `Some(None)` getting through, `None` a
    /// long poll asking again that says nothing): every command it is given.
    pub fn commands_saying(&mut self, node: &str, health: Option<Option<String>>) -> Vec<Action> {
        let agent = &self.agents[node];
        let (epoch, after) = (agent.epoch, agent.after);
        let node_name = node.to_string();
        let poll =
            self.call(|reply| Msg::Poll { node: node_name, epoch, after, health, reply }).expect("polled");
        let mut actions = Vec::new();
        for command in poll.commands.into_iter().map(std::sync::Arc::unwrap_or_clone) {
            self.agents.get_mut(node).unwrap().after = command.seq;
            actions.push(command.action);
        }
        actions
    }

    pub fn cancel(&mut self, id: JobId, grace_ms: Option<u64>) -> Result<ebb_api::Job, ebb_server::Refusal> {
        let principal = self.admin.clone();
        let req = CancelRequest { grace_ms };
        self.call(|reply| Msg::Cancel { principal, id, req, reply })
    }

    pub fn drill(&mut self, id: JobId) -> Result<ebb_api::Job, ebb_server::Refusal> {
        let principal = self.admin.clone();
        self.call(|reply| Msg::Drill { principal, id, reply })
    }

    pub fn report_msg(
        node: &str,
        events: Vec<AgentEvent>,
    ) -> (Msg, oneshot::Receiver<Result<ebb_api::ReportReply, ebb_server::Refusal>>) {
        let (reply, rx) = oneshot::channel();
        (Msg::Report { report: Report { node: node.into(), events, id: None }, reply }, rx)
    }

    pub fn report(&mut self, node: &str, events: Vec<AgentEvent>) {
        self.report_as(node, events, None);
    }

    pub fn report_as(&mut self, node: &str, events: Vec<AgentEvent>, id: Option<ReportId>) {
        let report = Report { node: node.into(), events, id };
        self.call(|reply| Msg::Report { report, reply }).expect("report taken");
    }

    pub fn submit_msg(&self, gpus: u32) -> (Msg, oneshot::Receiver<Result<Vec<JobId>, ebb_server::Refusal>>) {
        let (reply, rx) = oneshot::channel();
        let spec = JobSubmission { gpus: Some(gpus), argv: vec!["work".into()], ..Default::default() };
        (Msg::Submit { principal: self.admin.clone(), spec: Box::new(spec), reply }, rx)
    }

    pub fn submit(&mut self, gpus: u32) -> JobId {
        let (msg, mut rx) = self.submit_msg(gpus);
        let now = self.now;
        self.engine().batch(vec![msg], now).unwrap();
        self.engine().sanity_check().unwrap_or_else(|e| panic!("after a batch: {e}"));
        rx.try_recv().unwrap().unwrap()[0]
    }

    pub fn job(&mut self, id: JobId) -> Result<ebb_api::Job, ebb_server::Refusal> {
        let principal = self.admin.clone();
        self.call(|reply| Msg::Job { principal, id, reply })
    }

    /// A job's state, as the API names it.
    pub fn state(&mut self, id: JobId) -> String {
        self.job(id).expect("job").state
    }

    /// `node` as `GET /v1/nodes` shows it.
    pub fn node(&mut self, node: &str) -> ebb_api::Node {
        self.call(|reply| Msg::Nodes { reply }).into_iter().find(|n| n.name == node).expect("joined")
    }

    pub fn jobs(&mut self) -> Vec<JobId> {
        let principal = self.admin.clone();
        let page = self
            .call(|reply| Msg::Jobs {
                principal,
                query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 1000, ..Default::default() },
                reply,
            })
            .unwrap();
        page.jobs.iter().map(|j| JobId(j.id)).collect()
    }

    /// A job submitted, placed on `node` and reported started at `now`.
    pub fn running(&mut self, node: &str) -> AttemptRef {
        let id = self.submit(2);
        let starts = self.poll(node);
        let attempt = *starts.iter().find(|a| a.job == id).expect("placed");
        let at_ms = self.now;
        self.report(node, vec![AgentEvent::Started { attempt, pid: 4242, at_ms }]);
        attempt
    }

    /// Job `id`'s output, as the store has it committed.
    pub fn log(&self, id: JobId) -> String {
        let bytes = (self.open_store)().output(id, 0, i64::MAX as u64).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    pub fn usage(&self, id: JobId) -> Vec<UsageRow> {
        (self.open_store)().job_usage(id).unwrap()
    }
}

/// An event's detail as the wire has it.
pub fn detail(event: &JobEvent) -> serde_json::Value {
    serde_json::from_str(&event.event.detail_json()).expect("a detail is JSON")
}

pub fn exited(attempt: AttemptRef, code: i32, at_ms: u64) -> AgentEvent {
    AgentEvent::Exited {
        attempt,
        code: Some(code),
        signal: None,
        completed: false,
        at_ms,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
        ended_by: None,
    }
}
