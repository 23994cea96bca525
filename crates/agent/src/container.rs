//! Running an attempt inside its image, through an OCI runtime (runc).
//!
//! The attempt's process is a shim, this agent's own binary
//! (`ebb container-shim`), started as any attempt is: in the attempt's
//! cgroup, its output into the attempt's pipes. The shim
//!
//! * enters a mount namespace of its own and mounts the image's root file
//!   system (read-only, shared by every job of the node) under an overlay
//!   whose upper layer is the attempt's own: the job may write anywhere,
//!   the cache never changes, and the mount goes when the shim does;
//! * makes itself the subreaper of what it starts, runs `runc create`
//!   (the container's init is then its child) and `runc start`;
//! * passes every signal it gets to every process of the container, as the
//!   agent signals every process of a bare attempt;
//! * exits as the container's init did: its code, or its signal.
//!
//! runc places the container in a group below the shim's (a relative
//! `cgroupsPath`), so the attempt's group holds everything: `cgroup.kill`
//! at the deadline or at cancel, `populated` for the end, and the memory
//! peak, on unified and hybrid hosts alike.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::cgroup::CgroupError;
use crate::identity::Identity;
use CdiError::Malformed;

/// The exit code of a shim whose container never ran; why is in the
/// bundle's `error` file.
pub const NOT_STARTED: i32 = 125;

/// What the agent needs to run jobs in images.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    /// The OCI runtime (`--oci-runtime`).
    pub runtime: PathBuf,
    /// The image cache's budget (`--image-cache-size`) and what one
    /// image may take as it is unpacked (`--image-max-expansion`).
    pub cache: ebb_image::Limits,
    pub registries: ebb_image::Registries,
    /// How long a pull may take, and how slowly (`--pull-timeout`,
    /// `--pull-min-speed`).
    pub pull: PullLimits,
}

/// What one pull may take: a pull holds its attempt's GPUs, unbilled (a
/// pull is not metered), so it is bounded in time and in speed, and a
/// registry that trickles a byte every few seconds (which keeps a read
/// timeout alive) is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullLimits {
    /// The whole pull, download and unpack.
    pub timeout: std::time::Duration,
    /// The least a download must bring in each `window`, in bytes a
    /// second (0: no floor).
    pub min_bytes_per_s: u64,
    pub window: std::time::Duration,
}

impl Default for PullLimits {
    fn default() -> PullLimits {
        PullLimits {
            timeout: std::time::Duration::from_secs(600),
            min_bytes_per_s: 512 << 10,
            window: std::time::Duration::from_secs(30),
        }
    }
}

/// Why a pull was given up: past the node's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullGivenUp {
    #[error("the pull took longer than {}s (the node's --pull-timeout); given up, not started", .0.as_secs())]
    Timeout(std::time::Duration),
    #[error(
        "the registry sent {} in {}s, under the node's --pull-min-speed of {}/s; given up, not started",
        ebb_core::bytes_text(*sent),
        window.as_secs(),
        ebb_core::bytes_text(*floor)
    )]
    TooSlow { sent: u64, window: std::time::Duration, floor: u64 },
}

impl PullLimits {
    /// Runs `pull`, giving it up past the timeout or when `done()` (bytes
    /// downloaded so far; `u64::MAX` once the download is over) grows
    /// less than the floor over a window. Err says which.
    pub async fn watch<T>(
        &self,
        pull: impl std::future::Future<Output = T>,
        done: impl Fn() -> u64,
    ) -> Result<T, PullGivenUp> {
        tokio::pin!(pull);
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut windows = tokio::time::interval(self.window);
        windows.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        windows.tick().await; // the first is now
        let mut before = done();
        let floor = self.min_bytes_per_s.saturating_mul(self.window.as_secs().max(1));
        loop {
            tokio::select! {
                pulled = &mut pull => return Ok(pulled),
                _ = &mut deadline => return Err(PullGivenUp::Timeout(self.timeout)),
                _ = windows.tick() => {
                    let now = done();
                    if now != u64::MAX && self.min_bytes_per_s > 0 && now.saturating_sub(before) < floor {
                        let (sent, window, floor) = (now.saturating_sub(before), self.window, self.min_bytes_per_s);
                        return Err(PullGivenUp::TooSlow { sent, window, floor });
                    }
                    before = now;
                }
            }
        }
    }
}

