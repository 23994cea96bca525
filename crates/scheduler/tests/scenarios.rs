//! The scheduling policy, one behaviour per test.

mod common;

#[path = "scenarios/elastic.rs"]
mod elastic;
#[path = "scenarios/victims.rs"]
mod victims;
#[path = "scenarios/waiting.rs"]
mod waiting;

use common::Cluster;
use ebb_core::{Attempt, JobId, NodeId, ReservationId, Span, TenantId, Tier, Time};
use ebb_scheduler::*;

#[test]
fn packs_partly_used_nodes_first() {
    let mut c = Cluster::new(2, 8);
    let a = c.submit(Tier::OnDemand, 3);
    c.step();
    let b = c.submit(Tier::OnDemand, 2);
    c.step();
    assert_eq!(c.nodes_of(a), c.nodes_of(b), "the 2-GPU job should fill the partly used node");
    let big = c.submit(Tier::OnDemand, 8);
    c.step();
    assert_eq!(c.phase(big), Some(Phase::Running), "a whole node stayed free for the 8-GPU job");
}

#[test]
fn tiers_start_in_precedence_order_then_submission_order() {
    let mut c = Cluster::new(1, 4);
    let pre = c.submit(Tier::Preemptible, 4);
    let od = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].job, od);
    assert_eq!(c.phase(pre), Some(Phase::Queued));
}

#[test]
fn a_bounded_pass_starts_the_head_of_the_queue_and_leaves_the_rest_for_the_next() {
    let mut c = Cluster::new(4, 8);
    c.config.max_starts = Some(2);
    let pre: Vec<JobId> = (0..3).map(|_| c.submit(Tier::Preemptible, 8)).collect();
    let od = c.submit(Tier::OnDemand, 8);
    let first = c.step();
    let started: Vec<JobId> = first.placements.iter().map(|p| p.job).collect();
    assert_eq!(started, vec![od, pre[0]], "the head of the queue, in precedence order");
    assert!(
        first.pending.is_empty(),
        "the jobs the pass did not look at have no reason yet: {:?}",
        first.pending
    );
    assert_eq!(c.phase(pre[1]), Some(Phase::Queued));
    let second = c.step();
    let started: Vec<JobId> = second.placements.iter().map(|p| p.job).collect();
    assert_eq!(started, vec![pre[1], pre[2]]);
    assert!(c.step().is_empty(), "every job started: nothing is left for a third pass");
}

#[test]
fn preemption_drains_the_victim_and_holds_its_gpus_for_the_preemptor() {
    let mut c = Cluster::new(1, 8);
    let victim = c.submit(Tier::Preemptible, 8);
    c.step();
    c.advance(60);
    let od = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert_eq!(plan.drains.len(), 1);
    let drain = plan.drains[0];
    assert_eq!(drain.job, victim);
    assert_eq!(drain.deadline, drain.notice_at + Span::from_secs(300));
    assert_eq!(drain.reason, DrainReason::Preempted { by: od });
    assert_eq!(c.phase(od), Some(Phase::Holding));

    // Nobody else may take the held GPUs, not even a higher-priority job.
    let other = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.placements.is_empty() && plan.drains.is_empty());

    c.advance(10);
    assert_eq!(c.exit(victim, ExitKind::Failed { requeue: false }), ExitEffect::Requeued { preempted: true });
    let plan = c.step();
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].job, od);
    assert!(plan.placements[0].from_hold);
    assert_eq!(c.phase(other), Some(Phase::Queued));
    let v = c.state.job(victim).unwrap();
    assert_eq!((v.phase, v.preemptions), (Phase::Queued, 1));
}

#[test]
fn never_evicts_when_the_job_still_would_not_fit() {
    let mut c = Cluster::new(1, 8);
    c.submit(Tier::OnDemand, 4);
    c.submit(Tier::Preemptible, 4);
    c.step();
    let big = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert!(plan.drains.is_empty(), "evicting the preemptible job would free only 4 of 8 GPUs");
    assert_eq!(c.phase(big), Some(Phase::Queued));
}

