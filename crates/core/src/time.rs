//! Instants and spans in whole milliseconds.
//!
//! The scheduling core never reads a clock: every call takes an explicit
//! `now: Time`. The server passes wall-clock milliseconds since the Unix
//! epoch; the simulator passes virtual time since the start of its trace.

use std::fmt;
use std::ops::{Add, Sub};

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
}
