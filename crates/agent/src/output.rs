//! What of a job's output the agent passes on. A job may print faster than
//! the server can take it, or more than anyone will read: the agent reads
//! every byte (the job never blocks on its pipe) and forwards only what
//! fits under the operator's limits, dropping the rest with a marker line
//! in the log that says what was dropped and why.
//!
//! Three limits, each for its own harm: a cap per attempt (the server's
//! disk), a rate with a burst (the server's single writer, shared by every
//! node), and a budget for output not yet accepted by the server (the
//! agent's own memory while the server is slow or away).
//!
//! Output travels as text. Each pipe is read in chunks of up to 64 KiB,
//! and a character may straddle two reads: a stream's incomplete trailing
//! sequence (at most three bytes) waits for the next read
//! ([`Utf8Stream`]); bytes that are not UTF-8 become U+FFFD, and so does
//! a sequence the stream's end leaves incomplete. The limits count the
//! bytes of that text, which is what reaches the server, and cut it only
//! between characters.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ebb_api::{AgentEvent, AttemptRef};
use ebb_core::bytes_text;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::pipe;

use crate::report::{Reporter, EVENT_COST};

/// How much of a pipe is read at a time.
pub(crate) const READ_SIZE: usize = 64 * 1024;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The operator's limits on jobs' output; 0 means no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLimits {
    /// Bytes of output one attempt may send; the rest is dropped.
    pub max_per_attempt: u64,
    /// Bytes per second one attempt may send, sustained.
    pub rate: u64,
    /// Bytes one attempt may send at once above the rate.
    pub burst: u64,
    /// Bytes of output the agent holds for the server across attempts.
    pub buffer: u64,
}

impl Default for OutputLimits {
    /// A log is for people to read: 64 MiB is more than anyone reads, and
    /// bounds what one attempt costs the server's disk. 1 MiB/s is far
    /// above what a training loop prints, yet a node of eight attempts at
    /// full rate stays within what one writer takes from many nodes; the
    /// 4 MiB burst lets a stack trace or a dumped config through whole.
    /// 64 MiB of unsent output covers seconds of a busy node's output
    /// while the server restarts, and no more.
    fn default() -> Self {
        OutputLimits { max_per_attempt: 64 * MIB, rate: MIB, burst: 4 * MIB, buffer: 64 * MIB }
    }
}

/// Why output was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Cap,
    Rate,
    Buffer,
}

/// What to do with bytes just read from the job.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Forward this many bytes from the start of what was read.
    pub keep: usize,
    /// Then this line, saying what is dropped (or that dropping ended).
    pub marker: Option<String>,
}

/// One attempt's limits, over its stdout and stderr together.
pub(crate) struct Gate {
    limits: OutputLimits,
    forwarded: u64,
    tokens: u64,
    refilled: Instant,
    /// Dropping now, and why.
    dropping: Option<Reason>,
    /// Bytes dropped: over the cap, over the rate, with the buffer full.
    dropped: [u64; 3],
    /// Dropped since the current drop began.
    dropped_now: u64,
    /// The last byte forwarded was a newline (or none was): a marker
    /// starts a line of its own either way.
    at_line_start: bool,
}

/// Why a text is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotASize {
    #[error("{0:?}: expected a size such as 65536, 64KiB or 1MiB")]
    Number(String),
    #[error("{text:?}: unknown unit {unit:?} (B, KiB, MiB, GiB)")]
    Unit { text: String, unit: String },
    #[error("{0:?}: too large")]
    TooLarge(String),
}

/// Reads a size as operators write it: `65536`, `64KiB`, `64K`, `1MiB`,
/// `1M`, `2GiB` (units are powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, NotASize> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().map_err(|_| NotASize::Number(text.to_string()))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => KIB,
        "m" | "mib" | "mb" => MIB,
        "g" | "gib" | "gb" => 1024 * MIB,
        other => return Err(NotASize::Unit { text: text.to_string(), unit: other.to_string() }),
    };
    n.checked_mul(scale).ok_or_else(|| NotASize::TooLarge(text.to_string()))
}

