//! Replays of the ITP traces (traces/itp): every cluster runs, output is
//! deterministic, the drain window saves work, the lost-work policy loses
//! least; and a small synthetic trace on which `--min-runtime` stops a job
//! being preempted again as soon as it resumes.

use std::path::PathBuf;

use ebb_core::{Span, Tier};
use ebb_scheduler::VictimPolicy;
use ebb_sim::{run, NoticeMode, SimConfig, SimOutput, Summary, Trace, TraceJob};

fn trace_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/itp");
    assert!(dir.is_dir(), "the ITP traces are expected at {}", dir.display());
    dir
}

fn trace(name: &str, tier: Option<Tier>) -> Trace {
    Trace::load(&trace_dir().join(name), tier).unwrap()
}

fn replay(config: &SimConfig, traces: &[Trace]) -> SimOutput {
    run(config, traces, &mut |_| {}).unwrap()
}

/// Half of cluster08's jobs preemptible on a cluster that is often full,
/// hourly periodic checkpoints.
fn contended(notice: NoticeMode, drain_checkpoint: Option<u64>, policy: VictimPolicy) -> Summary {
    let config = SimConfig {
        nodes: 12,
        preemptible_fraction: 0.5,
        checkpoint_interval: Some(Span::from_secs(3600)),
        drain_checkpoint: drain_checkpoint.map(Span::from_secs),
        notice,
        victim_policy: policy,
        ..SimConfig::default()
    };
    replay(&config, &[trace("cluster08.csv", None)]).summary
}

#[test]
fn every_itp_cluster_replays_to_completion() {
    let mut names: Vec<String> = std::fs::read_dir(trace_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".csv"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 8);
    for name in names {
        let config = SimConfig { nodes: 32, preemptible_fraction: 0.3, ..SimConfig::default() };
        let s = replay(&config, &[trace(&name, None)]).summary;
        assert_eq!(s.completed + s.unschedulable, s.jobs, "{name}: every schedulable job completes");
        assert!(s.gpu_utilization > 0.0 && s.gpu_utilization <= 1.0, "{name}: {}", s.gpu_utilization);
        let by_tier = s.utilization_by_tier.on_demand + s.utilization_by_tier.preemptible;
        assert!((by_tier - s.gpu_utilization).abs() < 1e-5, "{name}: tiers add up");
        assert!(s.jobs_by_tier.preemptible > 0 && s.jobs_by_tier.on_demand > 0, "{name}");
    }
}

#[test]
fn same_input_gives_byte_identical_json() {
    let config = SimConfig {
        nodes: 12,
        preemptible_fraction: 0.4,
        checkpoint_interval: Some(Span::from_secs(1800)),
        drain_checkpoint: Some(Span::from_secs(30)),
        victim_policy: VictimPolicy::Random { seed: 7 },
        ..SimConfig::default()
    };
    let traces = [trace("cluster10.csv", None), trace("cluster05.csv", Some(Tier::Preemptible))];
    let first = replay(&config, &traces).to_json();
    let second = replay(&config, &traces).to_json();
    assert_eq!(first, second);
    for field in [
        "\"jobs\"",
        "\"completed\"",
        "\"makespan_s\"",
        "\"gpu_utilization\"",
        "\"utilization_by_tier\"",
        "\"preemptions\"",
        "\"repeat_preemptions\"",
        "\"quick_repeat_preemptions\"",
        "\"jobs_preempted_repeatedly\"",
        "\"lost_gpu_hours\"",
        "\"drain_gpu_hours\"",
        "\"idle_gpu_hours\"",
        "\"on_demand_wait_s\"",
        "\"preemptible_slowdown\"",
        "\"revenue_usd\"",
    ] {
        assert!(first.contains(field), "{field} missing from {first}");
    }
}

#[test]
fn a_save_that_fits_the_drain_window_loses_nothing_and_no_notice_loses_work() {
    let saved = contended(NoticeMode::Drain, Some(60), VictimPolicy::LostWork);
    let killed = contended(NoticeMode::None, None, VictimPolicy::LostWork);
    assert!(saved.preemptions > 100 && killed.preemptions > 100, "the scenario must preempt");
    assert_eq!(saved.lost_gpu_hours, 0.0, "every victim saved within its window");
    assert!(saved.drain_gpu_hours > 0.0, "the saves took time");
    assert!(killed.lost_gpu_hours > 50.0, "without notice work is lost: {}", killed.lost_gpu_hours);
    // A save that does not fit is no better than none.
    let too_slow = contended(NoticeMode::Drain, Some(600), VictimPolicy::LostWork);
    assert!(too_slow.lost_gpu_hours > 50.0, "{}", too_slow.lost_gpu_hours);
}

