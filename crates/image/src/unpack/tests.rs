use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use super::*;

/// One entry of a test layer.
#[derive(Clone, Debug)]
enum E {
    Dir(String),
    File(String, String),
    Symlink(String, String),
    Hardlink(String, String),
}

use E::*;

fn dir(p: &str) -> E {
    Dir(p.into())
}
fn file(p: &str, text: &str) -> E {
    File(p.into(), text.into())
}
fn symlink(p: &str, to: &str) -> E {
    Symlink(p.into(), to.into())
}
fn hardlink(p: &str, to: &str) -> E {
    Hardlink(p.into(), to.into())
}

/// The layer's tar, uncompressed. Names are written raw (`tar`'s
/// builder refuses `..`, which a hostile layer has).
fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let (path, kind, data, link): (&str, _, &[u8], Option<&str>) = match entry {
            Dir(p) => (p, tar::EntryType::Directory, b"", None),
            File(p, text) => (p, tar::EntryType::Regular, text.as_bytes(), None),
            Symlink(p, to) => (p, tar::EntryType::Symlink, b"", Some(to)),
            Hardlink(p, to) => (p, tar::EntryType::Link, b"", Some(to)),
        };
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        if path.len() >= 100 {
            // Long names as GNU tar writes them (the builder refuses `..`
            // and absolute names, which a long one here never has).
            builder.append_data(&mut header, path, data).unwrap();
            continue;
        }
        let name = &mut header.as_old_mut().name;
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(to) = link {
            let linkname = &mut header.as_old_mut().linkname;
            linkname.fill(0);
            linkname[..to.len()].copy_from_slice(to.as_bytes());
        }
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    out.write_all(tar).unwrap();
    out.finish().unwrap()
}

/// A scratch directory: `root` (the image's) four levels down, and
/// `canary` at the top, with files and a directory that no layer may
/// touch. Every link a test makes points into the scratch directory, by
/// its absolute path or by at most four `..`, so that an unpacker that
/// follows one (a regression) harms the scratch directory alone, never
/// the machine running the test.
struct Scratch {
    dir: PathBuf,
    root: PathBuf,
    canary: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ebb-unpack-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (root, canary) = (dir.join("d1/d2/d3/root"), dir.join("canary"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(canary.join("sub")).unwrap();
        std::fs::write(canary.join("precious"), "precious").unwrap();
        std::fs::write(canary.join("victim"), "victim").unwrap();
        std::fs::write(canary.join("sub/deep"), "deep").unwrap();
        Scratch { dir, root, canary }
    }

    /// Applies `entries` as one layer, gzip-compressed.
    fn apply(&self, entries: &[E]) -> Result<(), UnpackError> {
        self.apply_with(entries, &Limits::within(1 << 30))
    }

    fn apply_with(&self, entries: &[E], limits: &Limits) -> Result<(), UnpackError> {
        let blob = gzip(&tar_of(entries));
        let mut used = Used::default();
        apply_tar(&blob[..], blob.len() as u64, &self.root, limits, &mut used)
    }

    /// Everything under the scratch directory but the root: what a
    /// layer must leave as it was.
    fn outside(&self) -> BTreeMap<PathBuf, String> {
        let mut seen = BTreeMap::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path == self.root {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let what = if meta.is_dir() {
                    stack.push(path.clone());
                    format!("dir {:o}", meta.mode())
                } else {
                    format!("{:o} {}", meta.mode(), std::fs::read_to_string(&path).unwrap_or_default())
                };
                seen.insert(path.strip_prefix(&self.dir).unwrap().to_path_buf(), what);
            }
        }
        seen
    }

