//! Why a job waits: every job a pass leaves waiting says why, with the
//! numbers.

use super::*;

/// The reason a pass gives for `job`, which must be the first of its class.
fn pending(plan: &Plan, job: JobId) -> Pending {
    plan.pending
        .iter()
        .find(|(j, _)| *j == job)
        .map(|(_, why)| why.clone())
        .unwrap_or_else(|| panic!("no reason for {job} in {:?}", plan.pending))
}

#[test]
fn every_job_left_waiting_says_why_with_the_numbers() {
    let mut c = Cluster::new(2, 4);
    let m = c.model();
    let owner = TenantId(9);
    c.state
        .add_reservation(Reservation {
            id: ReservationId(1),
            tenant: owner,
            gpu_model: m,
            gpus: 4,
            start: Time::ZERO,
            end: Time::from_secs(86_400),
        })
        .unwrap();
    c.state
        .add_reservation(Reservation {
            id: ReservationId(2),
            tenant: TenantId(5),
            gpu_model: m,
            gpus: 2,
            start: Time::from_secs(3_600),
            end: Time::from_secs(7_200),
        })
        .unwrap();
    // On-demand may use 8 - 4 reserved: the second 4-GPU job is capped.
    let od1 = c.submit(Tier::OnDemand, 4);
    let od2 = c.submit(Tier::OnDemand, 4);
    // A reserved job before its reservation starts.
    let early = c.submit_as(Tier::Reserved, 2, TenantId(5));
    let plan = c.step();
    assert_eq!(c.phase(od1), Some(Phase::Running));
    assert_eq!(pending(&plan, od2), Pending::ReservationCap { model: m, capacity: 8, reserved: 4, used: 4 });
    assert_eq!(
        pending(&plan, early),
        Pending::ReservationNotStarted { model: m, starts: Some(Time::from_secs(3_600)) }
    );
    // Preemptible work borrows the reserved half; once it is full the rest
    // wait for free GPUs, and the second of a class waits behind the first.
    let borrower = c.submit(Tier::Preemptible, 3);
    let p1 = c.submit(Tier::Preemptible, 2);
    let p2 = c.submit(Tier::Preemptible, 2);
    let plan = c.step();
    assert_eq!(c.phase(borrower), Some(Phase::Running));
    assert_eq!(pending(&plan, p1), Pending::Resources { model: m, largest_free: 1 });
    assert!(plan.pending.iter().all(|(j, _)| *j != p2), "only the first of a class is looked at");
    assert_eq!(c.state.first_in_line(p2), Some(p1));
    // The reservation's owner exceeds it.
    let r1 = c.submit_as(Tier::Reserved, 4, owner);
    let plan = c.step();
    assert!(plan.preemptions.iter().any(|p| p.preemptor == r1), "the owner takes its GPUs back");
    let r2 = c.submit_as(Tier::Reserved, 1, owner);
    let plan = c.step();
    assert_eq!(pending(&plan, r2), Pending::ReservationFull { model: m, reserved: 4, used: 4 });
    // The operator reclaims all preemptible capacity.
    c.exit(borrower, ExitKind::Failed { requeue: true });
    c.step();
    c.exit(od1, ExitKind::Completed);
    c.state.reclaim(m, 8).unwrap();
    let plan = c.step();
    assert_eq!(pending(&plan, p1), Pending::Reclaimed { model: m, limit: 0, used: 0 });
}

#[test]
fn a_gang_says_which_nodes_it_waits_for_and_smaller_work_says_it_waits_behind_it() {
    let mut c = Cluster::new(2, 4);
    let m = c.model();
    let small = c.submit(Tier::Preemptible, 1);
    c.step();
    let gang = c.submit(Tier::Preemptible, 8);
    let behind = c.submit(Tier::Preemptible, 4);
    let plan = c.step();
    let Pending::WholeNodes { model, nodes, free, earmarked } = pending(&plan, gang) else {
        panic!("{:?}", plan.pending)
    };
    assert_eq!((model, nodes, free), (m, 2, 1));
    assert_eq!(earmarked.len(), 2, "both nodes are kept for the gang");
    // The free node would take the 4-GPU job, but it is kept for the gang.
    assert_eq!(pending(&plan, behind), Pending::Priority { behind: gang });
    // More than the cluster's capacity in service: a node is drained.
    c.exit(small, ExitKind::Completed);
    let plan = c.step();
    assert_eq!(c.phase(gang), Some(Phase::Running));
    assert!(plan.pending.iter().any(|(j, _)| *j == behind));
    let node = c.state.node_by_name("node-1").unwrap();
    c.state.drain_node(node).unwrap();
    c.exit(gang, ExitKind::Completed);
    let again = c.submit(Tier::OnDemand, 8);
    let plan = c.step();
    assert_eq!(pending(&plan, again), Pending::NoCapacity { model: None });
}
