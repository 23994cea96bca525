//! The agent's part of the protocol: register, then follow the command
//! stream, carrying each command out through the [`Supervisor`]; register
//! again whenever the server says so (it restarted, or declared this node
//! lost).
//!
//! The poll is the node's heartbeat, so no command holds it up: starts run
//! side by side; a stop, a drain or a cancel (a notice file and a signal)
//! is done in the loop before the next poll goes out; and a command for an
//! attempt whose earlier command is still under way (its start, above all)
//! runs after it, so that a drain finds its attempt running. Failed calls are retried after jittered
//! waits ([`crate::retry`]), and so is registering again with a server
//! that restarted: every agent learns of the restart at the same moment.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::Retryable;
use ebb_api::{Action, AgentEvent, AttemptRef, Register, Registered, StartAttempt};
use tokio::task::JoinHandle;

use crate::checkpoints::Checkpoints;
use crate::client::{CallError, Client};
use crate::drain;
use crate::report::{now_ms, Reporter};
use crate::retry;
use crate::supervisor::Supervisor;

/// How long to wait before trying again with a refused credential: the
/// operator has to act, so there is no point in asking often.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// What the node says of itself when it registers.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub name: String,
    pub gpu_model: String,
    pub gpus: u8,
    pub labels: BTreeMap<String, String>,
    /// Where other nodes reach this one (a gang's `MASTER_ADDR`).
    pub address: String,
    /// How long reports may keep failing before the poll says the node is
    /// unhealthy.
    pub unhealthy_after: Duration,
}

/// The agent: the server on one side, its attempts on the other.
pub(crate) struct Agent<S> {
    pub node: Node,
    pub client: Arc<Client>,
    pub reporter: Arc<Reporter>,
    pub supervisor: Arc<S>,
    /// How many times the server has taken this node's registration (a
    /// simulated fleet counts its nodes that joined by it).
    pub registrations: AtomicU64,
    /// The checkpoint store the server names at registration; none where
    /// attempts write no files (a simulated fleet).
    pub checkpoints: Option<Arc<Checkpoints>>,
    /// The node's health, reported with every registration; none for a
    /// simulated fleet.
    pub health: Option<Arc<crate::health::Monitor>>,
}

/// Commands under way, by attempt.
type Pending = HashMap<AttemptRef, JoinHandle<()>>;

/// How the node registers again.
#[derive(Debug, PartialEq, Eq)]
enum Rejoin {
    /// After a jittered pause: the server said so, because it restarted
    /// (every agent hears of that at the same moment) or lost this node.
    Spread,
    /// At once: the node has waited already (its credential was refused).
    Now,
}

impl<S: Supervisor> Agent<S> {
    /// Registers, then follows the command stream, for ever.
    pub(crate) async fn follow(self: Arc<Self>) {
        let mut pending = Pending::new();
        loop {
            let registered = self.register().await;
            if self.follow_from(registered, &mut pending).await == Rejoin::Spread {
                tokio::time::sleep(retry::REGISTRATION.delays().next_wait()).await;
            }
        }
    }

    /// Registers, retrying until the server takes it.
    async fn register(&self) -> Registered {
        loop {
            let registered = (|| self.register_once())
                .retry(retry::REGISTRATION)
                .when(|e| !matches!(e, CallError::Unauthorized(_)))
                .notify(|e, _| tracing::warn!("cannot register with {}: {e:?}", self.client.server()))
                .await;
            match registered {
                Ok(registered) => {
                    self.registrations.fetch_add(1, Ordering::Relaxed);
                    return registered;
                }
                Err(CallError::Unauthorized(why)) => {
                    self.credential_refused(&why);
                    tokio::time::sleep(REFUSED_RETRY).await;
                }
                Err(e) => tracing::warn!("cannot register with {}: {e:?}", self.client.server()),
            }
        }
    }

