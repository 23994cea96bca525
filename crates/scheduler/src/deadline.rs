//! The deadline rule, the one the server applies and the simulator
//! replays: a preemptible job that must be done by a time stays on the
//! preemptible tier while the rest of its run time and a margin fit before
//! then, and is promoted to on-demand the first moment they do not.
//!
//! The margin is what one more preemption can cost a job that saves on
//! notice: the drain window, a restart allowance (back in the queue,
//! placed as on-demand, restored from its checkpoint), and a tenth of the
//! remaining run time for an estimate drawn from a rate that varies. How
//! much run time the rest needs is the caller's: the server estimates it
//! from the job's progress reports, the simulator knows it.

use ebb_core::{Span, Time};

/// Time allowed for one restart after a preemption: requeued, placed on
/// on-demand capacity, started and restored from the checkpoint.
pub const RESTART_ALLOWANCE: Span = Span(60_000);

/// The margin a job needing `needed` more run time keeps before its
/// deadline.
pub fn margin(needed: Span, drain_window: Span) -> Span {
    Span(drain_window.0.saturating_add(RESTART_ALLOWANCE.0).saturating_add(needed.0 / 10))
}

/// Whether a job needing `needed` more run time at `now` must be promoted
/// to meet `deadline`.
pub fn must_promote(now: Time, needed: Span, deadline: Time, drain_window: Span) -> bool {
    let finish = u128::from(now.0) + u128::from(needed.0) + u128::from(margin(needed, drain_window).0);
    finish > u128::from(deadline.0)
}

/// The last instant a job needing `needed` more run time may wait until
/// and still meet `deadline` with its margin: where it must be judged
/// again if nothing changes before.
pub fn latest_start(needed: Span, deadline: Time, drain_window: Span) -> Time {
    Time(deadline.0.saturating_sub(margin(needed, drain_window).0).saturating_sub(needed.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H: u64 = 3_600_000;

    #[test]
    fn a_job_is_promoted_once_its_rest_and_margin_no_longer_fit() {
        let window = Span(300_000);
        // 3 h more: margin 5 min + 1 min + 18 min = 24 min.
        assert_eq!(margin(Span(3 * H), window), Span(24 * 60_000));
        let deadline = Time(10 * H);
        let latest = latest_start(Span(3 * H), deadline, window);
        assert_eq!(latest, Time(10 * H - 3 * H - 24 * 60_000));
        assert!(!must_promote(latest, Span(3 * H), deadline, window));
        assert!(must_promote(Time(latest.0 + 1), Span(3 * H), deadline, window));
    }

    proptest! {
        /// The judgement and the latest start agree at every instant
        /// (promoted exactly after it), and a job that cannot fit even
        /// now is promoted whenever it is judged; no panic at the extremes.
        #[test]
        fn the_judgement_and_the_latest_start_agree(
            now in any::<u64>(), needed in any::<u64>(), deadline in any::<u64>(), window in any::<u64>()
        ) {
            let (needed, deadline, window) = (Span(needed), Time(deadline), Span(window));
            let promote = must_promote(Time(now), needed, deadline, window);
            let least = u128::from(needed.0) + u128::from(margin(needed, window).0);
            if least <= u128::from(deadline.0) {
                prop_assert_eq!(promote, now > latest_start(needed, deadline, window).0);
            } else {
                prop_assert!(promote);
            }
        }
    }
}