#[test]
fn lost_work_policy_loses_less_than_youngest_and_random() {
    let lost_work = contended(NoticeMode::None, None, VictimPolicy::LostWork).lost_gpu_hours;
    for other in [VictimPolicy::Youngest, VictimPolicy::Random { seed: 1 }, VictimPolicy::Random { seed: 2 }]
    {
        let theirs = contended(NoticeMode::None, None, other).lost_gpu_hours;
        assert!(lost_work < theirs, "lost-work {lost_work} GPU-h vs {other:?} {theirs} GPU-h");
    }
}

#[test]
fn a_preemptible_backlog_adds_revenue_without_losing_on_demand_work() {
    let base = SimConfig { nodes: 16, drain_checkpoint: Some(Span::from_secs(30)), ..SimConfig::default() };
    let on_demand = trace("cluster08.csv", Some(Tier::OnDemand));
    let alone = replay(&base, std::slice::from_ref(&on_demand)).summary;
    let mut backlog = trace("cluster09.csv", Some(Tier::Preemptible));
    let last_on_demand = on_demand.jobs.iter().map(|j| j.submit_s).max().unwrap();
    backlog.jobs.retain(|j| j.submit_s <= last_on_demand);
    let mixed = replay(&base, &[on_demand, backlog]).summary;
    assert_eq!(alone.revenue_usd.on_demand, mixed.revenue_usd.on_demand, "on-demand work is the same");
    assert!(mixed.revenue_usd.preemptible > 0.0);
    assert!(mixed.gpu_utilization > alone.gpu_utilization);
    assert_eq!(mixed.busy_gpu_hours.on_demand, alone.busy_gpu_hours.on_demand);
}

#[test]
fn reserved_traces_draw_on_their_reservation() {
    let config = SimConfig { nodes: 4, reserved_gpus: 8, ..SimConfig::default() };
    let s = replay(
        &config,
        &[trace("cluster10.csv", Some(Tier::Reserved)), trace("cluster05.csv", Some(Tier::Preemptible))],
    )
    .summary;
    assert_eq!(s.completed + s.unschedulable, s.jobs);
    assert!(s.utilization_by_tier.reserved > 0.0);
    assert!(s.revenue_usd.reserved > 0.0);
    // Jobs larger than the reservation can never run as reserved.
    assert!(s.unschedulable > 0);
}

#[test]
fn bad_configuration_is_refused_with_the_flag_named() {
    let t = [trace("cluster10.csv", None)];
    let err = |config: SimConfig| run(&config, &t, &mut |_| {}).unwrap_err().to_string();
    assert!(err(SimConfig { nodes: 0, ..SimConfig::default() }).contains("--nodes"));
    assert!(err(SimConfig { preemptible_fraction: 1.5, ..SimConfig::default() })
        .contains("--preemptible-fraction"));
    let reserved = [trace("cluster10.csv", Some(Tier::Reserved))];
    let e = run(&SimConfig::default(), &reserved, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("--reserved-gpus"), "{e}");
}

#[test]
fn each_preemption_costs_the_restart_overhead() {
    let config = |overhead| SimConfig {
        nodes: 12,
        preemptible_fraction: 0.5,
        checkpoint_interval: Some(Span::from_secs(3600)),
        drain_checkpoint: Some(Span::from_secs(60)),
        restart_overhead: Span::from_secs(overhead),
        ..SimConfig::default()
    };
    let t = [trace("cluster08.csv", None)];
    let free = replay(&config(0), &t).summary;
    let costly = replay(&config(600), &t).summary;
    assert_eq!(free.restart_gpu_hours, 0.0);
    assert!(costly.preemptions > 100);
    // At least one GPU for ten minutes per resumed attempt that ran that long.
    assert!(
        costly.restart_gpu_hours > costly.preemptions as f64 * 0.5 * 600.0 / 3600.0,
        "{}",
        costly.restart_gpu_hours
    );
}

/// Two long preemptible jobs fill two 4-GPU nodes; every 15 minutes an
/// on-demand job needs one node for 10 minutes. A victim saves in 60 s and
/// resumes when the on-demand job ends, 4 minutes before the next arrives.
fn thrash(min_runtime: Span) -> Summary {
    let job = |id: &str, submit_s, duration_s| TraceJob { id: id.into(), submit_s, duration_s, gpus: 4 };
    let preemptible = Trace {
        name: "preemptible".into(),
        tier: Some(Tier::Preemptible),
        tenant: None,
        jobs: vec![job("a", 0, 100_000), job("b", 0, 100_000)],
    };
    let on_demand = Trace {
        name: "on-demand".into(),
        tier: Some(Tier::OnDemand),
        tenant: None,
        jobs: (0..6).map(|k| job(&format!("od{k}"), 1_000 + 900 * k, 600)).collect(),
    };
    let config = SimConfig {
        nodes: 2,
        gpus_per_node: 4,
        drain_checkpoint: Some(Span::from_secs(60)),
        min_runtime,
        ..SimConfig::default()
    };
    replay(&config, &[preemptible, on_demand]).summary
}