    /// What the server has not accepted yet, and the node's health as it
    /// is now: a restarted server learns it, and a finding that cleared
    /// while the agent was away is seen to have.
    fn unreported(&self) -> Vec<AgentEvent> {
        let mut events = self.reporter.unreported();
        if let Some(health) = &self.health {
            events.push(AgentEvent::Health { findings: health.current(), at_ms: crate::report::now_ms() });
        }
        events
    }

    async fn register_once(&self) -> Result<Registered, CallError> {
        let body = Register {
            node: self.node.name.clone(),
            gpu_model: self.node.gpu_model.clone(),
            gpus: self.node.gpus,
            labels: self.node.labels.clone(),
            running: self.supervisor.running(),
            address: Some(self.node.address.clone()),
            unreported: self.unreported(),
            starts_when_free: S::STARTS_WHEN_FREE,
            waiting: self.supervisor.waiting(),
            cpus: crate::host::cpus(),
            memory_mib: crate::host::memory_mib(),
        };
        let registered = self.client.register(&body).await?;
        tracing::info!(node = self.node.name, gpus = self.node.gpus, "registered");
        if let Some(checkpoints) = &self.checkpoints {
            if let Err(e) = checkpoints.configure(registered.checkpoint_store.as_ref()) {
                // Jobs started here would lose their checkpoints to the
                // node: the operator must give this agent what it needs.
                tracing::error!("{e}");
                eprintln!("ebb agent: {e}");
                std::process::exit(78);
            }
        }
        drain::kill_stale(&*self.supervisor, &registered.kill, "the server no longer runs this attempt");
        Ok(registered)
    }

    /// Follows the command stream until the node must register again.
    async fn follow_from(self: &Arc<Self>, registered: Registered, pending: &mut Pending) -> Rejoin {
        let mut after = registered.next_seq;
        // The server answers within an interval; one that has not answered
        // a few seconds later is frozen or cut off, and the next server of
        // the list is tried (see `Client::call`).
        let timeout = Duration::from_millis(registered.heartbeat_interval_ms) + Duration::from_secs(4);
        let mut failures: Option<retry::Delays> = None;
        loop {
            // The poll is the heartbeat: it says when reports keep failing.
            let failing = self.reporter.failing(Instant::now(), self.node.unhealthy_after);
            if let Some(why) = &failing {
                tracing::warn!("telling the server this node is unhealthy: {why}");
            }
            match self.client.poll(&self.node.name, registered.epoch, after, timeout, failing).await {
                Ok(commands) => {
                    failures = None;
                    for command in commands.commands {
                        after = command.seq;
                        self.execute(command.action, pending);
                    }
                    self.supervisor.ready_notices();
                }
                Err(CallError::Reregister(why)) => {
                    tracing::warn!("registering again: {why}");
                    return Rejoin::Spread;
                }
                Err(CallError::Unauthorized(why)) => {
                    self.credential_refused(&why);
                    tokio::time::sleep(REFUSED_RETRY).await;
                    return Rejoin::Now;
                }
                Err(e) => {
                    tracing::warn!("command poll failed: {e}");
                    let delays = failures.get_or_insert_with(|| retry::POLLS.delays());
                    tokio::time::sleep(delays.next_wait()).await;
                }
            }
        }
    }

