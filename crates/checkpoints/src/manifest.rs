//! The manifest: what one upload of a job's checkpoint directory holds —
//! each file's path, size and SHA-256, and the step the job reported —
//! and which manifest is the latest.
//!
//! A manifest is written after every blob it names, so its presence is
//! the upload's commit. Its key orders it: `manifests/<attempt>-<seq>`,
//! both zero-padded, so the newest is the greatest key and an attempt's
//! uploads follow its predecessors' whatever the nodes' clocks say.

use serde::{Deserialize, Serialize};

/// The format of manifests this build writes and reads.
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub job: u64,
    /// The attempt that uploaded it, and its upload's number within it.
    pub attempt: u32,
    pub seq: u32,
    /// The step of the checkpoint report that started the upload; none for
    /// the upload at the attempt's end or a report without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// When it was written, milliseconds since the Unix epoch (the
    /// uploading node's clock: for people, never for ordering).
    pub written_ms: u64,
    /// Sorted by path.
    pub files: Vec<FileEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the checkpoint directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

impl Manifest {
    /// The manifest's key under the job's prefix.
    pub fn key(&self) -> String {
        key(self.attempt, self.seq)
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// What people read: `step 12 (attempt 2, upload 3)`.
    pub fn describe(&self) -> String {
        let what = match self.step {
            Some(step) => format!("step {step}"),
            None => "the state at exit".to_string(),
        };
        format!("{what} (attempt {}, upload {})", self.attempt, self.seq)
    }

    /// Parses a manifest read from the store, refusing anything a restore
    /// must not act on: another format, another job, a path that would
    /// leave the checkpoint directory, a malformed hash.
    pub fn parse(bytes: &[u8], job: u64, key: &str) -> Result<Manifest, String> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| format!("manifest {key}: {e}"))?;
        if m.format != FORMAT {
            return Err(format!("manifest {key}: format {}, this agent reads {FORMAT}", m.format));
        }
        if m.job != job {
            return Err(format!("manifest {key}: it is job {}'s, not job {job}'s", m.job));
        }
        for f in &m.files {
            check_path(&f.path).map_err(|why| format!("manifest {key}: file {:?}: {why}", f.path))?;
            if f.sha256.len() != 64
                || !f.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(format!("manifest {key}: file {:?}: not a SHA-256: {:?}", f.path, f.sha256));
            }
        }
        Ok(m)
    }
}

/// `manifests/<attempt>-<seq>.json` with both zero-padded to 10 digits.
pub fn key(attempt: u32, seq: u32) -> String {
    format!("{attempt:010}-{seq:010}.json")
}

/// Manifest names (the last part of their keys) newest first; anything
/// that is not a manifest name is left out.
pub fn newest_first<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut names: Vec<&str> = names.into_iter().filter(|n| parse_key(n).is_some()).collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names
}

/// The attempt and upload of a manifest name.
pub fn parse_key(name: &str) -> Option<(u32, u32)> {
    let (attempt, seq) = name.strip_suffix(".json")?.split_once('-')?;
    let digits = |s: &str| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(attempt) && digits(seq)).then(|| Some((attempt.parse().ok()?, seq.parse().ok()?)))?
}

/// A path within the checkpoint directory: relative, `/`-separated, no
/// empty, `.` or `..` part, no part starting with `.` (the agent's own
/// temporaries and the job's never travel), no NUL.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.len() > 4096 {
        return Err("empty or too long");
    }
    for part in path.split('/') {
        if part.is_empty() || part.starts_with('.') || part.contains('\0') || part.len() > 255 {
            return Err("not a plain relative path");
        }
    }
    Ok(())
}

/// Which manifests to keep: the newest `keep`; the rest may go.
pub fn to_prune<'a>(names: impl IntoIterator<Item = &'a str>, keep: usize) -> Vec<&'a str> {
    newest_first(names).into_iter().skip(keep).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(attempt: u32, seq: u32) -> Manifest {
        Manifest {
            format: FORMAT,
            job: 7,
            attempt,
            seq,
            step: Some(3),
            written_ms: 1,
            files: vec![FileEntry { path: "ckpt-3.ckpt".into(), size: 5, sha256: "ab".repeat(32) }],
        }
    }

    #[test]
    fn the_latest_is_the_newest_attempt_then_its_newest_upload() {
        let names = [key(2, 9), key(10, 1), key(2, 10), "junk".into(), key(3, 1), "0000000010-1.json".into()];
        let newest = newest_first(names.iter().map(String::as_str));
        assert_eq!(newest, vec![key(10, 1), key(3, 1), key(2, 10), key(2, 9)]);
        // A late upload from attempt 3 (a lost node's) never hides attempt 10's.
        assert_eq!(to_prune(names.iter().map(String::as_str), 2), vec![key(2, 10), key(2, 9)]);
        assert_eq!(parse_key(&key(4_000_000_000, 3)), Some((4_000_000_000, 3)));
    }

    #[test]
    fn a_manifest_that_would_write_outside_the_directory_is_refused() {
        let good = manifest(1, 1);
        let bytes = serde_json::to_vec(&good).unwrap();
        assert_eq!(Manifest::parse(&bytes, 7, "k").unwrap(), good);
        assert!(Manifest::parse(&bytes, 8, "k").unwrap_err().contains("job 7's, not job 8's"));
        for bad in ["../x", "/etc/passwd", "a//b", "a/./b", ".hidden", "a/..", ""] {
            let mut m = manifest(1, 1);
            m.files[0].path = bad.into();
            let e = Manifest::parse(&serde_json::to_vec(&m).unwrap(), 7, "k").unwrap_err();
            assert!(e.contains("file"), "{bad}: {e}");
        }
        let mut m = manifest(1, 1);
        m.files[0].sha256 = "XYZ".into();
        assert!(Manifest::parse(&serde_json::to_vec(&m).unwrap(), 7, "k").unwrap_err().contains("SHA-256"));
        let mut m = manifest(1, 1);
        m.format = 2;
        assert!(Manifest::parse(&serde_json::to_vec(&m).unwrap(), 7, "k").unwrap_err().contains("format 2"));
    }
}
