//! Durable state behind one interface, so that a PostgreSQL backend can sit
//! beside the embedded SQLite one.
//!
//! What is stored is what the server needs to come back after a crash:
//! tenants, token hashes, nodes, every job's record and its event history.
//! The scheduling core's indices are rebuilt from these on start. Every
//! batch of changes is one transaction, committed (WAL, `synchronous=FULL`)
//! before any caller is answered.

use serde::{Deserialize, Serialize};

use ebb_api::JobEvent;
use ebb_core::{Attempt, JobId, TenantId};

pub use crate::billing::{PriceRow, ReservationRow, UsageRow};

mod page;
pub mod pg;
pub mod pg_tls;
mod sqlite;

pub(crate) use page::{job_page_sql, PageArg};
pub use sqlite::SqliteStore;

/// Why a store operation failed. Any failure abandons the batch it was
/// in; `retryable` says whether the same operation may succeed later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or refused the operation, in its words.
    #[error("storage: {0}")]
    Database(String),
    /// The connection to the database failed: a new one (a restarted
    /// server, another server) may succeed.
    #[error("storage: {0}")]
    Connection(String),
    /// What the store holds does not read: a record, an event's kind, a
    /// schema newer than this release.
    #[error("storage: {0}")]
    Unreadable(String),
    /// Another server took the lease: this one no longer leads, and
    /// writes nothing more (`leader.rs`).
    #[error("storage: deposed: {0}")]
    Deposed(String),
    /// The connection string (`--database`) cannot be used: retrying the
    /// same one cannot help.
    #[error("storage: --database: {0}")]
    Target(Box<pg_tls::TargetError>),
    /// A file beside the database (a job's log, the write-ahead log) or a
    /// thread the store needs could not be used.
    #[error("storage: {0}")]
    Io(String),
}

impl StoreError {
    pub fn retryable(&self) -> bool {
        matches!(self, StoreError::Connection(_))
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Unreadable(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRow {
    pub id: TenantId,
    pub name: String,
}

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// A tenant's own jobs.
    Tenant,
    /// Operator calls, plus the default tenant's jobs.
    Admin,
    /// The agents' join token: registers a node that has no credential yet.
    Agent,
    /// One node's own credential, issued when it joined: it speaks for
    /// that node alone.
    Node,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    pub hash: String,
    pub tenant: Option<TenantId>,
    pub scope: Scope,
    /// The node a `Scope::Node` credential is bound to.
    pub node: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    pub name: String,
    pub gpu_model: String,
    pub gpus: u8,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Cordoned by the operator.
    pub drained: bool,
    /// Where other nodes reach it (a gang's `MASTER_ADDR`).
    #[serde(default)]
    pub address: Option<String>,
    /// Its CPUs and memory (MiB), as its agent last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// When it first joined, and how often it has been interrupted without
    /// notice since (lost, or its agent came back without its attempts):
    /// what the recommended checkpoint interval is estimated from.
    #[serde(default)]
    pub joined_ms: u64,
    #[serde(default)]
    pub interruptions: u64,
    /// Removed by the operator (`ebb nodes remove`): it stays out, also
    /// across a server restart, until it joins again.
    #[serde(default)]
    pub removed: bool,
    /// Why it was drained, when its health drained it (absent: the
    /// operator did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_for: Option<String>,
    /// Its GPUs out of service, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus_out: Vec<GpuOut>,
    /// Its GPUs' faults in the last day: (GPU, when).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_faults: Vec<(u8, u64)>,
    /// What its agent last found wrong, all of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health: Vec<ebb_api::GpuFinding>,
}

/// A GPU out of service: what its agent found, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuOut {
    pub gpu: u8,
    pub reason: String,
    pub since_ms: u64,
    /// It faulted twice in a day: it stays out until the operator returns
    /// it, whatever its agent finds later.
    #[serde(default)]
    pub until_returned: bool,
}

impl NodeRow {
    /// Its GPUs out of service, as a mask.
    pub fn out_mask(&self) -> u64 {
        self.gpus_out.iter().fold(0, |mask, o| mask | (1u64 << o.gpu))
    }
}

/// Everything needed to rebuild the server's memory.
/// A job record as the store reads it back.
pub trait JobRow: for<'de> Deserialize<'de> {
    /// Takes what it has in common with the row read before it (the
    /// previous id), sharing instead of copying; by default nothing.
    fn share_with(&mut self, _previous: &Self) {}
}

/// Rows read as plain JSON (store tests) share nothing.
impl JobRow for serde_json::Value {}

#[derive(Debug)]
pub struct Snapshot<J> {
    pub tenants: Vec<TenantRow>,
    pub tokens: Vec<TokenRow>,
    pub nodes: Vec<NodeRow>,
    pub jobs: Vec<J>,
    pub prices: Vec<PriceRow>,
    pub reservations: Vec<ReservationRow>,
    /// When each node was last heard from.
    pub heard: Vec<(String, u64)>,
    /// Limits the operator set for single tenants.
    pub tenant_limits: Vec<(TenantId, ebb_api::TenantLimits)>,
    /// Tenants' registry logins: tenant, registry host, login.
    pub registry_logins: Vec<(TenantId, String, ebb_api::RegistryLogin)>,
    /// Reclaim limits, by model.
    pub reclaims: Vec<(String, u32)>,
    /// Webhooks, by id, and the deliveries not yet accepted, in order.
    pub webhooks: Vec<WebhookRow>,
    pub deliveries: Vec<DeliveryRow>,
}

/// A webhook: whose (a tenant, or the operators'), where, for which
/// events, in which body shape, and its signing secret (kept as given:
/// a signature needs it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookRow {
    pub id: u64,
    pub tenant: Option<TenantId>,
    pub url: String,
    pub events: Vec<String>,
    pub format: String,
    pub secret: String,
    pub created_ms: u64,
}