#[test]
fn gangs_start_and_are_evicted_whole() {
    let mut c = Cluster::new(4, 4);
    let gang = c.submit(Tier::Preemptible, 8);
    let plan = c.step();
    assert_eq!(plan.placements[0].alloc.len(), 2, "8 GPUs on 4-GPU nodes is a 2-node gang");
    let single = c.submit(Tier::Preemptible, 4);
    c.step();
    c.advance(30);
    c.checkpoint(single);
    c.advance(30);
    // An on-demand 12-GPU gang needs three whole nodes: one free, the gang's two.
    let od = c.submit(Tier::OnDemand, 12);
    let plan = c.step();
    let drained: Vec<JobId> = plan.drains.iter().map(|d| d.job).collect();
    assert!(drained.contains(&gang), "{drained:?}");
    assert_eq!(plan.preemptions[0].hold.len(), 3);
    c.exit(gang, ExitKind::Failed { requeue: false });
    if drained.contains(&single) {
        c.exit(single, ExitKind::Failed { requeue: false });
    }
    c.step();
    assert_eq!(c.phase(od), Some(Phase::Running));
}

#[test]
fn reserved_and_on_demand_jobs_are_never_drained() {
    let mut c = Cluster::new(1, 8);
    c.state
        .add_reservation(Reservation {
            id: ReservationId(1),
            tenant: TenantId(7),
            gpu_model: c.model(),
            gpus: 4,
            start: Time::ZERO,
            end: Time::from_secs(86_400),
        })
        .unwrap();
    c.submit_as(Tier::Reserved, 4, TenantId(7));
    c.submit(Tier::OnDemand, 4);
    c.step();
    c.submit(Tier::OnDemand, 4);
    c.submit_as(Tier::Reserved, 4, TenantId(7));
    let plan = c.step();
    assert!(plan.drains.is_empty() && plan.placements.is_empty());
}

#[test]
fn reserved_gpus_are_lent_to_preemptible_work_and_taken_back() {
    let mut c = Cluster::new(2, 4);
    let owner = TenantId(9);
    c.state
        .add_reservation(Reservation {
            id: ReservationId(1),
            tenant: owner,
            gpu_model: c.model(),
            gpus: 4,
            start: Time::ZERO,
            end: Time::from_secs(86_400),
        })
        .unwrap();
    // On-demand may not use the reserved half of the cluster...
    let od1 = c.submit(Tier::OnDemand, 4);
    let od2 = c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.phase(od1), Some(Phase::Running));
    assert_eq!(c.phase(od2), Some(Phase::Queued));
    // ...but preemptible work borrows it.
    let borrower = c.submit(Tier::Preemptible, 4);
    c.step();
    assert_eq!(c.phase(borrower), Some(Phase::Running));
    // The owner takes it back with the drain window.
    c.advance(100);
    let reserved = c.submit_as(Tier::Reserved, 4, owner);
    let plan = c.step();
    assert_eq!(plan.drains[0].job, borrower);
    c.exit(borrower, ExitKind::Failed { requeue: false });
    c.step();
    assert_eq!(c.phase(reserved), Some(Phase::Running));
    // Beyond the reservation the owner waits like anyone.
    let extra = c.submit_as(Tier::Reserved, 4, owner);
    c.step();
    assert_eq!(c.phase(extra), Some(Phase::Queued));
}

#[test]
fn a_large_job_is_not_starved_by_small_ones_behind_it() {
    let mut c = Cluster::new(2, 4);
    let smalls: Vec<JobId> = (0..8).map(|_| c.submit(Tier::Preemptible, 1)).collect();
    c.step();
    let big = c.submit(Tier::Preemptible, 4);
    // An endless stream of 1-GPU jobs behind it.
    let mut running = smalls.clone();
    for round in 0..20 {
        for _ in 0..2 {
            c.submit(Tier::Preemptible, 1);
        }
        // The oldest running small job finishes each round.
        let done = running.remove(0);
        c.advance(10);
        c.exit(done, ExitKind::Completed);
        c.step();
        running = c
            .state
            .jobs()
            .filter(|j| j.phase == Phase::Running && j.spec.id != big)
            .map(|j| j.spec.id)
            .collect();
        running.sort();
        if c.phase(big) == Some(Phase::Running) {
            assert!(round <= 4, "big job started only after {round} rounds");
            return;
        }
    }
    panic!("the 4-GPU job starved behind 1-GPU jobs");
}

