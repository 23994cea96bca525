//! The server's record of a job, as the store keeps it.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Draining,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Draining,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The state named `name`, as the API spells it.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Draining => "draining",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub(super) fn is_live(self) -> bool {
        matches!(self, JobState::Starting | JobState::Running | JobState::Draining)
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

impl JobRecord {
    /// The GPUs its live attempt holds: its `gpus`, or for an elastic job
    /// what it runs on now.
    pub fn running_gpus(&self) -> u32 {
        match self.spec.max_gpus {
            Some(_) if !self.placement.is_empty() => self.placement.iter().map(|p| p.gpus.len() as u32).sum(),
            _ => self.gpus,
        }
    }

    /// An elastic attempt's parts not told to leave, its first node first.
    pub(super) fn staying_parts(&self) -> impl Iterator<Item = &Part> {
        let leaving = self.elastic.as_deref().map_or(&[][..], |e| &e.leaving[..]);
        self.placement.iter().filter(move |part| !leaving.iter().any(|l| l.node == part.node))
    }

    /// The change of nodes its staying parts are told, once the record
    /// holds it: those parts, their GPUs, and what changes.
    pub(super) fn membership(&self, attempt: AttemptRef, change: Change) -> ebb_api::Membership {
        let staying: Vec<&Part> = self.staying_parts().collect();
        use ebb_api::MembershipChange as Kind;
        let (change, at_ms, deadline_ms, leaving, joining, reason) = match change {
            Change::Shrink { leaving, notice } => {
                let (at, deadline, reason) = (notice.notice_at_ms, notice.deadline_ms, notice.reason.clone());
                (Kind::Shrink, at, Some(deadline), leaving, vec![], reason)
            }
            Change::Grow { joining, at_ms } => {
                let reason = format!("grown onto {}", joining.join(", "));
                (Kind::Grow, at_ms, None, vec![], joining, reason)
            }
        };
        ebb_api::Membership {
            attempt,
            change,
            at_ms,
            deadline_ms,
            nodes: staying.iter().map(|part| part.node.clone()).collect(),
            leaving,
            joining,
            gpus: staying.iter().map(|part| part.gpus.len() as u32).sum(),
            reason,
        }
    }

    /// The GPUs the metrics count it at: a live job's what it holds (an
    /// elastic job's changes), any other's its `gpus`.
    pub fn tallied_gpus(&self) -> u32 {
        if self.state.is_live() {
            self.running_gpus()
        } else {
            self.gpus
        }
    }

    /// The job as the scheduling core takes it.
    pub(super) fn core_spec(&self, core: &State) -> JobSpec {
        JobSpec {
            id: self.id,
            tenant: self.tenant,
            tier: self.tier,
            gpus: self.gpus,
            max_gpus: self.spec.max_gpus,
            gpu_model: self.spec.gpu_model.as_deref().and_then(|m| core.model_by_name(m)),
            // A promoted job queues on-demand from its promotion (see
            // `State::promote`), after a restart too.
            submitted_at: Time(
                self.deadline
                    .as_ref()
                    .and_then(|d| d.promoted.as_ref())
                    .map_or(self.submitted_ms, |p| p.at_ms.max(self.submitted_ms)),
            ),
            priority: self.spec.priority,
            max_preemptions: self.spec.max_preemptions,
        }
    }

    /// What the store keeps of it as columns.
    pub fn columns(&self) -> crate::store::JobColumns<'_> {
        crate::store::JobColumns {
            tenant: self.tenant,
            state: self.state.as_str(),
            tier: self.tier.as_str(),
            gpus: self.gpus,
            name: self.spec.name.as_deref(),
            array: self.array.as_ref().map(|a| (a.id, a.index)),
            attempt: self.attempt,
            preemptions: self.preemptions,
            stored_state: None,
        }
    }
}

