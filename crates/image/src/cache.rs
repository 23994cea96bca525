//! The node's image cache.
//!
//! ```text
//! <root>/blobs/sha256/<hex>        a layer, as pulled, verified by its digest
//! <root>/blobs/sha256/<hex>.from   the repositories that served it
//! <root>/images/<key>/rootfs/      the image unpacked, layer on layer
//! <root>/images/<key>/image.json   what a start needs of it; written last,
//!                                  so an image without it is not there
//! <root>/images/<key>/used         its last use, as the file's mtime
//! <root>/tmp/                      downloads and unpacks under way
//! ```
//!
//! `<key>` is the SHA-256 of the registry, the repository and the digest
//! the server resolved at submit: the same bytes from another repository
//! are another image, so that a tenant who names a registry of its own
//! with another's digest gets nothing of the other's. An image pulled
//! with a login is another tenant's to use only once its registry has
//! said that tenant may pull it (the manifest asked for with that
//! tenant's login, on every acquire); one pulled without a login, anyone
//! could pull. A layer is kept once on disk, but is used for an image
//! only when that image's repository has served it (its digest checked
//! as it came): a repository that merely lists another's layer must
//! still have its bytes.
//!
//! An image is pulled once however many attempts ask for it at once (a
//! lock per image), and a layer once however many images share it (a
//! lock per layer). Past the budget, the least recently used images that
//! no attempt holds are removed, then the layers no image left refers to.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use oci_client::Client;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;

use crate::unpack::{Limits, Used};
use crate::{auth, classify, pinned, request_error, ImageError, Login, Registries};

/// How far a pull has come, in bytes of the layers it downloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// What a start needs of an image, kept beside its root file system.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `NAME=value`, as the image's config has them.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    /// What the image runs first, given the command as its arguments
    /// (Pyxis' `--container-entrypoint`).
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The layers' digests, bottom first.
    pub layers: Vec<String>,
    /// The unpacked root file system's size.
    pub bytes: u64,
    /// The image's digest.
    #[serde(default)]
    pub digest: String,
    /// Pulled with a login: whoever uses it must show the registry lets
    /// them pull it.
    #[serde(default)]
    pub private: bool,
}

struct Entry {
    digest: String,
    bytes: u64,
    layers: Vec<String>,
    last_used: SystemTime,
    holders: u32,
}

/// The cache of one node's images.
pub struct Cache {
    root: PathBuf,
    budget: u64,
    /// What one image may take as it is unpacked (its bytes at most the
    /// budget).
    limits: Limits,
    registries: Registries,
    images: Mutex<HashMap<String, Entry>>,
    /// One lock per image or layer digest being pulled.
    pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// An image held for an attempt: not evicted until dropped.
pub struct Lease {
    cache: Arc<Cache>,
    key: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// Bytes this acquire downloaded (0: the image was in the cache).
    pub downloaded: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.cache.release(&self.key);
    }
}

