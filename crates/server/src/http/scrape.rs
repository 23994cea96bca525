//! The tokens that may read `/metrics` and nothing else
//! (`--metrics-token-file`), rotated without a restart.
//!
//! The file holds one token a line; during a rotation it holds the old
//! and the new, then the new alone. The server reads it again whenever
//! its modification time changes (a `stat` per scrape), so a scraper is
//! never refused in between. A file that became unreadable or invalid
//! keeps the tokens read last, with a warning, rather than locking every
//! scraper out. Only SHA-256 hashes are kept, compared in constant time.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Why `--metrics-token-file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MetricsTokenError {
    #[error("--metrics-token-file {}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    #[error("--metrics-token-file {}: {why}", path.display())]
    Tokens { path: PathBuf, why: NotTokens },
}

/// A file that is not one to 16 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("one to 16 tokens, one a line, each of at least 16 characters with no spaces")]
pub struct NotTokens;

/// The scrape tokens, and where they come from.
#[derive(Debug)]
pub struct ScrapeTokens {
    file: Option<PathBuf>,
    state: Mutex<(Option<SystemTime>, Vec<String>)>,
}

impl ScrapeTokens {
    /// The tokens of `path`, read now: an error names what is wrong.
    pub fn from_file(path: &Path) -> Result<ScrapeTokens, MetricsTokenError> {
        let (modified, text) = read(path)?;
        let hashes =
            parse(&text).map_err(|why| MetricsTokenError::Tokens { path: path.to_path_buf(), why })?;
        Ok(ScrapeTokens { file: Some(path.to_path_buf()), state: Mutex::new((modified, hashes)) })
    }

    /// One token, fixed (tests).
    pub fn fixed(token: &str) -> ScrapeTokens {
        ScrapeTokens { file: None, state: Mutex::new((None, vec![super::hash_token(token)])) }
    }

    /// Whether `token` is one of them (the file read again if it changed).
    pub fn accepts(&self, token: &str) -> bool {
        let given = super::hash_token(token);
        let mut state = self.state.lock().expect("scrape tokens");
        if let Some(path) = &self.file {
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            if modified != state.0 {
                let tokens = read(path).and_then(|(m, text)| {
                    let why = |why| MetricsTokenError::Tokens { path: path.clone(), why };
                    Ok((m, parse(&text).map_err(why)?))
                });
                match tokens {
                    Ok((m, hashes)) => *state = (m, hashes),
                    Err(why) => {
                        tracing::warn!("{why}; the tokens read before stay");
                        state.0 = modified;
                    }
                }
            }
        }
        state.1.iter().fold(false, |found, hash| found | same(hash, &given))
    }
}

fn read(path: &Path) -> Result<(Option<SystemTime>, String), MetricsTokenError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| MetricsTokenError::File { path: path.to_path_buf(), source })?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Ok((modified, text))
}

/// The hashes of a file's tokens: one a line, each at least 16
/// characters with no space; at least one.
fn parse(text: &str) -> Result<Vec<String>, NotTokens> {
    let tokens: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let bad = tokens.iter().any(|t| t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()));
    if tokens.is_empty() || bad || tokens.len() > 16 {
        return Err(NotTokens);
    }
    Ok(tokens.into_iter().map(super::hash_token).collect())
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_again_when_it_changes_and_a_rotation_overlaps() {
        let dir = std::env::temp_dir().join(format!("ebb-scrape-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("metrics.token");
        let (old, new) = ("prometheus-old-0123456789", "prometheus-new-0123456789");
        let write = |text: &str, age_s: u64| {
            std::fs::write(&file, text).unwrap();
            // A distinct modification time whatever the clock's grain.
            let at = SystemTime::now() - std::time::Duration::from_secs(age_s);
            std::fs::File::options().write(true).open(&file).unwrap().set_modified(at).unwrap();
        };
        write(&format!("{old}\n"), 30);
        let tokens = ScrapeTokens::from_file(&file).unwrap();
        assert!(tokens.accepts(old) && !tokens.accepts(new));
        write(&format!("{old}\n{new}\n"), 20);
        assert!(tokens.accepts(old) && tokens.accepts(new), "both, while scrapers move over");
        write(&format!("{new}\n"), 10);
        assert!(!tokens.accepts(old) && tokens.accepts(new), "the old one is refused at once");
        write("short\n", 5);
        assert!(tokens.accepts(new), "a bad file keeps the tokens read before");
        for bad in ["short\n", "two words of a token\n", "\n\n"] {
            std::fs::write(&file, bad).unwrap();
            let refused = ScrapeTokens::from_file(&file).unwrap_err();
            assert!(matches!(refused, MetricsTokenError::Tokens { why: NotTokens, .. }), "{bad:?}");
            assert!(refused.to_string().contains("one to 16 tokens"), "{bad:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(ScrapeTokens::from_file(&file).unwrap_err().to_string().starts_with("--metrics-token-file"));
    }
}
