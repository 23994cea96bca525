//! Money: prices, reservations, usage, invoices and the operator's report.
//!
//! Amounts are integers: micro-dollars (`*_micro_usd`, 1 USD = 1,000,000).
//! The `*_usd` strings beside them are the same amounts for people.

use super::*;

/// One GPU model's prices, per GPU-hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Price {
    pub gpu_model: String,
    pub on_demand_micro_usd: i64,
    /// Always the on-demand price less the book's fixed discount.
    pub preemptible_micro_usd: i64,
    /// The contract rate a new reservation of this model gets by default.
    pub reserved_micro_usd: i64,
    pub on_demand_usd: String,
    pub preemptible_usd: String,
    pub reserved_usd: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PriceBook {
    /// The preemptible discount off on-demand, percent (fixed; never a bid).
    pub preemptible_discount_percent: f64,
    pub prices: Vec<Price>,
}

/// `PUT /v1/prices/{model}`: dollar amounts as decimal strings, e.g. `"2.50"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceUpdate {
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub on_demand_usd: String,
    #[serde(default)]
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub reserved_usd: Option<String>,
}

/// `POST /v1/reservations`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationRequest {
    pub tenant: String,
    pub gpu_model: String,
    #[schema(minimum = 1)]
    pub gpus: u32,
    /// RFC 3339 or a date (`2026-12-01`, midnight UTC).
    #[schema(
        pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$"
    )]
    pub start: String,
    #[schema(
        pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]*)?(Z|\+00:00)?)?$"
    )]
    pub end: String,
    /// Contract rate per GPU-hour, dollars (default: the price book's).
    #[serde(default)]
    #[schema(pattern = r"^[0-9]{1,12}(\.[0-9]{0,6})?$")]
    pub rate_usd: Option<String>,
    /// Accept a start more than a minute before now: a contract that began
    /// before it was entered. Without it such a start is refused (422), as
    /// the reservation would charge for time already gone; a start within
    /// the last minute is taken as now.
    #[serde(default)]
    pub backdate: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    pub id: u64,
    pub tenant: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub start: String,
    pub end: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub rate_micro_usd: i64,
    pub rate_usd: String,
    /// Active now (between its start and end).
    #[serde(default)]
    pub active: bool,
    /// GPUs its tenant's reserved jobs use now (a tenant's reservations of
    /// one model are drawn on in id order).
    #[serde(default)]
    pub in_use: u32,
    /// Of the GPUs it leaves idle, how many preemptible jobs use now: lent,
    /// and taken back with the drain window when its tenant needs them.
    /// Reserved capacity is a count, not fixed GPUs, so a model's
    /// preemptible GPUs beyond what the unreserved capacity leaves them
    /// are the lent ones, drawn on in reservation id order.
    #[serde(default)]
    pub lent: u32,
    /// Who borrows them: the preemptible jobs that started last on the
    /// model, until their GPUs make up `lent`. Only jobs the caller may
    /// see are named; a tenant sees how many of its GPUs are lent, not to
    /// whom.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub borrowers: Vec<Borrower>,
}

/// A preemptible job using GPUs a reservation leaves idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Borrower {
    pub job: u64,
    pub tenant: String,
    /// Of the reservation's idle GPUs, how many this job accounts for.
    pub gpus: u32,
}

/// What one attempt ran and cost: metered per second, from its process
/// start to its exit, at the rate its tier had when it started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub job: u64,
    pub attempt: u32,
    pub tenant: String,
    pub tier: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub started_at: String,
    pub ended_at: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// Whole seconds, a started second counting as one.
    pub seconds: u64,
    pub gpu_seconds: u64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub amount_usd: String,
    /// GPU-seconds after the drain notice, and of work lost (since the
    /// last checkpoint) when the attempt was preempted or lost.
    pub drain_gpu_seconds: u64,
    pub lost_gpu_seconds: u64,
    /// completed, failed, cancelled, preempted, lost, drill (an attempt
    /// ended by a fire drill: run time, neither preempted nor failed), or
    /// requeued (the job asked for it, outside a drain: `scontrol requeue`).
    pub outcome: String,
    /// An attempt of a deadline job promoted while it ran: its parts at
    /// each rate (preemptible, then on-demand), which add up to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<UsageSegment>,
}

/// Part of an attempt's usage at one tier's rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSegment {
    pub tier: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub seconds: u64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    /// Its GPUs: the record's, or for an elastic attempt its node's.
    #[serde(default)]
    pub gpus: u32,
}

/// One invoice line: a tier and GPU model at one rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InvoiceLine {
    pub tier: String,
    pub gpu_model: String,
    pub gpu_seconds: u64,
    pub gpu_hours: f64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub rate_usd: String,
    pub amount_usd: String,
}

