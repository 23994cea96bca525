//! Scheduling core at scale: 10,000 nodes x 8 GPUs with 100,000 queued jobs.
//!
//! Each of `fill` and `steady` runs with one tenant and with the jobs spread
//! over 1,000 tenants, whose order fair share keeps.
//!
//! * `fill`: an empty cluster and 100,000 queued jobs; passes until nothing
//!   more starts. Placements per second of one big pass.
//! * `steady`: a full cluster of preemptible work with 100,000 jobs queued
//!   behind it; each event is either a job finishing (its GPUs go to the
//!   queue) or an on-demand arrival that must preempt (decision, drain,
//!   victims exit, preemptor starts from its hold). Placements per second
//!   (those made while timed), preemption decisions included.
//! * `preemption decision`: wall time of one `schedule` call that has to
//!   choose victims in that full cluster, p50 / p99 / max over many.
//!
//! Run with `cargo bench -p ebb-scheduler`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use ebb_core::{JobId, Span, TenantId, Tier, Time};
use ebb_scheduler::*;

const NODES: u32 = 10_000;
const GPUS_PER_NODE: u8 = 8;
const QUEUED: u64 = 100_000;

/// A deterministic pseudo-random stream (no `rand` in the core's deps).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn size(&mut self) -> u32 {
        [1, 1, 1, 2, 2, 4, 8][(self.next() % 7) as usize]
    }
}

struct World {
    state: State,
    config: Config,
    now: Time,
    next_id: u64,
    running: Vec<JobId>,
    where_running: HashMap<JobId, usize>,
    rng: Lcg,
    /// Preemption decisions made (a victim set chosen and drained).
    preemptions: usize,
    /// Jobs are spread over this many tenants (fair share orders them).
    tenants: u32,
}

impl World {
    fn new() -> World {
        let mut state = State::new();
        for i in 0..NODES {
            let spec = NodeSpec {
                name: format!("node-{i:05}"),
                gpu_model: "H100-80GB".into(),
                gpus: GPUS_PER_NODE,
                labels: BTreeMap::new(),
            };
            state.add_node(spec, Time::ZERO).unwrap();
        }
        World {
            state,
            config: Config::default(),
            now: Time::from_secs(1),
            next_id: 1,
            running: Vec::new(),
            where_running: HashMap::new(),
            rng: Lcg(42),
            preemptions: 0,
            tenants: 1,
        }
    }

    fn submit(&mut self, tier: Tier, gpus: u32) -> JobId {
        let id = JobId(self.next_id);
        self.next_id += 1;
        let spec = JobSpec {
            id,
            tenant: TenantId(1 + (id.0 % self.tenants as u64) as u32),
            tier,
            gpus,
            max_gpus: None,
            gpu_model: None,
            submitted_at: self.now,
            priority: 0,
            max_preemptions: None,
        };
        self.state.submit(spec).unwrap();
        id
    }

    /// One pass, applied; returns (placements, preemptions).
    fn step(&mut self) -> Plan {
        let plan = schedule(&self.state, self.now, &self.config);
        self.state.apply(&plan).unwrap();
        for p in &plan.placements {
            self.where_running.insert(p.job, self.running.len());
            self.running.push(p.job);
        }
        plan
    }

    fn exit(&mut self, job: JobId, kind: ExitKind) {
        let attempt = self.state.job(job).unwrap().attempt;
        self.state.exited(job, attempt, kind).unwrap();
        let i = self.where_running.remove(&job).unwrap();
        self.running.swap_remove(i);
        if let Some(moved) = self.running.get(i) {
            self.where_running.insert(*moved, i);
        }
    }

    /// A cluster full of preemptible work with staggered checkpoints, and
    /// `QUEUED` preemptible jobs waiting behind it.
    fn full(tenants: u32) -> World {
        let mut w = World::new();
        w.tenants = tenants;
        let capacity = NODES * GPUS_PER_NODE as u32;
        let mut submitted = 0;
        while submitted < capacity {
            let gpus = w.rng.size();
            w.submit(Tier::Preemptible, gpus);
            submitted += gpus;
        }
        while !w.step().placements.is_empty() {}
        for i in 0..w.running.len() {
            let job = w.running[i];
            w.now = w.now + Span::from_millis(1 + w.rng.next() % 50);
            let attempt = w.state.job(job).unwrap().attempt;
            w.state.checkpointed(job, attempt, w.now).unwrap();
        }
        for _ in 0..QUEUED {
            let gpus = w.rng.size();
            w.submit(Tier::Preemptible, gpus);
        }
        w.step();
        w
    }

