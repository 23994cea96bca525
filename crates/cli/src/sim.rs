//! `ebb sim`: flags in, summary out (terminal, `--json`, `--report`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{given, usage, CliError};
use clap::Args;
use ebb_core::{MicroUsd, Span};
use ebb_scheduler::VictimPolicy;
use ebb_sim::{NoticeMode, SimConfig, SimOutput, Trace};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct SimArgs {
    /// Trace file (ITP format: job_id,submission_time,duration,num_gpu).
    /// Repeatable; TIER=PATH puts all of a trace's jobs in one tier
    /// (preemptible, also spot; on-demand, also ondemand; or reserved).
    #[arg(long = "trace", value_name = "[TIER=]PATH", required_unless_present = "tenants")]
    traces: Vec<String>,
    /// A trace replayed as the jobs of one tenant, with its fair-share
    /// weight (default 1) and, if given, the tier of all its jobs
    /// (on-demand or preemptible; else --preemptible-fraction decides).
    /// Repeatable: one tenant per trace.
    #[arg(long = "tenant", value_name = "NAME=PATH[:WEIGHT[:TIER]]")]
    tenants: Vec<String>,
    /// How each tier orders the tenants' jobs: fair-share (the product) or
    /// fifo (submission time alone, for comparison).
    #[arg(long, default_value = "fair-share")]
    order: ebb_scheduler::Order,
    /// The half-life a tenant's usage decays with, as the server's.
    #[arg(long, default_value = "24h", value_parser = parse_span)]
    fair_share_half_life: Span,
    /// Fair-share preemption, as the server's: drain the tenant furthest
    /// above its share when its usage over weight exceeds the waiting
    /// tenant's by more than PERCENT (default 20).
    #[arg(long, value_name = "PERCENT", num_args = 0..=1, default_missing_value = "20")]
    fair_share_preemption: Option<u32>,
    /// Nodes in the simulated cluster.
    #[arg(long, default_value_t = 16)]
    nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u8,
    /// GPU model of every node.
    #[arg(long, default_value = "H100-80GB")]
    gpu_model: String,
    /// Share (0-1) of jobs from untagged traces made preemptible, chosen
    /// deterministically from each job's id.
    #[arg(long, default_value_t = 0.0)]
    preemptible_fraction: f64,
    /// Notice to forced kill, e.g. 300, 300s, 5m.
    #[arg(long, default_value = "300", value_parser = parse_span)]
    drain_window: Span,
    /// `drain`: notice, then kill at the deadline; `none`: kill at once.
    #[arg(long, default_value = "drain")]
    notice: NoticeMode,
    /// Preemptible jobs checkpoint every this much progress.
    #[arg(long, value_parser = parse_span)]
    checkpoint_interval: Option<Span>,
    /// Time a job needs to save on notice (unset: it does not save on
    /// notice and is killed at the deadline).
    #[arg(long, value_parser = parse_span)]
    drain_checkpoint: Option<Span>,
    /// Time a resumed job spends before making progress.
    #[arg(long, default_value = "0", value_parser = parse_span)]
    restart_overhead: Span,
    /// Make every multi-node job of the preemptible tier elastic down to
    /// FRACTION (0-1) of its GPUs, rounded up to whole nodes: it starts
    /// with that many, grows into what no queued job wants, and is shrunk
    /// a node at a time rather than stopped. Its work advances with the
    /// GPUs it holds; each change of its nodes costs --restart-overhead.
    #[arg(long, value_name = "FRACTION")]
    elastic: Option<f64>,
    /// lost-work, youngest, oldest, fewest-gpus or random:SEED.
    #[arg(long, default_value = "lost-work")]
    victim_policy: VictimPolicy,
    /// A job preempted before is not chosen as a victim again until its
    /// new attempt has run this long, while another victim fits (as the
    /// server's --min-runtime); 0 turns the rule off.
    #[arg(long, default_value = "5m", value_parser = parse_span)]
    min_runtime: Span,
    /// On-demand price, USD per GPU-hour; preemptible is half.
    #[arg(long, default_value = "2.00", value_parser = parse_usd)]
    on_demand_price: MicroUsd,
    /// GPUs reserved for the jobs of reserved=PATH traces.
    #[arg(long, default_value_t = 0)]
    reserved_gpus: u32,
    /// Reserved contract rate, USD per GPU-hour, billed for the whole replay.
    #[arg(long, default_value = "1.40", value_parser = parse_usd)]
    reserved_price: MicroUsd,
    /// Ignore trace jobs submitted after this many seconds of trace time,
    /// and also report utilisation and revenue from the first submission
    /// to SECONDS, so runs
    /// with different backlogs compare over the same window.
    #[arg(long, value_name = "SECONDS")]
    until: Option<u64>,
    /// Give the preemptible jobs a deadline at submission + SLACK x their
    /// duration, and report how many met it and what they cost.
    #[arg(long, value_name = "SLACK")]
    deadline_slack: Option<f64>,
    /// What the jobs with deadlines run as: promote (preemptible, moved to
    /// on-demand by the server's rule once the rest would not fit),
    /// preemptible (throughout) or on-demand (throughout).
    #[arg(long, default_value = "promote", value_name = "POLICY")]
    deadline_policy: ebb_sim::DeadlinePolicy,
    /// Write the summary as JSON to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report with charts to FILE.
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
}

