//! A supervisor without processes, for tests. It records what it is asked
//! to do; an attempt "runs" from its start until SIGKILL or
//! [`FakeSupervisor::exit`], and its start and exit are reported as the
//! real supervisor reports them.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::{AgentEvent, AttemptRef, StartAttempt};
use nix::sys::signal::Signal;
use tokio::sync::watch;

use super::{MembersTarget, NoticeTarget, StartError, Supervisor};
use crate::notice::{Members, Notice};
use crate::report::{now_ms, Queue, Reporter};

/// What the fake was asked to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A start to be held back until its GPUs are free came.
    HoldBack(AttemptRef),
    Start(AttemptRef),
    Notice(AttemptRef),
    /// A change of nodes posted.
    Members(AttemptRef),
    /// A signal to a running attempt, and whether its notice file existed
    /// when it was sent.
    Signal {
        attempt: AttemptRef,
        signal: Signal,
        notice_file: bool,
    },
}

pub(crate) struct FakeSupervisor {
    reporter: Arc<Reporter>,
    /// Where the attempts' notice files go.
    dir: PathBuf,
    state: Mutex<State>,
    /// Starts wait while this is false.
    starts_open: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    /// Running attempts: the signal each asked for, and its notice.
    running: BTreeMap<AttemptRef, (Signal, Option<Notice>)>,
    /// Each running attempt's latest change of nodes.
    members: BTreeMap<AttemptRef, Members>,
    ops: Vec<Op>,
    refuse_starts: Option<String>,
    /// Starts held back, and whether each was withdrawn.
    held: BTreeMap<AttemptRef, bool>,
    /// Starts that wait (`open_starts(false)`) are pulling their image,
    /// and may be abandoned.
    pulling: bool,
    /// Pulls abandoned, and why.
    abandoned: BTreeMap<AttemptRef, String>,
}

impl Drop for FakeSupervisor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl FakeSupervisor {
    /// A fake reporting to a reporter of its own, whose queue is returned.
    pub(crate) fn new(name: &str) -> (Arc<FakeSupervisor>, Queue) {
        let (reporter, queue) = Reporter::new(0);
        (FakeSupervisor::with_reporter(name, reporter), queue)
    }