impl Cache {
    /// Opens the cache under `root` with a budget of `limits.max_bytes`:
    /// what earlier runs left complete is kept, what they left half-done
    /// is removed.
    pub fn open(root: &Path, limits: Limits, registries: &Registries) -> std::io::Result<Arc<Cache>> {
        let budget = limits.max_bytes;
        for dir in ["blobs/sha256", "images", "tmp"] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        // The node's own: a tenant's bare job must not read another's
        // image, nor reach what an image holds. Containers see their
        // image through the overlay their shim (root) mounts.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
        let _ = std::fs::remove_dir_all(root.join("tmp"));
        std::fs::create_dir_all(root.join("tmp"))?;
        let mut images = HashMap::new();
        for dir in std::fs::read_dir(root.join("images"))? {
            let dir = dir?.path();
            let key = dir.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
            match read_config(&dir) {
                Some(config) => {
                    let last_used = std::fs::metadata(dir.join("used"))
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    let digest = match config.digest.is_empty() {
                        // Kept by a release that named images by digest.
                        true => format!("sha256:{key}"),
                        false => config.digest,
                    };
                    images.insert(
                        key,
                        Entry { digest, bytes: config.bytes, layers: config.layers, last_used, holders: 0 },
                    );
                }
                None => {
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
        let cache = Arc::new(Cache {
            root: root.to_path_buf(),
            budget,
            limits,
            registries: registries.clone(),
            images: Mutex::new(images),
            pulls: Mutex::new(HashMap::new()),
        });
        cache.evict();
        Ok(cache)
    }

    /// The digests of the images in the cache, most recently used first.
    pub fn images(&self) -> Vec<String> {
        let images = self.images.lock().expect("images");
        let mut all: Vec<(&String, &Entry)> = images.iter().collect();
        all.sort_by_key(|e| std::cmp::Reverse(e.1.last_used));
        all.into_iter().map(|(_, e)| e.digest.clone()).collect()
    }

    /// The bytes the cache holds: unpacked images and their layers.
    pub fn bytes(&self) -> u64 {
        let images: u64 = self.images.lock().expect("images").values().map(|e| e.bytes).sum();
        images + dir_bytes(&self.root.join("blobs/sha256"))
    }

    /// Holds image `digest` (resolved from `reference`) for an attempt,
    /// pulling and unpacking it first where the cache lacks it.
    pub async fn acquire(
        self: &Arc<Self>,
        reference: &str,
        digest: &str,
        login: Option<&Login>,
        mut progress: impl FnMut(Progress) + Send,
    ) -> Result<Lease, ImageError> {
        hex_of(reference, digest)?;
        let parsed = self.registries.check(reference)?;
        let pinned = pinned(&parsed, digest);
        let source = format!("{}/{}", parsed.registry(), parsed.repository());
        let key = crate::sha256_hex(format!("{source}@{digest}").as_bytes());
        let lock = self.lock(&key);
        let _pulling = lock.lock().await;
        let dir = self.root.join("images").join(&key);
        let auth = auth(login);
        // A client of its own: oci-client keeps the first credentials it
        // is given for a registry, and another tenant's pull must not
        // borrow them. Made only where one is needed: its TLS roots take
        // milliseconds that a start from the cache need not wait.
        if let Some(config) = self.hold(&key, &dir) {
            let private = config.private;
            let lease = Lease { cache: self.clone(), rootfs: dir.join("rootfs"), key, config, downloaded: 0 };
            if private {
                // Dropped on refusal, which lets the hold go.
                let client: Client = self.registries.client(pinned.registry());
                let found =
                    client.fetch_manifest_digest(&pinned, &auth).await.map_err(|e| classify(reference, e))?;
                if found != digest {
                    return Err(ImageError::Other(
                        reference.to_string(),
                        format!("the registry has manifest {found} for digest {digest}"),
                    ));
                }
            }
            return Ok(lease);
        }
        let served_by = crate::sha256_hex(source.as_bytes());
        let client: Client = self.registries.client(pinned.registry());
        let (manifest, _) =
            client.pull_image_manifest(&pinned, &auth).await.map_err(|e| classify(reference, e))?;
        let mut config_bytes = Vec::new();
        client
            .pull_blob(&pinned, &manifest.config, &mut config_bytes)
            .await
            .map_err(|e| blob_error(reference, &manifest.config.digest, e))?;
        let image_config = parse_image_config(reference, &config_bytes)?;
        let total: u64 = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
        let mut done = 0;
        let mut downloaded = 0;
        progress(Progress { done, total });
        let mut layers = Vec::new();
        for layer in &manifest.layers {
            let layer_hex = hex_of(reference, &layer.digest)?.to_string();
            let blob = self.root.join("blobs/sha256").join(&layer_hex);
            let lock = self.lock(&layer_hex);
            let _layer = lock.lock().await;
            if !(blob.exists() && served(&blob, &served_by)) {
                let part = self.root.join("tmp").join(format!("{layer_hex}.part"));
                let file = tokio::fs::File::create(&part)
                    .await
                    .map_err(|e| ImageError::Other(reference.into(), format!("{}: {e}", part.display())))?;
                let mut counting = Counting { inner: file, done, total, progress: &mut progress };
                let mut pulled = client.pull_blob(&pinned, layer, &mut counting).await;
                if pulled.is_ok() {
                    use tokio::io::AsyncWriteExt;
                    pulled = counting.flush().await.map_err(Into::into);
                }
                let written = counting.done - done;
                if let Err(e) = pulled {
                    let _ = std::fs::remove_file(&part);
                    return Err(blob_error(reference, &layer.digest, e));
                }
                std::fs::rename(&part, &blob)
                    .map_err(|e| ImageError::Other(reference.into(), format!("{}: {e}", blob.display())))?;
                serve(&blob, &served_by)
                    .map_err(|e| ImageError::Other(reference.into(), format!("{}: {e}", blob.display())))?;
                downloaded += written;
            }
            done += layer.size.max(0) as u64;
            progress(Progress { done, total });
            layers.push((layer_hex, blob));
        }
        let root = self.root.clone();
        let digests: Vec<String> = manifest.layers.iter().map(|l| l.digest.clone()).collect();
        let unpack_key = key.clone();
        let image_config =
            ImageConfig { digest: digest.to_string(), private: login.is_some(), ..image_config };
        let limits = self.limits;
        let named = reference.to_string();
        let config = tokio::task::spawn_blocking(move || {
            unpack(&root, &unpack_key, &layers, image_config, digests, &limits)
                .map_err(|e| ImageError::Other(named, e))
        })
        .await
        .map_err(|e| ImageError::Other(reference.into(), e.to_string()))??;
        {
            let mut images = self.images.lock().expect("images");
            images.insert(
                key.clone(),
                Entry {
                    digest: digest.to_string(),
                    bytes: config.bytes,
                    layers: config.layers.clone(),
                    last_used: SystemTime::now(),
                    holders: 1,
                },
            );
        }
        self.evict();
        Ok(Lease { cache: self.clone(), rootfs: dir.join("rootfs"), key, config, downloaded })
    }

    fn lock(&self, digest: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut pulls = self.pulls.lock().expect("pulls");
        pulls.retain(|_, l| Arc::strong_count(l) > 1);
        pulls.entry(digest.to_string()).or_default().clone()
    }

    /// Takes a hold on an image the cache has.
    fn hold(&self, key: &str, dir: &Path) -> Option<ImageConfig> {
        let mut images = self.images.lock().expect("images");
        let entry = images.get_mut(key)?;
        let config = read_config(dir)?;
        entry.holders += 1;
        entry.last_used = SystemTime::now();
        Some(config)
    }

    fn release(&self, key: &str) {
        {
            let mut images = self.images.lock().expect("images");
            if let Some(entry) = images.get_mut(key) {
                entry.holders = entry.holders.saturating_sub(1);
                entry.last_used = SystemTime::now();
            }
        }
        let used = self.root.join("images").join(key).join("used");
        let _ = std::fs::write(&used, b"");
        self.evict();
    }

    /// Removes the least recently used images no attempt holds until the
    /// cache is within its budget, then the layers no image refers to.
    fn evict(&self) {
        let mut images = self.images.lock().expect("images");
        let blobs = self.root.join("blobs/sha256");
        let blob_bytes = |layers: &[String]| -> u64 {
            layers
                .iter()
                .filter_map(|d| d.strip_prefix("sha256:"))
                .filter_map(|h| std::fs::metadata(blobs.join(h)).ok())
                .map(|m| m.len())
                .sum()
        };
        let mut total: u64 = images.values().map(|e| e.bytes).sum::<u64>() + dir_bytes(&blobs);
        while total > self.budget {
            let Some(victim) = images
                .iter()
                .filter(|(_, e)| e.holders == 0)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(hex, _)| hex.clone())
            else {
                break;
            };
            let entry = images.remove(&victim).expect("victim");
            let still: std::collections::HashSet<&String> = images.values().flat_map(|e| &e.layers).collect();
            let orphans: Vec<String> = entry.layers.iter().filter(|l| !still.contains(l)).cloned().collect();
            let freed = entry.bytes + blob_bytes(&orphans);
            let dir = self.root.join("images").join(&victim);
            // Out of the way first, so a half-removed image is never taken.
            let gone = self.root.join("tmp").join(format!("{victim}.evicted"));
            if std::fs::rename(&dir, &gone).is_ok() {
                let _ = std::fs::remove_dir_all(&gone);
            }
            for layer in orphans.iter().filter_map(|d| d.strip_prefix("sha256:")) {
                let _ = std::fs::remove_file(blobs.join(layer));
                let _ = std::fs::remove_file(blobs.join(format!("{layer}.from")));
            }
            tracing::info!(image = entry.digest, bytes = freed, "evicted from the image cache");
            total = total.saturating_sub(freed);
        }
    }
}

fn hex_of<'a>(reference: &str, digest: &'a str) -> Result<&'a str, ImageError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            ImageError::Invalid(reference.to_string(), format!("{digest:?} is not a sha256 digest"))
        })
}

