//! How every command prints for scripts: `--json`, and the API's JSON
//! as the server sent it, pretty-printed.

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