    pub(crate) fn with_reporter(name: &str, reporter: Arc<Reporter>) -> Arc<FakeSupervisor> {
        let dir = std::env::temp_dir().join(format!("ebb-fake-supervisor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (starts_open, _) = watch::channel(true);
        Arc::new(FakeSupervisor { reporter, dir, state: Mutex::default(), starts_open })
    }

    /// An attempt running already, whose drain signal is `signal`.
    pub(crate) fn run(&self, attempt: AttemptRef, signal: Signal) {
        self.state.lock().unwrap().running.insert(attempt, (signal, None));
    }

    /// The attempt's process exits with `code`.
    pub(crate) fn exit(&self, attempt: AttemptRef, code: Option<i32>) {
        if self.state.lock().unwrap().running.remove(&attempt).is_some() {
            self.report_exit(attempt, code, None);
        }
    }

    fn report_exit(&self, attempt: AttemptRef, code: Option<i32>, signal: Option<i32>) {
        self.reporter.send(AgentEvent::Exited {
            attempt,
            code,
            signal,
            completed: false,
            at_ms: now_ms(),
            peak_memory_bytes: None,
            start_error: None,
            port_in_use: None,
            ended_by: None,
        });
    }

    pub(crate) fn members_file(&self, attempt: AttemptRef) -> PathBuf {
        self.dir.join(format!("members-{}-{}.json", attempt.job, attempt.attempt))
    }

    pub(crate) fn drain_file(&self, attempt: AttemptRef) -> PathBuf {
        self.dir.join(format!("drain-{}-{}.json", attempt.job, attempt.attempt))
    }

    pub(crate) fn ops(&self) -> Vec<Op> {
        self.state.lock().unwrap().ops.clone()
    }

    /// Starts wait until `open`.
    pub(crate) fn open_starts(&self, open: bool) {
        self.starts_open.send_replace(open);
    }

    /// Starts that wait are pulling their image: a stop or a drain gives
    /// them up.
    pub(crate) fn pull_starts(&self) {
        self.state.lock().unwrap().pulling = true;
    }

    /// Every start fails, saying `why`.
    pub(crate) fn refuse_starts(&self, why: &str) {
        self.state.lock().unwrap().refuse_starts = Some(why.to_string());
    }

    /// Waits until what was done so far satisfies `done`.
    pub(crate) async fn until(&self, what: &str, done: impl Fn(&[Op]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&self.ops()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}", self.ops());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Supervisor for FakeSupervisor {
    fn running(&self) -> Vec<AttemptRef> {
        self.state.lock().unwrap().running.keys().copied().collect()
    }

    fn is_running(&self, attempt: AttemptRef) -> bool {
        self.state.lock().unwrap().running.contains_key(&attempt)
    }

    fn under_notice(&self, attempt: AttemptRef, deadline_ms: u64) -> bool {
        let state = self.state.lock().unwrap();
        state
            .running
            .get(&attempt)
            .is_some_and(|(_, n)| n.as_ref().is_some_and(|n| n.deadline_ms == deadline_ms))
    }

    fn hold_back(&self, attempt: AttemptRef) {
        let mut state = self.state.lock().unwrap();
        state.ops.push(Op::HoldBack(attempt));
        state.held.entry(attempt).or_insert(false);
    }

    fn let_go(&self, attempt: AttemptRef) {
        self.state.lock().unwrap().held.remove(&attempt);
    }

    fn waiting(&self) -> Vec<AttemptRef> {
        let state = self.state.lock().unwrap();
        state.held.iter().filter(|(_, withdrawn)| !**withdrawn).map(|(a, _)| *a).collect()
    }

    fn withdraw(&self, attempt: AttemptRef) -> bool {
        self.state.lock().unwrap().held.get_mut(&attempt).map(|w| *w = true).is_some()
    }

    fn abandon(&self, attempt: AttemptRef, why: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let pulling = state.pulling && !*self.starts_open.borrow() && !state.running.contains_key(&attempt);
        if pulling {
            state.abandoned.insert(attempt, why.to_string());
        }
        pulling
    }

    fn start(self: &Arc<Self>, start: StartAttempt) -> impl Future<Output = Result<(), StartError>> + Send {
        let fake = self.clone();
        async move {
            let a = start.attempt;
            let mut open = fake.starts_open.subscribe();
            while !*open.borrow_and_update() {
                if let Some(why) = fake.state.lock().unwrap().abandoned.remove(&a) {
                    return Err(StartError::Abandoned(why));
                }
                let _ = tokio::time::timeout(Duration::from_millis(5), open.changed()).await;
            }
            {
                let mut state = fake.state.lock().unwrap();
                if let Some(why) = &state.refuse_starts {
                    return Err(StartError::Refused(why.clone()));
                }
                state.ops.push(Op::Start(a));
                let signal = Signal::try_from(start.signal).unwrap_or(Signal::SIGTERM);
                state.running.insert(a, (signal, None));
            }
            fake.reporter.send(AgentEvent::Started { attempt: a, pid: 1, at_ms: now_ms() });
            Ok(())
        }
    }

    fn signal(&self, attempt: AttemptRef, signal: Signal) {
        let notice_file = self.drain_file(attempt).exists();
        let mut state = self.state.lock().unwrap();
        if !state.running.contains_key(&attempt) {
            return;
        }
        state.ops.push(Op::Signal { attempt, signal, notice_file });
        if signal == Signal::SIGKILL {
            state.running.remove(&attempt);
            drop(state);
            self.report_exit(attempt, None, Some(libc::SIGKILL));
        }
    }

    fn post_members(&self, attempt: AttemptRef, members: Members) -> Option<MembersTarget> {
        let mut state = self.state.lock().unwrap();
        if !state.running.contains_key(&attempt) || !members.supersedes(state.members.get(&attempt)) {
            return None;
        }
        state.members.insert(attempt, members);
        state.ops.push(Op::Members(attempt));
        Some(MembersTarget { file: Some(self.members_file(attempt)) })
    }

    fn post_notice(&self, attempt: AttemptRef, notice: Notice) -> Option<NoticeTarget> {
        let mut state = self.state.lock().unwrap();
        let (signal, current) = state.running.get_mut(&attempt)?;
        if !notice.supersedes(current.as_ref()) {
            return None;
        }
        *current = Some(notice);
        let signal = *signal;
        state.ops.push(Op::Notice(attempt));
        Some(NoticeTarget { drain_file: Some(self.drain_file(attempt)), signal })
    }
}
