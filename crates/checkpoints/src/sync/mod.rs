//! Copying a job's checkpoint directory to the store and back.
//!
//! **Upload** ([`JobStore::upload`]): every regular file of the directory
//! (not links, not names starting with `.`: temporaries), hashed (a file
//! unchanged since the last upload is not read again), each blob the store
//! lacks stored — hashed again as it is sent, and refused if the file
//! changed meanwhile — then the manifest, last. A directory the same as at
//! the last upload makes no new manifest.
//!
//! **Restore** ([`JobStore::restore`]): the newest manifest whose every
//! file arrives with its size and hash; each file is staged under a
//! hidden name beside its place, and only when all are there are they
//! renamed into place. A manifest that cannot be read, a blob missing or
//! not matching its hash: that manifest is refused, said in the notes,
//! and the one before tried. Files are made through descriptors opened
//! without following links, owned by the job's user: the directory is
//! the job's, and a root agent must not be turned onto other files.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::location::{Store, StoreError};
use crate::manifest::{self, FileEntry, Manifest};

/// How many manifests of a job are kept; blobs no kept manifest names go.
pub const KEEP_MANIFESTS: usize = 3;

/// Reads and writes go in pieces of this size.
const CHUNK: usize = 8 << 20;

/// One job's part of the store.
#[derive(Clone, Debug)]
pub struct JobStore {
    pub(crate) store: Store,
    pub(crate) prefix: ObjectPath,
}

/// What an attempt remembers between its uploads: the files it hashed,
/// the blobs it knows the store has, the files of the last manifest.
#[derive(Debug, Default)]
pub struct UploadCache {
    /// (device, inode, size, mtime ns) to SHA-256.
    hashes: HashMap<(u64, u64, u64, i64), String>,
    stored: HashSet<String>,
    last: Option<Vec<FileEntry>>,
    seq: u32,
}

/// What an upload may take, and whose it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// The job's user (uid, gid): only its files are taken (a root agent's
    /// guard against a job's links to files it may not read), and what a
    /// `file://` store keeps of the job is owned by it, 0600 and 0700.
    pub owner: Option<(u32, u32)>,
    /// The most one checkpoint may hold, by its files' sizes as the
    /// directory says them (a sparse file counts whole: it is stored
    /// whole); 0: no limit. Checked before anything is read.
    pub max_bytes: u64,
}

/// An upload done.
#[derive(Debug)]
pub struct Uploaded {
    pub manifest: Manifest,
    /// Bytes sent (blobs the store lacked).
    pub sent_bytes: u64,
    pub seconds: f64,
}

/// What a restore did.
#[derive(Debug, Default)]
pub struct Restored {
    /// The checkpoint put in place; none: nothing (the job starts from
    /// what the directory had).
    pub manifest: Option<Manifest>,
    /// What people should know: each refused manifest and why, fallbacks.
    pub notes: Vec<String>,
    pub seconds: f64,
}

fn local(what: impl std::fmt::Display) -> StoreError {
    StoreError::Local(what.to_string())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a blocking task panicked")
}

impl JobStore {
    fn manifests(&self) -> ObjectPath {
        self.prefix.child("manifests")
    }

    fn blob(&self, sha256: &str) -> ObjectPath {
        self.prefix.child("blobs").child(sha256)
    }

    fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.store.objects
    }

    /// The job's manifests' names, newest first.
    pub async fn manifest_names(&self) -> Result<Vec<String>, StoreError> {
        let listed: Vec<_> = self
            .objects()
            .list(Some(&self.manifests()))
            .try_collect()
            .await
            .map_err(|e| self.store.failed(e))?;
        let names: Vec<String> =
            listed.iter().filter_map(|m| m.location.filename().map(str::to_string)).collect();
        Ok(manifest::newest_first(names.iter().map(String::as_str)).into_iter().map(str::to_string).collect())
    }

    /// Uploads `dir` as attempt `attempt`'s next checkpoint (see the module
    /// doc), under `rules`. None when nothing changed since the last
    /// upload.
    pub async fn upload(
        &self,
        dir: &Path,
        rules: Rules,
        attempt: u32,
        step: Option<u64>,
        cache: &mut UploadCache,
    ) -> Result<Option<Uploaded>, StoreError> {
        let began = Instant::now();
        let dir_owned = dir.to_path_buf();
        let uid = rules.owner.map(|(uid, _)| uid);
        let found = blocking(move || walk(&dir_owned, uid)).await?;
        let total: u64 = found.iter().map(|(_, _, meta)| meta.size()).sum();
        if rules.max_bytes > 0 && total > rules.max_bytes {
            return Err(StoreError::Limit(format!(
                "the checkpoint directory holds {total} bytes in {} files, over this node's limit of {} \
                 bytes for one job's checkpoint (ebb agent --max-checkpoint-bytes): not stored",
                found.len(),
                rules.max_bytes
            )));
        }
        // Hash what the cache does not know.
        let mut files = Vec::with_capacity(found.len());
        for (path, file, meta) in found {
            let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime() * 1_000_000_000 + meta.mtime_nsec());
            let file = Arc::new(file);
            let sha256 = match cache.hashes.get(&key) {
                Some(hash) => hash.clone(),
                None => {
                    let f = file.clone();
                    let hash =
                        blocking(move || hash_file(&f)).await.map_err(|e| local(format!("{path}: {e}")))?;
                    cache.hashes.insert(key, hash.clone());
                    hash
                }
            };
            files.push((FileEntry { path, size: meta.size(), sha256 }, file));
        }
        files.sort_by(|a, b| a.0.path.cmp(&b.0.path));
        let entries: Vec<FileEntry> = files.iter().map(|(e, _)| e.clone()).collect();
        if entries.is_empty() || cache.last.as_ref() == Some(&entries) {
            return Ok(None);
        }
        let mut sent_bytes = 0;
        for (entry, file) in &files {
            if cache.stored.contains(&entry.sha256) {
                continue;
            }
            let blob = self.blob(&entry.sha256);
            match self.objects().head(&blob).await {
                Ok(meta) if meta.size == entry.size => {}
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                    self.put_blob(&blob, entry, file.clone()).await?;
                    sent_bytes += entry.size;
                    test_pause().await;
                }
                Err(e) => return Err(self.store.failed(e)),
            }
            cache.stored.insert(entry.sha256.clone());
        }
        cache.seq += 1;
        let manifest = Manifest {
            format: manifest::FORMAT,
            job: self.job_id(),
            attempt,
            seq: cache.seq,
            step,
            written_ms: ebb_core::time::unix_ms(SystemTime::now()),
            files: entries.clone(),
        };
        let body = serde_json::to_vec_pretty(&manifest).map_err(local)?;
        // The commit: from here on this is the job's latest checkpoint.
        self.objects()
            .put(&self.manifests().child(manifest.key()), PutPayload::from(body))
            .await
            .map_err(|e| self.store.failed(e))?;
        cache.last = Some(entries);
        if let Err(e) = self.prune().await {
            tracing::warn!("checkpoint store: pruning job {}'s old checkpoints: {e}", self.job_id());
        }
        if let Some(root) = &self.store.local {
            // `<store>/<prefix>/<tenant>/<job>`
            let job = root.join(self.prefix.as_ref());
            let tenant = job.parent().map_or_else(|| job.clone(), Path::to_path_buf);
            let owner = rules.owner;
            blocking(move || seal(&tenant, &job, owner)).await?;
        }
        Ok(Some(Uploaded { manifest, sent_bytes, seconds: began.elapsed().as_secs_f64() }))
    }

    /// The job id, the last part of the prefix.
    fn job_id(&self) -> u64 {
        self.prefix.filename().and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    /// Sends `file` as `blob`, hashing it again on the way: a file changed
    /// since it was hashed (a job writing in place, against the contract)
    /// is refused and its upload aborted, never stored under a wrong name.
    async fn put_blob(
        &self,
        blob: &ObjectPath,
        entry: &FileEntry,
        file: Arc<std::fs::File>,
    ) -> Result<(), StoreError> {
        let mut writer =
            object_store::buffered::BufWriter::with_capacity(self.objects().clone(), blob.clone(), CHUNK);
        let mut hasher = Sha256::new();
        let mut offset = 0u64;
        let failed = |e: std::io::Error| local(format!("storing {}: {e}", entry.path));
        loop {
            let f = file.clone();
            let chunk = blocking(move || {
                let mut buf = vec![0u8; CHUNK];
                let n = f.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok::<_, std::io::Error>(buf)
            })
            .await
            .map_err(failed)?;
            if chunk.is_empty() {
                break;
            }
            offset += chunk.len() as u64;
            hasher.update(&chunk);
            if let Err(e) = writer.write_all(&chunk).await {
                let _ = writer.abort().await;
                return Err(failed(e));
            }
        }
        let sha256 = ebb_api::hex(&hasher.finalize());
        if sha256 != entry.sha256 || offset != entry.size {
            let _ = writer.abort().await;
            return Err(local(format!(
                "{}: changed while it was being stored (checkpoints must be written to a temporary and renamed)",
                entry.path
            )));
        }
        writer.shutdown().await.map_err(failed)
    }

    /// Deletes manifests older than the newest [`KEEP_MANIFESTS`], then
    /// blobs that no remaining manifest names.
    async fn prune(&self) -> Result<(), StoreError> {
        let names = self.manifest_names().await?;
        for old in names.iter().skip(KEEP_MANIFESTS) {
            self.objects()
                .delete(&self.manifests().child(old.as_str()))
                .await
                .map_err(|e| self.store.failed(e))?;
        }
        if names.len() <= KEEP_MANIFESTS {
            return Ok(());
        }
        let mut named = HashSet::new();
        for name in names.iter().take(KEEP_MANIFESTS) {
            let body = self.get(&self.manifests().child(name.as_str())).await?;
            let m = Manifest::parse(&body, self.job_id(), name).map_err(StoreError::Integrity)?;
            named.extend(m.files.into_iter().map(|f| f.sha256));
        }
        let blobs: Vec<_> = self
            .objects()
            .list(Some(&self.prefix.child("blobs")))
            .try_collect()
            .await
            .map_err(|e| self.store.failed(e))?;
        for blob in blobs {
            if blob.location.filename().is_some_and(|h| !named.contains(h)) {
                self.objects().delete(&blob.location).await.map_err(|e| self.store.failed(e))?;
            }
        }
        Ok(())
    }

    async fn get(&self, path: &ObjectPath) -> Result<Bytes, StoreError> {
        let got = self.objects().get(path).await.map_err(|e| self.store.failed(e))?;
        got.bytes().await.map_err(|e| self.store.failed(e))
    }

    /// Puts the newest good checkpoint into `dir` (see the module doc).
    /// `owner`: the uid and gid its files and directories get (a root
    /// agent's job user). An error is the store failing (unreachable,
    /// refusing): the caller decides whether to start without it.
    pub async fn restore(
        &self,
        dir: &Path,
        owner: Option<(u32, u32)>,
        cache: &mut UploadCache,
    ) -> Result<Restored, StoreError> {
        let began = Instant::now();
        let mut restored = Restored::default();
        let names = self.manifest_names().await?;
        for (i, name) in names.iter().enumerate() {
            let fallback = if i + 1 < names.len() { "trying the one before" } else { "no older checkpoint" };
            let body = match self.get(&self.manifests().child(name.as_str())).await {
                Ok(body) => body,
                Err(StoreError::Store { source: object_store::Error::NotFound { .. }, .. }) => continue, // pruned meanwhile
                Err(e) => return Err(e),
            };
            let manifest = match Manifest::parse(&body, self.job_id(), name) {
                Ok(m) => m,
                Err(why) => {
                    restored.notes.push(format!("refused {why}; {fallback}"));
                    continue;
                }
            };
            match self.fetch(dir, owner, &manifest).await {
                Ok(placed) => {
                    for (entry, key) in manifest.files.iter().zip(placed) {
                        cache.hashes.insert(key, entry.sha256.clone());
                        cache.stored.insert(entry.sha256.clone());
                    }
                    cache.last = Some(manifest.files.clone());
                    restored.manifest = Some(manifest);
                    break;
                }
                Err(StoreError::Integrity(why)) => {
                    restored.notes.push(format!("refused {}: {why}; {fallback}", manifest.describe()));
                }
                Err(e) => return Err(e),
            }
        }
        if restored.manifest.is_none() && !names.is_empty() {
            restored.notes.push("no good checkpoint in the store: the attempt starts without one".into());
        }
        restored.seconds = began.elapsed().as_secs_f64();
        Ok(restored)
    }

    /// Downloads every file of `manifest` into a staged name beside its
    /// place, checking size and hash; then renames them all into place.
    /// Returns each file's cache key, in the manifest's order.
    async fn fetch(
        &self,
        dir: &Path,
        owner: Option<(u32, u32)>,
        manifest: &Manifest,
    ) -> Result<Vec<(u64, u64, u64, i64)>, StoreError> {
        let root = {
            let dir = dir.to_path_buf();
            Arc::new(blocking(move || open_dir(&dir)).await?)
        };
        let stage = format!(".ebb-restore-{}-{}", manifest.attempt, manifest.seq);
        let mut staged: Vec<(Arc<OwnedFd>, String, String)> = Vec::new();
        let outcome = self.fetch_all(&root, owner, manifest, &stage, &mut staged).await;
        if let Err(e) = outcome {
            let staged = std::mem::take(&mut staged);
            blocking(move || {
                for (parent, tmp, _) in staged {
                    let _ = nix::unistd::unlinkat(
                        &*parent,
                        tmp.as_str(),
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    );
                }
            })
            .await;
            return Err(e);
        }
        blocking(move || {
            let mut keys = Vec::new();
            for (parent, tmp, name) in staged {
                nix::fcntl::renameat(&*parent, tmp.as_str(), &*parent, name.as_str())
                    .map_err(|e| local(format!("cannot put {name} in place: {e}")))?;
                let fd = nix::fcntl::openat(
                    &*parent,
                    name.as_str(),
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|e| local(format!("{name}: {e}")))?;
                let st = nix::sys::stat::fstat(&fd).map_err(|e| local(format!("{name}: {e}")))?;
                keys.push((
                    st.st_dev as u64,
                    st.st_ino as u64,
                    st.st_size as u64,
                    st.st_mtime as i64 * 1_000_000_000 + st.st_mtime_nsec as i64,
                ));
            }
            Ok(keys)
        })
        .await
    }

    async fn fetch_all(
        &self,
        root: &Arc<OwnedFd>,
        owner: Option<(u32, u32)>,
        manifest: &Manifest,
        stage: &str,
        staged: &mut Vec<(Arc<OwnedFd>, String, String)>,
    ) -> Result<(), StoreError> {
        for entry in &manifest.files {
            let (parent, name) = {
                let root = root.clone();
                let path = entry.path.clone();
                blocking(move || subdir(&root, &path, owner)).await?
            };
            let tmp = format!("{stage}-{name}");
            let file = {
                let parent = parent.clone();
                let tmp = tmp.clone();
                blocking(move || create_fresh(&parent, &tmp, owner)).await?
            };
            staged.push((parent, tmp, name));
            let file = Arc::new(file);
            let blob = self.blob(&entry.sha256);
            let got = match self.objects().get(&blob).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(StoreError::Integrity(format!(
                        "file {}: its blob is missing from the store",
                        entry.path
                    )))
                }
                Err(e) => return Err(self.store.failed(e)),
            };
            let mut stream = got.into_stream();
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let mut pending: Vec<u8> = Vec::with_capacity(CHUNK);
            loop {
                let next = stream.try_next().await.map_err(|e| self.store.failed(e))?;
                let done = next.is_none();
                if let Some(bytes) = next {
                    hasher.update(&bytes);
                    size += bytes.len() as u64;
                    if size > entry.size {
                        return Err(StoreError::Integrity(format!(
                            "file {}: the store holds more than the {} bytes its manifest says",
                            entry.path, entry.size
                        )));
                    }
                    pending.extend_from_slice(&bytes);
                }
                if pending.len() >= CHUNK || (done && !pending.is_empty()) {
                    let buf = std::mem::replace(&mut pending, Vec::with_capacity(CHUNK));
                    let f = file.clone();
                    let at = size - buf.len() as u64;
                    blocking(move || f.write_all_at(&buf, at))
                        .await
                        .map_err(|e| local(format!("{}: {e}", entry.path)))?;
                }
                if done {
                    break;
                }
            }
            let sha256 = ebb_api::hex(&hasher.finalize());
            if size != entry.size || sha256 != entry.sha256 {
                return Err(StoreError::Integrity(format!(
                    "file {}: the store's copy ({size} bytes, SHA-256 {sha256}) is not what its manifest says \
                     ({} bytes, SHA-256 {})",
                    entry.path, entry.size, entry.sha256
                )));
            }
            let f = file.clone();
            blocking(move || f.sync_all()).await.map_err(|e| local(format!("{}: {e}", entry.path)))?;
        }
        Ok(())
    }
}

