//! What the writer counts as it goes equals a recount from the store,
//! through any sequence of steps; idle heartbeats; finished jobs out of
//! memory still listed, shown, logged and counted; a deadline promotion
//! billed at both rates.

use ebb_core::{JobId, TenantId};
use std::collections::BTreeMap;

use ebb_api::{Action, AgentEvent, AttemptRef, EventKind, JobSubmission};
use ebb_server::engine::Msg;
use ebb_server::store::{Scope, SqliteStore};
use ebb_server::Principal;
use tokio::sync::oneshot;

use crate::harness::*;

/// One step of a random run.
#[derive(Clone, Debug)]
enum Step {
    /// `always`: `--restart always`, which quick exits put in back-off.
    Submit {
        tier: usize,
        gpus: u32,
        always: bool,
    },
    /// The tenant's `max_running_jobs`, or none.
    Limit {
        running: Option<u64>,
    },
    /// Node `node` polls and reports every attempt it is told to start as started.
    Poll {
        node: usize,
    },
    /// The `k`-th running attempt (mod their count) exits with `code`.
    Exit {
        k: usize,
        code: i32,
    },
    Cancel {
        k: usize,
    },
    Drain {
        node: usize,
    },
    /// A fire drill of the `k`-th job (mod their count), refused unless
    /// it is a running preemptible one.
    Drill {
        k: usize,
    },
    Later {
        ms: u64,
    },
    Restart,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..3usize, 1..=8u32, proptest::bool::weighted(0.3))
            .prop_map(|(tier, gpus, always)| Step::Submit { tier, gpus, always }),
        1 => proptest::option::of(1..4u64).prop_map(|running| Step::Limit { running }),
        4 => (0..2usize).prop_map(|node| Step::Poll { node }),
        3 => (0..16usize, 0..2i32).prop_map(|(k, code)| Step::Exit { k, code }),
        1 => (0..16usize).prop_map(|k| Step::Cancel { k }),
        1 => (0..2usize).prop_map(|node| Step::Drain { node }),
        1 => (0..16usize).prop_map(|k| Step::Drill { k }),
        2 => (100..5_000u64).prop_map(|ms| Step::Later { ms }),
        1 => Just(Step::Restart),
    ]
}

