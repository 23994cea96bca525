//! A batch is all or nothing, answered only after its commit: store
//! errors in the middle of one, reads behind a submission, backlogs,
//! one instant per batch, and what recovery, cancels, drills, restored
//! checkpoints and reports sent again leave behind across restarts.

use ebb_api::{Action, AgentEvent, AttemptRef, EventKind, JobEvent, Report, ReportId, StopNotice};
use ebb_core::{Attempt, JobId};
use ebb_server::engine::Msg;
use ebb_server::store::Store;
use tokio::sync::oneshot;

use crate::harness::*;
use crate::pg;

/// Every write the writer makes, each failed in turn inside a batch that
/// makes it: the batch commits nothing, answers nobody, and the restarted
/// writer holds exactly what the last commit held; the agent's retry then
/// goes through whole.
#[test]
fn a_store_error_mid_batch_commits_and_answers_nothing_and_the_restarted_server_is_consistent() {
    store_errors_mid_batch(TestEnv::new);
}

/// The same on PostgreSQL: a database of its own per write failed, on a
/// throwaway server.
#[test]
fn on_postgres_a_store_error_mid_batch_commits_and_answers_nothing() {
    let server = pg::Postgres::start("writer");
    let mut admin = postgres::Client::connect(&server.url(), postgres::NoTls).unwrap();
    store_errors_mid_batch(|name| {
        let db = name.replace('-', "_");
        admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let url = server.url_for(&db);
        TestEnv::with_store(&format!("pg-{name}"), move |_| {
            Box::new(move || ebb_server::store::pg::PgStore::open(&url).unwrap())
        })
    });
}

fn store_errors_mid_batch<S: Store>(mut env_for: impl FnMut(&str) -> TestEnv<S>) {
    for (op, n) in [("put_job", 2), ("add_event", 2), ("heard", 1), ("add_usage", 1), ("put_output", 1)] {
        let mut env = env_for(&format!("fail-{op}"));
        env.register("a", Vec::new(), Vec::new());
        let attempt = env.running("a");
        env.now += 60_000;

        // One batch: a submission, a read, and the report of the running
        // job's exit with its output.
        let (submit, mut submitted) = env.submit_msg(1);
        let (read_tx, mut read) = oneshot::channel();
        let jobs = Msg::Jobs {
            principal: env.admin.clone(),
            query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
            reply: read_tx,
        };
        let events = vec![AgentEvent::Output { attempt, data: "done\n".into() }, exited(attempt, 0, env.now)];
        let (report, mut reported) = TestEnv::<S>::report_msg("a", events.clone());
        env.fail(op, n);
        let now = env.now;
        // The tick writes the contact the report brought.
        let result = env.engine().batch(vec![submit, jobs, report, Msg::Tick], now);
        let failed = result.expect_err("a failed write must fail the batch");
        assert!(matches!(failed, ebb_server::engine::BatchFailed::Write(_)), "{op}: {failed}");
        assert!(submitted.try_recv().is_err(), "{op}: a submission was acknowledged");
        assert!(read.try_recv().is_err(), "{op}: a read was answered");
        assert!(reported.try_recv().is_err(), "{op}: a report was acknowledged");

        // The restarted writer has what the last commit had: one running job.
        env.restart();
        assert_eq!(env.jobs(), vec![attempt.job], "{op}");
        assert_eq!(env.job(JobId(attempt.job.0)).unwrap().state, "running", "{op}");
        assert!(env.usage(JobId(attempt.job.0)).is_empty(), "{op}: usage of an abandoned batch");
        assert_eq!(env.log(JobId(attempt.job.0)), "", "{op}: output of an abandoned batch");

        // The agent registers again and delivers what it still holds.
        env.register("a", vec![attempt], Vec::new());
        env.report("a", events);
        assert_eq!(env.job(JobId(attempt.job.0)).unwrap().state, "succeeded", "{op}");
        assert_eq!(env.usage(JobId(attempt.job.0)).len(), 1, "{op}");
        assert_eq!(env.log(JobId(attempt.job.0)), "done\n", "{op}");
    }
}