#[test]
fn min_runtime_stops_a_resumed_job_being_preempted_again_at_once() {
    let off = thrash(Span::ZERO);
    let on = thrash(Span::from_secs(300));
    // Without the rule the job that has just resumed is always the
    // cheapest victim: one job takes every preemption, each within minutes
    // of resuming.
    assert_eq!(off.preemptions, 6);
    assert_eq!((off.jobs_preempted, off.max_preemptions_of_a_job), (1, 6));
    assert_eq!((off.repeat_preemptions, off.quick_repeat_preemptions), (5, 5));
    // With it the two jobs take turns, each running 19 minutes between
    // preemptions.
    assert_eq!(on.preemptions, 6);
    assert_eq!((on.jobs_preempted, on.max_preemptions_of_a_job), (2, 3));
    assert_eq!((on.repeat_preemptions, on.quick_repeat_preemptions), (4, 0));
    // On-demand jobs wait for the victim's save alike, and no work is lost.
    assert_eq!(on.on_demand_wait_s, off.on_demand_wait_s);
    assert_eq!(on.on_demand_wait_s.max, 60.0);
    assert_eq!((on.lost_gpu_hours, off.lost_gpu_hours), (0.0, 0.0));
}

/// One preemptible job of an hour with a deadline at 1.5 times that, on a
/// node that on-demand work of 5 minutes takes every 15 minutes.
fn deadline_run(policy: ebb_sim::DeadlinePolicy) -> ebb_sim::DeadlineFigures {
    let job = |id: &str, submit_s, duration_s| TraceJob { id: id.into(), submit_s, duration_s, gpus: 4 };
    let preemptible =
        Trace { name: "preemptible".into(), tier: None, tenant: None, jobs: vec![job("a", 0, 3_600)] };
    let on_demand = Trace {
        name: "on-demand".into(),
        tier: Some(Tier::OnDemand),
        tenant: None,
        jobs: (0..6).map(|k| job(&format!("od{k}"), 600 + 900 * k, 300)).collect(),
    };
    let config = SimConfig {
        nodes: 1,
        gpus_per_node: 4,
        preemptible_fraction: 1.0,
        drain_checkpoint: Some(Span::from_secs(60)),
        deadline_slack: Some(1.5),
        deadline_policy: policy,
        ..SimConfig::default()
    };
    replay(&config, &[preemptible, on_demand]).summary.deadlines.unwrap()
}

#[test]
fn promotion_meets_a_deadline_that_preemptions_would_miss_for_less_than_on_demand() {
    use ebb_sim::DeadlinePolicy::*;
    let (on_demand, preemptible, promote) =
        (deadline_run(OnDemand), deadline_run(Preemptible), deadline_run(Promote));
    // Preempted by every burst, it loses 6 minutes to each and is late.
    assert_eq!((preemptible.jobs, preemptible.met, preemptible.promoted), (1, 0, 0));
    // Promoted once the rest and the margin no longer fit, it is no victim
    // from then on and finishes in time.
    assert_eq!((promote.met, promote.promoted), (1, 1));
    assert_eq!((on_demand.met, on_demand.promoted), (1, 0));
    assert!(preemptible.cost_micro_usd < promote.cost_micro_usd, "{preemptible:?} {promote:?}");
    assert!(promote.cost_micro_usd < on_demand.cost_micro_usd, "{promote:?} {on_demand:?}");
    assert_eq!(on_demand.cost_usd, on_demand.on_demand_cost_usd);
}

/// One preemptible job of 24 GPUs and an hour on three 8-GPU nodes; an
/// on-demand job takes one node from 1000 s for 1000 s. A save on notice
/// takes 30 s, a restart 60 s.
fn elastic_run(elastic: Option<f64>) -> Summary {
    let job = |id: &str, submit_s, duration_s, gpus| TraceJob { id: id.into(), submit_s, duration_s, gpus };
    let preemptible = Trace {
        name: "preemptible".into(),
        tier: Some(Tier::Preemptible),
        tenant: None,
        jobs: vec![job("train", 0, 3_600, 24)],
    };
    let on_demand = Trace {
        name: "on-demand".into(),
        tier: Some(Tier::OnDemand),
        tenant: None,
        jobs: vec![job("od", 1_000, 1_000, 8)],
    };
    let config = SimConfig {
        nodes: 3,
        drain_checkpoint: Some(Span::from_secs(30)),
        restart_overhead: Span::from_secs(60),
        elastic,
        ..SimConfig::default()
    };
    replay(&config, &[preemptible, on_demand]).summary
}

