//! Fire drills: a running preemptible job gets a real drain notice on its
//! owner's word, and its exit requeues it at once without counting as a
//! preemption.

mod common;

use common::Cluster;
use ebb_core::{JobId, Span, TenantId, Tier};
use ebb_scheduler::*;

#[test]
fn a_drill_gives_the_notice_with_the_drain_window_and_requeues_without_a_preemption() {
    let mut c = Cluster::new(1, 4);
    let job = c.submit(Tier::Preemptible, 4);
    c.step();
    c.advance(60);
    let window = c.config.drain_window;
    let drain = c.state.drill(job, c.now, window).unwrap();
    c.state.sanity_check().unwrap();
    assert_eq!((drain.job, drain.attempt, drain.reason), (job, c.attempt(job), DrainReason::Drill));
    assert_eq!((drain.notice_at, drain.deadline), (c.now, c.now + Span::from_secs(300)));
    assert_eq!(c.phase(job), Some(Phase::Draining));
    let notice = c.state.job(job).unwrap().notice.unwrap();
    assert_eq!(notice.reason, DrainReason::Drill);

    // A pass while it drains starts nothing on its GPUs and drains nothing.
    let other = c.submit(Tier::Preemptible, 1);
    let plan = c.step();
    assert!(plan.placements.is_empty() && plan.drains.is_empty(), "{plan:#?}");

    c.advance(2);
    assert_eq!(c.exit(job, ExitKind::Failed { requeue: false }), ExitEffect::Drilled);
    let j = c.state.job(job).unwrap();
    assert_eq!((j.phase, j.preemptions, j.notice), (Phase::Queued, 0, None));
    // Requeued at once, in its place by submission time: it starts again
    // before the job submitted after it.
    let plan = c.step();
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![job]);
    assert_eq!(plan.placements[0].attempt.0, 2);
    assert_eq!(c.phase(other), Some(Phase::Queued));
}

#[test]
fn a_drilled_exit_never_consults_max_preemptions() {
    let mut c = Cluster::new(1, 2);
    let job = JobId(100);
    let spec = JobSpec {
        id: job,
        tenant: TenantId(1),
        tier: Tier::Preemptible,
        gpus: 2,
        max_gpus: None,
        gpu_model: None,
        submitted_at: c.now,
        priority: 0,
        max_preemptions: Some(0),
    };
    c.state.submit(spec).unwrap();
    for attempt in 1..=3 {
        c.step();
        assert_eq!(c.attempt(job).0, attempt);
        c.state.drill(job, c.now, Span::from_secs(10)).unwrap();
        c.advance(1);
        assert_eq!(c.exit(job, ExitKind::Failed { requeue: false }), ExitEffect::Drilled);
    }
    assert_eq!(c.state.job(job).unwrap().preemptions, 0);
}

#[test]
fn a_drilled_job_that_finishes_or_is_lost_ends_as_it_would_without_the_drill() {
    let mut c = Cluster::new(2, 2);
    let finishing = c.submit(Tier::Preemptible, 2);
    let lost = c.submit(Tier::Preemptible, 2);
    c.step();
    for job in [finishing, lost] {
        c.state.drill(job, c.now, Span::from_secs(10)).unwrap();
    }
    assert_eq!(c.exit(finishing, ExitKind::Completed), ExitEffect::Finished);
    assert_eq!(c.exit(lost, ExitKind::Lost), ExitEffect::RequeuedLost);
    assert!(c.state.job(finishing).is_none());
    assert_eq!(c.phase(lost), Some(Phase::Queued));
}

#[test]
fn a_real_preemption_after_a_drill_counts_again() {
    let mut c = Cluster::new(1, 4);
    let victim = c.submit(Tier::Preemptible, 4);
    c.step();
    c.state.drill(victim, c.now, Span::from_secs(10)).unwrap();
    c.advance(1);
    assert_eq!(c.exit(victim, ExitKind::Failed { requeue: false }), ExitEffect::Drilled);
    c.step();
    let od = c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    assert_eq!(plan.drains[0].reason, DrainReason::Preempted { by: od });
    assert_eq!(c.exit(victim, ExitKind::Failed { requeue: false }), ExitEffect::Requeued { preempted: true });
    assert_eq!(c.state.job(victim).unwrap().preemptions, 1);
}

#[test]
fn only_a_running_preemptible_job_without_a_notice_can_be_drilled() {
    let mut c = Cluster::new(1, 4);
    let od = c.submit(Tier::OnDemand, 1);
    let draining = c.submit(Tier::Preemptible, 1);
    c.step();
    let queued = c.submit(Tier::Preemptible, 4);
    let window = Span::from_secs(10);
    let refused = |c: &mut Cluster, job| c.state.drill(job, c.now, window).unwrap_err();
    assert!(matches!(refused(&mut c, od), StateError::Invalid(m) if m.contains("on-demand")));
    assert!(matches!(refused(&mut c, queued), StateError::Conflict(m) if m.contains("not running")));
    c.state.drill(draining, c.now, window).unwrap();
    assert!(matches!(refused(&mut c, draining), StateError::Conflict(m) if m.contains("already draining")));
    assert!(matches!(refused(&mut c, JobId(99)), StateError::NotFound(_)));
    c.state.sanity_check().unwrap();
}

/// A job's own requeue earns no protection, as a drill earns none: a job
/// preempted once that then requeues itself is not settling in its next
/// attempt, so an on-demand job drains it (the cheapest victim) rather
/// than another tenant's older, costlier job. Before, requeueing itself
/// every 45 s kept a job safe for ever.
#[test]
fn a_job_that_requeues_itself_is_not_spared_as_settling() {
    let mut c = Cluster::new(2, 4);
    let looping = c.submit(Tier::Preemptible, 4);
    c.step();
    let od = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert_eq!(plan.drains[0].job, looping);
    assert_eq!(
        c.exit(looping, ExitKind::Failed { requeue: false }),
        ExitEffect::Requeued { preempted: true }
    );
    c.step();
    assert_eq!(c.exit(od, ExitKind::Completed), ExitEffect::Finished);
    let older = c.submit(Tier::Preemptible, 4);
    c.step();
    c.advance(100);
    assert_eq!(c.exit(looping, ExitKind::Requeue), ExitEffect::RequeuedLost);
    c.step();
    assert!(c.state.job(looping).unwrap().requeued_itself);
    c.advance(1);
    c.submit(Tier::OnDemand, 4);
    let plan = c.step();
    let drained: Vec<JobId> = plan.drains.iter().map(|d| d.job).collect();
    assert_eq!(drained, [looping], "the older job, with 100 s of work, was drained instead");
    assert!(c.state.job(older).unwrap().notice.is_none());
    c.state.sanity_check().unwrap();
}
