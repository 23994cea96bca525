//! Money: the price book, the usage record of each attempt, invoices and
//! the operator's report. Integers (micro-dollars) throughout; dollars
//! appear only as display strings.
//!
//! * A usage record is made once per attempt, when it ends, in the same
//!   store transaction as the state change that ends it; its primary key is
//!   (job, attempt), so it can never be counted twice.
//! * Time is metered per second: from the process start to its exit (by
//!   the agent's clock), a started second counting as a whole one.
//! * The rate is the tier's rate when the attempt started: on-demand from
//!   the book, preemptible = on-demand less the book's fixed discount,
//!   reserved = 0 (the reservation's contract covers it, charged for its
//!   whole committed period).
//! * A deadline job promoted to on-demand while it ran has one record for
//!   the attempt with two segments: its seconds up to the promotion
//!   (a started second counting as one) at the preemptible rate, the rest
//!   at the on-demand rate. The record's amount is their sum, and invoices
//!   and reports count each segment under its own tier.
//! * An attempt belongs to the invoice period in which it ended. Invoice
//!   lines sum their records' amounts, so lines and records agree to the
//!   micro-dollar.

use std::collections::BTreeMap;

use ebb_api as api;
use ebb_core::MicroUsd;
use serde::{Deserialize, Serialize};

use crate::{rfc3339, ApiError};

/// What the operator configures about money.
#[derive(Clone, Debug)]
pub struct Pricing {
    /// On-demand (and optionally reserved) prices per GPU-hour by model,
    /// micro-dollars, from the command line; they replace the stored ones
    /// at start.
    pub prices: Vec<(String, i64, Option<i64>)>,
    /// The on-demand price of a model that joins without one.
    pub default_price: i64,
    /// The preemptible discount in basis points (5000 = 50%).
    pub discount_bps: u32,
}

/// One GPU model's prices per GPU-hour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceRow {
    pub gpu_model: String,
    pub on_demand: i64,
    pub reserved: i64,
}

/// A reservation as the store keeps it. Its charge is computed from it
/// whenever an invoice asks, so a row is never removed once it has charged
/// anything: deleting a reservation that has started ends it then
/// (`end_ms` becomes the deletion's instant) and marks it `deleted_ms`,
/// which takes it off the list and out of the scheduler but leaves every
/// invoice of its past unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationRow {
    pub id: u64,
    pub tenant: u32,
    pub gpu_model: String,
    pub gpus: u32,
    pub start_ms: u64,
    pub end_ms: u64,
    pub rate: i64,
    /// When an operator deleted it; its charge stops at `end_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_ms: Option<u64>,
}

/// What one attempt ran and cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub job: u64,
    pub attempt: u32,
    pub tenant: u32,
    pub tier: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub started_ms: u64,
    pub ended_ms: u64,
    pub seconds: u64,
    pub rate: i64,
    /// The on-demand rate at the same moment: what the work would have cost.
    pub on_demand_rate: i64,
    pub amount: i64,
    pub drain_gpu_seconds: u64,
    pub lost_gpu_seconds: u64,
    pub outcome: String,
    /// The job had been preempted before this attempt (false in records
    /// written before servers kept it).
    #[serde(default)]
    pub follows_preemption: bool,
    /// It also had its drain notice less than the server's `--min-runtime`
    /// after it was placed: the scheduler could spare it no longer.
    #[serde(default)]
    pub within_min_runtime: bool,
    /// A promoted attempt's parts, preemptible then on-demand; empty for
    /// every other attempt (the record is one part at its own tier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<Segment>,
}

/// Part of an attempt at one tier's rate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub tier: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub seconds: u64,
    pub rate: i64,
    pub amount: i64,
}

impl UsageRow {
    pub fn gpu_seconds(&self) -> u64 {
        self.seconds.saturating_mul(u64::from(self.gpus))
    }

    /// Its parts at each tier's rate: its segments, or itself whole.
    pub fn parts(&self) -> Vec<Segment> {
        if !self.segments.is_empty() {
            return self.segments.clone();
        }
        vec![Segment {
            tier: self.tier.clone(),
            from_ms: self.started_ms,
            to_ms: self.ended_ms,
            seconds: self.seconds,
            rate: self.rate,
            amount: self.amount,
        }]
    }

    pub fn view(&self, tenant: &str) -> api::Usage {
        api::Usage {
            job: self.job,
            attempt: self.attempt,
            tenant: tenant.to_string(),
            tier: self.tier.clone(),
            gpu_model: self.gpu_model.clone(),
            gpus: self.gpus,
            started_at: rfc3339(self.started_ms),
            ended_at: rfc3339(self.ended_ms),
            started_ms: self.started_ms,
            ended_ms: self.ended_ms,
            seconds: self.seconds,
            gpu_seconds: self.gpu_seconds(),
            rate_micro_usd: self.rate,
            amount_micro_usd: self.amount,
            amount_usd: usd(self.amount),
            drain_gpu_seconds: self.drain_gpu_seconds,
            lost_gpu_seconds: self.lost_gpu_seconds,
            outcome: self.outcome.clone(),
            segments: self
                .segments
                .iter()
                .map(|s| api::UsageSegment {
                    tier: s.tier.clone(),
                    from_ms: s.from_ms,
                    to_ms: s.to_ms,
                    seconds: s.seconds,
                    rate_micro_usd: s.rate,
                    amount_micro_usd: s.amount,
                })
                .collect(),
        }
    }
}

/// What an attempt's end tells the meter.
pub struct Ended<'a> {
    pub job: u64,
    pub attempt: u32,
    pub tenant: u32,
    pub tier: &'a str,
    pub gpu_model: &'a str,
    pub gpus: u32,
    pub started_ms: u64,
    pub ended_ms: u64,
    pub notice_at_ms: Option<u64>,
    pub rate: i64,
    pub on_demand_rate: i64,
    pub lost_gpu_ms: u64,
    pub outcome: &'a str,
    pub follows_preemption: bool,
    pub within_min_runtime: bool,
    /// Promoted to on-demand during the attempt: when (clamped to the
    /// attempt), and the preemptible rate it ran at before.
    pub promoted: Option<(u64, i64)>,
}

