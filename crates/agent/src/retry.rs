//! How long the agent waits before calling the server again after a call
//! failed.
//!
//! Every agent of a cluster loses the server at the same moment when it
//! restarts, and fixed or merely doubling waits bring them all back at the
//! same moments too: the restarted server, replaying its log, takes every
//! node's registration and every node's backlog of reports at once. So
//! each wait is drawn at random between zero and an exponential envelope
//! ("full jitter"): the envelope doubles from `first` to `cap` (backon's
//! [`ExponentialBuilder`]), and the draw spreads the agents over it. Each
//! agent seeds its own generator, so two agents never wait alike.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// An exponential envelope for the waits between tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// The envelope of the first wait.
    pub first: Duration,
    /// No wait is longer than this.
    pub cap: Duration,
}

/// Reports: starts and exits are billed, so they are retried until they
/// get through, but never more than a few seconds apart.
pub(crate) const REPORTS: Policy = Policy { first: Duration::from_millis(50), cap: Duration::from_secs(4) };

/// The command poll is the heartbeat: its retries stay well under the
/// server's heartbeat timeout (10 s by default), so a short outage never
/// makes the node lost.
pub(crate) const POLLS: Policy = Policy { first: Duration::from_millis(200), cap: Duration::from_secs(2) };

/// Registration, and the pause before registering again with a server
/// that restarted (every agent learns of the restart at once).
pub(crate) const REGISTRATION: Policy =
    Policy { first: Duration::from_millis(300), cap: Duration::from_secs(3) };

impl Policy {
    /// The waits of one run of tries, drawn by a generator seeded from
    /// the operating system: agents started together still differ.
    pub(crate) fn delays(self) -> Delays {
        self.delays_seeded(getrandom::u64().unwrap_or_else(|_| fastrand::u64(..)))
    }

    /// The waits drawn by a generator seeded with `seed`: the same seed,
    /// the same waits.
    pub(crate) fn delays_seeded(self, seed: u64) -> Delays {
        let envelope = ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_max_delay(self.cap)
            .with_factor(2.0)
            .without_max_times()
            .build();
        Delays { envelope, rng: fastrand::Rng::with_seed(seed) }
    }
}

impl BackoffBuilder for Policy {
    type Backoff = Delays;

    fn build(self) -> Delays {
        self.delays()
    }
}

/// The waits between tries, without end: each drawn uniformly between
/// zero and its envelope.
#[derive(Debug)]
pub(crate) struct Delays {
    envelope: ExponentialBackoff,
    rng: fastrand::Rng,
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let envelope = self.envelope.next()?;
        Some(envelope.mul_f64(self.rng.f64()))
    }
}

impl Delays {
    /// The next wait (the envelope never runs out).
    pub(crate) fn next_wait(&mut self) -> Duration {
        self.next().unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound of the `i`th wait.
    fn envelope(policy: Policy, i: u32) -> Duration {
        policy.first.saturating_mul(2u32.saturating_pow(i)).min(policy.cap)
    }

    #[test]
    fn two_agents_wait_apart_within_the_cap_and_longer_as_failures_go_on() {
        for policy in [REPORTS, POLLS, REGISTRATION] {
            // Two agents, each with its own generator, as in production.
            let one: Vec<Duration> = policy.delays().take(16).collect();
            let other: Vec<Duration> = policy.delays().take(16).collect();
            assert_ne!(one, other, "two agents retry at the same moments");
            for (i, (a, b)) in one.iter().zip(&other).enumerate() {
                let bound = envelope(policy, i as u32);
                assert!(*a <= bound && *b <= bound, "wait {i}: {a:?} and {b:?} over {bound:?}");
                assert!(bound <= policy.cap);
            }
            // The waits grow: averaged over many runs (seeded, so the test
            // always sees the same draws), each is about half its envelope,
            // which doubles until the cap.
            let runs: Vec<Vec<Duration>> =
                (0..500).map(|seed| policy.delays_seeded(seed).take(16).collect()).collect();
            let mean = |i: usize| runs.iter().map(|r| r[i]).sum::<Duration>() / runs.len() as u32;
            let mut i = 0;
            while envelope(policy, i as u32 + 1) < policy.cap {
                assert!(
                    mean(i + 1) > mean(i) * 3 / 2,
                    "{policy:?}: wait {} is no longer than wait {i}",
                    i + 1
                );
                i += 1;
            }
            let capped = mean(15);
            assert!(capped > policy.cap / 3 && capped < policy.cap * 2 / 3, "{policy:?}: {capped:?}");
        }
    }

    #[test]
    fn a_seed_gives_the_same_waits() {
        let a: Vec<Duration> = REPORTS.delays_seeded(7).take(8).collect();
        let b: Vec<Duration> = REPORTS.delays_seeded(7).take(8).collect();
        assert_eq!(a, b);
    }
}