/// Makes what a `file://` store keeps of a job its user's alone: the
/// tenant's directory and the job's 0700, every file under the job's
/// 0600, all owned by `owner` (none: as they are, the agent's). Nothing
/// here follows a link, and nothing but directories and regular files is
/// changed: a store is the operator's, but a shared one is mounted where
/// jobs may reach it.
fn seal(tenant: &Path, job: &Path, owner: Option<(u32, u32)>) -> Result<(), StoreError> {
    // Each is opened without following a link (a link is refused), then
    // changed through its descriptor, never by name.
    let fix = |fd: &OwnedFd, what: &str, is_dir: bool| -> Result<(), StoreError> {
        let failed = |e: nix::Error| local(format!("cannot make {what} private: {e}"));
        nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(if is_dir { 0o700 } else { 0o600 }))
            .map_err(failed)?;
        chown(fd, owner).map_err(failed)
    };
    for dir in [tenant, job] {
        fix(&open_dir(dir)?, &dir.display().to_string(), true)?;
    }
    let mut todo = vec![open_dir(job)?];
    while let Some(dir) = todo.pop() {
        let listing = nix::dir::Dir::from_fd(nix::unistd::dup(&dir).map_err(|e| local(e.to_string()))?)
            .map_err(|e| local(format!("cannot list the store: {e}")))?;
        let mut entries = Vec::new();
        for entry in listing.into_iter().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                entries.push((name, entry.file_type()));
            }
        }
        for (name, kind) in entries {
            let is_dir = match kind {
                Some(nix::dir::Type::Directory) => true,
                Some(nix::dir::Type::File) => false,
                _ => continue,
            };
            // O_NONBLOCK: a file swapped for a FIFO meanwhile must not hang the open.
            let flags = if is_dir {
                OFlag::O_RDONLY | OFlag::O_DIRECTORY
            } else {
                OFlag::O_RDONLY | OFlag::O_NONBLOCK
            };
            let fd = match nix::fcntl::openat(
                &dir,
                name.as_str(),
                flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Pruned meanwhile, or swapped for a link: not ours to change.
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                    continue
                }
                Err(e) => return Err(local(format!("cannot open {name} in the store: {e}"))),
            };
            let stat = nix::sys::stat::fstat(&fd).map_err(|e| local(format!("{name}: {e}")))?;
            let kind =
                nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode) & nix::sys::stat::SFlag::S_IFMT;
            if kind != if is_dir { nix::sys::stat::SFlag::S_IFDIR } else { nix::sys::stat::SFlag::S_IFREG } {
                continue;
            }
            fix(&fd, &name, is_dir)?;
            if is_dir {
                todo.push(fd);
            }
        }
    }
    Ok(())
}

