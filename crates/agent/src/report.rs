//! What the agent tells the server: every start, checkpoint, exit and
//! piece of output, in order, retried until accepted.
//!
//! Reports are sized by what they weigh on the wire. The server refuses
//! bodies over [`ebb_api::MAX_REQUEST_BYTES`]; output weighs up to six
//! times its length once JSON escapes it (`\x01` is `\u0001`), so the agent
//! measures each event as serialised and packs reports under
//! [`ebb_api::MAX_REPORT_BYTES`], splitting output that would not fit.
//!
//! Starts, checkpoints and exits are billed and never dropped: they are
//! remembered until the server accepts them, and a registration carries
//! them, so a server that restarted accounts them as they happened.
//! Output is not remembered; it counts against a budget for output the
//! server has not taken yet, so that a slow or absent server costs the
//! agent bounded memory, and a report the server refuses as it is loses
//! its output (with a marker saying so), never its other events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ebb_api::{AgentEvent, AttemptRef, Report, ReportId};
use tokio::sync::mpsc;

use crate::client::{CallError, Client};
use crate::retry;

/// Milliseconds since the Unix epoch: the time events are stamped with.
pub(crate) fn now_ms() -> u64 {
    ebb_core::time::unix_ms(SystemTime::now())
}

/// What a queued output event costs the agent's budget beyond its bytes:
/// a job writing a byte at a time must not fill memory with events.
pub(crate) const EVENT_COST: u64 = 64;

/// Where the agent's events go: queued in order for the report loop
/// ([`Reporter::run`]), which sends them to the server.
pub(crate) struct Reporter {
    events: mpsc::UnboundedSender<AgentEvent>,
    /// Starts, checkpoints and exits not yet accepted by the server, in
    /// order: a registration carries them.
    unreported: Mutex<Vec<AgentEvent>>,
    /// Output queued for the server, in bytes plus [`EVENT_COST`] per
    /// event; bounded by `output_buffer`.
    queued_output: AtomicU64,
    output_buffer: u64,
    health: Mutex<ReportHealth>,
    /// This agent's session (random, new at each start) and the number of
    /// the last report it made: the server applies a report sent again
    /// (its reply was lost) once.
    session: u64,
    reports: AtomicU64,
    /// Slots for reports in flight, shared by the nodes of a simulated
    /// fleet (one process, one descriptor per connection: each node's
    /// command poll holds one, and a report beside it another). `None` for
    /// an agent: its one report at a time needs no bound.
    in_flight: Option<Arc<tokio::sync::Semaphore>>,
}

/// The events queued by a [`Reporter`], for its report loop.
pub(crate) type Queue = mpsc::UnboundedReceiver<AgentEvent>;

/// The queue has no report loop any more: the agent is stopping.
#[derive(Debug)]
pub(crate) struct Stopping;

impl Reporter {
    /// A reporter holding at most `output_buffer` bytes of unsent output
    /// (0: no limit), and the queue its report loop reads.
    pub(crate) fn new(output_buffer: u64) -> (Arc<Reporter>, Queue) {
        Self::sharing(output_buffer, None)
    }

    /// As [`new`](Self::new), its reports waiting for one of `in_flight`'s
    /// slots.
    pub(crate) fn sharing(
        output_buffer: u64,
        in_flight: Option<Arc<tokio::sync::Semaphore>>,
    ) -> (Arc<Reporter>, Queue) {
        let (events, queue) = mpsc::unbounded_channel();
        let reporter = Reporter {
            events,
            unreported: Mutex::new(Vec::new()),
            queued_output: AtomicU64::new(0),
            output_buffer,
            health: Mutex::new(ReportHealth::default()),
            session: {
                let mut bytes = [0u8; 8];
                let _ = getrandom::fill(&mut bytes);
                u64::from_le_bytes(bytes) >> 1
            },
            reports: AtomicU64::new(0),
            in_flight,
        };
        (Arc::new(reporter), queue)
    }

    /// Queues `event`: output counts against the budget for unsent output,
    /// anything else is remembered until the server accepts it.
    pub(crate) fn send(&self, event: AgentEvent) {
        let _ = self.try_send(event);
    }

    /// As [`send`](Self::send), saying whether the event can still reach
    /// the server.
    pub(crate) fn try_send(&self, event: AgentEvent) -> Result<(), Stopping> {
        if is_output(&event) {
            self.queued_output.fetch_add(output_cost(&event), Ordering::Relaxed);
        } else {
            self.unreported.lock().expect("unreported").push(event.clone());
        }
        self.events.send(event).map_err(|_| Stopping)
    }

