//! Property tests: the invariants hold after every step of random clusters
//! and job streams, the same input gives the same plans, and the indexed
//! victim search finds the same cost as brute force, settling jobs spared
//! as brute force spares them.

mod common;

use std::collections::BTreeMap;

use common::Cluster;
use ebb_core::{Attempt, JobId, NodeId, ReservationId, Span, TenantId, Tier, Time};
use ebb_scheduler::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Submit { tier: Tier, gpus: u32, tenant: u32 },
    SubmitElastic { nodes: u32, more: u32, tenant: u32 },
    PartLeft { pick: usize },
    Exit { pick: usize, kind: u8 },
    Checkpoint { pick: usize },
    Advance { secs: u64 },
    Cancel { pick: usize },
    DrainNode { node: u32 },
    UndrainNode { node: u32 },
    SetHealthy { node: u32, healthy: bool },
    Reclaim { gpus: u32 },
    ReleaseReclaim,
    Heartbeats { skip: u32 },
    Rejoin { node: u32 },
    GpuOut { node: u32, gpu: u8 },
    GpusBack { node: u32 },
    Step,
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![1 => Just(Tier::Reserved), 2 => Just(Tier::OnDemand), 4 => Just(Tier::Preemptible)]
}

fn op() -> impl Strategy<Value = Op> {
    op_weighted(3)
}

/// Ops with elastic jobs and their parts' exits `elastic` times as likely
/// as in `op()`'s first cut.
fn op_weighted(elastic: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (tier(), prop_oneof![Just(1u32), Just(2), Just(3), Just(4), Just(8), Just(16)], 0u32..3)
            .prop_map(|(tier, gpus, tenant)| Op::Submit { tier, gpus, tenant }),
        elastic => (1u32..3, 1u32..3, 0u32..3)
            .prop_map(|(nodes, more, tenant)| Op::SubmitElastic { nodes, more, tenant }),
        elastic => any::<usize>().prop_map(|pick| Op::PartLeft { pick }),
        3 => (any::<usize>(), 0u8..4).prop_map(|(pick, kind)| Op::Exit { pick, kind }),
        2 => any::<usize>().prop_map(|pick| Op::Checkpoint { pick }),
        3 => (1u64..200).prop_map(|secs| Op::Advance { secs }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (0u32..8).prop_map(|node| Op::DrainNode { node }),
        1 => (0u32..8).prop_map(|node| Op::UndrainNode { node }),
        1 => (0u32..8, any::<bool>()).prop_map(|(node, healthy)| Op::SetHealthy { node, healthy }),
        1 => (1u32..12).prop_map(|gpus| Op::Reclaim { gpus }),
        1 => Just(Op::ReleaseReclaim),
        4 => (0u32..8).prop_map(|skip| Op::Heartbeats { skip }),
        1 => (0u32..8).prop_map(|node| Op::Rejoin { node }),
        1 => (0u32..8, 0u8..8).prop_map(|(node, gpu)| Op::GpuOut { node, gpu }),
        1 => (0u32..8).prop_map(|node| Op::GpusBack { node }),
        8 => Just(Op::Step),
    ]
}

fn pick<T: Copy>(items: &[T], i: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[i % items.len()])
}