/// Opens the checkpoint directory itself (made by the agent beforehand),
/// not through a link.
fn open_dir(dir: &Path) -> Result<OwnedFd, StoreError> {
    nix::fcntl::open(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW, Mode::empty())
        .map_err(|e| local(format!("cannot open {}: {e}", dir.display())))
}

/// The directory a manifest path's file goes in (made as needed, owned by
/// `owner`), opened without following links, and the file's name.
fn subdir(
    root: &Arc<OwnedFd>,
    path: &str,
    owner: Option<(u32, u32)>,
) -> Result<(Arc<OwnedFd>, String), StoreError> {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().expect("a checked path has a part").to_string();
    let mut dir = root.clone();
    for part in parts {
        match nix::sys::stat::mkdirat(&*dir, part, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(local(format!("cannot make {part} for {path}: {e}"))),
        }
        let fd = nix::fcntl::openat(
            &*dir,
            part,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| local(format!("cannot open {part} for {path}: {e}")))?;
        chown(&fd, owner).map_err(|e| local(format!("{path}: {e}")))?;
        dir = Arc::new(fd);
    }
    Ok((dir, name))
}

/// Creates `name` in `dir` afresh (O_EXCL follows no link), owned by `owner`.
fn create_fresh(dir: &OwnedFd, name: &str, owner: Option<(u32, u32)>) -> Result<std::fs::File, StoreError> {
    let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| local(format!("cannot create {name}: {e}")))?;
    chown(&fd, owner).map_err(|e| local(format!("{name}: {e}")))?;
    Ok(std::fs::File::from(fd))
}

