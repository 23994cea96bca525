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

use std::time::Instant;

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

/// Reads a size as operators write it: `65536`, `64KiB`, `64K`, `1MiB`,
/// `1M`, `2GiB` (units are powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 =
        number.parse().map_err(|_| format!("{text:?}: expected a size such as 65536, 64KiB or 1MiB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => KIB,
        "m" | "mib" | "mb" => MIB,
        "g" | "gib" | "gb" => 1024 * MIB,
        other => return Err(format!("{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{text:?}: too large"))
}

/// Sizes for people: `64 MiB`, `1.5 KiB`, `12 bytes`.
pub fn human_bytes(n: u64) -> String {
    let (unit, name) = match n {
        n if n >= MIB => (MIB, "MiB"),
        n if n >= KIB => (KIB, "KiB"),
        _ => return format!("{n} bytes"),
    };
    if n.is_multiple_of(unit) {
        format!("{} {name}", n / unit)
    } else {
        format!("{:.1} {name}", n as f64 / unit as f64)
    }
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

    /// Decides on `n` bytes just read, with `buffer_free` bytes left in the
    /// agent's budget for unsent output.
    pub(crate) fn admit(&mut self, data: &[u8], now: Instant, buffer_free: u64) -> Verdict {
        self.refill(now);
        let n = data.len() as u64;
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
        let keep = n.min(room);
        self.forwarded += keep;
        if self.limits.rate != 0 {
            self.tokens -= keep;
        }
        if keep > 0 {
            self.at_line_start = data[keep as usize - 1] == b'\n';
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
                    human_bytes(l.max_per_attempt)
                )
            }
            Reason::Rate => format!(
                "output over the rate limit of {}/s (burst {}): dropping it until it slows",
                human_bytes(l.rate),
                human_bytes(l.burst)
            ),
            Reason::Buffer => format!(
                "the agent's {} of unsent output is full (the server is slow or away): dropping output",
                human_bytes(l.buffer)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(max: u64, rate: u64, burst: u64, buffer: u64) -> OutputLimits {
        OutputLimits { max_per_attempt: max, rate, burst, buffer }
    }

    #[test]
    fn the_cap_keeps_the_first_bytes_and_drops_the_rest_with_one_marker() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(10, 0, 0, 0), t);
        assert_eq!(gate.admit(b"hello\n", t, 0), Verdict { keep: 6, marker: None });
        let v = gate.admit(b"world\nmore", t, 0);
        assert_eq!(v.keep, 4);
        assert_eq!(
            v.marker.as_deref(),
            Some("\n[ebb: output over the 10 bytes per-attempt limit: dropping the rest]\n")
        );
        // Later output goes silently, even after a long pause.
        assert_eq!(gate.admit(b"again", t + Duration::from_secs(3600), 0), Verdict { keep: 0, marker: None });
        assert_eq!(
            gate.summary().as_deref(),
            Some("[ebb: 11 bytes of this attempt's output were dropped (11 over the per-attempt limit); 10 were kept]\n")
        );
    }

    #[test]
    fn the_rate_limit_lets_the_burst_through_then_the_rate_and_says_what_it_dropped() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(0, 100, 1000, 0), t);
        let chunk = [b'x'; 600];
        assert_eq!(gate.admit(&chunk, t, 0).keep, 600);
        let v = gate.admit(&chunk, t, 0);
        assert_eq!(v.keep, 400, "the rest of the burst");
        assert!(v.marker.unwrap().contains("over the rate limit of 100 bytes/s (burst 1000 bytes)"));
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
        let v = gate.admit(b"0123456789", t, 4);
        assert_eq!(v.keep, 4);
        assert!(v.marker.unwrap().contains("the agent's 100 bytes of unsent output is full"));
        assert_eq!(gate.admit(b"0123456789", t, 40).keep, 0);
        let v = gate.admit(b"0123456789", t, 60);
        assert_eq!(v.keep, 10);
        assert!(v.marker.unwrap().contains("16 bytes were dropped"));
    }

    #[test]
    fn no_limits_forward_everything() {
        let t = Instant::now();
        let mut gate = Gate::new(limits(0, 0, 0, 0), t);
        assert_eq!(gate.admit(&[1u8; 1 << 20], t, 0), Verdict { keep: 1 << 20, marker: None });
        assert_eq!(gate.summary(), None);
    }

    #[test]
    fn sizes_parse_as_operators_write_them() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64MiB"), Ok(64 * MIB));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("lots").unwrap_err().contains("expected a size"));
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("99999999999999GiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(64 * MIB), "64 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 bytes");
    }
}