/// Runs `ops` on a fresh cluster, checking invariants after every op, and
/// returns every plan made.
fn run(
    nodes: u32,
    gpus_per_node: u8,
    a100_nodes: u32,
    policy: VictimPolicy,
    min_runtime: Span,
    restart_cost: Span,
    ops: &[Op],
) -> Vec<Plan> {
    let mut c = Cluster::new(nodes, gpus_per_node);
    // A second GPU model: jobs that name no model may land on either.
    let mut specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec {
            name: format!("node-{i}"),
            gpu_model: "H100".into(),
            gpus: gpus_per_node,
            labels: BTreeMap::new(),
        })
        .collect();
    for i in 0..a100_nodes {
        let spec = NodeSpec {
            name: format!("a100-{i}"),
            gpu_model: "A100".into(),
            gpus: 4,
            labels: BTreeMap::new(),
        };
        c.state.add_node(spec.clone(), Time::ZERO).unwrap();
        specs.push(spec);
    }
    let all = specs.len() as u32;
    c.config.victim_policy = policy;
    c.config.min_runtime = min_runtime;
    c.config.restart_cost = restart_cost;
    c.config.heartbeat_timeout = Some(Span::from_secs(600));
    c.config.drain_window = Span::from_secs(120);
    c.state
        .add_reservation(Reservation {
            id: ReservationId(1),
            tenant: TenantId(1),
            gpu_model: c.model(),
            gpus: gpus_per_node as u32,
            start: Time::ZERO,
            end: Time::from_secs(5_000),
        })
        .unwrap();
    for op in ops {
        let live = |c: &Cluster, phases: &[Phase]| -> Vec<JobId> {
            c.state.jobs().filter(|j| phases.contains(&j.phase)).map(|j| j.spec.id).collect()
        };
        match *op {
            Op::Submit { tier, gpus, tenant } => {
                let _ = c.submit_as(tier, gpus.min(nodes * gpus_per_node as u32), TenantId(tenant));
            }
            Op::SubmitElastic { nodes: fewest, more, tenant } => {
                let most = (fewest + more).min(nodes.max(2));
                if fewest < most {
                    let per = gpus_per_node as u32;
                    let _ = c.submit_elastic(fewest * per, most * per, TenantId(tenant));
                }
            }
            Op::PartLeft { pick: i } => {
                let leaving: Vec<(JobId, NodeId)> = c
                    .state
                    .jobs()
                    .filter_map(|j| Some((j.spec.id, j.run.as_ref()?)))
                    .flat_map(|(id, run)| run.leaving().iter().map(move |(n, _)| (id, *n)))
                    .collect();
                if let Some((job, node)) = pick(&leaving, i) {
                    c.part_left(job, node);
                }
            }
            Op::Exit { pick: i, kind } => {
                if let Some(job) = pick(&live(&c, &[Phase::Running, Phase::Draining]), i) {
                    let kind = match kind {
                        0 => ExitKind::Completed,
                        1 => ExitKind::Failed { requeue: true },
                        2 => ExitKind::Failed { requeue: false },
                        _ => ExitKind::Cancelled,
                    };
                    c.exit(job, kind);
                }
            }
            Op::Checkpoint { pick: i } => {
                if let Some(job) = pick(&live(&c, &[Phase::Running, Phase::Draining]), i) {
                    c.checkpoint(job);
                }
            }
            Op::Advance { secs } => c.advance(secs),
            Op::Cancel { pick: i } => {
                if let Some(job) = pick(&live(&c, &[Phase::Queued, Phase::Holding]), i) {
                    c.state.cancel(job).unwrap();
                }
            }
            Op::DrainNode { node } => {
                let _ = c.state.drain_node(NodeId(node % all));
            }
            Op::UndrainNode { node } => {
                let _ = c.state.undrain_node(NodeId(node % all));
            }
            Op::SetHealthy { node, healthy } => {
                c.state.set_healthy(NodeId(node % all), healthy).unwrap();
            }
            Op::Reclaim { gpus } => {
                c.state.reclaim(c.model(), gpus).unwrap();
            }
            Op::ReleaseReclaim => c.state.release_reclaim(c.model()).unwrap(),
            Op::Heartbeats { skip } => {
                for n in 0..all {
                    if n != skip {
                        let _ = c.state.heartbeat(NodeId(n), c.now);
                    }
                }
            }
            Op::Rejoin { node } => {
                let _ = c.state.add_node(specs[(node % all) as usize].clone(), c.now);
            }
            Op::GpuOut { node, gpu } => {
                let node = NodeId(node % all);
                let gpu = gpu % c.state.nodes()[node.0 as usize].gpus;
                let on_it: Vec<JobId> = c
                    .state
                    .jobs()
                    .filter(|j| {
                        j.run.as_ref().is_some_and(|r| {
                            !r.is_leaving(node)
                                && r.alloc.iter().any(|(n, m)| *n == node && m & (1 << gpu) != 0)
                        })
                    })
                    .map(|j| j.spec.id)
                    .collect();
                let (mut requeued, _) = c.state.take_gpus_out(node, 1 << gpu).unwrap();
                requeued.sort_unstable();
                // A part leaving there is gone, and its job goes on.
                assert_eq!(requeued, on_it, "the attempts on GPU {gpu} of {node} are the ones requeued");
                for job in requeued {
                    let phase = c.state.job(job).unwrap().phase;
                    assert_eq!(phase, Phase::Queued, "{job} requeued");
                }
            }
            Op::GpusBack { node } => {
                c.state.return_gpus(NodeId(node % all), u64::MAX).unwrap();
            }
            Op::Step => {
                let ready: Vec<JobId> = c
                    .state
                    .jobs()
                    .filter(|j| j.phase == Phase::Holding)
                    .filter(|j| {
                        let hold = c.state.hold(j.spec.id).unwrap();
                        hold.waiting_on.is_empty() && hold.waiting_parts.is_empty()
                    })
                    .map(|j| j.spec.id)
                    .collect();
                let unhealthy: Vec<NodeId> = c
                    .state
                    .nodes()
                    .iter()
                    .filter(|n| n.status == NodeStatus::Unhealthy)
                    .map(|n| n.id)
                    .collect();
                let queued: Vec<JobId> =
                    c.state.jobs().filter(|j| j.phase == Phase::Queued).map(|j| j.spec.id).collect();
                let out: BTreeMap<NodeId, u64> =
                    c.state.nodes().iter().map(|n| (n.id, n.out_mask())).collect();
                let before = c.state.clone();
                let plan = c.step();
                check_elastic(&c, &before, &plan);
                for p in &plan.placements {
                    for (node, mask) in &p.alloc {
                        assert!(!unhealthy.contains(node), "{} placed on unhealthy {node}", p.job);
                        assert_eq!(mask & out[node], 0, "{} placed on a GPU of {node} out of service", p.job);
                    }
                }
                for p in &plan.preemptions {
                    for (node, mask) in &p.hold {
                        assert_eq!(
                            mask & out[node],
                            0,
                            "{} holds a GPU of {node} out of service",
                            p.preemptor
                        );
                    }
                }
                for d in &plan.drains {
                    let job = c.state.job(d.job).unwrap();
                    assert_eq!(job.spec.tier, Tier::Preemptible, "drained a {} job", job.spec.tier);
                    assert_eq!(d.deadline, d.notice_at + c.config.drain_window);
                }
                // Every job left queued says why: the first of its class
                // has a reason from this pass (unless it joined the queue
                // as the pass was applied: requeued from a lost node, or
                // its hold there released), or another tenant's job of its
                // class has (the walk ends once every class of a tier is
                // blocked: it waits behind that tenant), and the rest of
                // its tenant's class wait behind it.
                let class = |id: JobId| {
                    let s = &c.state.job(id).unwrap().spec;
                    (s.tier, s.gpus, s.gpu_model, (s.tier == Tier::Reserved).then_some(s.tenant))
                };
                for j in c.state.jobs().filter(|j| j.phase == Phase::Queued) {
                    let first = c.state.first_in_line(j.spec.id).expect("a queued job is in line");
                    let joined_after = !queued.contains(&first);
                    let why = plan.pending.iter().find(|(id, _)| *id == first).map(|(_, why)| why);
                    let class_blocked = plan
                        .pending
                        .iter()
                        .any(|(id, _)| c.state.job(*id).is_some_and(|_| class(*id) == class(first)));
                    assert!(
                        why.is_some() || joined_after || class_blocked,
                        "{first} waits without a reason: {:?}",
                        plan.pending
                    );
                    let tier = c.state.job(first).unwrap().spec.tier;
                    let fits_tier = match why {
                        Some(Pending::ReservationCap { .. }) => tier == Tier::OnDemand,
                        Some(Pending::ReservationFull { .. } | Pending::ReservationNotStarted { .. }) => {
                            tier == Tier::Reserved
                        }
                        Some(Pending::Reclaimed { .. }) => tier == Tier::Preemptible,
                        _ => true,
                    };
                    assert!(fits_tier, "{first} ({tier}) waits for {why:?}");
                }
                assert!(
                    plan.pending
                        .iter()
                        .all(|(id, _)| c.state.job(*id).is_some_and(|j| j.phase == Phase::Queued)),
                    "a reason is given only for a job still queued"
                );
                // A preemptor whose victims have all left starts at once on
                // exactly the GPUs held for it.
                for job in ready {
                    let started = plan.placements.iter().any(|p| p.job == job && p.from_hold);
                    assert!(started || !plan.lost_nodes.is_empty(), "{job} kept waiting on a ready hold");
                }
            }
        }
        c.state.sanity_check().unwrap_or_else(|e| panic!("after {op:?}: {e}"));
    }
    c.plans
}

