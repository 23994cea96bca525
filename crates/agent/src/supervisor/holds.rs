//! Which attempt holds which GPUs, for starts held back until their GPUs
//! are free (a preemptor's start, sent with its victims' notices).
//!
//! An attempt holds its GPUs from its start until its exit has been
//! handed to the reporter. Once every process of it is gone (its cgroup
//! empty) it no longer holds them in fact: a start waiting for them may
//! run at once, while the exit is read and reported, and reports its own
//! start after that exit, the order the server reads a node's report in.

use std::collections::HashMap;
use std::sync::Mutex;

use ebb_api::AttemptRef;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct GpuHolds {
    held: Mutex<HashMap<AttemptRef, Hold>>,
    /// Woken at every change, and when a waiting start is withdrawn.
    changed: Notify,
}

struct Hold {
    /// The GPUs, as a mask of their indices.
    mask: u64,
    /// Every process of the attempt is gone; its exit is not yet reported.
    gone: bool,
}

impl GpuHolds {
    /// Attempt `a` runs on `gpus`.
    pub(crate) fn hold(&self, a: AttemptRef, gpus: &[u8]) {
        self.held.lock().expect("holds").insert(a, Hold { mask: mask(gpus), gone: false });
    }

    /// Every process of `a` is gone: its GPUs are free to start on.
    pub(crate) fn gone(&self, a: AttemptRef) {
        if let Some(hold) = self.held.lock().expect("holds").get_mut(&a) {
            hold.gone = true;
        }
        self.changed.notify_waiters();
    }

    /// `a`'s exit has been handed to the reporter: a start on its GPUs
    /// may be reported.
    pub(crate) fn reported(&self, a: AttemptRef) {
        self.held.lock().expect("holds").remove(&a);
        self.changed.notify_waiters();
    }

    /// Wakes the starts waiting here, to look again whether they were
    /// withdrawn.
    pub(crate) fn wake(&self) {
        self.changed.notify_waiters();
    }

    /// Holds start `a` back until no process of another attempt holds any
    /// of `gpus`: true then, false once `withdrawn` says so.
    pub(crate) async fn free_for(&self, a: AttemptRef, gpus: &[u8], withdrawn: impl Fn() -> bool) -> bool {
        self.until(a, gpus, withdrawn, |hold| !hold.gone).await
    }

    /// Once start `a` runs on `gpus`: waits until the exits of the
    /// attempts whose processes left them have been handed to the
    /// reporter, so that its start is reported after them.
    pub(crate) async fn reported_for(&self, a: AttemptRef, gpus: &[u8]) {
        self.until(a, gpus, || false, |hold| hold.gone).await;
    }

    /// Until no other attempt holds any of `gpus` in a way that `blocks`
    /// (true), or until `withdrawn` (false).
    async fn until(
        &self,
        a: AttemptRef,
        gpus: &[u8],
        withdrawn: impl Fn() -> bool,
        blocks: impl Fn(&Hold) -> bool,
    ) -> bool {
        let mask = mask(gpus);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so no wake-up between is missed.
            changed.as_mut().enable();
            if withdrawn() {
                return false;
            }
            let busy = self
                .held
                .lock()
                .expect("holds")
                .iter()
                .any(|(other, hold)| *other != a && hold.mask & mask != 0 && blocks(hold));
            if !busy {
                return true;
            }
            changed.await;
        }
    }
}

