//! Attempts without processes, for a simulated fleet (`ebb agent
//! --simulate-nodes N`, see [`crate::fleet`]): each attempt is a task that
//! behaves as its job's environment says, and is reported exactly as a
//! process doing the same would be.
//!
//! * `EBB_SIM_DURATION`: how much work it does (run time, over its
//!   attempts); then it exits 0 having marked itself complete (as a job
//!   that creates `EBB_COMPLETION_FILE` before exiting), so one that
//!   finishes during a drain succeeds. Absent: it runs until it is
//!   stopped.
//! * `EBB_SIM_CHECKPOINT`: it reports a checkpoint every interval, with
//!   steps counted from 1 (or on from the step it resumed from), as a job
//!   posting to its metadata endpoint's `/ebb/v1/checkpoint` does.
//! * `EBB_SIM_SAVE` (default 0): at its first signal other than SIGKILL (a
//!   drain's, a cancel's, a stop's), it saves for this long, reports a
//!   checkpoint that took as long, and exits 0 without the completion
//!   mark: a well-behaved job that traps its signal. From the signal on,
//!   it only saves; a SIGKILL during the save ends it as it would a
//!   process.
//! * `EBB_SIM_IGNORE_NOTICE=1`: it ignores every signal but SIGKILL, so a
//!   drain or a cancel ends it at the deadline.
//!
//! Durations are a number of seconds (`2.5`) or a span with units (`90s`,
//! `5m`, `1h 30m`, `500ms`). A value that is not one is the job's error:
//! the attempt does not start, and is reported as an exit of 127 saying
//! why, as a program that cannot be run would be.
//!
//! SIGKILL ends an attempt at once, reported as a process killed by it
//! is: no exit code, signal 9. Attempts have no files (no notice file, no
//! directories) and report pid 0; the notice is on no endpoint, since no
//! job reads it.
//!
//! A simulated job resumes as a real one that loads its latest checkpoint
//! does. Every checkpoint an attempt reports (periodic or at its signal)
//! is remembered by the fleet ([`FleetCheckpoints`], shared by all its
//! nodes, as a checkpoint store is shared by a cluster's) with its step
//! and the work it stands for: the attempt's run time up to the save,
//! plus what the attempt had resumed from. A later attempt of the job, on
//! any node of the fleet, reports that it resumed from that step (what
//! `POST /ebb/v1/resumed` relays for a real job), numbers its checkpoints
//! on from it, and runs only what is left of `EBB_SIM_DURATION`. An
//! attempt with nothing saved starts from the beginning and reports no
//! resume. The newest checkpoint is the one of the greatest (attempt,
//! step), never the latest to arrive, so a late report of an attempt
//! the server has moved on from cannot hide a newer one's; a job that
//! completed or was cancelled is forgotten. The fleet remembers only
//! while its process runs.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_api::{AgentEvent, AttemptRef, StartAttempt};
use ebb_core::JobId;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::notice::{Members, Notice};
use crate::report::{now_ms, Reporter};
use crate::supervisor::{MembersTarget, NoticeTarget, StartError, Supervisor};

/// What a simulated job does, from its environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Behaviour {
    /// How long it runs before it exits 0 of itself; none: until stopped.
    pub duration: Option<Duration>,
    /// How often it reports a checkpoint while it runs.
    pub checkpoint_every: Option<Duration>,
    /// How long it saves after its signal before it exits.
    pub save: Duration,
    /// It ignores every signal but SIGKILL.
    pub ignore_notice: bool,
}

/// The longest span a variable may give: a year.
const LONGEST: Duration = Duration::from_secs(366 * 24 * 3600);

/// Why a simulated job's `EBB_SIM_*` variables cannot be followed: the
/// variable and its value, and what it may be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BehaviourError {
    #[error("{name}={value:?}: {why}")]
    Span { name: &'static str, value: String, why: SpanError },
    #[error("EBB_SIM_CHECKPOINT=0: the interval between checkpoints must be above 0")]
    NoInterval,
    #[error("EBB_SIM_IGNORE_NOTICE={0:?}: 1 or 0")]
    IgnoreNotice(String),
}

/// Why a text is not a span of the `EBB_SIM_*` variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpanError {
    #[error("not a number of seconds")]
    Seconds,
    #[error("a number of seconds (2.5) or a span with units (90s, 5m, 500ms)")]
    NoSpan,
    #[error("at most a year")]
    TooLong,
}