/// What a pass did to elastic jobs: a shrink leaves the job running on
/// its first node and at least its fewest GPUs; and a grow (or a
/// placement above the fewest) took no capacity a queued job could start
/// on: had the pass not grown them, the next pass would start nothing on
/// the nodes they took.
fn check_elastic(c: &Cluster, before: &State, plan: &Plan) {
    for s in &plan.shrinks {
        let job = c.state.job(s.job).unwrap();
        let run = job.run.as_ref().expect("a shrunk job runs on");
        assert!(!s.nodes.contains(&run.first_node()), "{} shrunk off its first node", s.job);
        assert!(run.active_gpus() >= job.spec.gpus, "{} shrunk below its fewest", s.job);
        assert_eq!(s.deadline, s.notice_at + c.config.drain_window);
    }
    let mut without = plan.clone();
    let mut grown: Vec<NodeId> = Vec::new();
    for g in without.grows.drain(..) {
        grown.extend(g.alloc.iter().map(|(n, _)| *n));
    }
    for p in &mut without.placements {
        let spec = &before.job(p.job).unwrap().spec;
        if spec.is_elastic() {
            let per = before.model(p.model).unwrap().gpus_per_node as u32;
            let keep = (spec.gpus / per) as usize;
            grown.extend(p.alloc.drain(keep..).map(|(n, _)| n));
        }
    }
    if grown.is_empty() {
        return;
    }
    let mut state = before.clone();
    state.apply(&without).expect("the plan without its grows applies");
    let next = schedule(&state, plan.now, &c.config);
    for p in next.placements.iter().filter(|p| !p.from_hold) {
        let queued = &state.job(p.job).unwrap().spec;
        if queued.is_elastic() {
            continue;
        }
        for (node, _) in &p.alloc {
            assert!(
                !grown.contains(node),
                "a grow took {node}, where queued {} could start: {plan:#?}",
                p.job
            );
        }
    }
}