/// A reservation's charge for the part of its committed period inside the
/// invoice's, used or not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReservationCharge {
    pub reservation: u64,
    pub gpu_model: String,
    pub gpus: u32,
    pub from: String,
    pub to: String,
    pub gpu_seconds: u64,
    pub gpu_hours: f64,
    pub rate_micro_usd: i64,
    pub amount_micro_usd: i64,
    pub amount_usd: String,
}

/// `GET /v1/bill`: a tenant's invoice for a period. An attempt belongs to
/// the period in which it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Invoice {
    pub tenant: String,
    pub from: String,
    pub to: String,
    pub lines: Vec<InvoiceLine>,
    pub reservations: Vec<ReservationCharge>,
    pub total_micro_usd: i64,
    pub total_usd: String,
    /// The same usage at on-demand prices (reserved usage included), plus
    /// nothing for reservations: what the work would have cost without them.
    pub on_demand_equivalent_micro_usd: i64,
    pub on_demand_equivalent_usd: String,
    /// What running preemptible instead of on-demand saved.
    pub preemptible_savings_micro_usd: i64,
    pub preemptible_savings_usd: String,
    pub attempts: u64,
    /// Attempts that ended preempted.
    pub preemptions: u64,
    /// Of those, attempts of jobs that had been preempted before.
    #[serde(default)]
    pub repeat_preemptions: u64,
    /// Of those, the ones whose notice came less than the server's
    /// `--min-runtime` after the job resumed: taken again so soon only
    /// because no other victim would do (or by an operator's drain or
    /// reclaim).
    #[serde(default)]
    pub preemptions_within_min_runtime: u64,
    pub drain_gpu_hours: f64,
    pub lost_gpu_hours: f64,
}

/// Per tier in the operator's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TierReport {
    pub tier: String,
    pub gpu_hours: f64,
    /// Share of the capacity's GPU-hours.
    pub utilisation: f64,
    pub revenue_micro_usd: i64,
    pub revenue_usd: String,
}

/// `GET /v1/report`: the cluster's use and revenue over a period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OperatorReport {
    pub from: String,
    pub to: String,
    /// GPU-hours of the nodes that had joined, over the period.
    pub capacity_gpu_hours: f64,
    pub used_gpu_hours: f64,
    pub idle_gpu_hours: f64,
    pub utilisation: f64,
    /// Utilisation without the preemptible tier: what the cluster would
    /// have sold without it.
    pub utilisation_without_preemptible: f64,
    pub tiers: Vec<TierReport>,
    /// Reservation charges (committed capacity, used or not).
    pub reservation_revenue_micro_usd: i64,
    pub reservation_revenue_usd: String,
    pub total_revenue_micro_usd: i64,
    pub total_revenue_usd: String,
    /// Preemptible work runs only on GPUs no reserved or on-demand job is
    /// using: all of it is otherwise idle capacity, sold.
    pub idle_capacity_sold_gpu_hours: f64,
    pub idle_capacity_sold_micro_usd: i64,
    pub idle_capacity_sold_usd: String,
}

/// One bucket of `GET /v1/report/series`: the report's figures for
/// `[start, end)` alone. GPU-hours are clipped to the bucket; an attempt's
/// revenue counts in the bucket in which it ended, as in the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportBucket {
    pub start: String,
    pub start_ms: u64,
    /// The next bucket's start; the period's end for the last bucket.
    pub end: String,
    pub end_ms: u64,
    pub capacity_gpu_hours: f64,
    pub used_gpu_hours: f64,
    pub utilisation: f64,
    /// Every tier, in the report's order, each with its share of this
    /// bucket's capacity.
    pub tiers: Vec<TierReport>,
    /// Every tenant that used GPUs in the bucket, by name, with its share
    /// of the bucket's used GPU-hours: how fair share divided them.
    pub tenants: Vec<TenantUse>,
    /// Reservation charges for the bucket's committed time. The buckets'
    /// charges add up to the period's exactly: each bucket's is rounded so
    /// that the running total is the period's so far, rounded down.
    pub reservation_revenue_micro_usd: i64,
    pub reservation_revenue_usd: String,
    pub total_revenue_micro_usd: i64,
    pub total_revenue_usd: String,
}

/// One tenant's use of one bucket of the operator's series.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUse {
    pub tenant: String,
    pub gpu_hours: f64,
    /// Of the bucket's used GPU-hours, 0 to 1.
    pub share: f64,
}

/// `GET /v1/report/series`: the operator's report over a period, bucket by
/// bucket. The buckets' GPU-hours add up to the report's for the same
/// period (to floating-point rounding), their revenue to the micro-dollar.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportSeries {
    pub from: String,
    pub to: String,
    pub from_ms: u64,
    pub to_ms: u64,
    /// The buckets' length, for people (`1h`).
    pub step: String,
    pub step_ms: u64,
    /// `[from, from + step)`, `[from + step, from + 2 step)` and so on, the
    /// last one ending at `to`.
    pub buckets: Vec<ReportBucket>,
}