/// A read in the same batch as a submission sees it, and is answered only
/// once it is committed: when the batch dies before its commit, the read
/// is never answered.
#[test]
fn a_read_issued_in_the_batch_of_a_submission_is_answered_only_after_its_commit() {
    let mut env = TestEnv::new("read");
    let (submit, mut submitted) = env.submit_msg(1);
    let (tx, mut read) = oneshot::channel();
    let jobs = Msg::Jobs {
        principal: env.admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
        reply: tx,
    };
    let (tx, mut one) = oneshot::channel();
    let job = Msg::Job { principal: env.admin.clone(), id: JobId(1), reply: tx };
    let now = env.now;
    env.engine.take().unwrap().crash_during(vec![submit, jobs, job], now);
    assert!(submitted.try_recv().is_err());
    assert!(read.try_recv().is_err(), "a read showed a job that was never committed");
    assert!(one.try_recv().is_err(), "a read showed a job that was never committed");

    env.restart();
    assert!(env.jobs().is_empty());
    let (submit, mut submitted) = env.submit_msg(1);
    let (tx, mut read) = oneshot::channel();
    let jobs = Msg::Jobs {
        principal: env.admin.clone(),
        query: ebb_server::engine::JobQuery { cursor: Some(0), limit: 100, ..Default::default() },
        reply: tx,
    };
    env.engine().batch(vec![submit, jobs], now).unwrap();
    let id = submitted.try_recv().unwrap().unwrap()[0];
    assert_eq!(
        read.try_recv().unwrap().unwrap().jobs.iter().map(|j| JobId(j.id)).collect::<Vec<_>>(),
        vec![id]
    );
}

/// The log has a batch's events only once the batch has committed, and
/// after its answers: a batch that dies before its commit leaves no line
/// for what never happened.
#[test]
fn a_batch_s_events_are_logged_only_once_it_has_committed() {
    let log = || String::from_utf8(captured_log::take()).unwrap();
    captured_log::start();
    let mut env = TestEnv::new("log-after-commit");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let cancel = |env: &TestEnv<_>| {
        let (reply, answered) = oneshot::channel();
        let req = ebb_api::CancelRequest::default();
        (Msg::Cancel { principal: env.admin.clone(), id: attempt.job, req, reply }, answered)
    };
    let now = env.now;
    let (msg, mut answered) = cancel(&env);
    env.engine.take().unwrap().crash_during(vec![msg], now);
    assert!(answered.try_recv().is_err());
    assert!(!log().contains("cancel_requested"), "a line for a batch never committed:\n{}", log());

    env.restart();
    let (msg, mut answered) = cancel(&env);
    env.engine().batch(vec![msg], now).unwrap();
    assert!(answered.try_recv().is_ok());
    let line = log().lines().find(|l| l.contains("kind=\"cancel_requested\"")).map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no line for the committed cancel:\n{}", log()));
    assert!(line.contains(" INFO ") && line.contains(&format!("job={}", attempt.job)), "{line}");
    // The steps every job takes are there too, at debug.
    assert!(log().contains(" DEBUG ") && log().contains("kind=\"started\""), "{}", log());
}

/// The log of this test's thread. tracing caches whether each call site
/// is wanted, for every thread at once: a subscriber of one test's thread
/// alone (`with_default`) misses the sites other tests' threads reach
/// first. So the process's own subscriber is set, once, and writes only
/// what a thread that asked for its log emits, into that thread's buffer.
mod captured_log {
    use std::cell::RefCell;

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    thread_local! {
        static LOG: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    }

    struct ThisThread;

    impl std::io::Write for ThisThread {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            LOG.with(|log| log.borrow_mut().as_mut().map(|log| log.extend_from_slice(buf)));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// From now on this thread's events, at debug and above, are kept.
    pub fn start() {
        static SET: std::sync::Once = std::sync::Once::new();
        SET.call_once(|| {
            // Asked at each event (a dynamic filter): a plain `filter_fn` is
            // asked once per site, on whichever thread reaches it first.
            let wanted = tracing_subscriber::filter::dynamic_filter_fn(|meta, _| {
                *meta.level() <= tracing::Level::DEBUG && LOG.with(|log| log.borrow().is_some())
            });
            let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(|| ThisThread);
            let subscriber = tracing_subscriber::registry().with(layer.with_filter(wanted));
            tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in these tests");
            // A site another thread was registering meanwhile may have
            // cached "never" from before the subscriber: once those few
            // microseconds are surely over, every site is asked again.
            std::thread::sleep(std::time::Duration::from_millis(50));
            tracing::callsite::rebuild_interest_cache();
        });
        LOG.with(|log| *log.borrow_mut() = Some(Vec::new()));
    }

