//! Ending attempts: the drain, cancels, stops, and kills.
//!
//! A drain gives a preemptible job its notice and time to save its work:
//! the notice goes on the attempt's metadata endpoint and into its notice
//! file *before* the job's signal, so a job woken by the signal finds the
//! notice wherever it looks; SIGKILL follows at the deadline. A cancel is
//! the same with its own notice (`action` and `reason` `cancel`) and
//! SIGTERM, as `scancel` sends, whatever signal the job asked for drains.
//! A stop (the rest of a gang) is SIGTERM, then SIGKILL after its grace.
//! A kill is SIGKILL at once, for attempts the server says must not run.

use std::sync::Arc;
use std::time::Duration;

use ebb_api::{AttemptRef, DrainAttempt, Membership, StopNotice};
use nix::sys::signal::Signal;

use crate::notice::{Members, Notice};
use crate::report::now_ms;
use crate::supervisor::Supervisor;

/// Delivers drain `d`: the endpoint and the notice file (in a directory
/// the job owns), then the job's signal, then SIGKILL at the deadline. A
/// repeated command (after a reconnect) does nothing.
pub(crate) fn drain<S: Supervisor>(supervisor: &Arc<S>, d: DrainAttempt) {
    let notice = Notice::new(d.notice_at_ms, d.deadline_ms, d.reason);
    deliver(supervisor, d.attempt, notice, None);
}

/// Delivers a cancel: its notice as a drain's, then SIGTERM, then SIGKILL
/// at its deadline. A cancel of an attempt being drained replaces the
/// drain's notice only if it ends the attempt sooner.
pub(crate) fn cancel<S: Supervisor>(supervisor: &Arc<S>, attempt: AttemptRef, n: StopNotice) {
    let notice = Notice::cancel(n.notice_at_ms, n.deadline_ms);
    deliver(supervisor, attempt, notice, Some(Signal::SIGTERM));
}

/// Posts `notice`, writes its file (where the attempt has one), sends
/// `signal` (the job's drain signal if none), and SIGKILL at the notice's
/// deadline if the attempt is still running then. Nothing if the attempt
/// already has a notice this one does not supersede.
fn deliver<S: Supervisor>(supervisor: &Arc<S>, a: AttemptRef, notice: Notice, signal: Option<Signal>) {
    let (action, deadline_ms) = (notice.action, notice.deadline_ms);
    let body = serde_json::to_vec_pretty(&notice).expect("notice serialises");
    let Some(target) = supervisor.post_notice(a, notice) else { return };
    let signal = signal.unwrap_or(target.signal);
    match target.drain_file.clone() {
        Some(file) => {
            // The file is written and the signal sent right after it, here:
            // a few calls on a local file, quicker than any trip to
            // another thread would be, and nothing between them.
            let written = supervisor.write_notice(&file, &body);
            supervisor.signal(a, signal);
            if let Err(e) = written {
                tracing::error!("cannot write the notice file {}: {e}", file.display());
            }
        }
        None => supervisor.signal(a, signal),
    }
    tracing::info!(
        job = %a.job,
        attempt = %a.attempt,
        action = ?action,
        deadline = deadline_ms,
        file = target.drain_file.as_deref().map(|f| f.display().to_string()).unwrap_or_default(),
        "notice"
    );
    let supervisor = supervisor.clone();
    let wait = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        if supervisor.under_notice(a, deadline_ms) {
            tracing::warn!(job = %a.job, attempt = %a.attempt, "deadline reached: SIGKILL");
            supervisor.signal(a, Signal::SIGKILL);
        }
    });
}

/// Tells an elastic attempt's part that stays of a change of its nodes:
/// on its endpoint, then in its members file. No signal: the part goes
/// on, and a launcher such as `torchrun` must not take one for its end.
/// A repeated command (after a reconnect), or one older than the change
/// the part has, does nothing.
pub(crate) fn members<S: Supervisor>(supervisor: &S, m: Membership) {
    let members = Members::new(&m);
    let body = serde_json::to_vec_pretty(&members).expect("members serialise");
    let Some(target) = supervisor.post_members(m.attempt, members) else { return };
    if let Some(file) = &target.file {
        if let Err(e) = supervisor.write_notice(file, &body) {
            tracing::error!("cannot write the members file {}: {e}", file.display());
        }
    }
    tracing::info!(
        job = %m.attempt.job,
        attempt = %m.attempt.attempt,
        change = ?m.change,
        nodes = m.nodes.len(),
        deadline = m.deadline_ms,
        "members"
    );
}

