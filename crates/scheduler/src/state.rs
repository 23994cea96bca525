//! The scheduling core's state and the events that change it.
//!
//! The edge (server or simulator) reports what happened — a submission, an
//! exit, a checkpoint, a node joining or being drained — through the methods
//! here, asks [`crate::schedule`] for a plan, and commits it with
//! [`State::apply`]. Every method is deterministic and does no I/O.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, ReservationId, Span, TenantId, Tier, Time};

use rustc_hash::FxHashMap;

use crate::error::{ApplyError, StateError};
use crate::index::{IndexKey, ModelIndex, SingleKey};
use crate::model::*;
use crate::plan::{Drain, Plan, RequeueReason};

/// One GPU model and the tier counters the caps are checked against.
#[derive(Clone, Debug)]
pub struct GpuModel {
    pub name: String,
    pub gpus_per_node: u8,
    /// GPUs on `Up` nodes.
    pub capacity: u32,
    /// GPUs running or held for reserved jobs.
    pub reserved_used: u32,
    /// GPUs running or held for on-demand jobs.
    pub on_demand_used: u32,
    /// GPUs of preemptible jobs that are running and not draining.
    pub preemptible_active: u32,
    /// Operator's reclaim: preemptible jobs may hold at most this many.
    pub preemptible_limit: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub model: GpuModelId,
    pub gpus: u8,
    pub labels: BTreeMap<String, String>,
    pub status: NodeStatus,
    pub last_heartbeat: Time,
    /// GPUs running an attempt.
    pub(crate) used: u64,
    /// GPUs held for preemptors (may still be used by draining victims).
    pub(crate) held: u64,
    /// Attempts on this node and their GPUs here.
    pub(crate) jobs: Vec<(JobId, u64)>,
    pub(crate) key: Option<IndexKey>,
    pub(crate) single_keys: Vec<SingleKey>,
}

impl Node {
    pub fn full_mask(&self) -> u64 {
        full_mask(self.gpus)
    }

    pub fn used_mask(&self) -> u64 {
        self.used
    }

    pub fn held_mask(&self) -> u64 {
        self.held
    }

    pub fn free_mask(&self) -> u64 {
        self.full_mask() & !self.used & !self.held
    }

    pub fn jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs.iter().map(|(job, _)| *job)
    }
}

pub(crate) fn full_mask(gpus: u8) -> u64 {
    if gpus >= 64 {
        u64::MAX
    } else {
        (1u64 << gpus) - 1
    }
}

/// GPUs held for a preemptor until its victims have left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub job: JobId,
    pub model: GpuModelId,
    pub alloc: Vec<(NodeId, u64)>,
    pub waiting_on: BTreeSet<JobId>,
}

/// Jobs that are interchangeable for the queue walk: if the first of a
/// class cannot start, none of the others can in the same pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueClass {
    pub tier: Tier,
    pub model: Option<GpuModelId>,
    pub gpus: u32,
    /// Reserved jobs draw on their own tenant's reservation.
    pub tenant: Option<TenantId>,
}

