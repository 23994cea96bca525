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
use ebb_core::{Attempt, JobId, MicroUsd, TenantId};
use serde::{Deserialize, Serialize};

use crate::{rfc3339, Refusal};

mod report;
#[cfg(test)]
mod tests;

pub use report::{report, series, series_step, Ledger, Live};

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
    pub tenant: TenantId,
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
    pub job: JobId,
    pub attempt: Attempt,
    pub tenant: TenantId,
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

/// Part of an attempt at one tier's rate (a promoted attempt's), or on
/// one node (an elastic attempt's, each node from its join to its exit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub tier: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub seconds: u64,
    pub rate: i64,
    pub amount: i64,
    /// Its GPUs; 0: the record's (records before elastic attempts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl UsageRow {
    pub fn gpu_seconds(&self) -> u64 {
        self.parts().iter().map(|p| p.seconds.saturating_mul(u64::from(p.gpus))).fold(0, u64::saturating_add)
    }

    /// Its parts at each tier's rate and on its GPUs: its segments, or
    /// itself whole; each with its GPUs.
    pub fn parts(&self) -> Vec<Segment> {
        if !self.segments.is_empty() {
            let mut parts = self.segments.clone();
            for part in &mut parts {
                if part.gpus == 0 {
                    part.gpus = self.gpus;
                }
            }
            return parts;
        }
        vec![Segment {
            tier: self.tier.clone(),
            from_ms: self.started_ms,
            to_ms: self.ended_ms,
            seconds: self.seconds,
            rate: self.rate,
            amount: self.amount,
            gpus: self.gpus,
        }]
    }

    pub fn view(&self, tenant: &str) -> api::Usage {
        api::Usage {
            job: self.job.0,
            attempt: self.attempt.0,
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
            segments: match self.segments.is_empty() {
                true => Vec::new(),
                false => self
                    .parts()
                    .into_iter()
                    .map(|s| api::UsageSegment {
                        tier: s.tier,
                        from_ms: s.from_ms,
                        to_ms: s.to_ms,
                        seconds: s.seconds,
                        rate_micro_usd: s.rate,
                        amount_micro_usd: s.amount,
                        gpus: s.gpus,
                    })
                    .collect(),
            },
        }
    }
}

/// What an attempt's end tells the meter.
pub struct Ended<'a> {
    pub job: JobId,
    pub attempt: Attempt,
    pub tenant: TenantId,
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
    /// An elastic attempt's parts, each on one node from its join to its
    /// exit: metered each apart (empty for every other attempt).
    pub parts: Vec<NodeSpan>,
}

/// One node's part of an elastic attempt: its GPUs, from its join to its
/// exit, and its drain notice if it had one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSpan {
    pub gpus: u32,
    pub from_ms: u64,
    pub to_ms: u64,
    pub notice_at_ms: Option<u64>,
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
    let mut drain_gpu_seconds = drain_seconds.saturating_mul(u64::from(e.gpus));
    let (amount, segments) = match e.promoted {
        None if !e.parts.is_empty() => {
            let segments: Vec<Segment> = e
                .parts
                .iter()
                .map(|p| {
                    let to_ms = p.to_ms.max(p.from_ms);
                    let seconds = whole_seconds(to_ms - p.from_ms);
                    Segment {
                        tier: e.tier.to_string(),
                        from_ms: p.from_ms,
                        to_ms,
                        seconds,
                        rate: e.rate,
                        amount: amount(e.rate, seconds.saturating_mul(u64::from(p.gpus))),
                        gpus: p.gpus,
                    }
                })
                .collect();
            drain_gpu_seconds = e
                .parts
                .iter()
                .filter_map(|p| {
                    let notice = p.notice_at_ms?;
                    let drained = whole_seconds(p.to_ms.saturating_sub(notice.max(p.from_ms)));
                    Some(drained.saturating_mul(u64::from(p.gpus)))
                })
                .fold(0, u64::saturating_add);
            (MicroUsd::total(segments.iter().map(|s| s.amount)), segments)
        }
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
                    gpus: 0,
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
        drain_gpu_seconds,
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
pub fn parse_price(field: &str, text: &str, discount_bps: u32) -> Result<i64, Refusal> {
    let micro = MicroUsd::parse_usd(text).map_err(|e| Refusal::invalid(format!("{field}: {e}")))?.0;
    if (micro as i128 * i128::from(10_000 - discount_bps)) % 10_000 != 0 {
        let step = 10_000 / gcd(10_000, u64::from(10_000 - discount_bps));
        return Err(Refusal::unacceptable(format!(
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
pub fn parse_time(field: &str, text: &str) -> Result<u64, Refusal> {
    let text = text.trim();
    let full = if text.len() == 10 && text.as_bytes().get(4) == Some(&b'-') {
        format!("{text}T00:00:00Z")
    } else {
        text.to_string()
    };
    let at =
        humantime::parse_rfc3339_weak(&full).or_else(|_| humantime::parse_rfc3339(&full)).map_err(|e| {
            Refusal::invalid(format!(
                "{field}: {text:?} is not a date or time (2026-12-01 or 2026-12-01T08:00:00Z): {e}"
            ))
        })?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| Refusal::invalid(format!("{field}: {text:?} is before 1970")))?;
    Ok(ms.as_millis() as u64)
}

/// `[from, to)`, checked.
pub fn period(from: &str, to: &str) -> Result<(u64, u64), Refusal> {
    let (f, t) = (parse_time("from", from)?, parse_time("to", to)?);
    if f >= t {
        return Err(Refusal::unacceptable(format!("from: {from} is not before to: {to}")));
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
            let gpu_seconds = part.seconds.saturating_mul(u64::from(part.gpus));
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