#[test]
fn an_elastic_job_gives_up_a_node_and_grows_back_instead_of_waiting() {
    let rigid = elastic_run(None);
    let elastic = elastic_run(Some(0.3));
    // Rigid: stopped at 1000 s (saved at 1030), waits for the on-demand
    // job, restarts at 2030 with 60 s of overhead and the 2600 s left.
    assert_eq!((rigid.multi_node.preemptions, rigid.multi_node.shrinks), (1, 0));
    let rigid_done = 2_030.0 + 60.0 + 2_600.0;
    assert!(
        (rigid.multi_node.slowdown.max - rigid_done / 3_600.0).abs() < 1e-3,
        "{}",
        rigid.multi_node.slowdown.max
    );
    // Elastic down to one node: at 1000 s it saves (30 s) and goes on
    // on 16 GPUs from 1030 (after 60 s of restart) at 2/3 of the pace;
    // at 2030 the node is free, it saves and grows back, restarts (60 s)
    // and does the rest at full pace.
    let m = &elastic.multi_node;
    assert_eq!((m.jobs, m.elastic, m.preemptions, m.shrinks, m.grows), (1, 1, 0, 1, 1));
    let at_grow = 1_000.0 + (2_030.0 - 1_090.0) * 16.0 / 24.0;
    let done = 2_030.0 + 60.0 + (3_600.0 - at_grow);
    assert!((m.slowdown.max - done / 3_600.0).abs() < 1e-3, "{} vs {}", m.slowdown.max, done / 3_600.0);
    assert!(m.slowdown.max < rigid.multi_node.slowdown.max);
    // Every GPU-second metered: 24 GPUs to the notice and the save, 16 for
    // the on-demand job's 1000 s (the freed node went to it), 24 after.
    let busy_preemptible = elastic.busy_gpu_hours.preemptible * 3_600.0;
    let expected = 24.0 * 1_030.0 + 16.0 * 1_000.0 + 24.0 * (done - 2_030.0);
    assert!((busy_preemptible - expected).abs() < 4.0, "{busy_preemptible} vs {expected}");
    assert_eq!((elastic.lost_gpu_hours, rigid.lost_gpu_hours), (0.0, 0.0));
    assert!(elastic.gpu_utilization >= rigid.gpu_utilization);
}

#[test]
fn elastic_multi_node_jobs_finish_sooner_on_an_itp_pair() {
    let config = |elastic| SimConfig {
        nodes: 24,
        checkpoint_interval: Some(Span::from_secs(3_600)),
        drain_checkpoint: Some(Span::from_secs(60)),
        restart_overhead: Span::from_secs(60),
        elastic,
        ..SimConfig::default()
    };
    let traces =
        [trace("cluster02.csv", Some(Tier::Preemptible)), trace("cluster08.csv", Some(Tier::OnDemand))];
    let rigid = replay(&config(None), &traces).summary;
    let elastic = replay(&config(Some(0.5)), &traces).summary;
    assert_eq!(rigid.multi_node.elastic, 0);
    assert_eq!(elastic.multi_node.elastic, elastic.multi_node.jobs);
    assert!(elastic.multi_node.shrinks > 0 && elastic.multi_node.grows > 0);
    assert!(elastic.multi_node.slowdown.mean < rigid.multi_node.slowdown.mean);
    assert!(elastic.gpu_utilization >= rigid.gpu_utilization);
    assert!(elastic.lost_gpu_hours <= rigid.lost_gpu_hours);
    assert_eq!(elastic.completed + elastic.unschedulable, elastic.jobs);
}

#[test]
fn elastic_is_refused_out_of_range_and_with_deadlines() {
    let traces = [trace("cluster10.csv", None)];
    for (fraction, slack, words) in [
        (0.0, None, "--elastic must be above 0 and at most 1, got 0"),
        (1.5, None, "--elastic must be above 0 and at most 1, got 1.5"),
        (f64::NAN, None, "--elastic must be above 0"),
        (0.5, Some(2.0), "--elastic and --deadline-slack"),
    ] {
        let config = SimConfig { elastic: Some(fraction), deadline_slack: slack, ..SimConfig::default() };
        let err = run(&config, &traces, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains(words), "{err}");
    }
}