#[test]
fn operator_drain_notices_preemptible_jobs_and_lets_others_finish() {
    let mut c = Cluster::new(2, 4);
    let od = c.submit(Tier::OnDemand, 2);
    let pre = c.submit(Tier::Preemptible, 2);
    c.step();
    let node = c.nodes_of(od)[0];
    assert_eq!(c.nodes_of(pre)[0], node);
    c.state.drain_node(node).unwrap();
    let plan = c.step();
    assert_eq!(plan.drains.len(), 1);
    assert_eq!(plan.drains[0].job, pre);
    assert_eq!(plan.drains[0].reason, DrainReason::NodeDrain { node });
    assert_eq!(c.phase(od), Some(Phase::Running));
    c.exit(pre, ExitKind::Failed { requeue: false });
    c.step();
    assert_ne!(c.nodes_of(pre)[0], node, "requeued work avoids the drained node");
    assert!(c.step().is_empty());
}

#[test]
fn reclaim_drains_preemptible_capacity_and_keeps_it_free_of_preemptible_work() {
    let mut c = Cluster::new(2, 4);
    let jobs: Vec<JobId> = (0..4).map(|_| c.submit(Tier::Preemptible, 2)).collect();
    c.step();
    c.advance(50);
    c.checkpoint(jobs[2]);
    c.checkpoint(jobs[3]);
    c.advance(50);
    let limit = c.state.reclaim(c.model(), 3).unwrap();
    assert_eq!(limit, 5);
    let plan = c.step();
    let mut drained: Vec<JobId> = plan.drains.iter().map(|d| d.job).collect();
    drained.sort();
    assert_eq!(drained, vec![jobs[2], jobs[3]], "4 GPUs freed to reclaim 3, freshest checkpoints first");
    assert!(plan.drains.iter().all(|d| d.reason == DrainReason::Reclaim));
    for job in drained {
        c.exit(job, ExitKind::Failed { requeue: false });
    }
    let plan = c.step();
    assert!(plan.placements.is_empty(), "preemptible work stays under the limit");
    let od = c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.phase(od), Some(Phase::Running));
    c.state.release_reclaim(c.model()).unwrap();
}

#[test]
fn a_silent_node_is_lost_and_its_jobs_requeue() {
    let mut c = Cluster::new(2, 4);
    c.config.heartbeat_timeout = Some(Span::from_secs(30));
    let a = c.submit(Tier::OnDemand, 4);
    let b = c.submit(Tier::OnDemand, 4);
    c.step();
    let (node_a, node_b) = (c.nodes_of(a)[0], c.nodes_of(b)[0]);
    c.advance(20);
    c.state.heartbeat(node_b, c.now).unwrap();
    c.advance(20);
    let plan = c.step();
    assert_eq!(plan.lost_nodes, vec![node_a]);
    assert_eq!(plan.requeues.len(), 1);
    assert_eq!(plan.requeues[0].job, a);
    assert_eq!(c.phase(a), Some(Phase::Queued));
    assert_eq!(c.attempt(a).0, 1, "requeued, not restarted yet");
    // A stale report about the lost attempt is refused.
    let err = c.state.exited(a, c.attempt(a), ExitKind::Completed).unwrap_err();
    assert!(matches!(err, StateError::StaleAttempt { .. }), "{err}");
    // The node comes back under its name and the job runs again.
    let back = c
        .state
        .add_node(
            NodeSpec { name: "node-0".into(), gpu_model: "H100".into(), gpus: 4, labels: Default::default() },
            c.now,
        )
        .unwrap();
    assert_eq!(back, NodeId(node_a.0));
    c.state.heartbeat(node_b, c.now).unwrap();
    c.step();
    assert_eq!(c.phase(a), Some(Phase::Running));
    assert_eq!(c.attempt(a).0, 2);
}

#[test]
fn max_preemptions_bounds_requeues() {
    let mut c = Cluster::new(1, 4);
    let id = JobId(100);
    c.state
        .submit(JobSpec {
            id,
            tenant: TenantId(1),
            tier: Tier::Preemptible,
            gpus: 4,
            max_gpus: None,
            gpu_model: None,
            submitted_at: c.now,
            priority: 0,
            max_preemptions: Some(0),
        })
        .unwrap();
    c.step();
    let od = c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.exit(id, ExitKind::Failed { requeue: false }), ExitEffect::PreemptionLimitReached);
    assert!(c.state.job(id).is_none());
    c.step();
    assert_eq!(c.phase(od), Some(Phase::Running));
}

