//! `ebb slurm-container SPEC -- PROGRAM...`: one task of a step into its
//! container, then `exec` of the program, so that the task keeps its pid,
//! its signals and its cgroup.
//!
//! The first task on a node makes the container's namespaces as the job's
//! user, with no privilege: a user namespace (the user mapped to itself,
//! or to root with `--container-remap-root`), a mount namespace whose
//! root (after `pivot_root`) is an overlay of the image the agent showed
//! the attempt and the container's own upper layer. Every later task, of
//! this step or of a later one (`--container-name`), joins the namespaces
//! of one still running (`setns`), as Pyxis does; the container's
//! directory lists its tasks' pids (with their start times, so that a
//! recycled pid is never joined), under a lock held while a task makes or
//! joins. Once its last task has ended the namespaces go with their
//! mounts; the upper layer stays for a named container's next step.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::Spec;

/// The exit of a task whose container could not be entered.
const NOT_STARTED: i32 = 125;

/// Runs `args` (`SPEC -- PROGRAM...`); never returns.
pub fn main(args: &[String]) -> ! {
    let fail = |why: String| -> ! {
        eprintln!("pyxis: {why}");
        std::process::exit(NOT_STARTED)
    };
    let (spec, argv) = match args {
        [spec, dashes, argv @ ..] if dashes == "--" && !argv.is_empty() => (spec, argv),
        _ => fail("usage: ebb slurm-container SPEC -- PROGRAM [ARGS...] (this command is srun's own)".into()),
    };
    let spec: Spec =
        serde_json::from_str(spec).unwrap_or_else(|e| fail(format!("the container's spec: {e}")));
    let host: BTreeMap<String, String> = std::env::vars().collect();
    let cwd = std::env::current_dir().ok();
    let mut program = Vec::new();
    if spec.container.entrypoint {
        program.extend(spec.image.entrypoint.iter().cloned());
    }
    program.extend(argv.iter().cloned());
    let env = environment(&spec, &host);
    if let Err(e) = enter(&spec) {
        fail(e)
    }
    let workdir =
        spec.container.workdir.clone().or_else(|| spec.image.working_dir.clone().filter(|d| !d.is_empty()));
    let moved = match workdir {
        Some(dir) => std::env::set_current_dir(&dir).map_err(|e| format!("--container-workdir {dir}: {e}")),
        // The step's directory where the container has it, else its root.
        None => match cwd.filter(|d| d.is_dir()) {
            Some(dir) => std::env::set_current_dir(dir).map_err(|e| e.to_string()),
            None => std::env::set_current_dir("/").map_err(|e| e.to_string()),
        },
    };
    if let Err(e) = moved {
        fail(e)
    }
    let e = std::process::Command::new(&program[0]).args(&program[1..]).env_clear().envs(env).exec();
    fail(format!("cannot run {:?} in the container: {e}", program[0]))
}

