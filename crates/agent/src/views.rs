//! Views of the image cache for jobs' steps: an image's root file system
//! mounted read-only under `DATA_DIR/views/JOB-ATTEMPT/` (the agent's
//! directory, which only the job's group may pass through), idmapped so that what root owns in the
//! image the job's user owns in the view. A step's container (Pyxis'
//! `srun --container-image`) is then made by the job's user alone, with
//! no privilege: its overlay's lower layer is the view, and inside its
//! user namespace the image's files are root's again for a remapped root,
//! or the user's own, as enroot unpacks them. The cache itself is never
//! reachable, nor writable, by a job.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The directory of every attempt's views.
pub(crate) fn root(data_dir: &Path) -> PathBuf {
    data_dir.join("views")
}

/// Mounts `source` read-only at `target` (an empty directory), files of
/// uid and gid 0 shown as `uid` and `gid`; the image's other owners show
/// as the overflow ids, and nothing in it is setuid or a device.
pub(crate) fn mount(source: &Path, target: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let userns = mapping(uid, gid)?;
    let tree = open_tree(source)?;
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP
            | libc::MOUNT_ATTR_RDONLY
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: the descriptors are open, the path and attr outlive the call.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let target =
        std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: as above.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_fd().as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A detached copy of the mount tree at `source`.
fn open_tree(source: &Path) -> std::io::Result<OwnedFd> {
    let path =
        std::ffi::CString::new(source.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: the path outlives the call; a descriptor it returns is ours.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A user namespace mapping 0 to `uid` and `gid`, which an idmapped mount
/// takes its mapping from: a short-lived process's, made for it.
fn mapping(uid: u32, gid: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::process::CommandExt;
    let sleep =
        ["/bin/sleep", "/usr/bin/sleep"].into_iter().find(|p| Path::new(p).exists()).unwrap_or("sleep");
    let mut command = std::process::Command::new(sleep);
    command.arg("600").stdin(std::process::Stdio::null());
    // SAFETY: between fork and exec the child only calls unshare(2).
    unsafe {
        command.pre_exec(|| nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(Into::into));
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    let made = (|| {
        std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1\n"))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1\n"))?;
        std::fs::File::open(format!("/proc/{pid}/ns/user"))
    })();
    let _ = child.kill();
    let _ = child.wait();
    made
}

/// Unmounts every view of the attempt whose directory is `dir`, and
/// removes it.
pub(crate) fn remove(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let _ = nix::mount::umount2(&entry.path(), nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(entry.path());
    }
    let _ = std::fs::remove_dir(dir);
}

/// What an agent before this one left: every attempt's views go.
pub(crate) fn remove_all(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(root(data_dir)) else { return };
    for entry in entries.flatten() {
        remove(&entry.path());
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// On a root host: a view shows root's files as the user's, is
    /// read-only, and goes with its attempt.
    #[test]
    fn a_view_shows_roots_files_as_the_users_and_cannot_be_written() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: idmapped mounts need root");
            return;
        }
        let base = std::env::temp_dir().join(format!("ebb-views-{}", std::process::id()));
        let (image, views) = (base.join("image"), base.join("views"));
        std::fs::create_dir_all(image.join("etc")).unwrap();
        std::fs::write(image.join("etc/marker"), b"image").unwrap();
        let dir = views.join("7-1");
        let at = dir.join("abc");
        std::fs::create_dir_all(&at).unwrap();
        mount(&image, &at, 65534, 65534).unwrap();
        let meta = std::fs::metadata(at.join("etc/marker")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "root's file is the user's in the view");
        assert_eq!(std::fs::metadata(image.join("etc/marker")).unwrap().uid(), 0, "and root's in the image");
        assert_eq!(std::fs::read(at.join("etc/marker")).unwrap(), b"image");
        let written = std::fs::write(at.join("etc/marker"), b"changed");
        assert_eq!(written.unwrap_err().raw_os_error(), Some(libc::EROFS));
        remove(&dir);
        assert!(!dir.exists(), "the view is unmounted and gone");
        assert_eq!(std::fs::read(image.join("etc/marker")).unwrap(), b"image");
        let _ = std::fs::remove_dir_all(&base);
    }
}
