//! The scheduling core's state and the events that change it.
//!
//! The edge (server or simulator) reports what happened — a submission, an
//! exit, a checkpoint, a node joining or being drained — through the methods
//! here, asks [`crate::schedule`] for a plan, and commits it with
//! [`State::apply`]. Every method is deterministic and does no I/O.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, ReservationId, TenantId, Tier, Time};

use rustc_hash::FxHashMap;

use crate::error::StateError;
use crate::index::{IndexKey, ModelIndex, SingleKey};
use crate::model::*;

mod apply;
mod check;
mod fair;
mod jobs;
mod quota;

pub(crate) use fair::{queue_place, ShareKey, TenantQueue};
pub use fair::{TenantShare, DEFAULT_WEIGHT};
pub use quota::Quota;

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
    /// Its on-demand rate, µ$ per GPU-hour: what an hour of it weighs in a
    /// tenant's usage ([`State::set_model_rate`]; until set, every model
    /// weighs the same, one dollar an hour).
    pub rate: u64,
}

/// A model's rate until the edge sets one.
pub const DEFAULT_MODEL_RATE: u64 = 1_000_000;

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
    /// GPUs out of service (a health fault): never free, never placed on.
    pub(crate) out: u64,
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

    pub fn out_mask(&self) -> u64 {
        self.out
    }

    pub fn free_mask(&self) -> u64 {
        self.full_mask() & !self.used & !self.held & !self.out
    }

    /// GPUs that count toward the model's capacity while the node is up.
    pub fn in_service(&self) -> u32 {
        (self.full_mask() & !self.out).count_ones()
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
    /// Parts of elastic jobs whose leaving it waits for.
    pub waiting_parts: BTreeSet<(JobId, NodeId)>,
    /// The attempt the job's start from this hold has been promised to its
    /// node ahead of the placement ([`State::stage`]): its placement from
    /// the hold is that attempt, and if the hold goes without one the
    /// number is never used again.
    pub staged: Option<Attempt>,
}

/// Jobs that are interchangeable for the queue walk: if the first of a
/// class cannot start, none of the others can in the same pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueClass {
    pub tier: Tier,
    pub model: Option<GpuModelId>,
    pub gpus: u32,
    /// Reserved jobs draw on their own tenant's reservation.
    pub tenant: Option<TenantId>,
}

/// A queued job's place within its tenant's jobs of one class: the
/// tenant's priority (higher first), then submission time, then id.
pub(crate) type QueueKey = (Reverse<i32>, Time, JobId);

pub(crate) fn queue_key(spec: &JobSpec) -> QueueKey {
    (Reverse(spec.priority), spec.submitted_at, spec.id)
}