/// The task's environment inside: the host's (the step's), but the
/// image's values where it has the variable (its `PATH`), unless the
/// variable is one `--container-env` names; `HOME` is root's for root.
pub fn environment(spec: &Spec, host: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = host.clone();
    for pair in &spec.image.env {
        if let Some((k, v)) = pair.split_once('=') {
            if !spec.container.env.iter().any(|n| n == k) {
                env.insert(k.to_string(), v.to_string());
            }
        }
    }
    for pair in &spec.image.gpu_env {
        if let Some((k, v)) = pair.split_once('=') {
            env.insert(k.to_string(), v.to_string());
        }
    }
    // The driver's libraries where the loader finds them: the CDI spec's
    // hooks (which would update the image's loader cache) need the node's
    // root, and are not run.
    let mut dirs: Vec<&str> = Vec::new();
    for (_, at, _) in &spec.image.gpu_mounts {
        let (dir, name) = at.rsplit_once('/').unwrap_or(("", at));
        if name.contains(".so") && !dir.is_empty() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    if !dirs.is_empty() {
        let mut path = dirs.join(":");
        if let Some(had) = env.get("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            path = format!("{path}:{had}");
        }
        env.insert("LD_LIBRARY_PATH".into(), path);
    }
    if spec.container.remap_root {
        env.insert("HOME".into(), "/root".into());
        env.insert("USER".into(), "root".into());
        env.insert("LOGNAME".into(), "root".into());
    }
    env
}

/// Joins the container where one of its tasks runs, or makes it.
fn enter(spec: &Spec) -> Result<(), String> {
    let lock = std::fs::File::create(spec.dir.join("lock"))
        .map_err(|e| format!("cannot lock the container: {e}"))?;
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock the container: {e}"))?;
    let me = std::process::id() as i32;
    let mine = spec.dir.join("pids").join(format!("{me}-{}", start_time(me).unwrap_or(0)));
    std::fs::write(&mine, b"").map_err(|e| format!("cannot record the task: {e}"))?;
    let entered = match running(&spec.dir).filter(|_| spec.join) {
        Some(pid) => join(pid),
        None => make(spec),
    };
    if entered.is_err() {
        let _ = std::fs::remove_file(&mine);
    }
    drop(held);
    entered
}

/// A task of the container at `dir` that runs now, if one does: a pid
/// recorded there whose process started when recorded and is in other
/// namespaces than this one. The records of ended tasks go.
pub fn running(dir: &Path) -> Option<i32> {
    let own = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let mut found = None;
    for entry in std::fs::read_dir(dir.join("pids")).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = name.split_once('-') else { continue };
        let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else { continue };
        let alive = start_time(pid) == Some(start);
        let inside = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|ns| ns != own);
        match (alive, inside) {
            (true, true) => found = found.or(Some(pid)),
            (true, false) => {}
            (false, _) => {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    found
}

/// A process's start, in clock ticks after boot (`/proc/PID/stat`'s 22nd
/// field).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split_whitespace().nth(19)?.parse().ok()
}

/// Enters the namespaces of the container's task `pid`: its user's
/// first, which gives this process the right to enter the others.
fn join(pid: i32) -> Result<(), String> {
    let open = |ns: &str| std::fs::File::open(format!("/proc/{pid}/ns/{ns}"));
    let own = |ns: &str| std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
    let theirs = |ns: &str| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok();
    let mut order = vec![("user", CloneFlags::CLONE_NEWUSER), ("mnt", CloneFlags::CLONE_NEWNS)];
    for (ns, flag) in [
        ("net", CloneFlags::CLONE_NEWNET),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
    ] {
        if own(ns) != theirs(ns) {
            order.push((ns, flag));
        }
    }
    // Opened before any is entered: once in the mount namespace, this
    // /proc may not be the one that names them.
    let files: Vec<_> = order
        .iter()
        .map(|(ns, flag)| {
            open(ns).map(|f| (*ns, *flag, f)).map_err(|e| format!("cannot join the container: {e}"))
        })
        .collect::<Result<_, _>>()?;
    for (ns, flag, file) in files {
        nix::sched::setns(file, flag)
            .map_err(|e| format!("cannot join the container's {ns} namespace: {e}"))?;
    }
    Ok(())
}

/// Makes the container's namespaces and its root, and moves into it.
fn make(spec: &Spec) -> Result<(), String> {
    let c = &spec.container;
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS;
    for (name, flag) in [
        ("net", CloneFlags::CLONE_NEWNET),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
    ] {
        if c.unshare.iter().any(|n| n == name) {
            flags |= flag;
        }
    }
    nix::sched::unshare(flags).map_err(|e| format!("cannot make the container's namespaces: {e}"))?;
    let (inside_uid, inside_gid) = if c.remap_root { (0, 0) } else { (uid, gid) };
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| format!("cannot write {file}: {e}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{inside_uid} {uid} 1\n"))?;
    write("gid_map", format!("{inside_gid} {gid} 1\n"))?;
    let failed = |what: String| move |e: nix::Error| format!("{what}: {e}");
    // Nothing mounted here reaches the node's namespace.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(failed("cannot make the container's mounts private".into()))?;
    let root = spec.dir.join("rootfs");
    let view = Path::new(&spec.image.rootfs);
    // Writable to begin with, even for --container-readonly: the mount
    // points below are made in the upper layer.
    let (upper, work) = (spec.dir.join("upper"), spec.dir.join("work"));
    let paths = [view, upper.as_path(), work.as_path()];
    if let Some(odd) = paths.iter().find(|p| p.to_string_lossy().contains([',', ':'])) {
        return Err(format!("{}: a path with ',' or ':' cannot be an overlay layer", odd.display()));
    }
    let data = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        view.display(),
        upper.display(),
        work.display()
    );
    mount(Some("overlay"), &root, Some("overlay"), MsFlags::empty(), Some(data.as_str()))
        .map_err(failed("cannot mount the container's file system".into()))?;
    for dir in ["/proc", "/sys", "/dev"] {
        bind(Path::new(dir), &inside(&root, dir, true)?, false)?;
    }
    for file in ["/etc/hosts", "/etc/resolv.conf"] {
        if Path::new(file).is_file() {
            if let Ok(target) = inside(&root, file, false) {
                bind(Path::new(file), &target, true)?;
            }
        }
    }
    for dir in &spec.binds {
        if Path::new(dir).is_dir() {
            bind(Path::new(dir), &inside(&root, dir, true)?, false)?;
        }
    }
    if let Some(home) = spec.home.as_deref().filter(|h| Path::new(h).is_dir()) {
        let at = if c.remap_root { "/root" } else { home };
        bind(Path::new(home), &inside(&root, at, true)?, false)?;
    }
    for (host, at, read_only) in &spec.image.gpu_mounts {
        let meta = std::fs::metadata(host).map_err(|e| format!("the GPUs' {host}: {e}"))?;
        bind(Path::new(host), &inside(&root, at, meta.is_dir())?, *read_only)?;
    }
    for m in &c.mounts {
        if m.source == "tmpfs" {
            let target = inside(&root, &m.target, true)?;
            mount(
                Some("tmpfs"),
                &target,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=755"),
            )
            .map_err(failed(format!("cannot mount a tmpfs at {}", m.target)))?;
            continue;
        }
        let source = Path::new(&m.source);
        let meta = std::fs::metadata(source).map_err(|e| format!("--container-mounts: {}: {e}", m.source))?;
        let target = inside(&root, &m.target, meta.is_dir())?;
        bind(source, &target, m.read_only)?;
    }
    if !c.writable {
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        mount(None::<&str>, &root, None::<&str>, flags, None::<&str>)
            .map_err(failed("cannot make the container read-only".into()))?;
    }
    std::env::set_current_dir(&root).map_err(|e| format!("cannot enter {}: {e}", root.display()))?;
    nix::unistd::pivot_root(".", ".").map_err(failed("cannot make the image the container's root".into()))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(failed("cannot leave the node's root".into()))?;
    std::env::set_current_dir("/").map_err(|e| e.to_string())?;
    nix::sys::prctl::set_no_new_privs().map_err(failed("cannot forbid new privileges".into()))?;
    Ok(())
}

/// `path` inside the container's `root`, made if missing (a directory,
/// or an empty file): a read-only image must have it.
fn inside(root: &Path, path: &str, dir: bool) -> Result<PathBuf, String> {
    let at = root.join(path.trim_start_matches('/'));
    let made = match (dir, at.exists()) {
        (_, true) => Ok(()),
        (true, false) => std::fs::create_dir_all(&at),
        (false, false) => at
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::File::create(&at).map(drop)),
    };
    made.map_err(|e| format!("cannot make {path} in the container: {e}"))?;
    Ok(at)
}

/// Binds `source` (and what is mounted below it) at `target`; read-only
/// if asked, keeping the flags the source's mount has, which a user
/// namespace may not take away.
fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    let failed = |e: nix::Error| format!("cannot bind {} in the container: {e}", source.display());
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(failed)?;
    if read_only {
        use nix::sys::statvfs::FsFlags;
        let kept = nix::sys::statvfs::statvfs(source).map_err(failed)?.flags();
        let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        for (has, flag) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if kept.contains(has) {
                flags |= flag;
            }
        }
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(failed)?;
    }
    Ok(())
}