    fn canary_path(&self) -> String {
        self.canary.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn whiteouts_opaque_directories_replacements_and_hard_links_follow_the_image_spec() {
    let s = Scratch::new("spec");
    s.apply(&[
        dir("etc"),
        file("etc/gone", "old"),
        file("etc/kept", "kept"),
        dir("opt"),
        file("opt/a", "a"),
        dir("opt/sub"),
        file("opt/sub/b", "b"),
        dir("swap"),
        file("swap/x", "x"),
        symlink("lib", "usr/lib"),
        file("both", "lower"),
    ])
    .unwrap();
    s.apply(&[
        file("etc/.wh.gone", ""),
        dir("opt"),
        file("opt/.wh..wh..opq", ""),
        file("opt/new", "new"),
        file("swap", "now a file"),
        dir("bin"),
        file("bin/busybox", "#!"),
        hardlink("bin/sh", "bin/busybox"),
        symlink("bin/ls", "busybox"),
        file(".wh.lib", ""),
        file("both", "upper"),
        file(".wh.both", ""),
        file("no/parent/entries", "made"),
    ])
    .unwrap();
    let root = &s.root;
    assert!(!root.join("etc/gone").exists(), "a whiteout removes the lower file");
    assert_eq!(std::fs::read_to_string(root.join("etc/kept")).unwrap(), "kept");
    assert!(!root.join("opt/a").exists() && !root.join("opt/sub").exists(), "opaque empties the lower dir");
    assert_eq!(std::fs::read_to_string(root.join("opt/new")).unwrap(), "new", "but keeps its own layer's");
    assert_eq!(std::fs::read_to_string(root.join("swap")).unwrap(), "now a file");
    let (a, b) = (root.join("bin/busybox").metadata().unwrap(), root.join("bin/sh").metadata().unwrap());
    assert_eq!(a.ino(), b.ino(), "a hard link is a link inside the root");
    assert_eq!(std::fs::read_link(root.join("bin/ls")).unwrap(), Path::new("busybox"));
    assert!(
        std::fs::symlink_metadata(root.join("lib")).is_err(),
        "a whiteout removes a link, not its target"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("both")).unwrap(),
        "upper",
        "a whiteout spares its own layer"
    );
    assert_eq!(std::fs::read_to_string(root.join("no/parent/entries")).unwrap(), "made");
}

#[test]
fn set_id_bits_are_dropped_and_devices_are_not_made() {
    let s = Scratch::new("modes");
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, mode) in [
        ("su", tar::EntryType::Regular, 0o6755),
        ("tmp", tar::EntryType::Directory, 0o1777),
        ("sda", tar::EntryType::Block, 0o666),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(0);
        builder.append_data(&mut header, path, std::io::empty()).unwrap();
    }
    let blob = builder.into_inner().unwrap();
    apply_tar(&blob[..], blob.len() as u64, &s.root, &Limits::within(1 << 30), &mut Used::default()).unwrap();
    assert_eq!(s.root.join("su").metadata().unwrap().mode() & 0o7777, 0o755);
    assert_eq!(s.root.join("tmp").metadata().unwrap().mode() & 0o7777, 0o1777, "the sticky bit stays");
    assert!(std::fs::symlink_metadata(s.root.join("sda")).is_err());
}

