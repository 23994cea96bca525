//! Elastic jobs: placed at their fewest GPUs and grown into what no
//! queued job wants, shrunk a node at a time for a preemptor when that
//! loses less than stopping a job, never below their fewest nor off their
//! first node alone, and grown back once the capacity frees and the job
//! has settled.

use crate::common::Cluster;
use ebb_core::{Attempt, Span, TenantId, Tier};
use ebb_scheduler::*;

const A: TenantId = TenantId(1);
const B: TenantId = TenantId(2);

/// Three 8-GPU nodes running one elastic job of 8 to 24 GPUs, started at
/// 0 and checkpointed at `checkpoint_s`; the clock at `now_s`.
fn three_nodes_one_job(checkpoint_s: u64, now_s: u64) -> (Cluster, ebb_core::JobId) {
    let mut c = Cluster::new(3, 8);
    c.config.restart_cost = Span::from_secs(60);
    let job = c.submit_elastic(8, 24, A);
    c.step();
    c.advance(checkpoint_s);
    c.checkpoint(job);
    c.advance(now_s - checkpoint_s);
    (c, job)
}

#[test]
fn an_elastic_job_starts_on_every_free_node_up_to_its_most() {
    let mut c = Cluster::new(4, 8);
    let job = c.submit_elastic(8, 24, A);
    let plan = c.step();
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].alloc.len(), 3, "24 GPUs: three whole nodes");
    assert_eq!(c.gpus_of(job), 24);
    assert!(plan.grows.is_empty(), "a job placed in the pass takes its nodes in its placement");
}

#[test]
fn an_elastic_job_starts_at_its_fewest_when_that_is_what_is_free() {
    let mut c = Cluster::new(3, 8);
    let rigid = c.submit(Tier::OnDemand, 16);
    c.step();
    let job = c.submit_elastic(8, 24, A);
    c.step();
    assert_eq!(c.gpus_of(job), 8, "it need not wait for 24");
    assert_eq!(c.phase(rigid), Some(Phase::Running));
}

#[test]
fn queued_work_of_its_tier_comes_before_a_grow() {
    let mut c = Cluster::new(3, 8);
    let blocker = c.submit(Tier::OnDemand, 16);
    c.step();
    let job = c.submit_elastic(8, 24, A);
    c.step();
    // Two nodes free once the on-demand job ends; a rigid 8-GPU job of
    // another tenant waits for one of them.
    let rigid = c.submit_as(Tier::Preemptible, 16, B);
    c.exit(blocker, ExitKind::Completed);
    c.advance(3_600);
    let plan = c.step();
    assert_eq!(c.phase(rigid), Some(Phase::Running), "the queued job starts");
    assert!(plan.grows.is_empty(), "nothing left to grow into");
    assert_eq!(c.gpus_of(job), 8);
}

#[test]
fn a_grow_waits_min_runtime_after_the_last_change() {
    let mut c = Cluster::new(3, 8);
    c.config.min_runtime = Span::from_secs(300);
    let blocker = c.submit(Tier::OnDemand, 16);
    c.step();
    let job = c.submit_elastic(8, 24, A);
    c.step();
    c.exit(blocker, ExitKind::Completed);
    c.advance(100);
    assert!(c.step().grows.is_empty(), "100 s after its start: not yet");
    c.advance(200);
    let plan = c.step();
    assert_eq!(plan.grows.len(), 1);
    assert_eq!(plan.grows[0].job, job);
    assert_eq!(plan.grows[0].attempt, Attempt(1), "the same attempt goes on");
    assert_eq!(plan.grows[0].alloc.len(), 2);
    assert_eq!(c.gpus_of(job), 24);
}

#[test]
fn a_preemptor_shrinks_an_elastic_job_instead_of_stopping_it() {
    // Saved 600 s ago: stopping it loses 24 GPUs × 600 s; a shrink loses
    // the leaving 8 × 600 s and the restart of the 16 that stay (60 s).
    let (mut c, job) = three_nodes_one_job(0, 600);
    let first = c.nodes_of(job)[0];
    let od = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.drains.is_empty(), "no job stopped: {plan:#?}");
    assert_eq!(plan.shrinks.len(), 1);
    let shrink = &plan.shrinks[0];
    assert_eq!(shrink.job, job);
    assert_eq!(shrink.nodes.len(), 1);
    assert_ne!(shrink.nodes[0], first, "rank 0's node never leaves alone");
    assert_eq!(shrink.reason, DrainReason::Preempted { by: od });
    let p = &plan.preemptions[0];
    assert_eq!(p.parts, vec![(job, shrink.nodes[0])]);
    assert_eq!(p.lost_gpu_ms, (8 * 600 + 16 * 60) * 1000);
    assert_eq!(p.hold, vec![(shrink.nodes[0], 0xff)], "the leaving node's GPUs are held for it");
    assert_eq!(c.phase(job), Some(Phase::Running), "the job runs on");
    // Nothing starts on the leaving node until its part has gone.
    assert!(c.step().placements.is_empty());
    c.part_left(job, shrink.nodes[0]);
    let plan = c.step();
    assert_eq!(plan.placements[0].job, od);
    assert!(plan.placements[0].from_hold);
    assert_eq!(c.gpus_of(job), 16);
    assert_eq!(c.attempt(job), Attempt(1), "no requeue: the same attempt");
}

