//! Quiet polls answered without the writer. A node that runs nothing,
//! is healthy and has no command waiting asks the same question every
//! heartbeat interval and gets the same empty answer; at 10,000 nodes
//! that is thousands of polls a second, each a trip to the writer thread
//! and back. The writer marks such a node *quiet* in its [`Line`] when
//! it takes one of its polls; the
//! HTTP handler answers a quiet node's poll from the line, notes when it
//! came, and waits on the node's command stream as any poll does. The
//! writer applies the noted contact on its tick, and at once for a node
//! it would otherwise find silent past the timeout.
//!
//! The line is only a cache of "nothing to say": whatever is not plainly
//! quiet — a command waiting, a node that says it is failing, one lost,
//! removed, running work, or a server that no longer leads — goes to the
//! writer as before. One more contact is noted here: a poll the writer
//! had taken, woken by a commit that gave its node commands, is answered
//! with them where it waits (`http/agent.rs`), and its contact is applied
//! on the tick as a quiet poll's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;

use super::*;

/// The quiet lines of one engine (one leadership): by node name.
pub struct Lines {
    /// The engine's epoch: a poll from before a restart is not quiet.
    epoch: u64,
    by_node: RwLock<HashMap<String, Arc<Line>>>,
    /// Polls answered here.
    answered: AtomicU64,
    /// Polls answered with the commands their wake carried.
    woken: AtomicU64,
}

/// One node's line.
pub struct Line {
    /// Set by the writer while the node runs nothing, is up and healthy
    /// and holds a valid credential.
    quiet: AtomicBool,
    /// The latest contact answered here (ms since the epoch), 0 once the
    /// writer took it.
    heard: AtomicU64,
    /// The node's command stream as last delivered.
    changed: watch::Receiver<Delivered>,
}

/// A quiet poll's answer: nothing now; the stream's next sequence number
/// and a receiver that wakes when a command is delivered.
pub struct QuietPoll {
    pub next_seq: u64,
    pub changed: watch::Receiver<Delivered>,
}

impl Lines {
    pub(super) fn new(epoch: u64) -> Lines {
        Lines { epoch, by_node: RwLock::default(), answered: AtomicU64::new(0), woken: AtomicU64::new(0) }
    }

    /// Answers `node`'s poll for commands after `after` if the node is
    /// quiet and has none; otherwise `None`, and the poll goes to the
    /// writer.
    pub fn poll(&self, node: &str, epoch: u64, after: u64, now: u64) -> Option<QuietPoll> {
        if epoch != self.epoch {
            return None;
        }
        let line = self.by_node.read().expect("lines").get(node)?.clone();
        if !line.quiet.load(Ordering::Acquire) {
            return None;
        }
        let mut changed = line.changed.clone();
        // Marked seen here: a command delivered after this wakes the wait.
        let delivered = changed.borrow_and_update().next_seq;
        // Delivered is the stream's next sequence number (0: none yet).
        if delivered > after + 1 {
            return None;
        }
        line.heard.fetch_max(now, Ordering::AcqRel);
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(QuietPoll { next_seq: delivered.max(1), changed })
    }

    /// A poll from `node` at `now` was answered with the commands its wait
    /// was woken with: the writer takes the contact on its tick, as a
    /// quiet poll's.
    pub fn woken(&self, node: &str, now: u64) {
        self.woken.fetch_add(1, Ordering::Relaxed);
        if let Some(line) = self.get(node) {
            line.heard.fetch_max(now, Ordering::AcqRel);
        }
    }

    /// How many polls were answered with the commands their wake carried.
    pub fn woken_answered(&self) -> u64 {
        self.woken.load(Ordering::Relaxed)
    }

    /// How many polls were answered here.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn get(&self, node: &str) -> Option<Arc<Line>> {
        self.by_node.read().expect("lines").get(node).cloned()
    }

    /// `node` is no longer quiet: its next poll goes to the writer.
    pub(super) fn unquiet(&self, node: &str) {
        if let Some(line) = self.get(node) {
            line.quiet.store(false, Ordering::Release);
        }
    }
}

impl<S: Store> Engine<S> {
    /// The lines the HTTP handlers answer quiet polls from.
    pub fn lines(&self) -> Arc<Lines> {
        self.lines.clone()
    }

    /// `node` polled the writer: its line exists from now on, quiet if
    /// the node is. A node stops being quiet by what makes it so: a
    /// command (its next poll sees it and comes here), a poll that says
    /// it is failing, being lost or removed ([`Lines::unquiet`]).
    pub(super) fn line(&mut self, node: &str) {
        let quiet = self.is_quiet(node);
        if let Some(line) = self.lines.get(node) {
            line.quiet.store(quiet, Ordering::Release);
            return;
        }
        let channel = self.outbox.channels.entry(node.to_string()).or_insert_with(Channel::new);
        let line = Line {
            quiet: AtomicBool::new(quiet),
            heard: AtomicU64::new(0),
            changed: channel.notify.subscribe(),
        };
        self.lines.by_node.write().expect("lines").insert(node.to_string(), Arc::new(line));
    }

    /// On the tick: the contact of every quiet poll since the last.
    pub(super) fn hear_lines(&mut self) -> Written {
        let heard: Vec<(String, u64)> = self
            .lines
            .by_node
            .read()
            .expect("lines")
            .iter()
            .filter_map(|(node, line)| match line.heard.swap(0, Ordering::AcqRel) {
                0 => None,
                at => Some((node.clone(), at)),
            })
            .collect();
        for (node, at) in heard {
            self.contact(&node, at)?;
        }
        Ok(())
    }

    /// Before a pass: a node the core would find silent past the timeout
    /// may have polled quietly since the tick; its contact is taken first.
    pub(super) fn hear_silent(&mut self, now: u64) -> Written {
        let timeout = self.config.heartbeat_timeout.as_millis();
        let silent: Vec<String> = self
            .core
            .silent_since(Time(now.saturating_sub(timeout)))
            .filter_map(|id| {
                self.core.node(id).filter(|n| n.status != NodeStatus::Lost).map(|n| n.name.clone())
            })
            .collect();
        for node in silent {
            if let Some(line) = self.lines.get(&node) {
                let at = line.heard.swap(0, Ordering::AcqRel);
                if at != 0 {
                    self.contact(&node, at)?;
                }
            }
        }
        Ok(())
    }

    /// A quiet poll from `node` at `at`, as a poll to the writer records it.
    fn contact(&mut self, node: &str, at: u64) -> Written {
        let Some(id) = self.core.node_by_name(node) else { return Ok(()) };
        if self.core.node(id).is_none_or(|n| n.last_heartbeat.0 >= at) {
            return Ok(());
        }
        // A lost node's quiet poll does not bring it back: its next poll
        // goes to the writer and is told to register again.
        if self.core.heartbeat(id, Time(at)).is_ok() {
            let Parts { fleet, core, mut fx, .. } = self.parts();
            agents::heard(fleet, core, &mut fx, node, at)?;
        }
        Ok(())
    }

    /// Is `node` up, idle, healthy and holding a valid credential?
    fn is_quiet(&self, node: &str) -> bool {
        let Some(n) = self.core.node_by_name(node).and_then(|id| self.core.node(id)) else { return false };
        n.status != NodeStatus::Lost
            && n.jobs().next().is_none()
            && !self.fleet.unhealthy.contains_key(node)
            && self.fleet.heard_since_start.contains(node)
            && self.access.node_credentials.contains_key(node)
    }
}