impl QueueClass {
    pub(crate) fn of(spec: &JobSpec) -> QueueClass {
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
    /// Queued jobs per class, every tenant's together, and how many
    /// classes each tier has.
    pub(crate) class_jobs: FxHashMap<QueueClass, u32>,
    pub(crate) classes_in_tier: [usize; 3],
    /// Per tier and tenant with queued work: its key and its queued jobs
    /// by class, in its own order (one entry holds all of a tenant's queue
    /// in a tier, so a pass that visits it finds its classes in one place).
    pub(crate) tenant_queues: FxHashMap<(Tier, TenantId), TenantQueue>,
    /// Per tier, its tenants with queued work, lowest key first.
    pub(crate) order: [BTreeSet<(ShareKey, TenantId)>; 3],
    /// Usage, weights and the instant keys are taken at.
    pub(crate) fair: fair::Fair,
    /// The tenants that run preemptible work, by key (the highest is the
    /// one furthest above its share), kept only while fair-share
    /// preemption, their one reader, is on
    /// ([`State::set_fair_share_preemption`]).
    pub(crate) keep_running: bool,
    pub(crate) running_order: BTreeSet<(ShareKey, TenantId)>,
    pub(crate) running_keys: FxHashMap<TenantId, ShareKey>,
    /// Jobs draining for fair-share preemption: while any is, no more are
    /// chosen (one reclaim at a time).
    pub(crate) fair_share_draining: u32,
    /// Quotas and their use.
    pub(crate) quotas: quota::Quotas,
    /// Jobs draining to give GPUs back to a tenant under its quota: while
    /// any is, no more are chosen.
    pub(crate) quota_draining: u32,
    pub(crate) holds: BTreeMap<JobId, Hold>,
    /// Holds whose victims have all left: the job starts next pass.
    pub(crate) ready_holds: BTreeSet<JobId>,
    /// Victim -> the preemptor waiting for it.
    victim_of: BTreeMap<JobId, JobId>,
    /// A leaving part of an elastic job -> the preemptor waiting for it.
    part_victim_of: BTreeMap<(JobId, NodeId), JobId>,
    /// Running elastic jobs below their most GPUs, none of their nodes
    /// leaving: those a pass may grow.
    pub(crate) growable: BTreeSet<JobId>,
    pub(crate) reservations: BTreeMap<ReservationId, Reservation>,
    reserved_used: BTreeMap<(TenantId, GpuModelId), u32>,
    pub(crate) index: Vec<ModelIndex>,
    pub(crate) heartbeats: BTreeSet<(Time, NodeId)>,
    /// Cordoned nodes whose preemptible jobs still need their notice.
    pub(crate) pending_node_drains: BTreeSet<NodeId>,
    /// The nodes kept for the job each tier's order is reserved for, as
    /// the last pass left them: the next pass looks at that job's tenant
    /// first and keeps the same nodes for it again.
    pub(crate) earmarks: BTreeMap<NodeId, JobId>,
    queued_by_tier: [u32; 3],
    /// Buffers `reindex` reads a node's keys into.
    reindex_scratch: KeyScratch,
    /// Applies since a debug build last checked the whole state
    /// (`apply`): after each while it holds up to fifty jobs, then once
    /// every fiftieth of its job count, so a check costs about fifty
    /// jobs' worth per apply however long the queue. (At a thousand,
    /// a debug build's replay of a real trace spent six sevenths of its
    /// time checking.)
    pub(crate) unchecked: u64,
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
    /// An elastic job's nodes that joined after its start, with when.
    pub joined: Vec<(NodeId, Time)>,
    /// An elastic job's nodes with a shrink's notice, still running.
    pub leaving: Vec<(NodeId, Notice)>,
    /// When its nodes last changed; its start if `None`.
    pub resized_at: Option<Time>,
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
        let q = self.tenant_queues.get(&(j.spec.tier, j.spec.tenant))?;
        q.classes.get(&QueueClass::of(&j.spec))?.first().map(|&(_, _, id)| id)
    }