#[test]
fn completing_during_the_drain_is_success_not_preemption() {
    let mut c = Cluster::new(1, 4);
    let pre = c.submit(Tier::Preemptible, 4);
    c.step();
    c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.exit(pre, ExitKind::Completed), ExitEffect::Finished);
}

#[test]
fn bad_input_is_refused_with_the_field_named() {
    let mut c = Cluster::new(1, 8);
    let spec = |gpus, tier, model| JobSpec {
        id: JobId(1),
        tenant: TenantId(1),
        tier,
        gpus,
        max_gpus: None,
        gpu_model: model,
        submitted_at: Time::ZERO,
        priority: 0,
        max_preemptions: None,
    };
    let err = c.state.submit(spec(0, Tier::OnDemand, None)).unwrap_err();
    assert!(err.to_string().contains("gpus must be at least 1"), "{err}");
    let m = Some(c.model());
    let err = c.state.submit(spec(12, Tier::OnDemand, m)).unwrap_err();
    assert!(err.to_string().contains("multiple of 8"), "{err}");
    let err = c.state.submit(spec(4, Tier::Reserved, None)).unwrap_err();
    assert!(err.to_string().contains("gpu model"), "{err}");
    let err = c
        .state
        .add_node(
            NodeSpec { name: "x".into(), gpu_model: "H100".into(), gpus: 4, labels: Default::default() },
            Time::ZERO,
        )
        .unwrap_err();
    assert!(err.to_string().contains("every H100 node has 8 GPUs"), "{err}");
    let err = c
        .state
        .add_reservation(Reservation {
            id: ReservationId(1),
            tenant: TenantId(1),
            gpu_model: c.model(),
            gpus: 1,
            start: Time::from_secs(10),
            end: Time::from_secs(5),
        })
        .unwrap_err();
    assert!(err.to_string().contains("start must be before end"), "{err}");
    c.state.sanity_check().unwrap();
}

#[test]
fn a_stale_plan_is_refused_whole() {
    let mut c = Cluster::new(1, 4);
    let a = c.submit(Tier::OnDemand, 4);
    let plan = schedule(&c.state, c.now, &c.config);
    c.state.cancel(a).unwrap();
    let err = c.state.apply(&plan).unwrap_err();
    assert!(err.is_retryable(), "{err}");
    c.state.sanity_check().unwrap();
}

#[test]
fn a_gang_is_not_starved_by_small_jobs_behind_it() {
    let mut c = Cluster::new(4, 4);
    for _ in 0..16 {
        c.submit(Tier::Preemptible, 1);
    }
    c.step();
    let gang = c.submit(Tier::Preemptible, 8);
    for round in 0..40 {
        c.submit(Tier::Preemptible, 1);
        // One running small job ends each round, oldest first.
        let mut running: Vec<JobId> = c
            .state
            .jobs()
            .filter(|j| j.phase == Phase::Running && j.spec.id != gang)
            .map(|j| j.spec.id)
            .collect();
        running.sort();
        if let Some(&done) = running.first() {
            c.advance(10);
            c.exit(done, ExitKind::Completed);
        }
        c.step();
        if c.phase(gang) == Some(Phase::Running) {
            assert_eq!(c.nodes_of(gang).len(), 2);
            assert!(round < 16, "the gang waited {round} rounds");
            return;
        }
    }
    panic!("the 8-GPU gang starved behind 1-GPU jobs");
}

#[test]
fn a_service_restarts_after_every_exit_uncounted() {
    let mut c = Cluster::new(1, 4);
    let service = c.submit(Tier::OnDemand, 1);
    for n in 1..=3u32 {
        c.step();
        let attempt = c.attempt(service);
        assert_eq!(attempt, Attempt(n));
        assert_eq!(c.state.exited(service, attempt, ExitKind::Restart).unwrap(), ExitEffect::Restarted);
        c.state.sanity_check().unwrap();
    }
    let job = c.state.job(service).unwrap();
    assert_eq!((job.phase, job.preemptions), (Phase::Queued, 0));
    c.step();
    assert_eq!(c.attempt(service), Attempt(4));
}

