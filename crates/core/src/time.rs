//! Instants and spans in whole milliseconds.
//!
//! The scheduling core never reads a clock: every call takes an explicit
//! `now: Time`. The server passes wall-clock milliseconds since the Unix
//! epoch; the simulator passes virtual time since the start of its trace.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::{Duration, UNIX_EPOCH};

/// The last instant RFC 3339 can write with a four-digit year,
/// 9999-12-31T23:59:59.999Z, in milliseconds since the Unix epoch.
pub const LAST_WRITABLE_MS: u64 = 253_402_300_799_999;

/// Milliseconds since the Unix epoch in RFC 3339, UTC, to the millisecond
/// (`2026-11-29T08:22:00.000Z`). Every time Ebb writes for people and
/// programs goes through here or [`rfc3339_seconds`]: an instant past the
/// year 9999, which only a wrong clock or a hostile request can give, is
/// written as the last one that has four digits, never a panic.
pub fn rfc3339_millis(ms: u64) -> String {
    humantime::format_rfc3339_millis(writable(ms)).to_string()
}

/// As [`rfc3339_millis`], to the whole second (`2026-11-29T08:22:00Z`), as
/// the clouds' metadata services write times.
pub fn rfc3339_seconds(ms: u64) -> String {
    humantime::format_rfc3339_seconds(writable(ms)).to_string()
}

/// The instant `ms` after the Unix epoch, no later than
/// [`LAST_WRITABLE_MS`], for formatters that cannot write a fifth digit
/// of the year (humantime's and httpdate's panic).
pub fn writable(ms: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.min(LAST_WRITABLE_MS))
}

/// Milliseconds since the Unix epoch of a wall-clock instant (0 before
/// it). The edges that read the clock (the server's writer, the agent,
/// the CLI, the checkpoint sync) convert what they read here; nothing in
/// ebb-core reads it.
pub fn unix_ms(at: std::time::SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An instant, in milliseconds since an epoch chosen by the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

/// A length of time in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub fn from_secs(secs: u64) -> Time {
        Time(secs * 1000)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// Seconds, rounded down.
    pub fn as_secs(self) -> u64 {
        self.0 / 1000
    }

    /// Time elapsed since `earlier`, or zero if `earlier` is in the future.
    pub fn saturating_since(self, earlier: Time) -> Span {
        Span(self.0.saturating_sub(earlier.0))
    }
}

impl Span {
    pub const ZERO: Span = Span(0);

    pub fn from_secs(secs: u64) -> Span {
        Span(secs * 1000)
    }

    pub fn from_millis(ms: u64) -> Span {
        Span(ms)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    pub fn as_secs(self) -> u64 {
        self.0 / 1000
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Seconds as a job or a person gives them (`3.5`, `0.003`), to the
    /// millisecond; negative or not a number is zero.
    pub fn from_secs_f64(secs: f64) -> Span {
        if secs.is_finite() && secs > 0.0 {
            Span((secs * 1000.0).round().min(u64::MAX as f64) as u64)
        } else {
            Span::ZERO
        }
    }

    /// The span for people, in its largest unit and the next:
    /// `3ms`, `3.5s`, `34m 17s`, `2h 05m`, `7d 0h`. Every duration the
    /// CLI and the server's messages print goes through here, so a 3 ms
    /// save reads `3ms`, never `0.0s`.
    pub fn human(self) -> String {
        const SECOND: u64 = 1_000;
        const MINUTE: u64 = 60 * SECOND;
        const HOUR: u64 = 60 * MINUTE;
        const DAY: u64 = 24 * HOUR;
        let ms = self.0;
        match ms {
            ms if ms < SECOND => format!("{ms}ms"),
            ms if ms < MINUTE => format!("{}.{}s", ms / SECOND, ms % SECOND / 100),
            ms if ms < HOUR => format!("{}m {:02}s", ms / MINUTE, ms % MINUTE / SECOND),
            ms if ms < DAY => format!("{}h {:02}m", ms / HOUR, ms % HOUR / MINUTE),
            ms => format!("{}d {}h", ms / DAY, ms % DAY / HOUR),
        }
    }

    /// Parses a duration as people write it on a command line: `300`
    /// (seconds), `300s`, `5m`, `1h`, `1.5s`, `250ms`.
    pub fn parse(text: &str) -> Result<Span, String> {
        let text = text.trim();
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let millis_per_unit: u64 = match unit {
            "" | "s" => 1_000,
            "ms" => 1,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(format!("unknown unit {unit:?} in duration {text:?} (use ms, s, m or h)")),
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("not a duration: {text:?} (e.g. 300, 300s, 5m)"));
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| format!("not a duration: {text:?} (e.g. 300, 300s, 5m)"))?
        };
        let frac_millis = if frac.is_empty() {
            0
        } else {
            let digits = frac.len().min(9);
            let value: u64 = frac[..digits].parse().expect("ascii digits");
            value * millis_per_unit / 10u64.pow(digits as u32)
        };
        whole
            .checked_mul(millis_per_unit)
            .and_then(|m| m.checked_add(frac_millis))
            .map(Span)
            .ok_or_else(|| format!("duration out of range: {text:?}"))
    }
}

