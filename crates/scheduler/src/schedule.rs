//! One scheduling pass: `schedule(&state, now, &config) -> Plan`.
//!
//! See `README.md` beside this file for the policy. The pass never mutates
//! the state: what it decides is recorded in an overlay (`Pass`) holding
//! only the nodes it touched, so a pass costs what its decisions need, not
//! what the cluster holds.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{btree_set, BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Bound;

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Span, TenantId, Tier, Time};

use rustc_hash::FxHashMap;

use crate::index::{Reclaimable, SingleVictim};
use crate::model::*;
use crate::plan::*;
use crate::state::{full_mask, spec_fits, QueueClass, QueueKey, ShareKey, State};

mod elastic;
mod free;
use free::lowest_bits;
mod quota;
mod victims;

/// Plans one scheduling step at `now`. Pure: same inputs, same plan.
pub fn schedule(state: &State, now: Time, config: &Config) -> Plan {
    let mut pass = Pass::new(state, now, config);
    pass.detect_lost_nodes();
    pass.drain_cordoned_nodes();
    pass.enforce_reclaims();
    pass.start_ready_holds();
    // Jobs requeued from lost nodes join the queue only as the plan is
    // applied: no grow until the next pass has looked at them too.
    if pass.walk_queue() && pass.plan.requeues.is_empty() {
        pass.grow_elastic();
    }
    // Both ordered by node: compared without building either.
    let kept =
        pass.earmarked.iter().filter(|(_, j)| pass.reserved.contains(&Some(**j))).map(|(&n, &j)| (n, j));
    if !kept.clone().eq(state.earmarks.iter().map(|(&n, &j)| (n, j))) {
        pass.plan.earmarks = Some(kept.collect());
    }
    pass.plan
}

/// What a node looks like after the decisions made so far in this pass.
#[derive(Clone, Copy)]
struct Touched {
    used: u64,
    held: u64,
}

/// A feasible way to make room for one job.
struct VictimSet {
    model: GpuModelId,
    hold: Vec<(NodeId, u64)>,
    victims: Vec<JobId>,
    /// Parts of elastic jobs that leave (the jobs go on).
    parts: Vec<(JobId, NodeId)>,
    /// Policy cost; lower is better.
    cost: u128,
}

impl VictimSet {
    /// Jobs drained or shrunk: a set's size, for ties.
    fn len(&self) -> usize {
        self.victims.len() + self.parts.len()
    }
}

enum Outcome {
    Started,
    Preempting,
    /// Waits, for this reason; later jobs of its class cannot start either.
    Blocked(Pending),
}

struct Pass<'a> {
    state: &'a State,
    now: Time,
    config: &'a Config,
    plan: Plan,
    touched: FxHashMap<NodeId, Touched>,
    /// Touched nodes that can still take work, by model and free GPUs.
    touched_by_free: Vec<Vec<BTreeSet<NodeId>>>,
    /// Nodes kept for a blocked job this pass, and for which: nothing else
    /// lands there.
    earmarked: BTreeMap<NodeId, JobId>,
    /// Per tier, the job first in the tier's order that could not start,
    /// when one was and needs more than one GPU, with the nodes kept for
    /// it (`State::earmarks`): until its tenant starts a job there, each
    /// pass looks at that tenant first and keeps those nodes for it again,
    /// as FIFO does for its oldest job, so the GPUs that free up on them
    /// are not taken by whichever tenant comes first in the pass's order.
    /// Reserved before the pass, the tenant; after it, the job.
    reserved: [Option<JobId>; 3],
    reserved_tenant: [Option<TenantId>; 3],
    /// Nodes declared lost this pass.
    dead: BTreeSet<NodeId>,
    /// Per model and free count: nodes of the state's bucket below this id
    /// were already found unusable this pass and need not be looked at.
    cursor: Vec<Vec<u32>>,
    /// Jobs given a drain notice this pass.
    victims: BTreeSet<JobId>,
    /// Elastic jobs shrunk this pass: the GPUs their leaving parts free,
    /// and those parts.
    shrunk: FxHashMap<JobId, u32>,
    shrunk_parts: BTreeSet<(JobId, NodeId)>,
    /// Elastic jobs placed this pass, by their placement's index: the
    /// grow after the walk may give them more nodes at once.
    placed_elastic: Vec<usize>,
    /// Per (model, free, gpus) bucket of the single-victim index: entries up
    /// to this one were found unusable this pass.
    single_cursor: BTreeMap<(GpuModelId, u8, u8), SingleVictim>,
    /// Whether the victim search under way passes over settling jobs.
    sparing_settling: bool,
    /// Whether it has passed over one: a search that spared settling jobs
    /// and found nothing is tried again without sparing them.
    passed_over_settling: Cell<bool>,
    on_demand_used: Vec<u32>,
    preemptible_active: Vec<u32>,
    reserved_used: BTreeMap<(TenantId, GpuModelId), u32>,
    reserved_total: Vec<u32>,
    /// µ$ per hour started (or held for) per tier and tenant this pass.
    extra_rate: FxHashMap<(Tier, TenantId), u64>,
    /// The victim search under way takes only these jobs.
    victim_filter: Option<VictimFilter>,
    /// Fair-share preemption chose victims this pass (at most once).
    reclaimed_share: bool,
    /// A quota's reclaim chose victims this pass (at most once).
    reclaimed_quota: bool,
    /// GPUs used against quotas, per tier, model and tenant, as this
    /// pass's decisions left them (absent: as in the state). Kept only
    /// where a quota governs.
    quota_used: FxHashMap<(Tier, GpuModelId, TenantId), u32>,
}

