//! An error with what caused it, in words: an HTTP client's or a
//! database driver's outermost error (`error sending request`, `error
//! performing TLS handshake`) seldom says what went wrong; its causes do.

use std::error::Error;

/// `e` and each of its causes, outermost first, joined by `: `; a cause
/// whose words the text so far already holds is not said twice.
pub fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let words = c.to_string();
        if !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        cause = c.source();
    }
    text
}

/// The innermost cause of `e`, which names what happened (`Connection
/// refused (os error 111)`).
pub fn innermost(e: &dyn Error) -> String {
    let mut cause = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Failed(&'static str, Option<Box<Failed>>);

    impl std::fmt::Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Failed {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    #[test]
    fn a_chain_says_each_cause_once_and_the_innermost_is_the_root() {
        let root = Failed("Connection refused (os error 111)", None);
        let middle = Failed("tcp connect error: Connection refused (os error 111)", Some(Box::new(root)));
        let top = Failed("error sending request", Some(Box::new(middle)));
        assert_eq!(
            chain(&top),
            "error sending request: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(innermost(&top), "Connection refused (os error 111)");
        let alone = Failed("no cause", None);
        assert_eq!((chain(&alone), innermost(&alone)), ("no cause".to_string(), "no cause".to_string()));
    }
}