    /// Carries out a command of the server's without waiting for it: a
    /// stop, a drain or a cancel at once (a notice file and a signal, before
    /// the next poll goes out), a start as a task of its own; any of them
    /// after the attempt's command under way if there is one.
    fn execute(self: &Arc<Self>, action: Action, pending: &mut Pending) {
        pending.retain(|_, task| !task.is_finished());
        let attempt = match &action {
            Action::Start(start) => {
                if start.when_gpus_free {
                    // Before its task runs: a stop that follows withdraws it.
                    self.supervisor.hold_back(start.attempt);
                }
                start.attempt
            }
            Action::Drain(drain) => {
                // A start still pulling its image goes without starting:
                // the pull would hold the GPUs past the deadline.
                let why = "drained while its image was being pulled: not started";
                self.supervisor.abandon(drain.attempt, why);
                drain.attempt
            }
            Action::Members(members) => members.attempt,
            Action::Stop { attempt, notice, .. } => {
                // A start held back for its GPUs, or still pulling its
                // image, goes without starting.
                self.supervisor.withdraw(*attempt);
                let why = match notice {
                    Some(_) => "cancelled while its image was being pulled: not started",
                    None => "stopped while its image was being pulled: not started",
                };
                self.supervisor.abandon(*attempt, why);
                *attempt
            }
            Action::Signal { attempt, signal, batch_only, full } => {
                use crate::slurm::Route;
                let route = match (batch_only, full) {
                    (true, _) => Route::Batch,
                    (false, true) => Route::Full,
                    (false, false) => Route::Steps,
                };
                if let Ok(signal) = nix::sys::signal::Signal::try_from(*signal) {
                    self.supervisor.pass_signal(*attempt, signal, route);
                }
                return;
            }
        };
        let before = pending.remove(&attempt);
        if before.is_none() {
            // The common case: at once.
            match action {
                Action::Stop { attempt, grace_ms, notice: None } => {
                    return drain::stop(&self.supervisor, attempt, Duration::from_millis(grace_ms))
                }
                Action::Stop { attempt, notice: Some(notice), .. } => {
                    return drain::cancel(&self.supervisor, attempt, notice)
                }
                Action::Drain(d) => return drain::drain(&self.supervisor, d),
                Action::Members(m) => return drain::members(&*self.supervisor, m),
                _ => {}
            }
        }
        let agent = self.clone();
        let task = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            match action {
                Action::Start(start) => agent.start(start).await,
                Action::Drain(d) => drain::drain(&agent.supervisor, d),
                Action::Members(m) => drain::members(&*agent.supervisor, m),
                Action::Stop { attempt, notice: Some(notice), .. } => {
                    drain::cancel(&agent.supervisor, attempt, notice)
                }
                Action::Stop { attempt, grace_ms, notice: None } => {
                    drain::stop(&agent.supervisor, attempt, Duration::from_millis(grace_ms))
                }
                Action::Signal { .. } => {}
            }
        });
        pending.insert(attempt, task);
    }

    /// Starts an attempt; one that cannot start is reported as having
    /// exited with 127, with why in its log and in the exit itself (for
    /// the job's timeline).
    async fn start(&self, s: StartAttempt) {
        let a = s.attempt;
        // A start held back for its GPUs (`execute`) waits no longer once
        // this returns, whichever way.
        let _held = s.when_gpus_free.then(|| Held(&*self.supervisor, a));
        if self.supervisor.is_running(a) {
            // A repeated command (one that came while the first was under
            // way ran after it).
            return;
        }
        if let Some(port) = s.rendezvous_port.filter(|p| !self.supervisor.port_free(*p)) {
            // Another program listens there: the gang's ranks could never
            // meet. The server requeues it with another port.
            let message = format!(
                "the gang's rendezvous port {port} (MASTER_PORT) is in use on this node by another program: \
                 not started; the server requeues the gang with another port"
            );
            tracing::warn!(job = %a.job, attempt = %a.attempt, "{message}");
            self.reporter.send(AgentEvent::Output { attempt: a, data: format!("ebb: {message}\n") });
            self.reporter.send(AgentEvent::Exited {
                attempt: a,
                code: None,
                signal: None,
                completed: false,
                at_ms: now_ms(),
                peak_memory_bytes: None,
                start_error: Some(message),
                port_in_use: Some(port),
                ended_by: None,
            });
            return;
        }
        if let Err(failed) = self.supervisor.start(s).await {
            let message = failed.to_string();
            tracing::error!(job = %a.job, attempt = %a.attempt, "{message}");
            self.reporter.send(AgentEvent::Output { attempt: a, data: format!("ebb: {message}\n") });
            self.reporter.send(AgentEvent::Exited {
                attempt: a,
                code: Some(127),
                signal: None,
                completed: false,
                at_ms: now_ms(),
                peak_memory_bytes: None,
                // The program's name is the submitter's, up to 128 KiB.
                start_error: Some(message.chars().take(ebb_api::MAX_START_ERROR_CHARS).collect()),
                port_in_use: None,
                ended_by: None,
            });
        }
    }

    /// The server refused this node's credential: it was revoked, so the
    /// server no longer holds anything this agent runs. Says what the
    /// operator must do, and stops the attempts (they were requeued
    /// elsewhere).
    fn credential_refused(&self, why: &str) {
        let name = &self.node.name;
        tracing::error!(
            "the server refused node {name}'s credential: {why}. This agent cannot take part until the \
             operator acts: to rejoin, delete {} and restart the agent, which then registers with the join \
             token (after `ebb nodes remove {name}` if the server still holds a credential for it). \
             Retrying every {}s",
            self.client.credential_path().display(),
            REFUSED_RETRY.as_secs(),
        );
        let running = self.supervisor.running();
        drain::kill_stale(
            &*self.supervisor,
            &running,
            "the node's credential was revoked and its attempts requeued",
        );
    }
}