/// `/metrics`' jobs, GPUs and queue as a walk over every job gives them.
fn recount(env: &mut TestEnv<SqliteStore>) -> ebb_server::metrics::Snapshot {
    let principal = env.admin.clone();
    let page = env
        .call(|reply| Msg::Jobs {
            principal,
            query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100_000, ..Default::default() },
            reply,
        })
        .unwrap();
    let name = |s: &str| -> &'static str {
        ebb_server::metrics::JOB_STATES
            .iter()
            .chain(ebb_server::metrics::TIERS.iter())
            .find(|n| **n == s)
            .copied()
            .unwrap_or_else(|| panic!("unknown name {s}"))
    };
    let mut counted = ebb_server::metrics::Snapshot::default();
    for job in page.jobs {
        let (tier, state) = (name(&job.tier), name(&job.state));
        *counted.jobs.entry((tier, state)).or_insert(0) += 1;
        let gpu_state = match state {
            "starting" | "running" => "running",
            "draining" => "draining",
            "queued" => {
                let reason = job.pending_reason.unwrap_or(ebb_api::PendingReason::Scheduling);
                *counted.queued.entry(ebb_server::metrics::QueueKey { tier, reason }).or_insert(0) += 1;
                continue;
            }
            _ => continue,
        };
        *counted.gpus.entry((tier, gpu_state)).or_insert(0) += u64::from(job.gpus);
    }
    counted
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// The tallies `/metrics` keeps as jobs change agree with a walk over
    /// every job after any run, a restart included.
    #[test]
    fn metrics_agree_with_a_recount_after_a_random_run(steps in proptest::collection::vec(step(), 1..60)) {
        let mut env = TestEnv::new("metrics-recount");
        let nodes = ["a", "b"];
        for node in nodes {
            env.register(node, Vec::new(), Vec::new());
        }
        let mut running: Vec<(String, AttemptRef)> = Vec::new();
        for step in steps {
            match step {
                Step::Submit { tier, gpus, always } => {
                    let tier = ["reserved", "on-demand", "preemptible"][tier];
                    let (reply, _rx) = oneshot::channel();
                    let spec = JobSubmission {
                        gpus: Some(gpus),
                        tier: Some(tier.into()),
                        argv: vec!["work".into()],
                        restart: always.then(|| "always".into()),
                        ..Default::default()
                    };
                    let now = env.now;
                    let principal = env.admin.clone();
                    env.engine().batch(vec![Msg::Submit { principal, spec: Box::new(spec), reply }], now).unwrap();
                }
                Step::Limit { running } => {
                    let principal = env.admin.clone();
                    let set = ebb_api::TenantLimits { max_running_jobs: running, ..Default::default() };
                    let tenant = "default".into();
                    env.call(|reply| Msg::TenantLimits { principal, tenant, set: Some(set), reply }).unwrap();
                }
                Step::Poll { node } => {
                    let node = nodes[node];
                    for action in env.commands(node) {
                        let at_ms = env.now;
                        match action {
                            Action::Start(s) => {
                                env.report(node, vec![AgentEvent::Started { attempt: s.attempt, pid: 4242, at_ms }]);
                                running.push((node.to_string(), s.attempt));
                            }
                            // A stop (a cancel) ends the attempt; a drained one
                            // runs on until a later step ends it.
                            Action::Stop { attempt, .. } => {
                                if running.iter().any(|(_, a)| *a == attempt) {
                                    env.report(node, vec![exited(attempt, 143, at_ms)]);
                                    running.retain(|(_, a)| *a != attempt);
                                }
                            }
                            Action::Drain(_) | Action::Signal { .. } | Action::Members(_) => {}
                        }
                    }
                }
                Step::Exit { k, code } => {
                    if !running.is_empty() {
                        let (node, attempt) = running.remove(k % running.len());
                        let at_ms = env.now;
                        env.report(&node, vec![exited(attempt, code, at_ms)]);
                    }
                }
                Step::Cancel { k } => {
                    let jobs = env.jobs();
                    if !jobs.is_empty() {
                        let _ = env.cancel(jobs[k % jobs.len()], None);
                    }
                }
                Step::Drain { node } => {
                    let name = nodes[node].to_string();
                    let _ = env.call(|reply| Msg::DrainNode { name, reply });
                }
                Step::Drill { k } => {
                    let jobs = env.jobs();
                    if !jobs.is_empty() {
                        let _ = env.drill(jobs[k % jobs.len()]);
                    }
                }
                Step::Later { ms } => {
                    env.now += ms;
                    let now = env.now;
                    env.engine().batch(vec![Msg::Tick], now).unwrap();
                }
                Step::Restart => {
                    env.restart();
                    for node in nodes {
                        let mine: Vec<AttemptRef> =
                            running.iter().filter(|(n, _)| n == node).map(|(_, a)| *a).collect();
                        env.register(node, mine, Vec::new());
                    }
                }
            }
            let kept = env.call(|reply| Msg::Metrics { reply });
            let counted = recount(&mut env);
            proptest::prop_assert_eq!(&kept.jobs.into_iter().filter(|(_, n)| *n > 0).collect::<BTreeMap<_, _>>(), &counted.jobs);
            proptest::prop_assert_eq!(&kept.gpus.into_iter().filter(|(k, n)| *n > 0 && k.1 != "held").collect::<BTreeMap<_, _>>(), &counted.gpus);
            proptest::prop_assert_eq!(&kept.queued, &counted.queued);
        }
    }
}

/// An idle node's heartbeat is not a write each time: its contact is
/// written again only after 5 minutes; a node that runs an attempt has
/// its latest contact written at every tick, so that work lost with it is
/// metered to (a tick before) the last one, and a poll is no write of its
/// own.
#[test]
fn an_idle_nodes_heartbeats_write_its_contact_only_now_and_then() {
    let mut env = TestEnv::new("idle-heartbeats");
    env.register("a", Vec::new(), Vec::new());
    env.fail("heard", 1);
    env.now += 200_000;
    env.commands("a"); // idle, 200 s after the last write: nothing written
    env.now += 100_001;
    let (agent_epoch, after) = (env.agents["a"].epoch, env.agents["a"].after);
    let (reply, _rx) = oneshot::channel();
    let poll = Msg::Poll { node: "a".into(), epoch: agent_epoch, after, health: None, reply };
    let now = env.now;
    assert!(env.engine().batch(vec![poll], now).is_err(), "5 minutes on, the contact is written (and fails)");
    env.restart();
    env.register("a", Vec::new(), Vec::new());
    env.running("a");
    env.fail("heard", 1);
    env.now += 100;
    let (reply, _rx) = oneshot::channel();
    let (agent_epoch, after) = (env.agents["a"].epoch, env.agents["a"].after);
    let poll = Msg::Poll { node: "a".into(), epoch: agent_epoch, after, health: None, reply };
    let now = env.now;
    env.engine().batch(vec![poll], now).expect("a busy node's poll writes nothing");
    env.now += 100;
    let now = env.now;
    assert!(env.engine().batch(vec![Msg::Tick], now).is_err(), "the tick writes the busy node's contact");
    env.restart();
    env.register("a", Vec::new(), Vec::new());
    env.running("a");
    env.tick();
    env.fail("heard", 1);
    let now = env.now;
    env.engine().batch(vec![Msg::Tick], now).expect("no contact since the last tick: nothing to write");
}

