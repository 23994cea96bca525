//! What a replay reports: the JSON summary (field names are part of the
//! interface) and the hourly series behind the HTML report.

use serde::Serialize;

/// One figure per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TierFigures<T> {
    pub reserved: T,
    pub on_demand: T,
    pub preemptible: T,
}

impl<T: Copy> TierFigures<T> {
    pub fn from_array([reserved, on_demand, preemptible]: [T; 3]) -> Self {
        TierFigures { reserved, on_demand, preemptible }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// The mean: moves with every value, where a percentile may not.
    pub mean: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles and the mean; zeros for an empty sample.
    pub fn of(mut values: Vec<f64>) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let i = (p * values.len() as f64).ceil() as usize;
            values[i.clamp(1, values.len()) - 1]
        };
        Percentiles {
            p50: round(rank(0.50), 3),
            p99: round(rank(0.99), 3),
            max: round(*values.last().unwrap(), 3),
            mean: round(values.iter().sum::<f64>() / values.len() as f64, 3),
        }
    }
}

/// Rounds for stable, readable output.
pub(crate) fn round(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// The settings a replay ran with, echoed so a JSON file explains itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigEcho {
    pub traces: Vec<String>,
    /// `fair-share` or `fifo`.
    pub order: &'static str,
    pub fair_share_half_life_s: f64,
    /// Fair-share preemption's threshold, percent; absent when off.
    pub fair_share_preemption_percent: Option<u32>,
    pub nodes: u32,
    pub gpus_per_node: u8,
    pub gpu_model: String,
    pub preemptible_fraction: f64,
    pub drain_window_s: f64,
    pub notice: &'static str,
    pub checkpoint_interval_s: Option<f64>,
    pub drain_checkpoint_s: Option<f64>,
    pub restart_overhead_s: f64,
    /// `--elastic`: multi-node preemptible jobs elastic down to this
    /// fraction of their GPUs; absent when off.
    pub elastic: Option<f64>,
    pub victim_policy: String,
    pub min_runtime_s: f64,
    pub on_demand_price_usd_per_gpu_hour: f64,
    pub preemptible_price_usd_per_gpu_hour: f64,
    pub reserved_gpus: u32,
}

/// One tenant's replay (`--tenant`): what it got against its weight.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantFigures {
    pub weight: u32,
    /// Its weight over all tenants' weights.
    pub weight_share: f64,
    /// GPU-hours its attempts ran, every tier.
    pub gpu_hours: f64,
    /// Its GPU-hours over all tenants'.
    pub share: f64,
    /// Submission to first start, seconds.
    pub wait_s: Percentiles,
    /// Drain notices its jobs had that were preemptions.
    pub preemptions: u64,
    pub lost_gpu_hours: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Jobs read from the traces.
    pub jobs: u64,
    pub completed: u64,
    /// Jobs larger than the cluster or of a shape no node fits; not run.
    pub unschedulable: u64,
    /// First submission to last completion.
    pub makespan_s: f64,
    /// GPU-time running attempts / (GPUs x makespan).
    pub gpu_utilization: f64,
    pub utilization_by_tier: TierFigures<f64>,
    /// Drain notices that were preemptions for another job.
    pub preemptions: u64,
    /// Jobs preempted at least once, and more than once.
    pub jobs_preempted: u64,
    pub jobs_preempted_repeatedly: u64,
    /// Preemptions of a job that had been preempted before (every one
    /// after a job's first): the thrash `--min-runtime` is there to curb.
    pub repeat_preemptions: u64,
    /// Those that came less than 10 minutes into the attempt: the job
    /// resumed and was taken again before it could do much. The yardstick
    /// is fixed, so that replays under different `--min-runtime` compare.
    pub quick_repeat_preemptions: u64,
    pub max_preemptions_of_a_job: u32,
    /// Work done since the last checkpoint and thrown away at a kill.
    pub lost_gpu_hours: f64,
    /// GPU-time from notice to exit.
    pub drain_gpu_hours: f64,
    /// GPU-time resumed attempts spent before making progress again.
    pub restart_gpu_hours: f64,
    pub idle_gpu_hours: f64,
    pub busy_gpu_hours: TierFigures<f64>,
    pub on_demand_wait_s: Percentiles,
    pub preemptible_wait_s: Percentiles,
    /// Completion time (submit to finish) over trace duration.
    pub preemptible_slowdown: Percentiles,
    pub revenue_usd: TierFigures<f64>,
    pub revenue_micro_usd: TierFigures<i64>,
    pub jobs_by_tier: TierFigures<u64>,
    pub completed_by_tier: TierFigures<u64>,
    /// Per tenant, by name (`default`: the jobs of `--trace` traces).
    pub tenants: std::collections::BTreeMap<String, TenantFigures>,
    /// Jain's fairness index of GPU-hours over weight across the tenants,
    /// counted over busy hours only (those that began with every tenant's
    /// work waiting): 1 when each got exactly its weight's share, 1/n at
    /// worst. None with one tenant or no busy hour.
    pub jain_index: Option<f64>,
    /// Hours counted as busy for `jain_index`.
    pub busy_hours: u64,
    /// The same figures over a fixed window, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// Preemptible jobs over more than one node, apart: the jobs
    /// `--elastic` makes elastic, and most of a preemptible tier's
    /// GPU-hours.
    pub multi_node: MultiNodeFigures,
    /// The jobs given deadlines, when `--deadline-slack` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadlines: Option<DeadlineFigures>,
    pub config: ConfigEcho,
}

