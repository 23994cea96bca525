//! Prometheus metrics at `/metrics`, computed from the writer's state at
//! scrape time.

use std::collections::BTreeMap;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub submitted: u64,
    pub preempted: u64,
    pub checkpoints: u64,
    pub lost_gpu_seconds: f64,
    pub passes: u64,
    pub pass_seconds: f64,
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub counters: Counters,
    pub jobs: BTreeMap<(&'static str, &'static str), u64>,
    pub gpus_in_use: BTreeMap<&'static str, u64>,
    pub gpus_total: u64,
    pub nodes: BTreeMap<&'static str, u64>,
    pub queued: u64,
}

type Labels = Vec<(String, String)>;

pub fn render(s: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("ebb");
    let jobs = Family::<Labels, Gauge>::default();
    for ((tier, state), n) in &s.jobs {
        jobs.get_or_create(&vec![("tier".into(), tier.to_string()), ("state".into(), state.to_string())])
            .set(*n as i64);
    }
    registry.register("jobs", "Jobs by tier and state", jobs);
    let gpus = Family::<Labels, Gauge>::default();
    for (tier, n) in &s.gpus_in_use {
        gpus.get_or_create(&vec![("tier".into(), tier.to_string())]).set(*n as i64);
    }
    registry.register("gpus_in_use", "GPUs held by live attempts, by tier", gpus);
    let total = Gauge::<i64>::default();
    total.set(s.gpus_total as i64);
    registry.register("gpus", "GPUs on nodes that take work", total);
    let nodes = Family::<Labels, Gauge>::default();
    for (status, n) in &s.nodes {
        nodes.get_or_create(&vec![("status".into(), status.to_string())]).set(*n as i64);
    }
    registry.register("nodes", "Nodes by status", nodes);
    let queued = Gauge::<i64>::default();
    queued.set(s.queued as i64);
    registry.register("queued_jobs", "Jobs waiting to start", queued);
    let counter = |v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        c
    };
    registry.register(
        "submissions",
        "Jobs submitted since the server started",
        counter(s.counters.submitted),
    );
    registry.register(
        "preemptions",
        "Attempts preempted since the server started",
        counter(s.counters.preempted),
    );
    registry.register(
        "checkpoints",
        "Checkpoints reported by attempts since the server started",
        counter(s.counters.checkpoints),
    );
    let lost = Counter::<f64>::default();
    lost.inc_by(s.counters.lost_gpu_seconds);
    registry.register(
        "lost_gpu_seconds",
        "GPU-seconds of work lost to preemptions and lost nodes since the server started",
        lost,
    );
    registry.register(
        "scheduling_passes",
        "Plans applied since the server started",
        counter(s.counters.passes),
    );
    let seconds = Counter::<f64>::default();
    seconds.inc_by(s.counters.pass_seconds);
    registry.register("scheduling_seconds", "Time spent planning", seconds);
    let mut text = String::new();
    encode(&mut text, &registry).expect("metrics encode into a string");
    text
}
