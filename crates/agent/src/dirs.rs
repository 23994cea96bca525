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

/// Why a job's directory could not be made its own.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot prepare {}: {source}", path.display())]
    Prepare { path: PathBuf, source: std::io::Error },
    /// A job planted a link where one of its directories goes.
    #[error("cannot prepare {}: it is a symbolic link, which is refused", .0.display())]
    Link(PathBuf),
    #[error("tenant {0:?}: not a valid tenant name")]
    TenantName(String),
}

/// Creates `path` (and its parents) if missing, and gives it `mode` and,
/// on a root agent, the owner `who` (none: the agent's own), writing only
/// what differs: a start changes no metadata it need not. Returns whether
/// it was created.
///
/// The directory is opened without following a symbolic link and changed
/// through that descriptor: a job that plants a link where one of its
/// directories will be (its tenant's checkpoint root is its own) gets an
/// error, never the root agent handing the link's target to its user.
pub(crate) fn own_dir(path: &Path, mode: u32, who: Option<&Identity>) -> Result<bool, DirError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |source: std::io::Error| DirError::Prepare { path: path.to_path_buf(), source };
    let created = create(path, mode).map_err(fail)?;
    // The agent's own directories are where the operator says, links or not.
    let no_follow = if who.is_some() { libc::O_NOFOLLOW } else { 0 };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | no_follow)
        .open(path)
        .map_err(|e| match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => DirError::Link(path.to_path_buf()),
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

/// Notice files made ahead. Creating a file is the dearest step of a
/// notice: a new inode, and where ext4 keeps no journal and files come
/// and go, its search for a free one passes over every inode freed in the
/// last seconds (a tenth of a millisecond on a busy test machine), on the
/// path from a preemptor's submit to its victim's signal. So a few empty
/// files wait, each held open, in the agent's own directory beside the run
/// directories (on their file system, where jobs cannot write); a notice
/// is written into one and renamed into place, the same atomic step as
/// [`write_job_file`]'s, and another is made once the poll's commands
/// have been carried out ([`NoticeFiles::refill`]). Without one ready, or
/// if its rename fails, the notice is written as any job file is.
pub(crate) struct NoticeFiles {
    dir: PathBuf,
    ready: std::sync::Mutex<Vec<(PathBuf, std::fs::File)>>,
    /// Files made so far: the next one's name.
    made: std::sync::atomic::AtomicU64,
}

impl NoticeFiles {
    /// Files kept ready: one for each attempt of an 8-GPU node drained at
    /// once (a poll's notices); a notice past them is written as any job
    /// file is.
    pub const KEEP: usize = 8;

    /// The files in `dir` (created 0700 if missing), which an earlier
    /// agent's files are cleared from, and [`NoticeFiles::KEEP`] made. A
    /// directory that cannot be prepared is said in the log: notices are
    /// then written as any job file is.
    pub(crate) fn new(dir: PathBuf) -> NoticeFiles {
        let files = NoticeFiles { dir, ready: Default::default(), made: Default::default() };
        let clear = |dir: &Path| -> std::io::Result<()> {
            for entry in std::fs::read_dir(dir)? {
                std::fs::remove_file(entry?.path())?;
            }
            Ok(())
        };
        let cleared = own_dir(&files.dir, 0o700, None).and_then(|_| {
            clear(&files.dir).map_err(|source| DirError::Prepare { path: files.dir.clone(), source })
        });
        match cleared {
            Ok(()) => files.refill(),
            Err(e) => tracing::warn!("cannot prepare notice files in {}: {e}", files.dir.display()),
        }
        files
    }

    /// Writes `body` to `path` in a directory the job owns, atomically,
    /// as [`write_job_file`] does: from a file made ahead where one is
    /// ready.
    pub(crate) fn write(&self, path: &Path, body: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let made = self.ready.lock().expect("notice files").pop();
        if let Some((ready, file)) = made {
            // The rename moves whatever the job put at `path` aside, a
            // link included, and follows none.
            match file.write_all_at(body, 0).and_then(|()| std::fs::rename(&ready, path)) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!("a notice file made ahead: {e}; writing {} afresh", path.display());
                    let _ = std::fs::remove_file(&ready);
                }
            }
        }
        write_job_file(path, body)
    }

    /// Makes files up to [`NoticeFiles::KEEP`] again.
    pub(crate) fn refill(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        use std::sync::atomic::Ordering;
        while self.ready.lock().expect("notice files").len() < Self::KEEP {
            let path = self.dir.join(self.made.fetch_add(1, Ordering::Relaxed).to_string());
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
                // The agent's umask (0077) took the job's read bits off.
                .and_then(|file| file.set_permissions(std::fs::Permissions::from_mode(0o644)).map(|()| file));
            match made {
                Ok(file) => self.ready.lock().expect("notice files").push((path, file)),
                Err(e) => {
                    tracing::warn!("cannot make a notice file {}: {e}", path.display());
                    return;
                }
            }
        }
    }

    /// How many are ready now.
    #[cfg(test)]
    fn ready(&self) -> usize {
        self.ready.lock().expect("notice files").len()
    }
}

