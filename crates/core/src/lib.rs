//! Ebb's domain vocabulary, shared by every other crate.
//!
//! Typed ids, tiers, time and money live here so that the scheduler, the
//! simulator and (later) the server agree on what a number means. Nothing in
//! this crate does I/O or reads the clock: `Time` is whatever instant the
//! caller says it is, which is what lets the scheduling core be a pure
//! function and the simulator run in virtual time.

pub mod checkpoint;
pub mod hostlist;
pub mod money;
pub mod time;

pub use money::{MicroUsd, PriceBook};
pub use time::{Span, Time};

use std::fmt;

/// A count of things for people: `1 GPU`, `8 GPUs`, `1 preemption`.
/// Every noun Ebb counts takes an `s`.
pub fn count(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// A size for people: `300 B`, `64 MiB` when whole, `1.5 KiB` otherwise,
/// in the largest binary unit (up to TiB) it reaches.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    // A unit is reached where one decimal of the one below would read 1024.0.
    let reached = |unit: u64| bytes >= unit - unit / 20_480;
    let Some((unit, name)) = UNITS.into_iter().find(|(unit, _)| reached(*unit)) else {
        return format!("{bytes} B");
    };
    if bytes.is_multiple_of(unit) {
        format!("{} {name}", bytes / unit)
    } else {
        format!("{:.1} {name}", bytes as f64 / unit as f64)
    }
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

typed_id!(
    /// A job, minted at the edge (server or simulator), never reused.
    /// Shown as its number, as users name it (`ebb show 42`).
    JobId(u64),
    ""
);
typed_id!(
    /// A node. The scheduling core hands these out densely as nodes join,
    /// so they double as indices; names live at the edge.
    NodeId(u32),
    "n"
);
typed_id!(
    /// A tenant (an organisation owning jobs, tokens, reservations, bills).
    /// Shown as its number, as the store keys it.
    TenantId(u32),
    ""
);
typed_id!(
    /// A reservation of committed capacity.
    ReservationId(u32),
    "r"
);
typed_id!(
    /// A GPU model, interned by the scheduling core (`H100-80GB` -> 0, ...).
    GpuModelId(u16),
    "m"
);

/// The attempt number of a job: 1 for its first run, +1 for each requeue.
/// Together with the job id it fences stale processes: anything reported
/// about an attempt other than the job's current one is refused.
/// `Attempt(0)` (the default) is no attempt: a job not yet placed.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Attempt(pub u32);

impl JobId {
    /// The id minted after this one.
    pub fn next(self) -> JobId {
        JobId(self.0 + 1)
    }
}

impl Attempt {
    /// The attempt after this one.
    pub fn next(self) -> Attempt {
        Attempt(self.0 + 1)
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Capacity tiers, in fixed order of precedence: a lower `rank` wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Reserved,
    OnDemand,
    Preemptible,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Reserved, Tier::OnDemand, Tier::Preemptible];

    /// Precedence: reserved (0) > on-demand (1) > preemptible (2).
    pub fn rank(self) -> u8 {
        self as u8
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Reserved => "reserved",
            Tier::OnDemand => "on-demand",
            Tier::Preemptible => "preemptible",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tier name that is not one of the three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownTier(pub String);

impl fmt::Display for UnknownTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown tier {:?}: expected {TIER_NAMES}", self.0)
    }
}

impl std::error::Error for UnknownTier {}

/// The tiers as people may write them, wherever Ebb reads one: each
/// name, with the aliases taken for it.
pub const TIER_NAMES: &str = "preemptible (also spot), on-demand (also ondemand) or reserved";

/// A tier by its name or an alias (`spot`, what the clouds call
/// preemptible capacity; `ondemand`, `on_demand`), in any case.
impl std::str::FromStr for Tier {
    type Err = UnknownTier;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "reserved" => Ok(Tier::Reserved),
            "on-demand" | "ondemand" | "on_demand" => Ok(Tier::OnDemand),
            "preemptible" | "spot" => Ok(Tier::Preemptible),
            _ => Err(UnknownTier(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tier_is_read_by_its_name_or_an_alias_in_any_case() {
        use super::Tier;
        for (given, tier) in [
            ("preemptible", Tier::Preemptible),
            ("Spot", Tier::Preemptible),
            ("ON-DEMAND", Tier::OnDemand),
            ("ondemand", Tier::OnDemand),
            ("on_demand", Tier::OnDemand),
            ("reserved", Tier::Reserved),
        ] {
            assert_eq!(given.parse::<Tier>(), Ok(tier), "{given}");
        }
        let refused = "on demand".parse::<Tier>().unwrap_err().to_string();
        assert_eq!(
            refused,
            "unknown tier \"on demand\": expected preemptible (also spot), on-demand (also ondemand) or reserved"
        );
    }

    #[test]
    fn one_gpu_is_singular() {
        assert_eq!(super::count(1, "GPU"), "1 GPU");
        assert_eq!(super::count(0, "GPU"), "0 GPUs");
        assert_eq!(super::count(8, "preemption"), "8 preemptions");
    }

    #[test]
    fn sizes_read_in_the_largest_unit_they_reach() {
        use super::bytes_text;
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(1024), "1 KiB");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(64 << 20), "64 MiB");
        assert_eq!(bytes_text(3 << 19), "1.5 MiB");
        assert_eq!(bytes_text(5 << 30), "5 GiB");
        assert_eq!(bytes_text((1 << 30) - 1), "1.0 GiB");
        assert_eq!(bytes_text((1 << 20) - 51), "1.0 MiB");
        assert_eq!(bytes_text((1 << 20) - 52), "1023.9 KiB");
        assert_eq!(bytes_text(1 << 40), "1 TiB");
        assert_eq!(bytes_text(u64::MAX), "16777216.0 TiB");
    }
}