/// Whole seconds, a started second counting as one.
fn whole_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The amount for `gpu_seconds` at `rate` per GPU-hour, rounded down.
pub fn amount(rate: i64, gpu_seconds: u64) -> i64 {
    MicroUsd::for_gpu_millis(MicroUsd(rate), u128::from(gpu_seconds) * 1000).0
}

/// The usage record of an attempt that has ended.
pub fn meter(e: Ended<'_>) -> UsageRow {
    let ended_ms = e.ended_ms.max(e.started_ms);
    let seconds = whole_seconds(ended_ms - e.started_ms);
    let drain_seconds = e
        .notice_at_ms
        .map_or(0, |notice| whole_seconds(ended_ms.saturating_sub(notice.max(e.started_ms))).min(seconds));
    let (amount, segments) = match e.promoted {
        None => (amount(e.rate, seconds.saturating_mul(u64::from(e.gpus))), Vec::new()),
        Some((promoted_ms, preemptible_rate)) => {
            let at = promoted_ms.clamp(e.started_ms, ended_ms);
            let before = whole_seconds(at - e.started_ms).min(seconds);
            let parts = [
                ("preemptible", e.started_ms, at, before, preemptible_rate),
                (e.tier, at, ended_ms, seconds - before, e.rate),
            ];
            let segments: Vec<Segment> = parts
                .into_iter()
                .map(|(tier, from_ms, to_ms, seconds, rate)| Segment {
                    tier: tier.to_string(),
                    from_ms,
                    to_ms,
                    seconds,
                    rate,
                    amount: amount(rate, seconds.saturating_mul(u64::from(e.gpus))),
                })
                .collect();
            (MicroUsd::total(segments.iter().map(|s| s.amount)), segments)
        }
    };
    UsageRow {
        job: e.job,
        attempt: e.attempt,
        tenant: e.tenant,
        tier: e.tier.to_string(),
        gpu_model: e.gpu_model.to_string(),
        gpus: e.gpus,
        started_ms: e.started_ms,
        ended_ms,
        seconds,
        rate: e.rate,
        on_demand_rate: e.on_demand_rate,
        amount,
        drain_gpu_seconds: drain_seconds.saturating_mul(u64::from(e.gpus)),
        lost_gpu_seconds: e.lost_gpu_ms.div_ceil(1000),
        outcome: e.outcome.to_string(),
        follows_preemption: e.follows_preemption,
        within_min_runtime: e.within_min_runtime,
        segments,
    }
}

pub fn usd(micro: i64) -> String {
    let sign = if micro < 0 { "-" } else { "" };
    let abs = micro.unsigned_abs();
    let cents_and_below = abs % 1_000_000;
    // Dollars with as many decimals as the amount needs (at least two).
    let mut frac = format!("{cents_and_below:06}");
    while frac.len() > 2 && frac.ends_with('0') {
        frac.pop();
    }
    format!("{sign}{}.{frac}", abs / 1_000_000)
}

fn hours(gpu_seconds: u64) -> f64 {
    gpu_seconds as f64 / 3600.0
}

/// The preemptible rate: on-demand less the discount, exactly.
pub fn preemptible_rate(on_demand: i64, discount_bps: u32) -> i64 {
    let book = ebb_core::PriceBook {
        on_demand_per_gpu_hour: MicroUsd(on_demand),
        reserved_per_gpu_hour: MicroUsd::ZERO,
        preemptible_discount_bps: discount_bps,
    };
    book.preemptible_per_gpu_hour().0
}

/// Checks a price: non-negative dollars, and discountable without a
/// fraction of a micro-dollar (so preemptible is exactly the discount off).
pub fn parse_price(field: &str, text: &str, discount_bps: u32) -> Result<i64, ApiError> {
    let micro = MicroUsd::parse_usd(text).map_err(|e| ApiError::bad_request(format!("{field}: {e}")))?.0;
    if (micro as i128 * i128::from(10_000 - discount_bps)) % 10_000 != 0 {
        let step = 10_000 / gcd(10_000, u64::from(10_000 - discount_bps));
        return Err(ApiError::unprocessable(format!(
            "{field}: ${text} cannot be discounted by {}% to a whole micro-dollar; use a multiple of {}",
            f64::from(discount_bps) / 100.0,
            usd(step as i64)
        )));
    }
    Ok(micro)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

pub fn price_view(row: &PriceRow, discount_bps: u32) -> api::Price {
    let preemptible = preemptible_rate(row.on_demand, discount_bps);
    api::Price {
        gpu_model: row.gpu_model.clone(),
        on_demand_micro_usd: row.on_demand,
        preemptible_micro_usd: preemptible,
        reserved_micro_usd: row.reserved,
        on_demand_usd: usd(row.on_demand),
        preemptible_usd: usd(preemptible),
        reserved_usd: usd(row.reserved),
    }
}

pub fn reservation_view(r: &ReservationRow, tenant: &str) -> api::Reservation {
    api::Reservation {
        id: r.id,
        tenant: tenant.to_string(),
        gpu_model: r.gpu_model.clone(),
        gpus: r.gpus,
        start: rfc3339(r.start_ms),
        end: rfc3339(r.end_ms),
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        rate_micro_usd: r.rate,
        rate_usd: usd(r.rate),
        active: false,
        in_use: 0,
        lent: 0,
        borrowers: Vec::new(),
    }
}

/// A time given by a person: RFC 3339 (`2026-12-01T08:00:00Z`) or a date
/// (`2026-12-01`, midnight UTC). Milliseconds since the epoch.
pub fn parse_time(field: &str, text: &str) -> Result<u64, ApiError> {
    let text = text.trim();
    let full = if text.len() == 10 && text.as_bytes().get(4) == Some(&b'-') {
        format!("{text}T00:00:00Z")
    } else {
        text.to_string()
    };
    let at =
        humantime::parse_rfc3339_weak(&full).or_else(|_| humantime::parse_rfc3339(&full)).map_err(|e| {
            ApiError::bad_request(format!(
                "{field}: {text:?} is not a date or time (2026-12-01 or 2026-12-01T08:00:00Z): {e}"
            ))
        })?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| ApiError::bad_request(format!("{field}: {text:?} is before 1970")))?;
    Ok(ms.as_millis() as u64)
}

