//! One owner per data directory.
//!
//! `ebb server`, `ebb agent` and `ebb up` each take an exclusive lock on
//! their directory before they touch anything in it, and hold it until
//! they exit: two servers on one database would each acknowledge jobs the
//! other overwrites, and two agents on one directory kill each other's
//! jobs as leftovers. The lock is `flock(2)` on `<dir>/ebb.lock`, so the
//! kernel lets go of it however the holder dies; the file holds the
//! holder's PID for the message a second process prints.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Held for as long as the process owns the directory.
pub struct DirLock {
    _file: Flock<File>,
    pub path: PathBuf,
}

/// Why a data directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("--data-dir {}: {source}", dir.display())]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error("--data-dir {}: {}: {source}", dir.display(), file.display())]
    File { dir: PathBuf, file: PathBuf, source: std::io::Error },
    #[error(
        "--data-dir {}: in use by {holder}; {what} needs a data directory of its own (stop that process, or \
         pass another --data-dir)",
        dir.display()
    )]
    InUse { dir: PathBuf, holder: String, what: String },
    #[error("--data-dir {}: cannot lock {}: {source}", dir.display(), file.display())]
    Lock { dir: PathBuf, file: PathBuf, source: nix::errno::Errno },
}

/// The lock file's name inside a data directory.
pub const LOCK_FILE: &str = "ebb.lock";

/// Takes `dir` for `what` (`ebb server`, ...), creating the directory if
/// it is missing. Fails at once, touching nothing else, if another
/// process holds it; the error names the directory and that process.
pub fn lock_dir(dir: &Path, what: &str) -> Result<DirLock, LockError> {
    std::fs::create_dir_all(dir).map_err(|source| LockError::Dir { dir: dir.to_path_buf(), source })?;
    let path = dir.join(LOCK_FILE);
    let file_error = |source| LockError::File { dir: dir.to_path_buf(), file: path.clone(), source };
    // Opened with O_CLOEXEC (std's default): no child inherits the lock.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(file_error)?;
    let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process".to_string(),
                text => format!("another process (pid {})", text.lines().next().unwrap_or(text)),
            };
            return Err(LockError::InUse { dir: dir.to_path_buf(), holder, what: what.to_string() });
        }
        Err((_, source)) => return Err(LockError::Lock { dir: dir.to_path_buf(), file: path, source }),
    };
    let pid = format!("{}\n{what}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(pid.as_bytes()))
        .map_err(file_error)?;
    Ok(DirLock { _file: file, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_with_the_holders_pid_and_the_first_keeps_the_directory() {
        let dir = std::env::temp_dir().join(format!("ebb-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = lock_dir(&dir, "ebb server").expect("first");
        // flock is per open file description: a second open in this very
        // process conflicts as another process's would.
        let err = lock_dir(&dir, "ebb server").err().expect("refused");
        assert!(matches!(&err, LockError::InUse { what, .. } if what == "ebb server"), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");
        drop(first);
        lock_dir(&dir, "ebb agent").expect("free again once the first is gone");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