#[test]
fn a_restart_restores_running_work_and_a_lost_attempt_requeues_uncounted() {
    let mut c = Cluster::new(1, 4);
    let running = c.submit(Tier::Preemptible, 2);
    c.step();
    let run = c.state.job(running).unwrap().run.clone().unwrap();
    let spec = c.state.job(running).unwrap().spec.clone();
    // A fresh core, as after a server restart: the node joins, the running
    // job is put back on exactly its GPUs.
    let mut fresh = Cluster::new(1, 4);
    fresh.state.restore_run(spec.clone(), restored(&run, 0, None)).unwrap();
    fresh.state.sanity_check().unwrap();
    // Its GPUs are not free; a second restore onto them is refused.
    let mut twin = spec.clone();
    twin.id = JobId(99);
    assert!(fresh.state.restore_run(twin, restored(&run, 0, None)).is_err());
    // The attempt vanished (its node restarted): requeued, neither a
    // failure nor a preemption.
    let attempt = fresh.attempt(running);
    assert_eq!(fresh.state.exited(running, attempt, ExitKind::Lost).unwrap(), ExitEffect::RequeuedLost);
    let job = fresh.state.job(running).unwrap();
    assert_eq!((job.phase, job.preemptions), (Phase::Queued, 0));
    fresh.state.sanity_check().unwrap();
    fresh.step();
    assert_eq!(fresh.attempt(running).0, 2);
}

#[test]
fn a_restored_hold_waits_for_its_victims_instead_of_preempting_again() {
    let mut c = Cluster::new(1, 4);
    let v1 = c.submit(Tier::Preemptible, 2);
    let v2 = c.submit(Tier::Preemptible, 2);
    c.step();
    c.advance(10);
    c.checkpoint(v2);
    let od = c.submit(Tier::OnDemand, 2);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![v2]);
    let hold = c.state.hold(od).unwrap().alloc.clone();
    // A fresh core as after a restart: runs (one draining), the queued
    // preemptor, then its hold.
    let mut fresh = Cluster::new(1, 4);
    for id in [v1, v2] {
        let job = c.state.job(id).unwrap();
        let run = job.run.clone().unwrap();
        fresh.state.restore_run(job.spec.clone(), restored(&run, 0, job.notice)).unwrap();
    }
    fresh.state.submit(c.state.job(od).unwrap().spec.clone()).unwrap();
    fresh.state.restore_hold(od, hold.clone(), &[v2], &[], None).unwrap();
    fresh.state.sanity_check().unwrap();
    fresh.now = c.now;
    assert!(fresh.step().is_empty(), "no second victim while the first drains");
    assert_eq!(fresh.phase(v1), Some(Phase::Running));
    fresh.exit(v2, ExitKind::Failed { requeue: false });
    let plan = fresh.step();
    assert_eq!(plan.placements[0].job, od);
    assert_eq!(plan.placements[0].alloc, hold);
}

#[test]
fn an_unhealthy_node_takes_no_new_work_and_keeps_its_jobs_until_healthy_again() {
    let mut c = Cluster::new(1, 8);
    let running = c.submit(Tier::Preemptible, 4);
    c.step();
    c.state.set_healthy(NodeId(0), false).unwrap();
    assert_eq!(c.state.node(NodeId(0)).unwrap().status, NodeStatus::Unhealthy);
    let next = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert!(plan.placements.is_empty(), "placed work on an unhealthy node: {plan:?}");
    assert!(plan.drains.is_empty(), "an unhealthy node's jobs are not drained: {plan:?}");
    assert_eq!(c.phase(running), Some(Phase::Running));
    assert_eq!(c.phase(next), Some(Phase::Queued));
    c.state.set_healthy(NodeId(0), true).unwrap();
    c.step();
    assert_eq!(c.phase(next), Some(Phase::Running), "a healthy node takes work again");
}

/// Two 4-GPU preemptible jobs on two 4-GPU nodes: `resumed` was preempted
/// once and started again 60 s ago, with nothing to lose since; `steady`
/// has run 16 minutes without a checkpoint. Returns (resumed, steady).
fn resumed_and_steady(c: &mut Cluster) -> (JobId, JobId) {
    let resumed = c.submit(Tier::Preemptible, 4);
    let steady = c.submit(Tier::Preemptible, 4);
    c.step();
    c.advance(300);
    c.checkpoint(resumed);
    c.advance(300);
    let first = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![resumed], "the cheaper victim");
    c.exit(resumed, ExitKind::Failed { requeue: false });
    c.step();
    c.advance(300);
    c.exit(first, ExitKind::Completed);
    c.step();
    assert_eq!(c.phase(resumed), Some(Phase::Running));
    assert_eq!(c.state.job(resumed).unwrap().preemptions, 1);
    c.advance(60);
    (resumed, steady)
}

