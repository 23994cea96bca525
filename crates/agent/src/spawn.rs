//! Starting an attempt's process.
//!
//! `fork` copies the agent's page tables at every start, and the agent is
//! a large multithreaded process: that copy was most of what a start cost.
//! Here the child shares the agent's memory until it calls `exec`, as
//! `posix_spawn` does (`clone(CLONE_VM | CLONE_VFORK)`: the calling thread
//! waits until then), and in between it does what `posix_spawn` cannot:
//! join the attempt's cgroups and become the tenant's user.
//!
//! The child runs on a stack of its own, in memory the agent's other
//! threads go on using, so it only makes system calls on data prepared
//! before the clone: no allocation, no lock, no panic. It changes
//! credentials by raw system calls, since glibc's `setuid` would change
//! every thread of the agent's as well.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::identity::{Identity, DEFAULT_PATH};

/// What to start.
pub struct Request<'a> {
    pub argv: &'a [String],
    /// The whole environment (nothing is inherited).
    pub env: &'a BTreeMap<String, String>,
    /// The working directory, entered as the user.
    pub cwd: &'a Path,
    pub who: &'a Identity,
    /// `cgroup.procs` files the child writes "0" to, joining their groups.
    pub join: &'a [RawFd],
}

/// A started process: in its own process group, stdin from `/dev/null`,
/// stdout and stderr into these pipes.
pub struct Child {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The step of the child's set-up that failed, and why.
#[derive(Debug)]
pub struct SpawnError {
    pub step: &'static str,
    pub error: std::io::Error,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

impl SpawnError {
    fn new(step: &'static str, error: impl Into<std::io::Error>) -> SpawnError {
        SpawnError { step, error: error.into() }
    }

    /// Why, for people: the step that failed and the system's words,
    /// without `(os error N)`; for `exec` itself the words say it all
    /// (`No such file or directory`, `Permission denied`).
    pub fn cause(&self) -> String {
        let text = self.error.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        if self.step == EXEC_STEP {
            text.to_string()
        } else {
            format!("{}: {text}", self.step)
        }
    }
}

/// The child's steps, as a failed child records them (0: none failed).
const JOIN: u8 = 1;
const PGROUP: u8 = 2;
const GROUPS: u8 = 3;
const GID: u8 = 4;
const UID: u8 = 5;
const STDIO: u8 = 6;
const CHDIR: u8 = 7;
const EXEC: u8 = 8;

const EXEC_STEP: &str = "cannot run it";

fn step_name(step: u8) -> &'static str {
    match step {
        JOIN => "cannot join its cgroup",
        PGROUP => "cannot make its process group",
        GROUPS => "cannot take its user's groups",
        GID => "cannot take its user's gid",
        UID => "cannot take its user's uid",
        STDIO => "cannot connect its standard streams",
        CHDIR => "cannot enter its working directory",
        _ => EXEC_STEP,
    }
}

/// Everything the child reads, built before the clone.
struct Context<'a> {
    candidates: Vec<CString>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    cwd: CString,
    join: &'a [RawFd],
    /// Some((gid, uid, groups)) where the child must switch users.
    switch: Option<(libc::gid_t, libc::uid_t, Vec<libc::gid_t>)>,
    stdio: [RawFd; 3],
    /// Written by a failing child, read after it has exited: the step
    /// (0: none) and its errno.
    failed_step: AtomicU8,
    failed_errno: AtomicI32,
}

