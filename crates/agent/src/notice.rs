//! The notice an attempt gets before it is stopped: written to its notice
//! file and served by its metadata endpoint in every shape, the same facts
//! each time. The job's side is `docs/job-contract.md`.

use ebb_api::{Membership, MembershipChange};
use serde::{Deserialize, Serialize};

/// What the notice announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeAction {
    /// A drain: the job is preempted (and requeued) unless it finishes
    /// first; its last checkpoint upload may hold its exit until the
    /// deadline.
    Preempt,
    /// A cancel: the job ends, whatever it does, by the deadline.
    Cancel,
}

/// The drain or cancel notice as every shape reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub action: NoticeAction,
    pub notice_at: String,
    pub deadline: String,
    pub reason: String,
    #[serde(skip)]
    pub deadline_ms: u64,
}

impl Notice {
    /// A drain's notice.
    pub fn new(notice_at_ms: u64, deadline_ms: u64, reason: String) -> Notice {
        Notice {
            action: NoticeAction::Preempt,
            notice_at: ebb_core::time::rfc3339_millis(notice_at_ms),
            deadline: ebb_core::time::rfc3339_millis(deadline_ms),
            reason,
            deadline_ms,
        }
    }

    /// A cancel's notice.
    pub fn cancel(notice_at_ms: u64, deadline_ms: u64) -> Notice {
        Notice { action: NoticeAction::Cancel, ..Notice::new(notice_at_ms, deadline_ms, "cancel".into()) }
    }

    /// Whether this notice replaces `current`: an attempt has one notice,
    /// and a later one counts only if its deadline comes sooner (a cancel
    /// of a job being drained, a second cancel with a shorter grace). The
    /// same notice again (a command repeated after a reconnect) does not.
    pub fn supersedes(&self, current: Option<&Notice>) -> bool {
        current.is_none_or(|c| self.deadline_ms < c.deadline_ms)
    }
}

/// An elastic job's change of nodes, as the nodes that stay read it (the
/// members file, `GET /ebb/v1/members`): what changes, when the leaving
/// nodes are killed on a shrink, the nodes once it is done (the first
/// first), and the GPUs it holds then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Members {
    pub change: MembershipChange,
    pub at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    pub nodes: Vec<String>,
    pub leaving: Vec<String>,
    pub joining: Vec<String>,
    pub gpus: u32,
    pub reason: String,
    #[serde(skip)]
    pub at_ms: u64,
}

impl Members {
    pub fn new(m: &Membership) -> Members {
        Members {
            change: m.change,
            at: ebb_core::time::rfc3339_millis(m.at_ms),
            deadline: m.deadline_ms.map(ebb_core::time::rfc3339_millis),
            nodes: m.nodes.clone(),
            leaving: m.leaving.clone(),
            joining: m.joining.clone(),
            gpus: m.gpus,
            reason: m.reason.clone(),
            at_ms: m.at_ms,
        }
    }

    /// Whether this change replaces `current`: the later one counts; the
    /// same change again (a command repeated after a reconnect) does not.
    pub fn supersedes(&self, current: Option<&Members>) -> bool {
        current.is_none_or(|c| self.at_ms > c.at_ms || (self.at_ms == c.at_ms && self != c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file and the endpoint's native shape say `preempt` or `cancel`,
    /// as the job contract documents.
    #[test]
    fn the_action_is_written_as_the_contract_names_it() {
        let drain = serde_json::to_value(Notice::new(0, 1, "preempted".into())).unwrap();
        assert_eq!(drain["action"], "preempt");
        let cancel = serde_json::to_value(Notice::cancel(0, 1)).unwrap();
        assert_eq!((cancel["action"].as_str(), cancel["reason"].as_str()), (Some("cancel"), Some("cancel")));
    }
}