/// The server's record of a job: what the store keeps.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub tenant: TenantId,
    pub spec: StoredSpec,
    #[serde(with = "tier_name")]
    pub tier: Tier,
    pub gpus: u32,
    pub signal: i32,
    pub state: JobState,
    pub attempt: Attempt,
    pub preemptions: u32,
    pub retries: u32,
    pub submitted_ms: u64,
    /// Live attempt: GPUs by node, when it started, nodes still running it.
    pub placement: Vec<Part>,
    pub started_ms: u64,
    pub running_on: Vec<String>,
    /// The live attempt's drain notice (boxed: most records have none,
    /// and a record is kept in memory for every live job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Box<DrainNotice>>,
    /// A drain notice as releases before typed notices stored it
    /// (`[notice_at, deadline, reason]`): read, never written; recovery
    /// turns it into `drain` (`DrainNotice::from_legacy`).
    #[serde(default, rename = "notice", skip_serializing)]
    pub legacy_notice: Option<Box<(u64, u64, String)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<i32>,
    pub cancel_requested: bool,
    /// A running job's cancel: when its notice was given and when SIGKILL
    /// comes (absent in records of servers before cancels had notices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_notice: Option<(u64, u64)>,
    /// A node lost track of the live attempt.
    pub vanished: bool,
    /// GPUs held for this queued job while `waiting_for` drain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Part>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<JobId>,
    /// Parts of elastic jobs (job, node) its held GPUs wait for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_parts: Vec<(JobId, String)>,
    /// An elastic job's live attempt beyond its placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<Box<ElasticRun>>,
    /// Its start, sent to the held GPUs' node before the victims left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<super::staged::StagedStart>,
    /// The highest attempt number spent on a start sent ahead and then
    /// withdrawn (it may have run on its node): the next attempt is
    /// numbered after it, after a restart too. `attempt` stays the latest
    /// placed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub spent_attempt: Attempt,
    /// The array or sweep this job is a task of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub checkpoints: CheckpointStats,
    /// The live attempt, by the agents' clocks: when its first process
    /// started, the nodes that have started it, when its last checkpoint
    /// completed, and when its last process exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_started_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started_on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_checkpoint_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub exited_ms: u64,
    /// Work lost over all attempts, GPU-milliseconds.
    #[serde(default, skip_serializing_if = "is_default")]
    pub lost_gpu_ms: u64,
    /// The interval recommended to the latest attempt, seconds, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<(u64, String)>,
    /// A live gang one of whose parts exited 0 while others run: when
    /// the others are stopped if they have not exited by then (the first
    /// exit plus the gang exit grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_grace_until: Option<u64>,
    /// Ebb stopped the live gang's other parts, and why (a part failed, or
    /// the rest outran the grace after a part's exit): the attempt has
    /// failed, whatever those parts exit with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_stopped: Option<String>,
    /// The live gang could not meet: its rendezvous port was taken on its
    /// first node (why, for the timeline). It is requeued once all its
    /// parts have ended, as neither a failure nor a preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_failed: Option<String>,
    /// The live attempt's image pull: the node, bytes done and in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulling: Option<(String, u64, u64)>,
    /// A live gang's rendezvous (`MASTER_ADDR`, `MASTER_PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous: Option<(String, u16)>,
    /// A live Slurm job's step key: what its batch steps and every `srun`
    /// into it (from inside, or from a login node with `--jobid`, which
    /// the job's tenant is given it for) must present. Drawn per attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_key: Option<String>,
    /// The live attempt's GPU model and rates per GPU-hour (its tier's, and
    /// on-demand's), fixed when it was placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<(String, i64, i64)>,
    /// A queued job kept out of the scheduler for now, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// Quick exits in a row of a `--restart always` job: its back-off.
    #[serde(default, skip_serializing_if = "is_default")]
    pub quick_exits: u32,
    /// A drill requeued it since it was last preempted: its attempts since
    /// are no resume from a preemption, and so not settling (the core's
    /// `Job::drilled`, restored with it).
    #[serde(default, skip_serializing_if = "is_default")]
    pub drilled_since_preempted: bool,
    /// Times it requeued itself outside a drain (`scontrol requeue`, its
    /// endpoint's `requeue`): each after the restart back-off when it came
    /// quickly, at most `--max-requeues`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub requeues: u32,
    /// Its last attempt requeued itself: the attempts since earn no
    /// protection as victims (the core's `Job::requeued_itself`, restored
    /// with it).
    #[serde(default, skip_serializing_if = "is_default")]
    pub requeued_itself: bool,
    /// Random bits of its run id, drawn at submit, so that nobody can
    /// tell another's run id from its job's number and time (0: a job of
    /// a release before them, whose run id keeps its old form).
    #[serde(default, skip_serializing_if = "is_default")]
    pub run_nonce: u64,
    /// Its latest fire drill, concluded or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<Box<super::DrillRecord>>,
    /// Its log's committed length is kept in the store (`LogState`): true
    /// for every job since that was so; older jobs' logs are taken as
    /// they are when first touched.
    #[serde(default)]
    pub log_tracked: bool,
    /// A preemptible job's deadline, its progress and its promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Box<super::Deadline>>,
    /// What ended the live attempt besides its exit, as a node said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<EndedBy>,
    /// It failed because an attempt ran past its time limit.
    #[serde(default, skip_serializing_if = "is_default")]
    pub timed_out: bool,
    /// What the tally counts it as when it was last saved (not stored:
    /// counted again at load).
    #[serde(skip)]
    pub counted: Option<Counted>,
    /// Known to have no output in the store: accepted by this server, and
    /// none has come since (not stored: a job loaded at start is looked
    /// up). Spares a new job's first output two reads.
    #[serde(skip)]
    pub no_output: bool,
}

