//! Webhooks: an HTTP POST per event to a URL a tenant (its jobs' events)
//! or an operator (nodes' events) chose, signed with the webhook's secret.
//! See `docs/webhooks.md` for the body, the signature and the delivery.

use super::*;

/// Events of a tenant's jobs a webhook may take.
pub const JOB_WEBHOOK_EVENTS: [&str; 7] =
    ["preempted", "requeued", "promoted", "failed", "succeeded", "cancelled", "drill"];
/// Events of the nodes an operators' webhook may take.
pub const NODE_WEBHOOK_EVENTS: [&str; 4] = ["gpu_out", "node_drained", "node_lost", "node_back"];
/// The longest URL a webhook may have, in bytes.
pub const MAX_WEBHOOK_URL_BYTES: usize = 2048;
/// The most webhooks one tenant (or the operators) may have.
pub const MAX_WEBHOOKS: usize = 16;

/// `POST /v1/webhooks`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// Whose: a tenant's name (a tenant's token may name only its own, and
    /// may leave it out). An operator's token without it makes an
    /// operators' webhook, which takes nodes' events.
    #[serde(default)]
    pub tenant: Option<String>,
    /// `http://` or `https://`, at most 2048 bytes.
    #[schema(max_length = 2048)]
    pub url: String,
    /// A tenant's: preempted, requeued, promoted, failed, succeeded,
    /// cancelled, drill. The operators': gpu_out, node_drained, node_lost,
    /// node_back.
    #[schema(min_items = 1)]
    pub events: Vec<String>,
    /// `json` (the default: the documented body) or `slack` (`{"text":
    /// ...}`, what a Slack incoming webhook takes).
    #[serde(default)]
    pub format: Option<String>,
}

/// A webhook, as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    pub id: u64,
    /// The tenant it is for; absent: the operators'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub url: String,
    pub events: Vec<String>,
    pub format: String,
    /// Deliveries not yet accepted by the receiver.
    pub pending: u64,
    /// Its secret: only in the answer that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// One try to deliver an event, as `GET /v1/webhooks/{id}/log` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookDelivery {
    /// The delivery (the `Ebb-Delivery` header): the same on every try.
    pub delivery: u64,
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Which try this was, from 1.
    pub attempt: u32,
    pub at: String,
    /// `delivered` (a 2xx), `failed` (tried again later) or `gave_up`.
    pub outcome: String,
    /// The receiver's HTTP status, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What went wrong, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/webhooks/{id}/log`: the latest tries, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookLog {
    pub webhook: Webhook,
    pub deliveries: Vec<WebhookDelivery>,
}
