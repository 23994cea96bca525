//! A job's checkpoints as its record keeps them: the latest one, and the
//! recent durations the checkpoint interval is computed from.

use super::*;

/// A checkpoint a job reported: when, in which attempt, at which step,
/// how large, and how long taking it took. Stored as records before it
/// stored it, less the time as text (`at`, read and ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedCheckpoint {
    pub at_ms: u64,
    pub attempt: Attempt,
    pub step: Option<u64>,
    pub bytes: Option<u64>,
    /// How long taking it took, seconds.
    pub seconds: f64,
}

impl SavedCheckpoint {
    pub fn view(&self) -> ebb_api::Checkpoint {
        ebb_api::Checkpoint {
            at: rfc3339(self.at_ms),
            at_ms: self.at_ms,
            attempt: self.attempt.0,
            step: self.step,
            bytes: self.bytes,
            seconds: self.seconds,
        }
    }
}

/// What a job's checkpoint reports have shown.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStats {
    pub last: Option<Box<SavedCheckpoint>>,
    pub count: u64,
    /// How long the latest few took, milliseconds: δ is their mean.
    pub recent_ms: Vec<u64>,
    /// The job was warned that a checkpoint does not fit the drain window.
    pub warned: bool,
}

impl CheckpointStats {
    const RECENT: usize = 5;

    pub(super) fn record(&mut self, checkpoint: SavedCheckpoint, duration_ms: u64) {
        self.last = Some(Box::new(checkpoint));
        self.count += 1;
        self.recent_ms.push(duration_ms);
        if self.recent_ms.len() > Self::RECENT {
            self.recent_ms.remove(0);
        }
    }

    /// δ: the mean of the recent checkpoint times, once there are any
    /// (summed wide: each is a node's word, up to `u64::MAX`).
    pub(super) fn checkpoint_time(&self) -> Option<Span> {
        let n = self.recent_ms.len() as u128;
        let sum: u128 = self.recent_ms.iter().map(|&ms| u128::from(ms)).sum();
        (n > 0).then(|| Span(u64::try_from(sum / n).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_checkpoint_stored_with_its_time_as_text_reads_and_is_written_without_it() {
        let stored = r#"{"last": {"at": "2025-12-01T10:00:00.000Z", "at_ms": 1764583200000, "attempt": 3,
            "step": 120, "bytes": null, "seconds": 2.5}, "count": 4, "recent_ms": [2500], "warned": false}"#;
        let stats: CheckpointStats = serde_json::from_str(stored).unwrap();
        let last = stats.last.as_deref().unwrap();
        assert_eq!(
            (last.at_ms, last.attempt, last.step, last.seconds),
            (1_764_583_200_000, Attempt(3), Some(120), 2.5)
        );
        let written = serde_json::to_value(&stats).unwrap();
        assert!(written["last"].get("at").is_none(), "{written}");
        let view = last.view();
        assert_eq!((view.at.as_str(), view.attempt), ("2025-12-01T10:00:00.000Z", 3));
    }

    proptest! {

        /// A checkpoint at any instant, attempt, step, size and duration a
        /// node may report: stored in either form (with the old text of
        /// its time, whatever it says), it reads back as it was, and its
        /// view writes a time even past the year 9999.
        #[test]
        fn any_stored_checkpoint_reads_back_and_shows(
            at_ms in any::<u64>(),
            attempt in any::<u32>(),
            step in any::<Option<u64>>(),
            bytes in any::<Option<u64>>(),
            seconds in 0.0..1e18f64,
            at_text in ".{0,40}",
        ) {
            let saved = SavedCheckpoint { at_ms, attempt: Attempt(attempt), step, bytes, seconds };
            let json = serde_json::to_value(&saved).unwrap();
            prop_assert_eq!(serde_json::from_value::<SavedCheckpoint>(json.clone()).unwrap(), saved.clone());
            let mut old = json;
            old["at"] = serde_json::Value::String(at_text);
            prop_assert_eq!(serde_json::from_value::<SavedCheckpoint>(old).unwrap(), saved.clone());
            let view = saved.view();
            prop_assert!(!view.at.is_empty() && view.at_ms == at_ms && view.attempt == attempt);
        }
    }
}
