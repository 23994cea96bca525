//! Applying one layer to a root file system, as the OCI image spec says
//! ("Applying Changesets"): a `.wh.NAME` entry removes `NAME` of the
//! layers below, `.wh..wh..opq` empties its directory of what the layers
//! below put there, an entry replaces what was at its path (a directory
//! stays a directory and takes the entry's metadata), and hard links
//! point inside the root.
//!
//! The problem: a layer is a tenant's, and a node unpacks it as root.
//! Every name in it is hostile: `..`, an absolute path, a symbolic link
//! the layer (or one below) just made and then a path through it, a
//! whiteout or an opaque marker under such a link, a hard link to a
//! file outside. Removing or writing through any of them would let one
//! image delete or overwrite any file on the node.
//!
//! So no path is ever handed to the kernel whole. Every operation is
//! relative to a directory descriptor reached from the root one name at
//! a time, each opened with `O_NOFOLLOW | O_DIRECTORY`: a path through a
//! symbolic link, or through something that is not a directory, is
//! refused with its entry's name, whether it comes from this layer or
//! one below (an image's own links are for the container, which resolves
//! them inside its root; the unpacker never needs them). Removal is
//! `unlinkat` on such descriptors, recursively for directories, never
//! following a link; files are made with `O_CREAT | O_EXCL | O_NOFOLLOW`
//! after what was at their path is removed, so a write never lands in
//! another file through a link, hard or symbolic. Set-user and set-group
//! bits are dropped (a container runs with `no_new_privs`, where they
//! mean nothing; on the node they would be a way up for whoever reached
//! the cache), and so are device nodes (a container's `/dev` is its
//! runtime's).
//!
//! And a layer is small on the wire but may be huge on disk: what an
//! unpack writes is counted as it goes ([`Limits`]), and it stops past the
//! image's byte budget, its count of entries, or a layer's expansion
//! ratio, before the disk fills.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fchmodat, fstatat, futimens, mkdirat, FchmodatFlags, Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, mkfifoat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// The deepest entry a layer may name, in directories: far beyond any
/// real image, and low enough that a removal holds few descriptors.
pub const MAX_DEPTH: usize = 256;
/// The longest path a layer entry may have, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// What an entry costs the byte budget besides its data: its tar header,
/// so that a layer of a million empty files is not free.
pub const ENTRY_BYTES: u64 = 512;

/// What one image may take as its layers are unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes the unpacked image may hold: its files' data, and
    /// [`ENTRY_BYTES`] for each entry.
    pub max_bytes: u64,
    /// Entries (files, directories, links) the image may have.
    pub max_entries: u64,
    /// The most a layer may grow as it is unpacked: bytes written over
    /// bytes compressed. Layers under [`Limits::EXPANSION_FLOOR`] are
    /// not held to it.
    pub max_expansion: u64,
}

impl Limits {
    /// Bytes any layer may unpack to whatever its ratio: a small layer
    /// of zeros is no bomb.
    pub const EXPANSION_FLOOR: u64 = 16 << 20;

    /// The defaults beside an image cache of `max_bytes`.
    pub fn within(max_bytes: u64) -> Limits {
        Limits { max_bytes, max_entries: 1_000_000, max_expansion: 100 }
    }
}

/// Why a layer was not applied.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The layer names a path it may not: outside the root, through a
    /// link, too deep.
    #[error("layer entry {entry:?} {why}")]
    Refused { entry: String, why: String },
    /// The layer is larger, unpacked, than its image may be.
    #[error("{0}")]
    TooLarge(String),
    /// The layer is not a tar (or not gzip), or is cut short.
    #[error("the layer cannot be read: {0}")]
    Read(std::io::Error),
    /// The node refused an operation on a valid entry (its disk is full).
    #[error("layer entry {entry:?}: {source}")]
    Io { entry: String, source: std::io::Error },
}

/// What an image's unpack has used so far, across its layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Used {
    pub bytes: u64,
    pub entries: u64,
}

/// Applies the layer in `blob` (a tar, gzip-compressed or not) to the
/// directory `root`, counting what it writes into `used` and stopping
/// past `limits`.
pub fn apply_layer(blob: &Path, root: &Path, limits: &Limits, used: &mut Used) -> Result<(), UnpackError> {
    let file = File::open(blob).map_err(UnpackError::Read)?;
    let compressed = file.metadata().map_err(UnpackError::Read)?.len();
    apply_tar(BufReader::with_capacity(1 << 20, file), compressed, root, limits, used)
}

