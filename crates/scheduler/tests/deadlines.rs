//! Deadline promotion: a preemptible job the edge judges late moves to the
//! on-demand tier, queued or running, and is no victim from then on.

mod common;

use common::Cluster;
use ebb_core::{ReservationId, TenantId, Tier, Time};
use ebb_scheduler::*;

#[test]
fn a_running_job_promoted_in_place_is_no_victim_and_counts_as_on_demand() {
    let mut c = Cluster::new(1, 4);
    let job = c.submit(Tier::Preemptible, 4);
    c.step();
    c.advance(60);
    assert_eq!(c.state.promote(job, c.now), Ok(Promoted::Running));
    c.state.sanity_check().unwrap();
    let j = c.state.job(job).unwrap();
    assert_eq!((j.spec.tier, j.phase, j.attempt.0), (Tier::OnDemand, Phase::Running, 1));
    let m = c.state.model(c.model()).unwrap();
    assert_eq!((m.on_demand_used, m.preemptible_active), (4, 0));
    // An on-demand job that needs its GPUs now waits instead of evicting it.
    let waiting = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert!(plan.drains.is_empty() && plan.placements.is_empty(), "{plan:#?}");
    assert_eq!(c.phase(waiting), Some(Phase::Queued));
    // It ends as an on-demand job does, and its GPUs go to the waiting one.
    assert_eq!(c.exit(job, ExitKind::Completed), ExitEffect::Finished);
    let plan = c.step();
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![waiting]);
}

/// A promoted job took its on-demand place by its submission time: a
/// tenant could hold an early place at the preemptible price (a deadline
/// job submitted long before) and claim it later. It joins the on-demand
/// queue at its promotion now, behind on-demand jobs submitted before.
#[test]
fn a_queued_job_promoted_joins_the_on_demand_queue_at_its_promotion() {
    let mut c = Cluster::new(1, 4);
    let running = c.submit(Tier::OnDemand, 4);
    c.step();
    let early = c.submit(Tier::Preemptible, 4);
    c.advance(10);
    let on_demand = c.submit(Tier::OnDemand, 4);
    c.advance(10);
    assert_eq!(c.state.promote(early, c.now), Ok(Promoted::Queued));
    c.state.sanity_check().unwrap();
    assert_eq!(c.state.job(early).unwrap().spec.submitted_at, c.now);
    assert_eq!((c.state.queued(Tier::OnDemand), c.state.queued(Tier::Preemptible)), (2, 0));
    c.advance(10);
    let after = c.submit(Tier::OnDemand, 4);
    c.exit(running, ExitKind::Completed);
    let plan = c.step();
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![on_demand]);
    c.exit(on_demand, ExitKind::Completed);
    let plan = c.step();
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![early], "ahead of later ones");
    assert_eq!(c.phase(after), Some(Phase::Queued));
}

#[test]
fn a_job_on_lent_reserved_gpus_is_not_promoted_past_the_on_demand_cap() {
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
    let on_demand = c.submit(Tier::OnDemand, 4);
    let lent = c.submit(Tier::Preemptible, 4);
    c.step();
    assert_eq!(c.phase(lent), Some(Phase::Running));
    let refused = c.state.promote(lent, c.now).unwrap_err();
    assert!(matches!(refused, StateError::Conflict(_)), "{refused:?}");
    c.state.sanity_check().unwrap();
    assert_eq!(c.state.job(lent).unwrap().spec.tier, Tier::Preemptible);
    // Once the on-demand room is free again, it moves.
    c.exit(on_demand, ExitKind::Completed);
    assert_eq!(c.state.promote(lent, c.now), Ok(Promoted::Running));
    c.state.sanity_check().unwrap();
}

#[test]
fn only_preemptible_jobs_not_draining_are_promoted() {
    let mut c = Cluster::new(1, 4);
    let on_demand = c.submit(Tier::OnDemand, 1);
    let job = c.submit(Tier::Preemptible, 1);
    c.step();
    assert!(matches!(c.state.promote(on_demand, c.now), Err(StateError::Invalid(_))));
    let window = c.config.drain_window;
    c.state.drill(job, c.now, window).unwrap();
    assert!(matches!(c.state.promote(job, c.now), Err(StateError::Conflict(_))));
    c.state.sanity_check().unwrap();
}