#[test]
fn a_job_preempted_recently_is_passed_over_while_another_victim_fits() {
    let mut c = Cluster::new(2, 4);
    let (resumed, steady) = resumed_and_steady(&mut c);
    assert!(c.state.job(resumed).unwrap().settling(c.now, c.config.min_runtime));
    c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![steady]);
    assert_eq!(plan.preemptions[0].lost_gpu_ms, 4 * 960_000, "it costs more lost work, by design");
    assert_eq!(c.phase(resumed), Some(Phase::Running));
}

#[test]
fn a_job_preempted_before_is_a_victim_like_any_other_once_it_has_run_min_runtime() {
    let mut c = Cluster::new(2, 4);
    let (resumed, _) = resumed_and_steady(&mut c);
    c.advance(240); // 300 s since it resumed: the default min runtime
    assert!(!c.state.job(resumed).unwrap().settling(c.now, c.config.min_runtime));
    c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![resumed]);
}

#[test]
fn a_zero_min_runtime_chooses_victims_by_lost_work_alone() {
    let mut c = Cluster::new(2, 4);
    let (resumed, _) = resumed_and_steady(&mut c);
    c.config.min_runtime = Span::ZERO;
    c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![resumed]);
    assert_eq!(plan.preemptions[0].lost_gpu_ms, 4 * 60_000);
}

#[test]
fn a_settling_job_is_still_drained_when_nothing_else_makes_room() {
    let mut c = Cluster::new(2, 4);
    let (resumed, steady) = resumed_and_steady(&mut c);
    // Both preemptible jobs must go for an 8-GPU gang: the rule does not
    // keep it waiting.
    let gang = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    let mut drained: Vec<JobId> = plan.drains.iter().map(|d| d.job).collect();
    drained.sort();
    assert_eq!(drained, vec![resumed, steady]);
    assert_eq!(c.phase(gang), Some(Phase::Holding));

    // And alone on its node, it is drained for an on-demand job.
    let mut c = Cluster::new(1, 4);
    let job = c.submit(Tier::Preemptible, 4);
    c.step();
    let first = c.submit(Tier::OnDemand, 4);
    c.step();
    c.exit(job, ExitKind::Failed { requeue: false });
    c.step();
    c.exit(first, ExitKind::Completed);
    c.step();
    assert!(c.state.job(job).unwrap().settling(c.now, c.config.min_runtime));
    let second = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![job]);
    assert_eq!(c.phase(second), Some(Phase::Holding));
}

#[test]
fn a_gang_preemptor_empties_nodes_without_settling_jobs_when_it_can() {
    let mut c = Cluster::new(3, 4);
    let other = c.submit(Tier::Preemptible, 4);
    c.step();
    let (resumed, steady) = resumed_and_steady(&mut c);
    c.checkpoint(other);
    c.advance(1);
    // Emptying the settling job's node and `other`'s would lose least; the
    // gang takes `other`'s node and `steady`'s instead.
    c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    let mut drained: Vec<JobId> = plan.drains.iter().map(|d| d.job).collect();
    drained.sort();
    assert_eq!(drained, vec![other, steady]);
    assert_eq!(c.phase(resumed), Some(Phase::Running));
}

#[test]
fn a_reclaim_drains_settling_jobs_last() {
    let mut c = Cluster::new(2, 4);
    let (resumed, steady) = resumed_and_steady(&mut c);
    c.state.reclaim(c.model(), 4).unwrap();
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![steady]);
    assert_eq!(c.phase(resumed), Some(Phase::Running));
}

