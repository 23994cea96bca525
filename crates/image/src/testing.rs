//! For tests: a real registry on loopback (Debian's `docker-registry`)
//! and images built with the ecosystem's tools (`umoci` to lay out and
//! repack a root file system, `skopeo` to push it).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The password the registry of [`Registry::start_with_login`] takes for
/// user `alice`, and its bcrypt hash (cost 4) for the registry's htpasswd.
pub const PASSWORD: &str = "right-password";
const PASSWORD_BCRYPT: &str = "$2b$04$UMac4gm5u/aShUmLOGkKRuFJ1RLui1Ern6IBqpX5wnDfJE6.fwpJW";

/// A `docker-registry` serving on a free loopback port.
pub struct Registry {
    pub host: String,
    pub dir: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Registry {
    /// A registry anyone may pull from and push to.
    pub fn start(dir: &Path) -> Registry {
        Registry::launch(dir, false)
    }

    /// A registry that takes only `alice` with [`PASSWORD`].
    pub fn start_with_login(dir: &Path) -> Registry {
        Registry::launch(dir, true)
    }

    fn launch(dir: &Path, login: bool) -> Registry {
        std::fs::create_dir_all(dir).expect("registry dir");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let host = format!("127.0.0.1:{port}");
        let auth = if login {
            std::fs::write(dir.join("htpasswd"), format!("alice:{PASSWORD_BCRYPT}\n")).unwrap();
            format!("auth:\n  htpasswd:\n    realm: ebb-test\n    path: {}\n", dir.join("htpasswd").display())
        } else {
            String::new()
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    \
             rootdirectory: {}\n  delete:\n    enabled: true\n{auth}http:\n  addr: {host}\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let log = dir.join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian's package docker-registry) is needed: .ci/run installs it");
        let start = Instant::now();
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "docker-registry did not listen on {host}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Registry { host, dir: dir.to_path_buf(), log, child }
    }

    /// The blob downloads the registry has served (its access log's
    /// `GET /v2/.../blobs/...` lines), configs included.
    pub fn blob_gets(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
            .count()
    }

    /// The manifest lookups the registry has answered (`HEAD` or `GET`
    /// of `/v2/.../manifests/...`): one per tag resolved.
    pub fn manifest_requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| (l.contains("\"HEAD /v2/") || l.contains("\"GET /v2/")) && l.contains("/manifests/"))
            .count()
    }

    /// Where the registry keeps blob `digest`'s bytes.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file of an image being built: path inside it, contents, mode.
pub struct File<'a> {
    pub path: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
}

/// Builds an image of `/bin/busybox` (Debian's busybox-static) with its
/// applets, plus `files`, and pushes it as `name:tag` to `registry`
/// (`HOST:PORT`, over HTTP) with `login` if given. Returns the reference.
pub fn push_busybox_image(
    work: &Path,
    registry: &str,
    name: &str,
    tag: &str,
    files: &[File],
    login: Option<(&str, &str)>,
) -> String {
    let layout = work.join(format!("oci-{name}-{tag}"));
    let bundle = work.join(format!("bundle-{name}-{tag}"));
    let _ = std::fs::remove_dir_all(&layout);
    let _ = std::fs::remove_dir_all(&bundle);
    let image = format!("{}:{tag}", layout.display());
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci").args(["unpack", "--image", &image]).arg(&bundle));
    let rootfs = bundle.join("rootfs");
    for dir in ["bin", "tmp", "proc", "dev", "sys", "etc"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .expect("/bin/busybox (Debian's busybox-static) is needed: .ci/run installs it");
    for applet in
        ["sh", "cat", "ls", "ps", "sleep", "id", "echo", "env", "mkdir", "kill", "setsid", "test", "wc"]
    {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    for f in files {
        let path = rootfs.join(f.path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, f.contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode)).unwrap();
    }
    run(Command::new("umoci").args(["repack", "--image", &image]).arg(&bundle));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.env",
        "PATH=/bin",
        "--config.workingdir",
        "/",
    ]));
    let reference = format!("{registry}/{name}:{tag}");
    let mut copy = Command::new("skopeo");
    copy.args(["copy", "--quiet", "--dest-tls-verify=false"]);
    if let Some((user, password)) = login {
        copy.arg(format!("--dest-creds={user}:{password}"));
    }
    run(copy.arg(format!("oci:{image}")).arg(format!("docker://{reference}")));
    let _ = std::fs::remove_dir_all(&bundle);
    reference
}

fn run(command: &mut Command) {
    let out =
        command.output().unwrap_or_else(|e| panic!("{command:?}: {e} (.ci/run installs umoci and skopeo)"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
}
