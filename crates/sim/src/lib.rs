//! `ebb sim`: replays job traces through Ebb's scheduling core in virtual
//! time.
//!
//! The simulator is an edge of the core like the server is: it owns the
//! clock (virtual), the processes (modelled: useful work, periodic
//! checkpoints, the save on notice, the restart overhead) and the money,
//! and asks `ebb_scheduler::schedule` what to do at every event. The same
//! inputs give byte-identical output.

mod engine;
pub mod report;
mod summary;
pub mod trace;

pub use engine::{run, Progress};
pub use summary::{
    DeadlineFigures, MultiNodeFigures, Percentiles, Series, SimOutput, Summary, TenantFigures, TierFigures,
    Window,
};
pub use trace::{Trace, TraceJob, TraceTenant};

use ebb_core::{MicroUsd, Span};
use ebb_scheduler::{Order, VictimPolicy};

/// What a job gets when it is reclaimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeMode {
    /// The product: notice now, kill at the end of the drain window.
    Drain,
    /// Killed without notice, for comparison.
    None,
}

impl std::str::FromStr for NoticeMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drain" => Ok(NoticeMode::Drain),
            "none" => Ok(NoticeMode::None),
            other => Err(format!("notice: expected drain or none, got {other:?}")),
        }
    }
}

/// What becomes of the jobs given deadlines (`--deadline-slack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlinePolicy {
    /// Submitted on-demand: never preempted, full price.
    OnDemand,
    /// Preemptible throughout, whatever the deadline.
    Preemptible,
    /// Preemptible, promoted to on-demand by the server's rule (a queued
    /// job whose remaining run time and margin no longer fit).
    Promote,
}

impl std::str::FromStr for DeadlinePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on-demand" => Ok(DeadlinePolicy::OnDemand),
            "preemptible" => Ok(DeadlinePolicy::Preemptible),
            "promote" => Ok(DeadlinePolicy::Promote),
            other => {
                Err(format!("deadline policy: expected on-demand, preemptible or promote, got {other:?}"))
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: u32,
    pub gpus_per_node: u8,
    pub gpu_model: String,
    /// Share of jobs from traces without a tier that are preemptible,
    /// chosen deterministically from each job's id.
    pub preemptible_fraction: f64,
    pub drain_window: Span,
    pub notice: NoticeMode,
    /// Periodic checkpoints of preemptible jobs, in attempt progress.
    pub checkpoint_interval: Option<Span>,
    /// Time a job needs to save on notice; `None`: it does not save on
    /// notice and works on until killed.
    pub drain_checkpoint: Option<Span>,
    /// Time a resumed attempt spends before making progress again.
    pub restart_overhead: Span,
    pub victim_policy: VictimPolicy,
    /// A job preempted before is spared as a victim until its new attempt
    /// has run this long, while another victim fits (the server's
    /// `--min-runtime`); zero turns the rule off.
    pub min_runtime: Span,
    pub on_demand_price: MicroUsd,
    /// GPUs reserved for the jobs of `reserved=PATH` traces, billed for the
    /// whole replay at `reserved_price`.
    pub reserved_gpus: u32,
    pub reserved_price: MicroUsd,
    /// Preemptible discount in basis points (5000 = 50%).
    pub preemptible_discount_bps: u32,
    /// Also measure utilisation and revenue from the first submission to
    /// trace time `until` (seconds),
    /// so runs whose backlogs drain at different times compare fairly.
    pub window_until: Option<u64>,
    /// Give the jobs chosen preemptible a deadline at submission + this
    /// many times their duration, handled by `deadline_policy`.
    pub deadline_slack: Option<f64>,
    pub deadline_policy: DeadlinePolicy,
    /// How each tier orders the tenants' jobs: fair share (the product) or
    /// submission time alone, for comparison.
    pub order: Order,
    /// The half-life a tenant's usage decays with (the server's
    /// `--fair-share-half-life`).
    pub fair_share_half_life: Span,
    /// Fair-share preemption's threshold in percent (the server's
    /// `--fair-share-preemption`); off when `None`.
    pub fair_share_preemption: Option<u32>,
    /// Make every multi-node job of the preemptible tier elastic down to
    /// this fraction of its GPUs, rounded up to whole nodes (`--elastic`).
    pub elastic: Option<f64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 16,
            gpus_per_node: 8,
            gpu_model: "H100-80GB".into(),
            preemptible_fraction: 0.0,
            drain_window: Span::from_secs(300),
            notice: NoticeMode::Drain,
            checkpoint_interval: None,
            drain_checkpoint: None,
            restart_overhead: Span::ZERO,
            victim_policy: VictimPolicy::LostWork,
            min_runtime: ebb_scheduler::Config::default().min_runtime,
            on_demand_price: MicroUsd(2_000_000),
            reserved_gpus: 0,
            reserved_price: MicroUsd(1_400_000),
            preemptible_discount_bps: ebb_core::PriceBook::DEFAULT_DISCOUNT_BPS,
            window_until: None,
            deadline_slack: None,
            deadline_policy: DeadlinePolicy::Promote,
            order: Order::FairShare,
            fair_share_half_life: Span::from_secs(24 * 3600),
            fair_share_preemption: None,
            elastic: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{trace} line {line}: {field}: {message}")]
    Trace { trace: String, line: u64, field: String, message: String },
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{0}")]
    Config(String),
}
