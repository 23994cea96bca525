//! The discrete-event loop.
//!
//! Events (arrivals, completions, periodic checkpoints, exits after a drain)
//! are taken in time order; after each instant's events the scheduling core
//! plans and the plan is applied, repeatedly until it has nothing more to
//! do at that instant.
//!
//! The work model of one job: it needs `duration` of useful work (its trace
//! duration). An attempt after the first spends `restart_overhead` before
//! making progress. Every `checkpoint_interval` of progress it saves
//! (instantly). On a drain notice it either saves in `drain_checkpoint`
//! (if that fits in the window) and exits having lost nothing, or — if it
//! cannot save in time or does not save on notice — is killed at the
//! deadline, losing what it did since its last checkpoint. A job that can
//! finish before it would be killed simply finishes.
//!
//! An elastic job (`--elastic`) progresses in proportion to the GPUs it
//! works on: its trace duration is its work at its most GPUs. Every change
//! of its nodes restarts each rank from a save and costs
//! `restart_overhead`: a grow saves first (instantly, as a periodic
//! checkpoint does); a shrink's notice is met as a drain's — the job
//! saves in `drain_checkpoint` if that fits the window and the leaving
//! nodes exit then, or it is rolled back to its last checkpoint when they
//! exit (at once without a notice, at the deadline without a save).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use ebb_core::{Attempt, JobId, MicroUsd, PriceBook, ReservationId, Span, TenantId, Tier, Time};
use ebb_scheduler::{
    schedule, shape_fits, Config, DrainReason, ExitEffect, ExitKind, JobSpec, NodeSpec, Reservation, State,
    VictimPolicy,
};

use crate::summary::{
    round, ConfigEcho, DeadlineFigures, Percentiles, Series, SimOutput, Summary, TierFigures, Window,
};
use crate::{DeadlinePolicy, NoticeMode, SimConfig, SimError, Trace};

mod elastic;
mod figures;

const HOUR_MS: u64 = 3_600_000;
/// A repeat preemption this early in the attempt is counted as quick: a
/// fixed yardstick, so that replays under different `--min-runtime`
/// compare.
const QUICK_REPEAT: Span = Span(10 * 60_000);
const RESERVED_TENANT: TenantId = TenantId(1);
/// The tenant of the jobs of `--trace` traces.
const DEFAULT_OWNER: &str = "default";

/// Replay progress, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub arrived: u64,
    pub total: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    /// The attempt of generation `.1` finishes its work.
    Complete(usize, u32),
    Checkpoint(usize, u32),
    /// A draining attempt exits: after saving, or killed at its deadline.
    DrainExit(usize, u32),
    /// The part on node `.2` of elastic job `.0`'s attempt `.1` leaves.
    PartExit(usize, u32, u32),
    /// Judge job `.0`'s deadline (`--deadline-slack`, policy `promote`).
    DeadlineCheck(usize),
}

/// A stretch of an attempt on one set of nodes: the whole attempt for a
/// rigid job, from one change of its nodes to the next for an elastic one.
struct Running {
    start: Time,
    /// Time before the attempt makes progress (restart overhead).
    overhead: u64,
    /// Work saved when the stretch started.
    base: u64,
    /// GPUs it works on: work advances at `gpus / SimJob::gpus` of the
    /// rate at its most.
    gpus: u32,
}

struct Draining {
    notice: Time,
    /// The job stopped working (saving, or failing to) at this instant.
    stopped_at: Option<Time>,
    /// Whether the save on notice completes before the deadline.
    saves: bool,
}