    /// Every queue class of every tenant that has jobs: its tier, its
    /// first job and how many wait in it (the first included).
    /// O(classes × tenants).
    pub fn queue_heads(&self) -> impl Iterator<Item = (Tier, JobId, usize)> + '_ {
        self.tenant_queues
            .values()
            .flat_map(|q| &q.classes)
            .filter_map(|(class, queue)| Some((class.tier, queue.first()?.2, queue.len())))
    }

    pub fn hold(&self, job: JobId) -> Option<&Hold> {
        self.holds.get(&job)
    }

    /// The nodes kept for the jobs the tiers' orders are reserved for, by
    /// node.
    pub fn earmarks(&self) -> impl Iterator<Item = (NodeId, JobId)> + '_ {
        self.earmarks.iter().map(|(&n, &j)| (n, j))
    }

    /// Keeps what `plan` says about earmarks, for the next pass: what
    /// [`State::apply`] does, for a plan that is otherwise empty.
    pub fn keep_earmarks(&mut self, plan: &crate::Plan) {
        if let Some(earmarks) = &plan.earmarks {
            self.earmarks = earmarks.iter().copied().collect();
        }
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
                    rate: DEFAULT_MODEL_RATE,
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
            let in_service = node.in_service();
            self.set_heartbeat(id, now);
            self.models[model.0 as usize].capacity += in_service;
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
            out: 0,
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
        let (model, gpus) = (n.model, n.in_service());
        if counted {
            self.models[model.0 as usize].capacity -= gpus;
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
        let (model, gpus) = (n.model, n.in_service());
        self.models[model.0 as usize].capacity += gpus;
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
        let (model, gpus) = (n.model, n.in_service());
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
    /// not preempted) and holds on it are released. An elastic job's part
    /// that was leaving there is simply gone, and the job goes on.
    pub fn lose_node(&mut self, node: NodeId) -> Result<Vec<JobId>, StateError> {
        let n = self.node_checked(node)?;
        match n.status {
            NodeStatus::Lost => return Ok(Vec::new()),
            NodeStatus::Up => {
                let (model, gpus) = (n.model, n.in_service());
                self.models[model.0 as usize].capacity -= gpus;
            }
            NodeStatus::Cordoned | NodeStatus::Unhealthy => {}
        }
        let n = &mut self.nodes[node.0 as usize];
        n.status = NodeStatus::Lost;
        self.heartbeats.remove(&(n.last_heartbeat, node));
        self.pending_node_drains.remove(&node);
        self.reindex(node);
        self.release_holds_on(node);
        let (leaving, victims): (Vec<JobId>, Vec<JobId>) =
            self.nodes[node.0 as usize].jobs().partition(|&job| self.leaving_on(job, node));
        for job in leaving {
            self.drop_part(job, node);
        }
        for &job in &victims {
            self.end_run(job);
            self.requeue(job);
        }
        Ok(victims)
    }

    /// GPUs of `mask` on `node` are out of service (a health fault): the
    /// attempts running on any of them are ended and requeued, as a lost
    /// node's are, holds on the node that wanted them are released, and
    /// they take no work until `return_gpus`. Returns the requeued jobs,
    /// and whether holds on the node were released.
    pub fn take_gpus_out(&mut self, node: NodeId, mask: u64) -> Result<(Vec<JobId>, bool), StateError> {
        let n = self.node_checked(node)?;
        if mask & !n.full_mask() != 0 {
            return Err(StateError::Invalid(format!("node {node}: has {} GPUs, mask {mask:#x}", n.gpus)));
        }
        let newly = mask & !n.out;
        if newly == 0 {
            return Ok((Vec::new(), false));
        }
        let hit: Vec<JobId> = n.jobs.iter().filter(|(_, m)| m & newly != 0).map(|(j, _)| *j).collect();
        let holds_touched = n.held & newly != 0;
        let (model, counted) = (n.model, n.status == NodeStatus::Up);
        // A part leaving there is simply gone; every other attempt ends.
        let (leaving, victims): (Vec<JobId>, Vec<JobId>) =
            hit.into_iter().partition(|&j| self.leaving_on(j, node));
        for job in leaving {
            self.drop_part(job, node);
        }
        for &job in &victims {
            self.end_run(job);
            self.requeue(job);
        }
        if holds_touched {
            self.release_holds_on(node);
        }
        self.nodes[node.0 as usize].out |= newly;
        if counted {
            self.models[model.0 as usize].capacity -= newly.count_ones();
        }
        self.reindex(node);
        Ok((victims, holds_touched))
    }

    /// GPUs of `mask` on `node` are back in service.
    pub fn return_gpus(&mut self, node: NodeId, mask: u64) -> Result<(), StateError> {
        let n = self.node_checked(node)?;
        let back = mask & n.out;
        let (model, counted) = (n.model, n.status == NodeStatus::Up);
        self.nodes[node.0 as usize].out &= !back;
        if counted {
            self.models[model.0 as usize].capacity += back.count_ones();
        }
        self.reindex(node);
        Ok(())
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

    /// Recomputes a node's place in its model's indices. Only the entries
    /// that changed move (a checkpoint moves one job's; a start or an end
    /// on the node, which changes its free GPUs, moves them all), and the
    /// keys are read into buffers kept for it, so a node's reindex
    /// allocates nothing.
    pub(crate) fn reindex(&mut self, id: NodeId) {
        let mut scratch = std::mem::take(&mut self.reindex_scratch);
        let node = &self.nodes[id.0 as usize];
        let up = node.status == NodeStatus::Up;
        let free = match up {
            true => Some(self.read_keys(node, &mut scratch)),
            false => {
                scratch.clear();
                None
            }
        };
        let index = &mut self.index[node.model.0 as usize];
        let node = &mut self.nodes[id.0 as usize];
        match (&mut node.key, free) {
            (Some(old), Some(free))
                if (old.free, old.reclaimable as usize) == (free, scratch.slots.len()) =>
            {
                index.move_sums(id, old, &scratch.slots);
            }
            (key, free) => {
                let mut sums = Vec::new();
                if let Some(old) = key.take() {
                    index.remove(id, &old);
                    sums = old.top_sums;
                    sums.clear();
                }
                if let Some(free) = free {
                    sums.extend(top_sums(&scratch.slots));
                    let new = IndexKey { free, reclaimable: scratch.slots.len() as u8, top_sums: sums };
                    index.insert(id, &new);
                    *key = Some(new);
                }
            }
        }
        if node.single_keys != scratch.singles {
            index.move_singles(&node.single_keys, &scratch.singles);
            std::mem::swap(&mut node.single_keys, &mut scratch.singles);
        }
        self.reindex_scratch = scratch;
    }

    /// Reads what a node's index entries are made of, one look at each
    /// attempt on it: the save instants of its reclaimable GPUs, freshest
    /// first, and its single-node preemptible jobs as victims, in order.
    /// Returns its free GPUs.
    fn read_keys(&self, node: &Node, into: &mut KeyScratch) -> u8 {
        into.clear();
        let free = node.free_mask().count_ones() as u8;
        for &(job, mask) in &node.jobs {
            let j = &self.jobs[&job];
            if j.spec.tier != Tier::Preemptible || j.phase != Phase::Running {
                continue;
            }
            let run = j.run.as_ref().expect("running");
            if run.is_leaving(node.id) {
                continue;
            }
            let saved_at = run.progress_saved_at();
            into.slots.extend(std::iter::repeat_n(saved_at.0, (mask & !node.held).count_ones() as usize));
            // An elastic job's cost is not its GPUs' since its save alone
            // (`schedule::victims::victim_cost`): the node search prices it.
            if run.alloc.len() == 1 && !j.spec.is_elastic() {
                into.singles.push((free, mask.count_ones() as u8, (Reverse(saved_at), node.id, job)));
            }
        }
        into.slots.sort_unstable_by(|a, b| b.cmp(a));
        into.singles.sort_unstable();
        free
    }

    fn single_keys(&self, node: &Node) -> Vec<SingleKey> {
        let mut keys = KeyScratch::default();
        self.read_keys(node, &mut keys);
        keys.singles
    }

    fn index_key(&self, node: &Node) -> IndexKey {
        let mut keys = KeyScratch::default();
        let free = self.read_keys(node, &mut keys);
        IndexKey { free, reclaimable: keys.slots.len() as u8, top_sums: top_sums(&keys.slots).collect() }
    }
}

/// Buffers a node's index keys are read into (`State::reindex`).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyScratch {
    slots: Vec<u64>,
    singles: Vec<SingleKey>,
}

impl KeyScratch {
    fn clear(&mut self) {
        self.slots.clear();
        self.singles.clear();
    }
}

/// T_k for k = 1..=n of save instants sorted freshest first (see `index`).
fn top_sums(slots: &[u64]) -> impl Iterator<Item = u64> + '_ {
    slots.iter().scan(0u64, |sum, t| {
        *sum += t;
        Some(*sum)
    })
}

/// Whether `gpus` can be placed on nodes of `per_node` GPUs: on one node,
/// or as a gang over whole nodes.
pub fn shape_fits(gpus: u32, per_node: u8) -> bool {
    gpus <= per_node as u32 || gpus.is_multiple_of(per_node as u32)
}

/// Whether a job of `spec` can run on nodes of `per_node` GPUs: its
/// shape, and an elastic job's range in whole nodes.
pub(crate) fn spec_fits(spec: &JobSpec, per_node: u8) -> bool {
    match spec.max_gpus {
        None => shape_fits(spec.gpus, per_node),
        Some(max) => spec.gpus.is_multiple_of(per_node as u32) && max.is_multiple_of(per_node as u32),
    }
}
