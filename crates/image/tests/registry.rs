//! The image cache against a real registry on loopback, with images
//! built by `umoci` and pushed by `skopeo`.

use std::path::PathBuf;
use std::sync::Arc;

use ebb_image::testing::{push_busybox_image, File, Registry, PASSWORD};
use ebb_image::{resolve, Cache, ImageError, Limits, Login, Registries};

fn workdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-image-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn marker(contents: &[u8]) -> [File<'_>; 1] {
    [File { path: "/marker", contents, mode: 0o644 }]
}

fn registries(registry: &Registry) -> Registries {
    Registries { insecure: vec![registry.host.clone()], ..Registries::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_resolves_to_its_digest_and_the_cache_pulls_each_image_once() {
    let work = workdir("once");
    let registry = Registry::start(&work.join("registry"));
    let client = registries(&registry);
    let reference = push_busybox_image(&work, &registry.host, "train", "v1", &marker(b"first"), None);
    let first = resolve(&client, &reference, None).await.unwrap();
    assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");

    // The tag moves: the digest resolved before still names the old bytes.
    push_busybox_image(&work, &registry.host, "train", "v1", &marker(b"second"), None);
    let second = resolve(&client, &reference, None).await.unwrap();
    assert_ne!(first, second);

    let cache = Cache::open(&work.join("cache"), Limits::within(1 << 30), &registries(&registry)).unwrap();
    let mut seen = Vec::new();
    let lease = cache.acquire(&reference, &first, None, |p| seen.push(p)).await.unwrap();
    assert_eq!(std::fs::read(lease.rootfs.join("marker")).unwrap(), b"first");
    assert!(lease.rootfs.join("bin/busybox").exists());
    assert_eq!(lease.config.env, vec!["PATH=/bin".to_string()]);
    assert!(lease.downloaded > 1_000_000, "busybox is about 2 MB: {}", lease.downloaded);
    let last = seen.last().unwrap();
    assert_eq!(last.done, last.total, "progress ends at its total: {seen:?}");

    // Again, and twice at once: nothing more comes from the registry.
    let gets = registry.blob_gets();
    let again = cache.acquire(&reference, &first, None, |_| {}).await.unwrap();
    assert_eq!((again.downloaded, registry.blob_gets()), (0, gets));

    let (a, b) = tokio::join!(
        cache.acquire(&reference, &second, None, |_| {}),
        cache.acquire(&reference, &second, None, |_| {})
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(std::fs::read(a.rootfs.join("marker")).unwrap(), b"second");
    // The second image's config and its one changed layer, once: the
    // busybox layer is shared with the first... or not, as umoci lays
    // them; either way each blob is fetched at most once.
    let fetched = registry.blob_gets() - gets;
    assert!(fetched <= 2, "{fetched} blob downloads for one image of one layer and a config");
    assert_eq!(a.downloaded + b.downloaded, a.downloaded.max(b.downloaded), "one of the two pulled");
    drop((lease, again, a, b));

    // A new cache on the same directory (the agent restarted) has both.
    let reopened = Cache::open(&work.join("cache"), Limits::within(1 << 30), &registries(&registry)).unwrap();
    assert_eq!(reopened.images().len(), 2);
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_images_refused_credentials_and_a_corrupt_layer_each_say_so() {
    let work = workdir("errors");
    let registry = Registry::start_with_login(&work.join("registry"));
    let client = registries(&registry);
    let alice = Login { username: "alice".into(), password: PASSWORD.into() };
    let wrong = Login { username: "alice".into(), password: "wrong".into() };
    let reference =
        push_busybox_image(&work, &registry.host, "app", "v1", &marker(b"x"), Some(("alice", PASSWORD)));

    // A cluster that allows only another registry never connects to this one.
    let elsewhere = Registries { allowed: vec!["registry.example.com".into()], ..registries(&registry) };
    let gets = registry.blob_gets();
    let e = resolve(&elsewhere, &reference, Some(&alice)).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!("registry {} is not one this cluster pulls from", registry.host)),
        "{e}"
    );
    let cache = Cache::open(&work.join("elsewhere"), Limits::within(1 << 30), &elsewhere).unwrap();
    let digest = format!("sha256:{}", "0".repeat(64));
    assert!(matches!(cache.acquire(&reference, &digest, None, |_| {}).await, Err(ImageError::Invalid(..))));
    assert_eq!(registry.blob_gets(), gets);

    let missing = format!("{}/app:v9", registry.host);
    let e = resolve(&client, &missing, Some(&alice)).await.unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e}");
    assert_eq!(e.to_string(), format!("image {missing}: not found in the registry"));

    let e = resolve(&client, &reference, Some(&wrong)).await.unwrap_err();
    assert!(matches!(e, ImageError::Refused(..)), "{e}");
    let e = resolve(&client, &reference, None).await.unwrap_err();
    assert!(matches!(e, ImageError::Refused(..)), "anonymous: {e}");
    assert!(!e.to_string().contains(PASSWORD));
    let digest = resolve(&client, &reference, Some(&alice)).await.unwrap();

    // The registry serves other bytes than the layer's digest names.
    let manifest: serde_json::Value = {
        let blobs = std::fs::read_dir(registry.dir.join("data/docker/registry/v2/blobs/sha256")).unwrap();
        let mut found = None;
        for prefix in blobs.flatten() {
            for blob in std::fs::read_dir(prefix.path()).unwrap().flatten() {
                let bytes = std::fs::read(blob.path().join("data")).unwrap_or_default();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                    if v.get("layers").is_some() {
                        found = Some(v);
                    }
                }
            }
        }
        found.expect("the manifest in the registry's storage")
    };
    let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
    let path = registry.blob_path(&layer);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let cache = Cache::open(&work.join("cache"), Limits::within(1 << 30), &registries(&registry)).unwrap();
    let e = cache.acquire(&reference, &digest, Some(&alice), |_| {}).await.err().expect("a corrupt layer");
    assert!(matches!(e, ImageError::DigestMismatch(..)), "{e}");
    assert!(e.to_string().contains(&layer), "{e}");
    assert!(cache.images().is_empty() && cache.bytes() == 0, "nothing of it is kept");
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_budget_the_cache_evicts_the_least_recently_used_image_no_attempt_holds() {
    let work = workdir("evict");
    let registry = Registry::start(&work.join("registry"));
    let client = registries(&registry);
    let mut images = Vec::new();
    for name in ["a", "b", "c"] {
        // Each about 2 MB of busybox and a little of its own.
        let contents = name.repeat(100_000);
        let reference =
            push_busybox_image(&work, &registry.host, name, "v1", &marker(contents.as_bytes()), None);
        let digest = resolve(&client, &reference, None).await.unwrap();
        images.push((reference, digest));
    }
    // Room for about two images with their layers.
    let one = {
        let probe =
            Cache::open(&work.join("probe"), Limits::within(u64::MAX), &registries(&registry)).unwrap();
        let lease = probe.acquire(&images[0].0, &images[0].1, None, |_| {}).await.unwrap();
        drop(lease);
        probe.bytes()
    };
    let cache =
        Cache::open(&work.join("cache"), Limits::within(one * 5 / 2), &registries(&registry)).unwrap();
    let a = cache.acquire(&images[0].0, &images[0].1, None, |_| {}).await.unwrap();
    let b = cache.acquire(&images[1].0, &images[1].1, None, |_| {}).await.unwrap();
    drop(b);
    std::thread::sleep(std::time::Duration::from_millis(20));
    // `a` is the older but held: `b`, unheld, goes when `c` comes.
    let c = cache.acquire(&images[2].0, &images[2].1, None, |_| {}).await.unwrap();
    let held: Vec<String> = cache.images();
    assert!(held.contains(&images[0].1) && held.contains(&images[2].1), "{held:?}");
    assert!(!held.contains(&images[1].1), "b was evicted: {held:?}");
    assert!(cache.bytes() <= one * 5 / 2, "{} over {}", cache.bytes(), one * 5 / 2);
    drop(a);
    drop(c);
    // Now `a` (used before `c`) is the least recent: a fourth image would
    // evict it first.
    let b = cache.acquire(&images[1].0, &images[1].1, None, |_| {}).await.unwrap();
    let held = cache.images();
    assert!(!held.contains(&images[0].1) && held.contains(&images[2].1), "{held:?}");
    drop(b);
    let _: Arc<Cache> = cache;
    let _ = std::fs::remove_dir_all(&work);
}

/// Another tenant's private image, once in a node's cache, is not
/// another's to run: neither by its reference without a login the
/// registry takes, nor by its digest under a registry of one's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_private_image_is_used_only_by_whom_its_registry_lets_pull_it() {
    let work = workdir("private");
    let private = Registry::start_with_login(&work.join("private"));
    let open = Registry::start(&work.join("open"));
    let clients =
        Registries { insecure: vec![private.host.clone(), open.host.clone()], ..Registries::default() };
    let alice = Login { username: "alice".into(), password: PASSWORD.into() };
    let reference = push_busybox_image(
        &work,
        &private.host,
        "weights",
        "v1",
        &marker(b"secret"),
        Some(("alice", PASSWORD)),
    );
    let digest = resolve(&clients, &reference, Some(&alice)).await.unwrap();
    let cache = Cache::open(&work.join("cache"), Limits::within(1 << 30), &clients).unwrap();
    let lease = cache.acquire(&reference, &digest, Some(&alice), |_| {}).await.unwrap();
    assert_eq!(std::fs::read(lease.rootfs.join("marker")).unwrap(), b"secret");

    // Bob has no login there: the cache has the image, the registry says no.
    let e = cache.acquire(&reference, &digest, None, |_| {}).await.err().expect("bob is refused");
    assert!(matches!(e, ImageError::Refused(..)), "{e}");
    let wrong = Login { username: "alice".into(), password: "wrong".into() };
    assert!(cache.acquire(&reference, &digest, Some(&wrong), |_| {}).await.is_err());
    // Alice, again, from the cache.
    let again = cache.acquire(&reference, &digest, Some(&alice), |_| {}).await.unwrap();
    assert_eq!(again.downloaded, 0);

    // Bob names his own registry with alice's digest: another image, which
    // his registry does not have.
    let forged = format!("{}/weights:v1", open.host);
    let e = cache.acquire(&forged, &digest, None, |_| {}).await.err().expect("not alice's image");
    assert!(matches!(e, ImageError::NotFound(_)), "{e}");
    drop((lease, again));
    let _ = std::fs::remove_dir_all(&work);
}