/// A tenant name as a directory name: the server allows letters, digits,
/// `-` and `_`; anything else is refused rather than trusted as a path.
pub(crate) fn tenant_dir_name(tenant: &str) -> Result<&str, DirError> {
    let name = if tenant.is_empty() { "default" } else { tenant };
    if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        Ok(name)
    } else {
        Err(DirError::TenantName(tenant.to_string()))
    }
}

/// Sets a directory's modification time to now: the retention period
/// counts from an attempt's last use of it. One `utimensat`, on the
/// directory itself and never a link the job put in its place.
pub(crate) fn touch(dir: &Path) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let touched = utimensat(
        nix::fcntl::AT_FDCWD,
        dir,
        &TimeSpec::UTIME_OMIT,
        &TimeSpec::UTIME_NOW,
        UtimensatFlags::NoFollowSymlink,
    );
    if let Err(e) = touched {
        tracing::warn!("cannot mark {} finished: {e}", dir.display());
    }
}

/// An attempt's run directory: its drain notice and completion marker.
pub(crate) fn run_dir(data_dir: &Path, a: AttemptRef) -> PathBuf {
    data_dir.join("run").join(format!("{}-{}", a.job, a.attempt))
}

/// The files an earlier part of the same attempt left in its run
/// directory (an elastic job grown back onto a node it had left): its
/// drain notice, change of nodes and completion marker are not the new
/// part's, which would take the notice for its own drain. Whatever the
/// job put under those names goes too (a link itself, not what it
/// names; a directory with what it holds).
pub(crate) fn clear_earlier_part(run_dir: &Path) -> Result<(), DirError> {
    for name in [DRAIN_FILE, MEMBERS_FILE, COMPLETION_FILE] {
        let path = run_dir.join(name);
        let removed = match std::fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(_) if path.is_dir() && !path.is_symlink() => std::fs::remove_dir_all(&path),
            other => other,
        };
        removed.map_err(|source| DirError::Prepare { path, source })?;
    }
    Ok(())
}

/// In an attempt's run directory, its drain or cancel notice
/// (`EBB_DRAIN_FILE`).
pub(crate) const DRAIN_FILE: &str = "drain.json";
/// In an elastic attempt's run directory, its latest change of nodes
/// (`EBB_MEMBERS_FILE`).
pub(crate) const MEMBERS_FILE: &str = "members.json";
/// In an attempt's run directory, the job's completion marker
/// (`EBB_COMPLETION_FILE`).
pub(crate) const COMPLETION_FILE: &str = "complete";