/// GPU indices as a bit mask (indices past 63 are not a node's).
fn mask(gpus: &[u8]) -> u64 {
    gpus.iter().filter(|g| **g < 64).fold(0, |mask, g| mask | 1 << g)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use ebb_core::{Attempt, JobId};

    const VICTIM: AttemptRef = AttemptRef { job: JobId(1), attempt: Attempt(1) };
    const OTHER: AttemptRef = AttemptRef { job: JobId(2), attempt: Attempt(1) };
    const PREEMPTOR: AttemptRef = AttemptRef { job: JobId(3), attempt: Attempt(1) };

    /// Whether `f` is still waiting after a moment.
    async fn waits<F: std::future::Future>(f: &mut std::pin::Pin<&mut F>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f.as_mut()).await.is_err()
    }

    /// What `f` gives, which it must within a few seconds.
    async fn done<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(5), f).await.expect("still waiting")
    }

    #[tokio::test]
    async fn a_start_runs_once_its_victims_processes_are_gone_and_is_reported_after_their_exits() {
        let holds = GpuHolds::default();
        holds.hold(VICTIM, &[0, 1]);
        holds.hold(OTHER, &[2, 3]);
        let free = holds.free_for(PREEMPTOR, &[1, 2], || false);
        tokio::pin!(free);
        assert!(waits(&mut free).await, "both victims still run");
        holds.gone(VICTIM);
        assert!(waits(&mut free).await, "one victim still runs");
        holds.gone(OTHER);
        assert!(done(free).await, "every process on its GPUs is gone");

        // It runs; its start is reported only after both exits.
        holds.hold(PREEMPTOR, &[1, 2]);
        let reported = holds.reported_for(PREEMPTOR, &[1, 2]);
        tokio::pin!(reported);
        assert!(waits(&mut reported).await, "no exit reported yet");
        holds.reported(OTHER);
        assert!(waits(&mut reported).await, "one exit still to report");
        holds.reported(VICTIM);
        done(reported).await;
    }

    #[tokio::test]
    async fn other_gpus_and_its_own_hold_do_not_hold_a_start_back() {
        let holds = GpuHolds::default();
        holds.hold(VICTIM, &[0]);
        holds.hold(PREEMPTOR, &[1]);
        assert!(done(holds.free_for(PREEMPTOR, &[1], || false)).await);
        done(holds.reported_for(PREEMPTOR, &[1])).await;
        // Indices a node cannot have hold nothing.
        assert!(done(holds.free_for(PREEMPTOR, &[64, 200], || false)).await);
    }

    #[tokio::test]
    async fn a_reported_exit_frees_the_gpus_of_an_attempt_never_marked_gone() {
        // Where the exit waited for uploads, or ran in a container: its
        // GPUs are free only once it is reported.
        let holds = GpuHolds::default();
        holds.hold(VICTIM, &[0]);
        let free = holds.free_for(PREEMPTOR, &[0], || false);
        tokio::pin!(free);
        assert!(waits(&mut free).await);
        holds.reported(VICTIM);
        assert!(done(free).await);
        done(holds.reported_for(PREEMPTOR, &[0])).await;
    }

    /// Whether `f` is done at its first poll.
    fn ready_now<F: std::future::Future>(f: F) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::pin!(f).poll(&mut cx).is_ready()
    }

    proptest::proptest! {
        /// Against any others' GPUs (indices past a node's among them) in
        /// either state: a start is free exactly when no other attempt's
        /// process is on one of its GPUs, and reported exactly when no
        /// other's exit on them is still to report.
        #[test]
        fn a_start_waits_for_exactly_the_attempts_on_its_gpus(
            others in proptest::collection::vec(
                (proptest::collection::vec(0u8..70, 0..4), proptest::bool::ANY), 0..6),
            mine in proptest::collection::vec(0u8..70, 0..4),
        ) {
            let holds = GpuHolds::default();
            let on_mine = |gpus: &[u8]| gpus.iter().any(|g| *g < 64 && mine.contains(g));
            for (i, (gpus, gone)) in others.iter().enumerate() {
                let a = AttemptRef { job: JobId(10 + i as u64), attempt: Attempt(1) };
                holds.hold(a, gpus);
                if *gone {
                    holds.gone(a);
                }
            }
            holds.hold(PREEMPTOR, &mine);
            let running = others.iter().any(|(gpus, gone)| !gone && on_mine(gpus));
            let unreported = others.iter().any(|(gpus, gone)| *gone && on_mine(gpus));
            proptest::prop_assert_eq!(ready_now(holds.free_for(PREEMPTOR, &mine, || false)), !running);
            proptest::prop_assert_eq!(ready_now(holds.reported_for(PREEMPTOR, &mine)), !unreported);
            // Once every other's exit is reported, nothing holds it back.
            for i in 0..others.len() {
                holds.reported(AttemptRef { job: JobId(10 + i as u64), attempt: Attempt(1) });
            }
            proptest::prop_assert!(ready_now(holds.free_for(PREEMPTOR, &mine, || false)));
            proptest::prop_assert!(ready_now(holds.reported_for(PREEMPTOR, &mine)));
        }
    }

    #[tokio::test]
    async fn a_withdrawn_start_stops_waiting_when_woken() {
        let holds = Arc::new(GpuHolds::default());
        holds.hold(VICTIM, &[0]);
        let withdrawn = Arc::new(AtomicBool::new(false));
        let task = {
            let (holds, withdrawn) = (holds.clone(), withdrawn.clone());
            tokio::spawn(
                async move { holds.free_for(PREEMPTOR, &[0], || withdrawn.load(Ordering::SeqCst)).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        withdrawn.store(true, Ordering::SeqCst);
        holds.wake();
        assert!(!done(task).await.unwrap(), "withdrawn, not started");
    }
}