/// A start held back for its GPUs, waiting until dropped.
struct Held<'a, S: Supervisor>(&'a S, AttemptRef);

impl<S: Supervisor> Drop for Held<'_, S> {
    fn drop(&mut self) {
        self.0.let_go(self.1);
    }
}

#[cfg(test)]
mod tests {
    use ebb_api::DrainAttempt;
    use nix::sys::signal::Signal;

    use super::*;
    use crate::supervisor::fake::Op;
    use crate::testing::{self, until, FakeServer};
    use ebb_core::{Attempt, JobId};

    const A: AttemptRef = AttemptRef { job: JobId(1), attempt: Attempt(1) };
    const B: AttemptRef = AttemptRef { job: JobId(2), attempt: Attempt(1) };

    fn start_of(attempt: AttemptRef) -> Action {
        Action::Start(StartAttempt {
            attempt,
            tier: "spot".into(),
            argv: vec!["train".into()],
            env: BTreeMap::new(),
            workdir: None,
            gpus: vec![0],
            signal: Signal::SIGUSR1 as i32,
            run_as: None,
            tenant: String::new(),
            tenant_id: 1,
            rendezvous_port: None,
            image: None,
            time_limit_ms: None,
            slurm: None,
            when_gpus_free: false,
        })
    }

    #[tokio::test]
    async fn failing_reports_make_the_poll_say_unhealthy_until_they_get_through() {
        let fake = Arc::new(FakeServer::default());
        fake.broken.store(true, Ordering::SeqCst);
        let agent = testing::agent(fake.clone(), "unhealthy").await;
        agent.reporter.send(AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 });
        until("a poll says unhealthy", || fake.polls.lock().unwrap().iter().any(Option::is_some)).await;
        let why = fake.polls.lock().unwrap().iter().flatten().next().cloned().unwrap();
        assert!(why.contains("reports failing for") && why.contains("503"), "{why}");