/// Every page of the listing, `limit` at a time, with `between` run
/// after each page: the ids listed, in order.
fn all_pages(
    env: &mut TestEnv<SqliteStore>,
    query: ebb_server::engine::JobQuery,
    mut between: impl FnMut(&mut TestEnv<SqliteStore>),
) -> Vec<ebb_api::Job> {
    let mut all = Vec::new();
    let mut query = query;
    loop {
        let principal = env.admin.clone();
        let q = query.clone();
        let page = env.call(|reply| Msg::Jobs { principal, query: q, reply }).unwrap();
        all.extend(page.jobs);
        between(env);
        match page.next_cursor {
            Some(next) => query.cursor = Some(next),
            None => return all,
        }
    }
}

/// What a user sees of a finished job (here, with `keep_finished` 0, out
/// of the writer's memory as soon as its batch ends): show with events,
/// usage and its array's progress, its log, the listing, `/metrics`, a
/// refused cancel and drill, another tenant's 404; and all of it again
/// after a restart, which loads only the unfinished jobs.
#[test]
fn a_finished_job_out_of_memory_is_still_listed_shown_logged_and_counted() {
    let mut env = TestEnv::new("pruned");
    env.register("a", Vec::new(), Vec::new());
    let single = env.running("a");
    let (reply, mut rx) = oneshot::channel();
    let spec = JobSubmission {
        gpus: Some(1),
        argv: vec!["work".into()],
        array: Some("0-2".into()),
        name: Some("sweep".into()),
        ..Default::default()
    };
    let principal = env.admin.clone();
    let now = env.now;
    env.engine().batch(vec![Msg::Submit { principal, spec: Box::new(spec), reply }], now).unwrap();
    let tasks = rx.try_recv().unwrap().unwrap();
    assert_eq!(tasks.len(), 3);
    let started: Vec<AttemptRef> = env.poll("a").into_iter().filter(|a| tasks.contains(&a.job)).collect();
    assert_eq!(started.len(), 3);
    let at_ms = env.now;
    let starts = started.iter().map(|&attempt| AgentEvent::Started { attempt, pid: 1, at_ms }).collect();
    env.report("a", starts);

    // The single job and the first task succeed, the second is cancelled,
    // the third runs on; the listing is read a page at a time while they end.
    let mut step = 0;
    let ending = |env: &mut TestEnv<SqliteStore>| {
        step += 1;
        env.now += 1_000;
        let at_ms = env.now;
        match step {
            1 => env.report(
                "a",
                vec![
                    AgentEvent::Output { attempt: single, data: "hello\n".into() },
                    exited(single, 0, at_ms),
                ],
            ),
            2 => env.report("a", vec![exited(started[0], 0, at_ms)]),
            3 => {
                env.cancel(JobId(started[1].job.0), None).unwrap();
                env.report("a", vec![exited(started[1], 143, at_ms)]);
            }
            _ => {}
        }
    };
    let query = ebb_server::engine::JobQuery { cursor: Some(0), limit: 1, ..Default::default() };
    let listed: Vec<JobId> = all_pages(&mut env, query, ending).iter().map(|j| JobId(j.id)).collect();
    assert_eq!(listed, vec![single.job, tasks[0], tasks[1], tasks[2]], "each job exactly once");

    for life in ["before a restart", "after a restart"] {
        let shown = env.job(JobId(single.job.0)).unwrap();
        assert_eq!(shown.state, "succeeded", "{life}");
        assert!(shown.events.iter().any(|e| e.kind() == EventKind::Exited), "{life}");
        assert_eq!(shown.usage.len(), 1, "{life}: its usage");
        let principal = env.admin.clone();
        let log = env
            .call(|reply| Msg::LogFile { principal, id: single.job, offset: 0, sources: false, reply })
            .unwrap();
        assert_eq!((log.stored.as_deref(), log.finished), (Some(&b"hello\n"[..]), true), "{life}");
        let refused = env.cancel(JobId(single.job.0), None).unwrap_err();
        assert_eq!(
            (ebb_server::http::status(refused.kind), refused.message.as_str()),
            (409, "job 1: already succeeded; there is nothing to cancel")
        );
        let refused = env.drill(JobId(single.job.0)).unwrap_err();
        assert_eq!(
            (ebb_server::http::status(refused.kind), refused.message.as_str()),
            (409, "job 1: succeeded; only a running job can be drilled")
        );
        let other = Principal::tenant(Scope::Tenant, TenantId(2), "acme");
        let hidden = env.call(|reply| Msg::Job { principal: other, id: single.job, reply }).unwrap_err();
        assert_eq!(ebb_server::http::status(hidden.kind), 404, "{life}: another tenant's finished job");

        // The array counts its finished tasks by state, shown and listed.
        let head = env.job(JobId(tasks[0].0)).unwrap();
        let progress = head.progress.expect("an array's progress");
        let states: Vec<(&str, u64)> = progress.states.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        assert_eq!(states, vec![("cancelled", 1), ("running", 1), ("succeeded", 1)], "{life}");
        assert_eq!((progress.done, progress.total, progress.tasks.len()), (1, 3, 3), "{life}");
        let query = ebb_server::engine::JobQuery {
            cursor: Some(0),
            limit: 10,
            collapse: true,
            states: Some(vec![ebb_server::engine::JobState::Cancelled]),
            ..Default::default()
        };
        let collapsed = all_pages(&mut env, query, |_| {});
        assert_eq!(collapsed.iter().map(|j| JobId(j.id)).collect::<Vec<_>>(), vec![tasks[0]], "{life}");
        assert_eq!(collapsed[0].progress.as_ref().map(|p| (p.done, p.total)), Some((1, 3)), "{life}");
        let query = ebb_server::engine::JobQuery { cursor: Some(0), limit: 2, ..Default::default() };
        let listed: Vec<(JobId, String)> =
            all_pages(&mut env, query, |_| {}).into_iter().map(|j| (JobId(j.id), j.state)).collect();
        assert_eq!(
            listed,
            vec![
                (single.job, "succeeded".to_string()),
                (tasks[0], "succeeded".into()),
                (tasks[1], "cancelled".into()),
                (tasks[2], "running".into())
            ],
            "{life}"
        );

        let metrics = env.call(|reply| Msg::Metrics { reply });
        let count = |state: &str| -> u64 {
            metrics.jobs.iter().filter(|((_, s), _)| *s == state).map(|(_, n)| n).sum()
        };
        assert_eq!((count("succeeded"), count("cancelled"), count("running")), (2, 1, 1), "{life}");
        env.restart();
        env.register("a", vec![started[2]], Vec::new());
    }
    // Ids go on past every job, finished ones included.
    assert_eq!(env.submit(1), tasks[2].next());
}