fn blob_error(reference: &str, digest: &str, e: oci_client::errors::OciDistributionError) -> ImageError {
    match e {
        oci_client::errors::OciDistributionError::DigestError(d) => {
            ImageError::DigestMismatch(reference.to_string(), digest.to_string(), d.to_string())
        }
        oci_client::errors::OciDistributionError::IoError(io) => {
            ImageError::Other(reference.to_string(), format!("cannot write layer {digest}: {io}"))
        }
        oci_client::errors::OciDistributionError::RequestError(r) => {
            ImageError::Unreachable(reference.to_string(), request_error(&r))
        }
        other => classify(reference, other),
    }
}

/// The parts of an image's config a start uses.
fn parse_image_config(reference: &str, bytes: &[u8]) -> Result<ImageConfig, ImageError> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        config: Option<Inner>,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(rename = "Env", default)]
        env: Option<Vec<String>>,
        #[serde(rename = "WorkingDir", default)]
        working_dir: Option<String>,
        #[serde(rename = "Entrypoint", default)]
        entrypoint: Option<Vec<String>>,
    }
    let file: File = serde_json::from_slice(bytes).map_err(|e| {
        ImageError::Other(reference.to_string(), format!("its config is not an image config: {e}"))
    })?;
    let inner = file.config;
    Ok(ImageConfig {
        env: inner.as_ref().and_then(|c| c.env.clone()).unwrap_or_default(),
        entrypoint: inner.as_ref().and_then(|c| c.entrypoint.clone()).unwrap_or_default(),
        working_dir: inner.and_then(|c| c.working_dir).filter(|w| !w.is_empty()),
        ..ImageConfig::default()
    })
}

