//! Errors at the core's edge. "Does not fit" is not an error: a job that
//! cannot start simply stays queued.

use ebb_core::{Attempt, JobId};

/// A reported event the state refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The input is wrong; retrying the same input cannot help.
    #[error("{0}")]
    Invalid(String),
    /// No such job, node, model or reservation.
    #[error("{0}: not found")]
    NotFound(String),
    /// The request contradicts the current state (a node that already
    /// joined, a job already submitted).
    #[error("{0}")]
    Conflict(String),
    /// About an attempt the core no longer runs; the sender must stop it.
    #[error("job {job}: attempt {attempt} is stale (current attempt {current})")]
    StaleAttempt { job: JobId, attempt: Attempt, current: Attempt },
}

impl StateError {
    /// Whether the same call may succeed later without changing it.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// A plan that could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The state moved on since the plan was made; plan again.
    #[error("stale plan: {0}")]
    Stale(String),
    /// The plan would break an invariant: a bug in the planner.
    #[error("plan breaks an invariant: {0}")]
    Invariant(String),
}

impl ApplyError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ApplyError::Stale(_))
    }
}