impl Gate {
    pub(crate) fn new(limits: OutputLimits, now: Instant) -> Gate {
        Gate {
            limits,
            forwarded: 0,
            tokens: limits.burst.max(limits.rate),
            refilled: now,
            dropping: None,
            dropped: [0; 3],
            dropped_now: 0,
            at_line_start: true,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = (self.limits.rate as u128 * elapsed.as_micros() / 1_000_000) as u64;
        if earned > 0 {
            self.tokens = (self.tokens.saturating_add(earned)).min(self.limits.burst.max(self.limits.rate));
            self.refilled = now;
        }
    }

    /// How much of each limit is left now.
    fn room(&self, buffer_free: u64) -> [(Reason, u64); 3] {
        let unlimited = |limit: u64, left: u64| if limit == 0 { u64::MAX } else { left };
        [
            (
                Reason::Cap,
                unlimited(
                    self.limits.max_per_attempt,
                    self.limits.max_per_attempt.saturating_sub(self.forwarded),
                ),
            ),
            (Reason::Rate, unlimited(self.limits.rate, self.tokens)),
            (Reason::Buffer, unlimited(self.limits.buffer, buffer_free)),
        ]
    }

    /// Whether a drop for `reason` may end: the limit has room again, with
    /// some margin so that a job printing flat out gets a few markers a
    /// minute rather than one per read.
    fn may_resume(&self, reason: Reason, buffer_free: u64) -> bool {
        match reason {
            Reason::Cap => false,
            Reason::Rate => self.tokens >= (self.limits.burst.max(self.limits.rate) / 2).max(1),
            Reason::Buffer => buffer_free >= (self.limits.buffer / 2).max(1),
        }
    }

    /// Decides on `text` just read, with `buffer_free` bytes left in the
    /// agent's budget for unsent output. What is kept ends at a character
    /// boundary, and every byte is counted once: kept or dropped.
    pub(crate) fn admit(&mut self, text: &str, now: Instant, buffer_free: u64) -> Verdict {
        self.refill(now);
        let n = text.len() as u64;
        let mut resumed = None;
        if let Some(reason) = self.dropping {
            if !self.may_resume(reason, buffer_free) {
                self.drop_bytes(reason, n);
                return Verdict { keep: 0, marker: None };
            }
            resumed = Some(self.resume_marker());
            self.dropping = None;
        }
        let (reason, room) =
            self.room(buffer_free).into_iter().min_by_key(|(_, room)| *room).expect("three limits");
        let keep = floor_char_boundary(text, n.min(room) as usize) as u64;
        self.forwarded += keep;
        if self.limits.rate != 0 {
            self.tokens -= keep;
        }
        if keep > 0 {
            self.at_line_start = text.as_bytes()[keep as usize - 1] == b'\n';
        }
        let mut marker = resumed;
        if keep < n {
            self.dropping = Some(reason);
            self.dropped_now = 0;
            self.drop_bytes(reason, n - keep);
            let line = self.line(&self.drop_marker(reason));
            marker = Some(marker.unwrap_or_default() + &line);
        }
        if let Some(m) = &marker {
            self.at_line_start = m.ends_with('\n');
        }
        Verdict { keep: keep as usize, marker }
    }

    fn drop_bytes(&mut self, reason: Reason, n: u64) {
        self.dropped[reason as usize] += n;
        self.dropped_now += n;
    }

    /// `text` as a line of its own.
    fn line(&self, text: &str) -> String {
        let start = if self.at_line_start { "" } else { "\n" };
        format!("{start}[ebb: {text}]\n")
    }

    fn drop_marker(&self, reason: Reason) -> String {
        let l = &self.limits;
        match reason {
            Reason::Cap => {
                format!(
                    "output over the {} per-attempt limit: dropping the rest",
                    bytes_text(l.max_per_attempt)
                )
            }
            Reason::Rate => format!(
                "output over the rate limit of {}/s (burst {}): dropping it until it slows",
                bytes_text(l.rate),
                bytes_text(l.burst)
            ),
            Reason::Buffer => format!(
                "the agent's {} of unsent output is full (the server is slow or away): dropping output",
                bytes_text(l.buffer)
            ),
        }
    }

    fn resume_marker(&self) -> String {
        self.line(&format!("output resumes; {} bytes were dropped", self.dropped_now))
    }

    /// The attempt has ended: how much was dropped, and why, if any was.
    pub(crate) fn summary(&self) -> Option<String> {
        let [cap, rate, buffer] = self.dropped;
        let total = cap + rate + buffer;
        if total == 0 {
            return None;
        }
        let parts: Vec<String> = [
            (cap, "over the per-attempt limit"),
            (rate, "over the rate limit"),
            (buffer, "with the agent's buffer full"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        Some(self.line(&format!(
            "{total} bytes of this attempt's output were dropped ({}); {} were kept",
            parts.join(", "),
            self.forwarded
        )))
    }
}

/// The largest character boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// One stream's bytes as text, read after read: a character split between
/// two reads is decoded whole.
#[derive(Debug, Default)]
pub(crate) struct Utf8Stream {
    /// The start of a character the last read cut short (at most three
    /// bytes), to go before the next read.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// `bytes`, read after what came before, as text: a sequence cut short
    /// at the end waits for the next read; bytes that cannot be UTF-8
    /// become U+FFFD.
    pub(crate) fn decode(&mut self, bytes: &[u8]) -> String {
        let joined;
        let bytes = if self.pending.is_empty() {
            bytes
        } else {
            joined = [std::mem::take(&mut self.pending).as_slice(), bytes].concat();
            joined.as_slice()
        };
        let complete = incomplete_tail(bytes);
        self.pending = bytes[complete..].to_vec();
        String::from_utf8_lossy(&bytes[..complete]).into_owned()
    }

    /// The stream has ended: a sequence it left incomplete, as U+FFFD.
    pub(crate) fn finish(&mut self) -> Option<String> {
        (!std::mem::take(&mut self.pending).is_empty()).then(|| char::REPLACEMENT_CHARACTER.to_string())
    }
}

/// Where a character cut short by the end of `bytes` starts: a lead byte
/// among the last three, followed only by the continuation bytes it
/// expects, too few of them. `bytes.len()` if there is none.
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let start = bytes.len() - back;
        if bytes[start] & 0xc0 == 0x80 {
            continue; // a continuation byte: its lead is further back
        }
        return match std::str::from_utf8(&bytes[start..]) {
            // Valid as far as it goes: only the end came too soon.
            Err(e) if e.valid_up_to() == 0 && e.error_len().is_none() => start,
            _ => bytes.len(),
        };
    }
    bytes.len()
}

/// How long a line begun and not ended is held before it is passed on.
const LINE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A pipe's output passed on in whole lines: what follows its last line
/// break waits for the rest of its line (at most [`READ_SIZE`] of it,
/// and [`LINE_WAIT`]), so that a gang's nodes' lines, and a job's stdout
/// and stderr, never meet in the middle of a line in the log.
#[derive(Default)]
pub(crate) struct Lines {
    held: String,
}

impl Lines {
    /// Whether part of a line waits.
    pub(crate) fn held(&self) -> bool {
        !self.held.is_empty()
    }