        fake.broken.store(false, Ordering::SeqCst);
        until("the start is delivered", || !fake.delivered().is_empty()).await;
        let seen = fake.polls.lock().unwrap().len();
        until("a poll says healthy", || fake.polls.lock().unwrap()[seen..].iter().any(Option::is_none)).await;
        assert!(agent.reporter.unreported().is_empty());
    }

    #[tokio::test]
    async fn a_start_that_cannot_run_is_reported_as_an_exit_of_127_saying_why() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "refused-start").await;
        agent.supervisor.refuse_starts("run-as user alice: no such user on this node");
        fake.commands.lock().unwrap().push(start_of(A));
        let exited = |e: &AgentEvent| matches!(e, AgentEvent::Exited { code: Some(127), .. });
        until("the exit is delivered", || fake.delivered().iter().any(exited)).await;
        let delivered = fake.delivered();
        assert_eq!(
            delivered[0],
            AgentEvent::Output {
                attempt: A,
                data: "ebb: run-as user alice: no such user on this node\n".into()
            }
        );
        assert!(matches!(
            &delivered[1],
            AgentEvent::Exited { attempt: A, signal: None, completed: false, start_error: Some(why), .. }
                if why == "run-as user alice: no such user on this node"
        ));
    }

    /// A gang's first node checks its rendezvous port before the start:
    /// taken by another program, nothing starts and the exit says which.
    #[tokio::test]
    async fn a_gang_start_whose_rendezvous_port_is_taken_is_reported_and_not_started() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "port-taken").await;
        let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let Action::Start(mut start) = start_of(A) else { unreachable!() };
        start.rendezvous_port = Some(port);
        fake.commands.lock().unwrap().push(Action::Start(start));
        let exited = |e: &AgentEvent| matches!(e, AgentEvent::Exited { port_in_use: Some(_), .. });
        until("the exit is delivered", || fake.delivered().iter().any(exited)).await;
        assert!(agent.supervisor.ops().is_empty(), "it started");
        let delivered = fake.delivered();
        assert!(delivered.iter().any(|e| matches!(e,
            AgentEvent::Exited { attempt: A, code: None, port_in_use: Some(p), .. } if *p == port)));
        // A free port starts as any start does.
        drop(taken);
        let Action::Start(mut start) = start_of(B) else { unreachable!() };
        start.rendezvous_port = Some(port);
        fake.commands.lock().unwrap().push(Action::Start(start));
        agent.supervisor.until("the start", |ops| ops.contains(&Op::Start(B))).await;
    }

    /// A start held back for its GPUs waits from its command until it
    /// runs, cannot start, or turns out to be a repeat of one running:
    /// then the node no longer says it waits (at its next registration).
    #[tokio::test]
    async fn a_held_back_start_waits_no_longer_once_it_ran_failed_or_repeated() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "held-back").await;
        let held_back = |attempt: AttemptRef, port: Option<u16>| {
            let Action::Start(mut start) = start_of(attempt) else { unreachable!() };
            start.when_gpus_free = true;
            start.rendezvous_port = port;
            Action::Start(start)
        };
        let let_go = |a: AttemptRef| {
            let agent = agent.clone();
            move || {
                agent.supervisor.ops().contains(&Op::HoldBack(a)) && !agent.supervisor.waiting().contains(&a)
            }
        };
        // Started.
        fake.commands.lock().unwrap().push(held_back(A, None));
        agent.supervisor.until("the start", |ops| ops.contains(&Op::Start(A))).await;
        until("A let go", let_go(A)).await;
        // A repeat of a start that runs.
        fake.commands.lock().unwrap().push(held_back(A, None));
        until("A held back again", || {
            agent.supervisor.ops().iter().filter(|o| **o == Op::HoldBack(A)).count() == 2
        })
        .await;
        until("A let go again", let_go(A)).await;
        // Its gang's port taken: not started, reported.
        let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        fake.commands.lock().unwrap().push(held_back(B, Some(port)));
        let exited =
            |e: &AgentEvent| matches!(e, AgentEvent::Exited { attempt: B, port_in_use: Some(_), .. });
        until("B's exit", || fake.delivered().iter().any(exited)).await;
        until("B let go", let_go(B)).await;
        assert!(!agent.supervisor.ops().contains(&Op::Start(B)));
    }

    /// A registry that trickles its layers held a whole cluster's GPUs:
    /// the cancel printed `stopping` and nothing stopped until the pull
    /// was done; a drain's deadline passed. A stop, a cancel or a drain
    /// now gives up a start still pulling, at once: it ends not started.
    #[tokio::test]
    async fn a_cancel_or_a_drain_gives_up_a_start_still_pulling_its_image() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "abandon-pull").await;
        agent.supervisor.pull_starts();
        agent.supervisor.open_starts(false);
        let now = now_ms();
        let notice = ebb_api::StopNotice { notice_at_ms: now, deadline_ms: now + 60_000 };
        let drain = DrainAttempt {
            attempt: B,
            notice_at_ms: now,
            deadline_ms: now + 60_000,
            reason: "preempted".into(),
        };
        fake.commands.lock().unwrap().extend([
            start_of(A),
            start_of(B),
            Action::Stop { attempt: A, grace_ms: 10_000, notice: Some(notice) },
            Action::Drain(drain),
        ]);
        let ended = |a: AttemptRef, said: &'static str| move |e: &AgentEvent| matches!(e, AgentEvent::Exited { attempt, start_error: Some(why), .. } if *attempt == a && why.contains(said));
        until("A's exit", || {
            fake.delivered().iter().any(ended(A, "cancelled while its image was being pulled"))
        })
        .await;
        until("B's exit", || {
            fake.delivered().iter().any(ended(B, "drained while its image was being pulled"))
        })
        .await;
        agent.supervisor.open_starts(true);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(agent.supervisor.ops().is_empty(), "nothing started: {:?}", agent.supervisor.ops());
    }

    #[tokio::test]
    async fn a_drain_that_comes_with_its_start_is_delivered_once_the_attempt_runs() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "drain-after-start").await;
        agent.supervisor.open_starts(false);
        let now = now_ms();
        let drain = DrainAttempt {
            attempt: A,
            notice_at_ms: now,
            deadline_ms: now + 60_000,
            reason: "preempted".into(),
        };
        fake.commands.lock().unwrap().extend([start_of(A), Action::Drain(drain)]);
        // Both were taken, and the poll after them shows they were handed on.
        until("the commands are taken", || fake.commands.lock().unwrap().is_empty()).await;
        let polls = fake.polls.lock().unwrap().len();
        until("the next poll", || fake.polls.lock().unwrap().len() > polls).await;
        assert!(agent.supervisor.ops().is_empty(), "the start is held");
        agent.supervisor.open_starts(true);
        agent.supervisor.until("the drain's signal", |ops| ops.len() == 3).await;
        assert_eq!(
            agent.supervisor.ops(),
            vec![
                Op::Start(A),
                Op::Notice(A),
                Op::Signal { attempt: A, signal: Signal::SIGUSR1, notice_file: true }
            ]
        );
    }

    #[tokio::test]
    async fn after_a_server_restart_the_node_registers_again_with_what_it_runs_and_has_not_reported() {
        let fake = Arc::new(FakeServer::default());
        let agent = testing::agent(fake.clone(), "restart").await;
        until("the node registers", || fake.registrations.lock().unwrap().len() == 1).await;
        agent.supervisor.run(A, Signal::SIGTERM);
        agent.supervisor.run(B, Signal::SIGTERM);
        fake.broken.store(true, Ordering::SeqCst);
        let started = AgentEvent::Started { attempt: B, pid: 7, at_ms: 3 };
        agent.reporter.send(started.clone());
        // The restarted server holds B, not A.
        *fake.kill.lock().unwrap() = vec![A];
        fake.restarted.store(true, Ordering::SeqCst);
        until("the node registers again", || fake.registrations.lock().unwrap().len() == 2).await;
        let again = fake.registrations.lock().unwrap()[1].clone();
        assert_eq!(again.running, vec![A, B]);
        assert_eq!(again.unreported, vec![started]);
        agent.supervisor.until("A is killed", |ops| !ops.is_empty()).await;
        assert_eq!(
            agent.supervisor.ops(),
            vec![Op::Signal { attempt: A, signal: Signal::SIGKILL, notice_file: false }]
        );
        assert_eq!(agent.supervisor.running(), vec![B]);
    }
}