    /// What this thread has logged since `start`.
    pub fn take() -> Vec<u8> {
        LOG.with(|log| log.borrow().clone().unwrap_or_default())
    }
}

/// A backlog larger than a batch may start is placed a batch's worth at a
/// time: each piece is committed and at its nodes before the next is
/// placed, and the next batch goes on with no message to start it.
#[test]
fn a_backlog_is_placed_a_batch_at_a_time() {
    let mut env = TestEnv::new("pieces");
    let bound = ebb_server::engine::BATCH_STARTS;
    let nodes: Vec<String> = (0..bound.div_ceil(8) + 16).map(|i| format!("n{i:04}")).collect();
    for node in &nodes {
        env.register(node, Vec::new(), Vec::new());
    }
    let backlog = bound + 100;
    let (msgs, mut replies): (Vec<Msg>, Vec<_>) = (0..backlog).map(|_| env.submit_msg(1)).unzip();
    let now = env.now;
    env.engine().batch(msgs, now).unwrap();
    assert!(replies.iter_mut().all(|r| r.try_recv().is_ok_and(|r| r.is_ok())), "every job accepted");
    // Read beside the writer: any message to it is a batch that schedules.
    let db = rusqlite::Connection::open(env.dir.join("ebb.db")).unwrap();
    let placed = || -> usize {
        db.query_row("SELECT COUNT(*) FROM jobs WHERE state = 'starting'", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(placed(), bound, "the first batch starts as many as a batch may");
    env.engine().batch(Vec::new(), now).unwrap();
    assert_eq!(placed(), backlog, "the next, with no message, the rest");
    let starts: usize = nodes.iter().map(|n| env.poll(n).len()).sum();
    assert_eq!(starts, backlog, "every start reached its node once");
}

/// Every event written in a batch carries the batch's instant, never the
/// wall clock.
#[test]
fn every_event_of_a_batch_is_stamped_with_the_batchs_instant() {
    let mut env = TestEnv::new("clock");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    env.now += 1_234;
    let at = env.now;
    env.report("a", vec![exited(attempt, 0, at)]);
    let events = env.job(JobId(attempt.job.0)).unwrap().events;
    let stamps: Vec<(EventKind, u64)> = events.iter().map(|e| (e.kind(), e.at_ms)).collect();
    assert_eq!(
        stamps,
        vec![
            (EventKind::Submitted, T0),
            (EventKind::Placed, T0),
            (EventKind::Started, T0),
            (EventKind::Exited, at),
            (EventKind::Succeeded, at),
        ]
    );
}

/// A restarted server that cannot put a live attempt back (its node is
/// gone from the store) ends it as lost, and meters it to the node's last
/// contact, as any attempt lost with its node is: the last one a tick
/// wrote, a tick or less before the last poll, never after it.
#[test]
fn recovery_meters_the_attempts_it_ends() {
    let mut env = TestEnv::new("recovery");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    env.now += 30_000;
    env.poll("a"); // last contact, written at the tick
    let heard = env.now;
    env.now += 250;
    env.tick();
    env.now += 200;
    env.poll("a"); // the server dies before its next tick
    env.engine = None;
    let db = rusqlite::Connection::open(env.dir.join("ebb.db")).unwrap();
    db.execute("DELETE FROM nodes WHERE name = 'a'", []).unwrap();
    drop(db);
    env.now += 600_000;
    env.restart();

    let job = env.job(JobId(attempt.job.0)).unwrap();
    assert_eq!(job.state, "queued");
    let usage = env.usage(JobId(attempt.job.0));
    assert_eq!(usage.len(), 1, "the attempt recovery ended was not metered");
    assert_eq!((usage[0].started_ms, usage[0].ended_ms), (T0, heard));
    assert_eq!(usage[0].outcome, "lost");
    let requeued = job.events.iter().find(|e| e.kind() == EventKind::Requeued).expect("requeued");
    assert!(detail(requeued)["why"].as_str().unwrap().starts_with("server restart"), "{}", detail(requeued));
    assert_eq!(requeued.at_ms, env.now);
}

/// A cancel was SIGTERM and SIGKILL 10 s later, whatever the drain window,
/// with no notice for the job's trap; `--grace` did not exist.
#[test]
fn a_cancel_sends_its_notice_and_grace_keeps_its_deadline_and_is_sent_again_after_a_restart() {
    let mut env = TestEnv::new("cancel-grace");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let id = attempt.job;

    // The drain window here is 3 s: a longer grace is refused, and
    // nothing is cancelled.
    let refused = env.cancel(JobId(id.0), Some(3_001)).unwrap_err();
    assert_eq!(ebb_server::http::status(refused.kind), 422);
    assert_eq!(refused.message, "grace_ms: a cancel's grace may be at most the drain window, 3s; got 3.001s");
    assert!(env.commands("a").is_empty());
    assert_eq!(env.job(JobId(id.0)).unwrap().state, "running");

    // No grace asked: 10 s, or the drain window if shorter.
    env.now += 100;
    let asked = env.now;
    assert_eq!(env.cancel(JobId(id.0), None).unwrap().state, "running");
    let notice = StopNotice { notice_at_ms: asked, deadline_ms: asked + 3_000 };
    assert_eq!(env.commands("a"), vec![Action::Stop { attempt, grace_ms: 3_000, notice: Some(notice) }]);
    let event = env
        .job(JobId(id.0))
        .unwrap()
        .events
        .into_iter()
        .find(|e| e.kind() == EventKind::CancelRequested)
        .unwrap();
    assert_eq!(detail(&event)["grace_seconds"], 3.0);

    // Again with more time: nothing changes; with less: the deadline
    // comes sooner.
    env.now += 100;
    env.cancel(JobId(id.0), Some(3_000)).unwrap();
    assert!(env.commands("a").is_empty(), "a second cancel gave more time");
    let sooner = StopNotice { notice_at_ms: env.now, deadline_ms: env.now + 1_000 };
    env.cancel(JobId(id.0), Some(1_000)).unwrap();
    assert_eq!(
        env.commands("a"),
        vec![Action::Stop { attempt, grace_ms: 1_000, notice: Some(sooner.clone()) }]
    );

    // A restarted server tells the agent again, with the same deadline.
    env.now += 400;
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(env.commands("a"), vec![Action::Stop { attempt, grace_ms: 600, notice: Some(sooner) }]);

    env.report("a", vec![exited(attempt, 143, env.now)]);
    assert_eq!(env.job(JobId(id.0)).unwrap().state, "cancelled");
}

/// A drill is kept with the job: a server restarted while the drilled
/// attempt saves tells its node the notice again, takes its exit as the
/// drill's (requeued at once, not a preemption, billed as run time), and
/// concludes the drill when the next attempt reports its resume.
#[test]
fn a_drill_survives_a_restart_and_its_exit_requeues_the_job_as_a_drill() {
    let mut env = TestEnv::new("drill");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let id = attempt.job;
    env.now += 5_000;
    let notice_at = env.now;
    let job = env.drill(JobId(id.0)).unwrap();
    assert_eq!(job.state, "draining");
    let drill = job.drill.expect("the drill, in the answer");
    assert_eq!((drill.attempt, drill.notice_at_ms, drill.deadline_ms), (1, notice_at, notice_at + 3_000));
    assert_eq!((drill.verdict, drill.nodes), (None, vec!["a".to_string()]));
    let drains = |actions: Vec<Action>| -> Vec<ebb_api::DrainAttempt> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Drain(d) => Some(d),
                _ => None,
            })
            .collect()
    };
    let sent = drains(env.commands("a"));
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].attempt, sent[0].deadline_ms), (attempt, notice_at + 3_000));
    assert!(sent[0].reason.starts_with("drill: "), "{}", sent[0].reason);
    let again = env.drill(JobId(id.0)).unwrap_err();
    assert_eq!(
        (ebb_server::http::status(again.kind), again.message.as_str()),
        (409, format!("job {id}: already draining ({})", sent[0].reason).as_str())
    );

    env.now += 500;
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    assert_eq!(drains(env.commands("a")), sent, "the notice is sent again, as it was");
    env.now += 300;
    let at_ms = env.now;
    let save = AgentEvent::Checkpoint { attempt, step: Some(8), bytes: None, duration_ms: 200, at_ms };
    env.report("a", vec![save, exited(attempt, 0, at_ms + 50)]);
    let job = env.job(JobId(id.0)).unwrap();
    // Requeued and placed again in the same batch.
    assert_eq!((job.state.as_str(), job.attempt), ("starting", 2));
    assert_eq!((job.preemptions, job.retries, job.lost_gpu_seconds), (0, 0, 0.0));
    let usage = env.usage(JobId(id.0));
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (usage[0].outcome.as_str(), usage[0].drain_gpu_seconds, usage[0].lost_gpu_seconds),
        ("drill", 0, 0)
    );
    let drill = job.drill.unwrap();
    assert_eq!(
        (drill.exit.as_deref(), drill.fit_window, drill.requeued),
        (Some("exited with code 0"), Some(true), true)
    );
    assert_eq!(drill.checkpoint.as_ref().and_then(|c| c.step), Some(8));
    assert!(drill.verdict.is_none(), "waiting for the resume");

    // Placed again at once; the new attempt resumes from step 8.
    let next = *env.poll("a").first().expect("placed again");
    assert_eq!(next, AttemptRef { job: id, attempt: Attempt(2) });
    let at_ms = env.now;
    env.report("a", vec![AgentEvent::Started { attempt: next, pid: 4343, at_ms }]);
    env.report("a", vec![AgentEvent::Resumed { attempt: next, step: Some(8), at_ms }]);
    let job = env.job(JobId(id.0)).unwrap();
    let drill = job.drill.unwrap();
    assert_eq!((drill.verdict.as_deref(), drill.failures.len()), (Some("ready"), 0));
    assert_eq!(
        (drill.next_attempt, drill.next_node.as_deref(), drill.resumed_step),
        (Some(2), Some("a"), Some(8))
    );
    let kinds: Vec<EventKind> = job.events.iter().map(|e| e.kind()).collect();
    let drills: Vec<&JobEvent> = job.events.iter().filter(|e| e.kind() == EventKind::Drill).collect();
    assert_eq!(drills.len(), 2, "{kinds:?}");
    assert_eq!(
        (detail(drills[0])["phase"].as_str(), detail(drills[1])["phase"].as_str()),
        (Some("notice"), Some("verdict"))
    );
    assert_eq!(detail(drills[1])["verdict"], "ready");
    assert!(kinds.contains(&EventKind::Resumed) && kinds.contains(&EventKind::DrainNotice), "{kinds:?}");
    let requeued = job.events.iter().find(|e| e.kind() == EventKind::Requeued).unwrap();
    assert_eq!(detail(requeued)["reason"], "drill");
}

