//! The job store's tests, on `file://` stores: a checkpoint across nodes,
//! blobs that do not match their hash, what is kept, a job's checkpoint
//! private to its user, the size limit.

use super::*;
use ebb_api::CheckpointStoreLocation;

struct Fixture {
    root: std::path::PathBuf,
    store: JobStore,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn fixture(name: &str) -> Fixture {
    let root = std::env::temp_dir().join(format!("ebb-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let location = CheckpointStoreLocation {
        url: format!("file://{}/store", root.display()),
        endpoint: None,
        region: None,
    };
    let store = Store::open(&location, None).unwrap().job("team", 7).unwrap();
    Fixture { root, store }
}

fn node_dir(f: &Fixture, node: &str) -> std::path::PathBuf {
    let dir = f.root.join(node);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, body: &[u8]) {
    if let Some(parent) = dir.join(name).parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(dir.join(name), body).unwrap();
}

#[tokio::test]
async fn a_checkpoint_uploaded_on_one_node_is_restored_on_another() {
    let f = fixture("roundtrip");
    let a = node_dir(&f, "a");
    write(&a, "ckpt-1.ckpt", b"one");
    write(&a, "sub/state.bin", &vec![7u8; 3 * CHUNK / 2]);
    write(&a, ".ckpt-2.ckpt.tmp-9", b"half");
    let mut cache = UploadCache::default();
    let up = f.store.upload(&a, Rules::default(), 1, Some(1), &mut cache).await.unwrap().unwrap();
    assert_eq!(
        up.manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["ckpt-1.ckpt", "sub/state.bin"]
    );
    assert_eq!(up.sent_bytes, 3 + 3 * CHUNK as u64 / 2);
    // Nothing changed: no new manifest.
    assert!(f.store.upload(&a, Rules::default(), 1, None, &mut cache).await.unwrap().is_none());
    write(&a, "ckpt-2.ckpt", b"two");
    let up = f.store.upload(&a, Rules::default(), 1, Some(2), &mut cache).await.unwrap().unwrap();
    assert_eq!(up.sent_bytes, 3, "unchanged files are not sent again");

    let b = node_dir(&f, "b");
    let restored = f.store.restore(&b, None, &mut UploadCache::default()).await.unwrap();
    assert_eq!(restored.manifest.unwrap().step, Some(2));
    assert!(restored.notes.is_empty(), "{:?}", restored.notes);
    assert_eq!(std::fs::read(b.join("ckpt-2.ckpt")).unwrap(), b"two");
    assert_eq!(std::fs::read(b.join("sub/state.bin")).unwrap().len(), 3 * CHUNK / 2);
    assert!(!b.join(".ckpt-2.ckpt.tmp-9").exists(), "temporaries never travel");
    let staged: Vec<_> = std::fs::read_dir(&b)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".ebb"))
        .collect();
    assert!(staged.is_empty());
}

#[tokio::test]
async fn a_blob_that_does_not_match_its_hash_is_refused_and_the_previous_checkpoint_restored() {
    let f = fixture("corrupt");
    let a = node_dir(&f, "a");
    write(&a, "ckpt-1.ckpt", b"one");
    let mut cache = UploadCache::default();
    f.store.upload(&a, Rules::default(), 1, Some(1), &mut cache).await.unwrap().unwrap();
    write(&a, "ckpt-2.ckpt", b"two");
    let second =
        f.store.upload(&a, Rules::default(), 1, Some(2), &mut cache).await.unwrap().unwrap().manifest;
    let two = second.files.iter().find(|e| e.path == "ckpt-2.ckpt").unwrap();
    let blob = f.root.join("store/team/7/blobs").join(&two.sha256);
    std::fs::write(&blob, b"tw0").unwrap();

    let b = node_dir(&f, "b");
    let restored = f.store.restore(&b, None, &mut UploadCache::default()).await.unwrap();
    assert_eq!(restored.manifest.unwrap().step, Some(1));
    assert_eq!(restored.notes.len(), 1);
    let note = &restored.notes[0];
    assert!(
        note.starts_with("refused step 2 (attempt 1, upload 2): file ckpt-2.ckpt: the store's copy"),
        "{note}"
    );
    assert!(note.ends_with("trying the one before"), "{note}");
    assert!(!b.join("ckpt-2.ckpt").exists(), "nothing of a refused checkpoint is put in place");
    assert_eq!(std::fs::read(b.join("ckpt-1.ckpt")).unwrap(), b"one");
}