/// A deadline job on track stays preemptible; once its progress says it
/// would be late it is promoted where it runs, stays promoted across a
/// restart, and its one usage record is split at the promotion.
#[test]
fn a_deadline_job_is_promoted_in_place_and_its_attempt_is_billed_at_both_rates() {
    let mut env = TestEnv::new("deadline");
    env.register("a", Vec::new(), Vec::new());
    let (reply, mut rx) = oneshot::channel();
    let spec = JobSubmission {
        gpus: Some(2),
        argv: vec!["work".into()],
        deadline: Some(ebb_server::rfc3339(env.now + 600_000)),
        ..Default::default()
    };
    let (now, principal) = (env.now, env.admin.clone());
    env.engine().batch(vec![Msg::Submit { principal, spec: Box::new(spec), reply }], now).unwrap();
    let id = rx.try_recv().unwrap().unwrap()[0];
    let attempt = *env.poll("a").iter().find(|a| a.job == id).expect("placed");
    let started = env.now;
    env.report("a", vec![AgentEvent::Started { attempt, pid: 1, at_ms: started }]);
    assert_eq!(env.job(JobId(id.0)).unwrap().deadline.unwrap().state, "no_progress");

    // 10% in 10 s: 90 s more and a 72 s margin fit in the 590 s left.
    env.now += 10_000;
    env.report("a", vec![AgentEvent::Progress { attempt, fraction: 0.1, at_ms: env.now }]);
    let job = env.job(JobId(id.0)).unwrap();
    assert_eq!((job.tier.as_str(), job.deadline.unwrap().state.as_str()), ("preemptible", "on_track"));
    // 40% in 300 s: 450 s more and a 108 s margin do not fit in 300 s.
    env.now = started + 300_000;
    env.report("a", vec![AgentEvent::Progress { attempt, fraction: 0.4, at_ms: env.now }]);
    let job = env.job(JobId(id.0)).unwrap();
    assert_eq!((job.tier.as_str(), job.state.as_str(), job.attempt), ("on-demand", "running", 1));
    assert_eq!(job.deadline.as_ref().unwrap().state, "promoted");
    let promoted = job.events.iter().find(|e| e.kind() == EventKind::Promoted).expect("a promoted event");
    assert_eq!((promoted.at_ms, &detail(promoted)["running"]), (env.now, &serde_json::json!(true)));

    // A restarted server keeps it on-demand and still splits its bill.
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(env.job(JobId(id.0)).unwrap().tier, "on-demand");
    env.now += 100_000;
    env.report("a", vec![exited(attempt, 0, env.now)]);
    let usage = env.usage(JobId(id.0));
    assert_eq!(usage.len(), 1);
    let parts: Vec<_> =
        usage[0].parts().iter().map(|p| (p.tier.clone(), p.seconds, p.rate, p.amount)).collect();
    assert_eq!(
        parts,
        vec![
            ("preemptible".to_string(), 300, 1_800_000, 300_000),
            ("on-demand".to_string(), 100, 3_600_000, 200_000),
        ]
    );
    assert_eq!((usage[0].seconds, usage[0].amount), (400, 500_000));
    assert_eq!(env.job(JobId(id.0)).unwrap().deadline.unwrap().state, "met");
    // `/metrics` counts its revenue as the record's parts, each under its
    // tier (the counter starts at the restart, before the attempt ended).
    let metrics = env.call(|reply| Msg::Metrics { reply });
    let revenue: Vec<_> = metrics.counters.revenue_micro_usd.into_iter().collect();
    assert_eq!(revenue, [("on-demand", 200_000), ("preemptible", 300_000), ("reserved", 0)]);
}

