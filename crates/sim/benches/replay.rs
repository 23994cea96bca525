//! Wall time of whole replays: cluster08 (13,047 jobs) as the issue's
//! yardstick, alone and with half its jobs preemptible under contention.
//!
//! Run with `cargo bench -p ebb-sim`.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use ebb_core::Span;
use ebb_sim::{run, SimConfig, Trace};

fn cluster08() -> Trace {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/itp/cluster08.csv");
    Trace::load(&path, None).expect("the ITP cluster08 trace in traces/itp")
}

fn replay(c: &mut Criterion) {
    let traces = [cluster08()];
    let mut group = c.benchmark_group("replay_cluster08");
    group.sample_size(10);
    let on_demand = SimConfig { nodes: 16, ..SimConfig::default() };
    group.bench_function("on_demand_16_nodes", |b| b.iter(|| run(&on_demand, &traces, &mut |_| {}).unwrap()));
    let contended = SimConfig {
        nodes: 12,
        preemptible_fraction: 0.5,
        checkpoint_interval: Some(Span::from_secs(3600)),
        drain_checkpoint: Some(Span::from_secs(60)),
        ..SimConfig::default()
    };
    group.bench_function("half_preemptible_12_nodes", |b| {
        b.iter(|| run(&contended, &traces, &mut |_| {}).unwrap())
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