impl QueueClass {
    fn of(spec: &JobSpec) -> QueueClass {
        QueueClass {
            tier: spec.tier,
            model: spec.gpu_model,
            gpus: spec.gpus,
            tenant: (spec.tier == Tier::Reserved).then_some(spec.tenant),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct State {
    pub(crate) models: Vec<GpuModel>,
    model_ids: BTreeMap<String, GpuModelId>,
    pub(crate) nodes: Vec<Node>,
    node_ids: BTreeMap<String, NodeId>,
    /// Looked up on every decision, so hashed; `FxHash` has no random
    /// seed, so even iteration order is the same for the same history.
    pub(crate) jobs: FxHashMap<JobId, Job>,
    pub(crate) queues: BTreeMap<QueueClass, BTreeSet<(Time, JobId)>>,
    pub(crate) holds: BTreeMap<JobId, Hold>,
    /// Holds whose victims have all left: the job starts next pass.
    pub(crate) ready_holds: BTreeSet<JobId>,
    /// Victim -> the preemptor waiting for it.
    victim_of: BTreeMap<JobId, JobId>,
    pub(crate) reservations: BTreeMap<ReservationId, Reservation>,
    reserved_used: BTreeMap<(TenantId, GpuModelId), u32>,
    pub(crate) index: Vec<ModelIndex>,
    pub(crate) heartbeats: BTreeSet<(Time, NodeId)>,
    /// Cordoned nodes whose preemptible jobs still need their notice.
    pub(crate) pending_node_drains: BTreeSet<NodeId>,
    queued_by_tier: [u32; 3],
}

/// A run the edge puts back at restart (`State::restore_run`): attempt
/// `attempt` on `alloc` since `started_at`, with its preemptions so far,
/// its last checkpoint, and its drain notice if it was draining.
#[derive(Clone, Debug)]
pub struct RestoredRun {
    pub attempt: Attempt,
    pub preemptions: u32,
    pub alloc: Vec<(NodeId, u64)>,
    pub started_at: Time,
    pub last_checkpoint_at: Option<Time>,
    pub notice: Option<Notice>,
}

impl State {
    pub fn new() -> State {
        State::default()
    }

    // ---- queries -------------------------------------------------------

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Every job the core tracks (queued, holding, running, draining), in
    /// no meaningful order.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.0 as usize)
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.node_ids.get(name).copied()
    }

    pub fn model(&self, id: GpuModelId) -> Option<&GpuModel> {
        self.models.get(id.0 as usize)
    }

    pub fn model_by_name(&self, name: &str) -> Option<GpuModelId> {
        self.model_ids.get(name).copied()
    }

    pub fn models(&self) -> impl Iterator<Item = (GpuModelId, &GpuModel)> {
        self.models.iter().enumerate().map(|(i, m)| (GpuModelId(i as u16), m))
    }

    /// The first queued job of `job`'s queue class (jobs of the same tier,
    /// size and model): while it waits, `job` waits behind it.
    pub fn first_in_line(&self, job: JobId) -> Option<JobId> {
        let j = self.jobs.get(&job)?;
        self.queues.get(&QueueClass::of(&j.spec))?.first().map(|&(_, id)| id)
    }

    /// Every queue class that has jobs: its tier, its first job and how
    /// many wait in it (the first included). O(classes).
    pub fn queue_heads(&self) -> impl Iterator<Item = (Tier, JobId, usize)> + '_ {
        self.queues.iter().filter_map(|(class, queue)| Some((class.tier, queue.first()?.1, queue.len())))
    }

    pub fn hold(&self, job: JobId) -> Option<&Hold> {
        self.holds.get(&job)
    }

    /// Every hold, by the waiting job's id.
    pub fn holds(&self) -> impl Iterator<Item = &Hold> {
        self.holds.values()
    }

    pub fn queued(&self, tier: Tier) -> u32 {
        self.queued_by_tier[tier.rank() as usize]
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values()
    }

    /// GPUs of `tenant`'s active reservations of `model` at `now`.
    pub fn reserved_capacity(&self, tenant: TenantId, model: GpuModelId, now: Time) -> u32 {
        self.reservations
            .values()
            .filter(|r| r.tenant == tenant && r.gpu_model == model && r.is_active(now))
            .map(|r| r.gpus)
            .sum()
    }

    /// GPUs of all active reservations of `model` at `now`: on-demand work
    /// may not use them, preemptible work may borrow them.
    pub fn reserved_total(&self, model: GpuModelId, now: Time) -> u32 {
        self.reservations.values().filter(|r| r.gpu_model == model && r.is_active(now)).map(|r| r.gpus).sum()
    }

    pub fn reserved_used(&self, tenant: TenantId, model: GpuModelId) -> u32 {
        self.reserved_used.get(&(tenant, model)).copied().unwrap_or(0)
    }

    // ---- nodes ---------------------------------------------------------

    /// A node joins (or a lost node comes back under its name).
    pub fn add_node(&mut self, spec: NodeSpec, now: Time) -> Result<NodeId, StateError> {
        if spec.name.is_empty() {
            return Err(StateError::Invalid("node: name must not be empty".into()));
        }
        if spec.gpus == 0 || spec.gpus > MAX_GPUS_PER_NODE {
            return Err(StateError::Invalid(format!(
                "node {}: gpus must be between 1 and {MAX_GPUS_PER_NODE}, got {}",
                spec.name, spec.gpus
            )));
        }
        let model = match self.model_ids.get(&spec.gpu_model) {
            Some(&model) => {
                let per_node = self.models[model.0 as usize].gpus_per_node;
                if per_node != spec.gpus {
                    return Err(StateError::Invalid(format!(
                        "node {}: every {} node has {per_node} GPUs, this one reports {}",
                        spec.name, spec.gpu_model, spec.gpus
                    )));
                }
                model
            }
            None => {
                if spec.gpu_model.is_empty() {
                    return Err(StateError::Invalid(format!(
                        "node {}: gpu model must not be empty",
                        spec.name
                    )));
                }
                let model = GpuModelId(self.models.len() as u16);
                self.models.push(GpuModel {
                    name: spec.gpu_model.clone(),
                    gpus_per_node: spec.gpus,
                    capacity: 0,
                    reserved_used: 0,
                    on_demand_used: 0,
                    preemptible_active: 0,
                    preemptible_limit: None,
                });
                self.index.push(ModelIndex::new(spec.gpus));
                self.model_ids.insert(spec.gpu_model.clone(), model);
                model
            }
        };
        if let Some(&id) = self.node_ids.get(&spec.name) {
            let node = &mut self.nodes[id.0 as usize];
            if node.status != NodeStatus::Lost {
                return Err(StateError::Conflict(format!("node {}: already joined", spec.name)));
            }
            if node.model != model {
                return Err(StateError::Invalid(format!(
                    "node {}: rejoined with a different gpu model",
                    spec.name
                )));
            }
            debug_assert_eq!(node.used, 0);
            node.status = NodeStatus::Up;
            node.labels = spec.labels;
            self.set_heartbeat(id, now);
            self.models[model.0 as usize].capacity += spec.gpus as u32;
            self.reindex(id);
            return Ok(id);
        }
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            id,
            name: spec.name.clone(),
            model,
            gpus: spec.gpus,
            labels: spec.labels,
            status: NodeStatus::Up,
            last_heartbeat: now,
            used: 0,
            held: 0,
            jobs: Vec::new(),
            key: None,
            single_keys: Vec::new(),
        });
        self.node_ids.insert(spec.name, id);
        self.heartbeats.insert((now, id));
        self.models[model.0 as usize].capacity += spec.gpus as u32;
        self.reindex(id);
        Ok(id)
    }

    pub fn heartbeat(&mut self, node: NodeId, now: Time) -> Result<(), StateError> {
        let status = self.node_checked(node)?.status;
        if status == NodeStatus::Lost {
            return Err(StateError::Conflict(format!("node {node}: lost, must rejoin")));
        }
        self.set_heartbeat(node, now);
        Ok(())
    }

    /// Nodes last heard at or before `before`, the longest silent first
    /// (lost nodes among them).
    pub fn silent_since(&self, before: Time) -> impl Iterator<Item = NodeId> + '_ {
        self.heartbeats.iter().take_while(move |(last, _)| *last <= before).map(|&(_, id)| id)
    }

    fn set_heartbeat(&mut self, id: NodeId, now: Time) {
        let node = &mut self.nodes[id.0 as usize];
        self.heartbeats.remove(&(node.last_heartbeat, id));
        node.last_heartbeat = node.last_heartbeat.max(now);
        self.heartbeats.insert((node.last_heartbeat, id));
    }

    /// Maintenance drain: the node takes no new work, its preemptible jobs
    /// get their notice in the next pass, other tiers run to completion.
    pub fn drain_node(&mut self, node: NodeId) -> Result<(), StateError> {
        // An unhealthy node's capacity is out already; its drain goes ahead.
        let counted = match self.node_checked(node)?.status {
            NodeStatus::Up => true,
            NodeStatus::Unhealthy => false,
            NodeStatus::Cordoned => return Ok(()),
            NodeStatus::Lost => return Err(StateError::Conflict(format!("node {node}: lost, cannot drain"))),
        };
        let n = &mut self.nodes[node.0 as usize];
        n.status = NodeStatus::Cordoned;
        let (model, gpus) = (n.model, n.gpus);
        if counted {
            self.models[model.0 as usize].capacity -= gpus as u32;
        }
        self.reindex(node);
        self.release_holds_on(node);
        self.pending_node_drains.insert(node);
        Ok(())
    }

    /// Puts a drained node back into service.
    pub fn undrain_node(&mut self, node: NodeId) -> Result<(), StateError> {
        if self.node_checked(node)?.status != NodeStatus::Cordoned {
            return Err(StateError::Conflict(format!("node {node}: not drained")));
        }
        let n = &mut self.nodes[node.0 as usize];
        n.status = NodeStatus::Up;
        let (model, gpus) = (n.model, n.gpus);
        self.models[model.0 as usize].capacity += gpus as u32;
        self.pending_node_drains.remove(&node);
        self.reindex(node);
        Ok(())
    }

    /// Whether a node that is up may take new work: an unhealthy one takes
    /// none (its capacity leaves the model and its holds are released, as
    /// for a drain) but its jobs run on and nothing is drained. Only `Up`
    /// and `Unhealthy` change; a cordoned or lost node stays as it is.
    pub fn set_healthy(&mut self, node: NodeId, healthy: bool) -> Result<(), StateError> {
        let n = self.node_checked(node)?;
        let (model, gpus) = (n.model, n.gpus as u32);
        match (n.status, healthy) {
            (NodeStatus::Up, false) => {
                self.nodes[node.0 as usize].status = NodeStatus::Unhealthy;
                self.models[model.0 as usize].capacity -= gpus;
                self.reindex(node);
                self.release_holds_on(node);
            }
            (NodeStatus::Unhealthy, true) => {
                self.nodes[node.0 as usize].status = NodeStatus::Up;
                self.models[model.0 as usize].capacity += gpus;
                self.reindex(node);
            }
            _ => {}
        }
        Ok(())
    }

    /// The node is gone: its attempts are requeued as lost (not failed,
    /// not preempted) and holds on it are released.
    pub fn lose_node(&mut self, node: NodeId) -> Result<Vec<JobId>, StateError> {
        let n = self.node_checked(node)?;
        match n.status {
            NodeStatus::Lost => return Ok(Vec::new()),
            NodeStatus::Up => {
                let (model, gpus) = (n.model, n.gpus);
                self.models[model.0 as usize].capacity -= gpus as u32;
            }
            NodeStatus::Cordoned | NodeStatus::Unhealthy => {}
        }
        let n = &mut self.nodes[node.0 as usize];
        n.status = NodeStatus::Lost;
        self.heartbeats.remove(&(n.last_heartbeat, node));
        self.pending_node_drains.remove(&node);
        self.reindex(node);
        self.release_holds_on(node);
        let victims: Vec<JobId> = self.nodes[node.0 as usize].jobs().collect();
        for &job in &victims {
            self.end_run(job);
            self.requeue(job);
        }
        Ok(victims)
    }

    fn node_checked(&self, node: NodeId) -> Result<&Node, StateError> {
        self.nodes.get(node.0 as usize).ok_or_else(|| StateError::NotFound(format!("node {node}")))
    }

    // ---- operator capacity ---------------------------------------------

    /// Takes `gpus` GPUs of `model` back from the preemptible tier: the next
    /// pass drains victims until preemptible work holds that many fewer,
    /// and no preemptible job starts above the new limit until released.
    pub fn reclaim(&mut self, model: GpuModelId, gpus: u32) -> Result<u32, StateError> {
        let m = self.model_mut(model)?;
        let limit = m.preemptible_active.saturating_sub(gpus);
        m.preemptible_limit = Some(m.preemptible_limit.map_or(limit, |l| l.min(limit)));
        Ok(limit)
    }

    /// Puts back a reclaim limit as it stood (a restarted server).
    pub fn restore_reclaim(&mut self, model: GpuModelId, limit: u32) -> Result<(), StateError> {
        self.model_mut(model)?.preemptible_limit = Some(limit);
        Ok(())
    }

    /// Lifts a reclaim: preemptible work may use any idle GPU again.
    pub fn release_reclaim(&mut self, model: GpuModelId) -> Result<(), StateError> {
        self.model_mut(model)?.preemptible_limit = None;
        Ok(())
    }

    fn model_mut(&mut self, model: GpuModelId) -> Result<&mut GpuModel, StateError> {
        self.models
            .get_mut(model.0 as usize)
            .ok_or_else(|| StateError::NotFound(format!("gpu model {model}")))
    }

    pub fn add_reservation(&mut self, r: Reservation) -> Result<(), StateError> {
        if self.model(r.gpu_model).is_none() {
            return Err(StateError::NotFound(format!("reservation {}: gpu model {}", r.id, r.gpu_model)));
        }
        if r.gpus == 0 {
            return Err(StateError::Invalid(format!("reservation {}: gpus must be at least 1", r.id)));
        }
        if r.start >= r.end {
            return Err(StateError::Invalid(format!("reservation {}: start must be before end", r.id)));
        }
        if self.reservations.contains_key(&r.id) {
            return Err(StateError::Conflict(format!("reservation {}: already exists", r.id)));
        }
        self.reservations.insert(r.id, r);
        Ok(())
    }

    pub fn remove_reservation(&mut self, id: ReservationId) -> Result<Reservation, StateError> {
        self.reservations.remove(&id).ok_or_else(|| StateError::NotFound(format!("reservation {id}")))
    }

    // ---- jobs ----------------------------------------------------------

    pub fn submit(&mut self, spec: JobSpec) -> Result<(), StateError> {
        if spec.gpus == 0 {
            return Err(StateError::Invalid(format!("job {}: gpus must be at least 1, got 0", spec.id)));
        }
        if self.jobs.contains_key(&spec.id) {
            return Err(StateError::Conflict(format!("job {}: already submitted", spec.id)));
        }
        if let Some(model) = spec.gpu_model {
            let m = self
                .model(model)
                .ok_or_else(|| StateError::NotFound(format!("job {}: gpu model {model}", spec.id)))?;
            if !shape_fits(spec.gpus, m.gpus_per_node) {
                return Err(StateError::Invalid(format!(
                    "job {}: gpus must be at most {per} or a multiple of {per} ({} nodes have {per} GPUs), got {}",
                    spec.id,
                    m.name,
                    spec.gpus,
                    per = m.gpus_per_node
                )));
            }
        } else if spec.tier == Tier::Reserved {
            return Err(StateError::Invalid(format!(
                "job {}: a reserved job must name the gpu model of its reservation",
                spec.id
            )));
        }
        let id = spec.id;
        self.jobs.insert(
            id,
            Job {
                spec,
                attempt: Attempt(0),
                preemptions: 0,
                phase: Phase::Queued,
                run: None,
                notice: None,
                drilled: false,
                last_node: None,
            },
        );
        self.enqueue(id);
        Ok(())
    }

    /// Puts back a queued job when the edge restarted, with the attempts
    /// it has had and its preemptions: its next attempt gets a new number,
    /// so an agent still holding an old one is fenced.
    pub fn restore_queued(
        &mut self,
        spec: JobSpec,
        attempt: Attempt,
        preemptions: u32,
    ) -> Result<(), StateError> {
        let id = spec.id;
        self.submit(spec)?;
        let job = self.jobs.get_mut(&id).expect("just submitted");
        job.attempt = attempt;
        job.preemptions = preemptions;
        Ok(())
    }

    /// A restored job (queued or running) was requeued by a drill since it
    /// was last preempted (see [`Job::settling`]): the edge keeps that
    /// with its record and says so after restoring it.
    pub fn restore_drilled(&mut self, id: JobId) -> Result<(), StateError> {
        self.jobs.get_mut(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))?.drilled = true;
        Ok(())
    }

    /// Puts back a job that was running when the edge restarted: `spec`
    /// as submitted, and its run as the edge recorded it. Refused if the
    /// GPUs are not free on up nodes of one model, or the shape is wrong.
    pub fn restore_run(&mut self, spec: JobSpec, run: RestoredRun) -> Result<(), StateError> {
        let RestoredRun { attempt, preemptions, alloc, started_at, last_checkpoint_at, notice } = run;
        let id = spec.id;
        if self.jobs.contains_key(&id) {
            return Err(StateError::Conflict(format!("job {id}: already known")));
        }
        let model = match alloc.first() {
            Some((node, _)) => self.node_checked(*node)?.model,
            None => return Err(StateError::Invalid(format!("job {id}: restored run has no GPUs"))),
        };
        let gpus: u32 = alloc.iter().map(|(_, m)| m.count_ones()).sum();
        if gpus != spec.gpus {
            return Err(StateError::Invalid(format!(
                "job {id}: restored run has {gpus} GPUs, wants {}",
                spec.gpus
            )));
        }
        for &(node, mask) in &alloc {
            let n = self.node_checked(node)?;
            if n.status == NodeStatus::Lost || n.model != model || n.free_mask() & mask != mask {
                return Err(StateError::Conflict(format!("job {id}: GPUs on {} are not free", n.name)));
            }
        }
        if notice.is_some() && spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!("job {id}: only preemptible jobs drain")));
        }
        let (tier, tenant) = (spec.tier, spec.tenant);
        let phase = if notice.is_some() { Phase::Draining } else { Phase::Running };
        let run = Run { attempt, model, alloc: alloc.clone(), started_at, last_checkpoint_at };
        self.jobs.insert(
            id,
            Job {
                spec,
                attempt,
                preemptions,
                phase,
                run: Some(run),
                notice,
                drilled: false,
                last_node: None,
            },
        );
        if phase == Phase::Running {
            self.adjust_usage(tier, tenant, model, gpus as i64);
        }
        for (node, mask) in alloc {
            let n = &mut self.nodes[node.0 as usize];
            n.used |= mask;
            n.jobs.push((id, mask));
            self.reindex(node);
        }
        Ok(())
    }

    /// Puts back a hold that existed when the edge restarted: the queued job
    /// `id` waits for `victims` (those still draining) on exactly `alloc`.
    /// Without this a restarted server would preempt again for a job whose
    /// first victims are still leaving. Refused unless the job is queued
    /// and non-preemptible, and the GPUs are free or used only by draining
    /// victims.
    pub fn restore_hold(
        &mut self,
        id: JobId,
        alloc: Vec<(NodeId, u64)>,
        victims: &[JobId],
    ) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        if job.phase != Phase::Queued || job.spec.tier == Tier::Preemptible {
            return Err(StateError::Conflict(format!("job {id}: cannot hold GPUs")));
        }
        let (gpus, tier, tenant) = (job.spec.gpus, job.spec.tier, job.spec.tenant);
        let waiting: BTreeSet<JobId> = victims
            .iter()
            .copied()
            .filter(|v| {
                self.jobs.get(v).is_some_and(|j| j.phase == Phase::Draining)
                    && !self.victim_of.contains_key(v)
            })
            .collect();
        let model = match alloc.first() {
            Some((node, _)) => self.node_checked(*node)?.model,
            None => return Err(StateError::Invalid(format!("job {id}: hold has no GPUs"))),
        };
        let total: u32 = alloc.iter().map(|(_, m)| m.count_ones()).sum();
        if total != gpus {
            return Err(StateError::Invalid(format!("job {id}: hold has {total} GPUs, wants {gpus}")));
        }
        for &(node, mask) in &alloc {
            let n = self.node_checked(node)?;
            let victims_here =
                n.jobs.iter().filter(|(j, _)| waiting.contains(j)).fold(0, |acc, (_, m)| acc | m);
            if n.status != NodeStatus::Up
                || n.model != model
                || n.held & mask != 0
                || mask & n.used & !victims_here != 0
            {
                return Err(StateError::Conflict(format!("job {id}: GPUs on {} cannot be held", n.name)));
            }
        }
        self.dequeue(id);
        self.jobs.get_mut(&id).expect("checked").phase = Phase::Holding;
        self.adjust_usage(tier, tenant, model, gpus as i64);
        for &(node, mask) in &alloc {
            self.nodes[node.0 as usize].held |= mask;
            self.reindex(node);
        }
        for v in &waiting {
            self.victim_of.insert(*v, id);
        }
        if waiting.is_empty() {
            self.ready_holds.insert(id);
        }
        self.holds.insert(id, Hold { job: id, model, alloc, waiting_on: waiting });
        Ok(())
    }

    /// Withdraws a job that is not running (running jobs end through
    /// [`State::exited`] once their processes are gone).
    pub fn cancel(&mut self, id: JobId) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        match job.phase {
            Phase::Queued => self.dequeue(id),
            Phase::Holding => self.drop_hold(id),
            Phase::Running | Phase::Draining => {
                return Err(StateError::Conflict(format!(
                    "job {id}: running; stop its processes and report the exit"
                )))
            }
        }
        let job = self.jobs.remove(&id).expect("checked above");
        self.queued_by_tier[job.spec.tier.rank() as usize] -= 1;
        Ok(())
    }

    /// A fire drill: gives running preemptible job `id` a real drain
    /// notice now, with the deadline any drain would have (`now` plus the
    /// operator's `drain_window`). It is committed as a one-drain plan
    /// through [`State::apply`], so it meets every check a pass's drain
    /// does; the edge carries it out as it carries out a pass's drains.
    /// When the attempt exits without finishing, [`State::exited`] requeues
    /// it as [`ExitEffect::Drilled`]. Refused unless the job is preemptible
    /// and running without a notice.
    pub fn drill(&mut self, id: JobId, now: Time, drain_window: Span) -> Result<Drain, StateError> {
        let job = self.job_checked(id)?;
        if job.spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!(
                "job {id}: {}; only preemptible jobs are drained, so only they can be drilled",
                job.spec.tier
            )));
        }
        let attempt = match (job.phase, &job.run) {
            (Phase::Running, Some(run)) => run.attempt,
            (Phase::Draining, _) => {
                return Err(StateError::Conflict(format!("job {id}: already draining")));
            }
            _ => return Err(StateError::Conflict(format!("job {id}: not running"))),
        };
        let drain = Drain {
            job: id,
            attempt,
            notice_at: now,
            deadline: now + drain_window,
            reason: DrainReason::Drill,
        };
        let plan = Plan { now, drains: vec![drain], ..Plan::default() };
        self.apply(&plan).map_err(|e| StateError::Conflict(format!("job {id}: {e}")))?;
        Ok(drain)
    }

    /// Moves preemptible job `id` to the on-demand tier because its
    /// deadline no longer fits the preemptible tier's risk (the edge
    /// decides when). A queued job changes queue, where it takes its place
    /// as of `now`, as if submitted to on-demand then: by its submission
    /// time, a tenant could hold an early place in the on-demand queue at
    /// the preemptible price and claim it later. A running job changes
    /// tier where it runs (and would queue from `now` if it ran again): its GPUs move from
    /// the preemptible to the on-demand counters and it leaves the victim
    /// indices. That needs on-demand room outside every reservation at
    /// `now` (a job on lent reserved GPUs may be what fills it); without
    /// it the promotion is refused as a conflict and the job runs on as
    /// preemptible, for the edge to try again. A draining job is refused
    /// too: it is promoted once its exit has requeued it.
    pub fn promote(&mut self, id: JobId, now: Time) -> Result<Promoted, StateError> {
        let job = self.job_checked(id)?;
        if job.spec.tier != Tier::Preemptible {
            return Err(StateError::Invalid(format!(
                "job {id}: {}; only preemptible jobs are promoted",
                job.spec.tier
            )));
        }
        match job.phase {
            Phase::Queued => {
                self.dequeue(id);
                self.queued_by_tier[Tier::Preemptible.rank() as usize] -= 1;
                let spec = &mut self.jobs.get_mut(&id).expect("checked above").spec;
                spec.tier = Tier::OnDemand;
                spec.submitted_at = spec.submitted_at.max(now);
                self.enqueue(id);
                Ok(Promoted::Queued)
            }
            Phase::Running => {
                let run = job.run.as_ref().expect("a running job has a run");
                let (model, gpus, tenant) = (run.model, run.gpus(), job.spec.tenant);
                let nodes: Vec<NodeId> = run.alloc.iter().map(|(n, _)| *n).collect();
                let m = &self.models[model.0 as usize];
                let cap = m.capacity.saturating_sub(self.reserved_total(model, now));
                if m.on_demand_used + gpus > cap {
                    return Err(StateError::Conflict(format!(
                        "job {id}: no on-demand room outside reservations for {gpus} {} GPUs ({} of {cap} in use)",
                        m.name, m.on_demand_used
                    )));
                }
                self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
                self.adjust_usage(Tier::OnDemand, tenant, model, gpus as i64);
                let spec = &mut self.jobs.get_mut(&id).expect("checked above").spec;
                spec.tier = Tier::OnDemand;
                spec.submitted_at = spec.submitted_at.max(now);
                for node in nodes {
                    self.reindex(node);
                }
                Ok(Promoted::Running)
            }
            Phase::Draining => {
                Err(StateError::Conflict(format!("job {id}: draining; promoted once requeued")))
            }
            Phase::Holding => unreachable!("preemptible jobs never hold GPUs"),
        }
    }

    /// The attempt's processes have all exited; its GPUs are free (or pass
    /// to the preemptor holding them).
    pub fn exited(&mut self, id: JobId, attempt: Attempt, kind: ExitKind) -> Result<ExitEffect, StateError> {
        self.fence(id, attempt)?;
        let job = &self.jobs[&id];
        let draining = job.phase == Phase::Draining;
        let drill = job.notice.is_some_and(|n| n.reason == DrainReason::Drill);
        self.end_run(id);
        let effect = match (draining, kind) {
            (_, ExitKind::Lost) => ExitEffect::RequeuedLost,
            (_, ExitKind::Restart) => ExitEffect::Restarted,
            (_, ExitKind::Completed) => ExitEffect::Finished,
            (_, ExitKind::Cancelled) => ExitEffect::Cancelled,
            (true, ExitKind::Failed { .. }) if drill => {
                self.jobs.get_mut(&id).expect("fenced").drilled = true;
                ExitEffect::Drilled
            }
            (true, ExitKind::Failed { .. }) => {
                let job = self.jobs.get_mut(&id).expect("fenced");
                job.preemptions += 1;
                job.drilled = false;
                match job.spec.max_preemptions {
                    Some(max) if job.preemptions > max => ExitEffect::PreemptionLimitReached,
                    _ => ExitEffect::Requeued { preempted: true },
                }
            }
            (false, ExitKind::Failed { requeue: true }) => ExitEffect::Requeued { preempted: false },
            (false, ExitKind::Failed { requeue: false }) => ExitEffect::Failed,
        };
        if let ExitEffect::Requeued { .. }
        | ExitEffect::RequeuedLost
        | ExitEffect::Restarted
        | ExitEffect::Drilled = effect
        {
            self.requeue(id);
        } else {
            self.jobs.remove(&id);
        }
        Ok(effect)
    }

    /// The attempt reports a completed checkpoint taken at `at`.
    pub fn checkpointed(&mut self, id: JobId, attempt: Attempt, at: Time) -> Result<(), StateError> {
        self.fence(id, attempt)?;
        let job = self.jobs.get_mut(&id).expect("fenced");
        let run = job.run.as_mut().expect("fenced");
        run.last_checkpoint_at = Some(run.last_checkpoint_at.map_or(at, |t| t.max(at)));
        let nodes: Vec<NodeId> = run.alloc.iter().map(|(n, _)| *n).collect();
        if job.spec.tier == Tier::Preemptible && job.phase == Phase::Running {
            for node in nodes {
                self.reindex(node);
            }
        }
        Ok(())
    }

    fn job_checked(&self, id: JobId) -> Result<&Job, StateError> {
        self.jobs.get(&id).ok_or_else(|| StateError::NotFound(format!("job {id}")))
    }

    /// Refuses anything about an attempt that is not the job's live one.
    fn fence(&self, id: JobId, attempt: Attempt) -> Result<(), StateError> {
        let job = self.job_checked(id)?;
        match &job.run {
            Some(run) if run.attempt == attempt => Ok(()),
            _ => Err(StateError::StaleAttempt { job: id, attempt, current: job.attempt }),
        }
    }

    // ---- internal bookkeeping -----------------------------------------

    fn enqueue(&mut self, id: JobId) {
        let job = &self.jobs[&id];
        let class = QueueClass::of(&job.spec);
        self.queues.entry(class).or_default().insert((job.spec.submitted_at, id));
        self.queued_by_tier[job.spec.tier.rank() as usize] += 1;
    }

    /// Removes a queued job from its class (the tier count is left to the
    /// caller: a job that leaves the queue to hold GPUs is still queued).
    fn dequeue(&mut self, id: JobId) {
        let job = &self.jobs[&id];
        let class = QueueClass::of(&job.spec);
        let queue = self.queues.get_mut(&class).expect("queued job has a class");
        let removed = queue.remove(&(job.spec.submitted_at, id));
        debug_assert!(removed);
        if queue.is_empty() {
            self.queues.remove(&class);
        }
    }

    fn requeue(&mut self, id: JobId) {
        let job = self.jobs.get_mut(&id).expect("requeue of a known job");
        job.phase = Phase::Queued;
        job.run = None;
        job.notice = None;
        self.enqueue(id);
    }

    /// Frees the GPUs of a running or draining job and updates counters.
    fn end_run(&mut self, id: JobId) {
        let job = self.jobs.get_mut(&id).expect("end_run of a known job");
        let run = job.run.take().expect("end_run of a running job");
        if let [(node, _)] = run.alloc[..] {
            job.last_node = Some(node);
        }
        let was_draining = job.phase == Phase::Draining;
        job.notice = None;
        let (tier, tenant) = (job.spec.tier, job.spec.tenant);
        let gpus = run.gpus();
        if !was_draining {
            self.adjust_usage(tier, tenant, run.model, -(gpus as i64));
        }
        for &(node, mask) in &run.alloc {
            let n = &mut self.nodes[node.0 as usize];
            debug_assert_eq!(n.used & mask, mask, "freeing GPUs that were not used");
            n.used &= !mask;
            n.jobs.retain(|(j, _)| *j != id);
            self.reindex(node);
        }
        if let Some(preemptor) = self.victim_of.remove(&id) {
            if let Some(hold) = self.holds.get_mut(&preemptor) {
                hold.waiting_on.remove(&id);
                if hold.waiting_on.is_empty() {
                    self.ready_holds.insert(preemptor);
                }
            }
        }
    }

    /// Moves the tier counters by `delta` GPUs (negative to release).
    /// Draining preemptible jobs are no longer counted, so their callers
    /// release them when the drain starts, not when they exit.
    fn adjust_usage(&mut self, tier: Tier, tenant: TenantId, model: GpuModelId, delta: i64) {
        let apply = |v: &mut u32| *v = (*v as i64 + delta) as u32;
        let m = &mut self.models[model.0 as usize];
        match tier {
            Tier::Reserved => {
                apply(&mut m.reserved_used);
                apply(self.reserved_used.entry((tenant, model)).or_insert(0));
            }
            Tier::OnDemand => apply(&mut m.on_demand_used),
            Tier::Preemptible => apply(&mut m.preemptible_active),
        }
    }

    /// Releases every hold with GPUs on `node`; the holders queue again.
    fn release_holds_on(&mut self, node: NodeId) {
        let holders: Vec<JobId> =
            self.holds.values().filter(|h| h.alloc.iter().any(|(n, _)| *n == node)).map(|h| h.job).collect();
        for job in holders {
            self.drop_hold(job);
            self.requeue_holder(job);
        }
    }

    /// A job whose hold was released waits in its queue class again.
    fn requeue_holder(&mut self, job: JobId) {
        let j = self.jobs.get_mut(&job).expect("holder exists");
        j.phase = Phase::Queued;
        let class = QueueClass::of(&j.spec);
        let key = (j.spec.submitted_at, job);
        self.queues.entry(class).or_default().insert(key);
    }

    /// Forgets a hold: its GPUs become free again as their victims leave.
    fn drop_hold(&mut self, job: JobId) {
        let hold = self.holds.remove(&job).expect("holding job has a hold");
        self.ready_holds.remove(&job);
        let spec = &self.jobs[&job].spec;
        let (tier, tenant, gpus) = (spec.tier, spec.tenant, spec.gpus);
        self.adjust_usage(tier, tenant, hold.model, -(gpus as i64));
        for victim in &hold.waiting_on {
            self.victim_of.remove(victim);
        }
        for &(node, mask) in &hold.alloc {
            self.nodes[node.0 as usize].held &= !mask;
            self.reindex(node);
        }
    }

    /// Recomputes a node's place in its model's indices.
    pub(crate) fn reindex(&mut self, id: NodeId) {
        let node = &self.nodes[id.0 as usize];
        let up = node.status == NodeStatus::Up;
        let new_key = up.then(|| self.index_key(node));
        let new_singles = if up { self.single_keys(node) } else { Vec::new() };
        let index = &mut self.index[node.model.0 as usize];
        if node.key != new_key {
            if let Some(old) = &node.key {
                index.remove(id, old);
            }
            if let Some(new) = &new_key {
                index.insert(id, new);
            }
        }
        if node.single_keys != new_singles {
            for &old in &node.single_keys {
                index.remove_single(old);
            }
            for &new in &new_singles {
                index.insert_single(new);
            }
        }
        let node = &mut self.nodes[id.0 as usize];
        node.key = new_key;
        node.single_keys = new_singles;
    }

    fn single_keys(&self, node: &Node) -> Vec<SingleKey> {
        let free = node.free_mask().count_ones() as u8;
        let mut keys: Vec<SingleKey> = node
            .jobs
            .iter()
            .filter_map(|&(job, mask)| {
                let j = &self.jobs[&job];
                let run = j.run.as_ref()?;
                let single =
                    j.spec.tier == Tier::Preemptible && j.phase == Phase::Running && run.alloc.len() == 1;
                single.then(|| {
                    (free, mask.count_ones() as u8, (Reverse(run.progress_saved_at()), node.id, job))
                })
            })
            .collect();
        keys.sort_unstable();
        keys
    }

    fn index_key(&self, node: &Node) -> IndexKey {
        let mut slots: Vec<u64> = Vec::new();
        for &(job, mask) in &node.jobs {
            let j = &self.jobs[&job];
            if j.spec.tier == Tier::Preemptible && j.phase == Phase::Running {
                let saved_at = j.run.as_ref().expect("running").progress_saved_at();
                slots.extend(std::iter::repeat_n(saved_at.0, (mask & !node.held).count_ones() as usize));
            }
        }
        slots.sort_unstable_by(|a, b| b.cmp(a));
        let mut sum = 0;
        let top_sums = slots
            .iter()
            .map(|t| {
                sum += t;
                sum
            })
            .collect();
        IndexKey { free: node.free_mask().count_ones() as u8, reclaimable: slots.len() as u8, top_sums }
    }

    // ---- applying a plan ----------------------------------------------

    /// Checks `plan` against the live state, then commits all of it, or
    /// nothing if any part is no longer valid.
    pub fn apply(&mut self, plan: &Plan) -> Result<(), ApplyError> {
        self.check_plan(plan)?;
        let now = plan.now;
        for &node in &plan.lost_nodes {
            let _ = self.lose_node(node);
        }
        for drain in &plan.drains {
            let job = self.jobs.get_mut(&drain.job).expect("checked");
            job.phase = Phase::Draining;
            job.notice =
                Some(Notice { notice_at: drain.notice_at, deadline: drain.deadline, reason: drain.reason });
            let run = job.run.as_ref().expect("checked");
            let (model, gpus, tenant) = (run.model, run.gpus(), job.spec.tenant);
            let nodes: Vec<NodeId> = run.alloc.iter().map(|(n, _)| *n).collect();
            self.adjust_usage(Tier::Preemptible, tenant, model, -(gpus as i64));
            for node in nodes {
                self.reindex(node);
            }
            if let DrainReason::NodeDrain { node } = drain.reason {
                self.pending_node_drains.remove(&node);
            }
        }
        // A drained node is done once none of its preemptible jobs runs on
        // without a notice (one with no such jobs is done at once).
        let pending = std::mem::take(&mut self.pending_node_drains);
        self.pending_node_drains = pending
            .into_iter()
            .filter(|&n| {
                self.nodes[n.0 as usize].jobs().any(|j| {
                    let job = &self.jobs[&j];
                    job.spec.tier == Tier::Preemptible && job.phase == Phase::Running
                })
            })
            .collect();
        for p in &plan.preemptions {
            self.dequeue(p.preemptor);
            let job = self.jobs.get_mut(&p.preemptor).expect("checked");
            job.phase = Phase::Holding;
            let (tier, tenant, gpus) = (job.spec.tier, job.spec.tenant, job.spec.gpus);
            // Held GPUs count against the tier's caps from now on.
            self.adjust_usage(tier, tenant, p.model, gpus as i64);
            for &(node, mask) in &p.hold {
                self.nodes[node.0 as usize].held |= mask;
                self.reindex(node);
            }
            for &victim in &p.victims {
                self.victim_of.insert(victim, p.preemptor);
            }
            let waiting_on: BTreeSet<JobId> = p.victims.iter().copied().collect();
            if waiting_on.is_empty() {
                self.ready_holds.insert(p.preemptor);
            }
            self.holds.insert(
                p.preemptor,
                Hold { job: p.preemptor, model: p.model, alloc: p.hold.clone(), waiting_on },
            );
        }
        for p in &plan.placements {
            if p.from_hold {
                let hold = self.holds.remove(&p.job).expect("checked");
                self.ready_holds.remove(&p.job);
                for &(node, mask) in &hold.alloc {
                    self.nodes[node.0 as usize].held &= !mask;
                }
            } else {
                self.dequeue(p.job);
            }
            let job = self.jobs.get_mut(&p.job).expect("checked");
            job.phase = Phase::Running;
            job.attempt = p.attempt;
            job.run = Some(Run {
                attempt: p.attempt,
                model: p.model,
                alloc: p.alloc.clone(),
                started_at: now,
                last_checkpoint_at: None,
            });
            let (tier, tenant, gpus) = (job.spec.tier, job.spec.tenant, job.spec.gpus);
            self.queued_by_tier[tier.rank() as usize] -= 1;
            if !p.from_hold {
                self.adjust_usage(tier, tenant, p.model, gpus as i64);
            }
            for &(node, mask) in &p.alloc {
                let n = &mut self.nodes[node.0 as usize];
                n.used |= mask;
                n.jobs.push((p.job, mask));
                self.reindex(node);
            }
        }
        debug_assert!(self.sanity_check().is_ok(), "{:?}", self.sanity_check());
        Ok(())
    }

    fn check_plan(&self, plan: &Plan) -> Result<(), ApplyError> {
        let lost: BTreeSet<NodeId> = plan.lost_nodes.iter().copied().collect();
        for &node in &lost {
            match self.node(node) {
                Some(n) if n.status != NodeStatus::Lost => {}
                _ => return Err(ApplyError::Stale(format!("node {node} cannot be lost"))),
            }
        }
        for r in &plan.requeues {
            let RequeueReason::NodeLost(node) = r.reason;
            let job = self.live_run(r.job, r.attempt)?;
            if !lost.contains(&node) || !job.run.as_ref().unwrap().alloc.iter().any(|(n, _)| *n == node) {
                return Err(ApplyError::Stale(format!("requeue of {} not on a lost node", r.job)));
            }
        }
        let mut drained = BTreeSet::new();
        for d in &plan.drains {
            let job = self.live_run(d.job, d.attempt)?;
            if job.spec.tier != Tier::Preemptible {
                return Err(ApplyError::Invariant(format!(
                    "drain of {} which is {}, not preemptible",
                    d.job, job.spec.tier
                )));
            }
            if job.phase != Phase::Running || !drained.insert(d.job) {
                return Err(ApplyError::Stale(format!("{} is already draining", d.job)));
            }
            if job.run.as_ref().expect("fenced").alloc.iter().any(|(n, _)| lost.contains(n)) {
                return Err(ApplyError::Invariant(format!("drain of {} on a node this plan loses", d.job)));
            }
            if d.deadline < d.notice_at {
                return Err(ApplyError::Invariant(format!("drain of {}: deadline before notice", d.job)));
            }
        }
        // GPUs each node gives away in this plan; any overlap is a double booking.
        let mut claimed: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut claim = |node: NodeId, mask: u64, what: JobId| -> Result<(), ApplyError> {
            let c = claimed.entry(node).or_insert(0);
            if *c & mask != 0 {
                return Err(ApplyError::Invariant(format!("GPUs on {node} given twice (to {what})")));
            }
            *c |= mask;
            Ok(())
        };
        let mut caps = CapCheck::default();
        for d in &plan.drains {
            // Drained GPUs no longer count against the reclaim limit.
            let run = self.jobs[&d.job].run.as_ref().expect("checked");
            *caps.preemptible.entry(run.model).or_insert(0) -= run.gpus() as i64;
        }
        for p in &plan.preemptions {
            let job = self.job_checked(p.preemptor).map_err(|e| ApplyError::Stale(e.to_string()))?;
            if job.phase != Phase::Queued || job.spec.tier == Tier::Preemptible {
                return Err(ApplyError::Invariant(format!("{} cannot preempt", p.preemptor)));
            }
            for victim in &p.victims {
                let ok = plan
                    .drains
                    .iter()
                    .any(|d| d.job == *victim && d.reason == DrainReason::Preempted { by: p.preemptor });
                if !ok {
                    return Err(ApplyError::Invariant(format!("victim {victim} without its drain")));
                }
            }
            let victim_mask = |node: NodeId| -> u64 {
                p.victims
                    .iter()
                    .flat_map(|v| self.jobs[v].run.as_ref().unwrap().alloc.iter())
                    .filter(|(n, _)| *n == node)
                    .fold(0, |acc, (_, m)| acc | m)
            };
            let mut total = 0;
            for &(node, mask) in &p.hold {
                let n = self.usable_node(node, p.model, &lost)?;
                if n.held & mask != 0 {
                    return Err(ApplyError::Invariant(format!("hold on {node} overlaps another hold")));
                }
                if mask & !n.full_mask() != 0 || mask & n.used & !victim_mask(node) != 0 {
                    return Err(ApplyError::Invariant(format!("hold on {node} takes GPUs of a non-victim")));
                }
                claim(node, mask, p.preemptor)?;
                total += mask.count_ones();
            }
            if total != job.spec.gpus {
                return Err(ApplyError::Invariant(format!("hold for {} has {total} GPUs", p.preemptor)));
            }
            caps.check(self, &job.spec, p.model, plan.now)?;
        }
        for p in &plan.placements {
            let job = self.job_checked(p.job).map_err(|e| ApplyError::Stale(e.to_string()))?;
            if p.attempt.0 != job.attempt.0 + 1 {
                return Err(ApplyError::Stale(format!("{}: attempt {} is not next", p.job, p.attempt)));
            }
            match (job.phase, p.from_hold) {
                (Phase::Queued, false) => {}
                (Phase::Holding, true) => {
                    let hold = &self.holds[&p.job];
                    if !self.ready_holds.contains(&p.job) || hold.alloc != p.alloc {
                        return Err(ApplyError::Stale(format!("{}: hold not ready", p.job)));
                    }
                }
                _ => return Err(ApplyError::Stale(format!("{} is not waiting to start", p.job))),
            }
            if job.spec.gpu_model.is_some_and(|m| m != p.model) {
                return Err(ApplyError::Invariant(format!("{} placed on the wrong gpu model", p.job)));
            }
            let per_node = self.models[p.model.0 as usize].gpus_per_node;
            let mut total = 0;
            for &(node, mask) in &p.alloc {
                let n = self.usable_node(node, p.model, &lost)?;
                let own_hold = if p.from_hold { mask } else { 0 };
                if mask & !n.full_mask() != 0 || n.used & mask != 0 || n.held & mask & !own_hold != 0 {
                    return Err(ApplyError::Invariant(format!("{}: GPUs on {node} are not free", p.job)));
                }
                if !p.from_hold {
                    claim(node, mask, p.job)?;
                }
                total += mask.count_ones();
            }
            let whole_nodes = p.alloc.iter().all(|(_, m)| m.count_ones() == per_node as u32);
            if total != job.spec.gpus || (p.alloc.len() > 1 && !whole_nodes) || p.alloc.is_empty() {
                return Err(ApplyError::Invariant(format!("{}: placement has the wrong shape", p.job)));
            }
            if !p.from_hold {
                caps.check(self, &job.spec, p.model, plan.now)?;
            }
        }
        Ok(())
    }

    fn live_run(&self, id: JobId, attempt: Attempt) -> Result<&Job, ApplyError> {
        self.fence(id, attempt).map_err(|e| ApplyError::Stale(e.to_string()))?;
        Ok(&self.jobs[&id])
    }

    fn usable_node(
        &self,
        node: NodeId,
        model: GpuModelId,
        lost: &BTreeSet<NodeId>,
    ) -> Result<&Node, ApplyError> {
        match self.node(node) {
            Some(n) if n.status == NodeStatus::Up && n.model == model && !lost.contains(&node) => Ok(n),
            _ => Err(ApplyError::Stale(format!("node {node} cannot take work"))),
        }
    }

    // ---- invariants ----------------------------------------------------

    /// Recomputes everything the indices and counters cache and checks the
    /// invariants. O(cluster); tests call it after every step.
    pub fn sanity_check(&self) -> Result<(), String> {
        let mut used = vec![0u64; self.nodes.len()];
        let mut held = vec![0u64; self.nodes.len()];
        let mut on_node: Vec<Vec<(JobId, u64)>> = vec![Vec::new(); self.nodes.len()];
        let mut model_use = vec![(0u32, 0u32, 0u32); self.models.len()];
        let mut reserved_use: BTreeMap<(TenantId, GpuModelId), u32> = BTreeMap::new();
        let mut queued = [0u32; 3];
        for (id, job) in &self.jobs {
            if job.spec.id != *id {
                return Err(format!("{id} stored under the wrong id"));
            }
            match job.phase {
                Phase::Queued | Phase::Holding => {
                    queued[job.spec.tier.rank() as usize] += 1;
                    if job.run.is_some() || job.notice.is_some() {
                        return Err(format!("queued {id} has a run"));
                    }
                    let in_queue = self
                        .queues
                        .get(&QueueClass::of(&job.spec))
                        .is_some_and(|q| q.contains(&(job.spec.submitted_at, *id)));
                    if in_queue != (job.phase == Phase::Queued) {
                        return Err(format!("{id} ({:?}) queue membership wrong", job.phase));
                    }
                    if self.holds.contains_key(id) != (job.phase == Phase::Holding) {
                        return Err(format!("{id} ({:?}) hold membership wrong", job.phase));
                    }
                }
                Phase::Running | Phase::Draining => {
                    let run = job.run.as_ref().ok_or_else(|| format!("running {id} has no run"))?;
                    if run.attempt != job.attempt {
                        return Err(format!("{id} runs attempt {} but is at {}", run.attempt, job.attempt));
                    }
                    if (job.phase == Phase::Draining) != job.notice.is_some() {
                        return Err(format!("{id} notice does not match its phase"));
                    }
                    if job.phase == Phase::Draining && job.spec.tier != Tier::Preemptible {
                        return Err(format!("{id} is {} and draining", job.spec.tier));
                    }
                    if run.gpus() != job.spec.gpus {
                        return Err(format!("{id} holds {} GPUs, wants {}", run.gpus(), job.spec.gpus));
                    }
                    for &(node, mask) in &run.alloc {
                        let n = node.0 as usize;
                        if used[n] & mask != 0 {
                            return Err(format!("GPU on {node} held by two attempts ({id})"));
                        }
                        used[n] |= mask;
                        on_node[n].push((*id, mask));
                        if self.nodes[n].model != run.model {
                            return Err(format!("{id} runs on a node of another model"));
                        }
                    }
                    let u = &mut model_use[run.model.0 as usize];
                    match job.spec.tier {
                        Tier::Reserved => {
                            u.0 += run.gpus();
                            *reserved_use.entry((job.spec.tenant, run.model)).or_insert(0) += run.gpus();
                        }
                        Tier::OnDemand => u.1 += run.gpus(),
                        Tier::Preemptible if job.phase == Phase::Running => u.2 += run.gpus(),
                        Tier::Preemptible => {}
                    }
                }
            }
        }
        if queued != self.queued_by_tier {
            return Err(format!("queued counts {:?} != {:?}", self.queued_by_tier, queued));
        }
        let queue_len: usize = self.queues.values().map(BTreeSet::len).sum();
        let queued_phase = self.jobs.values().filter(|j| j.phase == Phase::Queued).count();
        if queue_len != queued_phase || self.queues.values().any(BTreeSet::is_empty) {
            return Err("queues hold jobs that are not queued".into());
        }
        for (id, hold) in &self.holds {
            let job = &self.jobs[id];
            let total: u32 = hold.alloc.iter().map(|(_, m)| m.count_ones()).sum();
            if total != job.spec.gpus {
                return Err(format!("hold for {id} has {total} GPUs"));
            }
            for &(node, mask) in &hold.alloc {
                let n = node.0 as usize;
                if held[n] & mask != 0 {
                    return Err(format!("GPU on {node} held for two jobs"));
                }
                held[n] |= mask;
                for &(other, omask) in &on_node[n] {
                    if omask & mask != 0 && !hold.waiting_on.contains(&other) {
                        return Err(format!("held GPU on {node} given to {other}, not {id}"));
                    }
                }
            }
            for victim in &hold.waiting_on {
                let v = self.jobs.get(victim).ok_or_else(|| format!("{id} waits on gone {victim}"))?;
                if v.phase != Phase::Draining || self.victim_of.get(victim) != Some(id) {
                    return Err(format!("{id} waits on {victim} which is not draining for it"));
                }
            }
            if hold.waiting_on.is_empty() != self.ready_holds.contains(id) {
                return Err(format!("hold for {id}: readiness out of step"));
            }
            let u = &mut model_use[hold.model.0 as usize];
            match job.spec.tier {
                Tier::Reserved => {
                    u.0 += job.spec.gpus;
                    *reserved_use.entry((job.spec.tenant, hold.model)).or_insert(0) += job.spec.gpus;
                }
                Tier::OnDemand => u.1 += job.spec.gpus,
                Tier::Preemptible => return Err(format!("preemptible {id} holds GPUs")),
            }
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if node.used != used[i] || node.held != held[i] {
                return Err(format!("{} masks out of step", node.id));
            }
            let mut jobs = node.jobs.clone();
            jobs.sort();
            let mut expect = on_node[i].clone();
            expect.sort();
            if jobs != expect {
                return Err(format!("{} job list out of step", node.id));
            }
            let key = (node.status == NodeStatus::Up).then(|| self.index_key(node));
            if node.key != key {
                return Err(format!("{} index key out of step", node.id));
            }
            let singles = if key.is_some() { self.single_keys(node) } else { Vec::new() };
            if node.single_keys != singles {
                return Err(format!("{} single-victim keys out of step", node.id));
            }
            for (free, gpus, entry) in &singles {
                if !self.index[node.model.0 as usize].singles[*free as usize][*gpus as usize].contains(entry)
                {
                    return Err(format!("{} missing from the single-victim index", entry.2));
                }
            }
            if let Some(key) = &key {
                let index = &self.index[node.model.0 as usize];
                if !index.by_free[key.free as usize].contains(&node.id) {
                    return Err(format!("{} missing from the free index", node.id));
                }
            }
            if node.status == NodeStatus::Lost && (node.used != 0 || node.held != 0) {
                return Err(format!("lost {} still has work", node.id));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            let (r, od, pre) = model_use[i];
            if (m.reserved_used, m.on_demand_used, m.preemptible_active) != (r, od, pre) {
                return Err(format!("{} tier counters out of step", m.name));
            }
            let capacity: u32 = self
                .nodes
                .iter()
                .filter(|n| n.model.0 as usize == i && n.status == NodeStatus::Up)
                .map(|n| n.gpus as u32)
                .sum();
            if capacity != m.capacity {
                return Err(format!("{} capacity out of step", m.name));
            }
            let indexed = self.index[i].len();
            let up =
                self.nodes.iter().filter(|n| n.model.0 as usize == i && n.status == NodeStatus::Up).count();
            if indexed != up {
                return Err(format!("{} index has {indexed} nodes, {up} are up", m.name));
            }
            let singles: usize =
                self.nodes.iter().filter(|n| n.model.0 as usize == i).map(|n| n.single_keys.len()).sum();
            if self.index[i].singles_len() != singles {
                return Err(format!("{} single-victim index has stale entries", m.name));
            }
        }
        let reserved_use_nonzero: BTreeMap<_, _> =
            self.reserved_used.iter().filter(|(_, v)| **v > 0).map(|(k, v)| (*k, *v)).collect();
        if reserved_use_nonzero != reserved_use {
            return Err("reserved usage out of step".into());
        }
        Ok(())
    }
}