#[tokio::test]
async fn blobs_without_a_manifest_are_never_the_latest() {
    let f = fixture("partial");
    let a = node_dir(&f, "a");
    write(&a, "ckpt-1.ckpt", b"one");
    let mut cache = UploadCache::default();
    f.store.upload(&a, Rules::default(), 1, Some(1), &mut cache).await.unwrap().unwrap();
    // An upload cut off after its blob: the blob is there, no manifest.
    let blob = f.store.blob(&ebb_api::hex(&Sha256::digest(b"two")));
    f.store.objects().put(&blob, PutPayload::from_static(b"two")).await.unwrap();
    let b = node_dir(&f, "b");
    let restored = f.store.restore(&b, None, &mut UploadCache::default()).await.unwrap();
    assert_eq!(restored.manifest.unwrap().step, Some(1));
    assert_eq!(std::fs::read_dir(&b).unwrap().count(), 1);
}

#[tokio::test]
async fn only_the_newest_manifests_and_their_blobs_are_kept() {
    let f = fixture("prune");
    let a = node_dir(&f, "a");
    let mut cache = UploadCache::default();
    for step in 1..=5u64 {
        // keep-1 as a job would: only the newest file is there.
        let _ = std::fs::remove_file(a.join(format!("ckpt-{}.ckpt", step - 1)));
        write(&a, &format!("ckpt-{step}.ckpt"), format!("state {step}").as_bytes());
        f.store.upload(&a, Rules::default(), 1, Some(step), &mut cache).await.unwrap().unwrap();
    }
    let names = f.store.manifest_names().await.unwrap();
    assert_eq!(names, [manifest::key(1, 5), manifest::key(1, 4), manifest::key(1, 3)]);
    let blobs = std::fs::read_dir(f.root.join("store/team/7/blobs")).unwrap().count();
    assert_eq!(blobs, KEEP_MANIFESTS);
}

#[tokio::test]
async fn a_store_with_nothing_restores_nothing_and_says_nothing() {
    let f = fixture("empty");
    let b = node_dir(&f, "b");
    let restored = f.store.restore(&b, None, &mut UploadCache::default()).await.unwrap();
    assert!(restored.manifest.is_none() && restored.notes.is_empty());
}

/// The root agent wrote a `file://` store's blobs 0644 under 0755
/// directories, and another tenant's job printed the weights: what the
/// store keeps of a job is its user's alone, 0600 and 0700.
#[tokio::test]
async fn a_file_store_keeps_a_jobs_checkpoint_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture("private");
    let a = node_dir(&f, "a");
    write(&a, "weights.bin", b"alice's weights");
    write(&a, "opt/state.bin", b"moments");
    let root = nix::unistd::geteuid().is_root();
    // Root: owned by the job's user (here nobody's ids); else as the agent's.
    let owner = root.then_some((65534, 65534));
    let rules = Rules { owner: None, max_bytes: 0 };
    f.store.upload(&a, rules, 1, Some(1), &mut UploadCache::default()).await.unwrap().unwrap();
    let rules = Rules { owner, ..rules };
    write(&a, "weights.bin", b"alice's newer weights");
    if let Some((uid, gid)) = owner {
        // The job's files are its user's: only those are taken.
        for path in walkdir(&a) {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        }
    }
    f.store.upload(&a, rules, 1, Some(2), &mut UploadCache::default()).await.unwrap().unwrap();
    let job = f.root.join("store/team/7");
    let mut seen = 0;
    let mut todo = vec![f.root.join("store/team"), job.clone()];
    for entry in walkdir(&job) {
        todo.push(entry);
    }
    for path in todo {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        assert_eq!(mode, if meta.is_dir() { 0o700 } else { 0o600 }, "{}", path.display());
        if let Some((uid, gid)) = owner {
            assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 6, "blobs, manifests and their directories: {seen}");
}

fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(walkdir(&path));
        }
        found.push(path);
    }
    found
}

/// A job stored a sparse 1 GiB file whole: a checkpoint over the
/// operator's limit is refused before a byte of it is read or stored.
#[tokio::test]
async fn a_checkpoint_over_the_limit_is_refused_before_it_is_read() {
    let f = fixture("limit");
    let a = node_dir(&f, "a");
    let sparse = std::fs::File::create(a.join("huge.bin")).unwrap();
    sparse.set_len(1 << 30).unwrap();
    write(&a, "small.bin", b"ok");
    let rules = Rules { owner: None, max_bytes: 64 << 20 };
    let began = Instant::now();
    let err = f.store.upload(&a, rules, 1, Some(1), &mut UploadCache::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Limit(_)) && !err.retryable(), "{err}");
    let text = err.to_string();
    assert!(text.contains("1073741826 bytes") && text.contains("--max-checkpoint-bytes"), "{text}");
    assert!(began.elapsed() < std::time::Duration::from_secs(5), "the file was read");
    assert!(f.store.manifest_names().await.unwrap().is_empty(), "something was stored");
    std::fs::remove_file(a.join("huge.bin")).unwrap();
    assert!(f.store.upload(&a, rules, 1, Some(2), &mut UploadCache::default()).await.unwrap().is_some());
}