    /// One event of the steady state; returns the placements it caused.
    fn event(&mut self) -> usize {
        self.now = self.now + Span::from_millis(100);
        if self.rng.next() % 10 < 7 {
            let i = (self.rng.next() as usize) % self.running.len();
            let job = self.running[i];
            if self.state.job(job).unwrap().phase == Phase::Draining {
                return 0;
            }
            self.exit(job, ExitKind::Completed);
            // Keep the backlog at its size: a finished job is replaced.
            let gpus = self.rng.size();
            self.submit(Tier::Preemptible, gpus);
            self.step().placements.len()
        } else {
            let gpus = self.rng.size();
            self.submit(Tier::OnDemand, gpus);
            let plan = self.step();
            self.preemptions += plan.preemptions.len();
            let mut placed = plan.placements.len();
            for drain in &plan.drains {
                self.exit(drain.job, ExitKind::Failed { requeue: false });
            }
            if !plan.drains.is_empty() {
                placed += self.step().placements.len();
            }
            placed
        }
    }
}

fn bench_fill(c: &mut Criterion) {
    for (tenants, name) in [(1, "10k_nodes_100k_queued"), (1_000, "10k_nodes_100k_queued_1000_tenants")] {
        let queued = || {
            let mut w = World::new();
            w.tenants = tenants;
            for _ in 0..QUEUED {
                let gpus = w.rng.size();
                w.submit(Tier::Preemptible, gpus);
            }
            w
        };
        let mut probe = queued();
        let mut placed = 0;
        loop {
            let n = probe.step().placements.len();
            if n == 0 {
                break;
            }
            placed += n;
        }
        drop(probe);
        let mut group = c.benchmark_group("fill");
        group.sample_size(10);
        group.throughput(Throughput::Elements(placed as u64));
        group.bench_function(BenchmarkId::new(name, "placements"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut w = queued();
                    let start = Instant::now();
                    while !w.step().placements.is_empty() {}
                    total += start.elapsed();
                }
                total
            })
        });
        group.finish();
    }
}

/// The steady state with the backlog of one tenant, and spread over
/// 1,000 tenants whose order fair share keeps. An iteration runs events
/// until it has made `PLACEMENTS` placements (what one makes past them
/// counts toward the next), so the throughput is the placements made, not
/// a count taken from another run: how many placements an event makes
/// depends on the order and drifts as the world does.
fn bench_steady(c: &mut Criterion) {
    const PLACEMENTS: usize = 1_600;
    for (tenants, name) in [(1, "10k_nodes_100k_queued"), (1_000, "10k_nodes_100k_queued_1000_tenants")] {
        let mut w = World::full(tenants);
        let mut surplus = 0;
        let (mut events, mut made) = (0u64, 0usize);
        let mut group = c.benchmark_group("steady");
        group.sample_size(10);
        group.throughput(Throughput::Elements(PLACEMENTS as u64));
        group.bench_function(BenchmarkId::new(name, "placements_with_preemption"), |b| {
            b.iter(|| {
                let mut placed = surplus;
                while placed < PLACEMENTS {
                    let n = w.event();
                    placed += n;
                    made += n;
                    events += 1;
                }
                surplus = placed - PLACEMENTS;
            })
        });
        group.finish();
        let per_event = made as f64 / events.max(1) as f64;
        let decisions = w.preemptions as f64 * 1000.0 / events.max(1) as f64;
        println!(
            "steady state, {tenants} tenants: {events} events: {per_event:.3} placements an event, {decisions:.0} preemption decisions a thousand"
        );
    }
}

fn preemption_latency() {
    let mut w = World::full(1);
    let mut samples = Vec::new();
    for _ in 0..5_000 {
        w.now = w.now + Span::from_millis(100);
        let gpus = w.rng.size();
        w.submit(Tier::OnDemand, gpus);
        let start = Instant::now();
        let plan = schedule(&w.state, w.now, &w.config);
        let took = start.elapsed();
        assert_eq!(plan.preemptions.len(), 1, "the on-demand job must preempt");
        samples.push(took);
        w.state.apply(&plan).unwrap();
        for p in &plan.placements {
            w.where_running.insert(p.job, w.running.len());
            w.running.push(p.job);
        }
        for drain in &plan.drains {
            w.exit(drain.job, ExitKind::Failed { requeue: false });
        }
        w.step();
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "preemption decision (10k nodes x 8 GPUs, 100k queued, {} decisions): p50 {:?}  p99 {:?}  max {:?}",
        samples.len(),
        pct(0.50),
        pct(0.99),
        samples.last().unwrap()
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench_fill(&mut c);
    bench_steady(&mut c);
    c.final_summary();
    if std::env::args().all(|a| a != "--list") {
        preemption_latency();
    }
}