/// Which jobs a victim search may take, besides running preemptible ones.
#[derive(Clone, Copy)]
enum VictimFilter {
    /// This tenant's that have run at least `min_runtime` (fair-share
    /// preemption).
    Tenant(TenantId),
    /// Those of tenants that borrow past their quota in the tier on the
    /// model (a quota's reclaim).
    Borrowers(Tier, GpuModelId),
}

/// One tenant's queued jobs of one tier in its own order, across its
/// classes: the head of each class not yet blocked, best first. A tenant
/// has a few classes, so these are short vectors, not trees; the rest of a
/// class is looked at only once its head starts.
struct TenantWalk<'a> {
    /// Each class's head with the class, best head last (so the best is
    /// popped from the end).
    heads: Vec<(QueueKey, QueueClass, &'a BTreeSet<QueueKey>)>,
    /// A job of the tenant was left waiting in this pass.
    waits: bool,
}

impl<'a> TenantWalk<'a> {
    fn new(state: &'a State, tier: Tier, tenant: TenantId) -> TenantWalk<'a> {
        let Some(q) = state.tenant_queues.get(&(tier, tenant)) else {
            return TenantWalk { heads: Vec::new(), waits: false };
        };
        let mut heads = Vec::with_capacity(q.classes.len());
        for (&class, queue) in &q.classes {
            if let Some(&head) = queue.first() {
                heads.push((head, class, queue));
            }
        }
        // Keys are unique (they end in the job's id).
        heads.sort_unstable_by_key(|h| Reverse(h.0));
        TenantWalk { heads, waits: false }
    }

    fn peek(&self) -> Option<(JobId, QueueClass)> {
        self.heads.last().map(|&((_, _, job), class, _)| (job, class))
    }

    /// The best head started: the next of its class takes its place.
    fn advance(&mut self, class: QueueClass) {
        let (head, c, queue) = self.heads.pop().expect("a head");
        debug_assert_eq!(c, class);
        if let Some(&next) = queue.range((Bound::Excluded(head), Bound::Unbounded)).next() {
            let at = self.heads.partition_point(|h| h.0 > next);
            self.heads.insert(at, (next, class, queue));
        }
    }

    /// The best head is blocked: the tenant's other jobs of its class wait
    /// behind it for the rest of the pass.
    fn drop_class(&mut self, class: QueueClass) {
        let (_, c, _) = self.heads.pop().expect("a head");
        debug_assert_eq!(c, class);
    }
}

impl<'a> Pass<'a> {
    fn new(state: &'a State, now: Time, config: &'a Config) -> Pass<'a> {
        let models = &state.models;
        Pass {
            state,
            now,
            config,
            plan: Plan { now, ..Plan::default() },
            touched: FxHashMap::default(),
            touched_by_free: models
                .iter()
                .map(|m| vec![BTreeSet::new(); m.gpus_per_node as usize + 1])
                .collect(),
            earmarked: BTreeMap::new(),
            reserved: [None; 3],
            reserved_tenant: {
                let mut reserved = [None; 3];
                for j in state.earmarks.values() {
                    if let Some(job) = state.jobs.get(j).filter(|j| j.phase == Phase::Queued) {
                        reserved[job.spec.tier.rank() as usize] = Some(job.spec.tenant);
                    }
                }
                reserved
            },
            dead: BTreeSet::new(),
            cursor: models.iter().map(|m| vec![0; m.gpus_per_node as usize + 1]).collect(),
            victims: BTreeSet::new(),
            shrunk: FxHashMap::default(),
            shrunk_parts: BTreeSet::new(),
            placed_elastic: Vec::new(),
            single_cursor: BTreeMap::new(),
            sparing_settling: false,
            passed_over_settling: Cell::new(false),
            on_demand_used: models.iter().map(|m| m.on_demand_used).collect(),
            preemptible_active: models.iter().map(|m| m.preemptible_active).collect(),
            reserved_used: BTreeMap::new(),
            reserved_total: (0..models.len())
                .map(|i| state.reserved_total(GpuModelId(i as u16), now))
                .collect(),
            extra_rate: FxHashMap::default(),
            victim_filter: None,
            reclaimed_share: false,
            reclaimed_quota: false,
            quota_used: FxHashMap::default(),
        }
    }