/// One node's part of a placement: the node, and the GPUs it gives.
/// Written with names; read in that form or, as records of releases
/// before parts were named hold it, as a `[node, gpus]` pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Part {
    pub node: String,
    pub gpus: Vec<u8>,
}

impl Part {
    pub fn new(node: impl Into<String>, gpus: Vec<u8>) -> Part {
        Part { node: node.into(), gpus }
    }

    pub fn view(&self) -> ebb_api::NodeGpus {
        ebb_api::NodeGpus { node: self.node.clone(), gpus: self.gpus.clone() }
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Part, D::Error> {
        deserializer.deserialize_any(PartVisitor)
    }
}

/// Reads either form of a part as it comes, without buffering it first
/// (a record is read for every listing of its job).
struct PartVisitor;

impl<'de> serde::de::Visitor<'de> for PartVisitor {
    type Value = Part;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a part: {node, gpus} or [node, gpus]")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Part, A::Error> {
        use serde::de::Error;
        let node = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(0, &self))?;
        let gpus = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(1, &self))?;
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::invalid_length(3, &self));
        }
        Ok(Part { node, gpus })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Part, A::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "lowercase")]
        enum Field {
            Node,
            Gpus,
            #[serde(other)]
            Other,
        }
        let (mut node, mut gpus) = (None, None);
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Node => node = Some(map.next_value()?),
                Field::Gpus => gpus = Some(map.next_value()?),
                Field::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Part {
            node: node.ok_or_else(|| A::Error::missing_field("node"))?,
            gpus: gpus.ok_or_else(|| A::Error::missing_field("gpus"))?,
        })
    }
}

/// Which array or sweep a job is a task of, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array's id: its first task's.
    pub id: JobId,
    /// `EBB_TASK_INDEX` of this task.
    pub index: u64,
    pub tasks: u64,
    /// A sweep task's parameters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

impl ArrayTask {
    pub fn view(&self) -> ebb_api::ArrayTask {
        ebb_api::ArrayTask {
            id: self.id.0,
            index: self.index,
            tasks: self.tasks,
            params: self.params.clone(),
        }
    }
}