    /// What of `text` (after what was held) ends with a line break, or
    /// everything once what waits is as long as a read.
    pub(crate) fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        match self.held.rfind('\n') {
            _ if self.held.len() >= READ_SIZE => std::mem::take(&mut self.held),
            Some(end) => {
                let rest = self.held.split_off(end + 1);
                std::mem::replace(&mut self.held, rest)
            }
            None => String::new(),
        }
    }

    /// Everything held (the pipe ended, or the line waited long enough).
    pub(crate) fn take(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// One attempt's output on its way to the server: its stdout and stderr
/// share the attempt's limits (and markers), each pipe is decoded on its
/// own.
pub(crate) struct Forwarder {
    attempt: AttemptRef,
    gate: Mutex<Gate>,
    reporter: Arc<Reporter>,
}

impl Forwarder {
    pub(crate) fn new(attempt: AttemptRef, limits: OutputLimits, reporter: Arc<Reporter>) -> Arc<Forwarder> {
        Arc::new(Forwarder { attempt, gate: Mutex::new(Gate::new(limits, Instant::now())), reporter })
    }

    /// Reads `pipe` to its end, every byte, so the job never blocks on a
    /// full pipe, and passes on what fits the limits, in whole lines
    /// ([`Lines`]).
    pub(crate) async fn read(&self, mut pipe: impl AsyncRead + Unpin) {
        let mut buf = vec![0u8; READ_SIZE];
        let mut stream = Utf8Stream::default();
        let mut lines = Lines::default();
        loop {
            let read = match lines.held() {
                // A line begun and not ended is passed on as it is after
                // a while (a progress bar's `\r`, a prompt).
                true => match tokio::time::timeout(LINE_WAIT, pipe.read(&mut buf)).await {
                    Ok(read) => read,
                    Err(_) => {
                        self.forward(&lines.take());
                        continue;
                    }
                },
                false => pipe.read(&mut buf).await,
            };
            match read {
                Ok(0) | Err(_) => break,
                Ok(n) => self.forward(&lines.push(&stream.decode(&buf[..n]))),
            }
        }
        if let Some(rest) = stream.finish() {
            self.forward(&lines.push(&rest));
        }
        self.forward(&lines.take());
    }

    /// Passes on what the gate lets through of `text`, and the gate's
    /// marker if it has one.
    fn forward(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let free = self.reporter.output_room();
        // Under the lock: stdout and stderr's markers stay in order.
        let mut gate = self.gate.lock().expect("gate");
        let verdict = gate.admit(text, Instant::now(), free.saturating_sub(EVENT_COST));
        if verdict.keep > 0 {
            let data = text[..verdict.keep].to_string();
            self.reporter.send(AgentEvent::Output { attempt: self.attempt, data });
        }
        if let Some(marker) = verdict.marker {
            self.reporter.send(AgentEvent::Output { attempt: self.attempt, data: marker });
        }
    }

    /// The attempt has ended: passes on how much was dropped, and why, if
    /// any was.
    pub(crate) fn finish(&self) {
        let summary = self.gate.lock().expect("gate").summary();
        if let Some(line) = summary {
            self.reporter.send(AgentEvent::Output { attempt: self.attempt, data: line });
        }
    }
}

/// The readers of one attempt's stdout and stderr.
pub(crate) struct Readers {
    forwarder: Arc<Forwarder>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Readers {
    /// Reads `pipes` until they close, passing on what fits `limits`.
    pub(crate) fn start(
        attempt: AttemptRef,
        limits: OutputLimits,
        reporter: &Arc<Reporter>,
        pipes: [OwnedFd; 2],
    ) -> Readers {
        let forwarder = Forwarder::new(attempt, limits, reporter.clone());
        // A pipe tokio cannot watch is dropped: the job's writes to it
        // fail (EPIPE), and the log says why.
        let tasks = pipes
            .into_iter()
            .filter_map(|fd| {
                pipe::Receiver::from_owned_fd(fd)
                    .inspect_err(|e| {
                        let a = attempt;
                        tracing::error!(job = %a.job, attempt = %a.attempt, "cannot read the job's output: {e}")
                    })
                    .ok()
            })
            .map(|pipe| {
                let forwarder = forwarder.clone();
                tokio::spawn(async move { forwarder.read(pipe).await })
            })
            .collect();
        Readers { forwarder, tasks }
    }

    /// The attempt's processes are gone: waits for the last of its output
    /// and passes on what was dropped, if any was. With the attempt's
    /// group empty every writer of the pipes is gone; a process that
    /// escaped a process group may still hold them, so the readers get a
    /// short, bounded wait, never the attempt's end.
    pub(crate) async fn finish(self) {
        let until = tokio::time::Instant::now() + std::time::Duration::from_millis(500);
        for mut reader in self.tasks {
            if tokio::time::timeout_at(until, &mut reader).await.is_err() {
                reader.abort();
            }
        }
        self.forwarder.finish();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ebb_core::{Attempt, JobId};

    fn limits(max: u64, rate: u64, burst: u64, buffer: u64) -> OutputLimits {
        OutputLimits { max_per_attempt: max, rate, burst, buffer }
    }

    #[test]
    fn the_cap_keeps_the_first_bytes_and_drops_the_rest_with_one_marker() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(10, 0, 0, 0), t);
        assert_eq!(gate.admit("hello\n", t, 0), Verdict { keep: 6, marker: None });
        let v = gate.admit("world\nmore", t, 0);
        assert_eq!(v.keep, 4);
        assert_eq!(
            v.marker.as_deref(),
            Some("\n[ebb: output over the 10 B per-attempt limit: dropping the rest]\n")
        );
        // Later output goes silently, even after a long pause.
        assert_eq!(gate.admit("again", t + Duration::from_secs(3600), 0), Verdict { keep: 0, marker: None });
        assert_eq!(
            gate.summary().as_deref(),
            Some("[ebb: 11 bytes of this attempt's output were dropped (11 over the per-attempt limit); 10 were kept]\n")
        );
    }

    #[test]
    fn the_rate_limit_lets_the_burst_through_then_the_rate_and_says_what_it_dropped() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(0, 100, 1000, 0), t);
        let chunk = "x".repeat(600);
        assert_eq!(gate.admit(&chunk, t, 0).keep, 600);
        let v = gate.admit(&chunk, t, 0);
        assert_eq!(v.keep, 400, "the rest of the burst");
        assert!(v.marker.unwrap().contains("over the rate limit of 100 B/s (burst 1000 B)"));
        // Until half the burst has come back, everything is dropped.
        assert_eq!(gate.admit(&chunk, t + Duration::from_secs(4), 0), Verdict { keep: 0, marker: None });
        let v = gate.admit(&chunk[..100], t + Duration::from_secs(5), 0);
        assert_eq!(v.keep, 100);
        assert_eq!(v.marker.as_deref(), Some("[ebb: output resumes; 800 bytes were dropped]\n"));
        assert!(gate.summary().unwrap().contains(
            "800 bytes of this attempt's output were dropped (800 over the rate limit); 1100 were kept"
        ));
    }