/// An array listed as one row says why its queued tasks wait, though the
/// row is its first task's, which runs.
#[test]
fn a_collapsed_arrays_row_says_why_its_queued_tasks_wait() {
    let mut env = TestEnv::new("array-reason");
    env.register_node("a", "H100", 2, Vec::new(), Vec::new());
    let (reply, mut rx) = oneshot::channel();
    let spec = JobSubmission {
        gpus: Some(1),
        argv: vec!["work".into()],
        array: Some("0-4".into()),
        name: Some("infer".into()),
        ..Default::default()
    };
    let principal = env.admin.clone();
    let now = env.now;
    env.engine().batch(vec![Msg::Submit { principal, spec: Box::new(spec), reply }], now).unwrap();
    let tasks = rx.try_recv().unwrap().unwrap();
    let started = env.poll("a");
    assert_eq!(started.len(), 2, "two GPUs: two tasks run, three wait");
    let at_ms = env.now;
    env.report("a", started.iter().map(|&attempt| AgentEvent::Started { attempt, pid: 1, at_ms }).collect());
    env.tick();
    let query =
        ebb_server::engine::JobQuery { cursor: Some(0), limit: 10, collapse: true, ..Default::default() };
    let rows = all_pages(&mut env, query, |_| {});
    assert_eq!(rows.len(), 1);
    assert_eq!(JobId(rows[0].id), tasks[0]);
    assert_eq!(rows[0].state, "running", "the row is the first task's");
    let waiting = env.job(tasks[4]).unwrap();
    assert!(waiting.pending_reason.is_some(), "a queued task says why it waits");
    assert!(rows[0].pending_reason.is_some(), "and so does its array's row: {:?}", rows[0]);
    assert!(rows[0].pending_detail.is_some());
}