/// The checkpoint a node restored from the checkpoint store before an
/// attempt started is in the job's timeline, before the start; the same
/// report from a node the attempt is not on is stale, and no event.
#[test]
fn a_restored_checkpoint_is_in_the_timeline_before_the_start_and_only_from_the_attempts_node() {
    let mut env = TestEnv::new("restored");
    env.register("a", Vec::new(), Vec::new());
    let id = env.submit(8);
    let attempt = *env.poll("a").first().expect("placed");
    env.register("b", Vec::new(), Vec::new());
    let restored = |at_ms| AgentEvent::Restored {
        attempt,
        from_attempt: 1,
        upload: 3,
        step: Some(1200),
        files: 2,
        bytes: 4096,
        duration_ms: 250,
        at_ms,
    };
    let at_ms = env.now;
    let reply = env.call(|reply| Msg::Report {
        report: Report { node: "b".into(), events: vec![restored(at_ms)], id: None },
        reply,
    });
    assert_eq!(reply.unwrap().stale, vec![attempt], "b does not run it");
    env.now += 100;
    env.report("a", vec![restored(at_ms), AgentEvent::Started { attempt, pid: 7, at_ms: at_ms + 100 }]);
    let job = env.job(id).unwrap();
    let kinds: Vec<EventKind> = job.events.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, [EventKind::Submitted, EventKind::Placed, EventKind::Restored, EventKind::Started]);
    let detail = &detail(&job.events[2]);
    assert_eq!(
        (&detail["node"], &detail["from_attempt"], &detail["upload"], &detail["step"]),
        (&serde_json::json!("a"), &serde_json::json!(1), &serde_json::json!(3), &serde_json::json!(1200))
    );
    assert_eq!(
        (&detail["files"], &detail["bytes"], &detail["seconds"]),
        (&serde_json::json!(2), &serde_json::json!(4096), &serde_json::json!(0.25))
    );
    assert_eq!(detail["at"], ebb_server::rfc3339(at_ms));
}

