//! Prometheus metrics at `/metrics`, computed from the writer's state at
//! scrape time.
//!
//! Every series is exported from the first scrape, zero included: each
//! label takes every value it can have ([`TIERS`], [`JOB_STATES`],
//! [`GPU_STATES`], [`NODE_STATUSES`]), so a dashboard never shows a gap
//! where nothing happened yet and an alert on a rate never meets a missing
//! series. Counters count since the server started (Prometheus' `rate` and
//! `increase` take restarts in their stride), end in `_total`, and carry
//! their unit in the name (`_seconds`, `_gpu_seconds`, `_usd`).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::billing::UsageRow;

/// The tiers, as labels name them.
pub const TIERS: [&str; 3] = ["reserved", "on-demand", "preemptible"];
/// A job's states, as the API names them.
pub const JOB_STATES: [&str; 7] =
    ["queued", "starting", "running", "draining", "succeeded", "failed", "cancelled"];
/// What an allocated GPU is doing: running an attempt, running one in its
/// drain window, or free but held for a job whose victims are draining
/// elsewhere (GPUs a victim still runs on count as `draining`).
pub const GPU_STATES: [&str; 3] = ["running", "draining", "held"];
/// A node's statuses, as the API names them.
pub const NODE_STATUSES: [&str; 4] = ["up", "draining", "unhealthy", "lost"];
/// What a health finding makes the server do (`ebb_api::HealthClass`).
pub const HEALTH_CLASSES: [&str; 3] = ["fatal", "drain", "warn"];
/// What a health finding is (`ebb_api::GpuFinding::kind`).
pub const HEALTH_KINDS: [&str; 8] = [
    "xid",
    "ecc_double_bit",
    "retired_pages",
    "remapped_rows",
    "throttled",
    "temperature",
    "nvlink_down",
    "check_failed",
];
/// Bucket bounds of `ebb_drain_seconds`, up to past the default drain
/// window (300 s).
const DRAIN_BUCKETS: [f64; 10] = [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 600.0];

/// What the writer counts as things happen.
#[derive(Clone, Debug)]
pub struct Counters {
    pub submitted: u64,
    pub preempted: u64,
    pub checkpoints: u64,
    pub lost_gpu_seconds: f64,
    pub passes: u64,
    pub pass_seconds: f64,
    /// Batches the writer committed; each ran the scheduler after its
    /// messages (a tick's at least every 250 ms).
    pub batches: u64,
    /// Agents' command polls taken by the writer, those answered without
    /// it (quiet nodes: idle, healthy, nothing waiting), and those
    /// answered with the commands of the commit that woke them.
    pub polls_writer: u64,
    pub polls_quiet: u64,
    pub polls_woken: u64,
    /// Agents' registrations (a node joining, an agent starting, an agent
    /// finding this server the new leader).
    pub registrations: u64,
    /// Preemptors' starts sent to their nodes with the drain notices, and
    /// those withdrawn because their holds went first (`engine/staged.rs`).
    pub starts_ahead: u64,
    pub starts_withdrawn: u64,
    /// Drills concluded, by verdict (`ready`, `failed`).
    pub drills_ready: u64,
    pub drills_failed: u64,
    /// Health findings as they appeared, by (class, kind).
    pub health_findings: BTreeMap<(&'static str, &'static str), u64>,
    /// GPU-seconds metered in drain windows (as invoices count them).
    pub drain_gpu_seconds: u64,
    /// Metered revenue of ended attempts, micro-dollars, by the tier each
    /// part of an attempt ran at (`UsageRow::parts`).
    pub revenue_micro_usd: BTreeMap<&'static str, i64>,
    /// Seconds from each drained attempt's notice to its end. Shared with
    /// every snapshot (a histogram is its buckets, not one number).
    pub drain_seconds: Histogram,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            submitted: 0,
            preempted: 0,
            checkpoints: 0,
            lost_gpu_seconds: 0.0,
            passes: 0,
            pass_seconds: 0.0,
            batches: 0,
            polls_writer: 0,
            registrations: 0,
            starts_ahead: 0,
            starts_withdrawn: 0,
            polls_quiet: 0,
            polls_woken: 0,
            drills_ready: 0,
            drills_failed: 0,
            health_findings: BTreeMap::new(),
            drain_gpu_seconds: 0,
            revenue_micro_usd: TIERS.iter().map(|&t| (t, 0)).collect(),
            drain_seconds: Histogram::new(DRAIN_BUCKETS),
        }
    }
}