/// A container's bundle under the attempt's run directory.
pub struct Bundle {
    pub dir: PathBuf,
}

impl Bundle {
    pub fn error_file(&self) -> PathBuf {
        self.dir.join("error")
    }
}

/// What goes in a container besides the image.
pub struct Spec<'a> {
    pub id: String,
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: &'a Path,
    pub who: &'a Identity,
    /// Root inside the image: the operator allowed it for the tenant.
    pub root: bool,
    pub hostname: String,
    /// Host directories mounted read-write at the same path inside.
    pub binds: Vec<PathBuf>,
    /// Host files mounted read-only at the same path inside.
    pub read_only: Vec<PathBuf>,
    /// The GPUs' CDI edits, where the node has a CDI spec.
    pub gpus: Option<Edits>,
}

/// Writes the bundle for `spec` under the attempt's run directory: the
/// runtime's `config.json` and the overlay's directories (the image
/// itself is mounted by the shim).
pub fn bundle(run_dir: &Path, spec: &Spec) -> std::io::Result<Bundle> {
    let dir = run_dir.join("container");
    for sub in ["rootfs", "upper", "work"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    // The job's user owns the overlay's top, so that it may write where
    // the image lets it.
    let (uid, gid) = ids(spec);
    std::os::unix::fs::chown(dir.join("upper"), Some(uid), Some(gid))?;
    let config = config(spec);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?,
    )?;
    Ok(Bundle { dir })
}

fn ids(spec: &Spec) -> (u32, u32) {
    match spec.root {
        true => (0, 0),
        false => (spec.who.uid.as_raw(), spec.who.gid.as_raw()),
    }
}

/// The runtime's `config.json` (OCI runtime spec 1.0).
pub fn config(spec: &Spec) -> Value {
    let (uid, gid) = ids(spec);
    let groups: Vec<u32> = match spec.root {
        true => Vec::new(),
        false => spec.who.groups.iter().map(|g| g.as_raw()).filter(|g| *g != gid).collect(),
    };
    let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for dir in &spec.binds {
        mounts.push(json!({"destination": dir, "type": "bind", "source": dir,
                           "options": ["rbind", "rw", "nosuid", "nodev"]}));
    }
    for file in &spec.read_only {
        mounts.push(json!({"destination": file, "type": "bind", "source": file,
                           "options": ["rbind", "ro", "nosuid", "nodev"]}));
    }
    let mut devices = Vec::new();
    // Deny every device but the usual few, as runc's default spec does.
    let mut allowed = vec![json!({"allow": false, "access": "rwm"})];
    let mut hooks = serde_json::Map::new();
    if let Some(edits) = &spec.gpus {
        env.extend(edits.env.iter().cloned());
        for node in &edits.device_nodes {
            devices
                .push(json!({"path": node.path, "type": node.kind, "major": node.major, "minor": node.minor,
                                "fileMode": node.mode, "uid": 0, "gid": 0}));
            allowed.push(json!({"allow": true, "type": node.kind, "major": node.major, "minor": node.minor,
                                "access": "rwm"}));
        }
        for m in &edits.mounts {
            mounts.push(json!({"destination": m.container_path, "type": "bind", "source": m.host_path,
                               "options": m.options}));
        }
        for (stage, list) in &edits.hooks {
            hooks.insert(stage.clone(), Value::Array(list.clone()));
        }
    }
    // The capabilities of Docker's default set but CAP_MKNOD (see
    // `hold_in_own_group`), for root inside; none for anyone else.
    let caps: Vec<&str> = match spec.root {
        true => vec![
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FSETID",
            "CAP_FOWNER",
            "CAP_NET_RAW",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETFCAP",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_KILL",
            "CAP_AUDIT_WRITE",
        ],
        false => Vec::new(),
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid, "additionalGids": groups},
            "args": spec.argv,
            "env": env,
            "cwd": spec.cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": true,
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": spec.hostname,
        "mounts": mounts,
        "hooks": hooks,
        "linux": {
            // The host's network: a gang's ranks meet, and the metadata
            // endpoint on loopback answers, as for a bare job.
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            // Below the shim's own group: the attempt's.
            "cgroupsPath": format!("ebb-{}", spec.id),
            "devices": devices,
            "resources": {"devices": allowed_with_defaults(allowed)},
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    })
}