/// A job's default working directory, shared by its attempts.
pub(crate) fn default_workdir(data_dir: &Path, job: ebb_core::JobId) -> PathBuf {
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
        assert_eq!(tenant_dir_name("team-a_1").unwrap(), "team-a_1");
        assert_eq!(tenant_dir_name("").unwrap(), "default");
        for bad in ["..", "../etc", "a/b", "."] {
            assert!(matches!(tenant_dir_name(bad), Err(DirError::TenantName(t)) if t == bad), "{bad}");
        }
    }

    /// A part of an elastic attempt grown back onto a node it left finds
    /// its run directory as the leaving part left it: the notice, the
    /// change of nodes and the marker go; the job's own files stay.
    #[test]
    fn a_part_started_again_finds_no_earlier_parts_notice() {
        let dir = std::env::temp_dir().join(format!("ebb-dirs-earlier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["drain.json", "complete", "script.sh"] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        // What a job may have put there: a directory, a link to its own file.
        std::fs::create_dir_all(dir.join("members.json/inside")).unwrap();
        std::os::unix::fs::symlink(dir.join("script.sh"), dir.join("complete.link")).unwrap();
        std::fs::rename(dir.join("complete.link"), dir.join("complete")).unwrap();
        clear_earlier_part(&dir).unwrap();
        let left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(left, ["script.sh"]);
        clear_earlier_part(&dir).expect("nothing to clear is no error");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A finished attempt's directory is marked used now, and a link the
    /// job put in its place is marked, not what it points to.
    #[test]
    fn touching_a_directory_marks_it_and_follows_no_link() {
        let root = crate::testing::temp_dir("touch");
        let (dir, target, link) = (root.join("run"), root.join("target"), root.join("link"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        for path in [&dir, &target] {
            std::fs::File::open(path).unwrap().set_modified(old).unwrap();
        }
        std::os::unix::fs::symlink(&target, &link).unwrap();
        touch(&dir);
        touch(&link);
        let modified = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        assert!(modified(&dir) > old + Duration::from_secs(3000), "not marked");
        assert_eq!(modified(&target), old, "the link was followed");
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn entries(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn a_notice_goes_into_a_file_made_ahead_and_another_is_made() {
        let root = crate::testing::temp_dir("notice-files");
        let (made, run) = (root.join("notices"), root.join("run"));
        std::fs::create_dir_all(&run).unwrap();
        // An earlier agent's files are cleared.
        std::fs::create_dir_all(&made).unwrap();
        std::fs::write(made.join("7"), b"stale").unwrap();
        let files = NoticeFiles::new(made.clone());
        assert_eq!((files.ready(), entries(&made)), (NoticeFiles::KEEP, NoticeFiles::KEEP));
        assert!(std::fs::read_dir(&made)
            .unwrap()
            .all(|e| std::fs::read(e.unwrap().path()).unwrap().is_empty()));
        assert_eq!(mode(&made), 0o700, "the files wait where jobs cannot reach them");

        let drain = run.join("drain.json");
        files.write(&drain, b"{\"action\": \"drain\"}").unwrap();
        assert_eq!(std::fs::read(&drain).unwrap(), b"{\"action\": \"drain\"}");
        assert_eq!(mode(&drain), 0o644, "the job reads it");
        assert_eq!((files.ready(), entries(&made)), (NoticeFiles::KEEP - 1, NoticeFiles::KEEP - 1));
        files.refill();
        assert_eq!((files.ready(), entries(&made)), (NoticeFiles::KEEP, NoticeFiles::KEEP));

        // A later notice (a cancel after a drain) replaces the file whole,
        // shorter or not, and a link the job put there is replaced, not
        // written through.
        files.write(&drain, b"{}").unwrap();
        assert_eq!(std::fs::read(&drain).unwrap(), b"{}");
        let target = root.join("target");
        std::fs::write(&target, b"the agent's").unwrap();
        std::fs::remove_file(&drain).unwrap();
        std::os::unix::fs::symlink(&target, &drain).unwrap();
        files.write(&drain, b"{\"action\": \"cancel\"}").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"the agent's");
        assert!(!std::fs::symlink_metadata(&drain).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&drain).unwrap(), b"{\"action\": \"cancel\"}");
    }

    #[test]
    fn without_files_made_ahead_a_notice_is_written_all_the_same() {
        let root = crate::testing::temp_dir("notice-files-none");
        // Where the directory cannot be made (a file is in its way).
        std::fs::write(root.join("notices"), b"").unwrap();
        let files = NoticeFiles::new(root.join("notices"));
        assert_eq!(files.ready(), 0);
        files.write(&root.join("drain.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(root.join("drain.json")).unwrap(), b"{}");

        // Where the one ready cannot be renamed into place (the run
        // directory is gone), the error is the job file's own, and the
        // file made ahead is not kept with a notice in it.
        let root = crate::testing::temp_dir("notice-files-gone");
        let files = NoticeFiles::new(root.join("notices"));
        assert!(files.write(&root.join("gone").join("drain.json"), b"{}").is_err());
        assert_eq!(entries(&root.join("notices")), NoticeFiles::KEEP - 1);
        files.refill();
        assert!(std::fs::read_dir(root.join("notices"))
            .unwrap()
            .all(|e| std::fs::read(e.unwrap().path()).unwrap().is_empty()));
    }

    proptest::proptest! {
        /// Any notices, of any length, to a few attempts' files, with or
        /// without files made up between: each file holds the last body
        /// written to it, whole, and never more files wait than are kept.
        #[test]
        fn every_notice_file_holds_its_last_body_whole(
            notices in proptest::collection::vec(
                (0usize..3, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9000), proptest::prelude::any::<bool>()),
                1..12,
            ),
        ) {
            let root = crate::testing::temp_dir("notice-files-any");
            let files = NoticeFiles::new(root.join("notices"));
            let mut last = std::collections::HashMap::new();
            for (attempt, body, refill) in notices {
                let path = root.join(format!("drain-{attempt}.json"));
                files.write(&path, &body).unwrap();
                last.insert(path, body);
                if refill {
                    files.refill();
                }
                proptest::prop_assert!(entries(&root.join("notices")) <= NoticeFiles::KEEP);
            }
            for (path, body) in last {
                proptest::prop_assert_eq!(std::fs::read(&path).unwrap(), body);
            }
        }
    }
}