#[test]
fn a_shrink_is_chosen_over_stopping_the_same_job_even_when_its_restart_costs_more() {
    // Saved 10 s ago: stopping it would lose 24 × 10 GPU-s, less than the
    // restart of the 16 GPUs that stay; but a stopped job restarts every
    // rank too, after a wait in the queue.
    let (mut c, job) = three_nodes_one_job(590, 600);
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.drains.is_empty());
    assert_eq!(plan.shrinks.len(), 1);
    assert_eq!(plan.preemptions[0].lost_gpu_ms, (8 * 10 + 16 * 60) * 1000);
    assert_eq!(c.phase(job), Some(Phase::Running));
}

#[test]
fn another_job_is_stopped_when_that_loses_less_than_a_shrink() {
    // Four nodes: the elastic job on three, a rigid 8-GPU job on the
    // fourth saved 100 s ago. The shrink would lose 8 × 600 + 16 × 60
    // GPU-s; stopping the rigid job 8 × 100.
    let mut c = Cluster::new(4, 8);
    c.config.restart_cost = Span::from_secs(60);
    let rigid = c.submit_as(Tier::Preemptible, 8, B);
    c.step();
    let job = c.submit_elastic(8, 24, A);
    c.step();
    assert_eq!(c.gpus_of(job), 24);
    c.advance(500);
    c.checkpoint(rigid);
    c.advance(100);
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.shrinks.is_empty());
    assert_eq!(plan.drains.len(), 1);
    assert_eq!(plan.drains[0].job, rigid);
    assert_eq!(plan.preemptions[0].lost_gpu_ms, 8 * 100 * 1000);
}

#[test]
fn a_job_at_its_fewest_is_stopped_whole() {
    let mut c = Cluster::new(2, 8);
    let job = c.submit_elastic(16, 24, A);
    c.step();
    assert_eq!(c.gpus_of(job), 16);
    c.advance(600);
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.shrinks.is_empty(), "16 is its fewest");
    assert_eq!(plan.drains[0].job, job);
}

#[test]
fn a_shrink_never_goes_below_the_fewest() {
    // 8 to 24 on three nodes: two preemptors of a node each may take two
    // nodes, a third must stop it whole (or another job).
    let (mut c, job) = three_nodes_one_job(0, 600);
    c.submit(Tier::OnDemand, 8);
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    let taken: usize = plan.shrinks.iter().map(|s| s.nodes.len()).sum();
    assert_eq!(taken, 2);
    assert!(plan.shrinks.iter().all(|s| !s.nodes.contains(&c.nodes_of(job)[0])));
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.shrinks.is_empty(), "only its first node stays, and it never leaves alone");
    assert_eq!(plan.drains.len(), 1, "the job is stopped whole: {plan:#?}");
}

#[test]
fn a_drained_node_takes_only_the_part_of_an_elastic_job_there() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    let nodes = c.nodes_of(job);
    c.state.drain_node(nodes[2]).unwrap();
    let plan = c.step();
    assert!(plan.drains.is_empty());
    assert_eq!(plan.shrinks.len(), 1);
    assert_eq!(plan.shrinks[0].nodes, vec![nodes[2]]);
    assert_eq!(plan.shrinks[0].reason, DrainReason::NodeDrain { node: nodes[2] });
    // Its first node drained: the job can only stop.
    c.state.drain_node(nodes[0]).unwrap();
    let plan = c.step();
    assert_eq!(plan.drains.len(), 1);
    assert_eq!(plan.drains[0].job, job);
}