/// An event on its way to a webhook: the outbox's row, written in the
/// batch that made the event and deleted once the receiver took it (or
/// it was given up), so that a restarted or new leader sends it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRow {
    pub id: u64,
    pub webhook: u64,
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The body, as it is sent and signed.
    pub body: String,
    pub created_ms: u64,
}

/// The tries kept per webhook for `ebb tenant webhook log`.
pub const WEBHOOK_LOG_KEPT: i64 = 200;

impl<J> Snapshot<J> {
    pub fn empty() -> Snapshot<J> {
        Snapshot {
            tenants: Vec::new(),
            tokens: Vec::new(),
            nodes: Vec::new(),
            jobs: Vec::new(),
            prices: Vec::new(),
            reservations: Vec::new(),
            heard: Vec::new(),
            tenant_limits: Vec::new(),
            registry_logins: Vec::new(),
            reclaims: Vec::new(),
            webhooks: Vec::new(),
            deliveries: Vec::new(),
        }
    }
}

/// What the store keeps of a job beside its record, as columns: what the
/// listing filters on, what arrays' progress and the finished jobs'
/// counts are read from, so that none of them reads a record (nor keeps
/// one in memory: a finished job's record lives only here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobColumns<'a> {
    pub tenant: TenantId,
    /// As the API spells it (`queued`, …, `cancelled`).
    pub state: &'a str,
    pub tier: &'a str,
    pub gpus: u32,
    pub name: Option<&'a str>,
    /// The array the job is a task of (its first task's id), and its index there.
    pub array: Option<(JobId, u64)>,
    pub attempt: Attempt,
    pub preemptions: u32,
    /// The state the store holds for the job as far as the writer knows
    /// (none: not stored yet). A hint, not a promise: a store may use it
    /// to write less and must still be right when it is wrong.
    pub stored_state: Option<&'a str>,
}

/// The states a job never leaves, as `JobColumns::state` spells them.
pub const FINISHED_STATES: [&str; 3] = ["succeeded", "failed", "cancelled"];
/// The others: the jobs the writer keeps in memory.
pub const UNFINISHED_STATES: [&str; 4] = ["queued", "starting", "running", "draining"];

/// One page of the job listing, by id past a cursor (keyset paging).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobPageQuery {
    /// Only this tenant's jobs (none: every tenant's).
    pub tenant: Option<TenantId>,
    /// The previous page's last id: the page continues past it.
    pub cursor: Option<JobId>,
    /// Newest first.
    pub desc: bool,
    /// At most this many rows.
    pub limit: usize,
    /// Only these states; with `collapse`, an array is listed when any of
    /// its tasks is in one of them.
    pub states: Option<Vec<String>>,
    pub tier: Option<String>,
    /// Only names containing this (case-sensitive); a job without a name
    /// has the empty one.
    pub name: Option<String>,
    /// An array is one row, its first task.
    pub collapse: bool,
    /// Rows stop once their records hold this many bytes of text (the
    /// row that passes it is the last), so that no page of jobs with huge
    /// arguments is read whole into memory; 0: no bound.
    pub max_bytes: usize,
}

/// A page of jobs as the store read it.
#[derive(Debug)]
pub struct JobRows<J> {
    pub rows: Vec<J>,
    /// It stopped at `max_bytes`, not at `limit` or the last row: more may
    /// follow.
    pub cut: bool,
}