/// Tina drilled her job, preempted once long ago and running well past
/// its minimum run time, 6 s before an on-demand job arrived: the drill's
/// requeue started a new attempt, that attempt counted as settling, and
/// Oscar's job, which had more to lose, was drained in its place. A drill
/// starts no settling period now, and a restored core keeps it so.
#[test]
fn a_drill_does_not_make_a_job_settling_and_so_does_not_change_the_victim() {
    let mut c = Cluster::new(2, 4);
    let (tina, oscar) = resumed_and_steady(&mut c);
    c.advance(600); // long settled
    let drill = c.state.drill(tina, c.now, Span::from_secs(300)).unwrap();
    assert_eq!(drill.job, tina);
    c.advance(1);
    assert_eq!(c.exit(tina, ExitKind::Failed { requeue: false }), ExitEffect::Drilled);
    c.step();
    assert_eq!(c.phase(tina), Some(Phase::Running), "the drilled job runs again at once");
    c.advance(5);
    let job = c.state.job(tina).unwrap().clone();
    assert!(!job.settling(c.now, c.config.min_runtime), "a drill made it settling");
    assert_eq!(job.preemptions, 1, "a drill is no preemption");

    // As after a restart: the same attempt put back, the drill said.
    let run = job.run.clone().unwrap();
    let mut fresh = Cluster::new(2, 4);
    (fresh.now, fresh.next_job) = (c.now, c.next_job);
    let oscar_job = c.state.job(oscar).unwrap().clone();
    let oscar_run = oscar_job.run.clone().unwrap();
    fresh
        .state
        .restore_run(
            oscar_job.spec,
            RestoredRun { last_checkpoint_at: None, ..restored(&oscar_run, 0, None) },
        )
        .unwrap();
    fresh
        .state
        .restore_run(job.spec, RestoredRun { last_checkpoint_at: None, ..restored(&run, 1, None) })
        .unwrap();
    assert!(fresh.state.job(tina).unwrap().settling(fresh.now, fresh.config.min_runtime), "not yet told");
    fresh.state.restore_drilled(tina).unwrap();
    for cluster in [&mut c, &mut fresh] {
        cluster.submit(Tier::OnDemand, 4);
        let plan = cluster.step();
        assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![tina]);
        assert_eq!(cluster.phase(oscar), Some(Phase::Running));
    }
}

/// A drilled job preempted afterwards settles again: only the drill's own
/// requeue is passed over.
#[test]
fn a_preemption_after_a_drill_starts_a_settling_period_again() {
    let mut c = Cluster::new(2, 4);
    let (tina, _) = resumed_and_steady(&mut c);
    c.advance(600);
    c.state.drill(tina, c.now, Span::from_secs(300)).unwrap();
    c.exit(tina, ExitKind::Failed { requeue: false });
    c.step();
    c.advance(1);
    let od = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains.iter().map(|d| d.job).collect::<Vec<_>>(), vec![tina]);
    assert_eq!(c.exit(tina, ExitKind::Failed { requeue: false }), ExitEffect::Requeued { preempted: true });
    c.step();
    c.exit(od, ExitKind::Completed);
    c.step();
    assert_eq!(c.phase(tina), Some(Phase::Running));
    assert!(c.state.job(tina).unwrap().settling(c.now, c.config.min_runtime));
}

#[test]
fn a_requeued_job_goes_back_to_the_node_it_ran_on_when_the_fit_is_equal() {
    // Two empty nodes fit a 4-GPU job equally: best fit alone takes the
    // lowest id. A job that last ran on the other goes back there (its
    // image is in that node's cache).
    let mut c = Cluster::new(2, 8);
    let filler = c.submit(Tier::OnDemand, 8);
    c.step();
    let job = c.submit(Tier::Preemptible, 4);
    c.step();
    let ran_on = c.nodes_of(job);
    assert_ne!(ran_on, c.nodes_of(filler));
    c.exit(filler, ExitKind::Completed);
    c.advance(10);
    assert_eq!(c.exit(job, ExitKind::Lost), ExitEffect::RequeuedLost);
    c.step();
    assert_eq!(c.nodes_of(job), ran_on, "both nodes are empty: back to its own");

    // A better fit wins over the node it ran on.
    let mut c = Cluster::new(2, 8);
    let filler = c.submit(Tier::OnDemand, 8);
    c.step();
    let job = c.submit(Tier::Preemptible, 4);
    c.step();
    let ran_on = c.nodes_of(job);
    let emptied = c.nodes_of(filler);
    c.exit(filler, ExitKind::Completed);
    c.exit(job, ExitKind::Lost);
    // Placed first (on-demand), on the lowest of two empty nodes.
    let half = c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.nodes_of(half), emptied);
    assert_eq!(c.nodes_of(job), emptied, "the half-full node fits better than the empty one it ran on");
    assert_ne!(c.nodes_of(job), ran_on);
}