fn chown(fd: &impl AsFd, owner: Option<(u32, u32)>) -> nix::Result<()> {
    match owner {
        Some((uid, gid)) => nix::unistd::fchown(
            fd,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        ),
        None => Ok(()),
    }
}

/// The regular files under `dir`, by relative path, opened (without
/// following a link) with what `fstat` says of them. Names starting with
/// `.` are left out (temporaries), and so are links, other kinds of file
/// and, with `owner`, files another user owns. A file that vanishes
/// while the walk runs (a job pruning old checkpoints) is simply not
/// there.
fn walk(
    dir: &Path,
    owner: Option<u32>,
) -> Result<Vec<(String, std::fs::File, std::fs::Metadata)>, StoreError> {
    let mut found = Vec::new();
    let mut todo = vec![(dir.to_path_buf(), String::new())];
    while let Some((abs, rel)) = todo.pop() {
        let entries = match std::fs::read_dir(&abs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => continue,
            Err(e) => return Err(local(format!("cannot read {}: {e}", abs.display()))),
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let path = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            if manifest::check_path(&path).is_err() {
                continue;
            }
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                todo.push((abs.join(&name), path));
            } else if kind.is_file() {
                let opened = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc_nofollow())
                    .open(abs.join(&name));
                let file = match opened {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(local(format!("cannot read {path}: {e}"))),
                };
                let meta = file.metadata().map_err(|e| local(format!("{path}: {e}")))?;
                if !meta.is_file() || owner.is_some_and(|uid| meta.uid() != uid) {
                    continue;
                }
                found.push((path, file, meta));
            }
        }
    }
    Ok(found)
}

fn libc_nofollow() -> i32 {
    OFlag::O_NOFOLLOW.bits()
}

fn hash_file(file: &std::fs::File) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    loop {
        let n = file.read_at(&mut buf, offset)?;
        if n == 0 {
            return Ok(ebb_api::hex(&hasher.finalize()));
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
}

/// For tests of an upload cut off half way: `EBB_X_CHECKPOINT_PAUSE_MS`
/// makes each stored blob wait this long before the next step. Unset in
/// production.
async fn test_pause() {
    if let Some(ms) = std::env::var("EBB_X_CHECKPOINT_PAUSE_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        tracing::info!("checkpoint store: pausing {ms} ms after a blob (EBB_X_CHECKPOINT_PAUSE_MS)");
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

#[cfg(test)]
mod tests;