    /// Bytes of output that may still be queued before the budget for
    /// unsent output is spent (the gate's `buffer_free`).
    pub(crate) fn output_room(&self) -> u64 {
        self.output_buffer.saturating_sub(self.queued_output.load(Ordering::Relaxed))
    }

    /// The events the server has not accepted yet, for a registration.
    pub(crate) fn unreported(&self) -> Vec<AgentEvent> {
        self.unreported.lock().expect("unreported").clone()
    }

    /// Why the node is unhealthy, if its reports keep failing.
    pub(crate) fn failing(&self, now: Instant, after: Duration) -> Option<String> {
        self.health.lock().expect("health").failing(now, after)
    }

    /// Sends the queued events to the server as `node`, in order, in
    /// reports sized under the server's limit, retrying until each is
    /// accepted; `stale` is told of the attempts the server fenced.
    pub(crate) async fn run(
        self: Arc<Self>,
        mut queue: Queue,
        client: Arc<Client>,
        node: String,
        stale: impl Fn(&[AttemptRef]),
    ) {
        while let Some(first) = queue.recv().await {
            let events = Self::piled_up(first, &mut queue);
            let cost: u64 = events.iter().map(output_cost).sum();
            for batch in pack(&node, events, ebb_api::MAX_REPORT_BYTES) {
                self.deliver(&client, &node, batch, &stale).await;
            }
            self.queued_output.fetch_sub(cost, Ordering::Relaxed);
        }
    }

    /// `first` and what has piled up behind it, to a few reports' worth.
    fn piled_up(first: AgentEvent, queue: &mut Queue) -> Vec<AgentEvent> {
        let mut weight = encoded_len(&first);
        let mut events = vec![first];
        while weight < 4 * ebb_api::MAX_REPORT_BYTES {
            let Ok(next) = queue.try_recv() else { break };
            weight += encoded_len(&next);
            events.push(next);
        }
        events
    }

    /// Delivers one report, retrying with jittered back-off while the
    /// server cannot be reached or fails. A report it refuses as it is
    /// (too large, or malformed) would be refused for ever: its output is
    /// dropped, with a marker in each attempt's log, then the markers too
    /// if need be; the starts, checkpoints and exits are always delivered.
    async fn deliver(
        &self,
        client: &Client,
        node: &str,
        mut events: Vec<AgentEvent>,
        stale: &impl Fn(&[AttemptRef]),
    ) {
        let mut delays = retry::REPORTS.delays();
        let mut refusals = 0;
        // One number for every try of this report.
        let seq = self.reports.fetch_add(1, Ordering::Relaxed) + 1;
        let id = Some(ReportId { session: self.session, seq });
        loop {
            let report = Report { node: node.to_string(), events, id };
            let slot = match &self.in_flight {
                Some(slots) => slots.acquire().await.ok(),
                None => None,
            };
            let result = client.report(&report).await;
            drop(slot);
            events = report.events;
            match result {
                Ok(reply) => {
                    self.health.lock().expect("health").delivered();
                    stale(&reply.stale);
                    self.forget_delivered(&events);
                    return;
                }
                Err(CallError::Refused(e)) if refusals < 2 && events.iter().any(is_output) => {
                    tracing::error!("the server refused a report ({e}): dropping its output");
                    self.health.lock().expect("health").failed(e.clone(), Instant::now());
                    events = if refusals == 0 {
                        drop_output(events, &e)
                    } else {
                        events.into_iter().filter(|e| !is_output(e)).collect()
                    };
                    refusals += 1;
                }
                Err(e) => {
                    tracing::warn!("report not delivered, retrying: {e}");
                    self.health.lock().expect("health").failed(e.to_string(), Instant::now());
                    tokio::time::sleep(delays.next_wait()).await;
                }
            }
        }
    }

    /// Reports go out in order, so the events a delivered one carried are
    /// the oldest ones remembered.
    fn forget_delivered(&self, events: &[AgentEvent]) {
        let delivered = events.iter().filter(|e| !is_output(e)).count();
        let mut unreported = self.unreported.lock().expect("unreported");
        let delivered = delivered.min(unreported.len());
        unreported.drain(..delivered);
    }
}

/// Reports failing in a row; what the command poll says while they do.
#[derive(Debug, Default)]
struct ReportHealth {
    failing_since: Option<Instant>,
    failures: u32,
    last_error: String,
}

impl ReportHealth {
    fn failed(&mut self, error: String, now: Instant) {
        self.failing_since.get_or_insert(now);
        self.failures += 1;
        self.last_error = error;
    }

    fn delivered(&mut self) {
        *self = ReportHealth::default();
    }

