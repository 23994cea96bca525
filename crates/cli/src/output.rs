//! How every command prints for scripts: `--json`, and the API's JSON
//! as the server sent it, pretty-printed.

use crate::error::{usage, CliError};
use clap::Args;

#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

/// `value` as pretty JSON, with a final newline.
pub fn json<T: serde::Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("serialisable");
    text.push('\n');
    text
}

/// A tier as people write it (`ebb_core::TIER_NAMES`), as the API's
/// name; anything else is refused naming them.
pub fn tier(text: &str) -> Result<String, CliError> {
    match text.parse::<ebb_core::Tier>() {
        Ok(tier) => Ok(tier.as_str().into()),
        Err(_) => Err(usage(format!("expected {}", ebb_core::TIER_NAMES))),
    }
}

#[cfg(test)]
mod tests {
    use super::tier;

    #[test]
    fn tiers_are_read_as_people_write_them() {
        for (given, meant) in [("spot", "preemptible"), ("Spot", "preemptible"), ("ondemand", "on-demand")] {
            assert_eq!(tier(given).unwrap(), meant);
        }
        for wrong in ["", "premptible", "on demand", "\u{0}", &"x".repeat(100_000)] {
            assert!(tier(wrong).unwrap_err().to_string().contains("spot"), "{wrong:?}");
        }
    }
}
