//! The operator's report: use, capacity and revenue by tier over a
//! period, and the same as a series of buckets for the dashboard's
//! charts, from the usage records, the attempts still running, the
//! reservations and the nodes.

use crate::{rfc3339, Refusal};
use ebb_api as api;
use ebb_core::MicroUsd;
use std::collections::BTreeMap;

use super::*;

/// An attempt still running, for the report's use figures.
#[derive(Clone, Debug)]
pub struct Live {
    pub tenant: TenantId,
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
    /// Tenants' names, for the series' use by tenant.
    pub names: BTreeMap<TenantId, String>,
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
    let Ledger { usage, live, reservations, nodes, now, .. } = ledger;
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
            *used_ms.entry(tier).or_insert(0) += u128::from(ms) * u128::from(part.gpus);
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
pub fn series_step(text: &str, from: u64, to: u64) -> Result<u64, Refusal> {
    let step = humantime::parse_duration(text.trim())
        .map_err(|e| Refusal::invalid(format!("step: {text:?} is not a duration (15m, 1h, 1d): {e}")))?;
    let step_ms = u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
    if step_ms < MIN_STEP_MS {
        return Err(Refusal::unacceptable(format!(
            "step: {text} is shorter than the shortest step, {}",
            duration_text(MIN_STEP_MS)
        )));
    }
    let period = to.saturating_sub(from);
    let buckets = period.div_ceil(step_ms);
    if buckets > MAX_BUCKETS {
        // In whole minutes, so that the advice reads as a step one would type.
        let shortest = period.div_ceil(MAX_BUCKETS).div_ceil(MIN_STEP_MS) * MIN_STEP_MS;
        return Err(Refusal::unacceptable(format!(
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
    let Ledger { usage, live, reservations, nodes, now, names } = ledger;
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
    let mut by_tenant: BTreeMap<TenantId, Vec<u128>> = BTreeMap::new();
    for u in usage {
        for part in u.parts() {
            let tier = tier_key(&part.tier);
            let used = used_ms.entry(tier).or_insert_with(|| vec![0; n]);
            let tenant = by_tenant.entry(u.tenant).or_insert_with(|| vec![0; n]);
            for (i, ms) in buckets_of((part.from_ms, part.to_ms)) {
                used[i] += u128::from(ms) * u128::from(part.gpus);
                tenant[i] += u128::from(ms) * u128::from(part.gpus);
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
        let tenant = by_tenant.entry(l.tenant).or_insert_with(|| vec![0; n]);
        for (i, ms) in buckets_of((l.started_ms, *now)) {
            used[i] += u128::from(ms) * u128::from(l.gpus);
            tenant[i] += u128::from(ms) * u128::from(l.gpus);
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
                tenants: {
                    let mut tenants: Vec<api::TenantUse> = by_tenant
                        .iter()
                        .filter(|(_, ms)| ms[i] > 0)
                        .map(|(id, ms)| api::TenantUse {
                            tenant: names.get(id).cloned().unwrap_or_else(|| format!("tenant {}", id.0)),
                            gpu_hours: ms_hours(ms[i]),
                            share: ms[i] as f64 / used_total as f64,
                        })
                        .collect();
                    tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
                    tenants
                },
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