impl Behaviour {
    /// The behaviour `env` asks for; an error names the variable.
    pub(crate) fn from_env(env: &BTreeMap<String, String>) -> Result<Behaviour, BehaviourError> {
        let span = |name: &'static str| {
            env.get(name)
                .map(|v| parse_span(v).map_err(|why| BehaviourError::Span { name, value: v.clone(), why }))
        };
        let duration = span("EBB_SIM_DURATION").transpose()?;
        let checkpoint_every = span("EBB_SIM_CHECKPOINT").transpose()?;
        if checkpoint_every == Some(Duration::ZERO) {
            return Err(BehaviourError::NoInterval);
        }
        let save = span("EBB_SIM_SAVE").transpose()?.unwrap_or_default();
        let ignore_notice = match env.get("EBB_SIM_IGNORE_NOTICE").map(String::as_str) {
            None | Some("" | "0" | "false") => false,
            Some("1" | "true") => true,
            Some(other) => return Err(BehaviourError::IgnoreNotice(other.to_string())),
        };
        Ok(Behaviour { duration, checkpoint_every, save, ignore_notice })
    }
}

/// A duration as the `EBB_SIM_*` variables give it: seconds (`2.5`) or a
/// span with units (`90s`, `5m`), at most a year.
pub(crate) fn parse_span(text: &str) -> Result<Duration, SpanError> {
    let text = text.trim();
    let span = match text.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds).map_err(|_| SpanError::Seconds)?,
        Err(_) => humantime::parse_duration(text).map_err(|_| SpanError::NoSpan)?,
    };
    if span > LONGEST {
        return Err(SpanError::TooLong);
    }
    Ok(span)
}

/// A checkpoint a simulated attempt reported, as the fleet remembers it
/// for the job's later attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Saved {
    /// The attempt that reported it.
    pub attempt: ebb_core::Attempt,
    pub step: u64,
    /// The work it holds: how long the job had run, over all its attempts,
    /// when it saved.
    pub work: Duration,
}

/// The newest checkpoint of each job, reported by any node of the fleet:
/// what a checkpoint store shared by every node would give a job's next
/// attempt. Kept in the fleet's memory only.
#[derive(Debug, Default)]
pub(crate) struct FleetCheckpoints {
    jobs: Mutex<HashMap<JobId, Saved>>,
}

impl FleetCheckpoints {
    /// Job `job`'s attempt `saved.attempt` reported `saved`: it becomes the
    /// job's newest unless one of a greater (attempt, step) is known, as a
    /// stale attempt's late report must not hide a newer attempt's.
    pub(crate) fn saved(&self, job: JobId, saved: Saved) {
        let mut jobs = self.jobs.lock().expect("checkpoints");
        let newest = jobs.entry(job).or_insert(saved);
        if (saved.attempt, saved.step) > (newest.attempt, newest.step) {
            *newest = saved;
        }
    }

    /// The newest checkpoint of job `job`, if any of its attempts saved.
    pub(crate) fn newest(&self, job: JobId) -> Option<Saved> {
        self.jobs.lock().expect("checkpoints").get(&job).copied()
    }

    /// Job `job` will not run again (it completed, or was cancelled).
    fn forget(&self, job: JobId) {
        self.jobs.lock().expect("checkpoints").remove(&job);
    }
}

/// One simulated node's attempts.
pub(crate) struct Simulated {
    node: String,
    reporter: Arc<Reporter>,
    /// The fleet's checkpoints, shared with every other node.
    checkpoints: Arc<FleetCheckpoints>,
    /// Every event of an attempt is sent while this is held and the attempt
    /// is in it: whoever takes an attempt out reports its exit, and nothing
    /// of it follows.
    running: Mutex<HashMap<AttemptRef, Running>>,
}

/// A running simulated attempt.
struct Running {
    /// The signal its job asked drains for.
    signal: Signal,
    notice: Option<Notice>,
    /// An elastic attempt's latest change of nodes.
    members: Option<Members>,
    /// Set at its first signal other than SIGKILL; dropped when it ends.
    signalled: watch::Sender<bool>,
}