/// The device rules every container has: null, zero, full, random,
/// urandom, tty, the pty master and slaves.
fn allowed_with_defaults(mut rules: Vec<Value>) -> Vec<Value> {
    for (kind, major, minor) in
        [("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0), ("c", 5, 2)]
    {
        rules.push(json!({"allow": true, "type": kind, "major": major, "minor": minor, "access": "rwm"}));
    }
    rules.push(json!({"allow": true, "type": "c", "major": 136, "access": "rwm"}));
    rules
}

/// One device node of a CDI edit, with what the runtime needs of it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceNode {
    pub path: String,
    pub kind: String,
    pub major: u64,
    pub minor: u64,
    pub mode: u32,
}

/// A bind mount of a CDI edit.
#[derive(Clone, Debug, PartialEq)]
pub struct CdiMount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// What a CDI spec (`nvidia-ctk cdi generate --format=json`) adds to a
/// container for some of its devices: theirs and the spec's common edits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edits {
    pub env: Vec<String>,
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<CdiMount>,
    /// By stage (`createContainer`, ...), as the runtime spec has them.
    pub hooks: BTreeMap<String, Vec<Value>>,
}

/// Why a CDI spec's edits could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The spec lacks what the CDI schema says it has.
    #[error("{0}")]
    Malformed(&'static str),
    #[error("the CDI spec has no device {0:?}")]
    NoDevice(String),
    #[error("CDI device node {host}: {source}")]
    DeviceNode { host: String, source: std::io::Error },
}

/// The edits of a CDI spec for the devices named `names` (for NVIDIA's,
/// the GPUs' indices: "0", "3"). A device the spec lacks is an error.
pub fn cdi_edits(spec: &Value, names: &[String]) -> Result<Edits, CdiError> {
    let mut edits = Edits::default();
    add_edits(&mut edits, &spec["containerEdits"])?;
    let devices = spec["devices"].as_array().ok_or(Malformed("a CDI spec has a list of devices"))?;
    for name in names {
        let device = devices
            .iter()
            .find(|d| d["name"].as_str() == Some(name))
            .ok_or_else(|| CdiError::NoDevice(name.clone()))?;
        add_edits(&mut edits, &device["containerEdits"])?;
    }
    Ok(edits)
}

fn add_edits(edits: &mut Edits, e: &Value) -> Result<(), CdiError> {
    if e.is_null() {
        return Ok(());
    }
    for v in e["env"].as_array().into_iter().flatten() {
        edits.env.push(v.as_str().ok_or(Malformed("a CDI env entry is a string"))?.to_string());
    }
    for d in e["deviceNodes"].as_array().into_iter().flatten() {
        let path = d["path"].as_str().ok_or(Malformed("a CDI device node has a path"))?.to_string();
        let host = d["hostPath"].as_str().unwrap_or(&path).to_string();
        if edits.device_nodes.iter().any(|n| n.path == path) {
            continue;
        }
        let meta =
            std::fs::metadata(&host).map_err(|source| CdiError::DeviceNode { host: host.clone(), source })?;
        use std::os::unix::fs::FileTypeExt;
        let kind = if meta.file_type().is_block_device() { "b" } else { "c" };
        let rdev = meta.rdev();
        edits.device_nodes.push(DeviceNode {
            path,
            kind: kind.into(),
            major: nix::sys::stat::major(rdev),
            minor: nix::sys::stat::minor(rdev),
            mode: 0o666,
        });
    }
    for m in e["mounts"].as_array().into_iter().flatten() {
        edits.mounts.push(CdiMount {
            host_path: m["hostPath"].as_str().ok_or(Malformed("a CDI mount has a hostPath"))?.to_string(),
            container_path: m["containerPath"]
                .as_str()
                .ok_or(Malformed("a CDI mount has a containerPath"))?
                .to_string(),
            options: m["options"]
                .as_array()
                .map(|o| o.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_else(|| vec!["rbind".into(), "ro".into()]),
        });
    }
    for h in e["hooks"].as_array().into_iter().flatten() {
        let stage = h["hookName"].as_str().ok_or(Malformed("a CDI hook has a hookName"))?.to_string();
        let mut hook = serde_json::Map::new();
        hook.insert("path".into(), h["path"].clone());
        if !h["args"].is_null() {
            hook.insert("args".into(), h["args"].clone());
        }
        if !h["env"].is_null() {
            hook.insert("env".into(), h["env"].clone());
        }
        edits.hooks.entry(stage).or_default().push(Value::Object(hook));
    }
    Ok(())
}

/// The shim's arguments, after `ebb container-shim`.
pub fn shim_args(runtime: &Path, state: &Path, bundle: &Bundle, id: &str, lower: &Path) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    vec![
        "--runtime".into(),
        s(runtime),
        "--state".into(),
        s(state),
        "--bundle".into(),
        s(&bundle.dir),
        "--id".into(),
        id.into(),
        "--lower".into(),
        s(lower),
    ]
}

