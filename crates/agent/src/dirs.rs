//! The directories the agent keeps for jobs: each attempt's run directory
//! and default working directory under the data directory, each tenant's
//! and job's checkpoint directory under the checkpoint root, and the
//! sweep that removes finished attempts' directories after the retention
//! period (never a checkpoint directory).
//!
//! A job owns its directories, and on a root agent it could plant a
//! symbolic link where the agent is about to work: directories are opened
//! without following links and changed through that descriptor, and files
//! the agent writes into them are created fresh. Everything here is
//! blocking file I/O: callers run it on a blocking thread.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ebb_api::AttemptRef;

use crate::identity::Identity;

/// Creates `path` (and its parents) if missing, and gives it `mode` and,
/// on a root agent, the owner `who` (none: the agent's own), writing only
/// what differs: a start changes no metadata it need not. Returns whether
/// it was created.
///
/// The directory is opened without following a symbolic link and changed
/// through that descriptor: a job that plants a link where one of its
/// directories will be (its tenant's checkpoint root is its own) gets an
/// error, never the root agent handing the link's target to its user.
pub(crate) fn own_dir(path: &Path, mode: u32, who: Option<&Identity>) -> Result<bool, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |e: std::io::Error| format!("cannot prepare {}: {e}", path.display());
    let created = create(path, mode).map_err(fail)?;
    // The agent's own directories are where the operator says, links or not.
    let no_follow = if who.is_some() { libc::O_NOFOLLOW } else { 0 };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | no_follow)
        .open(path)
        .map_err(|e| match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            format!("cannot prepare {}: it is a symbolic link, which is refused", path.display())
        }
        _ => fail(e),
    })?;
    let meta = dir.metadata().map_err(fail)?;
    if let Some(who) = who.filter(|w| w.switch) {
        if (meta.uid(), meta.gid()) != (who.uid.as_raw(), who.gid.as_raw()) {
            std::os::unix::fs::fchown(&dir, Some(who.uid.as_raw()), Some(who.gid.as_raw())).map_err(fail)?;
        }
    }
    if meta.mode() & 0o7777 != mode {
        dir.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(fail)?;
    }
    Ok(created)
}

/// Makes directory `path` with `mode` (its parents as they come), saying
/// whether it was made.
fn create(path: &Path, mode: u32) -> std::io::Result<bool> {
    use std::os::unix::fs::DirBuilderExt;
    let create = || std::fs::DirBuilder::new().mode(mode).create(path);
    match create() {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(path.parent().unwrap_or(path)).and_then(|()| create())?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Writes `body` to `path` in a directory the job owns, atomically (a
/// temporary file, then a rename), through no link the job may have put
/// there: a fresh file replaces whatever has the temporary name.
pub(crate) fn write_job_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // create_new (O_EXCL) follows no link, dangling or not.
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
    // The agent's umask (0077) took the job's read bits off.
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.write_all(body)?;
    std::fs::rename(&tmp, path)
}

/// A tenant name as a directory name: the server allows letters, digits,
/// `-` and `_`; anything else is refused rather than trusted as a path.
pub(crate) fn tenant_dir_name(tenant: &str) -> Result<&str, String> {
    let name = if tenant.is_empty() { "default" } else { tenant };
    if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        Ok(name)
    } else {
        Err(format!("tenant {tenant:?}: not a valid tenant name"))
    }
}

/// Sets a directory's modification time to now: the retention period
/// counts from an attempt's last use of it.
pub(crate) fn touch(dir: &Path) {
    if let Err(e) = std::fs::File::open(dir).and_then(|f| f.set_modified(SystemTime::now())) {
        tracing::warn!("cannot mark {} finished: {e}", dir.display());
    }
}

/// An attempt's run directory: its drain notice and completion marker.
pub(crate) fn run_dir(data_dir: &Path, a: AttemptRef) -> PathBuf {
    data_dir.join("run").join(format!("{}-{}", a.job, a.attempt))
}

/// A job's default working directory, shared by its attempts.
pub(crate) fn default_workdir(data_dir: &Path, job: u64) -> PathBuf {
    data_dir.join("work").join(job.to_string())
}

/// Removes the run directories and default working directories under
/// `data_dir` of attempts that ended more than `retention` ago; never a
/// checkpoint directory, never one of the `running` attempts'.
pub(crate) fn sweep(data_dir: &Path, retention: Duration, running: &[AttemptRef]) {
    let cutoff = SystemTime::now().checked_sub(retention).unwrap_or(UNIX_EPOCH);
    let run_names: Vec<String> = running.iter().map(|a| format!("{}-{}", a.job, a.attempt)).collect();
    let work_names: Vec<String> = running.iter().map(|a| a.job.to_string()).collect();
    for (parent, in_use) in [("run", run_names), ("work", work_names)] {
        let Ok(entries) = std::fs::read_dir(data_dir.join(parent)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < cutoff);
            if old && !in_use.contains(&name) {
                match std::fs::remove_dir_all(entry.path()) {
                    Ok(()) => {
                        tracing::info!(dir = %entry.path().display(), "removed a finished attempt's directory")
                    }
                    Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_name_never_leaves_the_checkpoint_root() {
        assert_eq!(tenant_dir_name("team-a_1"), Ok("team-a_1"));
        assert_eq!(tenant_dir_name(""), Ok("default"));
        for bad in ["..", "../etc", "a/b", "."] {
            assert!(tenant_dir_name(bad).is_err(), "{bad}");
        }
    }
}