impl Simulated {
    pub(crate) fn new(node: &str, reporter: Arc<Reporter>, checkpoints: Arc<FleetCheckpoints>) -> Simulated {
        Simulated { node: node.to_string(), reporter, checkpoints, running: Mutex::new(HashMap::new()) }
    }

    /// Runs attempt `a` as `behaviour` says, from `resumed` if it resumed
    /// from a checkpoint, until it exits or is killed.
    async fn run(
        self: Arc<Self>,
        a: AttemptRef,
        behaviour: Behaviour,
        resumed: Option<Saved>,
        mut signalled: watch::Receiver<bool>,
    ) {
        let started = Instant::now();
        let done_before = resumed.map_or(Duration::ZERO, |r| r.work);
        // The work done by `at`, this attempt's and what it resumed from.
        let work = |at: Instant| done_before + at.saturating_duration_since(started);
        let end = behaviour.duration.map(|d| started + d.saturating_sub(done_before));
        let mut next_checkpoint = behaviour.checkpoint_every.map(|every| started + every);
        let mut step = resumed.map_or(0, |r| r.step);
        loop {
            tokio::select! {
                biased;
                () = until(end) => {
                    self.exit(a, Some(0), None, true);
                    return;
                }
                changed = signalled.changed() => {
                    if changed.is_err() {
                        return; // killed: the exit is reported
                    }
                    if behaviour.ignore_notice {
                        continue;
                    }
                    // The save holds the work done up to the signal.
                    let saving = work(Instant::now());
                    tokio::time::sleep(behaviour.save).await;
                    step += 1;
                    if self.checkpoint(a, Saved { attempt: a.attempt, step, work: saving }, behaviour.save) {
                        self.exit(a, Some(0), None, false);
                    }
                    return;
                }
                () = until(next_checkpoint) => {
                    step += 1;
                    let at = next_checkpoint.expect("a checkpoint is due");
                    if !self.checkpoint(a, Saved { attempt: a.attempt, step, work: work(at) }, Duration::ZERO) {
                        return;
                    }
                    next_checkpoint = next_checkpoint.zip(behaviour.checkpoint_every).map(|(at, every)| at + every);
                }
            }
        }
    }

    /// Reports `saved`, a checkpoint of `a` that took `took`, and keeps it
    /// for the job's later attempts, if `a` still runs; says whether it
    /// does.
    fn checkpoint(&self, a: AttemptRef, saved: Saved, took: Duration) -> bool {
        let running = self.running.lock().expect("running");
        if !running.contains_key(&a) {
            return false;
        }
        // Kept before the report: the next attempt is placed only after
        // this one's exit, which follows it.
        self.checkpoints.saved(a.job, saved);
        self.reporter.send(AgentEvent::Checkpoint {
            attempt: a,
            step: Some(saved.step),
            bytes: None,
            duration_ms: took.as_millis() as u64,
            at_ms: now_ms(),
        });
        true
    }

    /// Ends `a` and reports its exit, unless it has ended already.
    fn exit(&self, a: AttemptRef, code: Option<i32>, signal: Option<i32>, completed: bool) {
        let mut running = self.running.lock().expect("running");
        let Some(ended) = running.remove(&a) else {
            return;
        };
        // A job that is done, or cancelled, does not run again.
        if completed || ended.notice.is_some_and(|n| n.action == crate::notice::NoticeAction::Cancel) {
            self.checkpoints.forget(a.job);
        }
        tracing::info!(node = self.node, job = %a.job, attempt = %a.attempt, ?code, ?signal, "exited");
        self.reporter.send(AgentEvent::Exited {
            attempt: a,
            code,
            signal,
            completed,
            at_ms: now_ms(),
            peak_memory_bytes: None,
            start_error: None,
            port_in_use: None,
            ended_by: None,
        });
    }
}

/// Sleeps until `at`; for ever if there is none.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The line a simulated attempt writes at its start.
fn first_line(node: &str, b: &Behaviour, resumed: Option<Saved>) -> String {
    let done = resumed.map_or(Duration::ZERO, |r| r.work);
    let runs = match b.duration {
        Some(d) => format!("runs for {}", humantime::format_duration(d.saturating_sub(done))),
        None => "runs until stopped".to_string(),
    };
    match resumed {
        Some(r) => format!(
            "simulated attempt on {node}: resumes from step {} ({} of work saved), {runs}\n",
            r.step,
            humantime::format_duration(r.work)
        ),
        None => format!("simulated attempt on {node}: {runs}\n"),
    }
}