/// `[from, to)`, checked.
pub fn period(from: &str, to: &str) -> Result<(u64, u64), ApiError> {
    let (f, t) = (parse_time("from", from)?, parse_time("to", to)?);
    if f >= t {
        return Err(ApiError::unprocessable(format!("from: {from} is not before to: {to}")));
    }
    Ok((f, t))
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

/// A reservation's committed GPU-milliseconds inside `[from, to)` and
/// their charge at its rate, rounded down.
fn reserved_in(r: &ReservationRow, from: u64, to: u64) -> (u128, i64) {
    let gpu_ms = u128::from(overlap((r.start_ms, r.end_ms), (from, to))) * u128::from(r.gpus);
    (gpu_ms, MicroUsd::for_gpu_millis(MicroUsd(r.rate), gpu_ms).0)
}

/// A reservation's charge for its committed time inside `[from, to)`.
pub fn reservation_charge(r: &ReservationRow, from: u64, to: u64) -> Option<api::ReservationCharge> {
    let (gpu_ms, amount) = reserved_in(r, from, to);
    if gpu_ms == 0 {
        return None;
    }
    let gpu_seconds = (gpu_ms / 1000) as u64;
    Some(api::ReservationCharge {
        reservation: r.id,
        gpu_model: r.gpu_model.clone(),
        gpus: r.gpus,
        from: rfc3339(r.start_ms.max(from)),
        to: rfc3339(r.end_ms.min(to)),
        gpu_seconds,
        gpu_hours: hours(gpu_seconds),
        rate_micro_usd: r.rate,
        amount_micro_usd: amount,
        amount_usd: usd(amount),
    })
}

/// A tenant's invoice from the usage records that ended in `[from, to)`
/// and its reservations.
pub fn invoice(
    tenant: &str,
    usage: &[UsageRow],
    reservations: &[ReservationRow],
    from: u64,
    to: u64,
) -> api::Invoice {
    let mut lines: BTreeMap<(String, String, i64), (u64, i64)> = BTreeMap::new();
    let (mut od_equivalent, mut savings) = (0i64, 0i64);
    let (mut preemptions, mut repeat_preemptions, mut within_min_runtime) = (0u64, 0u64, 0u64);
    let (mut drain, mut lost) = (0u64, 0u64);
    for u in usage {
        for part in u.parts() {
            let gpu_seconds = part.seconds.saturating_mul(u64::from(u.gpus));
            let line = lines.entry((part.tier.clone(), u.gpu_model.clone(), part.rate)).or_insert((0, 0));
            line.0 = line.0.saturating_add(gpu_seconds);
            line.1 = line.1.saturating_add(part.amount);
            let at_on_demand = amount(u.on_demand_rate, gpu_seconds);
            od_equivalent = od_equivalent.saturating_add(at_on_demand);
            if part.tier == "preemptible" {
                savings = savings.saturating_add(at_on_demand.saturating_sub(part.amount));
            }
        }
        if u.outcome == "preempted" {
            preemptions += 1;
            repeat_preemptions += u64::from(u.follows_preemption);
            within_min_runtime += u64::from(u.follows_preemption && u.within_min_runtime);
        }
        drain = drain.saturating_add(u.drain_gpu_seconds);
        lost = lost.saturating_add(u.lost_gpu_seconds);
    }
    let lines: Vec<api::InvoiceLine> = lines
        .into_iter()
        .map(|((tier, gpu_model, rate), (gpu_seconds, amount))| api::InvoiceLine {
            tier,
            gpu_model,
            gpu_seconds,
            gpu_hours: hours(gpu_seconds),
            rate_micro_usd: rate,
            amount_micro_usd: amount,
            rate_usd: usd(rate),
            amount_usd: usd(amount),
        })
        .collect();
    let charges: Vec<api::ReservationCharge> =
        reservations.iter().filter_map(|r| reservation_charge(r, from, to)).collect();
    let total = MicroUsd::total(
        lines.iter().map(|l| l.amount_micro_usd).chain(charges.iter().map(|c| c.amount_micro_usd)),
    );
    api::Invoice {
        tenant: tenant.to_string(),
        from: rfc3339(from),
        to: rfc3339(to),
        lines,
        reservations: charges,
        total_micro_usd: total,
        total_usd: usd(total),
        on_demand_equivalent_micro_usd: od_equivalent,
        on_demand_equivalent_usd: usd(od_equivalent),
        preemptible_savings_micro_usd: savings,
        preemptible_savings_usd: usd(savings),
        attempts: usage.len() as u64,
        preemptions,
        repeat_preemptions,
        preemptions_within_min_runtime: within_min_runtime,
        drain_gpu_hours: hours(drain),
        lost_gpu_hours: hours(lost),
    }
}

/// An attempt still running, for the report's use figures.
#[derive(Clone, Debug)]
pub struct Live {
    pub tier: String,
    pub gpus: u32,
    pub started_ms: u64,
}

/// What the operator's report and its series are computed from: the usage
/// records that ended at or after the period's start, the attempts still
/// running, every reservation, and each node's join instant and GPUs.
#[derive(Clone, Debug)]
pub struct Ledger {
    pub usage: Vec<UsageRow>,
    pub live: Vec<Live>,
    pub reservations: Vec<ReservationRow>,
    pub nodes: Vec<(u64, u32)>,
    pub now: u64,
}

/// The tiers every report lists, in its order, even when one sold nothing.
const TIERS: [&str; 3] = ["on-demand", "preemptible", "reserved"];

/// A tier's name as a key that outlives the record it came from.
fn tier_key(tier: &str) -> &'static str {
    TIERS.into_iter().find(|t| *t == tier).unwrap_or("on-demand")
}