/// Each way the third attacker's pass found, and its neighbours: a
/// layer that names a path outside its root, or reaches it through a
/// link, is refused, and the canary beside the root is untouched.
#[test]
fn no_entry_kind_reaches_outside_the_root() {
    let c = "CANARY";
    let cases: Vec<(&str, Vec<Vec<E>>)> = vec![
        ("a file through a link of the same layer", vec![vec![symlink("out", c), file("out/pwned", "x")]]),
        ("a whiteout through a link", vec![vec![symlink("a", c), file("a/.wh.victim", "")]]),
        ("an opaque marker through a link", vec![vec![symlink("b", c), file("b/.wh..wh..opq", "")]]),
        ("a replacement through a link", vec![vec![symlink("c", c), file("c/precious", "overwritten")]]),
        ("a directory through a link", vec![vec![symlink("d", c), dir("d/sub")]]),
        ("a link through a link", vec![vec![symlink("e", c), symlink("e/precious", "x")]]),
        (
            "a hard link made through a link",
            vec![vec![file("f", "x"), symlink("g", c), hardlink("g/victim", "f")]],
        ),
        ("a hard link to a file through a link", vec![vec![symlink("h", c), hardlink("i", "h/precious")]]),
        ("a whiteout across layers", vec![vec![symlink("j", c)], vec![file("j/.wh.victim", "")]]),
        ("an opaque marker across layers", vec![vec![symlink("k", c)], vec![file("k/.wh..wh..opq", "")]]),
        ("a replacement across layers", vec![vec![symlink("l", c)], vec![file("l/precious", "overwritten")]]),
        (
            "a deep whiteout across layers",
            vec![vec![dir("m"), symlink("m/n", c)], vec![file("m/n/sub/.wh.deep", "")]],
        ),
        ("a relative link out", vec![vec![symlink("o", UP), file("o/.wh.precious", "")]]),
        ("a parent directory", vec![vec![file(&format!("{UP}/precious"), "overwritten")]]),
        ("a parent directory inside", vec![vec![dir("p"), file(&format!("p/../{UP}/victim"), "x")]]),
        ("a whiteout of a parent", vec![vec![file(&format!("{UP}/.wh.precious"), "")]]),
        ("a hard link to a parent", vec![vec![hardlink("q", &format!("{UP}/precious"))]]),
        ("a hard link to an absolute path", vec![vec![hardlink("r", "CANARY/precious")]]),
    ];
    for (what, layers) in cases {
        let s = Scratch::new("attack");
        let before = s.outside();
        let mut refused = false;
        for layer in &layers {
            let layer: Vec<E> = layer.iter().map(|e| with_canary(e, &s.canary_path())).collect();
            match s.apply(&layer) {
                Ok(()) => {}
                Err(e @ UnpackError::Refused { .. }) => {
                    assert!(e.to_string().starts_with("layer entry "), "{what}: {e}");
                    refused = true;
                    break;
                }
                Err(e) => panic!("{what}: refused for the wrong reason: {e}"),
            }
        }
        assert!(refused, "{what}: applied");
        assert_eq!(s.outside(), before, "{what}: the canary changed");
    }
}

/// Absolute names are the root's: `/x` is `<root>/x`.
#[test]
fn an_absolute_entry_lands_inside_the_root() {
    let s = Scratch::new("absolute");
    let before = s.outside();
    let inside = format!("{}/precious", s.canary_path());
    let (link, whiteout) = (format!("{}/abs", s.canary_path()), format!("{}/.wh.abs", s.canary_path()));
    s.apply(&[file(&inside, "inside"), symlink(&link, &s.canary_path()), file(&whiteout, "")]).unwrap();
    assert_eq!(s.outside(), before);
    let landed = s.root.join(inside.trim_start_matches('/'));
    assert_eq!(std::fs::read_to_string(landed).unwrap(), "inside");
}

/// A file written over a hard link replaces the link, never the file it
/// shares (which may be another path's of the image, or of the node).
#[test]
fn a_file_over_a_hard_link_does_not_write_through_it() {
    let s = Scratch::new("hardlink");
    s.apply(&[file("x", "A"), hardlink("y", "x")]).unwrap();
    s.apply(&[file("y", "B")]).unwrap();
    assert_eq!(std::fs::read_to_string(s.root.join("x")).unwrap(), "A");
    assert_eq!(std::fs::read_to_string(s.root.join("y")).unwrap(), "B");
}

/// A link the image keeps to outside is the container's business (it
/// resolves inside its root); removing or replacing the link itself
/// touches only the link.
#[test]
fn links_to_outside_are_removed_as_links() {
    let s = Scratch::new("links");
    let before = s.outside();
    let c = s.canary_path();
    s.apply(&[symlink("a", &c), dir("d"), symlink("d/link", &c), symlink("t", &format!("{c}/precious"))])
        .unwrap();
    s.apply(&[file(".wh.a", ""), file("d/.wh..wh..opq", ""), file("t", "replaced")]).unwrap();
    s.apply(&[file("d", "a file where a directory of links was")]).unwrap();
    assert_eq!(s.outside(), before);
    assert_eq!(std::fs::read_to_string(s.root.join("t")).unwrap(), "replaced");
}