impl Supervisor for Simulated {
    /// A simulated attempt listens on no port.
    fn port_free(&self, _port: u16) -> bool {
        true
    }

    fn running(&self) -> Vec<AttemptRef> {
        self.running.lock().expect("running").keys().copied().collect()
    }

    fn is_running(&self, attempt: AttemptRef) -> bool {
        self.running.lock().expect("running").contains_key(&attempt)
    }

    fn under_notice(&self, attempt: AttemptRef, deadline_ms: u64) -> bool {
        let running = self.running.lock().expect("running");
        running.get(&attempt).is_some_and(|r| r.notice.as_ref().is_some_and(|n| n.deadline_ms == deadline_ms))
    }

    fn start(self: &Arc<Self>, start: StartAttempt) -> impl Future<Output = Result<(), StartError>> + Send {
        let this = self.clone();
        async move {
            let behaviour = Behaviour::from_env(&start.env)?;
            let a = start.attempt;
            let (signalled, watching) = watch::channel(false);
            // What an earlier attempt saved, from whichever node.
            let resumed = this.checkpoints.newest(a.job);
            {
                let mut running = this.running.lock().expect("running");
                let signal = Signal::try_from(start.signal).unwrap_or(Signal::SIGTERM);
                running.insert(a, Running { signal, notice: None, members: None, signalled });
                this.reporter.send(AgentEvent::Started { attempt: a, pid: 0, at_ms: now_ms() });
                let data = first_line(&this.node, &behaviour, resumed);
                this.reporter.send(AgentEvent::Output { attempt: a, data });
                if let Some(r) = resumed {
                    this.reporter.send(AgentEvent::Resumed {
                        attempt: a,
                        step: Some(r.step),
                        at_ms: now_ms(),
                    });
                }
            }
            tokio::spawn(this.clone().run(a, behaviour, resumed, watching));
            Ok(())
        }
    }

    fn signal(&self, attempt: AttemptRef, signal: Signal) {
        if signal == Signal::SIGKILL {
            return self.exit(attempt, None, Some(Signal::SIGKILL as i32), false);
        }
        if let Some(r) = self.running.lock().expect("running").get(&attempt) {
            r.signalled.send_if_modified(|signalled| !std::mem::replace(signalled, true));
        }
    }

    fn post_members(&self, attempt: AttemptRef, members: Members) -> Option<MembersTarget> {
        let mut running = self.running.lock().expect("running");
        let r = running.get_mut(&attempt)?;
        if !members.supersedes(r.members.as_ref()) {
            return None;
        }
        r.members = Some(members);
        Some(MembersTarget { file: None })
    }

    fn post_notice(&self, attempt: AttemptRef, notice: Notice) -> Option<NoticeTarget> {
        let mut running = self.running.lock().expect("running");
        let r = running.get_mut(&attempt)?;
        if !notice.supersedes(r.notice.as_ref()) {
            return None;
        }
        r.notice = Some(notice);
        Some(NoticeTarget { drain_file: None, signal: r.signal })
    }
}

#[cfg(test)]
mod tests {
    use ebb_api::DrainAttempt;

    use super::*;
    use crate::drain;
    use crate::report::Queue;
    use ebb_core::{Attempt, JobId};

    const A: AttemptRef = AttemptRef { job: JobId(7), attempt: Attempt(1) };

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn start_of(a: AttemptRef, pairs: &[(&str, &str)]) -> StartAttempt {
        StartAttempt {
            attempt: a,
            tier: "preemptible".into(),
            argv: vec!["train".into()],
            env: env(pairs),
            workdir: None,
            gpus: vec![0, 1],
            signal: Signal::SIGUSR1 as i32,
            run_as: None,
            tenant: "default".into(),
            tenant_id: 1,
            rendezvous_port: None,
            image: None,
            time_limit_ms: None,
            slurm: None,
            when_gpus_free: false,
        }
    }

    fn node() -> (Arc<Simulated>, Queue) {
        let (reporter, queue) = Reporter::new(0);
        (Arc::new(Simulated::new("sim-00000", reporter, Default::default())), queue)
    }