/// The shim: runs the container of `bundle` and exits as its init did.
/// Never returns.
pub fn shim(runtime: &Path, state: &Path, bundle: &Path, id: &str, lower: &Path) -> ! {
    let error_file = bundle.join("error");
    let fail = |why: String| -> ! {
        let _ = std::fs::write(&error_file, &why);
        eprintln!("ebb: {why}");
        std::process::exit(NOT_STARTED)
    };
    if let Err(e) = mount_root(bundle, lower) {
        fail(format!("cannot mount the image's root file system: {e}"));
    }
    // What we start is ours to reap, the container's init included once
    // `runc create` has left it.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        fail(format!("cannot become a subreaper: {e}"));
    }
    use nix::sys::signal::{SigSet, Signal};
    let mut forwarded = SigSet::all();
    for s in
        [Signal::SIGKILL, Signal::SIGSTOP, Signal::SIGSEGV, Signal::SIGBUS, Signal::SIGILL, Signal::SIGFPE]
    {
        forwarded.remove(s);
    }
    if let Err(e) = forwarded.thread_block() {
        fail(format!("cannot block signals: {e}"));
    }
    let log = bundle.join("runtime.log");
    let runc = |args: &[&str]| {
        let mut command = std::process::Command::new(runtime);
        command.arg("--root").arg(state).arg("--log").arg(&log).args(args);
        // SAFETY: between fork and exec the child only unblocks signals,
        // which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                SigSet::all().thread_unblock().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        command
    };
    let pid_file = bundle.join("init.pid");
    let bundle_arg = bundle.display().to_string();
    let pid_arg = pid_file.display().to_string();
    let created = runc(&["create", "--bundle", &bundle_arg, "--pid-file", &pid_arg, id]).status();
    match created {
        Ok(s) if s.success() => {}
        Ok(_) => fail(format!("{} create: {}", runtime.display(), create_error(&log, bundle))),
        Err(e) => fail(format!("cannot run the OCI runtime {}: {e}", runtime.display())),
    }
    let init: i32 = match std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse().ok()) {
        Some(pid) => pid,
        None => {
            let _ = runc(&["delete", "--force", id]).status();
            fail(format!("{} create left no pid file", runtime.display()))
        }
    };
    if let Err(e) = hold_in_own_group(init) {
        let _ = runc(&["delete", "--force", id]).status();
        fail(format!("cannot keep the container in the attempt's cgroup: {e}"));
    }
    match runc(&["start", id]).status() {
        Ok(s) if s.success() => {}
        other => {
            let why = match other {
                Ok(_) => last_error(&log),
                Err(e) => e.to_string(),
            };
            let _ = runc(&["delete", "--force", id]).status();
            fail(format!("{} start: {why}", runtime.display()))
        }
    }
    let status = wait_forwarding(init, &forwarded);
    let _ = runc(&["delete", "--force", id]).status();
    mirror(status)
}