/// Starts `req`: returns once the program runs (its `exec` succeeded), or
/// with the step that failed.
pub fn spawn(req: &Request) -> Result<Child, SpawnError> {
    let cstring = |what: &str, s: &[u8]| {
        CString::new(s).map_err(|_| {
            SpawnError::new(
                "cannot pass its arguments",
                std::io::Error::other(format!("{what} contains a NUL byte")),
            )
        })
    };
    let program = req.argv.first().ok_or_else(|| {
        SpawnError::new("cannot pass its arguments", std::io::Error::other("no program to run"))
    })?;
    let argv =
        req.argv.iter().map(|a| cstring("an argument", a.as_bytes())).collect::<Result<Vec<_>, _>>()?;
    let env = req
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("variable {k}"), format!("{k}={v}").as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let path = req.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let candidates = candidates(program, path)
        .into_iter()
        .map(|c| cstring("the program's path", &c))
        .collect::<Result<Vec<_>, _>>()?;

    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let null = dev_null()?;
    // The child moves these onto 0, 1 and 2: none may be one of those.
    let out_w = above_stdio(out_w)?;
    let err_w = above_stdio(err_w)?;

    let with_null = |v: &[CString]| v.iter().map(|c| c.as_ptr()).chain([std::ptr::null()]).collect();
    let ctx = Context {
        argv: with_null(&argv),
        envp: with_null(&env),
        candidates,
        cwd: cstring("the working directory", req.cwd.as_os_str().as_bytes())?,
        join: req.join,
        switch: req.who.switch.then(|| {
            (req.who.gid.as_raw(), req.who.uid.as_raw(), req.who.groups.iter().map(|g| g.as_raw()).collect())
        }),
        stdio: [null, out_w.as_raw_fd(), err_w.as_raw_fd()],
        failed_step: AtomicU8::new(0),
        failed_errno: AtomicI32::new(0),
    };
    let stack = Stack::take().map_err(|e| SpawnError::new("cannot map a stack to start it on", e))?;

    // SAFETY: every signal is blocked around the clone, so that no handler
    // of the agent's runs in the child while it shares the agent's memory;
    // the child resets them all before unblocking. `ctx` and `stack` outlive
    // the child's use of them: with CLONE_VFORK, `clone` returns only once
    // the child has exec'd or exited.
    //
    // All but SIGCHLD, which only the child's own children (it has none
    // before its exec) would send it. A job that exited before this thread
    // had unblocked its signals had its SIGCHLD queued rather than dropped
    // (a blocked signal is never ignored), then delivered by waking an
    // idle thread of the agent's for nothing: seven starts in ten of jobs
    // that end at once.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigdelset(&mut all, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &ctx as *const Context as *mut c_void,
        );
        let clone_error = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(SpawnError::new("cannot start a process", clone_error));
        }
        pid
    };
    drop((out_w, err_w));
    stack.give_back();
    let step = ctx.failed_step.load(Ordering::Acquire);
    if step != 0 {
        reap(pid);
        let error = std::io::Error::from_raw_os_error(ctx.failed_errno.load(Ordering::Acquire));
        return Err(SpawnError::new(step_name(step), error));
    }
    Ok(Child { pid, stdout: out_r, stderr: err_r })
}

/// Where `execvp` would look for `program`, in order.
fn candidates(program: &str, path: &str) -> Vec<Vec<u8>> {
    if program.contains('/') {
        return vec![program.as_bytes().to_vec()];
    }
    path.split(':')
        .map(|dir| {
            // An empty entry is the working directory.
            let dir = if dir.is_empty() { "." } else { dir.trim_end_matches('/') };
            format!("{dir}/{program}").into_bytes()
        })
        .collect()
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SpawnError::new("cannot make a pipe", e))
}

/// `/dev/null`, every job's standard input: opened once, numbered 3 or
/// above.
fn dev_null() -> Result<RawFd, SpawnError> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(null) = NULL.get() {
        return Ok(null.as_raw_fd());
    }
    let null = std::fs::File::open("/dev/null").map_err(|e| SpawnError::new("cannot open /dev/null", e))?;
    let null = above_stdio(OwnedFd::from(null))?;
    Ok(NULL.get_or_init(|| null).as_raw_fd())
}

/// `fd`, or a copy of it numbered 3 or above.
fn above_stdio(fd: OwnedFd) -> Result<OwnedFd, SpawnError> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one we own.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(SpawnError::new("cannot number a descriptor", std::io::Error::last_os_error()));
    }
    // SAFETY: `copy` is a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// The child, between clone and exec: records the failing step and exits
/// 127, or becomes the program.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Context`, alive until the child
    // exec's or exits (CLONE_VFORK).
    let ctx = unsafe { &*(arg as *const Context) };
    // SAFETY: only system calls on memory prepared before the clone.
    let (step, errno) = unsafe { prepare_and_exec(ctx) };
    ctx.failed_errno.store(errno, Ordering::Release);
    ctx.failed_step.store(step, Ordering::Release);
    // SAFETY: exits the child only; runs no destructor, no atexit handler.
    unsafe { libc::_exit(127) }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
}

/// The umask a job's process starts with.
pub const JOB_UMASK: libc::mode_t = 0o022;