/// A report sent again because its reply was lost (the server committed
/// it) is applied once: its output is in the log once and its checkpoint
/// counts once, also after a restart of the server. A new session of the
/// agent numbers its reports afresh.
#[test]
fn a_report_sent_again_adds_its_output_and_checkpoint_once() {
    let mut env = TestEnv::new("resend");
    env.register("a", Vec::new(), Vec::new());
    let attempt = env.running("a");
    let at_ms = env.now;
    let events = vec![
        AgentEvent::Output { attempt, data: "step 1\n".into() },
        AgentEvent::Checkpoint { attempt, step: Some(1), bytes: Some(10), duration_ms: 100, at_ms },
    ];
    let first = ReportId { session: 77, seq: 1 };
    env.report_as("a", events.clone(), Some(first));
    env.report_as("a", events.clone(), Some(first));
    env.restart();
    env.register("a", vec![attempt], Vec::new());
    env.report_as("a", events.clone(), Some(first));
    assert_eq!(env.log(JobId(attempt.job.0)), "step 1\n");
    let checkpoints = env
        .job(JobId(attempt.job.0))
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind() == EventKind::Checkpoint)
        .count();
    assert_eq!(checkpoints, 1);

    let next = vec![AgentEvent::Output { attempt, data: "step 2\n".into() }];
    env.report_as("a", next, Some(ReportId { session: 77, seq: 2 }));
    // The agent restarted: a new session starts again from 1.
    let again = vec![AgentEvent::Output { attempt, data: "step 3\n".into() }];
    env.report_as("a", again, Some(ReportId { session: 78, seq: 1 }));
    assert_eq!(env.log(JobId(attempt.job.0)), "step 1\nstep 2\nstep 3\n");
}