/// Moves the container's init, before it runs the job, into a group
/// below the shim's own v2 group. runc places a relative `cgroupsPath`
/// below its caller's group in the v1 hierarchies (memory, on hybrid
/// hosts) but at the root of the v2 one: there the attempt's group would
/// not hold the container, and cancel, the deadline and fencing would
/// kill only the shim. Every process of the job descends from init, so
/// all of them are in the attempt's group from here on. (runc's own
/// device rules stay with its groups: in v1 on hybrid hosts; on unified
/// ones its eBPF filter stays at its group, which is why root inside an
/// image has no CAP_MKNOD to make device nodes with.)
fn hold_in_own_group(init: i32) -> Result<(), CgroupError> {
    let file = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CgroupError::File { path, source }
    };
    let read = |p: &str| std::fs::read_to_string(p).map_err(file(Path::new(p)));
    let parents = crate::cgroup::discover(&read("/proc/self/mountinfo")?, &read("/proc/self/cgroup")?)?;
    let group = parents.v2.join("container");
    match std::fs::create_dir(&group) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(file(&group)(e)),
        _ => {}
    }
    let procs = group.join("cgroup.procs");
    std::fs::write(&procs, init.to_string()).map_err(file(&procs))
}

/// An overlay of the image (`lower`, read-only) under the attempt's own
/// upper layer, at the bundle's `rootfs`, in a mount namespace of the
/// shim's: nothing of it outlives the shim and what it starts. `nodev`
/// and `nosuid`: a device node an image carries (`tar` unpacks one as an
/// empty file in any case) or a setuid program gives nothing.
fn mount_root(bundle: &Path, lower: &Path) -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
    let mut options = OsString::from("lowerdir=");
    options.push(lower);
    options.push(",upperdir=");
    options.push(bundle.join("upper"));
    options.push(",workdir=");
    options.push(bundle.join("work"));
    // No device node or setuid bit of an image counts: runc's own /dev
    // holds the container's devices.
    let flags = MsFlags::MS_NODEV | MsFlags::MS_NOSUID;
    mount(Some("overlay"), &bundle.join("rootfs"), Some("overlay"), flags, Some(options.as_os_str()))
}

/// Why `runc create` failed: its log's last error. What runc says of a
/// program the image lacks goes only to its standard error, which is the
/// container's (the job's log): that case is found here, the program
/// looked for in the image as runc looks for it, and named with the
/// `PATH` searched.
fn create_error(log: &Path, bundle: &Path) -> String {
    let logged = last_error(log);
    if logged != NO_MESSAGE {
        return logged;
    }
    let config: Option<Value> =
        std::fs::read(bundle.join("config.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let Some(process) = config.as_ref().map(|c| &c["process"]) else { return logged };
    let Some(program) = process["args"][0].as_str() else { return logged };
    let path = process["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|v| v.strip_prefix("PATH="))
        .unwrap_or("");
    match missing(&bundle.join("rootfs"), program, path) {
        true if program.contains('/') => format!("exec: {program:?}: no such file in the image"),
        true => format!("exec: {program:?}: executable file not found in the image's PATH ({path})"),
        false => format!("{logged}; what the runtime said is in the job's log (ebb logs)"),
    }
}

/// Whether `program` is missing from the image at `rootfs`: a path, or a
/// name looked for in each of `path`'s directories.
fn missing(rootfs: &Path, program: &str, path: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        |p: PathBuf| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        return !runnable(rootfs.join(program.trim_start_matches('/')));
    }
    !path
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|dir| runnable(rootfs.join(dir.trim_start_matches('/')).join(program)))
}

const NO_MESSAGE: &str = "failed (no message in its log)";

/// The runtime's last error message from its JSON log.
fn last_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_string))
        .unwrap_or_else(|| NO_MESSAGE.into())
}