/// Whether `gpus` can be placed on nodes of `per_node` GPUs: on one node,
/// or as a gang over whole nodes.
pub fn shape_fits(gpus: u32, per_node: u8) -> bool {
    gpus <= per_node as u32 || gpus.is_multiple_of(per_node as u32)
}

/// The tier caps, checked over a whole plan: what it starts or holds adds
/// up before it is compared with the limits.
#[derive(Default)]
struct CapCheck {
    on_demand: BTreeMap<GpuModelId, u32>,
    reserved: BTreeMap<(TenantId, GpuModelId), u32>,
    preemptible: BTreeMap<GpuModelId, i64>,
}

impl CapCheck {
    fn check(
        &mut self,
        state: &State,
        spec: &JobSpec,
        model: GpuModelId,
        now: Time,
    ) -> Result<(), ApplyError> {
        let m = &state.models[model.0 as usize];
        let gpus = spec.gpus;
        match spec.tier {
            Tier::OnDemand => {
                let d = self.on_demand.entry(model).or_insert(0);
                *d += gpus;
                let cap = m.capacity.saturating_sub(state.reserved_total(model, now));
                if m.on_demand_used + *d > cap {
                    return Err(ApplyError::Invariant(format!(
                        "{}: on-demand would use GPUs reserved for others",
                        spec.id
                    )));
                }
            }
            Tier::Reserved => {
                let key = (spec.tenant, model);
                let d = self.reserved.entry(key).or_insert(0);
                *d += gpus;
                if state.reserved_used(key.0, key.1) + *d > state.reserved_capacity(key.0, key.1, now) {
                    return Err(ApplyError::Invariant(format!(
                        "{}: reserved usage would exceed the reservation",
                        spec.id
                    )));
                }
            }
            Tier::Preemptible => {
                let d = self.preemptible.entry(model).or_insert(0);
                *d += gpus as i64;
                if m.preemptible_limit.is_some_and(|limit| m.preemptible_active as i64 + *d > limit as i64) {
                    return Err(ApplyError::Invariant(format!(
                        "{}: preemptible usage would exceed the reclaim limit",
                        spec.id
                    )));
                }
            }
        }
        Ok(())
    }
}