    // ---- lost nodes, operator drains and reclaims ------------------------

    fn detect_lost_nodes(&mut self) {
        let Some(timeout) = self.config.heartbeat_timeout else { return };
        let state = self.state;
        let mut requeued = BTreeSet::new();
        for &(last, node) in &state.heartbeats {
            if last + timeout > self.now {
                break;
            }
            if state.nodes[node.0 as usize].status == NodeStatus::Lost {
                continue;
            }
            self.plan.lost_nodes.push(node);
            self.dead.insert(node);
            self.untouch_bucket(node);
            for job in state.nodes[node.0 as usize].jobs() {
                // A part leaving there is gone with it; the job goes on.
                let leaving = state.jobs[&job].run.as_ref().is_some_and(|r| r.is_leaving(node));
                if !leaving && requeued.insert(job) {
                    let attempt = state.jobs[&job].attempt;
                    self.plan.requeues.push(Requeue { job, attempt, reason: RequeueReason::NodeLost(node) });
                    self.victims.insert(job);
                }
            }
        }
    }

    /// A cordoned node's preemptible jobs get their notice; an elastic
    /// job that can do without the node loses only its part there.
    fn drain_cordoned_nodes(&mut self) {
        let state = self.state;
        for &node in &state.pending_node_drains {
            for job in state.nodes[node.0 as usize].jobs() {
                let j = &state.jobs[&job];
                let leaving = j.run.as_ref().is_some_and(|r| r.is_leaving(node));
                if j.spec.tier == Tier::Preemptible
                    && j.phase == Phase::Running
                    && !leaving
                    && !self.victims.contains(&job)
                    && !self.shrunk_parts.contains(&(job, node))
                {
                    let reason = DrainReason::NodeDrain { node };
                    match self.part_may_leave(j, node) {
                        true => self.shrink(job, &[node], reason),
                        false if !self.shrunk.contains_key(&job) => self.drain(job, reason),
                        // Shrunk already this pass: drained whole by the next.
                        false => {}
                    }
                }
            }
        }
    }

    /// Drains preemptible work of a model above its reclaim limit, cheapest
    /// per GPU first and settling jobs after every other. Runs only while a
    /// limit is exceeded (right after the operator's reclaim), so its scan
    /// of the model's jobs is not per event.
    fn enforce_reclaims(&mut self) {
        let state = self.state;
        for (model, m) in state.models() {
            let Some(limit) = m.preemptible_limit else { continue };
            let active = self.preemptible_active[model.0 as usize];
            if active <= limit {
                continue;
            }
            let mut candidates: Vec<(bool, u128, JobId, u32)> = state
                .jobs
                .values()
                .filter(|j| {
                    j.spec.tier == Tier::Preemptible
                        && j.phase == Phase::Running
                        && !self.victims.contains(&j.spec.id)
                        && j.run.as_ref().is_some_and(|r| r.model == model)
                })
                .map(|j| {
                    let settling = j.settling(self.now, self.config.min_runtime);
                    let gpus = j.run.as_ref().map_or(j.spec.gpus, Run::active_gpus).max(1);
                    (settling, self.victim_cost(j) / gpus as u128, j.spec.id, gpus)
                })
                .collect();
            candidates.sort();
            let mut excess = active - limit;
            for (_, _, job, gpus) in candidates {
                if excess == 0 {
                    break;
                }
                if self.shrunk.contains_key(&job) {
                    continue;
                }
                self.drain(job, DrainReason::Reclaim);
                excess = excess.saturating_sub(gpus);
            }
        }
    }