/// An elastic job's live attempt beyond its placement: its nodes told to
/// leave, the nodes that joined after its start (by the server's clock),
/// and the parts that have left, each metered from its join to its exit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticRun {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<LeavingPart>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joined: Vec<(String, u64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<LeftPart>,
    /// When its nodes last changed (a shrink's notice or a grow), by the
    /// server's clock: it grows again only `min_runtime` after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resized_ms: Option<u64>,
}

/// A change of an elastic attempt's nodes, as [`JobRecord::membership`]
/// tells it.
pub(super) enum Change<'a> {
    Shrink { leaving: Vec<String>, notice: &'a DrainNotice },
    Grow { joining: Vec<String>, at_ms: u64 },
}

/// A node of an elastic job's attempt told to leave by a shrink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeavingPart {
    pub node: String,
    pub notice: DrainNotice,
}

/// A part of an elastic job's attempt that has left: its GPUs there, from
/// its start (or its node's join) to its exit by its agent's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftPart {
    pub node: String,
    pub gpus: u32,
    pub from_ms: u64,
    pub to_ms: u64,
    /// Its shrink's notice.
    pub notice_at_ms: Option<u64>,
}

/// A live attempt's drain: when its notice was given, when it is killed,
/// what drained it, and why in words (as its `drain_notice` event said).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainNotice {
    pub notice_at_ms: u64,
    pub deadline_ms: u64,
    pub cause: Drained,
    pub reason: String,
}

/// What drained an attempt: the server's record of the core's
/// `DrainReason`, with names where the core has dense indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Drained {
    /// A job of a higher tier needed its GPUs.
    Preempted { by: JobId },
    /// The operator drained its node (for its health, or by hand).
    Node { node: String },
    /// The operator reclaimed the preemptible tier's GPUs.
    Reclaim,
    /// A fire drill.
    Drill,
    /// Its tenant borrowed past its quota while `waiting` waits.
    Quota { waiting: TenantId },
    /// Its tenant is furthest above its fair share while `waiting` waits.
    FairShare { waiting: TenantId },
}

impl DrainNotice {
    /// A notice a release before typed notices stored: its cause read
    /// back from its words, the waiting tenant by the name they give
    /// (`tenant_id`; a tenant since removed is `TenantId(0)`, which only
    /// counts the drain).
    pub fn from_legacy(
        (notice_at_ms, deadline_ms, reason): (u64, u64, String),
        drill: bool,
        tenant_id: impl Fn(&str) -> Option<TenantId>,
    ) -> DrainNotice {
        let waiting = |text: &str, before: &str| {
            let name = text.rsplit_once("; ").map_or("", |(_, tail)| tail);
            name.strip_suffix(before).and_then(&tenant_id).unwrap_or(TenantId(0))
        };
        let cause = if drill || reason == super::plan::DRILL_REASON {
            Drained::Drill
        } else if let Some(by) = reason.strip_prefix("preempted by job ").and_then(|n| n.parse().ok()) {
            Drained::Preempted { by: JobId(by) }
        } else if reason.starts_with(super::plan::FAIR_SHARE_REASON) {
            Drained::FairShare { waiting: waiting(&reason, " waits") }
        } else if reason.starts_with(super::plan::QUOTA_REASON) {
            Drained::Quota { waiting: waiting(&reason, " is under its own and waits") }
        } else if let Some(rest) = reason.strip_prefix("node ") {
            let node = rest.split_once(" drained ").map_or(rest, |(name, _)| name);
            Drained::Node { node: node.to_string() }
        } else {
            Drained::Reclaim
        };
        DrainNotice { notice_at_ms, deadline_ms, cause, reason }
    }
}

/// What the tally counts a job as: its tier, state and GPUs, and, while
/// it is queued outside the core, why (a `Waiting`'s reason code).
pub type Counted = (Tier, JobState, u32, Option<ebb_api::PendingReason>);

