//! Why the server refuses what it was asked: the domain's refusals, with
//! no HTTP in them. The writer, the submission checks and the money rules
//! return a `Refusal`; `http/` alone gives each kind its status
//! (`http::status`), so a handler's answer and a test's expectation speak
//! of the same kind.

/// A refusal: its kind, and a message that names what was wrong
/// (`field: why`, lowercase, no trailing punctuation).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub kind: Refused,
    pub message: String,
}

/// The kinds of refusal, each with what the caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refused {
    /// It breaks a rule the API document states (a limit, a pattern):
    /// the request must change.
    Invalid,
    /// The caller did not say who it is, or not credibly.
    Unauthenticated,
    /// The caller may not do this.
    Forbidden,
    /// No such thing, or not the caller's to see.
    NotFound,
    /// Well-formed, but refused on its meaning: it names what does not
    /// exist, contradicts itself, or asks what this cluster cannot do.
    Unacceptable,
    /// What it names is not in a state that allows it now.
    Conflict,
    /// A tenant over one of its limits: retrying later, once some of its
    /// jobs have finished, can help.
    OverLimit,
    /// Something the server depends on (an image's registry) cannot be
    /// reached now: nothing was done, and a retry may succeed.
    Unavailable,
    /// The server's own fault.
    Internal,
}

impl Refusal {
    pub fn new(kind: Refused, message: impl Into<String>) -> Refusal {
        Refusal { kind, message: message.into() }
    }
    pub fn invalid(message: String) -> Refusal {
        Refusal::new(Refused::Invalid, message)
    }
    pub fn unauthenticated(message: &str) -> Refusal {
        Refusal::new(Refused::Unauthenticated, message)
    }
    pub fn forbidden(message: &str) -> Refusal {
        Refusal::new(Refused::Forbidden, message)
    }
    pub fn not_found(message: String) -> Refusal {
        Refusal::new(Refused::NotFound, message)
    }
    pub fn unacceptable(message: String) -> Refusal {
        Refusal::new(Refused::Unacceptable, message)
    }
    pub fn conflict(message: String) -> Refusal {
        Refusal::new(Refused::Conflict, message)
    }
    pub fn over_limit(message: String) -> Refusal {
        Refusal::new(Refused::OverLimit, message)
    }
    pub fn unavailable(message: String) -> Refusal {
        Refusal::new(Refused::Unavailable, message)
    }
    pub fn internal(message: String) -> Refusal {
        Refusal::new(Refused::Internal, message)
    }

    /// Whether asking again, unchanged, may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self.kind, Refused::Conflict | Refused::OverLimit | Refused::Unavailable | Refused::Internal)
    }

    /// The same refusal, its message under `prefix` (`jobs[3]: ...`).
    pub fn within(self, prefix: &str) -> Refusal {
        Refusal { message: format!("{prefix}: {}", self.message), ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Refused; 9] = [
        Refused::Invalid,
        Refused::Unauthenticated,
        Refused::Forbidden,
        Refused::NotFound,
        Refused::Unacceptable,
        Refused::Conflict,
        Refused::OverLimit,
        Refused::Unavailable,
        Refused::Internal,
    ];

    #[test]
    fn each_kind_has_its_own_status_and_only_the_retryable_are_not_the_callers_fault() {
        let statuses: std::collections::BTreeSet<u16> = ALL.iter().map(|k| crate::http::status(*k)).collect();
        assert_eq!(statuses.len(), ALL.len(), "one status a kind");
        for kind in ALL {
            let refusal = Refusal::new(kind, "x: why");
            let status = crate::http::status(kind);
            // 409 and 429 are the caller's to retry later; 5xx the server's.
            assert_eq!(refusal.retryable(), matches!(status, 409 | 429 | 500..=599), "{kind:?}");
            let answer = crate::ApiError::from(refusal.clone().within("jobs[2]"));
            assert_eq!((answer.status, answer.message.as_str()), (status, "jobs[2]: x: why"));
        }
    }
}