impl<J> JobRows<J> {
    /// Reads records (JSON text, in order) until `limit` of them or past
    /// `max_bytes` of text, whichever comes first.
    pub(crate) fn read(
        records: impl Iterator<Item = Result<String>>,
        query: &JobPageQuery,
    ) -> Result<JobRows<J>>
    where
        J: for<'de> Deserialize<'de>,
    {
        let (mut rows, mut bytes) = (Vec::new(), 0usize);
        for record in records {
            if rows.len() >= query.limit {
                break;
            }
            if query.max_bytes > 0 && bytes >= query.max_bytes {
                return Ok(JobRows { rows, cut: true });
            }
            let record = record?;
            bytes = bytes.saturating_add(record.len());
            rows.push(serde_json::from_str(&record)?);
        }
        Ok(JobRows { rows, cut: false })
    }
}

/// A task of an array, as its progress shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRow {
    pub id: JobId,
    pub index: u64,
    pub state: String,
    pub attempt: Attempt,
    pub preemptions: u32,
}

/// Finished jobs of one tier and state: how many, and their GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedCount {
    pub tier: String,
    pub state: String,
    pub jobs: u64,
    pub gpus: u64,
}

/// The storage interface the server is written against.
pub trait Store: Send {
    fn begin(&mut self) -> Result<()>;
    fn commit(&mut self) -> Result<()>;
    fn rollback(&mut self) -> Result<()>;
    /// Everything the server holds in memory; of the jobs, only those
    /// not finished (finished ones are read from here when asked for).
    fn load<J: JobRow>(&mut self) -> Result<Snapshot<J>>;
    fn put_tenant(&mut self, tenant: &TenantRow) -> Result<()>;
    fn put_token(&mut self, token: &TokenRow) -> Result<()>;
    /// Revokes one token (a no-op for an unknown hash).
    fn delete_token(&mut self, hash: &str) -> Result<()>;
    fn put_node(&mut self, node: &NodeRow) -> Result<()>;
    fn put_job<J: Serialize>(&mut self, id: JobId, columns: &JobColumns, job: &J) -> Result<()>;
    /// Job `id`'s record, if there is one.
    fn job<J: JobRow>(&mut self, id: JobId) -> Result<Option<J>>;
    /// One page of the job listing: the records, in the page's order.
    fn job_page<J: JobRow>(&mut self, query: &JobPageQuery) -> Result<JobRows<J>>;
    /// How many of array `array`'s tasks are in each state.
    fn array_states(&mut self, array: JobId) -> Result<Vec<(String, u64)>>;
    /// Array `array`'s tasks, by id.
    fn array_tasks(&mut self, array: JobId) -> Result<Vec<TaskRow>>;
    /// The finished jobs, counted by tier and state (read at start, for
    /// `/metrics`: their records are not loaded).
    fn finished_counts(&mut self) -> Result<Vec<FinishedCount>>;
    /// Adds `event` to job `job`'s history.
    fn add_event(&mut self, job: JobId, event: &JobEvent) -> Result<()>;
    fn events(&mut self, job: JobId) -> Result<Vec<JobEvent>>;
    fn max_job_id(&mut self) -> Result<JobId>;
    /// The node was heard from at `at_ms`: after a restart, work on a node
    /// that never comes back is metered up to here.
    fn heard(&mut self, node: &str, at_ms: u64) -> Result<()>;
    fn put_price(&mut self, price: &PriceRow) -> Result<()>;
    fn put_reservation(&mut self, reservation: &ReservationRow) -> Result<()>;
    fn delete_reservation(&mut self, id: u64) -> Result<()>;
    /// Fails if the attempt already has a record: usage is never counted twice.
    fn add_usage(&mut self, usage: &UsageRow) -> Result<()>;
    /// Records that ended in `[from_ms, to_ms)`, of one tenant or all.
    fn usage(&mut self, tenant: Option<TenantId>, from_ms: u64, to_ms: u64) -> Result<Vec<UsageRow>>;
    fn job_usage(&mut self, job: JobId) -> Result<Vec<UsageRow>>;
    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Result<()>;
    /// A tenant's login for a registry, or none (removed).
    fn put_registry_login(
        &mut self,
        tenant: TenantId,
        registry: &str,
        login: Option<&ebb_api::RegistryLogin>,
    ) -> Result<()>;
    /// How much of the job's log is committed (see `LogState`).
    fn log_state(&mut self, job: JobId) -> Result<Option<LogState>>;
    /// Every job whose log is a file (`LogState::file`), with the length
    /// committed: in one query, as a server takes over with every job.
    fn file_logs(&mut self) -> Result<Vec<(JobId, LogState)>>;
    fn put_log_state(&mut self, job: JobId, state: &LogState) -> Result<()>;
    /// A model's reclaim limit, or none (lifted).
    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Result<()>;
    fn put_webhook(&mut self, hook: &WebhookRow) -> Result<()>;
    /// The webhook, its deliveries and its log.
    fn delete_webhook(&mut self, id: u64) -> Result<()>;
    fn put_delivery(&mut self, delivery: &DeliveryRow) -> Result<()>;
    fn delete_delivery(&mut self, id: u64) -> Result<()>;
    /// A try, kept with the latest `WEBHOOK_LOG_KEPT` of its webhook.
    fn add_webhook_log(&mut self, webhook: u64, entry: &ebb_api::WebhookDelivery) -> Result<()>;
    /// The webhook's latest tries, newest first.
    fn webhook_log(&mut self, webhook: u64) -> Result<Vec<ebb_api::WebhookDelivery>>;
    /// The last report applied from `node`.
    /// Each node's last report applied (see `put_last_report`), read once
    /// as the writer starts.
    fn last_reports(&mut self) -> Result<Vec<(String, ebb_api::ReportId)>>;
    fn put_last_report(&mut self, node: &str, id: ebb_api::ReportId) -> Result<()>;
    /// Output of job `job` from byte `offset` of its log.
    /// A piece of job `job`'s log at `offset`; `node` names the node of a
    /// gang that wrote it.
    fn put_output(&mut self, job: JobId, offset: u64, data: &[u8], node: Option<&str>) -> Result<()>;
    /// Bytes `[from, to)` of job `job`'s log, as far as it is kept.
    fn output(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<u8>>;
    /// Where each piece of `[from, to)` of the log that a gang's node
    /// wrote starts, and which node, by start.
    fn output_sources(&mut self, job: JobId, from: u64, to: u64) -> Result<Vec<(u64, String)>>;
    /// The length of job `job`'s log as kept: where its last piece ends.
    fn output_len(&mut self, job: JobId) -> Result<u64>;
    /// Job `job`'s output is to be removed at `at_ms` (`--keep-output`
    /// after it ended).
    fn expire_output(&mut self, job: JobId, at_ms: u64) -> Result<()>;
    /// Removes the output of at most `limit` jobs whose time came by
    /// `now_ms`, soonest first, and notes when; the jobs.
    fn prune_output(&mut self, now_ms: u64, limit: usize) -> Result<Vec<JobId>>;
    /// When job `job`'s output was removed, if it was.
    fn output_removed(&mut self, job: JobId) -> Result<Option<u64>>;
}

/// How much of a job's log file is committed. Output is kept in the
/// store, in the same transactions as everything else, and a log's length
/// is where its last piece ends; a log written before the store kept
/// output is a file in the data dir's `logs/`, whose committed length is
/// recorded here (output past it is from a batch that never committed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogState {
    pub bytes: u64,
    /// The log is the file `logs/JOB.log` (written before the store kept
    /// output): it stays there, and output still to come is appended to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub file: bool,
}