    /// Why the node is unhealthy: its reports have failed for `after` and
    /// at least three times in a row (one slow answer is not a failure).
    fn failing(&self, now: Instant, after: Duration) -> Option<String> {
        let since = self.failing_since?;
        let failing_for = now.saturating_duration_since(since);
        (self.failures >= 3 && failing_for >= after).then(|| {
            format!(
                "reports failing for {}s ({} tries): {}",
                failing_for.as_secs(),
                self.failures,
                self.last_error
            )
        })
    }
}

pub(crate) fn is_output(event: &AgentEvent) -> bool {
    matches!(event, AgentEvent::Output { .. })
}

/// What an event costs the budget for unsent output.
fn output_cost(event: &AgentEvent) -> u64 {
    match event {
        AgentEvent::Output { data, .. } => data.len() as u64 + EVENT_COST,
        _ => 0,
    }
}

/// `events` with each attempt's output replaced by one marker saying how
/// much was dropped and why.
fn drop_output(events: Vec<AgentEvent>, why: &str) -> Vec<AgentEvent> {
    let mut kept = Vec::new();
    let mut dropped: Vec<(AttemptRef, usize)> = Vec::new();
    for event in events {
        match event {
            AgentEvent::Output { attempt, data } => match dropped.iter_mut().find(|(a, _)| *a == attempt) {
                Some((_, n)) => *n += data.len(),
                None => dropped.push((attempt, data.len())),
            },
            other => kept.push(other),
        }
    }
    let markers = dropped.into_iter().map(|(attempt, n)| AgentEvent::Output {
        attempt,
        data: format!("\n[ebb: {n} bytes of output dropped: the server refused them ({why})]\n"),
    });
    markers.chain(kept).collect()
}

/// Bytes `s` takes inside a JSON string, as serde_json writes it.
pub(crate) fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Bytes an output event of `attempt` with no data takes serialised.
fn output_overhead(attempt: AttemptRef) -> usize {
    let empty = AgentEvent::Output { attempt, data: String::new() };
    serde_json::to_vec(&empty).map_or(0, |v| v.len())
}

/// Bytes `event` takes serialised.
pub(crate) fn encoded_len(event: &AgentEvent) -> usize {
    match event {
        AgentEvent::Output { attempt, data } => output_overhead(*attempt) + escaped_len(data),
        other => serde_json::to_vec(other).map_or(0, |v| v.len()),
    }
}

/// `data` cut at character boundaries into pieces that each take at most
/// `max` bytes escaped (at least one character each).
pub(crate) fn split_escaped(data: &str, max: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut weight = 0;
    for (i, c) in data.char_indices() {
        let w = escaped_len(c.encode_utf8(&mut [0; 4]));
        if weight + w > max && i > start {
            pieces.push(data[start..i].to_string());
            start = i;
            weight = 0;
        }
        weight += w;
    }
    if start < data.len() {
        pieces.push(data[start..].to_string());
    }
    pieces
}

/// Events packed into reports from `node` whose bodies each take at most
/// `bound` bytes serialised, in order. Adjacent output of one attempt is
/// joined while it fits; output too large for any report is split. An
/// event other than output never is (each is far under any bound).
pub(crate) fn pack(node: &str, events: Vec<AgentEvent>, bound: usize) -> Vec<Vec<AgentEvent>> {
    let empty = Report { node: node.to_string(), events: Vec::new(), id: None };
    let base = serde_json::to_vec(&empty).map_or(0, |v| v.len());
    // Room for events (and the commas between them) in one report.
    let room = bound.saturating_sub(base).max(1);
    let mut reports = Vec::new();
    let mut current: Vec<AgentEvent> = Vec::new();
    let mut used = 0;
    let mut push = |event: AgentEvent, reports: &mut Vec<Vec<AgentEvent>>, current: &mut Vec<AgentEvent>| {
        let size = encoded_len(&event) + usize::from(!current.is_empty());
        if used + size > room && !current.is_empty() {
            reports.push(std::mem::take(current));
            used = 0;
        }
        let size = encoded_len(&event) + usize::from(!current.is_empty());
        // Joined to the output before it when the joined event fits.
        if let (
            Some(AgentEvent::Output { attempt: last, data }),
            AgentEvent::Output { attempt, data: more },
        ) = (current.last_mut(), &event)
        {
            let grow = escaped_len(more);
            if *last == *attempt && used + grow <= room {
                data.push_str(more);
                used += grow;
                return;
            }
        }
        used += size;
        current.push(event);
    };
    for event in events {
        match event {
            AgentEvent::Output { attempt, data } if encoded_len_of(attempt, &data) > room => {
                // Each piece fits a report of its own.
                let max = room.saturating_sub(output_overhead(attempt) + 1).max(1);
                for piece in split_escaped(&data, max) {
                    push(AgentEvent::Output { attempt, data: piece }, &mut reports, &mut current);
                }
            }
            event => push(event, &mut reports, &mut current),
        }
    }
    if !current.is_empty() {
        reports.push(current);
    }
    reports
}