/// Returns only on failure: the step and errno.
unsafe fn prepare_and_exec(ctx: &Context) -> (u8, c_int) {
    unsafe {
        // Default dispositions for every signal: none of the agent's
        // handlers may run here, and a job starts as if from a shell.
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());

        for &fd in ctx.join {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return (JOIN, errno());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return (PGROUP, errno());
        }
        // The agent's own umask is 0077 (its files are its own); a job
        // starts with the usual one, as from a login. The child has its
        // own copy of the file system context (no CLONE_FS): the agent's
        // is untouched.
        libc::umask(JOB_UMASK);
        if let Some((gid, uid, groups)) = &ctx.switch {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                return (GROUPS, errno());
            }
            if libc::syscall(libc::SYS_setgid, *gid) != 0 {
                return (GID, errno());
            }
            if libc::syscall(libc::SYS_setuid, *uid) != 0 {
                return (UID, errno());
            }
        }
        for (target, &fd) in ctx.stdio.iter().enumerate() {
            if libc::dup2(fd, target as c_int) < 0 {
                return (STDIO, errno());
            }
        }
        // As the user: a directory the user cannot enter fails here.
        if libc::chdir(ctx.cwd.as_ptr()) != 0 {
            return (CHDIR, errno());
        }
        // As execvp does: on to the next candidate where this one is
        // missing or not allowed; a permission error wins over "not found".
        let mut error = libc::ENOENT;
        for candidate in &ctx.candidates {
            libc::execve(candidate.as_ptr(), ctx.argv.as_ptr(), ctx.envp.as_ptr());
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => error = libc::EACCES,
                other => return (EXEC, other),
            }
        }
        (EXEC, error)
    }
}

/// A child's stack: mapped, with a guard page below it.
struct Stack {
    base: *mut c_void,
    len: usize,
}

// SAFETY: a mapping only the thread that holds the `Stack` uses (and the
// child it starts, while that thread waits).
unsafe impl Send for Stack {}

/// Stacks children ran on, kept for the next starts: mapping a fresh one
/// and unmapping it costs every start page faults and, in a multithreaded
/// agent, a flush of the other CPUs' TLBs.
static STACKS: std::sync::Mutex<Vec<Stack>> = std::sync::Mutex::new(Vec::new());
/// Starts run a few at a time: more stacks than this are unmapped.
const KEPT_STACKS: usize = 8;
const STACK_BYTES: usize = 256 * 1024;

impl Stack {
    /// A kept stack, or a new one.
    fn take() -> std::io::Result<Stack> {
        match STACKS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            Some(stack) => Ok(stack),
            None => Stack::new(STACK_BYTES),
        }
    }

    /// Keeps the stack for the next start; its child has exec'd or exited
    /// (`clone` with CLONE_VFORK returned), so nothing runs on it.
    fn give_back(self) {
        let mut kept = STACKS.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT_STACKS {
            kept.push(self);
        }
    }

    fn new(len: usize) -> std::io::Result<Stack> {
        // SAFETY: a fresh anonymous mapping, released in Drop.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The top, 16-byte aligned (the stack grows down).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping.
        let end = unsafe { self.base.cast::<u8>().add(self.len) };
        end.wrapping_sub(end as usize % 16).cast()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Waits for `pid` (a child that failed to start) and discards its status.
fn reap(pid: i32) {
    while let Err(nix::errno::Errno::EINTR) = waitpid(Pid::from_raw(pid), None) {}
}

/// How a process ended: its exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Waits for child `pid` to end, and reaps it: on a pidfd where the kernel
/// has them (5.3 and later), else on a blocking thread.
pub async fn wait(pid: i32) -> std::io::Result<Ended> {
    // SAFETY: pidfd_open returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        // SAFETY: a fresh descriptor owned by nothing else, registered while
        // the AsyncFd owns it and closed only when the AsyncFd is dropped.
        let pidfd = unsafe {
            AsyncFd::register_with_interest(OwnedFd::from_raw_fd(fd as RawFd), Interest::READABLE)?
        };
        // Readable once the process has exited.
        let _ready = pidfd.readable().await?;
        return reap_status(pid);
    }
    tokio::task::spawn_blocking(move || reap_status(pid)).await.map_err(std::io::Error::other)?
}