    fn drain(&mut self, job: JobId, reason: DrainReason) {
        let j = &self.state.jobs[&job];
        debug_assert_eq!(j.spec.tier, Tier::Preemptible, "only preemptible jobs are drained");
        let run = j.run.as_ref().expect("drained job runs");
        debug_assert!(!self.shrunk.contains_key(&job), "a job shrunk this pass is not drained whole");
        self.victims.insert(job);
        self.preemptible_active[run.model.0 as usize] -= run.active_gpus();
        self.plan.drains.push(Drain {
            job,
            attempt: run.attempt,
            notice_at: self.now,
            deadline: self.now + self.config.drain_window,
            reason,
        });
    }

    // ---- starting jobs ---------------------------------------------------

    fn start_ready_holds(&mut self) {
        let state = self.state;
        for &job in &state.ready_holds {
            let hold = &state.holds[&job];
            if hold.alloc.iter().any(|(n, _)| self.dead.contains(n)) {
                continue;
            }
            for &(node, mask) in &hold.alloc {
                let t = self.masks(node);
                self.touch(node, Touched { used: t.used | mask, held: t.held & !mask });
            }
            let j = &state.jobs[&job];
            self.plan.placements.push(Placement {
                job,
                attempt: Attempt(j.attempt.0 + 1),
                model: hold.model,
                alloc: hold.alloc.clone(),
                from_hold: true,
            });
        }
    }

    /// Walks queued jobs tier by tier, in the config's order, until every
    /// class has started all it can or is blocked, or the pass's bound on
    /// starts is reached. Returns whether it walked them all: whether
    /// every queued job was either started or found unable to.
    fn walk_queue(&mut self) -> bool {
        match self.config.order {
            Order::Fifo => self.walk_fifo(),
            Order::FairShare => Tier::ALL.into_iter().all(|tier| self.walk_tier(tier)),
        }
    }

    fn at_bound(&self) -> bool {
        let bound = self.config.max_starts.unwrap_or(usize::MAX);
        self.plan.placements.len() + self.plan.preemptions.len() >= bound
    }