impl Counters {
    /// An attempt ended, metered as `usage` (none: it never ran), having
    /// had its notice for `drained_ms` if it was drained. Its revenue is
    /// counted part by part, each under its own tier, as invoices and
    /// reports count it: a deadline job promoted while it ran earned the
    /// preemptible rate up to the promotion and on-demand after.
    pub fn ended(&mut self, usage: Option<&UsageRow>, drained_ms: Option<u64>) {
        if let Some(usage) = usage {
            for part in usage.parts() {
                // As the report counts it (`billing::report`).
                let tier = TIERS.into_iter().find(|t| *t == part.tier).unwrap_or("on-demand");
                let earned = self.revenue_micro_usd.entry(tier).or_insert(0);
                *earned = earned.saturating_add(part.amount);
            }
            self.drain_gpu_seconds += usage.drain_gpu_seconds;
        }
        if let Some(ms) = drained_ms {
            self.drain_seconds.observe(ms as f64 / 1000.0);
        }
    }
}

/// A series of `ebb_jobs_queued`: the queued jobs it counts. Its labels
/// are its fields; their values are in [`QueueKey::all`], and the one
/// place that makes a key from a job is `Engine::metrics_snapshot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub tier: &'static str,
    /// The job's `pending_reason`.
    pub reason: ebb_api::PendingReason,
}

impl QueueKey {
    /// Every series, so that each is exported at zero too.
    fn all() -> impl Iterator<Item = QueueKey> {
        TIERS.into_iter().flat_map(|tier| {
            ebb_api::PendingReason::ALL.into_iter().map(move |reason| QueueKey { tier, reason })
        })
    }

    fn labels(&self) -> Labels {
        vec![("tier".into(), self.tier.into()), ("reason".into(), self.reason.as_str().into())]
    }
}

