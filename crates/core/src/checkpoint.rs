//! The recommended checkpoint interval (Young/Daly): τ = √(2·δ·M), where δ
//! is the time one checkpoint takes and M the mean time between
//! **unannounced** interruptions of the capacity the job runs on.
//!
//! Drained preemptions are not in M: they come with notice, so a job that
//! saves on notice loses only the drain, not the work since its last
//! periodic checkpoint. Periodic checkpoints insure against what comes
//! without notice: a node or its agent lost.

use std::fmt;

use crate::Span;

/// δ before a job has reported a checkpoint: a typical model save.
pub const DEFAULT_CHECKPOINT_TIME: Span = Span(30_000);
/// The prior on M: one unannounced interruption per this much node-time,
/// blended with what is observed (so a young cluster with no losses yet
/// does not recommend "never", and one early loss does not dominate).
pub const PRIOR_NODE_TIME: Span = Span(7 * 24 * 3_600_000);
/// Bounds on the recommendation.
pub const MIN_INTERVAL: Span = Span(10_000);
pub const MAX_INTERVAL: Span = Span(24 * 3_600_000);

/// What the interruption rate is estimated from: the capacity's observed
/// node-time and the unannounced interruptions (node losses) in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exposure {
    pub node_time: Span,
    pub interruptions: u64,
}

impl Exposure {
    /// Mean time between unannounced interruptions of one node, with the
    /// prior of one per [`PRIOR_NODE_TIME`] counted as one more observation.
    pub fn node_mtbi(&self) -> Span {
        Span((self.node_time.0 + PRIOR_NODE_TIME.0) / (self.interruptions + 1))
    }
}

/// The recommendation and what it was computed from, for `ebb show`.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub interval: Span,
    /// δ and whether it was measured (else [`DEFAULT_CHECKPOINT_TIME`]).
    pub checkpoint_time: Span,
    pub measured: bool,
    /// M for the whole job: a gang over k nodes is interrupted when any of
    /// them is, so M is one node's divided by k.
    pub mtbi: Span,
    pub nodes: u32,
    pub exposure: Exposure,
    pub clamped: bool,
}

/// τ = √(2·δ·M) for a job on `nodes` nodes with measured checkpoint time
/// `checkpoint_time` (None before its first report).
pub fn recommend(checkpoint_time: Option<Span>, exposure: Exposure, nodes: u32) -> Recommendation {
    let measured = checkpoint_time.is_some();
    let delta = checkpoint_time.unwrap_or(DEFAULT_CHECKPOINT_TIME).max(Span(1));
    let mtbi = Span(exposure.node_mtbi().0 / u64::from(nodes.max(1)));
    let raw = (2.0 * delta.0 as f64 * mtbi.0 as f64).sqrt() as u64;
    let interval = Span(raw.clamp(MIN_INTERVAL.0, MAX_INTERVAL.0));
    Recommendation {
        interval,
        checkpoint_time: delta,
        measured,
        mtbi,
        nodes: nodes.max(1),
        exposure,
        clamped: interval.0 != raw,
    }
}

impl fmt::Display for Recommendation {
    /// Why: the formula with its inputs and where each came from, as they
    /// stood when it was computed (an attempt's placement: reports that
    /// come later are for the next attempt).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "√(2 × δ {} × M {}) = {}",
            self.checkpoint_time.human(),
            self.mtbi.human(),
            self.interval.human()
        )?;
        if self.clamped {
            write!(f, " (kept within {}..{})", MIN_INTERVAL.human(), MAX_INTERVAL.human())?;
        }
        if self.measured {
            write!(f, "; δ measured from the job's checkpoint reports before this attempt")?;
        } else {
            write!(f, "; δ assumed: no checkpoint reported before this attempt")?;
        }
        write!(
            f,
            "; M from {} in {} of node time, plus a prior of one per {}",
            crate::count(self.exposure.interruptions, "unannounced interruption"),
            self.exposure.node_time.human(),
            PRIOR_NODE_TIME.human()
        )?;
        if self.nodes > 1 {
            write!(f, ", divided by the job's {} nodes", self.nodes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn young_daly_on_known_inputs() {
        // δ = 60 s, M = 7 days (no data): √(2 · 60 · 604800) s ≈ 8519 s.
        let r = recommend(Some(Span::from_secs(60)), Exposure::default(), 1);
        assert_eq!(r.mtbi, PRIOR_NODE_TIME);
        assert_eq!(r.interval.as_secs(), 8519);
        assert!(r.measured && !r.clamped);

        // 99 losses in 693 node-days (+ the prior): M = 700 d / 100 = 7 d,
        // a gang over 4 nodes sees M / 4 and so half the interval.
        let exposure = Exposure { node_time: Span(693 * 24 * HOUR), interruptions: 99 };
        assert_eq!(exposure.node_mtbi(), PRIOR_NODE_TIME);
        let gang = recommend(Some(Span::from_secs(60)), exposure, 4);
        assert_eq!(gang.interval.as_secs(), 8519 / 2);
    }

    #[test]
    fn more_interruptions_mean_shorter_intervals() {
        let calm = recommend(
            Some(Span::from_secs(20)),
            Exposure { node_time: Span(100 * HOUR), interruptions: 0 },
            1,
        );
        let rough = recommend(
            Some(Span::from_secs(20)),
            Exposure { node_time: Span(100 * HOUR), interruptions: 50 },
            1,
        );
        assert!(rough.interval < calm.interval);
        let slow_save = recommend(Some(Span::from_secs(200)), Exposure::default(), 1);
        let fast_save = recommend(Some(Span::from_secs(2)), Exposure::default(), 1);
        assert!(fast_save.interval < slow_save.interval);
    }

    #[test]
    fn defaults_and_bounds() {
        let r = recommend(None, Exposure::default(), 1);
        assert_eq!(r.checkpoint_time, DEFAULT_CHECKPOINT_TIME);
        assert!(!r.measured);
        assert!(r.to_string().contains("assumed"), "{r}");
        // A tiny save on flaky capacity would checkpoint every few ms.
        let flaky = Exposure { node_time: Span(HOUR), interruptions: 10_000 };
        let r = recommend(Some(Span(5)), flaky, 1);
        assert_eq!(r.interval, MIN_INTERVAL);
        assert!(r.clamped && r.to_string().contains("kept within"), "{r}");
    }
}
