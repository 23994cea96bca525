//! Applying one layer to a root file system, as the OCI image spec says
//! ("Applying Changesets"): a `.wh.NAME` entry removes `NAME` of the
//! layers below, `.wh..wh..opq` empties its directory of what the layers
//! below put there, an entry replaces what was at its path (a directory
//! stays a directory and takes the entry's metadata), and hard links
//! point inside the root. Paths that would leave the root, by `..` or by a
//! symbolic link of an earlier layer, are refused (the `tar` crate's
//! `unpack_in`).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Applies the layer in `blob` (a tar, gzip-compressed or not) to `root`.
pub fn apply_layer(blob: &Path, root: &Path) -> std::io::Result<()> {
    let mut file = File::open(blob)?;
    let mut magic = [0u8; 2];
    let gzip = file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b];
    file.seek(SeekFrom::Start(0))?;
    let file = BufReader::with_capacity(1 << 20, file);
    if gzip {
        apply(tar::Archive::new(flate2::read::GzDecoder::new(file)), root)
    } else {
        apply(tar::Archive::new(file), root)
    }
}

fn apply<R: Read>(mut archive: tar::Archive<R>, root: &Path) -> std::io::Result<()> {
    archive.set_overwrite(true);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    // Owners as the image says where the cache is root's (a node), the
    // unpacker's own otherwise (a test's unprivileged run).
    archive.set_preserve_ownerships(is_root());
    // What this layer itself put, which its opaque markers must keep.
    let mut own: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let Some(path) = relative(&entry.path()?) else {
            return Err(std::io::Error::other(format!(
                "layer entry {:?} leaves the root",
                entry.path().map(|p| p.display().to_string()).unwrap_or_default()
            )));
        };
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if name == OPAQUE {
            empty_below(root, &parent, &own)?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            remove(&root.join(&parent).join(hidden))?;
            continue;
        }
        let target = root.join(&path);
        let is_dir = entry.header().entry_type().is_dir();
        if let Ok(meta) = std::fs::symlink_metadata(&target) {
            if !(is_dir && meta.is_dir()) {
                remove(&target)?;
            }
        }
        if !entry.unpack_in(root)? {
            return Err(std::io::Error::other(format!("layer entry {} leaves the root", path.display())));
        }
        own.insert(path);
    }
    Ok(())
}

/// `path` inside the root: leading `/` and `.` dropped, `None` for `..`.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Removes what lies in `dir` but this layer's own entries.
fn empty_below(root: &Path, dir: &Path, own: &HashSet<PathBuf>) -> std::io::Result<()> {
    let Ok(children) = std::fs::read_dir(root.join(dir)) else { return Ok(()) };
    for child in children {
        let child = child?;
        if !own.contains(&dir.join(child.file_name())) {
            remove(&child.path())?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> std::io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer made of (path, contents; None: a directory; Some("->x"):
    /// a symbolic link to x; Some("=>x"): a hard link to x).
    fn layer(dir: &Path, name: &str, entries: &[(&str, Option<&str>)]) -> PathBuf {
        let path = dir.join(name);
        let file = File::create(&path).unwrap();
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast()));
        for (p, contents) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o755);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match contents {
                None => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    builder.append_data(&mut header, p, std::io::empty()).unwrap();
                }
                Some(link) if link.starts_with("->") || link.starts_with("=>") => {
                    let kind =
                        if link.starts_with("->") { tar::EntryType::Symlink } else { tar::EntryType::Link };
                    header.set_entry_type(kind);
                    header.set_size(0);
                    builder.append_link(&mut header, p, &link[2..]).unwrap();
                }
                Some(text) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(text.len() as u64);
                    builder.append_data(&mut header, p, text.as_bytes()).unwrap();
                }
            }
        }
        builder.into_inner().unwrap().finish().unwrap();
        path
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-unpack-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn whiteouts_opaque_directories_replacements_and_hard_links_follow_the_image_spec() {
        let dir = tempdir("spec");
        let root = dir.join("rootfs");
        std::fs::create_dir(&root).unwrap();
        let base = layer(
            &dir,
            "1.tgz",
            &[
                ("etc", None),
                ("etc/gone", Some("old")),
                ("etc/kept", Some("kept")),
                ("opt", None),
                ("opt/a", Some("a")),
                ("opt/sub", None),
                ("opt/sub/b", Some("b")),
                ("swap", None),
                ("swap/x", Some("x")),
            ],
        );
        let top = layer(
            &dir,
            "2.tgz",
            &[
                ("etc/.wh.gone", Some("")),
                ("opt", None),
                ("opt/.wh..wh..opq", Some("")),
                ("opt/new", Some("new")),
                ("swap", Some("now a file")),
                ("bin", None),
                ("bin/busybox", Some("#!")),
                ("bin/sh", Some("=>bin/busybox")),
                ("bin/ls", Some("->busybox")),
            ],
        );
        apply_layer(&base, &root).unwrap();
        apply_layer(&top, &root).unwrap();
        assert!(!root.join("etc/gone").exists(), "a whiteout removes the lower file");
        assert_eq!(std::fs::read_to_string(root.join("etc/kept")).unwrap(), "kept");
        assert!(
            !root.join("opt/a").exists() && !root.join("opt/sub").exists(),
            "opaque empties the lower dir"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("opt/new")).unwrap(),
            "new",
            "but keeps its own layer's"
        );
        assert_eq!(std::fs::read_to_string(root.join("swap")).unwrap(), "now a file");
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (root.join("bin/busybox").metadata().unwrap(), root.join("bin/sh").metadata().unwrap());
        assert_eq!(a.ino(), b.ino(), "a hard link is a link inside the root");
        assert_eq!(std::fs::read_link(root.join("bin/ls")).unwrap(), Path::new("busybox"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entries_that_leave_the_root_are_refused() {
        let dir = tempdir("escape");
        let root = dir.join("rootfs");
        std::fs::create_dir(&root).unwrap();
        // A symbolic link to outside, then a file written through it.
        let through =
            layer(&dir, "1.tgz", &[("out", Some(&format!("->{}", dir.display()))), ("out/pwned", Some("x"))]);
        assert!(apply_layer(&through, &root).is_err());
        assert!(!dir.join("pwned").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