impl Add<Span> for Time {
    type Output = Time;
    fn add(self, rhs: Span) -> Time {
        Time(self.0 + rhs.0)
    }
}

impl Sub<Span> for Time {
    type Output = Time;
    fn sub(self, rhs: Span) -> Time {
        Time(self.0.saturating_sub(rhs.0))
    }
}

impl Add for Span {
    type Output = Span;
    fn add(self, rhs: Span) -> Span {
        Span(self.0 + rhs.0)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}s", self.0 / 1000)
        } else {
            write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_instant_is_milliseconds_since_the_epoch_never_less_than_zero_or_past_u64() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1_234)), 1_234);
        assert_eq!(unix_ms(UNIX_EPOCH), 0);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0, "a clock set before 1970");
        let past_u64 = UNIX_EPOCH + Duration::from_secs(u64::MAX / 1_000 + 1);
        assert_eq!(unix_ms(past_u64), u64::MAX);
    }

    /// The clock-skew check formatted a node's `at_ms` of the year 10000
    /// for its refusal, and the formatter panicked: one request stopped
    /// the server.
    #[test]
    fn times_past_the_year_9999_are_written_as_its_last_instant() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(LAST_WRITABLE_MS), "9999-12-31T23:59:59.999Z");
        for ms in [LAST_WRITABLE_MS + 1, 253_402_300_800_000, u64::MAX / 2, u64::MAX] {
            assert_eq!(rfc3339_millis(ms), "9999-12-31T23:59:59.999Z", "{ms}");
            assert_eq!(rfc3339_seconds(ms), "9999-12-31T23:59:59Z", "{ms}");
        }
        assert_eq!(rfc3339_seconds(1_764_404_520_500), "2025-11-29T08:22:00Z");
    }

    #[test]
    fn parses_durations_as_written() {
        assert_eq!(Span::parse("300"), Ok(Span::from_secs(300)));
        assert_eq!(Span::parse("300s"), Ok(Span::from_secs(300)));
        assert_eq!(Span::parse("5m"), Ok(Span::from_secs(300)));
        assert_eq!(Span::parse("1h"), Ok(Span::from_secs(3600)));
        assert_eq!(Span::parse("1.5s"), Ok(Span(1500)));
        assert_eq!(Span::parse("250ms"), Ok(Span(250)));
        assert!(Span::parse("5 minutes").is_err());
        assert!(Span::parse("-1").is_err());
        assert!(Span::parse("").is_err());
        assert!(Span::parse("s").is_err());
    }

    #[test]
    fn spans_for_people_keep_their_unit() {
        let cases = [
            (0, "0ms"),
            (3, "3ms"),
            (999, "999ms"),
            (1_000, "1.0s"),
            (3_500, "3.5s"),
            (59_999, "59.9s"),
            (60_000, "1m 00s"),
            (2_057_000, "34m 17s"),
            (3_600_000, "1h 00m"),
            (7_500_000, "2h 05m"),
            (7 * 86_400_000, "7d 0h"),
            (8 * 86_400_000 + 5 * 3_600_000, "8d 5h"),
        ];
        for (ms, text) in cases {
            assert_eq!(Span(ms).human(), text, "{ms} ms");
        }
        assert_eq!(Span::from_secs_f64(0.003), Span(3));
        assert_eq!(Span::from_secs_f64(-1.0), Span::ZERO);
        assert_eq!(Span::from_secs_f64(f64::NAN), Span::ZERO);
    }
}
