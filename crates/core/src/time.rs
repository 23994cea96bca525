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
        if self.0 % 1000 == 0 {
            write!(f, "{}s", self.0 / 1000)
        } else {
            write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
        }
    }
}