/// A finished job's output stays `keep_output`, then goes (a minute's
/// pass at most later), and reading the log says when it went; the job
/// and its timeline stay. A job still running keeps its output whatever
/// its age.
#[test]
fn finished_jobs_output_goes_after_keep_output_and_the_log_says_when() {
    let mut env = TestEnv::new("keep-output");
    env.config.keep_output = ebb_core::Span(3_600_000);
    env.restart();
    env.register("a", Vec::new(), Vec::new());
    let done = env.running("a");
    let still = env.running("a");
    let out = |data: &str, attempt| AgentEvent::Output { attempt, data: data.into() };
    let now = env.now;
    env.report("a", vec![out("done\n", done), exited(done, 0, now), out("working\n", still)]);
    let read = |env: &mut TestEnv, id: u64| {
        let admin = env.admin.clone();
        env.call(|reply| Msg::LogFile { principal: admin, id: JobId(id), offset: 0, sources: false, reply })
            .unwrap()
    };
    env.now += 3_599_000;
    let log = read(&mut env, done.job.0);
    assert_eq!((log.stored.as_deref(), log.removed_ms), (Some(&b"done\n"[..]), None), "kept for the hour");
    env.now += 62_000;
    read(&mut env, done.job.0); // the batch after the hour prunes
    let pruned_at = env.now;
    let log = read(&mut env, done.job.0);
    assert_eq!((log.committed, log.removed_ms, log.finished), (0, Some(pruned_at), true), "gone, and when");
    assert_eq!(env.log(JobId(done.job.0)), "");
    assert_eq!(env.job(JobId(done.job.0)).unwrap().state, "succeeded", "the job stays");
    assert_eq!(env.log(JobId(still.job.0)), "working\n", "a running job's output stays");
    // A restart finds the same: the expiry is in the store.
    env.restart();
    env.now += 1_000;
    assert_eq!(read(&mut env, done.job.0).removed_ms, Some(pruned_at));
}