fn reap_status(pid: i32) -> std::io::Result<Ended> {
    loop {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(Ended { code: Some(code), signal: None }),
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                return Ok(Ended { code: None, signal: Some(signal as i32) })
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn me() -> Identity {
        crate::identity::test_user()
    }

    fn run(argv: &[&str], env: &[(&str, &str)], cwd: &Path) -> Result<(String, Ended), SpawnError> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let who = me();
        let child = spawn(&Request { argv: &argv, env: &env, cwd, who: &who, join: &[] })?;
        let mut out = String::new();
        std::fs::File::from(child.stdout).read_to_string(&mut out).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let ended = rt.block_on(wait(child.pid)).unwrap();
        Ok((out, ended))
    }

    #[test]
    fn the_program_gets_exactly_its_argv_env_and_directory_in_its_own_process_group() {
        let dir = std::env::temp_dir();
        let script = "echo \"$# $1|$2|$FOO|$(pwd)|$(ps -o pgid= -p $$ | tr -d ' ')|$$\"; env | wc -l";
        let (out, ended) =
            run(&["sh", "-c", script, "sh", "a b", "*"], &[("FOO", "bar"), ("PATH", "/usr/bin:/bin")], &dir)
                .unwrap();
        assert_eq!(ended, Ended { code: Some(0), signal: None });
        let mut lines = out.lines();
        let fields: Vec<&str> = lines.next().unwrap().split('|').collect();
        assert_eq!(fields[..4], ["2 a b", "*", "bar", &dir.canonicalize().unwrap().display().to_string()]);
        assert_eq!(fields[4], fields[5], "the process leads its own group");
        // FOO, PATH, and what sh sets itself (PWD, SHLVL, _): nothing of ours.
        let count: usize = lines.next().unwrap().trim().parse().unwrap();
        assert!(count <= 5, "{out}");
    }

    #[test]
    fn starts_on_many_threads_at_once_each_get_their_own_argv_on_kept_stacks() {
        let dir = std::env::temp_dir();
        let outs: Vec<Vec<String>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..6)
                .map(|t| {
                    let dir = &dir;
                    scope.spawn(move || {
                        (0..40)
                            .map(|i| {
                                let word = format!("{t}-{i}");
                                run(&["echo", &word], &[("PATH", "/usr/bin:/bin")], dir).unwrap().0
                            })
                            .collect()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (t, outs) in outs.iter().enumerate() {
            for (i, out) in outs.iter().enumerate() {
                assert_eq!(out, &format!("{t}-{i}\n"));
            }
        }
        let kept = STACKS.lock().unwrap().len();
        assert!((1..=KEPT_STACKS).contains(&kept), "{kept} stacks kept");
    }

    #[test]
    fn exit_codes_and_signals_are_reported() {
        let dir = std::env::temp_dir();
        let path = [("PATH", "/usr/bin:/bin")];
        assert_eq!(
            run(&["sh", "-c", "exit 3"], &path, &dir).unwrap().1,
            Ended { code: Some(3), signal: None }
        );
        let killed = run(&["sh", "-c", "kill -TERM $$"], &path, &dir).unwrap().1;
        assert_eq!(killed, Ended { code: None, signal: Some(libc::SIGTERM) });
    }

    #[test]
    fn failures_name_their_step() {
        let dir = std::env::temp_dir();
        let path = [("PATH", "/nonexistent:/usr/bin:/bin")];
        let missing = run(&["no-such-program-here"], &path, &dir).err().unwrap();
        assert_eq!(missing.step, "cannot run it");
        assert_eq!(missing.error.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(missing.cause(), "No such file or directory");
        let bad_dir = run(&["true"], &path, Path::new("/nonexistent/dir")).err().unwrap();
        assert_eq!(bad_dir.step, "cannot enter its working directory");
        assert_eq!(bad_dir.cause(), "cannot enter its working directory: No such file or directory");
        let plain = dir.join(format!("ebb-spawn-not-executable-{}", std::process::id()));
        std::fs::write(&plain, "hello\n").unwrap();
        let not_exec = run(&[plain.to_str().unwrap()], &path, &dir).err().unwrap();
        std::fs::remove_file(&plain).unwrap();
        assert_eq!(not_exec.error.kind(), std::io::ErrorKind::PermissionDenied, "{not_exec}");
        let nul = run(&["true", "a\0b"], &path, &dir).err().unwrap();
        assert!(nul.to_string().contains("NUL byte"), "{nul}");
    }

    #[test]
    fn the_agents_ignored_signals_are_not_inherited() {
        // SAFETY: a test process; SIGHUP ignored here must not reach the child.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let dir = std::env::temp_dir();
        let (out, _) =
            run(&["sh", "-c", "grep SigIgn /proc/self/status"], &[("PATH", "/usr/bin:/bin")], &dir).unwrap();
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_DFL) };
        let mask = u64::from_str_radix(out.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & (1 << (libc::SIGHUP - 1)), 0, "{out}");
    }
}
