//! Which jobs a preemptor drains, as data: each case is a timeline of jobs
//! started and checkpoints taken on a small cluster, then one on-demand
//! job; the case says which of the running jobs it drains and the
//! GPU-seconds of work they lose. One `check` runs them all.

use std::collections::BTreeSet;

use crate::common::Cluster;
use ebb_core::{JobId, Tier};
use ebb_scheduler::Phase;

/// A job running when the preemptor comes: started and last checkpointed
/// that many seconds before it.
struct Running {
    tier: Tier,
    gpus: u32,
    started_ago_s: u64,
    checkpoint_ago_s: Option<u64>,
}

const fn preemptible(gpus: u32, started_ago_s: u64, checkpoint_ago_s: Option<u64>) -> Running {
    Running { tier: Tier::Preemptible, gpus, started_ago_s, checkpoint_ago_s }
}

struct Case {
    name: &'static str,
    nodes: u32,
    gpus_per_node: u8,
    /// Started in this order; jobs started at once are placed in it.
    running: &'static [Running],
    preemptor_gpus: u32,
    /// Indices into `running`.
    victims: &'static [usize],
    lost_gpu_s: u128,
}

const CASES: &[Case] = &[
    Case {
        name: "the victim is the one that checkpointed most recently",
        nodes: 2,
        gpus_per_node: 4,
        running: &[preemptible(4, 660, None), preemptible(4, 660, Some(60))],
        preemptor_gpus: 4,
        victims: &[1],
        lost_gpu_s: 4 * 60,
    },
    Case {
        name: "without checkpoints the youngest loses least",
        nodes: 2,
        gpus_per_node: 4,
        running: &[preemptible(4, 600, None), preemptible(4, 60, None)],
        preemptor_gpus: 4,
        victims: &[1],
        lost_gpu_s: 4 * 60,
    },
    Case {
        name: "a checkpoint makes an old job cheaper than a young one",
        nodes: 2,
        gpus_per_node: 4,
        running: &[preemptible(4, 600, Some(10)), preemptible(4, 60, None)],
        preemptor_gpus: 4,
        victims: &[0],
        lost_gpu_s: 4 * 10,
    },
    Case {
        name: "fewer victims break a tie in lost work",
        nodes: 2,
        gpus_per_node: 4,
        running: &[preemptible(2, 100, None), preemptible(2, 100, None), preemptible(4, 100, None)],
        preemptor_gpus: 4,
        victims: &[2],
        lost_gpu_s: 4 * 100,
    },
    Case {
        name: "two small victims when together they lose less than one large",
        nodes: 2,
        gpus_per_node: 4,
        running: &[preemptible(4, 300, None), preemptible(2, 100, None), preemptible(2, 100, None)],
        preemptor_gpus: 4,
        victims: &[1, 2],
        lost_gpu_s: 2 * 100 + 2 * 100,
    },
    Case {
        name: "only what the preemptor needs is drained, the cheapest that fits",
        nodes: 2,
        gpus_per_node: 8,
        running: &[preemptible(8, 100, None), preemptible(4, 100, None), preemptible(4, 50, None)],
        preemptor_gpus: 4,
        victims: &[2],
        lost_gpu_s: 4 * 50,
    },
    Case {
        name: "on-demand work is never drained, so nothing is when the rest would not make room",
        nodes: 1,
        gpus_per_node: 8,
        running: &[
            Running { tier: Tier::OnDemand, gpus: 4, started_ago_s: 600, checkpoint_ago_s: None },
            preemptible(4, 60, None),
        ],
        preemptor_gpus: 8,
        victims: &[],
        lost_gpu_s: 0,
    },
];

enum Step {
    Start(usize),
    Checkpoint(usize),
}

fn check(case: &Case) {
    let mut c = Cluster::new(case.nodes, case.gpus_per_node);
    let mut timeline: Vec<(u64, Step)> = Vec::new();
    for (i, job) in case.running.iter().enumerate() {
        timeline.push((job.started_ago_s, Step::Start(i)));
        if let Some(ago) = job.checkpoint_ago_s {
            assert!(ago < job.started_ago_s, "{}: a checkpoint before its start", case.name);
            timeline.push((ago, Step::Checkpoint(i)));
        }
    }
    // Earliest first; at one instant, starts in the case's order.
    timeline.sort_by_key(|(ago, step)| (std::cmp::Reverse(*ago), matches!(step, Step::Checkpoint(_))));
    let mut ids: Vec<Option<JobId>> = vec![None; case.running.len()];
    let mut ago = timeline.first().map_or(0, |(ago, _)| *ago);
    for (at, step) in timeline {
        c.advance(ago - at);
        ago = at;
        match step {
            Step::Start(i) => {
                let job = &case.running[i];
                let id = c.submit(job.tier, job.gpus);
                c.step();
                assert_eq!(c.phase(id), Some(Phase::Running), "{}: job {i} did not start", case.name);
                ids[i] = Some(id);
            }
            Step::Checkpoint(i) => c.checkpoint(ids[i].expect("started")),
        }
    }
    c.advance(ago);
    c.submit(Tier::OnDemand, case.preemptor_gpus);
    let plan = c.step();
    let drained: BTreeSet<JobId> = plan.drains.iter().map(|d| d.job).collect();
    let expected: BTreeSet<JobId> = case.victims.iter().map(|i| ids[*i].expect("started")).collect();
    assert_eq!(drained, expected, "{}", case.name);
    let lost: u128 = plan.preemptions.iter().map(|p| p.lost_gpu_ms).sum();
    assert_eq!(lost, case.lost_gpu_s * 1000, "{}: work lost", case.name);
}

#[test]
fn each_preemptor_drains_the_victims_that_lose_least() {
    for case in CASES {
        check(case);
    }
}