/// The operator's report for `[from, to)`: use by tier (ended and running
/// attempts, clipped to the period), capacity from the nodes' GPUs since
/// they joined, revenue from records ended in the period and reservations.
pub fn report(ledger: &Ledger, from: u64, to: u64) -> api::OperatorReport {
    let Ledger { usage, live, reservations, nodes, now } = ledger;
    let capacity_ms: u128 = nodes
        .iter()
        .map(|&(joined, gpus)| u128::from(overlap((joined, *now), (from, to))) * u128::from(gpus))
        .sum();
    let mut used_ms: BTreeMap<&str, u128> = TIERS.iter().map(|&tier| (tier, 0)).collect();
    let mut revenue: BTreeMap<&str, i64> = TIERS.iter().map(|&tier| (tier, 0)).collect();
    for u in usage {
        for part in u.parts() {
            let tier = tier_key(&part.tier);
            let ms = overlap((part.from_ms, part.to_ms), (from, to));
            *used_ms.entry(tier).or_insert(0) += u128::from(ms) * u128::from(u.gpus);
            if (from..to).contains(&u.ended_ms) {
                let earned = revenue.entry(tier).or_insert(0);
                *earned = earned.saturating_add(part.amount);
            }
        }
    }
    for l in live {
        let ms = overlap((l.started_ms, *now), (from, to));
        *used_ms.entry(l.tier.as_str()).or_insert(0) += u128::from(ms) * u128::from(l.gpus);
    }
    let reservation_revenue = MicroUsd::total(
        reservations.iter().filter_map(|r| reservation_charge(r, from, to)).map(|c| c.amount_micro_usd),
    );
    let share = |ms: u128| if capacity_ms == 0 { 0.0 } else { ms as f64 / capacity_ms as f64 };
    let used: u128 = used_ms.values().sum();
    let preemptible_ms = used_ms["preemptible"];
    let total = MicroUsd::total(revenue.values().copied().chain([reservation_revenue]));
    api::OperatorReport {
        from: rfc3339(from),
        to: rfc3339(to),
        capacity_gpu_hours: ms_hours(capacity_ms),
        used_gpu_hours: ms_hours(used),
        idle_gpu_hours: ms_hours(capacity_ms.saturating_sub(used)),
        utilisation: share(used),
        utilisation_without_preemptible: share(used - preemptible_ms),
        tiers: tier_reports(&used_ms, &revenue, capacity_ms),
        reservation_revenue_micro_usd: reservation_revenue,
        reservation_revenue_usd: usd(reservation_revenue),
        total_revenue_micro_usd: total,
        total_revenue_usd: usd(total),
        idle_capacity_sold_gpu_hours: ms_hours(preemptible_ms),
        idle_capacity_sold_micro_usd: revenue["preemptible"],
        idle_capacity_sold_usd: usd(revenue["preemptible"]),
    }
}

fn ms_hours(gpu_ms: u128) -> f64 {
    gpu_ms as f64 / 3_600_000.0
}

/// Each tier's use, share of `capacity_ms` and revenue, in the tiers' order.
fn tier_reports(
    used_ms: &BTreeMap<&str, u128>,
    revenue: &BTreeMap<&str, i64>,
    capacity_ms: u128,
) -> Vec<api::TierReport> {
    used_ms
        .iter()
        .map(|(tier, &ms)| {
            let revenue = revenue.get(tier).copied().unwrap_or(0);
            api::TierReport {
                tier: tier.to_string(),
                gpu_hours: ms_hours(ms),
                utilisation: if capacity_ms == 0 { 0.0 } else { ms as f64 / capacity_ms as f64 },
                revenue_micro_usd: revenue,
                revenue_usd: usd(revenue),
            }
        })
        .collect()
}

/// The most buckets a series answers: enough for a month by the hour or a
/// day by the two minutes, few enough for a chart and a table.
pub const MAX_BUCKETS: u64 = 1_000;
/// The shortest step of a series: usage is metered by the second, and
/// finer buckets than a minute say nothing a chart can show.
pub const MIN_STEP_MS: u64 = 60_000;