struct SimJob {
    tier: Tier,
    /// Its most GPUs (the trace's); the unit of its work.
    gpus: u32,
    /// An elastic job's fewest GPUs.
    min_gpus: Option<u32>,
    /// GPUs its attempt holds now (leaving parts included), since when:
    /// metered up to each change.
    held: u32,
    held_since: Time,
    /// Parts of its attempt told to leave by a shrink.
    leaving: Vec<elastic::Leaving>,
    /// It stopped working to save for a shrink at this instant.
    paused_at: Option<Time>,
    shrinks: u32,
    grows: u32,
    /// GPU-milliseconds of its work thrown away.
    lost: u128,
    submit: Time,
    /// Useful work needed, in ms.
    duration: u64,
    /// Work saved so far (by checkpoints), in ms.
    saved: u64,
    attempt: Attempt,
    /// Bumped on every change so that events for an old state are ignored.
    generation: u32,
    run: Option<Running>,
    drain: Option<Draining>,
    first_start: Option<Time>,
    done_at: Option<Time>,
    /// Preemption notices it has had.
    preemptions: u32,
    /// When it must be done (`--deadline-slack`), and whether it was promoted.
    deadline: Option<Time>,
    promoted: bool,
    /// What its attempts cost, micro-dollars.
    cost: i64,
    /// Its tenant: an index into `Engine::owners`.
    owner: usize,
}

/// A tenant of the replay: `default` for the jobs of `--trace` traces, one
/// per `--tenant`.
struct Owner {
    name: String,
    weight: u32,
    id: TenantId,
    /// Its jobs waiting now (queued or requeued, not yet started).
    queued: u32,
    busy: u128,
    lost: u128,
    preemptions: u64,
    /// GPU-milliseconds by hour.
    busy_by_hour: Vec<u128>,
}

impl SimJob {
    /// Useful work done by `t` in the current attempt, saved work included.
    fn progress(&self, t: Time) -> u64 {
        let run = self.run.as_ref().expect("progress of a running job");
        let stopped = self.drain.as_ref().and_then(|d| d.stopped_at).into_iter().chain(self.paused_at);
        let until = stopped.fold(t, Time::min);
        let worked = until.saturating_since(run.start).0.saturating_sub(run.overhead);
        let done = worked as u128 * run.gpus as u128 / self.gpus as u128;
        (run.base as u128 + done).min(self.duration as u128) as u64
    }

    fn finish_time(&self) -> Time {
        let run = self.run.as_ref().expect("finish time of a running job");
        let left = (self.duration - run.base) as u128 * self.gpus as u128;
        run.start + Span(run.overhead + left.div_ceil(run.gpus as u128) as u64)
    }
}

struct Engine<'a> {
    config: &'a SimConfig,
    core: Config,
    state: State,
    jobs: Vec<SimJob>,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    seq: u64,
    origin: Time,
    capacity: u32,
    // Accounting, GPU-milliseconds.
    busy: [u128; 3],
    /// Busy time inside the measurement window, if any.
    busy_in_window: [u128; 3],
    lost: u128,
    drain: u128,
    restart: u128,
    preemptions: u64,
    /// Preemptions of a job preempted before, and those of them that came
    /// within `QUICK_REPEAT` of the attempt's start.
    repeat_preemptions: u64,
    quick_repeat_preemptions: u64,
    // Hourly series.
    busy_by_hour: Vec<[u128; 3]>,
    queued_by_hour: Vec<[u32; 3]>,
    preemptions_by_hour: Vec<u32>,
    last_sampled_hour: Option<u64>,
    /// Rates per GPU-hour by tier rank: reserved, on-demand, preemptible.
    rates: [MicroUsd; 3],
    owners: Vec<Owner>,
    /// Per hour: whether it began with every tenant's work waiting.
    busy_hours: Vec<bool>,
}

/// Replays `traces` under `config`. `progress` is called now and then.
pub fn run(
    config: &SimConfig,
    traces: &[Trace],
    progress: &mut dyn FnMut(Progress),
) -> Result<SimOutput, SimError> {
    validate(config, traces)?;
    let mut engine = Engine::new(config)?;
    let (unschedulable, total) = engine.load(traces);
    let (mut arrived, mut reported) = (0u64, 0u64);
    while let Some(&Reverse((now, _, _))) = engine.events.peek() {
        engine.sample_queues(now);
        arrived += engine.process_events_at(now);
        engine.settle(now);
        if arrived - reported >= 256 {
            progress(Progress { arrived, total });
            reported = arrived;
        }
    }
    progress(Progress { arrived: total, total });
    Ok(engine.finish(traces, unschedulable))
}