#[test]
fn a_shrunk_job_grows_back_when_the_preemptor_ends() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    c.config.min_runtime = Span::from_secs(300);
    let od = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    let leaving = plan.shrinks[0].nodes[0];
    c.advance(30);
    c.part_left(job, leaving);
    c.step();
    c.advance(1_000);
    c.exit(od, ExitKind::Completed);
    let plan = c.step();
    assert_eq!(plan.grows.len(), 1, "{plan:#?}");
    assert_eq!(plan.grows[0].alloc, vec![(leaving, 0xff)]);
    assert_eq!(c.gpus_of(job), 24);
    let run = c.state.job(job).unwrap().run.clone().unwrap();
    assert_eq!(run.joined(), [(leaving, c.now)], "the node that joined, and when");
    assert_eq!(run.attempt, Attempt(1));
}

#[test]
fn a_part_that_was_not_told_to_leave_cannot_report_leaving() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    let nodes = c.nodes_of(job);
    let err = c.state.part_left(job, Attempt(1), nodes[1]).unwrap_err();
    assert!(err.to_string().contains("was not told to leave"), "{err}");
    let err = c.state.part_left(job, Attempt(7), nodes[1]).unwrap_err();
    assert!(matches!(err, StateError::StaleAttempt { .. }), "{err}");
    c.state.sanity_check().unwrap();
}

#[test]
fn the_whole_job_ending_releases_its_leaving_parts_to_the_preemptor() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    let od = c.submit(Tier::OnDemand, 8);
    c.step();
    // The job fails while its part leaves: every GPU of it is free, and
    // the preemptor starts on its hold.
    c.exit(job, ExitKind::Failed { requeue: false });
    let plan = c.step();
    assert!(plan.placements.iter().any(|p| p.job == od && p.from_hold), "{plan:#?}");
}

#[test]
fn bad_ranges_are_refused_naming_them() {
    let c = Cluster::new(2, 8);
    let spec = |gpus, max_gpus, tier| JobSpec {
        id: ebb_core::JobId(99),
        tenant: A,
        tier,
        gpus,
        max_gpus: Some(max_gpus),
        gpu_model: Some(c.model()),
        submitted_at: c.now,
        priority: 0,
        max_preemptions: None,
    };
    let refused = |s: JobSpec| c.state.clone().submit(s).unwrap_err().to_string();
    assert!(refused(spec(16, 8, Tier::Preemptible)).contains("must be above its fewest, got 16:8"));
    assert!(refused(spec(8, 8, Tier::Preemptible)).contains("must be above its fewest"));
    assert!(refused(spec(8, 16, Tier::OnDemand)).contains("only preemptible jobs are elastic"));
    assert!(refused(spec(4, 16, Tier::Preemptible)).contains("multiples of 8, got 4:16"));
    assert!(refused(spec(8, 20, Tier::Preemptible)).contains("multiples of 8, got 8:20"));
}

#[test]
fn a_promoted_elastic_job_runs_on_rigid_at_its_size() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    assert_eq!(c.state.promote(job, c.now).unwrap(), Promoted::Running);
    let spec = &c.state.job(job).unwrap().spec;
    assert_eq!((spec.gpus, spec.max_gpus, spec.tier), (24, None, Tier::OnDemand));
    c.state.sanity_check().unwrap();
}

#[test]
fn a_grow_takes_no_node_kept_for_a_waiting_gang() {
    // A preemptible 16-GPU gang waits for two whole nodes while one is
    // free: that node is kept for it, and the elastic job may not take it.
    let mut c = Cluster::new(3, 8);
    let on_demand = c.submit(Tier::OnDemand, 8);
    c.step();
    let small = c.submit_as(Tier::Preemptible, 4, B);
    c.step();
    let job = c.submit_elastic(8, 16, A);
    c.step();
    assert_eq!(c.gpus_of(job), 8);
    let gang = c.submit_as(Tier::Preemptible, 16, B);
    c.advance(600);
    let freed = c.nodes_of(on_demand)[0];
    c.exit(on_demand, ExitKind::Completed);
    let plan = c.step();
    assert!(plan.grows.is_empty(), "{plan:#?}");
    let half_free = c.nodes_of(small)[0];
    let waits = plan.pending.iter().find(|(j, _)| *j == gang).map(|(_, why)| why.clone());
    match waits {
        Some(Pending::WholeNodes { nodes: 2, free: 1, earmarked, .. }) => {
            let mut expect = vec![half_free, freed];
            expect.sort();
            assert_eq!(earmarked, expect);
        }
        other => panic!("the gang waits for whole nodes, not {other:?}"),
    }
    // Once the small job ends the gang starts, and still nothing grows.
    c.exit(small, ExitKind::Completed);
    let plan = c.step();
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].job, gang);
    assert!(plan.grows.is_empty());
}