    /// Two nodes of one fleet, reporting on one queue.
    fn two_nodes() -> (Arc<Simulated>, Arc<Simulated>, Queue) {
        let (reporter, queue) = Reporter::new(0);
        let checkpoints = Arc::new(FleetCheckpoints::default());
        let node = |name: &str| Arc::new(Simulated::new(name, reporter.clone(), checkpoints.clone()));
        (node("sim-00000"), node("sim-00001"), queue)
    }

    /// A reported event, with the second of the paused clock it came in.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Started,
        Output,
        Resumed { step: u64, at_s: u64 },
        Checkpoint { step: u64, took_ms: u64, at_s: u64 },
        Exited { code: Option<i32>, signal: Option<i32>, completed: bool, at_s: u64 },
    }

    /// Watches a node's reports on the paused clock, half a second after
    /// each whole second: an event is put in the second it was seen by
    /// (what a test does between two looks happens at the half second).
    struct Watch {
        queue: Queue,
        t0: Instant,
        second: u64,
        seen: Vec<Seen>,
    }

    impl Watch {
        fn new(queue: Queue) -> Watch {
            Watch { queue, t0: Instant::now(), second: 0, seen: Vec::new() }
        }

        /// Lets the clock run to half a second past second `s`.
        async fn to(&mut self, s: u64) {
            while self.second <= s {
                tokio::time::sleep_until(self.t0 + Duration::from_millis(self.second * 1000 + 500)).await;
                let at_s = self.second;
                while let Ok(event) = self.queue.try_recv() {
                    self.seen.push(match event {
                        AgentEvent::Started { pid: 0, .. } => Seen::Started,
                        AgentEvent::Output { .. } => Seen::Output,
                        AgentEvent::Resumed { step, .. } => Seen::Resumed { step: step.unwrap(), at_s },
                        AgentEvent::Checkpoint { step, duration_ms, .. } => {
                            Seen::Checkpoint { step: step.unwrap(), took_ms: duration_ms, at_s }
                        }
                        AgentEvent::Exited { code, signal, completed, .. } => {
                            Seen::Exited { code, signal, completed, at_s }
                        }
                        other => panic!("unexpected {other:?}"),
                    });
                }
                self.second += 1;
            }
        }
    }

    #[test]
    fn durations_are_seconds_or_spans_with_units() {
        assert_eq!(parse_span("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_span("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_span("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_span("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_span("0"), Ok(Duration::ZERO));
        assert!(parse_span("-1").is_err());
        assert!(parse_span("soon").is_err());
        assert_eq!(parse_span("400d"), Err(SpanError::TooLong));
        assert!(SpanError::TooLong.to_string().contains("at most a year"));
        let b = Behaviour::from_env(&env(&[])).unwrap();
        assert_eq!(
            b,
            Behaviour { duration: None, checkpoint_every: None, save: Duration::ZERO, ignore_notice: false }
        );
        let e = Behaviour::from_env(&env(&[("EBB_SIM_SAVE", "a while")])).unwrap_err();
        assert!(e.to_string().starts_with("EBB_SIM_SAVE=\"a while\": a number of seconds"), "{e}");
        assert!(Behaviour::from_env(&env(&[("EBB_SIM_CHECKPOINT", "0")])).is_err());
        assert!(Behaviour::from_env(&env(&[("EBB_SIM_IGNORE_NOTICE", "yes")])).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_checkpoints_every_interval_and_exits_complete_when_its_duration_ends() {
        let (sim, queue) = node();
        let mut watch = Watch::new(queue);
        sim.start(start_of(A, &[("EBB_SIM_DURATION", "10"), ("EBB_SIM_CHECKPOINT", "4s")])).await.unwrap();
        assert!(sim.is_running(A));
        watch.to(11).await;
        assert_eq!(
            watch.seen,
            [
                Seen::Started,
                Seen::Output,
                Seen::Checkpoint { step: 1, took_ms: 0, at_s: 4 },
                Seen::Checkpoint { step: 2, took_ms: 0, at_s: 8 },
                Seen::Exited { code: Some(0), signal: None, completed: true, at_s: 10 },
            ]
        );
        assert!(!sim.is_running(A));
    }

    #[tokio::test(start_paused = true)]
    async fn at_its_notice_a_job_saves_reports_a_checkpoint_and_exits_without_the_completion_mark() {
        let (sim, queue) = node();
        let mut watch = Watch::new(queue);
        sim.start(start_of(A, &[("EBB_SIM_CHECKPOINT", "3s"), ("EBB_SIM_SAVE", "2.25s")])).await.unwrap();
        watch.to(4).await;
        let now = now_ms();
        let d = DrainAttempt { attempt: A, notice_at_ms: now, deadline_ms: now + 30_000, reason: "x".into() };
        drain::drain(&sim, d);
        watch.to(9).await;
        assert_eq!(
            watch.seen,
            [
                Seen::Started,
                Seen::Output,
                Seen::Checkpoint { step: 1, took_ms: 0, at_s: 3 },
                Seen::Checkpoint { step: 2, took_ms: 2250, at_s: 7 },
                Seen::Exited { code: Some(0), signal: None, completed: false, at_s: 7 },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_that_ignores_its_notice_runs_until_sigkill_which_ends_it_at_once() {
        let (sim, queue) = node();
        let mut watch = Watch::new(queue);
        sim.start(start_of(A, &[("EBB_SIM_IGNORE_NOTICE", "1"), ("EBB_SIM_SAVE", "1")])).await.unwrap();
        sim.signal(A, Signal::SIGUSR1);
        sim.signal(A, Signal::SIGTERM);
        watch.to(4).await;
        assert!(sim.is_running(A));
        sim.signal(A, Signal::SIGKILL);
        sim.signal(A, Signal::SIGKILL);
        watch.to(8).await;
        assert_eq!(
            watch.seen,
            [
                Seen::Started,
                Seen::Output,
                Seen::Exited { code: None, signal: Some(9), completed: false, at_s: 5 },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sigkill_during_the_save_ends_the_job_with_no_checkpoint_after_its_exit() {
        let (sim, queue) = node();
        let mut watch = Watch::new(queue);
        sim.start(start_of(A, &[("EBB_SIM_SAVE", "10s"), ("EBB_SIM_DURATION", "5s")])).await.unwrap();
        sim.signal(A, Signal::SIGTERM);
        watch.to(5).await;
        assert!(sim.is_running(A), "from its signal on, it only saves");
        sim.signal(A, Signal::SIGKILL);
        watch.to(15).await;
        assert_eq!(
            watch.seen,
            [
                Seen::Started,
                Seen::Output,
                Seen::Exited { code: None, signal: Some(9), completed: false, at_s: 6 },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_whose_environment_is_wrong_does_not_start() {
        let (sim, mut queue) = node();
        let e = sim.start(start_of(A, &[("EBB_SIM_DURATION", "ten")])).await.unwrap_err();
        assert!(e.to_string().starts_with("EBB_SIM_DURATION=\"ten\""), "{e}");
        assert!(!sim.is_running(A));
        assert!(queue.try_recv().is_err(), "nothing reported");
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_notice_is_posted_once_and_a_sooner_one_replaces_it() {
        let (sim, _queue) = node();
        sim.start(start_of(A, &[])).await.unwrap();
        let drain = Notice::new(1, 60_000, "preempted".into());
        let target = sim.post_notice(A, drain.clone()).unwrap();
        assert_eq!(target, NoticeTarget { drain_file: None, signal: Signal::SIGUSR1 });
        assert_eq!(sim.post_notice(A, drain), None);
        assert!(sim.post_notice(A, Notice::cancel(2, 10_000)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_attempt_on_another_node_resumes_from_the_saved_step_and_runs_what_is_left() {
        let (first, second, queue) = two_nodes();
        let mut watch = Watch::new(queue);
        let job = [("EBB_SIM_DURATION", "10"), ("EBB_SIM_CHECKPOINT", "3s"), ("EBB_SIM_SAVE", "1.25")];
        first.start(start_of(A, &job)).await.unwrap();
        // Its notice at 4.5 s: it saves the 4.5 s of work done as step 2.
        watch.to(4).await;
        let now = now_ms();
        let d = DrainAttempt { attempt: A, notice_at_ms: now, deadline_ms: now + 30_000, reason: "x".into() };
        drain::drain(&first, d);
        watch.to(6).await;
        assert_eq!(
            first.checkpoints.newest(A.job),
            Some(Saved { attempt: Attempt(1), step: 2, work: ms(4_500) })
        );
        // Attempt 2 on the other node at 6.75 s: 5.5 s left, steps from 3.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let next = AttemptRef { job: A.job, attempt: Attempt(2) };
        second.start(start_of(next, &job)).await.unwrap();
        watch.to(14).await;
        assert_eq!(
            watch.seen,
            [
                Seen::Started,
                Seen::Output,
                Seen::Checkpoint { step: 1, took_ms: 0, at_s: 3 },
                Seen::Checkpoint { step: 2, took_ms: 1250, at_s: 6 },
                Seen::Exited { code: Some(0), signal: None, completed: false, at_s: 6 },
                Seen::Started,
                Seen::Output,
                Seen::Resumed { step: 2, at_s: 7 },
                Seen::Checkpoint { step: 3, took_ms: 0, at_s: 10 },
                Seen::Exited { code: Some(0), signal: None, completed: true, at_s: 12 },
            ]
        );
        // Done, the job is forgotten: nothing to resume from again.
        assert_eq!(second.checkpoints.newest(A.job), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_says_where_it_resumes_from_and_how_long_it_has_left() {
        let (first, second, _queue) = two_nodes();
        let job = [("EBB_SIM_DURATION", "1m"), ("EBB_SIM_CHECKPOINT", "20s")];
        first.start(start_of(A, &job)).await.unwrap();
        assert_eq!(
            first_line("sim-00000", &Behaviour::from_env(&env(&job)).unwrap(), None),
            "simulated attempt on sim-00000: runs for 1m\n"
        );
        tokio::time::sleep(Duration::from_secs(45)).await;
        first.signal(A, Signal::SIGKILL);
        let saved = second.checkpoints.newest(A.job).expect("saved");
        assert_eq!(saved, Saved { attempt: Attempt(1), step: 2, work: ms(40_000) });
        let line = first_line("sim-00001", &Behaviour::from_env(&env(&job)).unwrap(), Some(saved));
        assert_eq!(
            line,
            "simulated attempt on sim-00001: resumes from step 2 (40s of work saved), runs for 20s\n"
        );
    }

    #[test]
    fn the_newest_checkpoint_is_the_greatest_attempt_and_step_not_the_last_to_arrive() {
        let fleet = FleetCheckpoints::default();
        assert_eq!(fleet.newest(JobId(7)), None);
        let saved = |attempt, step, s| Saved { attempt, step, work: Duration::from_secs(s) };
        fleet.saved(JobId(7), saved(Attempt(1), 4, 40));
        fleet.saved(JobId(7), saved(Attempt(2), 5, 50));
        // Attempt 1, on a node cut off from the server, saves on.
        fleet.saved(JobId(7), saved(Attempt(1), 6, 60));
        assert_eq!(fleet.newest(JobId(7)), Some(saved(Attempt(2), 5, 50)));
        fleet.saved(JobId(7), saved(Attempt(2), 6, 55));
        assert_eq!(fleet.newest(JobId(7)), Some(saved(Attempt(2), 6, 55)));
        fleet.saved(JobId(8), saved(Attempt(1), 1, 10));
        fleet.forget(JobId(7));
        assert_eq!((fleet.newest(JobId(7)), fleet.newest(JobId(8))), (None, Some(saved(Attempt(1), 1, 10))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_job_is_forgotten_and_a_drained_one_is_not() {
        let (sim, _queue) = node();
        let job = [("EBB_SIM_CHECKPOINT", "1s")];
        let drained = AttemptRef { job: JobId(8), attempt: Attempt(1) };
        for a in [A, drained] {
            sim.start(start_of(a, &job)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let now = now_ms();
        drain::drain(
            &sim,
            DrainAttempt {
                attempt: drained,
                notice_at_ms: now,
                deadline_ms: now + 30_000,
                reason: "x".into(),
            },
        );
        assert!(sim.post_notice(A, Notice::cancel(now, now + 10_000)).is_some());
        sim.signal(A, Signal::SIGTERM);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!sim.is_running(A) && !sim.is_running(drained));
        assert_eq!(sim.checkpoints.newest(A.job), None, "cancelled: it will not run again");
        assert_eq!(sim.checkpoints.newest(drained.job).map(|s| s.step), Some(3), "requeued: it resumes");
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }
}