fn validate(config: &SimConfig, traces: &[Trace]) -> Result<(), SimError> {
    let fail = |m: String| Err(SimError::Config(m));
    if traces.is_empty() {
        return fail("at least one --trace or --tenant is required".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for tenant in traces.iter().filter_map(|t| t.tenant.as_ref()) {
        if tenant.name == DEFAULT_OWNER || !names.insert(&tenant.name) {
            return fail(format!(
                "--tenant {}: named twice (or `default`, the jobs of --trace)",
                tenant.name
            ));
        }
        if tenant.weight == 0 {
            return fail(format!("--tenant {}: weight must be at least 1", tenant.name));
        }
    }
    if config.nodes == 0 {
        return fail("--nodes must be at least 1".into());
    }
    if config.gpus_per_node == 0 || config.gpus_per_node > ebb_scheduler::MAX_GPUS_PER_NODE {
        return fail(format!(
            "--gpus-per-node must be between 1 and {}, got {}",
            ebb_scheduler::MAX_GPUS_PER_NODE,
            config.gpus_per_node
        ));
    }
    if !(0.0..=1.0).contains(&config.preemptible_fraction) {
        return fail(format!(
            "--preemptible-fraction must be between 0 and 1, got {}",
            config.preemptible_fraction
        ));
    }
    if config.deadline_slack.is_some_and(|slack| !(slack.is_finite() && slack >= 1.0)) {
        return fail(format!(
            "--deadline-slack must be at least 1 (a deadline before the work could be done), got {}",
            config.deadline_slack.unwrap_or_default()
        ));
    }
    if let Some(fraction) = config.elastic {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return fail(format!("--elastic must be above 0 and at most 1, got {fraction}"));
        }
        if config.deadline_slack.is_some() {
            return fail("--elastic and --deadline-slack are not replayed together".into());
        }
    }
    if config.checkpoint_interval == Some(Span::ZERO) {
        return fail("--checkpoint-interval must be positive".into());
    }
    let reserved_trace = traces.iter().any(|t| t.tier == Some(Tier::Reserved));
    if reserved_trace && config.reserved_gpus == 0 {
        return fail("a reserved=PATH trace needs --reserved-gpus N".into());
    }
    if config.reserved_gpus > config.nodes * config.gpus_per_node as u32 {
        return fail("--reserved-gpus exceeds the cluster".into());
    }
    Ok(())
}

/// Whether a job with this id is made preemptible under `fraction`:
/// FNV-1a of the id, as a fraction of 2^64, below `fraction`.
fn preemptible_by_id(id: &str, fraction: f64) -> bool {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash as f64 / 18_446_744_073_709_551_616.0) < fraction
}

