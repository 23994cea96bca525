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

/// A tier as people write it: the API's names, `ondemand` and `on_demand`,
/// and `spot` (what the clouds call preemptible capacity), as the API's
/// name; anything else is refused naming the three.
pub fn tier(text: &str) -> Result<String, CliError> {
    match text.to_ascii_lowercase().as_str() {
        "preemptible" | "spot" => Ok("preemptible".into()),
        "on-demand" | "ondemand" | "on_demand" => Ok("on-demand".into()),
        "reserved" => Ok("reserved".into()),
        _ => Err(usage("expected preemptible (also spot), on-demand or reserved")),
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