/// Jobs by tier and state, and their GPUs, kept as records are saved, so
/// that `/metrics` need not walk every job; and the queued jobs kept out
/// of the core by tier and reason (the core knows why the others wait).
#[derive(Default)]
pub(super) struct Tally {
    pub jobs: BTreeMap<(Tier, JobState), u64>,
    pub gpus: BTreeMap<(Tier, JobState), u64>,
    pub waiting: BTreeMap<(Tier, ebb_api::PendingReason), u64>,
}

impl Tally {
    /// Counts `job` as it is now, in place of what it was counted as.
    pub fn count(&mut self, job: &mut JobRecord) {
        let waiting = match (job.state, job.waiting) {
            (JobState::Queued, Some(w)) => Some(w.code()),
            _ => None,
        };
        let now = (job.tier, job.state, job.tallied_gpus(), waiting);
        if job.counted == Some(now) {
            return;
        }
        if let Some((tier, state, gpus, waiting)) = job.counted.take() {
            Self::sub(&mut self.jobs, (tier, state), 1);
            Self::sub(&mut self.gpus, (tier, state), u64::from(gpus));
            if let Some(reason) = waiting {
                Self::sub(&mut self.waiting, (tier, reason), 1);
            }
        }
        *self.jobs.entry((job.tier, job.state)).or_default() += 1;
        *self.gpus.entry((job.tier, job.state)).or_default() += u64::from(now.2);
        if let Some(reason) = waiting {
            *self.waiting.entry((job.tier, reason)).or_default() += 1;
        }
        job.counted = Some(now);
    }

    /// Counts `jobs` jobs of `tier` in `state` with `gpus` GPUs in all,
    /// whose records are not in memory (finished jobs, at start).
    pub fn add(&mut self, tier: Tier, state: JobState, jobs: u64, gpus: u64) {
        *self.jobs.entry((tier, state)).or_default() += jobs;
        *self.gpus.entry((tier, state)).or_default() += gpus;
    }

    fn sub<K: Ord>(map: &mut BTreeMap<K, u64>, key: K, n: u64) {
        if let Some(count) = map.get_mut(&key) {
            *count = count.saturating_sub(n);
        }
    }
}

/// The tasks of one submission are stored a row each, and share one
/// environment again when read back.
impl crate::store::JobRow for JobRecord {
    fn share_with(&mut self, previous: &JobRecord) {
        if previous.spec.env == self.spec.env {
            self.spec.env = previous.spec.env.clone();
        }
        if previous.spec.argv == self.spec.argv {
            self.spec.argv = previous.spec.argv.clone();
        }
        if previous.spec.slurm == self.spec.slurm {
            self.spec.slurm = previous.spec.slurm.clone();
        }
    }
}

/// A run id's random bits: never 0 (which marks a job without them).
fn new_run_nonce() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the system's random source");
    u64::from_le_bytes(bytes).max(1)
}

impl JobRecord {
    /// The one run every attempt is part of (see [`super::launch::run_id`]).
    pub fn run_id(&self) -> String {
        super::launch::run_id(self.id, self.submitted_ms, self.run_nonce)
    }

    /// A job just accepted: queued, never placed.
    pub fn queued(
        id: JobId,
        tenant: TenantId,
        spec: StoredSpec,
        tier: Tier,
        gpus: u32,
        signal: i32,
        submitted_ms: u64,
    ) -> JobRecord {
        JobRecord {
            id,
            tenant,
            spec,
            tier,
            gpus,
            signal,
            state: JobState::Queued,
            attempt: Attempt(0),
            preemptions: 0,
            retries: 0,
            submitted_ms,
            placement: Vec::new(),
            started_ms: 0,
            running_on: Vec::new(),
            drain: None,
            legacy_notice: None,
            exit_code: None,
            exit_signal: None,
            cancel_requested: false,
            cancel_notice: None,
            vanished: false,
            held: Vec::new(),
            waiting_for: Vec::new(),
            waiting_parts: Vec::new(),
            elastic: None,
            staged: None,
            spent_attempt: Attempt(0),
            array: None,
            checkpoints: CheckpointStats::default(),
            run_started_ms: None,
            started_on: Vec::new(),
            attempt_checkpoint_ms: None,
            exited_ms: 0,
            lost_gpu_ms: 0,
            interval: None,
            rendezvous: None,
            step_key: None,
            billing: None,
            waiting: None,
            quick_exits: 0,
            drilled_since_preempted: false,
            requeues: 0,
            requeued_itself: false,
            run_nonce: new_run_nonce(),
            gang_grace_until: None,
            gang_stopped: None,
            rendezvous_failed: None,
            pulling: None,
            drill: None,
            log_tracked: true,
            deadline: None,
            ended_by: None,
            timed_out: false,
            counted: None,
            no_output: true,
        }
    }
}