#[test]
fn a_restarted_core_restores_a_shrinking_job_and_the_hold_waiting_for_its_part() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    let od = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    let leaving = plan.shrinks[0].nodes[0];
    let hold = c.state.hold(od).unwrap().alloc.clone();
    // A fresh core as after a restart: the run with its leaving part,
    // the queued preemptor, then its hold waiting for that part.
    let mut fresh = Cluster::new(3, 8);
    let j = c.state.job(job).unwrap();
    let run = j.run.clone().unwrap();
    fresh.state.restore_run(j.spec.clone(), crate::restored(&run, 0, None)).unwrap();
    fresh.state.submit(c.state.job(od).unwrap().spec.clone()).unwrap();
    // A part named that is not leaving is not waited for.
    let first = run.first_node();
    fresh.state.restore_hold(od, hold.clone(), &[], &[(job, leaving), (job, first)], None).unwrap();
    fresh.state.sanity_check().unwrap();
    assert_eq!(fresh.state.hold(od).unwrap().waiting_parts.len(), 1);
    fresh.now = c.now;
    assert!(fresh.step().is_empty(), "nothing more is taken while the part leaves");
    fresh.part_left(job, leaving);
    let plan = fresh.step();
    assert_eq!(plan.placements[0].job, od);
    assert_eq!(plan.placements[0].alloc, hold);
    assert_eq!(fresh.gpus_of(job), 16);
}

#[test]
fn a_restored_run_is_held_to_its_range_and_its_own_nodes() {
    let (c, job) = three_nodes_one_job(0, 600);
    let j = c.state.job(job).unwrap();
    let run = j.run.clone().unwrap();
    let refused = |spec: JobSpec, restored: RestoredRun| {
        let mut fresh = Cluster::new(3, 8);
        fresh.state.restore_run(spec, restored).unwrap_err().to_string()
    };
    let rigid = JobSpec { max_gpus: None, gpus: 16, ..j.spec.clone() };
    assert!(refused(rigid, crate::restored(&run, 0, None)).contains("has 24 GPUs, wants 16"));
    let small = JobSpec { max_gpus: Some(16), ..j.spec.clone() };
    assert!(refused(small, crate::restored(&run, 0, None)).contains("wants 8:16"));
    let mut first_leaves = crate::restored(&run, 0, None);
    first_leaves.leaving =
        vec![(run.first_node(), Notice { notice_at: c.now, deadline: c.now, reason: DrainReason::Reclaim })];
    assert!(refused(j.spec.clone(), first_leaves).contains("not its own (nor its first)"));
}

#[test]
fn a_node_lost_under_a_leaving_part_takes_only_that_part() {
    // Told by the operator, and by the heartbeat timeout in a pass.
    for by_timeout in [false, true] {
        let (mut c, job) = three_nodes_one_job(0, 600);
        c.config.heartbeat_timeout = Some(Span::from_secs(60));
        let nodes = c.nodes_of(job);
        for n in &nodes {
            c.state.heartbeat(*n, c.now).unwrap();
        }
        let od = c.submit(Tier::OnDemand, 8);
        let leaving = c.step().shrinks[0].nodes[0];
        let requeued = match by_timeout {
            false => c.state.lose_node(leaving).unwrap(),
            true => {
                c.advance(61);
                for n in nodes.iter().filter(|n| **n != leaving) {
                    c.state.heartbeat(*n, c.now).unwrap();
                }
                let plan = c.step();
                assert_eq!(plan.lost_nodes, vec![leaving]);
                plan.requeues.iter().map(|r| r.job).collect()
            }
        };
        c.state.sanity_check().unwrap();
        assert!(requeued.is_empty(), "the job is not requeued: {requeued:?}");
        assert_eq!((c.phase(job), c.gpus_of(job), c.attempt(job)), (Some(Phase::Running), 16, Attempt(1)));
        // The hold on the lost node is gone; the preemptor waits again.
        assert_eq!(c.phase(od), Some(Phase::Queued));
    }
}

#[test]
fn gpus_taken_out_under_a_leaving_part_take_only_that_part() {
    let (mut c, job) = three_nodes_one_job(0, 600);
    c.submit(Tier::OnDemand, 8);
    let leaving = c.step().shrinks[0].nodes[0];
    let (requeued, _) = c.state.take_gpus_out(leaving, 0b1).unwrap();
    c.state.sanity_check().unwrap();
    assert!(requeued.is_empty());
    assert_eq!((c.phase(job), c.gpus_of(job)), (Some(Phase::Running), 16));
    // A staying node's GPU out ends the attempt, as for any gang.
    let staying = c.nodes_of(job)[1];
    let (requeued, _) = c.state.take_gpus_out(staying, 0b1).unwrap();
    assert_eq!(requeued, vec![job]);
    c.state.sanity_check().unwrap();
}