fn duration_text(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// A series' step (`15m`, `1h`, `1d`) over `[from, to)`, checked: at least
/// `MIN_STEP_MS`, and at most `MAX_BUCKETS` buckets. Milliseconds.
pub fn series_step(text: &str, from: u64, to: u64) -> Result<u64, ApiError> {
    let step = humantime::parse_duration(text.trim())
        .map_err(|e| ApiError::bad_request(format!("step: {text:?} is not a duration (15m, 1h, 1d): {e}")))?;
    let step_ms = u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
    if step_ms < MIN_STEP_MS {
        return Err(ApiError::unprocessable(format!(
            "step: {text} is shorter than the shortest step, {}",
            duration_text(MIN_STEP_MS)
        )));
    }
    let period = to.saturating_sub(from);
    let buckets = period.div_ceil(step_ms);
    if buckets > MAX_BUCKETS {
        // In whole minutes, so that the advice reads as a step one would type.
        let shortest = period.div_ceil(MAX_BUCKETS).div_ceil(MIN_STEP_MS) * MIN_STEP_MS;
        return Err(ApiError::unprocessable(format!(
            "step: {text} over the {} from {} to {} makes {buckets} buckets, over the limit of {MAX_BUCKETS}; \
             use a step of at least {} for this period, or a period of at most {} for this step",
            duration_text(period),
            rfc3339(from),
            rfc3339(to),
            duration_text(shortest),
            duration_text(step_ms.saturating_mul(MAX_BUCKETS)),
        )));
    }
    Ok(step_ms)
}

/// The report for `[from, to)` bucket by bucket (`[from + i step, from +
/// (i + 1) step)`, the last ending at `to`), in one pass over the ledger:
/// each record, running attempt, node and reservation adds to the buckets
/// it overlaps, by the report's rules. The buckets add up to `report`'s
/// figures for the same period: GPU-milliseconds exactly (so GPU-hours to
/// floating-point rounding), revenue to the micro-dollar. A reservation's
/// charge in a bucket is its charge up to the bucket's end less its charge
/// up to the bucket's start, each rounded down as the report rounds: never
/// more than a micro-dollar from the bucket's own charge, and no rounding
/// lost over the period.
pub fn series(ledger: &Ledger, from: u64, to: u64, step_ms: u64) -> api::ReportSeries {
    assert!(from < to && step_ms > 0, "a series of a period that runs forwards, by a positive step");
    let Ledger { usage, live, reservations, nodes, now } = ledger;
    let n = usize::try_from((to - from).div_ceil(step_ms)).expect("a bounded number of buckets");
    let bounds = |i: usize| {
        let start = from + i as u64 * step_ms;
        (start, start.saturating_add(step_ms).min(to))
    };
    // The buckets `[start, end)` overlaps, clipped to the period.
    let buckets_of = |(start, end): (u64, u64)| {
        let (start, end) = (start.max(from), end.min(to));
        let range = if start < end {
            ((start - from) / step_ms) as usize..((end - 1 - from) / step_ms) as usize + 1
        } else {
            0..0
        };
        range.map(move |i| (i, overlap((start, end), bounds(i))))
    };
    let mut capacity_ms = vec![0u128; n];
    for &(joined, gpus) in nodes {
        for (i, ms) in buckets_of((joined, *now)) {
            capacity_ms[i] += u128::from(ms) * u128::from(gpus);
        }
    }
    let mut used_ms: BTreeMap<&str, Vec<u128>> = TIERS.iter().map(|&tier| (tier, vec![0; n])).collect();
    let mut revenue: BTreeMap<&str, Vec<i64>> = TIERS.iter().map(|&tier| (tier, vec![0; n])).collect();
    for u in usage {
        for part in u.parts() {
            let tier = tier_key(&part.tier);
            let used = used_ms.entry(tier).or_insert_with(|| vec![0; n]);
            for (i, ms) in buckets_of((part.from_ms, part.to_ms)) {
                used[i] += u128::from(ms) * u128::from(u.gpus);
            }
            if (from..to).contains(&u.ended_ms) {
                let revenue = revenue.entry(tier).or_insert_with(|| vec![0; n]);
                let earned = &mut revenue[((u.ended_ms - from) / step_ms) as usize];
                *earned = earned.saturating_add(part.amount);
            }
        }
    }
    for l in live {
        let used = used_ms.entry(l.tier.as_str()).or_insert_with(|| vec![0; n]);
        for (i, ms) in buckets_of((l.started_ms, *now)) {
            used[i] += u128::from(ms) * u128::from(l.gpus);
        }
    }
    let mut reservation_revenue = vec![0i64; n];
    for r in reservations {
        let charged_until = |t: u64| reserved_in(r, from, t).1;
        for (i, _) in buckets_of((r.start_ms, r.end_ms)) {
            let (start, end) = bounds(i);
            reservation_revenue[i] = reservation_revenue[i]
                .saturating_add(charged_until(end).saturating_sub(charged_until(start)));
        }
    }
    let buckets = (0..n)
        .map(|i| {
            let (start, end) = bounds(i);
            let used: BTreeMap<&str, u128> = used_ms.iter().map(|(&tier, ms)| (tier, ms[i])).collect();
            let earned: BTreeMap<&str, i64> = revenue.iter().map(|(&tier, m)| (tier, m[i])).collect();
            let used_total: u128 = used.values().sum();
            let total = MicroUsd::total(earned.values().copied().chain([reservation_revenue[i]]));
            api::ReportBucket {
                start: rfc3339(start),
                start_ms: start,
                end: rfc3339(end),
                end_ms: end,
                capacity_gpu_hours: ms_hours(capacity_ms[i]),
                used_gpu_hours: ms_hours(used_total),
                utilisation: if capacity_ms[i] == 0 {
                    0.0
                } else {
                    used_total as f64 / capacity_ms[i] as f64
                },
                tiers: tier_reports(&used, &earned, capacity_ms[i]),
                reservation_revenue_micro_usd: reservation_revenue[i],
                reservation_revenue_usd: usd(reservation_revenue[i]),
                total_revenue_micro_usd: total,
                total_revenue_usd: usd(total),
            }
        })
        .collect();
    api::ReportSeries {
        from: rfc3339(from),
        to: rfc3339(to),
        from_ms: from,
        to_ms: to,
        step: duration_text(step_ms),
        step_ms,
        buckets,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::prop_compose;

    use super::*;

    #[test]
    fn metering_is_per_started_second() {
        let base = Ended {
            job: 1,
            attempt: 1,
            tenant: 1,
            tier: "preemptible",
            gpu_model: "H100",
            gpus: 4,
            started_ms: 10_000,
            ended_ms: 10_000 + 90_500,
            notice_at_ms: Some(10_000 + 60_000),
            rate: 1_000_000,
            on_demand_rate: 2_000_000,
            lost_gpu_ms: 1_500,
            outcome: "preempted",
            follows_preemption: true,
            within_min_runtime: false,
            promoted: None,
        };
        let u = meter(base);
        assert!(u.follows_preemption && !u.within_min_runtime);
        assert_eq!(u.seconds, 91);
        assert_eq!(u.gpu_seconds(), 364);
        // 364 GPU-s at $1/GPU-h = $0.101111 (rounded down).
        assert_eq!(u.amount, 101_111);
        assert_eq!(u.drain_gpu_seconds, 31 * 4);
        assert_eq!(u.lost_gpu_seconds, 2);
    }

    #[test]
    fn prices_must_discount_exactly() {
        assert_eq!(parse_price("on_demand_usd", "2.50", 5_000).unwrap(), 2_500_000);
        let err = parse_price("on_demand_usd", "0.000001", 5_000).unwrap_err();
        assert!(err.message.contains("multiple of 0.000002"), "{}", err.message);
        assert!(parse_price("on_demand_usd", "-1", 5_000).unwrap_err().message.contains("on_demand_usd"));
        assert_eq!(preemptible_rate(2_500_000, 5_000) * 2, 2_500_000);
    }

    proptest::proptest! {
        /// Under the default book, every price the server accepts has a
        /// preemptible rate of exactly half, and every price it refuses is
        /// one that has none.
        #[test]
        fn preemptible_is_exactly_half_of_every_accepted_price(micro in 0i64..1_000_000_000_000) {
            let text = format!("{}.{:06}", micro / 1_000_000, micro % 1_000_000);
            match parse_price("on_demand_usd", &text, 5_000) {
                Ok(price) => {
                    proptest::prop_assert_eq!(price, micro);
                    proptest::prop_assert_eq!(preemptible_rate(price, 5_000) * 2, price);
                }
                Err(_) => proptest::prop_assert!(micro % 2 == 1),
            }
        }
    }

    const TIERS_AND_MORE: [&str; 3] = ["on-demand", "preemptible", "reserved"];

    prop_compose! {
        fn usage_row()(tier in 0..3usize, gpus in 1u32..9, started_ms in 0u64..40_000_000,
                       ms in 0u64..20_000_000, rate in 0i64..10_000_000) -> UsageRow {
            let seconds = ms.div_ceil(1000);
            UsageRow {
                job: 1,
                attempt: 1,
                tenant: 1,
                tier: TIERS_AND_MORE[tier].to_string(),
                gpu_model: "H100".into(),
                gpus,
                started_ms,
                ended_ms: started_ms + ms,
                seconds,
                rate,
                on_demand_rate: rate,
                amount: amount(rate, seconds * u64::from(gpus)),
                drain_gpu_seconds: 0,
                lost_gpu_seconds: 0,
                outcome: "completed".into(),
                follows_preemption: false,
                within_min_runtime: false,
                segments: Vec::new(),
            }
        }
    }

    prop_compose! {
        fn reservation()(gpus in 1u32..9, start_ms in 0u64..50_000_000, ms in 1u64..30_000_000,
                         rate in 0i64..10_000_000) -> ReservationRow {
            ReservationRow { id: 1, tenant: 1, gpu_model: "H100".into(), gpus, start_ms,
                             end_ms: start_ms + ms, rate, deleted_ms: None }
        }
    }

    prop_compose! {
        fn ledger()(usage in proptest::collection::vec(usage_row(), 0..30),
                    live in proptest::collection::vec((0..3usize, 1u32..9, 0u64..60_000_000), 0..5),
                    reservations in proptest::collection::vec(reservation(), 0..4),
                    nodes in proptest::collection::vec((0u64..30_000_000, 1u32..9), 0..4),
                    now in 0u64..70_000_000) -> Ledger {
            let live = live
                .into_iter()
                .map(|(tier, gpus, started_ms)| Live { tier: TIERS_AND_MORE[tier].into(), gpus, started_ms })
                .collect();
            Ledger { usage, live, reservations, nodes, now }
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    proptest::proptest! {
        /// The series adds up to the report of its period: GPU-hours to
        /// floating-point rounding, every micro-dollar exactly.
        #[test]
        fn a_series_adds_up_to_the_report_of_its_period(
            ledger in ledger(),
            from in 0u64..40_000_000,
            length in 1u64..30_000_000,
            step_minutes in 1u64..600,
        ) {
            use proptest::prop_assert;
            let (to, step_ms) = (from + length, step_minutes * 60_000);
            let report = report(&ledger, from, to);
            let series = series(&ledger, from, to, step_ms);
            let buckets = &series.buckets;
            proptest::prop_assert_eq!(buckets.len() as u64, length.div_ceil(step_ms));
            proptest::prop_assert_eq!((buckets[0].start_ms, buckets[buckets.len() - 1].end_ms), (from, to));
            for pair in buckets.windows(2) {
                proptest::prop_assert_eq!(pair[0].end_ms, pair[1].start_ms);
            }
            let sum_f = |f: &dyn Fn(&api::ReportBucket) -> f64| buckets.iter().map(f).sum::<f64>();
            let sum_i = |f: &dyn Fn(&api::ReportBucket) -> i64| buckets.iter().map(f).sum::<i64>();
            prop_assert!(close(sum_f(&|b| b.capacity_gpu_hours), report.capacity_gpu_hours));
            prop_assert!(close(sum_f(&|b| b.used_gpu_hours), report.used_gpu_hours));
            for (t, tier) in report.tiers.iter().enumerate() {
                prop_assert!(buckets.iter().all(|b| b.tiers[t].tier == tier.tier));
                prop_assert!(close(sum_f(&|b| b.tiers[t].gpu_hours), tier.gpu_hours), "{}", tier.tier);
                proptest::prop_assert_eq!(sum_i(&|b| b.tiers[t].revenue_micro_usd), tier.revenue_micro_usd);
            }
            proptest::prop_assert_eq!(
                sum_i(&|b| b.reservation_revenue_micro_usd),
                report.reservation_revenue_micro_usd
            );
            proptest::prop_assert_eq!(sum_i(&|b| b.total_revenue_micro_usd), report.total_revenue_micro_usd);
            // Each bucket's reservation charge is within a micro-dollar per
            // reservation of what the bucket alone would be charged.
            for b in buckets {
                let own: i64 = ledger
                    .reservations
                    .iter()
                    .filter_map(|r| reservation_charge(r, b.start_ms, b.end_ms))
                    .map(|c| c.amount_micro_usd)
                    .sum();
                let slack = ledger.reservations.len() as i64;
                prop_assert!((b.reservation_revenue_micro_usd - own).abs() <= slack);
            }
        }
    }

    #[test]
    fn a_series_buckets_what_ran_in_each_and_counts_revenue_where_it_ended() {
        const H: u64 = 3_600_000;
        let record = |tier: &str, started_ms, ended_ms, amount| UsageRow {
            tier: tier.into(),
            gpus: 2,
            started_ms,
            ended_ms,
            amount,
            ..usage_template()
        };
        let ledger = Ledger {
            // Two GPU-hours of preemptible work across the first two
            // buckets, ended in the second; on-demand work that ended
            // before the period counts in neither.
            usage: vec![record("preemptible", H, 2 * H, 7_000_000), record("on-demand", 0, H / 4, 5_000_000)],
            live: vec![Live { tier: "reserved".into(), gpus: 1, started_ms: 2 * H }],
            reservations: vec![ReservationRow {
                id: 1,
                tenant: 1,
                gpu_model: "H100".into(),
                gpus: 1,
                start_ms: 0,
                end_ms: 10 * H,
                rate: 1_000_001,
                deleted_ms: None,
            }],
            nodes: vec![(0, 4)],
            now: 2 * H + H / 2,
        };
        let series = series(&ledger, H / 2, 3 * H, H);
        // Start, capacity, GPU-hours and revenue by tier, reservations' revenue.
        type Bucket = (u64, f64, [f64; 3], [i64; 3], i64);
        let got: Vec<Bucket> = series
            .buckets
            .iter()
            .map(|b| {
                let hours = [0, 1, 2].map(|t| b.tiers[t].gpu_hours);
                let revenue = [0, 1, 2].map(|t| b.tiers[t].revenue_micro_usd);
                (b.start_ms, b.capacity_gpu_hours, hours, revenue, b.reservation_revenue_micro_usd)
            })
            .collect();
        // Tiers in the report's order: on-demand, preemptible, reserved.
        // Capacity and the running attempt stop at now; the last half
        // hour of the reservation is charged what brings the buckets to
        // its 2.5 hours' charge, 2_500_002 (2_500_002.5 rounded down).
        assert_eq!(
            got,
            vec![
                (H / 2, 4.0, [0.0, 1.0, 0.0], [0, 0, 0], 1_000_001),
                (H + H / 2, 4.0, [0.0, 1.0, 0.5], [0, 7_000_000, 0], 1_000_001),
                (2 * H + H / 2, 0.0, [0.0, 0.0, 0.0], [0, 0, 0], 500_000),
            ]
        );
        assert_eq!(series.step, "1h");
        assert_eq!(series.buckets[2].end_ms, 3 * H, "the last bucket ends with the period");
    }

    fn usage_template() -> UsageRow {
        UsageRow {
            job: 1,
            attempt: 1,
            tenant: 1,
            tier: "preemptible".into(),
            gpu_model: "H100".into(),
            gpus: 1,
            started_ms: 0,
            ended_ms: 0,
            seconds: 0,
            rate: 0,
            on_demand_rate: 0,
            amount: 0,
            drain_gpu_seconds: 0,
            lost_gpu_seconds: 0,
            outcome: "completed".into(),
            follows_preemption: false,
            within_min_runtime: false,
            segments: Vec::new(),
        }
    }

    #[test]
    fn a_promoted_attempt_is_billed_at_each_rate_for_its_seconds_and_invoiced_on_two_lines() {
        // 2 GPUs from 10 s; promoted at 70.2 s (61 started seconds as
        // preemptible at $1/GPU-h), ended at 100.5 s (91 seconds in all,
        // 30 of them on-demand at $2/GPU-h).
        let u = meter(Ended {
            job: 1,
            attempt: 1,
            tenant: 1,
            tier: "on-demand",
            gpu_model: "H100",
            gpus: 2,
            started_ms: 10_000,
            ended_ms: 100_500,
            notice_at_ms: None,
            rate: 2_000_000,
            on_demand_rate: 2_000_000,
            lost_gpu_ms: 0,
            outcome: "completed",
            follows_preemption: false,
            within_min_runtime: false,
            promoted: Some((70_200, 1_000_000)),
        });
        let parts: Vec<_> = u.parts().iter().map(|p| (p.tier.clone(), p.seconds, p.rate, p.amount)).collect();
        assert_eq!(
            parts,
            vec![
                ("preemptible".to_string(), 61, 1_000_000, 61 * 2 * 1_000_000 / 3600),
                ("on-demand".to_string(), 30, 2_000_000, 30 * 2 * 2_000_000 / 3600),
            ]
        );
        assert_eq!((u.seconds, u.amount), (91, 33_888 + 33_333));
        let invoice = invoice("acme", std::slice::from_ref(&u), &[], 0, 1_000_000);
        let lines: Vec<_> =
            invoice.lines.iter().map(|l| (l.tier.as_str(), l.gpu_seconds, l.amount_micro_usd)).collect();
        assert_eq!(lines, vec![("on-demand", 60, 33_333), ("preemptible", 122, 33_888)]);
        assert_eq!(invoice.total_micro_usd, u.amount);
        assert_eq!(invoice.preemptible_savings_micro_usd, amount(2_000_000, 122) - 33_888);
    }

    #[test]
    fn an_invoice_counts_preemptions_again_and_within_the_minimum_run_time() {
        let row = |outcome: &str, follows_preemption, within_min_runtime| UsageRow {
            outcome: outcome.into(),
            follows_preemption,
            within_min_runtime,
            ..usage_template()
        };
        let usage = [
            row("preempted", false, false),
            row("preempted", true, false),
            row("preempted", true, true),
            row("preempted", true, true),
            // Not preempted: a job preempted before that then finished or
            // was lost counts for nothing here.
            row("completed", true, false),
            row("lost", true, true),
            // A record from before servers kept the facts reads as neither.
            serde_json::from_value(serde_json::json!({
                "job": 1, "attempt": 1, "tenant": 1, "tier": "preemptible", "gpu_model": "H100",
                "gpus": 1, "started_ms": 0, "ended_ms": 0, "seconds": 0, "rate": 0,
                "on_demand_rate": 0, "amount": 0, "drain_gpu_seconds": 0, "lost_gpu_seconds": 0,
                "outcome": "preempted"
            }))
            .unwrap(),
        ];
        let inv = invoice("acme", &usage, &[], 0, 1);
        assert_eq!(inv.attempts, 7);
        assert_eq!((inv.preemptions, inv.repeat_preemptions, inv.preemptions_within_min_runtime), (5, 3, 2));
    }

    proptest::proptest! {
        /// A step of the form the API document states is never malformed:
        /// it is taken, or refused for its length (422), never with a 400.
        #[test]
        fn every_step_the_document_allows_parses(step in &ebb_api::STEP_PATTERN[1..ebb_api::STEP_PATTERN.len() - 1]) {
            if let Err(e) = series_step(&step, 0, 86_400_000) {
                proptest::prop_assert_eq!(e.status, 422, "{}", e.message);
            }
        }
    }

    /// The highest price the book takes, for a reservation of every GPU
    /// from 1970 to 9999 and records as long: every figure saturates at
    /// the largest amount, none wraps and none panics (a fuzzer found the
    /// report series overflowing its sums).
    #[test]
    fn amounts_past_the_range_saturate_instead_of_overflowing() {
        let (from, to) = period("1970-01-01", "9999-12-28").unwrap();
        let huge = ReservationRow {
            id: 1,
            tenant: 1,
            gpu_model: "H100".into(),
            gpus: u32::MAX,
            start_ms: from,
            end_ms: to,
            rate: i64::MAX,
            deleted_ms: None,
        };
        let reservations = vec![huge.clone(), ReservationRow { id: 2, ..huge }];
        let mut record = usage_template();
        record.gpus = u32::MAX;
        record.started_ms = from;
        record.ended_ms = to - 1;
        record.seconds = (to - from) / 1000;
        record.rate = i64::MAX;
        record.on_demand_rate = i64::MAX;
        record.amount = amount(i64::MAX, record.seconds.saturating_mul(u64::from(record.gpus)));
        assert_eq!(record.amount, i64::MAX);
        let usage = vec![record.clone(), record];
        let ledger = Ledger {
            usage: usage.clone(),
            live: Vec::new(),
            reservations: reservations.clone(),
            nodes: vec![(from, u32::MAX)],
            now: to,
        };
        let report = report(&ledger, from, to);
        assert_eq!(report.total_revenue_micro_usd, i64::MAX);
        assert_eq!(report.reservation_revenue_micro_usd, i64::MAX);
        let series = series(&ledger, from, to, series_step("999999d", from, to).unwrap());
        assert!(series.buckets.iter().all(|b| b.total_revenue_micro_usd >= 0));
        assert_eq!(series.buckets.iter().map(|b| b.total_revenue_micro_usd).max(), Some(i64::MAX));
        let invoice = invoice("t", &usage, &reservations, from, to);
        assert_eq!(invoice.total_micro_usd, i64::MAX);
        assert!(invoice.preemptible_savings_micro_usd >= 0);
    }

    #[test]
    fn a_series_step_is_a_minute_or_more_and_makes_at_most_a_thousand_buckets() {
        const DAY: u64 = 86_400_000;
        assert_eq!(series_step("1h", 0, DAY).unwrap(), 3_600_000);
        assert_eq!(series_step("15m", 0, DAY).unwrap(), 900_000);
        assert_eq!(series_step("1d", 0, 30 * DAY).unwrap(), DAY);
        let err = series_step("hourly", 0, DAY).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.starts_with("step: \"hourly\" is not a duration"), "{}", err.message);
        let err = series_step("30s", 0, DAY).unwrap_err();
        assert_eq!(
            (err.status, err.message.as_str()),
            (422, "step: 30s is shorter than the shortest step, 1m")
        );
        let err = series_step("1m", 0, 30 * DAY).unwrap_err();
        assert_eq!(err.status, 422);
        assert_eq!(
            err.message,
            "step: 1m over the 30days from 1970-01-01T00:00:00.000Z to 1970-01-31T00:00:00.000Z \
             makes 43200 buckets, over the limit of 1000; use a step of at least 44m for this \
             period, or a period of at most 16h 40m for this step"
        );
        assert_eq!(series_step("1m", 0, 1_000 * 60_000).unwrap(), 60_000, "exactly 1000 buckets");
    }

    #[test]
    fn dates_and_periods() {
        assert_eq!(parse_time("from", "1970-01-02").unwrap(), 86_400_000);
        assert_eq!(parse_time("from", "1970-01-01T00:00:01Z").unwrap(), 1_000);
        assert!(parse_time("from", "yesterday").unwrap_err().message.starts_with("from:"));
        assert!(period("1970-01-03", "1970-01-02").unwrap_err().message.contains("is not before"));
    }

    #[test]
    fn usd_for_people() {
        assert_eq!(usd(2_500_000), "2.50");
        assert_eq!(usd(101_111), "0.101111");
        assert_eq!(usd(0), "0.00");
        assert_eq!(usd(-1_230_000), "-1.23");
    }
}