/// Waits for `init` to end, reaping everything else that ends meanwhile
/// and passing each signal the shim gets to every process of the
/// container. Returns how `init` ended.
fn wait_forwarding(init: i32, forwarded: &nix::sys::signal::SigSet) -> nix::sys::wait::WaitStatus {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;
    let namespace = std::fs::read_link(format!("/proc/{init}/ns/pid")).ok();
    loop {
        let signal = match forwarded.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if signal == nix::sys::signal::Signal::SIGCHLD {
            loop {
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(status @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                        if pid.as_raw() == init =>
                    {
                        return status;
                    }
                    Ok(_) => {}
                }
            }
        } else if let Some(namespace) = &namespace {
            for pid in in_namespace(namespace) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
            }
        }
    }
}

/// The processes whose PID namespace is `namespace` (as `/proc/PID/ns/pid`
/// reads).
fn in_namespace(namespace: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::str::from_utf8(e.file_name().as_bytes()).ok()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok().as_deref() == Some(namespace))
        .collect()
}

/// Exits as `status` says the container's init did: with its code, or by
/// its signal (without a core file).
fn mirror(status: nix::sys::wait::WaitStatus) -> ! {
    use nix::sys::signal::SigSet;
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, signal, _) => {
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            // SAFETY: restoring the default action of a signal.
            unsafe {
                let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl);
            }
            // Blocked until now: raised, then unblocked, it ends the shim.
            let _ = nix::sys::signal::raise(signal);
            let _ = SigSet::all().thread_unblock();
            std::process::exit(128 + signal as i32)
        }
        _ => std::process::exit(NOT_STARTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pull downloading under the floor over a window is given up; one
    /// over it, or past its download (unpacking), is not; none outlives
    /// the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_pull_is_given_up_past_its_time_or_under_its_speed() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::time::Duration;
        let limits = PullLimits {
            timeout: Duration::from_secs(300),
            min_bytes_per_s: 1000,
            window: Duration::from_secs(30),
        };
        let done = std::sync::Arc::new(AtomicU64::new(0));
        // A byte every few seconds: a read timeout never fires.
        let trickle = {
            let done = done.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        let e = limits.watch(trickle, || done.load(Ordering::Relaxed)).await.unwrap_err();
        assert!(matches!(e, PullGivenUp::TooSlow { floor: 1000, .. }), "{e:?}");
        assert!(e.to_string().contains(" B in 30s, under the node's --pull-min-speed of 1000 B/s"), "{e}");

        let fast = std::sync::Arc::new(AtomicU64::new(0));
        let steady = {
            let fast = fast.clone();
            async move {
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    fast.fetch_add(2000, Ordering::Relaxed);
                }
                fast.store(u64::MAX, Ordering::Relaxed); // downloaded; unpacking
                tokio::time::sleep(Duration::from_secs(120)).await;
                "pulled"
            }
        };
        assert_eq!(limits.watch(steady, || fast.load(Ordering::Relaxed)).await, Ok("pulled"));

        let endless = std::future::pending::<()>();
        let e = limits.watch(endless, || u64::MAX).await.unwrap_err();
        assert_eq!(e, PullGivenUp::Timeout(Duration::from_secs(300)));
        assert!(e.to_string().contains("longer than 300s"), "{e}");
    }

    fn who() -> Identity {
        Identity {
            user: "t".into(),
            uid: nix::unistd::Uid::from_raw(2_000_001),
            gid: nix::unistd::Gid::from_raw(2_000_001),
            home: "/h".into(),
            groups: vec![nix::unistd::Gid::from_raw(2_000_001)],
            switch: true,
            allocated: true,
        }
    }

    #[test]
    fn a_tenants_container_runs_as_its_user_without_capabilities_on_the_hosts_network() {
        let env = BTreeMap::from([("CUDA_VISIBLE_DEVICES".to_string(), "2,3".to_string())]);
        let argv = vec!["python".to_string(), "train.py".to_string()];
        let who = who();
        let spec = Spec {
            id: "7.1".into(),
            argv: &argv,
            env: &env,
            cwd: Path::new("/work"),
            who: &who,
            root: false,
            hostname: "job-7".into(),
            binds: vec!["/ckpt/7".into()],
            read_only: vec!["/etc/resolv.conf".into()],
            gpus: None,
        };
        let c = config(&spec);
        assert_eq!(c["process"]["user"]["uid"], 2_000_001);
        assert_eq!(c["process"]["capabilities"]["effective"], json!([]));
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(c["process"]["env"], json!(["CUDA_VISIBLE_DEVICES=2,3"]));
        let kinds: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["pid", "ipc", "uts", "mount"], "the host's network, its own everything else");
        assert_eq!(c["linux"]["cgroupsPath"], "ebb-7.1", "relative: below the shim's, the attempt's group");
        let binds: Vec<&Value> =
            c["mounts"].as_array().unwrap().iter().filter(|m| m["type"] == "bind").collect();
        assert_eq!(binds[0]["destination"], "/ckpt/7");
        assert!(binds[0]["options"].as_array().unwrap().contains(&json!("rw")));
        assert!(binds[1]["options"].as_array().unwrap().contains(&json!("ro")));
        let root = config(&Spec { root: true, ..spec });
        assert_eq!(root["process"]["user"]["uid"], 0);
        assert!(root["process"]["capabilities"]["effective"]
            .as_array()
            .unwrap()
            .contains(&json!("CAP_CHOWN")));
    }

    #[test]
    fn a_cdi_spec_gives_exactly_the_jobs_gpus_and_the_common_edits() {
        // As `nvidia-ctk cdi generate --format=json` writes one (device
        // nodes here are ones every host has).
        let spec = json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}},
                {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/zero"}]}},
                {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}, {"path": "/dev/zero"}]}}
            ],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [{"path": "/dev/full"}],
                "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550", "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550",
                            "options": ["ro", "nosuid", "nodev", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
                           "args": ["nvidia-ctk", "hook", "update-ldcache"]}]
            }
        });
        let edits = cdi_edits(&spec, &["1".to_string()]).unwrap();
        let paths: Vec<&str> = edits.device_nodes.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["/dev/full", "/dev/zero"], "the common nodes and GPU 1's, not GPU 0's");
        assert_eq!((edits.device_nodes[1].major, edits.device_nodes[1].minor), (1, 5));
        assert_eq!(edits.mounts.len(), 1);
        assert_eq!(edits.hooks["createContainer"].len(), 1);
        let missing = cdi_edits(&spec, &["7".to_string()]).unwrap_err();
        assert!(matches!(&missing, CdiError::NoDevice(name) if name == "7"), "{missing:?}");
        assert!(missing.to_string().contains("no device \"7\""), "{missing}");
        let who = who();
        let env = BTreeMap::new();
        let c = config(&Spec {
            id: "1.1".into(),
            argv: &[],
            env: &env,
            cwd: Path::new("/"),
            who: &who,
            root: false,
            hostname: "h".into(),
            binds: vec![],
            read_only: vec![],
            gpus: Some(edits),
        });
        assert_eq!(c["linux"]["devices"].as_array().unwrap().len(), 2);
        assert!(c["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .contains(&json!({"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"})));
        assert_eq!(c["hooks"]["createContainer"][0]["path"], "/usr/bin/nvidia-ctk");
    }

    #[test]
    fn a_program_the_image_lacks_is_found_missing_as_runc_looks_for_it() {
        use std::os::unix::fs::PermissionsExt;
        let rootfs = std::env::temp_dir().join(format!("ebb-missing-{}", std::process::id()));
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::create_dir_all(rootfs.join("data")).unwrap();
        std::fs::write(rootfs.join("bin/sh"), b"").unwrap();
        std::fs::set_permissions(rootfs.join("bin/sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(rootfs.join("data/notes"), b"").unwrap();
        assert!(!missing(&rootfs, "sh", "/usr/bin:/bin"));
        assert!(missing(&rootfs, "python3", "/usr/bin:/bin"));
        assert!(missing(&rootfs, "sh", ""), "no PATH, nothing found by name");
        assert!(!missing(&rootfs, "/bin/sh", ""));
        assert!(missing(&rootfs, "/app/train.py", "/bin"));
        assert!(missing(&rootfs, "notes", "/data"), "a file that is not executable");
        let _ = std::fs::remove_dir_all(&rootfs);
    }
}