/// Adds to `out` (bytes of a log from `from`, up to `to`) what the piece
/// of the log at `start` holds of it. False at a gap: nothing past it is
/// read as if it followed.
pub(crate) fn append_piece(out: &mut Vec<u8>, from: u64, to: u64, start: u64, data: &[u8]) -> bool {
    let at = from + out.len() as u64;
    if start > at {
        return false;
    }
    let skip = (at - start) as usize;
    let end = data.len().min((to - start) as usize);
    if skip < end {
        out.extend_from_slice(&data[skip..end]);
    }
    true
}

/// Job `job`'s event of `kind` from its stored detail. A detail that does
/// not read as its kind's keeps the kind, with nothing known of it, and is
/// logged: the history stays whole, and the row is left as it was.
pub(crate) fn stored_event(job: u64, kind: ebb_api::EventKind, detail: &str) -> ebb_api::Event {
    let (event, why) = ebb_api::Event::from_stored(kind, detail);
    if let Some(why) = why {
        tracing::warn!(job, "an event of the store does not read: {why}");
    }
    event
}

/// The scope a stored name stands for.
pub(crate) fn scope_of(name: &str) -> Scope {
    match name {
        "admin" => Scope::Admin,
        "agent" => Scope::Agent,
        "node" => Scope::Node,
        _ => Scope::Tenant,
    }
}

pub(crate) fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Tenant => "tenant",
        Scope::Admin => "admin",
        Scope::Agent => "agent",
        Scope::Node => "node",
    }
}