/// Preemptible jobs over more than one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MultiNodeFigures {
    pub jobs: u64,
    pub completed: u64,
    /// Of them, elastic (`--elastic`: their fewest GPUs below their most).
    pub elastic: u64,
    /// Completion time (submit to finish) over trace duration, completed
    /// jobs.
    pub slowdown: Percentiles,
    /// Submission to first start, seconds.
    pub wait_s: Percentiles,
    /// Drain notices of whole jobs that were preemptions.
    pub preemptions: u64,
    /// Their work thrown away, at kills and at shrinks that could not save.
    pub lost_gpu_hours: f64,
    /// Shrinks (notices to some of a job's nodes) and grows.
    pub shrinks: u64,
    pub grows: u64,
}

/// Utilisation and revenue over `[first submission, until_s]` of trace time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    pub until_s: f64,
    pub gpu_utilization: f64,
    pub utilization_by_tier: TierFigures<f64>,
    pub idle_gpu_hours: f64,
    pub revenue_usd: TierFigures<f64>,
}

impl Summary {
    /// The summary as (label, value) lines, for the terminal and the report.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let pct = |x: f64| format!("{:.1}%", x * 100.0);
        let u = &self.utilization_by_tier;
        let (wait, slow, rev) = (&self.on_demand_wait_s, &self.preemptible_slowdown, &self.revenue_usd);
        let mut rows = vec![
            (
                "jobs",
                format!("{} ({} completed, {} unschedulable)", self.jobs, self.completed, self.unschedulable),
            ),
            ("makespan", format!("{:.1} h", self.makespan_s / 3600.0)),
            (
                "GPU utilisation",
                format!(
                    "{} (reserved {}, on-demand {}, preemptible {})",
                    pct(self.gpu_utilization),
                    pct(u.reserved),
                    pct(u.on_demand),
                    pct(u.preemptible)
                ),
            ),
            ("idle", format!("{:.1} GPU-h", self.idle_gpu_hours)),
            (
                "preemptions",
                format!(
                    "{} (lost {:.1} GPU-h, drain {:.1} GPU-h, restart {:.1} GPU-h)",
                    self.preemptions, self.lost_gpu_hours, self.drain_gpu_hours, self.restart_gpu_hours
                ),
            ),
            (
                "repeat preemptions",
                format!(
                    "{} ({} within 10 min of resuming; {} of {} preempted jobs more than once, at most {} times)",
                    self.repeat_preemptions,
                    self.quick_repeat_preemptions,
                    self.jobs_preempted_repeatedly,
                    self.jobs_preempted,
                    self.max_preemptions_of_a_job
                ),
            ),
            (
                "on-demand wait",
                format!("p50 {:.0} s, p99 {:.0} s, max {:.0} s", wait.p50, wait.p99, wait.max),
            ),
            ("preemptible slowdown", format!("p50 {:.2}, p99 {:.2}", slow.p50, slow.p99)),
            (
                "multi-node preemptible",
                format!(
                    "{} jobs ({} elastic): slowdown p50 {:.2}, mean {:.2}; wait p50 {:.0} s; lost {:.1} GPU-h; {} preemptions, {} shrinks, {} grows",
                    self.multi_node.jobs,
                    self.multi_node.elastic,
                    self.multi_node.slowdown.p50,
                    self.multi_node.slowdown.mean,
                    self.multi_node.wait_s.p50,
                    self.multi_node.lost_gpu_hours,
                    self.multi_node.preemptions,
                    self.multi_node.shrinks,
                    self.multi_node.grows
                ),
            ),
            (
                "revenue",
                format!(
                    "on-demand ${:.2}, preemptible ${:.2}, reserved ${:.2}",
                    rev.on_demand, rev.preemptible, rev.reserved
                ),
            ),
        ];
        if let Some(w) = &self.window {
            let (u, rev) = (&w.utilization_by_tier, &w.revenue_usd);
            rows.push((
                "window utilisation",
                format!(
                    "{} (on-demand {}, preemptible {}), idle {:.1} GPU-h, up to trace time {:.1} h",
                    pct(w.gpu_utilization),
                    pct(u.on_demand),
                    pct(u.preemptible),
                    w.idle_gpu_hours,
                    w.until_s / 3600.0
                ),
            ));
            rows.push((
                "window revenue",
                format!(
                    "on-demand ${:.2}, preemptible ${:.2}, reserved ${:.2}",
                    rev.on_demand, rev.preemptible, rev.reserved
                ),
            ));
        }
        rows
    }
}

/// Hour-by-hour figures since the first submission.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Mean GPUs busy during each hour, per tier (reserved, on-demand,
    /// preemptible).
    pub busy_gpus: Vec<[f64; 3]>,
    /// Jobs waiting at the start of each hour, per tier.
    pub queued: Vec<[u32; 3]>,
    pub preemptions: Vec<u32>,
    /// Revenue earned up to the end of each hour, per tier, in dollars.
    pub revenue_usd: Vec<[f64; 3]>,
}

/// The jobs given deadlines (`--deadline-slack`): how many met them,
/// and what they cost their owners.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadlineFigures {
    pub slack: f64,
    pub policy: String,
    pub jobs: u64,
    pub met: u64,
    pub missed: u64,
    pub promoted: u64,
    pub cost_usd: f64,
    pub cost_micro_usd: i64,
    /// The same work at the on-demand price (their GPU-time run once).
    pub on_demand_cost_usd: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SimOutput {
    pub summary: Summary,
    pub series: Series,
    pub capacity_gpus: u32,
}

impl SimOutput {
    /// The `--json` document: pretty-printed, byte-identical for the same
    /// input.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.summary).expect("summary serialises");
        text.push('\n');
        text
    }
}