impl<'a> Engine<'a> {
    fn new(config: &'a SimConfig) -> Result<Engine<'a>, SimError> {
        let mut state = State::new();
        for i in 0..config.nodes {
            let spec = NodeSpec {
                name: format!("sim-{i:05}"),
                gpu_model: config.gpu_model.clone(),
                gpus: config.gpus_per_node,
                labels: BTreeMap::new(),
            };
            state.add_node(spec, Time::ZERO).map_err(|e| SimError::Config(e.to_string()))?;
        }
        let model = state.model_by_name(&config.gpu_model).expect("nodes added");
        let rate = u64::try_from(config.on_demand_price.0).unwrap_or(0);
        state.set_model_rate(model, rate).map_err(|e| SimError::Config(e.to_string()))?;
        state
            .set_fair_share_half_life(config.fair_share_half_life)
            .map_err(|e| SimError::Config(format!("--fair-share-half-life: {e}")))?;
        state.set_fair_share_preemption(config.fair_share_preemption.is_some());
        let drain_window = match config.notice {
            NoticeMode::Drain => config.drain_window,
            NoticeMode::None => Span::ZERO,
        };
        Ok(Engine {
            config,
            core: Config {
                drain_window,
                victim_policy: config.victim_policy,
                heartbeat_timeout: None,
                min_runtime: config.min_runtime,
                max_starts: None,
                order: config.order,
                fair_share_preemption: config.fair_share_preemption,
                restart_cost: config.restart_overhead,
            },
            state,
            jobs: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            origin: Time::ZERO,
            capacity: config.nodes * config.gpus_per_node as u32,
            busy: [0; 3],
            busy_in_window: [0; 3],
            lost: 0,
            drain: 0,
            restart: 0,
            preemptions: 0,
            repeat_preemptions: 0,
            quick_repeat_preemptions: 0,
            busy_by_hour: Vec::new(),
            queued_by_hour: Vec::new(),
            preemptions_by_hour: Vec::new(),
            last_sampled_hour: None,
            rates: {
                let book = PriceBook {
                    on_demand_per_gpu_hour: config.on_demand_price,
                    reserved_per_gpu_hour: config.reserved_price,
                    preemptible_discount_bps: config.preemptible_discount_bps,
                };
                [config.reserved_price, book.on_demand_per_gpu_hour, book.preemptible_per_gpu_hour()]
            },
            owners: Vec::new(),
            busy_hours: Vec::new(),
        })
    }

    /// Turns trace rows into jobs and arrival events; returns (jobs that can
    /// never run here, total jobs that will run).
    fn load(&mut self, traces: &[Trace]) -> (u64, u64) {
        let model = self.state.model_by_name(&self.config.gpu_model).expect("nodes added");
        let mut unschedulable = 0;
        let mut rows: Vec<(u64, usize, usize)> = Vec::new();
        for (t, trace) in traces.iter().enumerate() {
            for (i, job) in trace.jobs.iter().enumerate() {
                rows.push((job.submit_s, t, i));
            }
        }
        rows.sort_unstable();
        // Tenants in the order their traces were given, `default` where
        // the first untagged one was.
        let mut owner_of = Vec::with_capacity(traces.len());
        for trace in traces {
            let (name, weight) = match &trace.tenant {
                Some(t) => (t.name.clone(), t.weight),
                None => (DEFAULT_OWNER.to_string(), 1),
            };
            let index = match self.owners.iter().position(|o| o.name == name) {
                Some(i) => i,
                None => {
                    let id = TenantId(2 + self.owners.len() as u32);
                    self.state.set_weight(id, weight).expect("validated weight");
                    self.owners.push(Owner {
                        name,
                        weight,
                        id,
                        queued: 0,
                        busy: 0,
                        lost: 0,
                        preemptions: 0,
                        busy_by_hour: Vec::new(),
                    });
                    self.owners.len() - 1
                }
            };
            owner_of.push(index);
        }
        self.origin = rows.first().map_or(Time::ZERO, |r| Time::from_secs(r.0));
        if traces.iter().any(|t| t.tier == Some(Tier::Reserved)) {
            self.state
                .add_reservation(Reservation {
                    id: ReservationId(1),
                    tenant: RESERVED_TENANT,
                    gpu_model: model,
                    gpus: self.config.reserved_gpus,
                    start: Time::ZERO,
                    end: Time(u64::MAX),
                })
                .expect("validated reservation");
        }
        for (_, t, i) in rows {
            let trace = &traces[t];
            let row = &trace.jobs[i];
            let fits = shape_fits(row.gpus, self.config.gpus_per_node) && row.gpus <= self.capacity;
            let mut tier =
                trace.tier.unwrap_or(if preemptible_by_id(&row.id, self.config.preemptible_fraction) {
                    Tier::Preemptible
                } else {
                    Tier::OnDemand
                });
            let deadline = match (tier, self.config.deadline_slack) {
                (Tier::Preemptible, Some(slack)) => {
                    let allowed = (row.duration_s as f64 * 1000.0 * slack).round() as u64;
                    Some(Time::from_secs(row.submit_s) + Span(allowed))
                }
                _ => None,
            };
            if deadline.is_some() && self.config.deadline_policy == DeadlinePolicy::OnDemand {
                tier = Tier::OnDemand;
            }
            let fits = fits
                && match tier {
                    Tier::Reserved => row.gpus <= self.config.reserved_gpus,
                    Tier::OnDemand => row.gpus <= self.capacity - self.config.reserved_gpus,
                    Tier::Preemptible => true,
                };
            if !fits {
                unschedulable += 1;
                continue;
            }
            let index = self.jobs.len();
            let per_node = self.config.gpus_per_node as u32;
            let min_gpus =
                self.config.elastic.filter(|_| tier == Tier::Preemptible && row.gpus > per_node).and_then(
                    |fraction| {
                        let nodes = ((row.gpus as f64 * fraction) / per_node as f64).ceil().max(1.0) as u32;
                        Some(nodes * per_node).filter(|&min| min < row.gpus)
                    },
                );
            self.jobs.push(SimJob {
                tier,
                gpus: row.gpus,
                min_gpus,
                held: 0,
                held_since: Time::ZERO,
                leaving: Vec::new(),
                paused_at: None,
                shrinks: 0,
                grows: 0,
                lost: 0,
                submit: Time::from_secs(row.submit_s),
                duration: row.duration_s * 1000,
                saved: 0,
                attempt: Attempt(0),
                generation: 0,
                run: None,
                drain: None,
                first_start: None,
                done_at: None,
                preemptions: 0,
                deadline,
                promoted: false,
                cost: 0,
                owner: owner_of[t],
            });
            self.push(Time::from_secs(row.submit_s), Event::Arrive(index));
        }
        (unschedulable, self.jobs.len() as u64)
    }

    fn push(&mut self, at: Time, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn id(index: usize) -> JobId {
        JobId(index as u64 + 1)
    }

    /// Handles every event due at `now`; returns how many were arrivals.
    fn process_events_at(&mut self, now: Time) -> u64 {
        let mut arrivals = 0;
        while let Some(&Reverse((at, _, event))) = self.events.peek() {
            if at != now {
                break;
            }
            self.events.pop();
            match event {
                Event::Arrive(i) => {
                    arrivals += 1;
                    let job = &self.jobs[i];
                    let owner = &mut self.owners[job.owner];
                    owner.queued += 1;
                    let tenant = if job.tier == Tier::Reserved { RESERVED_TENANT } else { owner.id };
                    let gpu_model = (job.tier == Tier::Reserved)
                        .then(|| self.state.model_by_name(&self.config.gpu_model).unwrap());
                    let spec = JobSpec {
                        id: Self::id(i),
                        tenant,
                        tier: job.tier,
                        gpus: job.min_gpus.unwrap_or(job.gpus),
                        max_gpus: job.min_gpus.map(|_| job.gpus),
                        gpu_model,
                        submitted_at: now,
                        priority: 0,
                        max_preemptions: None,
                    };
                    self.state.submit(spec).expect("trace jobs are valid");
                    self.plan_deadline_check(i, now);
                }
                Event::DeadlineCheck(i) => self.check_deadline(i, now),
                Event::Complete(i, generation) if self.jobs[i].generation == generation => {
                    self.exit(i, now, true)
                }
                Event::Checkpoint(i, generation) if self.jobs[i].generation == generation => {
                    self.checkpoint(i, now)
                }
                Event::PartExit(i, attempt, node) => self.part_exit(i, now, Attempt(attempt), node),
                Event::DrainExit(i, generation) if self.jobs[i].generation == generation => {
                    let job = &mut self.jobs[i];
                    if job.drain.as_ref().is_some_and(|d| d.saves) {
                        job.saved = job.progress(now);
                        let attempt = job.attempt;
                        self.state.checkpointed(Self::id(i), attempt, now).expect("live attempt");
                    }
                    self.exit(i, now, false);
                }
                _ => {} // for an attempt that has moved on
            }
        }
        arrivals
    }

    /// Plans and applies until the core has nothing more to do at `now`.
    fn settle(&mut self, now: Time) {
        loop {
            let plan = schedule(&self.state, now, &self.core);
            if plan.is_empty() {
                self.state.keep_earmarks(&plan);
                break;
            }
            self.state.apply(&plan).expect("the core's own plan applies");
            for drain in &plan.drains {
                if let DrainReason::Preempted { .. } | DrainReason::FairShare { .. } = drain.reason {
                    self.count_preemption(drain.job.0 as usize - 1, now);
                }
                self.notice(drain.job.0 as usize - 1, now, drain.deadline);
            }
            for shrink in &plan.shrinks {
                self.shrink_notice(shrink.job.0 as usize - 1, now, shrink);
            }
            for placement in &plan.placements {
                let gpus = placement.alloc.iter().map(|(_, mask)| mask.count_ones()).sum();
                self.start(placement.job.0 as usize - 1, now, placement.attempt, gpus);
            }
            for grow in &plan.grows {
                let gpus = grow.alloc.iter().map(|(_, mask)| mask.count_ones()).sum();
                self.grow(grow.job.0 as usize - 1, now, gpus);
            }
            // Exits due right now (no notice, or an instant save) free GPUs
            // that this same instant can use.
            self.process_events_at(now);
        }
    }

    /// Under policy `promote`, when job `i`, queued from `now`, must be
    /// judged: the last instant it could start and still finish with the
    /// server's margin (`ebb_scheduler::deadline`, the server's rule). The
    /// simulator knows the rest exactly; the server estimates it from the
    /// job's progress reports.
    fn plan_deadline_check(&mut self, i: usize, now: Time) {
        let job = &self.jobs[i];
        let Some(deadline) = job.deadline else { return };
        if self.config.deadline_policy != DeadlinePolicy::Promote || job.promoted || job.done_at.is_some() {
            return;
        }
        let overhead = if job.attempt.0 > 0 { self.config.restart_overhead.0 } else { 0 };
        let needed = job.duration - job.saved + overhead;
        let due =
            ebb_scheduler::deadline::latest_start(Span(needed), deadline, self.core.drain_window).max(now);
        self.push(due, Event::DeadlineCheck(i));
    }

    /// A queued deadline job whose slack is gone is promoted to on-demand;
    /// a running one is left to run (it progresses at its rate, so its
    /// judgement changes only if it is preempted, which plans a new check).
    fn check_deadline(&mut self, i: usize, now: Time) {
        let job = &self.jobs[i];
        if job.promoted || job.done_at.is_some() || job.run.is_some() || job.tier != Tier::Preemptible {
            return;
        }
        if self.state.job(Self::id(i)).is_some_and(|j| j.phase == ebb_scheduler::Phase::Queued) {
            self.state.promote(Self::id(i), now).expect("a queued preemptible job is promoted");
            let job = &mut self.jobs[i];
            job.tier = Tier::OnDemand;
            job.promoted = true;
        }
    }

    fn count_preemption(&mut self, i: usize, now: Time) {
        self.preemptions += 1;
        let hour = self.hour(now);
        bump(&mut self.preemptions_by_hour, hour, |c| *c += 1);
        let job = &mut self.jobs[i];
        if job.preemptions > 0 {
            self.repeat_preemptions += 1;
            let ran = now.saturating_since(job.run.as_ref().expect("a victim runs").start);
            if ran < QUICK_REPEAT {
                self.quick_repeat_preemptions += 1;
            }
        }
        job.preemptions += 1;
        self.owners[job.owner].preemptions += 1;
    }

    /// Attempt `attempt` of job `i` starts on `gpus` GPUs.
    fn start(&mut self, i: usize, now: Time, attempt: Attempt, gpus: u32) {
        let overhead = if attempt.0 > 1 { self.config.restart_overhead.0 } else { 0 };
        let job = &mut self.jobs[i];
        self.owners[job.owner].queued -= 1;
        job.attempt = attempt;
        job.first_start.get_or_insert(now);
        (job.held, job.held_since) = (gpus, now);
        self.stretch(i, now, overhead, gpus);
    }

    /// Job `i` works from `now` on `gpus` GPUs, from what it has saved,
    /// after `overhead`: its completion and its next checkpoint are due.
    fn stretch(&mut self, i: usize, now: Time, overhead: u64, gpus: u32) {
        let interval = self.config.checkpoint_interval;
        let job = &mut self.jobs[i];
        job.generation += 1;
        job.paused_at = None;
        job.run = Some(Running { start: now, overhead, base: job.saved, gpus });
        let (generation, finish) = (job.generation, job.finish_time());
        let first_checkpoint = (job.tier == Tier::Preemptible)
            .then_some(interval)
            .flatten()
            .map(|every| now + Span(overhead) + every)
            .filter(|at| *at < finish);
        self.push(finish, Event::Complete(i, generation));
        if let Some(at) = first_checkpoint {
            self.push(at, Event::Checkpoint(i, generation));
        }
    }

    fn checkpoint(&mut self, i: usize, now: Time) {
        let job = &mut self.jobs[i];
        if job.drain.as_ref().is_some_and(|d| d.stopped_at.is_some()) {
            return; // not working any more
        }
        job.saved = job.progress(now);
        let (attempt, generation, finish) = (job.attempt, job.generation, job.finish_time());
        self.state.checkpointed(Self::id(i), attempt, now).expect("live attempt");
        let every = self.config.checkpoint_interval.expect("periodic checkpoints configured");
        if now + every < finish {
            self.push(now + every, Event::Checkpoint(i, generation));
        }
    }

    /// A drain notice reaches job `i` at `now`, to be killed at `deadline`.
    fn notice(&mut self, i: usize, now: Time, deadline: Time) {
        let window = deadline.saturating_since(now);
        let save = self.config.drain_checkpoint;
        let job = &mut self.jobs[i];
        let remaining = job.duration - job.progress(now);
        // A job saving for a shrink works no more: it finishes only if restarted.
        let finishes_in_window = job.paused_at.is_none() && job.finish_time() <= deadline;
        let mut draining = Draining { notice: now, stopped_at: None, saves: false };
        let exit_at = match (self.config.notice, save) {
            (NoticeMode::None, _) => {
                draining.stopped_at = Some(now);
                Some(now)
            }
            // Finishing beats saving: let it finish (its Complete event stands).
            _ if finishes_in_window && save.is_none_or(|s| remaining <= s.0) => None,
            (NoticeMode::Drain, Some(save)) if save <= window => {
                draining.stopped_at = Some(now);
                draining.saves = true;
                Some(now + save)
            }
            (NoticeMode::Drain, Some(_)) => {
                // Tries to save, runs out of window, is killed.
                draining.stopped_at = Some(now);
                Some(deadline)
            }
            (NoticeMode::Drain, None) => Some(deadline), // works on until killed
        };
        let stops = draining.stopped_at.is_some();
        job.drain = Some(draining);
        if stops {
            job.generation += 1; // its completion and checkpoints are off
        }
        if let Some(at) = exit_at {
            let generation = job.generation;
            self.push(at, Event::DrainExit(i, generation));
        }
    }

    fn exit(&mut self, i: usize, now: Time, completed: bool) {
        let job = &mut self.jobs[i];
        let run = job.run.as_ref().expect("exit of a running job");
        let ran = now.saturating_since(run.start).0;
        self.restart += run.gpus as u128 * run.overhead.min(ran) as u128;
        // Parts leaving go with it, each drained since its own notice.
        let leaving: u32 = job.leaving.iter().map(|l| l.gpus).sum();
        for part in job.leaving.drain(..) {
            self.drain += part.gpus as u128 * now.saturating_since(part.notice).0 as u128;
        }
        if let Some(d) = &job.drain {
            self.drain += (job.held - leaving) as u128 * now.saturating_since(d.notice).0 as u128;
        }
        let owner = &mut self.owners[job.owner];
        if !completed {
            let lost = job.gpus as u128 * (job.progress(now) - job.saved) as u128;
            self.lost += lost;
            job.lost += lost;
            owner.lost += lost;
            owner.queued += 1;
        } else {
            job.done_at = Some(now);
        }
        let attempt = job.attempt;
        job.run = None;
        job.drain = None;
        job.paused_at = None;
        job.generation += 1;
        let kind = if completed { ExitKind::Completed } else { ExitKind::Failed { requeue: false } };
        let effect = self.state.exited(Self::id(i), attempt, kind).expect("live attempt");
        self.meter(i, now);
        self.jobs[i].held = 0;
        debug_assert!(
            matches!(effect, ExitEffect::Finished | ExitEffect::Requeued { preempted: true }),
            "{effect:?}"
        );
        if !completed {
            self.plan_deadline_check(i, now);
        }
    }

    /// Meters what job `i` held since it was last metered, up to `now`:
    /// busy GPU-time by tier, hour and tenant, its cost, and its usage for
    /// fair share.
    fn meter(&mut self, i: usize, now: Time) {
        let hour_origin = self.origin;
        let model = self.state.model_by_name(&self.config.gpu_model).expect("nodes added");
        let job = &mut self.jobs[i];
        let (held, since) = (job.held, std::mem::replace(&mut job.held_since, now));
        let gpus = held as u128;
        let ran = now.saturating_since(since).0;
        let tier = job.tier.rank() as usize;
        self.busy[tier] += gpus * ran as u128;
        job.cost += MicroUsd::for_gpu_millis(self.rates[tier], gpus * ran as u128).0;
        add_interval(&mut self.busy_by_hour, hour_origin, tier, held, since, now);
        let owner = &mut self.owners[job.owner];
        owner.busy += gpus * ran as u128;
        add_owner_interval(&mut owner.busy_by_hour, hour_origin, held, since, now);
        let tenant = if job.tier == Tier::Reserved { RESERVED_TENANT } else { owner.id };
        if let Some(until) = self.config.window_until {
            let end = now.min(Time::from_secs(until));
            self.busy_in_window[tier] += gpus * end.saturating_since(since).0 as u128;
        }
        self.state
            .record_usage(tenant, job.tier, model, held, (since, now), now)
            .expect("the model is known");
    }

    fn hour(&self, t: Time) -> usize {
        (t.saturating_since(self.origin).0 / HOUR_MS) as usize
    }

    /// Records queue lengths at every hour boundary up to `now`.
    fn sample_queues(&mut self, now: Time) {
        let hour = self.hour(now) as u64;
        let from = self.last_sampled_hour.map_or(0, |h| h + 1);
        if from > hour {
            return;
        }
        let queued = [Tier::Reserved, Tier::OnDemand, Tier::Preemptible].map(|t| self.state.queued(t));
        let busy = self.owners.len() > 1 && self.owners.iter().all(|o| o.queued > 0);
        for h in from..=hour {
            bump(&mut self.queued_by_hour, h as usize, |q| *q = queued);
            bump(&mut self.busy_hours, h as usize, |b| *b = busy);
        }
        self.last_sampled_hour = Some(hour);
    }
}

pub(crate) fn policy_name(policy: VictimPolicy) -> String {
    match policy {
        VictimPolicy::LostWork => "lost-work".into(),
        VictimPolicy::Youngest => "youngest".into(),
        VictimPolicy::Oldest => "oldest".into(),
        VictimPolicy::FewestGpus => "fewest-gpus".into(),
        VictimPolicy::Random { seed } => format!("random:{seed}"),
    }
}

/// Applies `f` to slot `i`, growing the vector with defaults as needed.
fn bump<T: Default + Clone>(v: &mut Vec<T>, i: usize, f: impl FnOnce(&mut T)) {
    if v.len() <= i {
        v.resize(i + 1, T::default());
    }
    f(&mut v[i]);
}

/// Calls `add(hour, ms)` for each hour [start, end) overlaps, with the
/// milliseconds of it in that hour.
fn each_hour(origin: Time, start: Time, end: Time, mut add: impl FnMut(usize, u128)) {
    let (mut from, to) = (start.saturating_since(origin).0, end.saturating_since(origin).0);
    while from < to {
        let hour = from / HOUR_MS;
        let until = ((hour + 1) * HOUR_MS).min(to);
        add(hour as usize, (until - from) as u128);
        from = until;
    }
}

/// Adds `gpus` busy over [start, end) to a tenant's hourly buckets.
fn add_owner_interval(by_hour: &mut Vec<u128>, origin: Time, gpus: u32, start: Time, end: Time) {
    each_hour(origin, start, end, |hour, ms| bump(by_hour, hour, |b| *b += gpus as u128 * ms));
}

/// Adds `gpus` busy over [start, end) to the hourly buckets of `tier`.
fn add_interval(by_hour: &mut Vec<[u128; 3]>, origin: Time, tier: usize, gpus: u32, start: Time, end: Time) {
    each_hour(origin, start, end, |hour, ms| bump(by_hour, hour, |b| b[tier] += gpus as u128 * ms));
}