/// [`apply_layer`] of a layer read from `blob`, `compressed` bytes long.
pub fn apply_tar(
    mut blob: impl std::io::BufRead,
    compressed: u64,
    root: &Path,
    limits: &Limits,
    used: &mut Used,
) -> Result<(), UnpackError> {
    let gzip = blob.fill_buf().map_err(UnpackError::Read)?.starts_with(&[0x1f, 0x8b]);
    let root = open_root(root)?;
    let expansion = limits.max_expansion.saturating_mul(compressed).max(Limits::EXPANSION_FLOOR);
    let mut layer =
        Layer { root, limits, used, expansion, written: 0, own: HashSet::new(), dirs: Vec::new() };
    if gzip {
        layer.apply(tar::Archive::new(flate2::read::GzDecoder::new(blob)))
    } else {
        layer.apply(tar::Archive::new(blob))
    }
}

fn open_root(root: &Path) -> Result<OwnedFd, UnpackError> {
    openat(nix::fcntl::AT_FDCWD, root, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| UnpackError::Io { entry: root.display().to_string(), source: e.into() })
}

/// One layer being applied.
struct Layer<'a> {
    root: OwnedFd,
    limits: &'a Limits,
    used: &'a mut Used,
    /// The most this layer may write.
    expansion: u64,
    /// What this layer has written.
    written: u64,
    /// What this layer itself put, which its opaque markers keep.
    own: HashSet<PathBuf>,
    /// Directories this layer made or changed, with their times, set
    /// last (a file made in one changes its time).
    dirs: Vec<(PathBuf, i64)>,
}

/// An entry's path, checked: plain names below the root.
struct Named {
    /// As the layer wrote it, for errors.
    shown: String,
    path: PathBuf,
    parts: Vec<OsString>,
}

impl Named {
    fn new(raw: &Path) -> Result<Named, UnpackError> {
        let shown = raw.display().to_string();
        let refuse = |why: &str| UnpackError::Refused { entry: shown.clone(), why: why.to_string() };
        if raw.as_os_str().len() > MAX_PATH_BYTES {
            return Err(refuse(&format!("is longer than {MAX_PATH_BYTES} bytes")));
        }
        let mut parts = Vec::new();
        for c in raw.components() {
            match c {
                Component::Normal(p) => parts.push(p.to_os_string()),
                Component::CurDir | Component::RootDir => {}
                Component::ParentDir | Component::Prefix(_) => return Err(refuse("leaves the root (..)")),
            }
        }
        if parts.len() > MAX_DEPTH {
            return Err(refuse(&format!("is deeper than {MAX_DEPTH} directories")));
        }
        if parts.iter().any(|p| p.as_bytes().contains(&0)) {
            return Err(refuse("has a NUL byte in its name"));
        }
        let path = parts.iter().collect();
        Ok(Named { shown, path, parts })
    }

    fn parent(&self) -> &[OsString] {
        &self.parts[..self.parts.len().saturating_sub(1)]
    }

    fn name(&self) -> Option<&OsStr> {
        self.parts.last().map(|p| p.as_os_str())
    }
}

