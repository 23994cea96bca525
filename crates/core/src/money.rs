//! Money as integer micro-dollars. Never floating point.
//!
//! Amounts are computed from GPU-milliseconds and a per-GPU-hour rate in one
//! multiplication and one division (in `i128`), so that summing usage first
//! and pricing once gives the same answer as a person with a calculator.
//!
//! Every amount and every sum saturates at the range of `i64` (about
//! $9.2 trillion) instead of overflowing: a price book and a reservation
//! that no operator would write (the highest price for eight thousand
//! years) must not stop the server that reports on them.

use std::fmt;
use std::ops::{Add, AddAssign};

/// An amount in micro-dollars (1 USD = 1,000,000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MicroUsd(pub i64);

const MILLIS_PER_HOUR: i128 = 3_600_000;

impl MicroUsd {
    pub const ZERO: MicroUsd = MicroUsd(0);

    /// Whole dollars and cents, e.g. from a price book entry `2.50`.
    pub fn from_usd_cents(cents: i64) -> MicroUsd {
        MicroUsd(cents * 10_000)
    }

    /// Parses a decimal dollar amount (`"2.5"`, `"0.000001"`) exactly,
    /// refusing more than six decimals and negative values.
    pub fn parse_usd(text: &str) -> Result<MicroUsd, String> {
        let text = text.trim();
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || (!frac.is_empty() && !digits(frac)) {
            return Err(format!("not a non-negative dollar amount: {text:?}"));
        }
        if frac.len() > 6 {
            return Err(format!("more than six decimals (micro-dollars): {text:?}"));
        }
        let whole: i64 = whole.parse().map_err(|_| format!("dollar amount out of range: {text:?}"))?;
        let frac_micros: i64 =
            if frac.is_empty() { 0 } else { format!("{frac:0<6}").parse().expect("six ascii digits") };
        whole
            .checked_mul(1_000_000)
            .and_then(|m| m.checked_add(frac_micros))
            .map(MicroUsd)
            .ok_or_else(|| format!("dollar amount out of range: {text:?}"))
    }

    /// The amount for `gpu_millis` GPU-milliseconds at `rate` per GPU-hour,
    /// rounded down to the micro-dollar.
    pub fn for_gpu_millis(rate_per_gpu_hour: MicroUsd, gpu_millis: u128) -> MicroUsd {
        let gpu_millis = i128::try_from(gpu_millis).unwrap_or(i128::MAX);
        let amount = i128::from(rate_per_gpu_hour.0).saturating_mul(gpu_millis) / MILLIS_PER_HOUR;
        MicroUsd(amount.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
    }

    /// The sum of `amounts`, saturating.
    pub fn total(amounts: impl IntoIterator<Item = i64>) -> i64 {
        amounts.into_iter().fold(0i64, i64::saturating_add)
    }

    /// The amount in dollars, for display and reports only.
    pub fn as_usd_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// An amount for people: dollars to the cent, rounded half away from
    /// zero (`12.35`). What a person reads on an invoice; the exact
    /// micro-dollars are in every `--json`.
    pub fn amount_text(self) -> String {
        self.decimals(2)
    }

    /// A price per GPU-hour for people: dollars to the hundredth of a
    /// cent (`3.6000`), so that rates line up and a discounted rate
    /// (`1.8000`) keeps its digits.
    pub fn rate_text(self) -> String {
        self.decimals(4)
    }

    fn decimals(self, places: u32) -> String {
        let unit = 10u64.pow(6 - places);
        let rounded = (self.0.unsigned_abs() + unit / 2) / unit;
        let scale = 10u64.pow(places);
        let sign = if self.0 < 0 && rounded > 0 { "-" } else { "" };
        format!("{sign}{}.{:0width$}", rounded / scale, rounded % scale, width = places as usize)
    }
}

impl Add for MicroUsd {
    type Output = MicroUsd;
    fn add(self, rhs: MicroUsd) -> MicroUsd {
        MicroUsd(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for MicroUsd {
    fn add_assign(&mut self, rhs: MicroUsd) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl fmt::Display for MicroUsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        write!(f, "{sign}${}.{:06}", abs / 1_000_000, abs % 1_000_000)
    }
}

/// Rates for one GPU model. The preemptible rate is not stored: it is the
/// on-demand rate times the book's fixed discount, never a bid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriceBook {
    pub on_demand_per_gpu_hour: MicroUsd,
    /// Contract rate billed for every reserved GPU-hour of a reservation.
    pub reserved_per_gpu_hour: MicroUsd,
    /// Preemptible discount in basis points: 5000 = 50% off on-demand.
    pub preemptible_discount_bps: u32,
}

impl PriceBook {
    pub const DEFAULT_DISCOUNT_BPS: u32 = 5_000;

    pub fn preemptible_per_gpu_hour(&self) -> MicroUsd {
        let rate =
            self.on_demand_per_gpu_hour.0 as i128 * (10_000 - self.preemptible_discount_bps as i128) / 10_000;
        MicroUsd(rate as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_usd_is_exact() {
        assert_eq!(MicroUsd::parse_usd("2.5"), Ok(MicroUsd(2_500_000)));
        assert_eq!(MicroUsd::parse_usd("0.000001"), Ok(MicroUsd(1)));
        assert_eq!(MicroUsd::parse_usd("3"), Ok(MicroUsd(3_000_000)));
        assert!(MicroUsd::parse_usd("-1").is_err());
        assert!(MicroUsd::parse_usd("1.0000001").is_err());
        assert!(MicroUsd::parse_usd("abc").is_err());
        assert!(MicroUsd::parse_usd("").is_err());
    }

    #[test]
    fn preemptible_is_exactly_half_by_default() {
        for cents in [1, 99, 250, 1_999] {
            let book = PriceBook {
                on_demand_per_gpu_hour: MicroUsd::from_usd_cents(cents),
                reserved_per_gpu_hour: MicroUsd::ZERO,
                preemptible_discount_bps: PriceBook::DEFAULT_DISCOUNT_BPS,
            };
            assert_eq!(book.preemptible_per_gpu_hour().0 * 2, book.on_demand_per_gpu_hour.0);
        }
    }

    #[test]
    fn amount_for_one_gpu_hour_is_the_rate() {
        let rate = MicroUsd(2_000_000);
        assert_eq!(MicroUsd::for_gpu_millis(rate, 3_600_000), rate);
        assert_eq!(MicroUsd::for_gpu_millis(rate, 8 * 1_800_000), MicroUsd(8_000_000));
        assert_eq!(MicroUsd(2_500_000).to_string(), "$2.500000");
    }

    #[test]
    fn amounts_read_to_the_cent_and_rates_to_four_decimals() {
        assert_eq!(MicroUsd(2_500_000).amount_text(), "2.50");
        assert_eq!(MicroUsd(101_111).amount_text(), "0.10");
        assert_eq!(MicroUsd(105_000).amount_text(), "0.11");
        assert_eq!(MicroUsd(0).amount_text(), "0.00");
        assert_eq!(MicroUsd(4_999).amount_text(), "0.00");
        assert_eq!(MicroUsd(-4_999).amount_text(), "0.00");
        assert_eq!(MicroUsd(-1_235_000).amount_text(), "-1.24");
        assert_eq!(MicroUsd(i64::MAX).amount_text(), "9223372036854.78");
        assert_eq!(MicroUsd(3_600_000).rate_text(), "3.6000");
        assert_eq!(MicroUsd(1_800_000).rate_text(), "1.8000");
        assert_eq!(MicroUsd(1_234_567).rate_text(), "1.2346");
        assert_eq!(MicroUsd(2).rate_text(), "0.0000");
    }
}
