//! What the CLI writes to a person's terminal is text, never commands to
//! the terminal.
//!
//! Job names, reasons, node names and a job's output come from tenants
//! and their jobs; an operator runs `ebb jobs` and `ebb logs` on them. A
//! name holding `ESC [ 2 J` cleared the operator's screen, `ESC ] 0 ;`
//! set its window's title, and worse sequences exist. So every control
//! character but the line break and the tab (C0, DEL, C1) is written as
//! an escape (`\x1b`, `\u{9b}`), and so are the marks that reverse the
//! direction of text (U+202A–U+202E, U+2066–U+2069), which can make a
//! line read as another. JSON output needs nothing: serde escapes every
//! control character already. `ebb logs --raw` passes a job's output
//! through unchanged, for a program that wants its bytes.

use std::borrow::Cow;

/// `text` as it may be written to a terminal.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !needs_escape(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escape_sequences_are_written_as_text() {
        assert_eq!(terminal_safe("train\x1b[2J\x1b]0;owned\x07"), "train\\x1b[2J\\x1b]0;owned\\x07");
        assert_eq!(terminal_safe("a\u{9b}31m b\u{202e}txt.exe"), "a\\u{9b}31m b\\u{202e}txt.exe");
        assert_eq!(terminal_safe("carriage\rreturn\x7f"), "carriage\\x0dreturn\\x7f");
        assert!(matches!(terminal_safe("plain\tline\nnext é 漢字"), Cow::Borrowed(_)));
    }

    proptest! {
        /// Whatever a tenant puts in a name, what reaches the terminal holds
        /// no control character but line breaks and tabs; text without one
        /// is left exactly as it was.
        #[test]
        fn nothing_but_line_breaks_and_tabs_reaches_the_terminal(text in any::<String>()) {
            let shown = terminal_safe(&text);
            prop_assert!(!shown.chars().any(needs_escape), "{:?}", shown);
            if !text.chars().any(needs_escape) {
                prop_assert_eq!(shown.as_ref(), text.as_str());
            }
        }
    }
}