/// Ends an attempt without a notice (the rest of a gang, or every attempt
/// when the agent stops): SIGTERM, as `scancel` does, then SIGKILL after
/// `grace`.
pub(crate) fn stop<S: Supervisor>(supervisor: &Arc<S>, attempt: AttemptRef, grace: Duration) {
    supervisor.signal(attempt, Signal::SIGTERM);
    let supervisor = supervisor.clone();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        supervisor.signal(attempt, Signal::SIGKILL);
    });
}

/// Stops every attempt as the agent stops (their exits say so: they are
/// requeued), and waits until they have ended, or `grace` and a second
/// more have passed.
pub(crate) async fn stop_all<S: Supervisor>(supervisor: &Arc<S>, grace: Duration) {
    for a in supervisor.running() {
        supervisor.stop_for_shutdown(a, grace);
    }
    let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(1);
    while !supervisor.running().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills attempts the server says must not run, saying `why`.
pub(crate) fn kill_stale<S: Supervisor>(supervisor: &S, attempts: &[AttemptRef], why: &str) {
    for attempt in attempts {
        tracing::warn!(job = %attempt.job, attempt = %attempt.attempt, "{why}: killing it");
        supervisor.withdraw(*attempt);
        supervisor.signal(*attempt, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::fake::{FakeSupervisor, Op};
    use ebb_core::{Attempt, JobId};

    const A: AttemptRef = AttemptRef { job: JobId(1), attempt: Attempt(1) };

    fn drain_of(a: AttemptRef, deadline_in: Duration) -> DrainAttempt {
        let now = now_ms();
        DrainAttempt {
            attempt: a,
            notice_at_ms: now,
            deadline_ms: now + deadline_in.as_millis() as u64,
            reason: "preempted by job 2".into(),
        }
    }

    #[tokio::test]
    async fn a_drain_posts_the_notice_and_writes_its_file_before_the_signal_then_kills_at_the_deadline() {
        let (fake, _queue) = FakeSupervisor::new("drain-order");
        fake.run(A, Signal::SIGUSR1);
        drain(&fake, drain_of(A, Duration::from_millis(200)));
        let notice: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fake.drain_file(A)).unwrap()).unwrap();
        assert_eq!(notice["action"], "preempt");
        assert_eq!(notice["reason"], "preempted by job 2");
        assert_eq!(
            fake.ops(),
            vec![Op::Notice(A), Op::Signal { attempt: A, signal: Signal::SIGUSR1, notice_file: true }]
        );
        fake.until("the deadline's SIGKILL", |ops| ops.len() == 3).await;
        assert_eq!(fake.ops()[2], Op::Signal { attempt: A, signal: Signal::SIGKILL, notice_file: true });
    }

    #[tokio::test]
    async fn a_repeated_drain_is_delivered_once_and_an_exited_attempt_is_not_killed() {
        let (fake, _queue) = FakeSupervisor::new("drain-repeated");
        fake.run(A, Signal::SIGTERM);
        drain(&fake, drain_of(A, Duration::from_millis(100)));
        drain(&fake, drain_of(A, Duration::from_millis(100)));
        fake.exit(A, Some(0));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            fake.ops(),
            vec![Op::Notice(A), Op::Signal { attempt: A, signal: Signal::SIGTERM, notice_file: true }]
        );
    }

    fn cancel_of(deadline_in: Duration) -> StopNotice {
        let now = now_ms();
        StopNotice { notice_at_ms: now, deadline_ms: now + deadline_in.as_millis() as u64 }
    }

    fn notice_file(fake: &FakeSupervisor, a: AttemptRef) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(fake.drain_file(a)).unwrap()).unwrap()
    }

    /// A cancel was SIGTERM without a notice: a job's trap found nothing
    /// to say it was cancelled, or when it would be killed.
    #[tokio::test]
    async fn a_cancel_writes_its_notice_before_sigterm_then_kills_at_its_deadline() {
        let (fake, _queue) = FakeSupervisor::new("cancel");
        fake.run(A, Signal::SIGUSR1);
        let n = cancel_of(Duration::from_millis(200));
        cancel(&fake, A, n.clone());
        let notice = notice_file(&fake, A);
        assert_eq!((notice["action"].as_str(), notice["reason"].as_str()), (Some("cancel"), Some("cancel")));
        assert_eq!(notice["deadline"], crate::notice::Notice::cancel(n.notice_at_ms, n.deadline_ms).deadline);
        // SIGTERM, as scancel sends, not the signal the job asked drains for.
        assert_eq!(
            fake.ops(),
            vec![Op::Notice(A), Op::Signal { attempt: A, signal: Signal::SIGTERM, notice_file: true }]
        );
        fake.until("the deadline's SIGKILL", |ops| ops.len() == 3).await;
        assert_eq!(fake.ops()[2], Op::Signal { attempt: A, signal: Signal::SIGKILL, notice_file: true });
    }

    #[tokio::test]
    async fn a_cancel_of_a_draining_attempt_replaces_its_notice_only_if_it_ends_it_sooner() {
        let (fake, _queue) = FakeSupervisor::new("cancel-draining");
        fake.run(A, Signal::SIGUSR1);
        drain(&fake, drain_of(A, Duration::from_secs(60)));
        cancel(&fake, A, cancel_of(Duration::from_secs(120)));
        assert_eq!(notice_file(&fake, A)["action"], "preempt", "a later deadline changed the notice");
        assert_eq!(fake.ops().len(), 2);
        cancel(&fake, A, cancel_of(Duration::from_millis(100)));
        assert_eq!(notice_file(&fake, A)["action"], "cancel");
        fake.until("the cancel's SIGKILL", |ops| ops.len() == 5).await;
        assert_eq!(
            fake.ops()[2..],
            [
                Op::Notice(A),
                Op::Signal { attempt: A, signal: Signal::SIGTERM, notice_file: true },
                Op::Signal { attempt: A, signal: Signal::SIGKILL, notice_file: true },
            ]
        );
    }

    #[tokio::test]
    async fn a_stop_is_sigterm_then_sigkill_after_the_grace() {
        let (fake, _queue) = FakeSupervisor::new("stop");
        fake.run(A, Signal::SIGUSR1);
        stop(&fake, A, Duration::from_millis(50));
        fake.until("the SIGKILL", |ops| ops.len() == 2).await;
        assert_eq!(
            fake.ops(),
            vec![
                Op::Signal { attempt: A, signal: Signal::SIGTERM, notice_file: false },
                Op::Signal { attempt: A, signal: Signal::SIGKILL, notice_file: false },
            ]
        );
        assert!(!fake.is_running(A), "SIGKILL ended it");
    }

    /// An elastic job grown back onto a node it left runs the same
    /// attempt there again: the leaving part's deadline, when it comes,
    /// is not the new part's, which no notice reached.
    #[tokio::test]
    async fn a_part_started_again_after_its_node_left_is_not_killed_at_the_old_deadline() {
        let (fake, _queue) = FakeSupervisor::new("drain-grown-back");
        fake.run(A, Signal::SIGTERM);
        drain(&fake, drain_of(A, Duration::from_millis(200)));
        fake.exit(A, Some(143));
        fake.run(A, Signal::SIGTERM);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(fake.is_running(A), "the new part was killed at the old part's deadline");
        assert_eq!(
            fake.ops(),
            vec![Op::Notice(A), Op::Signal { attempt: A, signal: Signal::SIGTERM, notice_file: true }]
        );
    }

    fn shrink_at(at_ms: u64, nodes: &[&str]) -> Membership {
        crate::testing::shrink(A, nodes, at_ms)
    }

    /// The nodes that stay are told without a signal (a launcher such as
    /// torchrun would take one for its end); the file says the change as
    /// the endpoint does; a repeat or an older change is not delivered.
    #[tokio::test]
    async fn a_change_of_nodes_is_written_without_a_signal_and_only_the_latest_counts() {
        let (fake, _queue) = FakeSupervisor::new("members");
        members(&*fake, shrink_at(1_000, &["node-0"]));
        assert_eq!(fake.ops(), vec![], "an attempt not running here is told nothing");
        fake.run(A, Signal::SIGTERM);
        members(&*fake, shrink_at(1_000, &["node-0", "node-1"]));
        let file = || -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(fake.members_file(A)).unwrap()).unwrap()
        };
        assert_eq!(file()["change"], "shrink");
        assert_eq!(file()["nodes"], serde_json::json!(["node-0", "node-1"]));
        assert_eq!(file()["deadline"], ebb_core::time::rfc3339_millis(301_000));
        members(&*fake, shrink_at(1_000, &["node-0", "node-1"]));
        members(&*fake, shrink_at(999, &["node-0"]));
        assert_eq!(fake.ops(), vec![Op::Members(A)], "a repeat or an older change was delivered");
        let mut grow = shrink_at(2_000, &["node-0", "node-1", "node-3"]);
        (grow.change, grow.deadline_ms, grow.leaving, grow.joining) =
            (ebb_api::MembershipChange::Grow, None, vec![], vec!["node-3".into()]);
        members(&*fake, grow);
        assert_eq!(fake.ops(), vec![Op::Members(A), Op::Members(A)]);
        assert_eq!((file()["change"].as_str(), file().get("deadline")), (Some("grow"), None));
        assert_eq!(file()["joining"], serde_json::json!(["node-3"]));
    }
}