fn restart_cost() -> impl Strategy<Value = Span> {
    prop_oneof![Just(Span::ZERO), Just(Span::from_secs(5)), Just(Span::from_secs(60))]
}

fn min_runtime() -> impl Strategy<Value = Span> {
    prop_oneof![Just(Span::ZERO), Just(Span::from_secs(120)), Just(Span::from_secs(600))]
}

fn policy() -> impl Strategy<Value = VictimPolicy> {
    prop_oneof![
        3 => Just(VictimPolicy::LostWork),
        1 => Just(VictimPolicy::Youngest),
        1 => Just(VictimPolicy::Oldest),
        1 => Just(VictimPolicy::FewestGpus),
        1 => any::<u64>().prop_map(|seed| VictimPolicy::Random { seed }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(
        nodes in 1u32..6,
        gpus_per_node in prop_oneof![Just(4u8), Just(8)],
        a100_nodes in 0u32..3,
        policy in policy(),
        min_runtime in min_runtime(),
        restart_cost in restart_cost(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(nodes, gpus_per_node, a100_nodes, policy, min_runtime, restart_cost, &ops);
    }

    /// As above, on clusters of whole nodes where elastic jobs are most
    /// of the work: shrinks, parts leaving and grows among preemptors,
    /// drained nodes and lost ones.
    #[test]
    fn elastic_invariants_hold_after_every_step(
        nodes in 2u32..6,
        gpus_per_node in prop_oneof![Just(4u8), Just(8)],
        min_runtime in min_runtime(),
        restart_cost in restart_cost(),
        ops in prop::collection::vec(op_weighted(12), 1..200),
    ) {
        run(nodes, gpus_per_node, 0, VictimPolicy::LostWork, min_runtime, restart_cost, &ops);
    }

    #[test]
    fn same_input_same_plans(
        nodes in 1u32..6,
        policy in policy(),
        min_runtime in min_runtime(),
        restart_cost in restart_cost(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let first = run(nodes, 8, 1, policy, min_runtime, restart_cost, &ops);
        let second = run(nodes, 8, 1, policy, min_runtime, restart_cost, &ops);
        prop_assert_eq!(first, second);
    }

    /// With elastic jobs among the victims, the search picks a set exactly
    /// as cheap as trying every node and every subset of its preemptible
    /// jobs, an elastic job there losing only its part where it may;
    /// and what the plan does keeps each
    /// elastic job on its first node and at least its fewest GPUs, and
    /// holds every leaving GPU for the preemptor until the part exits.
    #[test]
    fn shrink_search_matches_brute_force(
        nodes in 2u32..7,
        jobs in prop::collection::vec((1u32..4, 0u32..3), 1..8),
        saves in prop::collection::vec((any::<usize>(), 1u64..1000), 0..12),
        restart_s in prop_oneof![Just(0u64), Just(30), Just(120)],
        want in 1u32..5,
    ) {
        let mut c = Cluster::new(nodes, 4);
        c.config.restart_cost = Span::from_secs(restart_s);
        c.config.min_runtime = Span::ZERO;
        for (fewest, more) in jobs {
            match more {
                0 => c.submit(Tier::Preemptible, fewest.min(4)),
                _ => c.submit_elastic(4 * fewest, 4 * (fewest + more), TenantId(1)),
            };
            c.advance(7);
            c.step();
        }
        checkpoint_and_fill(&mut c, saves);
        let expected = brute_force_with_parts(&c, want);
        let od = c.submit(Tier::OnDemand, want);
        let before = c.state.clone();
        let plan = c.step();
        match expected {
            None => prop_assert!(plan.preemptions.is_empty()),
            Some((cost, n)) => {
                prop_assert_eq!(plan.preemptions.len(), 1);
                let p = &plan.preemptions[0];
                prop_assert_eq!((p.lost_gpu_ms, p.victims.len() + p.parts.len()), (cost, n), "{:#?}", plan);
            }
        }
        check_elastic(&c, &before, &plan);
        // The parts leave; the preemptor starts on exactly its hold, the
        // leaving GPUs among them, and nobody else took them meanwhile.
        let Some(p) = plan.preemptions.first() else { return Ok(()) };
        for &(job, node) in &p.parts {
            prop_assert!(c.state.hold(od).unwrap().waiting_parts.contains(&(job, node)));
            prop_assert!(c.step().placements.iter().all(|pl| pl.job != od));
            c.part_left(job, node);
        }
        for &v in &p.victims {
            c.exit(v, ExitKind::Failed { requeue: true });
        }
        let started = c.step();
        let placed = started.placements.iter().find(|pl| pl.job == od).expect("the preemptor starts");
        prop_assert!(placed.from_hold);
        prop_assert_eq!(&placed.alloc, &p.hold);
    }

    /// The indexed, pruned search picks a victim set exactly as cheap as
    /// trying every node and every subset of its preemptible jobs.
    #[test]
    fn victim_search_matches_brute_force(
        nodes in 1u32..8,
        sizes in prop::collection::vec(prop_oneof![Just(1u32), Just(2), Just(4)], 1..40),
        checkpoints in prop::collection::vec((any::<usize>(), 1u64..1000), 0..10),
        non_preemptible in prop::collection::vec(any::<usize>(), 0..4),
        want in prop_oneof![Just(1u32), Just(2), Just(3), Just(4)],
    ) {
        let mut c = Cluster::new(nodes, 4);
        for (i, gpus) in sizes.iter().enumerate() {
            let tier = if non_preemptible.contains(&i) { Tier::OnDemand } else { Tier::Preemptible };
            c.submit(tier, *gpus);
            c.advance(7);
            c.step();
        }
        c.config.victim_policy = VictimPolicy::LostWork;
        checkpoint_and_fill(&mut c, checkpoints);
        let expected = brute_force_min_lost(&c, want);
        c.submit(Tier::OnDemand, want);
        let plan = schedule(&c.state, c.now, &c.config);
        match expected {
            None => prop_assert!(plan.preemptions.is_empty()),
            Some((cost, n)) => {
                prop_assert_eq!(plan.preemptions.len(), 1);
                prop_assert_eq!(plan.preemptions[0].lost_gpu_ms, cost);
                prop_assert_eq!(plan.preemptions[0].victims.len(), n);
            }
        }
    }

    /// With some preemptible jobs settling (preempted before, resumed less
    /// than `min_runtime` ago), the search picks the cheapest set without
    /// one if any set without one makes room, and otherwise the cheapest
    /// set of all: exactly what trying every subset of every node gives.
    #[test]
    fn victim_search_spares_settling_jobs_as_brute_force_does(
        nodes in prop::collection::vec(
            prop::collection::vec((prop_oneof![Just(1u32), Just(2), Just(4)], any::<bool>(), 0u64..900, prop::option::of(0u64..900), 0u32..3), 0..5),
            1..6,
        ),
        min_runtime in min_runtime(),
        want in 1u32..=4,
    ) {
        let mut c = Cluster::new(nodes.len() as u32, 4);
        c.now = Time::from_secs(10_000);
        c.config.min_runtime = min_runtime;
        let mut next = 1000;
        for (n, jobs) in nodes.iter().enumerate() {
            let node = NodeId(n as u32);
            let mut free = 4u32;
            // The node's jobs as far as they fit, then on-demand work on
            // every GPU left, so the preemptor must preempt.
            let fill = jobs
                .iter()
                .map(|&(gpus, preemptible, ago, saved, preemptions)| (gpus, preemptible, ago, saved, preemptions))
                .chain(std::iter::repeat((1, false, 0, None, 0)));
            for (gpus, preemptible, ago, saved, preemptions) in fill {
                if free == 0 {
                    break;
                }
                if gpus > free {
                    continue;
                }
                let tier = if preemptible { Tier::Preemptible } else { Tier::OnDemand };
                let started = Time(c.now.0 - ago * 1000);
                let checkpoint = saved.filter(|s| *s <= ago).map(|s| Time(c.now.0 - s * 1000));
                let mask = ((1u64 << gpus) - 1) << (4 - free);
                let spec = JobSpec {
                    id: JobId(next),
                    tenant: TenantId(1),
                    tier,
                    gpus,
                    max_gpus: None,
                    gpu_model: None,
                    submitted_at: Time::ZERO,
                    priority: 0,
                    max_preemptions: None,
                };
                let preemptions = if preemptible { preemptions } else { 0 };
                c.state
                    .restore_run(
                        spec,
                        RestoredRun {
                            attempt: Attempt(preemptions + 1),
                            preemptions,
                            alloc: vec![(node, mask)],
                            started_at: started,
                            last_checkpoint_at: checkpoint,
                            notice: None,
                            joined: Vec::new(),
                            leaving: Vec::new(),
                            resized_at: None,
                        },
                    )
                    .unwrap();
                next += 1;
                free -= gpus;
            }
        }
        c.state.sanity_check().unwrap();
        let expected = brute_force_sparing(&c, want);
        c.submit(Tier::OnDemand, want);
        let plan = schedule(&c.state, c.now, &c.config);
        match expected {
            None => prop_assert!(plan.preemptions.is_empty()),
            Some((settling, cost, n)) => {
                prop_assert_eq!(plan.preemptions.len(), 1);
                let p = &plan.preemptions[0];
                let chosen_settling = p
                    .victims
                    .iter()
                    .any(|v| c.state.job(*v).unwrap().settling(c.now, c.config.min_runtime));
                prop_assert_eq!((chosen_settling, p.lost_gpu_ms, p.victims.len()), (settling, cost, n));
            }
        }
        c.state.apply(&plan).unwrap();
        c.state.sanity_check().unwrap();
    }
}

/// Checkpoints running jobs as `saves` says ((pick, seconds later)),
/// then fills every free GPU with on-demand work, so that the next job
/// must preempt, and lets 300 s pass.
fn checkpoint_and_fill(c: &mut Cluster, saves: Vec<(usize, u64)>) {
    let running: Vec<JobId> =
        c.state.jobs().filter(|j| j.phase == Phase::Running).map(|j| j.spec.id).collect();
    for (pick, secs) in saves {
        c.advance(secs);
        if let Some(job) = super_pick(&running, pick) {
            c.checkpoint(job);
        }
    }
    loop {
        let free: u32 = c.state.nodes().iter().map(|n| n.free_mask().count_ones()).sum();
        if free == 0 {
            break;
        }
        c.submit(Tier::OnDemand, 1);
        c.step();
    }
    c.advance(300);
}

fn super_pick(items: &[JobId], i: usize) -> Option<JobId> {
    pick(items, i)
}

/// Every single-node eviction of running preemptible jobs that frees
/// `want` GPUs: (any victim settling, lost GPU-ms, victims) of each.
fn single_node_evictions(c: &Cluster, want: u32) -> Vec<(bool, u128, usize)> {
    let mut sets = Vec::new();
    for node in c.state.nodes() {
        let free = node.free_mask().count_ones();
        let options: Vec<(u128, u32, bool)> = node
            .jobs()
            .filter_map(|id| {
                let j = c.state.job(id).unwrap();
                let run = j.run.as_ref().unwrap();
                (j.spec.tier == Tier::Preemptible && j.phase == Phase::Running).then(|| {
                    let lost =
                        j.spec.gpus as u128 * c.now.saturating_since(run.progress_saved_at()).0 as u128;
                    (lost, j.spec.gpus, j.settling(c.now, c.config.min_runtime))
                })
            })
            .collect();
        for subset in 1u32..(1 << options.len()) {
            let chosen: Vec<_> = options.iter().enumerate().filter(|(i, _)| subset & (1 << i) != 0).collect();
            let freed: u32 = chosen.iter().map(|(_, o)| o.1).sum();
            if free + freed >= want {
                let cost = chosen.iter().map(|(_, o)| o.0).sum();
                sets.push((chosen.iter().any(|(_, o)| o.2), cost, chosen.len()));
            }
        }
    }
    sets
}

/// (lost GPU-ms, victims) of the best single-node eviction for `want` GPUs.
/// (lost GPU-ms, victims and parts) of the cheapest single-node eviction
/// for `want` GPUs, where an elastic job on a node other than its first
/// loses only its part there if what stays is at least its fewest: that
/// part's GPUs × since its save, and the restart of every GPU that stays
/// (never stopped whole there: that loses what the shrink does and more);
/// stopped whole, each of its GPUs' work since the save and restart.
fn brute_force_with_parts(c: &Cluster, want: u32) -> Option<(u128, usize)> {
    let restart = c.config.restart_cost.0 as u128;
    let mut best: Option<(u128, usize)> = None;
    for node in c.state.nodes() {
        let free = node.free_mask().count_ones();
        // Per job: (whole cost, unless it may lose only its part here;
        // that part's cost; GPUs here).
        let options: Vec<(Option<u128>, Option<u128>, u32)> = node
            .jobs()
            .filter_map(|id| {
                let j = c.state.job(id).unwrap();
                let run = j.run.as_ref().unwrap();
                if j.spec.tier != Tier::Preemptible || j.phase != Phase::Running {
                    return None;
                }
                let since = c.now.saturating_since(run.progress_saved_at()).0 as u128;
                let here = run.alloc.iter().find(|(n, _)| *n == node.id).unwrap().1.count_ones();
                let whole = run.gpus() as u128 * (since + if j.spec.is_elastic() { restart } else { 0 });
                let may_go =
                    j.spec.is_elastic() && run.first_node() != node.id && run.gpus() - here >= j.spec.gpus;
                let part = may_go.then(|| here as u128 * since + (run.gpus() - here) as u128 * restart);
                Some(((!may_go).then_some(whole), part, here))
            })
            .collect();
        // Each job: 0 stays, 1 stops whole, 2 loses its part here.
        let mut choice = vec![0u8; options.len()];
        loop {
            let (mut cost, mut freed, mut n) = (0u128, 0u32, 0usize);
            let mut valid = true;
            for (o, &k) in options.iter().zip(&choice) {
                match k {
                    0 => {}
                    1 => match o.0 {
                        Some(whole) => (cost, freed, n) = (cost + whole, freed + o.2, n + 1),
                        None => valid = false,
                    },
                    _ => match o.1 {
                        Some(part) => (cost, freed, n) = (cost + part, freed + o.2, n + 1),
                        None => valid = false,
                    },
                }
            }
            if valid && n > 0 && free + freed >= want && free < want {
                best = Some(best.map_or((cost, n), |b| b.min((cost, n))));
            }
            // Next choice, as a number in base 3.
            let mut i = 0;
            while i < choice.len() && choice[i] == 2 {
                choice[i] = 0;
                i += 1;
            }
            if i == choice.len() {
                break;
            }
            choice[i] += 1;
        }
    }
    best
}

fn brute_force_min_lost(c: &Cluster, want: u32) -> Option<(u128, usize)> {
    single_node_evictions(c, want).into_iter().map(|(_, cost, n)| (cost, n)).min()
}

/// (any victim settling, lost GPU-ms, victims) of the best single-node
/// eviction for `want` GPUs: sets without a settling job first.
fn brute_force_sparing(c: &Cluster, want: u32) -> Option<(bool, u128, usize)> {
    single_node_evictions(c, want).into_iter().min()
}