/// A run as the edge would restore it: `run`'s attempt, GPUs and times.
pub(crate) fn restored(
    run: &ebb_scheduler::Run,
    preemptions: u32,
    notice: Option<ebb_scheduler::Notice>,
) -> RestoredRun {
    RestoredRun {
        attempt: run.attempt,
        preemptions,
        alloc: run.alloc.clone(),
        started_at: run.started_at,
        last_checkpoint_at: run.last_checkpoint_at,
        notice,
        joined: run.joined().to_vec(),
        leaving: run.leaving().to_vec(),
        resized_at: run.resized.as_ref().map(|r| r.at),
    }
}

#[test]
fn a_staged_start_is_the_placement_from_its_hold_or_a_number_never_used_again() {
    // Staged, then the victim leaves: the placement from the hold is the
    // attempt promised.
    let mut c = Cluster::new(1, 4);
    let victim = c.submit(Tier::Preemptible, 4);
    c.step();
    let od = c.submit(Tier::OnDemand, 4);
    c.step();
    assert_eq!(c.phase(od), Some(Phase::Holding));
    let staged = c.state.stage(od).unwrap();
    assert_eq!(staged, Attempt(1));
    c.state.sanity_check().unwrap();
    assert!(c.state.stage(od).is_err(), "a start is staged once");
    assert!(c.state.stage(victim).is_err(), "only a hold's start is staged");
    c.exit(victim, ExitKind::Failed { requeue: true });
    let plan = c.step();
    assert_eq!((plan.placements[0].job, plan.placements[0].attempt), (od, staged));
    assert!(plan.placements[0].from_hold);

    // Staged, then the preemptor is cancelled: its number is spent. Staged,
    // then the node is lost: the job's next attempt is numbered after the
    // one the node may have started.
    for lose in [false, true] {
        let mut c = Cluster::new(2, 4);
        let victim = c.submit(Tier::Preemptible, 4);
        let other = c.submit(Tier::Preemptible, 4);
        c.step();
        let od = c.submit(Tier::OnDemand, 4);
        c.step();
        let node = c.state.hold(od).unwrap().alloc[0].0;
        let staged = c.state.stage(od).unwrap();
        if lose {
            c.state.lose_node(node).unwrap();
            c.state.sanity_check().unwrap();
            assert_eq!(c.phase(od), Some(Phase::Queued));
            assert_eq!(c.attempt(od), staged, "the staged number is taken");
            for j in [victim, other] {
                if c.phase(j) == Some(Phase::Running) {
                    c.exit(j, ExitKind::Completed);
                }
            }
            let plan = c.step();
            let p = plan.placements.iter().find(|p| p.job == od).expect("placed on the other node");
            assert_eq!(p.attempt, Attempt(staged.0 + 1));
            assert_ne!(p.alloc[0].0, node);
        } else {
            c.state.cancel(od).unwrap();
            c.state.sanity_check().unwrap();
            assert!(c.state.job(od).is_none());
        }
    }

    // A hold restored after a restart keeps its staged start; one whose
    // hold is not restored is fenced past it.
    let mut c = Cluster::new(1, 4);
    let victim = c.submit(Tier::Preemptible, 4);
    c.step();
    let od = c.submit(Tier::OnDemand, 4);
    c.step();
    let hold = c.state.hold(od).unwrap().alloc.clone();
    let staged = c.state.stage(od).unwrap();
    let mut fresh = Cluster::new(1, 4);
    let job = c.state.job(victim).unwrap();
    fresh.state.restore_run(job.spec.clone(), restored(job.run.as_ref().unwrap(), 0, job.notice)).unwrap();
    let spec = c.state.job(od).unwrap().spec.clone();
    fresh.state.restore_queued(spec.clone(), Attempt(0), 0).unwrap();
    assert!(fresh.state.restore_hold(od, hold.clone(), &[victim], &[], Some(Attempt(2))).is_err());
    fresh.state.restore_hold(od, hold, &[victim], &[], Some(staged)).unwrap();
    fresh.state.sanity_check().unwrap();
    fresh.exit(victim, ExitKind::Failed { requeue: true });
    let plan = fresh.step();
    assert_eq!((plan.placements[0].job, plan.placements[0].attempt), (od, staged));
    let mut other = Cluster::new(1, 4);
    other.state.restore_queued(spec, Attempt(0), 0).unwrap();
    other.state.fence_attempt(od, staged).unwrap();
    let plan = other.step();
    assert_eq!(plan.placements[0].attempt, Attempt(2));
}
