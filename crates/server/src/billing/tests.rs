//! Money's unit tests: metering, prices, invoices, reports and series,
//! at their extremes.

use proptest::prelude::prop_compose;

use super::*;

#[test]
fn metering_is_per_started_second() {
    let base = Ended {
        job: JobId(1),
        attempt: Attempt(1),
        tenant: TenantId(1),
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
        parts: Vec::new(),
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
            job: JobId(1),
            attempt: Attempt(1),
            tenant: TenantId(1),
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
        ReservationRow { id: 1, tenant: TenantId(1), gpu_model: "H100".into(), gpus, start_ms,
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
            .map(|(tier, gpus, started_ms)| Live { tenant: TenantId(gpus % 3), tier: TIERS_AND_MORE[tier].into(), gpus, started_ms })
            .collect();
        Ledger { usage, live, reservations, nodes, now, names: BTreeMap::new() }
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
        // Each bucket's use by tenant adds up to its use, and the shares to 1.
        for b in buckets {
            let by_tenant: f64 = b.tenants.iter().map(|t| t.gpu_hours).sum();
            prop_assert!((by_tenant - b.used_gpu_hours).abs() <= 1e-6 * b.used_gpu_hours.max(1.0));
            let shares: f64 = b.tenants.iter().map(|t| t.share).sum();
            prop_assert!(b.tenants.is_empty() || (shares - 1.0).abs() < 1e-9, "{shares}");
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
        live: vec![Live { tenant: TenantId(1), tier: "reserved".into(), gpus: 1, started_ms: 2 * H }],
        reservations: vec![ReservationRow {
            id: 1,
            tenant: TenantId(1),
            gpu_model: "H100".into(),
            gpus: 1,
            start_ms: 0,
            end_ms: 10 * H,
            rate: 1_000_001,
            deleted_ms: None,
        }],
        nodes: vec![(0, 4)],
        now: 2 * H + H / 2,
        names: BTreeMap::from([(TenantId(1), "acme".to_string())]),
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
        job: JobId(1),
        attempt: Attempt(1),
        tenant: TenantId(1),
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
        job: JobId(1),
        attempt: Attempt(1),
        tenant: TenantId(1),
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
        parts: Vec::new(),
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
            proptest::prop_assert_eq!(crate::http::status(e.kind), 422, "{}", e.message);
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
        tenant: TenantId(1),
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
        names: BTreeMap::new(),
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
    assert_eq!(crate::http::status(err.kind), 400);
    assert!(err.message.starts_with("step: \"hourly\" is not a duration"), "{}", err.message);
    let err = series_step("30s", 0, DAY).unwrap_err();
    assert_eq!(
        (crate::http::status(err.kind), err.message.as_str()),
        (422, "step: 30s is shorter than the shortest step, 1m")
    );
    let err = series_step("1m", 0, 30 * DAY).unwrap_err();
    assert_eq!(crate::http::status(err.kind), 422);
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