fn encoded_len_of(attempt: AttemptRef, data: &str) -> usize {
    output_overhead(attempt) + escaped_len(data)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::output::OutputLimits;
    use crate::testing::{self, until, FakeServer};
    use ebb_core::{Attempt, JobId};

    const A: AttemptRef = AttemptRef { job: JobId(7), attempt: Attempt(1) };
    const B: AttemptRef = AttemptRef { job: JobId(8), attempt: Attempt(1) };

    fn body(node: &str, events: &[AgentEvent]) -> usize {
        serde_json::to_vec(&Report { node: node.into(), events: events.to_vec(), id: None }).unwrap().len()
    }

    fn output(attempt: AttemptRef, data: &str) -> AgentEvent {
        AgentEvent::Output { attempt, data: data.into() }
    }

    fn exited(attempt: AttemptRef) -> AgentEvent {
        AgentEvent::Exited {
            attempt,
            code: Some(0),
            signal: None,
            completed: false,
            at_ms: 1,
            peak_memory_bytes: None,
            start_error: None,
            port_in_use: None,
            ended_by: None,
        }
    }

    /// Output of `attempt` in `reports`, joined.
    fn joined(reports: &[Vec<AgentEvent>], attempt: AttemptRef) -> String {
        reports
            .iter()
            .flatten()
            .filter_map(|e| match e {
                AgentEvent::Output { attempt: a, data } if *a == attempt => Some(data.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn escaped_length_is_what_serde_json_writes() {
        for s in [
            "",
            "plain",
            "\x01\x02\x1f",
            "quote \" back \\ slash",
            "\n\r\t\x08\x0c",
            "é ✓ 🦀",
            "\x7f\u{fffd}",
        ] {
            assert_eq!(escaped_len(s), serde_json::to_string(s).unwrap().len() - 2, "{s:?}");
        }
    }

    #[test]
    fn a_megabyte_of_control_characters_is_split_into_reports_under_the_bound() {
        let data = "\x01".repeat(1_000_000) + "end";
        let events = vec![AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 }, output(A, &data), exited(A)];
        let bound = 100_000;
        let reports = pack("node-1", events, bound);
        assert!(reports.len() >= 60, "6 MB escaped in 100 kB reports: {}", reports.len());
        for r in &reports {
            let size = body("node-1", r);
            assert!(size <= bound, "a report of {size} bytes");
        }
        assert_eq!(joined(&reports, A), data, "every byte, in order");
        let all: Vec<&AgentEvent> = reports.iter().flatten().collect();
        assert!(matches!(all.first(), Some(AgentEvent::Started { .. })));
        assert!(matches!(all.last(), Some(AgentEvent::Exited { .. })));
    }

    #[test]
    fn small_events_share_reports_and_output_is_joined_per_attempt_in_order() {
        let mut events = Vec::new();
        for i in 0..2000 {
            events.push(output(if i % 3 == 0 { B } else { A }, &format!("line {i}\n")));
        }
        events.push(exited(A));
        let bound = 4096;
        let reports = pack("n", events.clone(), bound);
        assert!(reports.len() > 1);
        for r in &reports {
            assert!(body("n", r) <= bound);
        }
        let expect = |attempt| -> String {
            events
                .iter()
                .filter_map(|e| match e {
                    AgentEvent::Output { attempt: a, data } if *a == attempt => Some(data.as_str()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(joined(&reports, A), expect(A));
        assert_eq!(joined(&reports, B), expect(B));
        assert!(matches!(reports.last().unwrap().last(), Some(AgentEvent::Exited { .. })));
    }

    #[test]
    fn adjacent_output_of_one_attempt_is_one_event() {
        let reports =
            pack("n", vec![output(A, "a"), output(A, "b"), output(B, "c"), output(A, "d")], 1 << 20);
        assert_eq!(reports, vec![vec![output(A, "ab"), output(B, "c"), output(A, "d")]]);
    }

    #[test]
    fn splitting_keeps_characters_whole() {
        let pieces = split_escaped("é✓🦀\x01ab", 4);
        assert_eq!(pieces.concat(), "é✓🦀\x01ab");
        assert!(pieces.iter().all(|p| escaped_len(p) <= 6), "{pieces:?}");
        assert_eq!(pieces, vec!["é", "✓", "🦀", "\x01", "ab"]);
    }

    const STARTED: AgentEvent = AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 };

    /// A report tried again carries the id of its first try, so the
    /// server applies it once however many replies were lost; the next
    /// report is numbered after it.
    #[tokio::test]
    async fn a_report_keeps_its_id_across_tries_and_the_next_is_numbered_after_it() {
        let fake = Arc::new(FakeServer::default());
        fake.broken.store(true, Ordering::SeqCst);
        let (_, reporter) = testing::reporter(fake.clone(), "ids").await;
        reporter.send(STARTED);
        until("three tries", || fake.report_ids.lock().unwrap().len() >= 3).await;
        fake.broken.store(false, Ordering::SeqCst);
        until("the start is delivered", || !fake.delivered().is_empty()).await;
        reporter.send(exited(A));
        until("the exit is delivered", || fake.delivered().len() == 2).await;
        let ids: Vec<ReportId> =
            fake.report_ids.lock().unwrap().iter().map(|id| id.expect("an id")).collect();
        let (last, tries) = ids.split_last().unwrap();
        assert!(tries.iter().all(|id| *id == tries[0]), "{ids:?}");
        assert_eq!((last.session, last.seq), (tries[0].session, tries[0].seq + 1), "{ids:?}");
    }

    #[tokio::test]
    async fn reports_sharing_slots_wait_for_one_and_are_delivered_once_one_is_free() {
        let fake = Arc::new(FakeServer::default());
        let server = testing::serve(fake.clone()).await;
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let taken = slots.clone().acquire_owned().await.unwrap();
        let mut reporters = Vec::new();
        for node in ["node-1", "node-2"] {
            let dir = testing::temp_dir(&format!("slots-{node}"));
            let client = Arc::new(Client::new(reqwest::Client::new(), &server, "t", &dir, None));
            let (reporter, queue) = Reporter::sharing(0, Some(slots.clone()));
            tokio::spawn(reporter.clone().run(queue, client, node.into(), |_| {}));
            reporter.send(STARTED);
            reporters.push(reporter);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(fake.report_ids.lock().unwrap().is_empty(), "a report went out without a slot");
        drop(taken);
        until("both nodes' starts are delivered", || fake.delivered().len() == 2).await;
        assert_eq!(fake.report_ids.lock().unwrap().len(), 2, "each report tried once: none failed");
        // The server has a report before its reply reaches the reporter,
        // which gives its slot back then.
        until("every slot given back", || slots.available_permits() == 1).await;
    }

    #[tokio::test]
    async fn a_refused_report_drops_its_output_but_never_the_exit() {
        let fake = Arc::new(FakeServer::default());
        fake.refuse_output.store(true, Ordering::SeqCst);
        let (_, reporter) = testing::reporter(fake.clone(), "refused").await;
        reporter.send(STARTED);
        reporter.send(output(A, "refused\n"));
        reporter.send(exited(A));
        let exited = |e: &AgentEvent| matches!(e, AgentEvent::Exited { .. });
        until("the exit is delivered", || fake.delivered().iter().any(exited)).await;
        assert!(!fake.delivered().iter().any(is_output));
        until("nothing is left unreported", || reporter.unreported().is_empty()).await;
        until("the output's budget is back", || reporter.output_room() == OutputLimits::default().buffer)
            .await;

        // With output accepted again, the marker says what was dropped.
        fake.refuse_output.store(false, Ordering::SeqCst);
        let events = drop_output(vec![output(A, "xyz")], "413 Payload Too Large");
        assert_eq!(
            events,
            vec![output(
                A,
                "\n[ebb: 3 bytes of output dropped: the server refused them (413 Payload Too Large)]\n"
            )]
        );
    }

    #[test]
    fn health_needs_repeated_failures_over_time_and_one_delivery_restores_it() {
        let t = Instant::now();
        let after = Duration::from_secs(10);
        let mut h = ReportHealth::default();
        h.failed("503".into(), t);
        assert_eq!(h.failing(t + Duration::from_secs(60), after), None, "one failure is not a pattern");
        h.failed("503".into(), t + Duration::from_secs(1));
        h.failed("connection refused".into(), t + Duration::from_secs(2));
        assert_eq!(h.failing(t + Duration::from_secs(9), after), None, "not for long enough yet");
        let why = h.failing(t + Duration::from_secs(10), after).unwrap();
        assert_eq!(why, "reports failing for 10s (3 tries): connection refused");
        h.delivered();
        assert_eq!(h.failing(t + Duration::from_secs(60), after), None);
    }
}