/// The state at one scrape.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub counters: Counters,
    /// Jobs by (tier, state).
    pub jobs: BTreeMap<(&'static str, &'static str), u64>,
    pub queued: BTreeMap<QueueKey, u64>,
    /// Allocated GPUs by (tier, GPU state).
    pub gpus: BTreeMap<(&'static str, &'static str), u64>,
    /// GPUs on nodes that take work, and of those the ones neither
    /// allocated nor held.
    pub gpus_total: u64,
    pub gpus_idle: u64,
    pub nodes: BTreeMap<&'static str, u64>,
    /// GPUs out of service for a fault, on nodes that are not lost.
    pub gpus_faulted: u64,
    /// Per tenant and tier with work or usage there: (share of the tier's
    /// decayed usage, its weight's share, decayed usage in dollars).
    pub shares: BTreeMap<(String, &'static str), (f64, f64, f64)>,
    /// Per tenant, tier and GPU model with a quota: (nominal, used).
    pub quotas: BTreeMap<(String, &'static str, String), (u64, u64)>,
}

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn gauge(value: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    g
}

fn counter(value: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(value);
    c
}

fn counter_f64(value: f64) -> Counter<f64> {
    let c = Counter::<f64>::default();
    c.inc_by(value);
    c
}

/// The Prometheus text of a snapshot.
pub fn render(s: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("ebb");
    register_state(&mut registry, s);
    register_tenants(&mut registry, s);
    register_outcomes(&mut registry, &s.counters);
    register_operations(&mut registry, s);
    let mut text = String::new();
    encode(&mut text, &registry).expect("metrics encode into a string");
    text
}

/// What the server holds now: jobs, GPUs and nodes.
fn register_state(registry: &mut Registry, s: &Snapshot) {
    let count = |map: &BTreeMap<(&str, &str), u64>, key: (&str, &str)| map.get(&key).copied().unwrap_or(0);

    let jobs = Family::<Labels, Gauge>::default();
    for tier in TIERS {
        for state in JOB_STATES {
            jobs.get_or_create(&labels(&[("tier", tier), ("state", state)]))
                .set(count(&s.jobs, (tier, state)) as i64);
        }
    }
    registry.register("jobs", "Jobs by tier and state", jobs);

    let queued = Family::<Labels, Gauge>::default();
    for key in QueueKey::all() {
        queued.get_or_create(&key.labels()).set(s.queued.get(&key).copied().unwrap_or(0) as i64);
    }
    registry.register(
        "jobs_queued",
        "Jobs waiting to start, by tier and why they wait (pending_reason)",
        queued,
    );

    let gpus = Family::<Labels, Gauge>::default();
    for tier in TIERS {
        for state in GPU_STATES {
            gpus.get_or_create(&labels(&[("tier", tier), ("state", state)]))
                .set(count(&s.gpus, (tier, state)) as i64);
        }
    }
    registry.register(
        "gpus_allocated",
        "GPUs given to jobs, by the job's tier and what the GPU does: running an attempt, running one in its \
         drain window, or free and held for a job waiting for its victims",
        gpus,
    );
    registry.register("gpus", "GPUs on nodes that take work", gauge(s.gpus_total));
    registry.register(
        "gpus_idle",
        "GPUs on nodes that take work, neither allocated nor held",
        gauge(s.gpus_idle),
    );

    let nodes = Family::<Labels, Gauge>::default();
    for status in NODE_STATUSES {
        nodes
            .get_or_create(&labels(&[("status", status)]))
            .set(s.nodes.get(status).copied().unwrap_or(0) as i64);
    }
    registry.register("nodes", "Nodes by status", nodes);
}

/// Tenants' fair shares and quotas.
fn register_tenants(registry: &mut Registry, s: &Snapshot) {
    let [share, weight_share, usage] = [(); 3].map(|_| Family::<Labels, Gauge<f64, AtomicU64>>::default());
    for ((tenant, tier), &(s_, w, u)) in &s.shares {
        let l = labels(&[("tenant", tenant), ("tier", tier)]);
        share.get_or_create(&l).set(s_);
        weight_share.get_or_create(&l).set(w);
        usage.get_or_create(&l).set(u);
    }
    registry.register(
        "tenant_share",
        "A tenant's share (0-1) of its tier's usage, GPU time at on-demand prices decayed with the fair-share \
         half-life",
        share,
    );
    registry.register(
        "tenant_weight_share",
        "A tenant's weight over the weights of its tier's tenants (0-1)",
        weight_share,
    );
    registry.register_with_unit(
        "tenant_usage",
        "A tenant's decayed usage in a tier, GPU time valued at on-demand prices",
        Unit::Other("dollars".into()),
        usage,
    );
    let quota = Family::<Labels, Gauge>::default();
    for ((tenant, tier, model), &(nominal, used)) in &s.quotas {
        for (kind, value) in [("nominal", nominal), ("used", used)] {
            let l = labels(&[("tenant", tenant), ("tier", tier), ("gpu_model", model), ("kind", kind)]);
            quota.get_or_create(&l).set(value as i64);
        }
    }
    registry.register(
        "tenant_quota_gpus",
        "A tenant's quota in a tier on a GPU model, and the GPUs it uses against it",
        quota,
    );
}

/// What jobs came to since the server started: submissions, preemptions,
/// drains, checkpoints, lost work, revenue.
fn register_outcomes(registry: &mut Registry, c: &Counters) {
    registry.register("submissions", "Jobs submitted since the server started", counter(c.submitted));
    registry.register(
        "preemptions",
        "Attempts that ended preempted (drained, then requeued or past their max_preemptions) since the server \
         started",
        counter(c.preempted),
    );
    registry.register_with_unit(
        "drain",
        "Time from a drained attempt's notice to its end, since the server started",
        Unit::Seconds,
        c.drain_seconds.clone(),
    );
    registry.register_with_unit(
        "drain",
        "GPU-seconds metered in drain windows (as invoices count them) since the server started",
        Unit::Other("gpu_seconds".into()),
        counter(c.drain_gpu_seconds),
    );
    registry.register(
        "checkpoints",
        "Checkpoints reported by attempts since the server started",
        counter(c.checkpoints),
    );
    registry.register_with_unit(
        "lost",
        "GPU-seconds of work lost to preemptions and lost nodes since the server started",
        Unit::Other("gpu_seconds".into()),
        counter_f64(c.lost_gpu_seconds),
    );
    let revenue = Family::<Labels, Counter<f64>>::default();
    for tier in TIERS {
        let micro = c.revenue_micro_usd.get(tier).copied().unwrap_or(0);
        revenue.get_or_create(&labels(&[("tier", tier)])).inc_by(micro as f64 / 1e6);
    }
    registry.register_with_unit(
        "revenue",
        "Metered revenue of attempts that ended since the server started, by the tier each part ran at (a \
         deadline job promoted while it ran: preemptible up to the promotion, on-demand after), in dollars \
         (reserved jobs are covered by their reservation, whose charges are in `ebb report`)",
        Unit::Other("usd".into()),
        revenue,
    );
}

/// The server's own work since it started: agents' polls and
/// registrations, starts sent ahead, health findings, drills, passes.
fn register_operations(registry: &mut Registry, s: &Snapshot) {
    let c = &s.counters;
    let polls = Family::<Labels, Counter>::default();
    polls.get_or_create(&labels(&[("answered", "writer")])).inc_by(c.polls_writer);
    polls.get_or_create(&labels(&[("answered", "quiet")])).inc_by(c.polls_quiet);
    polls.get_or_create(&labels(&[("answered", "woken")])).inc_by(c.polls_woken);
    registry.register(
        "agent_polls",
        "Agents' command polls since the server started: taken by the writer, answered without it for a \
         quiet node (idle, healthy, no command waiting), or answered where they waited with the commands of \
         the commit that woke them (each of those was taken by the writer first)",
        polls,
    );
    registry.register(
        "agent_registrations",
        "Agents' registrations since the server started (or took the lead): a node joining, an agent \
         starting, every agent after a takeover",
        counter(c.registrations),
    );
    let ahead = Family::<Labels, Counter>::default();
    ahead.get_or_create(&labels(&[("outcome", "sent")])).inc_by(c.starts_ahead);
    ahead.get_or_create(&labels(&[("outcome", "withdrawn")])).inc_by(c.starts_withdrawn);
    registry.register(
        "starts_ahead",
        "Preemptors' starts sent to their nodes with the drain notices since the server started (the node \
         starts one when its victims have gone), and those withdrawn because the hold went first",
        ahead,
    );
    let findings = Family::<Labels, Counter>::default();
    for class in HEALTH_CLASSES {
        for kind in HEALTH_KINDS {
            let n = s.counters.health_findings.get(&(class, kind)).copied().unwrap_or(0);
            findings.get_or_create(&labels(&[("class", class), ("kind", kind)])).inc_by(n);
        }
    }
    registry.register(
        "health_findings",
        "GPU and node health findings as they appeared since the server started, by what they made the \
         server do (fatal: the GPU out of service; drain: the node drained; warn: shown) and by kind",
        findings,
    );
    registry.register(
        "gpus_faulted",
        "GPUs out of service for a fault (ebb undrain returns them), on nodes that are not lost",
        gauge(s.gpus_faulted),
    );
    let drills = Family::<Labels, Counter>::default();
    drills.get_or_create(&labels(&[("verdict", "ready")])).inc_by(c.drills_ready);
    drills.get_or_create(&labels(&[("verdict", "failed")])).inc_by(c.drills_failed);
    registry.register("drills", "Drills (ebb drill) concluded since the server started, by verdict", drills);
    registry.register("scheduling_passes", "Plans applied since the server started", counter(c.passes));
    registry.register(
        "writer_batches",
        "Batches the writer committed since the server started, each with a scheduling pass",
        counter(c.batches),
    );
    registry.register_with_unit(
        "scheduling",
        "Time spent planning since the server started",
        Unit::Seconds,
        counter_f64(c.pass_seconds),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_core::{Attempt, JobId, TenantId};

    /// The value of the series `name` (with its labels, as exported).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_fresh_server_exports_every_series_at_zero() {
        let text = render(&Snapshot::default());
        let mut series = vec![
            "ebb_gpus".to_string(),
            "ebb_gpus_idle".into(),
            "ebb_submissions_total".into(),
            "ebb_preemptions_total".into(),
            "ebb_drain_seconds_count".into(),
            "ebb_drain_seconds_sum".into(),
            "ebb_drain_seconds_bucket{le=\"300.0\"}".into(),
            "ebb_drain_seconds_bucket{le=\"+Inf\"}".into(),
            "ebb_drain_gpu_seconds_total".into(),
            "ebb_checkpoints_total".into(),
            "ebb_lost_gpu_seconds_total".into(),
            "ebb_scheduling_passes_total".into(),
            "ebb_writer_batches_total".into(),
            "ebb_scheduling_seconds_total".into(),
            "ebb_agent_polls_total{answered=\"writer\"}".into(),
            "ebb_agent_polls_total{answered=\"quiet\"}".into(),
            "ebb_agent_registrations_total".into(),
            "ebb_starts_ahead_total{outcome=\"sent\"}".into(),
            "ebb_starts_ahead_total{outcome=\"withdrawn\"}".into(),
            "ebb_drills_total{verdict=\"ready\"}".into(),
            "ebb_drills_total{verdict=\"failed\"}".into(),
            "ebb_gpus_faulted".into(),
        ];
        for class in HEALTH_CLASSES {
            for kind in HEALTH_KINDS {
                series.push(format!("ebb_health_findings_total{{class=\"{class}\",kind=\"{kind}\"}}"));
            }
        }
        for tier in TIERS {
            for reason in ebb_api::PendingReason::ALL {
                series.push(format!("ebb_jobs_queued{{tier=\"{tier}\",reason=\"{reason}\"}}"));
            }
            series.push(format!("ebb_revenue_usd_total{{tier=\"{tier}\"}}"));
            for state in JOB_STATES {
                series.push(format!("ebb_jobs{{tier=\"{tier}\",state=\"{state}\"}}"));
            }
            for state in GPU_STATES {
                series.push(format!("ebb_gpus_allocated{{tier=\"{tier}\",state=\"{state}\"}}"));
            }
        }
        for status in NODE_STATUSES {
            series.push(format!("ebb_nodes{{status=\"{status}\"}}"));
        }
        for s in &series {
            assert_eq!(value(&text, s), Some(0.0), "{s} is not exported at zero:\n{text}");
        }
        for family in ["jobs", "jobs_queued", "gpus_allocated", "nodes", "revenue_usd", "drain_seconds"] {
            assert!(text.contains(&format!("# HELP ebb_{family} ")), "no HELP for {family}");
            assert!(text.contains(&format!("# TYPE ebb_{family} ")), "no TYPE for {family}");
        }
        assert!(text.contains("# TYPE ebb_revenue_usd counter\n# UNIT ebb_revenue_usd usd"), "{text}");
        assert!(
            text.contains("# TYPE ebb_drain_seconds histogram\n# UNIT ebb_drain_seconds seconds"),
            "{text}"
        );
    }

    /// A usage record of `gpus` GPUs at `tier` for `seconds`, drained for
    /// the last `drained_s` of them, promoted `promoted_s` in if it was.
    fn usage(
        tier: &str,
        gpus: u32,
        seconds: u64,
        drained_s: Option<u64>,
        promoted_s: Option<u64>,
    ) -> UsageRow {
        let ms = |s: u64| 1_000_000 + s * 1000;
        crate::billing::meter(crate::billing::Ended {
            job: JobId(1),
            attempt: Attempt(1),
            tenant: TenantId(0),
            tier,
            gpu_model: "H100",
            gpus,
            started_ms: ms(0),
            ended_ms: ms(seconds),
            notice_at_ms: drained_s.map(|d| ms(seconds - d)),
            // $3.60 and $1.80 per GPU-hour: 1,000 and 500 micro-dollars a GPU-second.
            rate: if tier == "preemptible" { 1_800_000 } else { 3_600_000 },
            on_demand_rate: 3_600_000,
            lost_gpu_ms: 0,
            outcome: "completed",
            follows_preemption: false,
            within_min_runtime: false,
            promoted: promoted_s.map(|p| (ms(p), 1_800_000)),
            parts: Vec::new(),
        })
    }

    #[test]
    fn an_ended_attempt_moves_revenue_drain_time_and_drain_gpu_seconds() {
        let mut counters = Counters::default();
        counters.ended(Some(&usage("preemptible", 2, 1_250, Some(2), None)), Some(2_500));
        counters.ended(Some(&usage("on-demand", 1, 3_000, None, None)), None);
        counters.ended(Some(&usage("preemptible", 1, 500, None, None)), None);
        counters.ended(None, None);
        let text = render(&Snapshot { counters, ..Default::default() });
        assert_eq!(value(&text, "ebb_revenue_usd_total{tier=\"preemptible\"}"), Some(1.5));
        assert_eq!(value(&text, "ebb_revenue_usd_total{tier=\"on-demand\"}"), Some(3.0));
        assert_eq!(value(&text, "ebb_revenue_usd_total{tier=\"reserved\"}"), Some(0.0));
        assert_eq!(value(&text, "ebb_drain_gpu_seconds_total"), Some(4.0));
        assert_eq!(value(&text, "ebb_drain_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "ebb_drain_seconds_sum"), Some(2.5));
        assert_eq!(value(&text, "ebb_drain_seconds_bucket{le=\"1.0\"}"), Some(0.0));
        assert_eq!(value(&text, "ebb_drain_seconds_bucket{le=\"5.0\"}"), Some(1.0));
    }

    #[test]
    fn a_promoted_attempts_revenue_is_counted_under_each_segments_tier_as_invoices_count_it() {
        // 2 GPUs for 1,000 s, promoted to on-demand 600 s in: 600 s at the
        // preemptible rate, 400 s at the on-demand rate.
        let promoted = usage("on-demand", 2, 1_000, None, Some(600));
        let mut counters = Counters::default();
        counters.ended(Some(&promoted), None);
        let expected: BTreeMap<&str, i64> =
            [("reserved", 0), ("on-demand", 2 * 400 * 1_000), ("preemptible", 2 * 600 * 500)].into();
        assert_eq!(counters.revenue_micro_usd, expected);
        assert_eq!(counters.revenue_micro_usd.values().sum::<i64>(), promoted.amount);
        // What the operator's report counts for the same record, tier by tier.
        let ledger = crate::billing::Ledger {
            usage: vec![promoted],
            live: Vec::new(),
            reservations: Vec::new(),
            nodes: Vec::new(),
            now: 3_000_000,
            names: Default::default(),
        };
        let report = crate::billing::report(&ledger, 0, 3_000_000);
        for tier in &report.tiers {
            assert_eq!(
                counters.revenue_micro_usd[tier.tier.as_str()],
                tier.revenue_micro_usd,
                "{}",
                tier.tier
            );
        }
        let text = render(&Snapshot { counters, ..Default::default() });
        assert_eq!(value(&text, "ebb_revenue_usd_total{tier=\"preemptible\"}"), Some(0.6));
        assert_eq!(value(&text, "ebb_revenue_usd_total{tier=\"on-demand\"}"), Some(0.8));
    }
}