/// Unpacks the layers into a fresh root file system in `tmp/`, then
/// moves it into place and writes its `image.json`. What a refused or
/// failed unpack left is removed.
fn unpack(
    root: &Path,
    hex: &str,
    layers: &[(String, PathBuf)],
    config: ImageConfig,
    digests: Vec<String>,
    limits: &Limits,
) -> Result<ImageConfig, String> {
    let work = root.join("tmp").join(format!("{hex}.unpack"));
    let unpacked = unpack_into(root, &work, hex, layers, config, digests, limits);
    if unpacked.is_err() {
        let _ = std::fs::remove_dir_all(&work);
    }
    unpacked
}

fn unpack_into(
    root: &Path,
    work: &Path,
    hex: &str,
    layers: &[(String, PathBuf)],
    mut config: ImageConfig,
    digests: Vec<String>,
    limits: &Limits,
) -> Result<ImageConfig, String> {
    let io = |e: std::io::Error| format!("cannot unpack it: {e}");
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work.join("rootfs")).map_err(io)?;
    let mut used = Used::default();
    for ((layer_hex, blob), digest) in layers.iter().zip(&digests) {
        debug_assert!(digest.ends_with(layer_hex.as_str()));
        crate::unpack::apply_layer(blob, &work.join("rootfs"), limits, &mut used)
            .map_err(|e| format!("layer {digest}: {e}"))?;
    }
    config.layers = digests;
    config.bytes = dir_bytes(&work.join("rootfs"));
    std::fs::write(work.join("used"), b"").map_err(io)?;
    let dir = root.join("images").join(hex);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(work, &dir).map_err(io)?;
    let json = serde_json::to_vec(&config).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("image.json.part"), json).map_err(io)?;
    std::fs::rename(dir.join("image.json.part"), dir.join("image.json")).map_err(io)?;
    Ok(config)
}

/// Whether the repository `source` (its key) has served `blob`.
fn served(blob: &Path, source: &str) -> bool {
    let from = blob.with_extension("from");
    std::fs::read_to_string(from).is_ok_and(|text| text.lines().any(|l| l == source))
}

/// Records that the repository `source` (its key) served `blob`.
fn serve(blob: &Path, source: &str) -> std::io::Result<()> {
    let from = blob.with_extension("from");
    let mut text = std::fs::read_to_string(&from).unwrap_or_default();
    if !text.lines().any(|l| l == source) {
        text.push_str(source);
        text.push('\n');
        let part = blob.with_extension("from.part");
        std::fs::write(&part, text)?;
        std::fs::rename(part, from)?;
    }
    Ok(())
}

fn read_config(dir: &Path) -> Option<ImageConfig> {
    serde_json::from_slice(&std::fs::read(dir.join("image.json")).ok()?).ok()
}

/// The bytes of the files under `dir` (each hard-linked file once).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.nlink() <= 1 || seen.insert((meta.dev(), meta.ino())) {
                total += meta.len();
            }
        }
    }
    total
}

/// A writer that counts what passes through it.
struct Counting<'a, W, F> {
    inner: W,
    done: u64,
    total: u64,
    progress: &'a mut F,
}

impl<W: AsyncWrite + Unpin, F: FnMut(Progress) + Send> AsyncWrite for Counting<'_, W, F> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            this.done += n as u64;
            (this.progress)(Progress { done: this.done.min(this.total), total: this.total });
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