/// Why a queued job is not in the scheduling core yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// A `--restart always` job that keeps exiting quickly runs again
    /// only after `until_ms`, as Kubernetes' CrashLoopBackOff.
    Backoff { until_ms: u64 },
    /// Its tenant has `max_running_jobs` admitted; it is admitted when
    /// one of them finishes, in submission order.
    TenantLimit,
    /// Jobs it depends on (`after`) have not ended as it needs.
    Dependency,
    /// Its array has `array_limit` tasks running; it runs when one ends,
    /// in index order.
    ArrayLimit,
}

impl Waiting {
    /// Its `pending_reason` code.
    pub fn code(self) -> ebb_api::PendingReason {
        match self {
            Waiting::Backoff { .. } => ebb_api::PendingReason::Backoff,
            Waiting::TenantLimit => ebb_api::PendingReason::TenantLimit,
            Waiting::Dependency => ebb_api::PendingReason::Dependency,
            Waiting::ArrayLimit => ebb_api::PendingReason::ArrayLimit,
        }
    }
}

/// A `--restart always` run shorter than this counts as a quick exit.
pub const QUICK_EXIT_MS: u64 = 10_000;
/// The back-off after the n-th quick exit in a row: 1 s, doubling, at most 5 min.
pub fn restart_backoff_ms(quick_exits: u32) -> u64 {
    match quick_exits {
        0 => 0,
        n => (1_000u64 << (n - 1).min(20)).min(300_000),
    }
}

/// What one tenant has in the server, against its limits.
#[derive(Clone, Debug, Default)]
pub(super) struct TenantLoad {
    /// Jobs not finished, and the bytes of their arguments and environments.
    pub(super) jobs: u64,
    pub(super) bytes: u64,
    /// Jobs admitted to the scheduling core (queued there, running, or in
    /// a restart back-off).
    pub(super) admitted: u64,
    /// Jobs waiting for admission, by id: submission order.
    pub(super) waiting: BTreeSet<JobId>,
}

/// A record leaves out what is at its default (a missing field reads
/// back as its default, in this server and the ones before it): a record
/// is written at every change of its job.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