#[test]
fn a_decompression_bomb_stops_at_its_ratio_and_the_image_at_its_budget() {
    let s = Scratch::new("bomb");
    let zeros = "\0".repeat(64 << 20);
    let e = s.apply(&[file("zeros", &zeros)]).unwrap_err();
    assert!(matches!(e, UnpackError::TooLarge(_)), "{e}");
    assert!(e.to_string().contains("100 times its compressed size"), "{e}");
    assert!(s.root.join("zeros").metadata().unwrap().len() <= (Limits::EXPANSION_FLOOR + (64 << 10)));

    let s = Scratch::new("budget");
    let small = Limits { max_bytes: 1 << 20, ..Limits::within(1 << 20) };
    let e = s.apply_with(&[file("big", &"x".repeat(2 << 20))], &small).unwrap_err();
    assert!(e.to_string().contains("more than 1 MiB, this node's limit for one image"), "{e}");

    let s = Scratch::new("entries");
    let few = Limits { max_entries: 10, ..Limits::within(1 << 30) };
    let many: Vec<E> = (0..20).map(|i| file(&format!("f{i}"), "")).collect();
    let e = s.apply_with(&many, &few).unwrap_err();
    assert!(e.to_string().contains("more than 10 files"), "{e}");
}

#[test]
fn paths_too_deep_or_too_long_are_refused() {
    let s = Scratch::new("deep");
    let deep = vec!["d"; MAX_DEPTH + 1].join("/");
    assert!(matches!(s.apply(&[file(&deep, "x")]), Err(UnpackError::Refused { .. })));
    let long = PathBuf::from("a".repeat(MAX_PATH_BYTES + 1));
    assert!(Named::new(&long).is_err());
}

/// The canary, relative to the root.
const UP: &str = "../../../../canary";

fn with_canary(e: &E, canary: &str) -> E {
    let f = |s: &String| s.replace("CANARY", canary);
    match e {
        Dir(p) => Dir(f(p)),
        File(p, t) => File(f(p), t.clone()),
        Symlink(p, t) => Symlink(f(p), f(t)),
        Hardlink(p, t) => Hardlink(f(p), f(t)),
    }
}

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// Names from a small alphabet so that entries meet each other:
    /// links over directories, whiteouts of links, files under links.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            Just("c".to_string()),
            Just(".wh.a".to_string()),
            Just(".wh.b".to_string()),
            Just(".wh..wh..opq".to_string()),
            Just("..".to_string()),
            Just(".".to_string()),
            Just("precious".to_string()),
        ]
    }

    /// Entry paths: relative (at most three `..`, which stay in the
    /// scratch directory), or absolute under the canary's own path,
    /// which is the root's: never `/` alone, which an unpacker that kept
    /// it (a regression) would take as the machine's.
    fn path() -> impl Strategy<Value = String> {
        (prop::bool::weighted(0.1), prop::collection::vec(name(), 1..4)).prop_map(|(absolute, parts)| {
            format!("{}{}", if absolute { "CANARY/" } else { "" }, parts.join("/"))
        })
    }

    /// Link targets: the canary, absolutely and relatively, and names of
    /// the layers. None leaves the scratch directory (see [`Scratch`]):
    /// no `/`, no more than four `..`.
    fn target() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("CANARY".to_string()),
            Just("CANARY/precious".to_string()),
            Just("CANARY/sub".to_string()),
            Just(UP.to_string()),
            Just(format!("{UP}/precious")),
            Just("../..".to_string()),
            prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("."), Just("precious")], 1..3)
                .prop_map(|parts| parts.join("/")),
        ]
    }

    fn entry() -> impl Strategy<Value = E> {
        prop_oneof![
            path().prop_map(Dir),
            (path(), "[a-z]{0,8}").prop_map(|(p, t)| File(p, t)),
            (path(), target()).prop_map(|(p, t)| Symlink(p, t)),
            (path(), target()).prop_map(|(p, t)| Hardlink(p, t)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever sequence of layers a tenant builds, every entry kind
        /// mixed, unpacking it leaves everything outside the root as it
        /// was, and refuses or applies without panicking.
        #[test]
        fn random_layers_never_touch_the_canary(layers in prop::collection::vec(prop::collection::vec(entry(), 1..8), 1..4)) {
            let s = Scratch::new("fuzz");
            let before = s.outside();
            for layer in &layers {
                let layer: Vec<E> = layer.iter().map(|e| with_canary(e, &s.canary_path())).collect();
                if s.apply(&layer).is_err() {
                    break;
                }
            }
            prop_assert_eq!(s.outside(), before);
        }
    }
}