impl Layer<'_> {
    fn apply<R: Read>(&mut self, mut archive: tar::Archive<R>) -> Result<(), UnpackError> {
        for entry in archive.entries().map_err(UnpackError::Read)? {
            let mut entry = entry.map_err(UnpackError::Read)?;
            let raw = entry.path().map_err(UnpackError::Read)?.into_owned();
            let named = Named::new(&raw)?;
            self.entry(&named, &mut entry)?;
        }
        for (path, mtime) in std::mem::take(&mut self.dirs).into_iter().rev() {
            let named = Named::new(&path)?;
            if let Some(dir) = self.dir(&named, &named.parts, Walk::Existing)? {
                let _ = futimens(&dir, &time(mtime), &time(mtime));
            }
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, named: &Named, entry: &mut tar::Entry<R>) -> Result<(), UnpackError> {
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
            return Ok(());
        }
        self.charge(named, ENTRY_BYTES, 1)?;
        let Some(name) = named.name() else {
            // The root itself ("./"): it stays the cache's.
            return Ok(());
        };
        if name.as_bytes() == OPAQUE.as_bytes() {
            if let Some(dir) = self.dir(named, named.parent(), Walk::Existing)? {
                let parent: PathBuf = named.parent().iter().collect();
                let names = list(&dir).map_err(|e| io(named, e))?;
                for child in names {
                    if !self.own.contains(&parent.join(&child)) {
                        remove_at(&dir, &child, 1).map_err(|e| io(named, e))?;
                    }
                }
            }
            return Ok(());
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT.as_bytes()) {
            let hidden = OsStr::from_bytes(hidden);
            let parent: PathBuf = named.parent().iter().collect();
            if hidden.is_empty() || self.own.contains(&parent.join(hidden)) {
                return Ok(());
            }
            if let Some(dir) = self.dir(named, named.parent(), Walk::Existing)? {
                remove_at(&dir, hidden, 1).map_err(|e| io(named, e))?;
            }
            return Ok(());
        }
        let parent = self.dir(named, named.parent(), Walk::Create)?.expect("made");
        let header = entry.header();
        let mode = header.mode().map_err(UnpackError::Read)? & 0o1777;
        let owner = owner(named, header)?;
        let mtime = header.mtime().map_err(UnpackError::Read)?.min(i64::MAX as u64) as i64;
        let existing = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        match kind {
            tar::EntryType::Directory => {
                if existing.is_none_or(|s| kind_of(&s) != SFlag::S_IFDIR) {
                    remove_at(&parent, name, 1).map_err(|e| io(named, e))?;
                    mkdirat(&parent, name, Mode::from_bits_truncate(0o700))
                        .map_err(|e| io(named, e.into()))?;
                }
                let dir = open_dir(&parent, name).map_err(|e| io(named, e.into()))?;
                set_owner_and_mode(&dir, owner, mode).map_err(|e| io(named, e))?;
                self.dirs.push((named.path.clone(), mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                remove_at(&parent, name, 1).map_err(|e| io(named, e))?;
                let flags =
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let fd = openat(&parent, name, flags, Mode::from_bits_truncate(0o600))
                    .map_err(|e| io(named, e.into()))?;
                let mut file = File::from(fd);
                self.copy(named, entry, &mut file)?;
                set_owner_and_mode(&file, owner, mode).map_err(|e| io(named, e))?;
                let _ = futimens(&file, &time(mtime), &time(mtime));
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Read)?
                    .ok_or_else(|| refused(named, "is a symbolic link without a target"))?;
                remove_at(&parent, name, 1).map_err(|e| io(named, e))?;
                symlinkat(target.as_ref(), &parent, name).map_err(|e| io(named, e.into()))?;
                if let Some((uid, gid)) = owner {
                    fchownat(&parent, name, Some(uid), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(|e| io(named, e.into()))?;
                }
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Read)?
                    .ok_or_else(|| refused(named, "is a hard link without a target"))?;
                let target =
                    Named::new(&target).map_err(|_| refused(named, "is a hard link that leaves the root"))?;
                if target.parts == named.parts {
                    return Ok(());
                }
                let Some(target_name) = target.name() else {
                    return Err(refused(named, "is a hard link to the root"));
                };
                let from = self.dir(named, target.parent(), Walk::Existing)?.ok_or_else(|| {
                    refused(named, &format!("is a hard link to {}, which the image lacks", target.shown))
                })?;
                remove_at(&parent, name, 1).map_err(|e| io(named, e))?;
                linkat(&from, target_name, &parent, name, AtFlags::empty()).map_err(|e| {
                    if e == Errno::ENOENT {
                        refused(named, &format!("is a hard link to {}, which the image lacks", target.shown))
                    } else {
                        io(named, e.into())
                    }
                })?;
            }
            tar::EntryType::Fifo => {
                remove_at(&parent, name, 1).map_err(|e| io(named, e))?;
                mkfifoat(&parent, name, Mode::from_bits_truncate(0o600)).map_err(|e| io(named, e.into()))?;
                if let Some((uid, gid)) = owner {
                    fchownat(&parent, name, Some(uid), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(|e| io(named, e.into()))?;
                }
                fchmodat(&parent, name, Mode::from_bits_truncate(mode), FchmodatFlags::FollowSymlink)
                    .map_err(|e| io(named, e.into()))?;
            }
            // A container's devices are its runtime's (`/dev` is a tmpfs
            // it fills): device nodes in a layer are not made.
            tar::EntryType::Char | tar::EntryType::Block => return Ok(()),
            other => return Err(refused(named, &format!("is of a kind images do not hold ({other:?})"))),
        }
        self.own.insert(named.path.clone());
        Ok(())
    }

    /// The directory at `parts` below the root, reached one name at a
    /// time without following a link; missing ones are made with `walk`
    /// `Create` (none: `Existing`, and one is missing).
    fn dir(&self, named: &Named, parts: &[OsString], walk: Walk) -> Result<Option<OwnedFd>, UnpackError> {
        let mut dir = open_dir(&self.root, OsStr::new(".")).map_err(|e| io(named, e.into()))?;
        for (i, part) in parts.iter().enumerate() {
            let next = match open_dir(&dir, part) {
                Err(Errno::ENOENT) if walk == Walk::Create => {
                    match mkdirat(&dir, part.as_os_str(), Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(io(named, e.into())),
                    }
                    open_dir(&dir, part)
                }
                other => other,
            };
            dir = match next {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Ok(None),
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    let through: PathBuf = parts[..=i].iter().collect();
                    let link = fstatat(&dir, part.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .is_ok_and(|s| kind_of(&s) == SFlag::S_IFLNK);
                    let why = match link {
                        true => format!("passes through the symbolic link {}", through.display()),
                        false => format!("passes through {}, which is not a directory", through.display()),
                    };
                    return Err(refused(named, &why));
                }
                Err(e) => return Err(io(named, e.into())),
            };
        }
        Ok(Some(dir))
    }

    /// Copies the entry's data into `file`, within the budget.
    fn copy<R: Read>(
        &mut self,
        named: &Named,
        entry: &mut tar::Entry<R>,
        file: &mut File,
    ) -> Result<(), UnpackError> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = entry.read(&mut buf).map_err(UnpackError::Read)?;
            if n == 0 {
                return Ok(());
            }
            self.charge(named, n as u64, 0)?;
            file.write_all(&buf[..n]).map_err(|e| io(named, e))?;
        }
    }

    /// Counts `bytes` and `entries` against the limits.
    fn charge(&mut self, named: &Named, bytes: u64, entries: u64) -> Result<(), UnpackError> {
        self.used.bytes = self.used.bytes.saturating_add(bytes);
        self.used.entries = self.used.entries.saturating_add(entries);
        self.written = self.written.saturating_add(bytes);
        let mib = |b: u64| b >> 20;
        if self.used.bytes > self.limits.max_bytes {
            return Err(UnpackError::TooLarge(format!(
                "unpacks to more than {} MiB, this node's limit for one image (at {})",
                mib(self.limits.max_bytes),
                named.shown
            )));
        }
        if self.used.entries > self.limits.max_entries {
            return Err(UnpackError::TooLarge(format!(
                "has more than {} files, this node's limit for one image (at {})",
                self.limits.max_entries, named.shown
            )));
        }
        if self.written > self.expansion {
            return Err(UnpackError::TooLarge(format!(
                "a layer unpacks to more than {} times its compressed size ({} MiB, at {})",
                self.limits.max_expansion,
                mib(self.expansion),
                named.shown
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    Create,
    Existing,
}

fn open_dir(dir: &impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The names in `dir`, without `.` and `..`.
fn list(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let mut open = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let mut names = Vec::new();
    for entry in open.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir`, whatever it is, following no link: a
/// directory with everything in it. Nothing there is no error.
fn remove_at(dir: &OwnedFd, name: &OsStr, depth: usize) -> std::io::Result<()> {
    let Ok(stat) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else { return Ok(()) };
    if kind_of(&stat) == SFlag::S_IFDIR {
        if depth > MAX_DEPTH + 1 {
            return Err(std::io::Error::other(format!("deeper than {MAX_DEPTH} directories")));
        }
        let inner = open_dir(dir, name)?;
        for child in list(&inner)? {
            remove_at(&inner, &child, depth + 1)?;
        }
        match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    } else {
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The entry's owner, where the unpacker may give files away (root, on a
/// node); else the unpacker's own (a test's unprivileged run).
fn owner(named: &Named, header: &tar::Header) -> Result<Option<(Uid, Gid)>, UnpackError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let uid = header.uid().map_err(UnpackError::Read)?;
    let gid = header.gid().map_err(UnpackError::Read)?;
    let id = |n: u64| u32::try_from(n).ok().filter(|n| *n != u32::MAX);
    match (id(uid), id(gid)) {
        (Some(u), Some(g)) => Ok(Some((Uid::from_raw(u), Gid::from_raw(g)))),
        _ => Err(refused(named, &format!("has an owner out of range ({uid}:{gid})"))),
    }
}

fn set_owner_and_mode(fd: &impl AsFd, owner: Option<(Uid, Gid)>, mode: u32) -> std::io::Result<()> {
    if let Some((uid, gid)) = owner {
        fchown(fd, Some(uid), Some(gid))?;
    }
    // After the owner: a change of owner clears the mode's set-id bits,
    // which are dropped anyway.
    fchmod(fd, Mode::from_bits_truncate(mode))?;
    Ok(())
}

fn kind_of(stat: &nix::sys::stat::FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

fn time(seconds: i64) -> TimeSpec {
    TimeSpec::new(seconds, 0)
}

fn refused(named: &Named, why: &str) -> UnpackError {
    UnpackError::Refused { entry: named.shown.clone(), why: why.to_string() }
}

fn io(named: &Named, source: std::io::Error) -> UnpackError {
    UnpackError::Io { entry: named.shown.clone(), source }
}

#[cfg(test)]
mod tests;