mod tier_name {
    use ebb_core::Tier;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(tier: &Tier, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tier.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
impl JobRecord {
    /// A preemptible gang of 8 GPUs a node, its attempt `attempt`
    /// running on `nodes` since 1,000.
    pub(super) fn running_gang(id: JobId, attempt: Attempt, nodes: &[&str]) -> JobRecord {
        let spec = ebb_api::JobSubmission { argv: vec!["train".into()], ..Default::default() };
        let gpus = 8 * nodes.len() as u32;
        let mut job =
            JobRecord::queued(id, TenantId(1), StoredSpec::from(spec), Tier::Preemptible, gpus, 15, 0);
        job.state = JobState::Running;
        job.attempt = attempt;
        job.placement = nodes.iter().map(|n| Part::new(*n, (0..8).collect())).collect();
        job.running_on = nodes.iter().map(|n| n.to_string()).collect();
        job.run_started_ms = Some(1_000);
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn legacy(reason: &str) -> Drained {
        let tenants = |name: &str| {
            [("alpha", 3), ("beta team", 4)].into_iter().find(|t| t.0 == name).map(|t| TenantId(t.1))
        };
        DrainNotice::from_legacy((10, 20, reason.to_string()), false, tenants).cause
    }

    #[test]
    fn a_part_reads_in_either_form_and_is_written_with_names() {
        let pair: Part = serde_json::from_str(r#"["node-1", [0, 3]]"#).unwrap();
        let named: Part = serde_json::from_str(r#"{"node": "node-1", "gpus": [0, 3]}"#).unwrap();
        assert_eq!(pair, Part::new("node-1", vec![0, 3]));
        assert_eq!(named, pair);
        assert_eq!(serde_json::to_string(&pair).unwrap(), r#"{"node":"node-1","gpus":[0,3]}"#);
        assert!(serde_json::from_str::<Part>(r#"["node-1"]"#).is_err());
        assert!(serde_json::from_str::<Part>(r#"["node-1", [0], "more"]"#).is_err());
        assert!(serde_json::from_str::<Part>(r#"{"node": "node-1", "gpus": [256]}"#).is_err());
        assert!(serde_json::from_str::<Part>(r#"{"node": "node-1"}"#).is_err());
        let later: Part = serde_json::from_str(r#"{"gpus": [1], "since_ms": 5, "node": "n\u0031"}"#).unwrap();
        assert_eq!(later, Part::new("n1", vec![1]), "a field of a later release is passed over");
    }

    proptest! {
        #[test]
        fn a_part_reads_back_from_either_form(node in ".{0,40}", gpus in proptest::collection::vec(any::<u8>(), 0..16)) {
            let part = Part::new(node.clone(), gpus.clone());
            let named: Part = serde_json::from_str(&serde_json::to_string(&part).unwrap()).unwrap();
            let pair: Part = serde_json::from_str(&serde_json::to_string(&(node, gpus)).unwrap()).unwrap();
            prop_assert_eq!(&named, &part);
            prop_assert_eq!(&pair, &part);
        }
    }

    #[test]
    fn a_legacy_notice_is_read_back_into_its_cause() {
        let fair = "fair share: alpha is furthest above its share of the preemptible tier (80% of its usage \
                    against a weight of 50%); beta team waits";
        let quota = "quota: alpha borrows past its quota of the preemptible tier; beta team is under its own and waits";
        assert_eq!(legacy("preempted by job 17"), Drained::Preempted { by: JobId(17) });
        assert_eq!(legacy(fair), Drained::FairShare { waiting: TenantId(4) });
        assert_eq!(legacy(quota), Drained::Quota { waiting: TenantId(4) });
        assert_eq!(legacy(&fair.replace("beta team", "gone")), Drained::FairShare { waiting: TenantId(0) });
        assert_eq!(
            legacy("node gpu-7 drained for its health: xid 79"),
            Drained::Node { node: "gpu-7".into() }
        );
        assert_eq!(legacy("node gpu-7 drained by the operator"), Drained::Node { node: "gpu-7".into() });
        assert_eq!(legacy(super::super::plan::DRILL_REASON), Drained::Drill);
        assert_eq!(legacy("preemptible capacity reclaimed by the operator"), Drained::Reclaim);
        let notice = DrainNotice::from_legacy((10, 20, "preempted by job 1".into()), true, |_| None);
        assert_eq!((notice.notice_at_ms, notice.deadline_ms, notice.cause), (10, 20, Drained::Drill));
    }

    proptest! {
        /// Whatever words an old record holds, reading them back neither
        /// panics nor loses them, and the typed form survives a round trip.
        #[test]
        fn any_legacy_notice_reads_and_round_trips(reason in ".{0,80}", at in any::<u64>(), deadline in any::<u64>()) {
            let notice = DrainNotice::from_legacy((at, deadline, reason.clone()), false, |n| n.len().try_into().ok().map(TenantId));
            prop_assert_eq!(&notice.reason, &reason);
            let json = serde_json::to_string(&notice).unwrap();
            prop_assert_eq!(serde_json::from_str::<DrainNotice>(&json).unwrap(), notice);
        }
    }
}