fn parse_span(text: &str) -> Result<Span, CliError> {
    Span::parse(text).map_err(usage)
}

fn parse_usd(text: &str) -> Result<MicroUsd, CliError> {
    MicroUsd::parse_usd(text).map_err(usage)
}

pub fn run(args: SimArgs) -> Result<(), CliError> {
    let mut traces = args
        .traces
        .iter()
        .map(|arg| Trace::load_arg(arg))
        .chain(args.tenants.iter().map(|arg| Trace::load_tenant_arg(arg)))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(until) = args.until {
        for trace in &mut traces {
            trace.jobs.retain(|job| job.submit_s <= until);
        }
    }
    let config = SimConfig {
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        gpu_model: args.gpu_model,
        preemptible_fraction: args.preemptible_fraction,
        drain_window: args.drain_window,
        notice: args.notice,
        checkpoint_interval: args.checkpoint_interval,
        drain_checkpoint: args.drain_checkpoint,
        restart_overhead: args.restart_overhead,
        victim_policy: args.victim_policy,
        min_runtime: args.min_runtime,
        on_demand_price: args.on_demand_price,
        reserved_gpus: args.reserved_gpus,
        reserved_price: args.reserved_price,
        preemptible_discount_bps: ebb_core::PriceBook::DEFAULT_DISCOUNT_BPS,
        window_until: args.until,
        deadline_slack: args.deadline_slack,
        deadline_policy: args.deadline_policy,
        order: args.order,
        fair_share_half_life: args.fair_share_half_life,
        fair_share_preemption: args.fair_share_preemption,
        elastic: args.elastic,
    };
    // A bar only on a terminal; scripts and CI get quiet stderr.
    let bar = if std::io::stderr().is_terminal() {
        let total = traces.iter().map(|t| t.jobs.len() as u64).sum();
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{spinner} replaying [{bar:40}] {pos}/{len} jobs arrived ({eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        Some(bar)
    } else {
        None
    };
    let started = Instant::now();
    let output = ebb_sim::run(&config, &traces, &mut |p| {
        if let Some(bar) = &bar {
            bar.set_length(p.total);
            bar.set_position(p.arrived);
        }
    })?;
    let elapsed = started.elapsed();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let mut stdout = String::new();
    // Which files were written, said after the summary (on standard error
    // when standard output carries the JSON).
    let mut wrote = String::new();
    if let Some(path) = &args.json {
        let json = output.to_json();
        if path.as_os_str() == "-" {
            stdout.push_str(&json);
        } else {
            std::fs::write(path, json).map_err(given("--json", path))?;
            wrote.push_str(&format!("wrote the summary (JSON) to {}\n", path.display()));
        }
    }
    if let Some(path) = &args.report {
        std::fs::write(path, ebb_sim::report::html(&output)).map_err(given("--report", path))?;
        wrote.push_str(&format!("wrote the report (HTML) to {}\n", path.display()));
    }
    if args.json.as_deref().is_none_or(|p| p.as_os_str() != "-") {
        stdout.push_str(&summary_text(&output, elapsed.as_secs_f64()));
        stdout.push_str(&wrote);
    } else {
        eprint!("{wrote}");
    }
    crate::write_stdout(&stdout)
}

fn summary_text(output: &SimOutput, wall_s: f64) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    let s = &output.summary;
    let c = &s.config;
    writeln!(
        text,
        "replayed on {} nodes x {} {} GPUs in {:.2} s",
        c.nodes, c.gpus_per_node, c.gpu_model, wall_s
    )
    .unwrap();
    for (name, value) in s.rows() {
        writeln!(text, "  {name:<24}{value}").unwrap();
    }
    if s.tenants.len() > 1 {
        writeln!(
            text,
            "  {:<12}{:>7}{:>9}{:>12}{:>8}{:>12}{:>12}{:>11}{:>12}",
            "tenant",
            "weight",
            "of all",
            "GPU-hours",
            "share",
            "wait p50",
            "wait p99",
            "preempted",
            "lost GPU-h"
        )
        .unwrap();
        for (name, t) in &s.tenants {
            writeln!(
                text,
                "  {:<12}{:>7}{:>8.1}%{:>12.1}{:>7.1}%{:>12}{:>12}{:>11}{:>12.2}",
                name,
                t.weight,
                t.weight_share * 100.0,
                t.gpu_hours,
                t.share * 100.0,
                Span::from_secs_f64(t.wait_s.p50).human(),
                Span::from_secs_f64(t.wait_s.p99).human(),
                t.preemptions,
                t.lost_gpu_hours
            )
            .unwrap();
        }
        match s.jain_index {
            Some(j) => writeln!(
                text,
                "  Jain's index of GPU-hours / weight over {} busy hours: {j:.4}",
                s.busy_hours
            ),
            None => writeln!(text, "  Jain's index: no hour began with every tenant's work waiting"),
        }
        .unwrap();
    }
    if let Some(d) = &s.deadlines {
        writeln!(
            text,
            "  deadlines ({} x slack, {}): {} jobs, {} met, {} missed, {} promoted; cost ${:.2} (${:.2} at on-demand)",
            d.slack, d.policy, d.jobs, d.met, d.missed, d.promoted, d.cost_usd, d.on_demand_cost_usd
        )
        .unwrap();
    }
    text
}