    #[test]
    fn a_full_buffer_drops_until_half_of_it_is_free() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(0, 0, 0, 100), t);
        let v = gate.admit("0123456789", t, 4);
        assert_eq!(v.keep, 4);
        assert!(v.marker.unwrap().contains("the agent's 100 B of unsent output is full"));
        assert_eq!(gate.admit("0123456789", t, 40).keep, 0);
        let v = gate.admit("0123456789", t, 60);
        assert_eq!(v.keep, 10);
        assert!(v.marker.unwrap().contains("16 bytes were dropped"));
    }

    #[test]
    fn no_limits_forward_everything() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(0, 0, 0, 0), t);
        assert_eq!(gate.admit(&"\x01".repeat(1 << 20), t, 0), Verdict { keep: 1 << 20, marker: None });
        assert_eq!(gate.summary(), None);
    }

    #[test]
    fn sizes_parse_as_operators_write_them() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64MiB"), Ok(64 * MIB));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("lots").unwrap_err().to_string().contains("expected a size"));
        let unit = parse_bytes("3 parsecs").unwrap_err();
        assert!(matches!(&unit, NotASize::Unit { unit, .. } if unit == "parsecs"), "{unit:?}");
        assert!(unit.to_string().contains("unknown unit"));
        assert!(parse_bytes("99999999999999GiB").unwrap_err().to_string().contains("too large"));
    }

    /// What `stream` makes of `reads`, one after another, and its end.
    fn decode(reads: &[&[u8]]) -> String {
        let mut stream = Utf8Stream::default();
        let mut text: String = reads.iter().map(|r| stream.decode(r)).collect();
        text.extend(stream.finish());
        text
    }

    #[test]
    fn a_character_split_between_two_reads_is_decoded_whole() {
        for whole in ["é", "日本", "🦀", "a🦀b"] {
            let bytes = whole.as_bytes();
            for cut in 0..=bytes.len() {
                assert_eq!(decode(&[&bytes[..cut], &bytes[cut..]]), whole, "{whole:?} cut at {cut}");
            }
        }
        // A 4-byte character in four reads of a byte each.
        let crab = "🦀".as_bytes();
        assert_eq!(decode(&[&crab[..1], &crab[1..2], &crab[2..3], &crab[3..]]), "🦀");
        let mut stream = Utf8Stream::default();
        assert_eq!(stream.decode(&crab[..3]), "", "nothing to pass on yet");
        assert_eq!(stream.pending.len(), 3);
    }

    #[test]
    fn bytes_that_are_not_utf8_become_replacement_characters_and_so_does_a_cut_off_end() {
        assert_eq!(decode(&[b"a\xffb", b"\xc3"]), "a\u{fffd}b\u{fffd}");
        // A lead byte followed by what cannot continue it is invalid at once.
        assert_eq!(decode(&[b"\xe6\x97", b"x"]), "\u{fffd}x");
        assert_eq!(decode(&[b"\xe0\x80", b"\x80"]), "\u{fffd}\u{fffd}\u{fffd}", "an overlong form");
        assert_eq!(decode(&[b"\xf0\x9f\xa6"]), "\u{fffd}", "the stream ended inside a character");
        assert_eq!(decode(&[b"\x80\x80\x80", b"\x80"]), "\u{fffd}".repeat(4), "continuation bytes alone");
    }

    #[test]
    fn the_limits_count_the_text_forwarded_and_cut_only_between_characters() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(10, 0, 0, 0), t);
        // Each invalid byte is forwarded as three: the cap counts those.
        let text = String::from_utf8_lossy(b"\xff\xff\xff\xff").into_owned();
        let v = gate.admit(&text, t, 0);
        assert_eq!(v.keep, 9, "three whole U+FFFD, not a part of a fourth");
        assert!(text.is_char_boundary(v.keep));
        assert!(gate.summary().unwrap().contains("3 bytes of this attempt's output were dropped"));
        let mut gate = Gate::new(limits(0, 0, 0, 100), t);
        assert_eq!(gate.admit("日本語", t, 7).keep, 6);
        assert_eq!(gate.admit("🦀", t, 3).keep, 0, "less room than the character");
    }

    /// A forwarder's output as the server would get it.
    async fn forwarded(limits: OutputLimits, pipe: impl AsyncRead + Unpin) -> String {
        let (reporter, mut queue) = Reporter::new(limits.buffer);
        let a = AttemptRef { job: JobId(1), attempt: Attempt(1) };
        let forwarder = Forwarder::new(a, limits, reporter);
        forwarder.read(pipe).await;
        forwarder.finish();
        drop(forwarder);
        let mut text = String::new();
        while let Ok(AgentEvent::Output { data, .. }) = queue.try_recv() {
            text.push_str(&data);
        }
        text
    }

    #[tokio::test]
    async fn a_character_across_two_reads_of_a_pipe_arrives_whole() {
        let line = format!("{}🦀 end\n", "a".repeat(READ_SIZE - 2));
        let bytes = line.as_bytes();
        // Two reads, the first ending two bytes into the crab.
        let pipe = (&bytes[..READ_SIZE]).chain(&bytes[READ_SIZE..]);
        assert_eq!(forwarded(OutputLimits::default(), pipe).await, line);
        let cut_off = &bytes[..READ_SIZE];
        let text = forwarded(OutputLimits::default(), cut_off).await;
        assert_eq!(text, format!("{}\u{fffd}", "a".repeat(READ_SIZE - 2)));
    }

    /// Through a real pipe, written by a real process: `dd` writes the
    /// line in one call, the pipe holds 64 KiB, so the first read ends
    /// inside the 4-byte character.
    #[tokio::test]
    async fn a_process_line_with_a_character_across_the_64_kib_read_boundary_arrives_whole() {
        let line = format!("{}🦀 end\n", "a".repeat(READ_SIZE - 2));
        let dir = std::env::temp_dir().join(format!("ebb-output-boundary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("line");
        std::fs::write(&file, &line).unwrap();
        let argv = [
            "dd".to_string(),
            format!("if={}", file.display()),
            format!("bs={}", line.len()),
            "status=none".into(),
        ];
        let env = std::collections::BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let who = crate::identity::test_user();
        let request = crate::spawn::Request { argv: &argv, env: &env, cwd: &dir, who: &who, join: &[] };
        let child = crate::spawn::spawn(&request).unwrap();
        let stdout = pipe::Receiver::from_owned_fd(child.stdout).unwrap();
        let text = forwarded(OutputLimits::default(), stdout).await;
        let ended = crate::spawn::wait(child.pid).await.unwrap();
        assert_eq!(ended.code, Some(0));
        assert_eq!(text.len(), line.len());
        assert!(text == line, "the line came back changed around {:?}", &text[READ_SIZE - 4..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_passed_on_in_whole_lines() {
        let mut lines = Lines::default();
        assert_eq!(lines.push("rank 0: step 1\nrank 0: st"), "rank 0: step 1\n");
        assert!(lines.held());
        assert_eq!(lines.push("ep 2"), "");
        assert_eq!(lines.push("\nrank 0: step 3\n"), "rank 0: step 2\nrank 0: step 3\n");
        assert!(!lines.held());
        assert_eq!(lines.push("no end"), "");
        assert_eq!(lines.take(), "no end");
        // A line as long as a read is passed on as it is.
        let long = "x".repeat(READ_SIZE);
        assert_eq!(lines.push(&long).len(), READ_SIZE);
    }
}