    /// One tier in fair-share order: the tenant with the lowest key next,
    /// and of its jobs the first in its own order whose class is not
    /// blocked; a start moves the tenant back by what it started. A class
    /// blocked for one tenant is blocked for every later one (its jobs
    /// are interchangeable for the question, and the pass only takes
    /// capacity), so the walk ends once every class of the tier is
    /// blocked: it costs O((started + classes) · log tenants), never a
    /// look at every tenant. Returns false at the pass's bound.
    fn walk_tier(&mut self, tier: Tier) -> bool {
        let state = self.state;
        let rank = tier.rank() as usize;
        let classes = state.classes_in_tier[rank];
        let mut base = state.order[rank].iter().peekable();
        // Tenants this pass has looked at, with their keys as the pass
        // moved them; a tenant here is passed over in `base`.
        let mut moved: BinaryHeap<Reverse<(ShareKey, TenantId)>> = BinaryHeap::new();
        let mut walks: FxHashMap<TenantId, TenantWalk<'a>> = FxHashMap::default();
        // The first job blocked in each class with its tenant, and how many
        // tenants have a job left waiting so far (each walk knows whether
        // its tenant is one).
        let mut blocked: BTreeMap<QueueClass, (JobId, TenantId)> = BTreeMap::new();
        let mut waiting = 0u32;
        // The tenant reserved for first, then the tier's order; the first
        // job looked at is reserved for if it cannot start.
        if let Some(tenant) = self.reserved_tenant[rank] {
            if state.tenant_queues.contains_key(&(tier, tenant)) {
                moved.push(Reverse((ShareKey(f64::NEG_INFINITY), tenant)));
            }
        }
        let mut head = true;
        loop {
            if blocked.len() >= classes {
                return true;
            }
            while base.peek().is_some_and(|(_, t)| walks.contains_key(t)) {
                base.next();
            }
            let from_moved = match (base.peek(), moved.peek()) {
                (None, None) => return true,
                (Some(b), Some(Reverse(m))) => m < *b,
                (None, Some(_)) => true,
                (Some(_), None) => false,
            };
            let (key, tenant) =
                if from_moved { moved.pop().expect("peeked").0 } else { *base.next().expect("peeked") };
            // Reserved for: its first job is looked at first, the rest in
            // its place in the order.
            let reserved_visit = key.0 == f64::NEG_INFINITY;
            let walk = walks.entry(tenant).or_insert_with(|| TenantWalk::new(state, tier, tenant));
            while let Some((job, class)) = walk.peek() {
                if let Some(&(behind, of)) = blocked.get(&class) {
                    walk.drop_class(class);
                    let why = match of == tenant {
                        true => Pending::Priority { behind },
                        false => Pending::FairShare { tenants_ahead: waiting - walk.waits as u32 },
                    };
                    self.plan.pending.push((job, why));
                    waiting += !std::mem::replace(&mut walk.waits, true) as u32;
                    continue;
                }
                if self.at_bound() {
                    return false;
                }
                match self.try_start(job) {
                    Outcome::Started | Outcome::Preempting => {
                        head = false;
                        walk.advance(class);
                        if walk.peek().is_some() {
                            let key = state.fair.key(tier, tenant, self.extra_rate(tier, tenant));
                            moved.push(Reverse((key, tenant)));
                        }
                        break;
                    }
                    Outcome::Blocked(why) => {
                        let why = self.blocked_why(job, tenant, tier, why);
                        // A quota keeps this tenant out, not the class.
                        if !why.is_quota() {
                            blocked.insert(class, (job, tenant));
                            // The first in the tier's order that waits for
                            // GPUs to free (it kept nodes for itself: not
                            // one no node could ever hold, nor one a cap
                            // holds) is reserved for, if it needs them to
                            // free together (one GPU is any GPU that frees,
                            // in its turn).
                            if head && self.earmarked.values().any(|&j| j == job) {
                                head = false;
                                if state.jobs[&job].spec.gpus > 1 {
                                    self.reserved[rank] = Some(job);
                                }
                            }
                        }
                        walk.drop_class(class);
                        self.plan.pending.push((job, why));
                        waiting += !std::mem::replace(&mut walk.waits, true) as u32;
                        if reserved_visit {
                            if walk.peek().is_some() {
                                let key = state.fair.key(tier, tenant, self.extra_rate(tier, tenant));
                                moved.push(Reverse((key, tenant)));
                            }
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Why a job the walk could not start waits, after the reclaims it may
    /// set off: a quota's, then (preemptible) fair-share preemption.
    fn blocked_why(&mut self, job: JobId, tenant: TenantId, tier: Tier, why: Pending) -> Pending {
        let short = matches!(
            why,
            Pending::Resources { .. } | Pending::WholeNodes { .. } | Pending::ReservationCap { .. }
        );
        if !short {
            return why;
        }
        self.reclaim_for(job)
            .or_else(|| (tier == Tier::Preemptible).then(|| self.reclaim_share(job, tenant)).flatten())
            .unwrap_or(why)
    }

    /// The cheapest victims `filter` allows that make room for `job` on
    /// `models`, the nodes it earmarked itself included (they are kept
    /// for it, not from it).
    pub(super) fn victims_for(
        &mut self,
        job: JobId,
        filter: VictimFilter,
        models: &[GpuModelId],
    ) -> Option<VictimSet> {
        let own: Vec<NodeId> = self.earmarked.iter().filter(|(_, j)| **j == job).map(|(n, _)| *n).collect();
        for node in &own {
            self.earmarked.remove(node);
        }
        self.victim_filter = Some(filter);
        let set = self.cheapest_victims(models, self.state.jobs[&job].spec.gpus);
        self.victim_filter = None;
        for node in own {
            self.earmarked.insert(node, job);
        }
        set
    }

    /// A quota's reclaim for `job`, if its tenant is under its quota of a
    /// model it may use.
    fn reclaim_for(&mut self, job: JobId) -> Option<Pending> {
        let spec = &self.state.jobs[&job].spec;
        // Not the tier's cap: on-demand borrowers may be what fills it.
        let models: Vec<GpuModelId> =
            self.candidate_models(spec).filter(|&m| self.quota_blocks(spec, m).is_none()).collect();
        self.reclaim_quota(job, &models)
    }

    /// Fair-share preemption for `job` of `tenant`, which waits in the
    /// preemptible tier for GPUs: if the tenant furthest above its share
    /// has a key more than the threshold above this tenant's (this job
    /// counted), its cheapest jobs that make room, each run for at least
    /// `min_runtime`, get their drain notice. No GPUs are held: the job
    /// takes them in its turn when they are free. At most once a pass, and
    /// not while earlier victims of it drain, so reclaims come one at a
    /// time and the keys move between them.
    fn reclaim_share(&mut self, job: JobId, tenant: TenantId) -> Option<Pending> {
        let threshold = self.config.fair_share_preemption?;
        let state = self.state;
        if self.reclaimed_share || state.fair_share_draining > 0 {
            return None;
        }
        let tier = Tier::Preemptible;
        let victim = state.furthest_above_share(tenant)?;
        let spec = &state.jobs[&job].spec;
        let models: Vec<GpuModelId> =
            self.candidate_models(spec).filter(|&m| self.cap_allows(spec, m)).collect();
        let rate = state.models[models.first()?.0 as usize].rate.saturating_mul(spec.gpus as u64);
        let mine = state.fair.key(tier, tenant, self.extra_rate(tier, tenant).saturating_add(rate));
        let theirs = state.fair.key(tier, victim, self.extra_rate(tier, victim));
        if theirs.0 <= mine.0 * (1.0 + threshold as f64 / 100.0) {
            return None;
        }
        let set = self.victims_for(job, VictimFilter::Tenant(victim), &models)?;
        self.reclaimed_share = true;
        for &v in &set.victims {
            self.drain(v, DrainReason::FairShare { tenant });
        }
        Some(Pending::ReclaimingShare { from: victim, victims: set.victims.len() as u32 })
    }

    /// Every tier in submission order, every tenant together (today's
    /// order before fair share, for comparison): one cursor per class and
    /// tenant, merged; a class blocked is blocked for all. Returns false
    /// at the pass's bound.
    fn walk_fifo(&mut self) -> bool {
        let state = self.state;
        let mut queues: Vec<(QueueClass, btree_set::Iter<'a, QueueKey>)> = state
            .tenant_queues
            .values()
            .flat_map(|q| &q.classes)
            .map(|(class, queue)| (*class, queue.iter()))
            .collect();
        let mut heap = BinaryHeap::new();
        for (i, (class, iter)) in queues.iter_mut().enumerate() {
            if let Some(&(prio, at, job)) = iter.next() {
                heap.push(Reverse((class.tier.rank(), at, prio, job, i)));
            }
        }
        let mut blocked: BTreeMap<QueueClass, JobId> = BTreeMap::new();
        while let Some(Reverse((_, _, _, job, i))) = heap.pop() {
            let class = queues[i].0;
            if let Some(&behind) = blocked.get(&class) {
                self.plan.pending.push((job, Pending::Priority { behind }));
                continue;
            }
            if self.at_bound() {
                return false;
            }
            match self.try_start(job) {
                Outcome::Started | Outcome::Preempting => {
                    let (class, iter) = &mut queues[i];
                    if let Some(&(prio, at, next)) = iter.next() {
                        heap.push(Reverse((class.tier.rank(), at, prio, next, i)));
                    }
                }
                Outcome::Blocked(why) => {
                    if !why.is_quota() {
                        blocked.insert(class, job);
                    }
                    self.plan.pending.push((job, why));
                }
            }
        }
        true
    }

    /// µ$ per hour `tenant` started in `tier` in this pass.
    fn extra_rate(&self, tier: Tier, tenant: TenantId) -> u64 {
        self.extra_rate.get(&(tier, tenant)).copied().unwrap_or(0)
    }

    fn try_start(&mut self, id: JobId) -> Outcome {
        let state = self.state;
        let job = &state.jobs[&id];
        let spec = &job.spec;
        // Free GPUs first, on each model the caps allow; no list of models
        // is built for a job that starts (most of them, in a busy pass).
        let mut first = None;
        for model in candidate_models(state, spec) {
            first.get_or_insert(model);
            if self.cap_allows(spec, model) {
                if let Some(alloc) = self.find_free(model, spec.gpus, job.last_node) {
                    self.place(id, model, alloc);
                    return Outcome::Started;
                }
            }
        }
        let Some(first) = first else {
            return Outcome::Blocked(Pending::NoCapacity { model: spec.gpu_model });
        };
        if spec.tier != Tier::Preemptible {
            let models: Vec<GpuModelId> =
                candidate_models(state, spec).filter(|&m| self.cap_allows(spec, m)).collect();
            if let Some(set) = self.choose_victims(&models, spec.gpus) {
                self.preempt(id, set);
                return Outcome::Preempting;
            }
        }
        let Some(model) = candidate_models(state, spec).find(|&m| self.cap_allows(spec, m)) else {
            return Outcome::Blocked(
                self.quota_blocks(spec, first).unwrap_or_else(|| self.capped(spec, first)),
            );
        };
        let mut why = self.short_of(model, spec.gpus);
        let earmarked = self.earmark_for(id, model, spec.gpus);
        if let Pending::WholeNodes { earmarked: kept, .. } = &mut why {
            *kept = earmarked;
        }
        Outcome::Blocked(why)
    }

    /// Why a job within its tier's cap on `model` found no room there:
    /// called before the job earmarks nodes of its own.
    fn short_of(&mut self, model: GpuModelId, gpus: u32) -> Pending {
        let per_node = self.state.models[model.0 as usize].gpus_per_node as u32;
        let kept_for = |pass: &Self, fits: &dyn Fn(u32) -> bool| {
            pass.earmarked.iter().find_map(|(&node, &job)| {
                let n = &pass.state.nodes[node.0 as usize];
                (n.model == model && fits(pass.free_mask(node).count_ones())).then_some(job)
            })
        };
        if gpus <= per_node {
            if let Some(behind) = kept_for(self, &|free| free >= gpus) {
                return Pending::Priority { behind };
            }
            let largest_free =
                (0..gpus as usize).rev().find(|&free| self.bucket_first(model, free).is_some());
            Pending::Resources { model, largest_free: largest_free.unwrap_or(0) as u32 }
        } else {
            let nodes = gpus / per_node;
            let free = self.bucket_nodes(model, per_node as usize, nodes as usize).len() as u32;
            if let Some(behind) = kept_for(self, &|f| f == per_node) {
                return Pending::Priority { behind };
            }
            Pending::WholeNodes { model, nodes, free, earmarked: Vec::new() }
        }
    }

    /// Why a job over its tier's cap on `model` waits.
    fn capped(&self, spec: &JobSpec, model: GpuModelId) -> Pending {
        let m = &self.state.models[model.0 as usize];
        let i = model.0 as usize;
        match spec.tier {
            Tier::OnDemand => Pending::ReservationCap {
                model,
                capacity: m.capacity,
                reserved: self.reserved_total[i],
                used: self.on_demand_used[i],
            },
            Tier::Reserved => {
                let reserved = self.state.reserved_capacity(spec.tenant, model, self.now);
                if reserved == 0 {
                    let starts = self
                        .state
                        .reservations()
                        .filter(|r| r.tenant == spec.tenant && r.gpu_model == model && r.start > self.now)
                        .map(|r| r.start)
                        .min();
                    Pending::ReservationNotStarted { model, starts }
                } else {
                    Pending::ReservationFull {
                        model,
                        reserved,
                        used: self.reserved_used_now(spec.tenant, model),
                    }
                }
            }
            Tier::Preemptible => Pending::Reclaimed {
                model,
                limit: m.preemptible_limit.unwrap_or(m.capacity),
                used: self.preemptible_active[i],
            },
        }
    }

    /// Models the job could ever run on: its own, or any whose node size
    /// admits its shape and whose capacity is large enough.
    fn candidate_models<'s>(&'s self, spec: &'s JobSpec) -> impl Iterator<Item = GpuModelId> + 's {
        candidate_models(self.state, spec)
    }

    /// The tier caps: on-demand may not take GPUs reserved for others,
    /// reserved jobs stay within their tenant's reservation, preemptible
    /// work within any reclaim limit.
    fn cap_allows(&self, spec: &JobSpec, model: GpuModelId) -> bool {
        let m = &self.state.models[model.0 as usize];
        let i = model.0 as usize;
        if self.quota_blocks(spec, model).is_some() {
            return false;
        }
        match spec.tier {
            Tier::OnDemand => {
                self.on_demand_used[i] + spec.gpus <= m.capacity.saturating_sub(self.reserved_total[i])
            }
            Tier::Reserved => {
                let used = self.reserved_used_now(spec.tenant, model);
                used + spec.gpus <= self.state.reserved_capacity(spec.tenant, model, self.now)
            }
            Tier::Preemptible => {
                m.preemptible_limit.is_none_or(|limit| self.preemptible_active[i] + spec.gpus <= limit)
            }
        }
    }

    fn reserved_used_now(&self, tenant: TenantId, model: GpuModelId) -> u32 {
        self.reserved_used
            .get(&(tenant, model))
            .copied()
            .unwrap_or_else(|| self.state.reserved_used(tenant, model))
    }

    fn count(&mut self, spec: &JobSpec, model: GpuModelId) {
        let i = model.0 as usize;
        let rate = self.state.models[i].rate.saturating_mul(spec.gpus as u64);
        *self.extra_rate.entry((spec.tier, spec.tenant)).or_insert(0) += rate;
        // Use against quotas matters only where a quota governs.
        if spec.tier != Tier::Reserved && self.state.quotas.governs(spec.tier, model) {
            let used = self.quota_used_now(spec.tier, model, spec.tenant);
            self.quota_used.insert((spec.tier, model, spec.tenant), used + spec.gpus);
        }
        match spec.tier {
            Tier::OnDemand => self.on_demand_used[i] += spec.gpus,
            Tier::Reserved => {
                let used = self.reserved_used_now(spec.tenant, model);
                self.reserved_used.insert((spec.tenant, model), used + spec.gpus);
            }
            Tier::Preemptible => self.preemptible_active[i] += spec.gpus,
        }
    }

    fn place(&mut self, job: JobId, model: GpuModelId, alloc: Vec<(NodeId, u64)>) {
        let state = self.state;
        let j = &state.jobs[&job];
        self.count(&j.spec, model);
        if j.spec.is_elastic() {
            self.placed_elastic.push(self.plan.placements.len());
        }
        for &(node, mask) in &alloc {
            let t = self.masks(node);
            self.touch(node, Touched { used: t.used | mask, held: t.held });
        }
        self.plan.placements.push(Placement {
            job,
            attempt: Attempt(j.attempt.0 + 1),
            model,
            alloc,
            from_hold: false,
        });
    }

    fn preempt(&mut self, job: JobId, set: VictimSet) {
        let state = self.state;
        let j = &state.jobs[&job];
        self.count(&j.spec, set.model);
        for &(node, mask) in &set.hold {
            let t = self.masks(node);
            self.touch(node, Touched { used: t.used, held: t.held | mask });
        }
        let mut lost_gpu_ms = 0;
        for &victim in &set.victims {
            let v = &state.jobs[&victim];
            let run = v.run.as_ref().expect("victims run");
            let restart = if v.spec.is_elastic() { self.config.restart_cost.0 as u128 } else { 0 };
            let since_save = self.now.saturating_since(run.progress_saved_at()).0 as u128;
            lost_gpu_ms += run.active_gpus() as u128 * (since_save + restart);
            self.drain(victim, DrainReason::Preempted { by: job });
        }
        let mut parts = set.parts.clone();
        parts.sort_unstable();
        for group in parts.chunk_by(|a, b| a.0 == b.0) {
            let victim = group[0].0;
            lost_gpu_ms += self.shrink_cost(&state.jobs[&victim], group.iter().map(|p| p.1));
            let nodes: Vec<NodeId> = group.iter().map(|p| p.1).collect();
            self.shrink(victim, &nodes, DrainReason::Preempted { by: job });
        }
        self.plan.preemptions.push(Preemption {
            preemptor: job,
            model: set.model,
            hold: set.hold,
            victims: set.victims,
            parts,
            lost_gpu_ms,
        });
    }

    // ---- free capacity ---------------------------------------------------
}

/// Models a job of `spec` could ever run on: its own, or any whose node
/// size admits its shape and whose capacity is large enough.
fn candidate_models<'s>(state: &'s State, spec: &'s JobSpec) -> impl Iterator<Item = GpuModelId> + 's {
    state.models().filter_map(move |(id, m)| {
        let wanted = spec.gpu_model.is_none_or(|w| w == id);
        (wanted && spec_fits(spec, m.gpus_per_node) && spec.gpus <= m.capacity).then_some(id)
    })
}
