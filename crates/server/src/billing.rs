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
}

impl UsageRow {
    pub fn gpu_seconds(&self) -> u64 {
        self.seconds * u64::from(self.gpus)
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
        amount: amount(e.rate, seconds * u64::from(e.gpus)),
        drain_gpu_seconds: drain_seconds * u64::from(e.gpus),
        lost_gpu_seconds: e.lost_gpu_ms.div_ceil(1000),
        outcome: e.outcome.to_string(),
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

/// A reservation's charge for its committed time inside `[from, to)`.
pub fn reservation_charge(r: &ReservationRow, from: u64, to: u64) -> Option<api::ReservationCharge> {
    let ms = overlap((r.start_ms, r.end_ms), (from, to));
    if ms == 0 {
        return None;
    }
    let gpu_ms = u128::from(ms) * u128::from(r.gpus);
    let amount = MicroUsd::for_gpu_millis(MicroUsd(r.rate), gpu_ms).0;
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
    let (mut od_equivalent, mut savings, mut preemptions) = (0i64, 0i64, 0u64);
    let (mut drain, mut lost) = (0u64, 0u64);
    for u in usage {
        let line = lines.entry((u.tier.clone(), u.gpu_model.clone(), u.rate)).or_insert((0, 0));
        line.0 += u.gpu_seconds();
        line.1 += u.amount;
        let at_on_demand = amount(u.on_demand_rate, u.gpu_seconds());
        od_equivalent += at_on_demand;
        if u.tier == "preemptible" {
            savings += at_on_demand - u.amount;
        }
        preemptions += u64::from(u.outcome == "preempted");
        drain += u.drain_gpu_seconds;
        lost += u.lost_gpu_seconds;
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
    let total = lines.iter().map(|l| l.amount_micro_usd).sum::<i64>()
        + charges.iter().map(|c| c.amount_micro_usd).sum::<i64>();
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
        drain_gpu_hours: hours(drain),
        lost_gpu_hours: hours(lost),
    }
}

/// An attempt still running, for the report's use figures.
pub struct Live {
    pub tier: String,
    pub gpus: u32,
    pub started_ms: u64,
}

/// The operator's report for `[from, to)`: use by tier (ended and running
/// attempts, clipped to the period), capacity from the nodes' GPUs since
/// they joined, revenue from records ended in the period and reservations.
pub fn report(
    usage: &[UsageRow],
    live: &[Live],
    reservations: &[ReservationRow],
    nodes: &[(u64, u32)],
    now: u64,
    from: u64,
    to: u64,
) -> api::OperatorReport {
    let capacity_ms: u128 = nodes
        .iter()
        .map(|&(joined, gpus)| u128::from(overlap((joined, now), (from, to))) * u128::from(gpus))
        .sum();
    let mut used_ms: BTreeMap<&str, u128> = BTreeMap::new();
    let mut revenue: BTreeMap<&str, i64> = BTreeMap::new();
    for tier in ["reserved", "on-demand", "preemptible"] {
        used_ms.insert(tier, 0);
        revenue.insert(tier, 0);
    }
    for u in usage {
        let ms = overlap((u.started_ms, u.ended_ms), (from, to));
        *used_ms.entry(u.tier.as_str()).or_insert(0) += u128::from(ms) * u128::from(u.gpus);
        if (from..to).contains(&u.ended_ms) {
            *revenue.entry(u.tier.as_str()).or_insert(0) += u.amount;
        }
    }
    for l in live {
        let ms = overlap((l.started_ms, now), (from, to));
        *used_ms.entry(l.tier.as_str()).or_insert(0) += u128::from(ms) * u128::from(l.gpus);
    }
    let reservation_revenue: i64 =
        reservations.iter().filter_map(|r| reservation_charge(r, from, to)).map(|c| c.amount_micro_usd).sum();
    let gpu_hours = |ms: u128| ms as f64 / 3_600_000.0;
    let share = |ms: u128| if capacity_ms == 0 { 0.0 } else { ms as f64 / capacity_ms as f64 };
    let used: u128 = used_ms.values().sum();
    let preemptible_ms = used_ms["preemptible"];
    let tiers = used_ms
        .iter()
        .map(|(tier, ms)| api::TierReport {
            tier: tier.to_string(),
            gpu_hours: gpu_hours(*ms),
            utilisation: share(*ms),
            revenue_micro_usd: revenue[tier],
            revenue_usd: usd(revenue[tier]),
        })
        .collect();
    let total = revenue.values().sum::<i64>() + reservation_revenue;
    api::OperatorReport {
        from: rfc3339(from),
        to: rfc3339(to),
        capacity_gpu_hours: gpu_hours(capacity_ms),
        used_gpu_hours: gpu_hours(used),
        idle_gpu_hours: gpu_hours(capacity_ms.saturating_sub(used)),
        utilisation: share(used),
        utilisation_without_preemptible: share(used - preemptible_ms),
        tiers,
        reservation_revenue_micro_usd: reservation_revenue,
        reservation_revenue_usd: usd(reservation_revenue),
        total_revenue_micro_usd: total,
        total_revenue_usd: usd(total),
        idle_capacity_sold_gpu_hours: gpu_hours(preemptible_ms),
        idle_capacity_sold_micro_usd: revenue["preemptible"],
        idle_capacity_sold_usd: usd(revenue["preemptible"]),
    }
}

#[cfg(test)]
mod tests {
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
        };
        let u = meter(base);
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
