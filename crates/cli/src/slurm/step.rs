//! What runs in a Slurm job on its node: the batch step (`ebb
//! slurm-batch`, which the agent starts as the attempt's main process)
//! and the signal handling it shares with `srun`'s steps. Synchronous,
//! with no threads but the readers `srun -l` needs: these are the job's
//! own processes, in its cgroup, as its user.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use crate::error::{failed, file, usage, CliError};
use ebb_agent::slurm::Route;
use nix::sys::signal::{SigSet, Signal};

/// The signals a step's own process waits for rather than dies of: every
/// one but those a fault raises (its children get theirs from the agent
/// or through it), SIGCHLD among them, to learn its children ended.
pub fn waited_signals() -> SigSet {
    let mut set = SigSet::all();
    for fault in
        [Signal::SIGSEGV, Signal::SIGBUS, Signal::SIGFPE, Signal::SIGILL, Signal::SIGTRAP, Signal::SIGSYS]
    {
        set.remove(fault);
    }
    set
}

/// Has `command`'s process start with no signal blocked: this process
/// blocks them all to wait for them, and a child inherits its mask.
pub fn unblocked(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: sigprocmask is async-signal-safe; the child's mask alone changes.
    unsafe { command.pre_exec(|| SigSet::empty().thread_set_mask().map_err(std::io::Error::from)) }
}

/// The next signal in `set` (blocked), and the route the agent queued it
/// with, if it did (a signal merely sent has none).
pub fn next_signal(set: &SigSet) -> Option<(i32, Option<Route>)> {
    let mut info = std::mem::MaybeUninit::<nix::libc::siginfo_t>::zeroed();
    // SAFETY: sigwaitinfo fills `info` when it returns a signal.
    let signo = unsafe { nix::libc::sigwaitinfo(set.as_ref(), info.as_mut_ptr()) };
    if signo < 0 {
        return None;
    }
    // SAFETY: filled above.
    let info = unsafe { info.assume_init() };
    let route = match info.si_code == nix::libc::SI_QUEUE {
        // SAFETY: a queued signal carries its value.
        true => Route::from_value(unsafe { info.si_value().sival_ptr } as usize),
        false => None,
    };
    Some((signo, route))
}

/// A task's exit as `srun` counts it: its code, or 128+N for signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// How a child ended, as this process should end: its code, or its
/// signal raised again on itself (exit 128+N if that cannot be).
pub fn end_as(status: ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    let signal = status.signal().unwrap_or(9);
    if let Ok(s) = Signal::try_from(signal) {
        let mut set = SigSet::empty();
        set.add(s);
        let _ = set.thread_unblock();
        // SAFETY: resetting a signal to its default disposition.
        unsafe {
            let _ = nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigDfl);
        }
        let _ = nix::sys::signal::raise(s);
    }
    std::process::exit(128 + signal)
}

/// What a file-name pattern's `%` letters stand for in this job.
#[derive(Default)]
pub struct Names {
    pub job: String,
    pub array_job: Option<String>,
    pub array_task: Option<String>,
    pub name: String,
    pub node: String,
    pub user: String,
    /// `%s`: the step (`batch` for the batch script).
    pub step: String,
    /// `%t` and `%n`: the task and node of a step's task.
    pub task: Option<u32>,
    pub node_index: u32,
}

impl Names {
    /// The job's own, from the variables Ebb sets for it.
    pub fn from_env(env: &BTreeMap<String, String>) -> Names {
        let get = |k: &str| env.get(k).cloned().unwrap_or_default();
        Names {
            job: get("SLURM_JOB_ID"),
            array_job: env.get("SLURM_ARRAY_JOB_ID").cloned(),
            array_task: env.get("SLURM_ARRAY_TASK_ID").cloned(),
            name: get("SLURM_JOB_NAME"),
            node: get("EBB_NODE"),
            user: get("USER"),
            step: "batch".into(),
            task: None,
            node_index: env.get("SLURM_NODEID").and_then(|n| n.parse().ok()).unwrap_or(0),
        }
    }

    /// `pattern` with Slurm's `%` letters replaced (`%j %A %a %x %J %N %n
    /// %t %s %u %%`), each with an optional width (`%3a`: `007`).
    pub fn expand(&self, pattern: &str) -> String {
        let mut out = String::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut width = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                width.push(*d);
                chars.next();
            }
            let width: usize = width.parse().unwrap_or(0).min(10);
            let pad = |value: &str| match value.parse::<u64>() {
                Ok(n) => format!("{n:0width$}"),
                Err(_) => value.to_string(),
            };
            let value = match chars.next() {
                Some('%') => "%".to_string(),
                Some('j') => pad(&self.job),
                Some('A') => pad(self.array_job.as_deref().unwrap_or(&self.job)),
                // Slurm's NO_VAL for a job that is not an array task.
                Some('a') => pad(self.array_task.as_deref().unwrap_or("4294967294")),
                Some('x') => self.name.clone(),
                Some('J') => format!("{}.{}", pad(&self.job), self.step),
                Some('s') => self.step.clone(),
                Some('N') => self.node.clone(),
                Some('n') => pad(&self.node_index.to_string()),
                Some('t') => pad(&self.task.unwrap_or(0).to_string()),
                Some('u') => self.user.clone(),
                Some(other) => format!("%{other}"),
                None => "%".to_string(),
            };
            out.push_str(&value);
        }
        out
    }
}

/// Opens an output file as `--open-mode` says, made if missing, and its
/// directory with it. Slurm's own would fail without the directory, but
/// tools built on Slurm make it after `sbatch` answers (submitit makes
/// each array task's once it has the job's id), which on Slurm is long
/// before the job starts, and on Ebb may not be.
pub fn open_output(path: &Path, append: bool) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).mode(0o644);
    if append {
        options.append(true);
    } else {
        options.truncate(true);
    }
    match options.open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                Some(dir) => std::fs::create_dir_all(dir)?,
                None => return Err(e),
            }
            options.open(path)
        }
        opened => opened,
    }
}

/// The batch step's command line, as the agent writes it.
struct BatchArgs {
    script: PathBuf,
    steps: PathBuf,
    output: String,
    error: String,
    append: bool,
    to_batch: bool,
    args: Vec<String>,
}

fn batch_args(args: &[String]) -> Result<BatchArgs, CliError> {
    let mut parsed = BatchArgs {
        script: PathBuf::new(),
        steps: PathBuf::new(),
        output: String::new(),
        error: String::new(),
        append: false,
        to_batch: false,
        args: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).cloned().ok_or_else(|| usage(format!("{} needs a value", args[i])));
        match args[i].as_str() {
            "--" => {
                parsed.args = args[i + 1..].to_vec();
                break;
            }
            "--script" => parsed.script = value()?.into(),
            "--steps" => parsed.steps = value()?.into(),
            "--output" => parsed.output = value()?,
            "--error" => parsed.error = value()?,
            "--open-mode" => parsed.append = value()? == "append",
            // The job's signal: the agent queues it with its route.
            "--signal" => {
                value()?;
            }
            "--signal-to" => parsed.to_batch = value()? == "batch",
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
        i += 2;
    }
    if parsed.script.as_os_str().is_empty() || parsed.output.is_empty() {
        return Err(usage("--script and --output are needed"));
    }
    Ok(parsed)
}

/// Claims the next step number in `steps` (a file per step, made
/// exclusively, so concurrent `srun`s never share one).
pub fn claim_step(steps: &std::path::Path) -> Result<(u32, std::path::PathBuf), CliError> {
    for n in 0..100_000 {
        let path = steps.join(n.to_string());
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => return Ok((n, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(file(&path)(e)),
        }
    }
    Err(failed("no step number left"))
}

/// The file in the attempt's run directory whose port the first node's
/// batch step found taken ([`ebb_agent::slurm::STEP_PORT_TAKEN`]).
const STEP_PORT_TAKEN: &str = ebb_agent::slurm::STEP_PORT_TAKEN;

/// `ebb slurm-batch ...`: runs the job's script with its output and error
/// in their files, routes the job's `--signal`, and ends as the script
/// did. Not for people: the agent starts it.
pub fn batch(args: &[String]) -> ! {
    let fail = |message: String| -> ! {
        eprintln!("ebb slurm-batch: {message}");
        std::process::exit(1)
    };
    let a = batch_args(args).unwrap_or_else(|e| fail(e.to_string()));
    let env: BTreeMap<String, String> = std::env::vars().collect();
    // A job of several nodes: the script runs on the first; the others'
    // batch steps run the steps srun sends them.
    if let Some(hub) = env.get("EBB_SLURM_HUB") {
        match env.get("SLURM_NODEID").map(String::as_str) {
            Some("0") | None => {
                // This node's own steps listener too: `srun --jobid` from
                // outside the job runs its tasks here through it.
                let key = env.get("EBB_SLURM_KEY").cloned().unwrap_or_default();
                let at = super::remote::serve_steps(key.clone(), &a.steps, env.clone())
                    .unwrap_or_else(|e| fail(format!("cannot listen for steps: {e}")));
                let first = super::remote::FirstNode { at, steps: a.steps.clone() };
                if let Err(e) = super::remote::serve_directory(hub, key, first) {
                    // Taken since the agent found it free: the agent tells
                    // the server, which starts the job again on another.
                    if let super::remote::StepError::Listen { port, source } = &e {
                        if source.kind() == std::io::ErrorKind::AddrInUse {
                            if let Some(run_dir) = a.steps.parent() {
                                let _ = std::fs::write(run_dir.join(STEP_PORT_TAKEN), port.to_string());
                            }
                        }
                    }
                    fail(e.to_string())
                }
            }
            Some(_) => super::remote::node_step(&a.steps, a.to_batch),
        }
    }
    let names = Names::from_env(&env);
    let open = |pattern: &str| {
        let path = PathBuf::from(names.expand(pattern));
        open_output(&path, a.append)
            .map_err(|e| format!("cannot open {} for the job's output: {e}", path.display()))
    };
    let stdout = open(&a.output).unwrap_or_else(|e| fail(e));
    let stderr = match a.error == a.output {
        true => stdout.try_clone().unwrap_or_else(|e| fail(e.to_string())),
        false => open(&a.error).unwrap_or_else(|e| fail(e)),
    };
    let waited = waited_signals();
    if let Err(e) = waited.thread_block() {
        fail(format!("cannot block signals: {e}"));
    }
    let mut child = unblocked(&mut Command::new(&a.script))
        .args(&a.args)
        .env("SLURM_PROCID", "0")
        .env("SLURM_LOCALID", "0")
        .env("EBB_SLURM_STEPS", &a.steps)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| fail(format!("cannot run the batch script {}: {e}", a.script.display())));
    let script_pid = child.id() as i32;
    let status = wait_routing(&mut child, &waited, |signo, route| match route {
        Route::Full => signal_full(&a.steps, script_pid, signo),
        Route::Drain if !a.to_batch => signal_steps(&a.steps, signo),
        Route::Steps => signal_steps(&a.steps, signo),
        // SAFETY: kill with a plain number; the batch shell is our child.
        Route::Drain | Route::Batch => unsafe {
            nix::libc::kill(script_pid, signo);
        },
    });
    end_as(status)
}

/// Waits for `child`, passing each signal the agent queued with a route
/// to `route`; every other signal is taken and let be.
fn wait_routing(child: &mut Child, waited: &SigSet, route: impl Fn(i32, Route)) -> ExitStatus {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        match next_signal(waited) {
            Some((signo, Some(r))) => route(signo, r),
            Some(_) => {}
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Sends `signal` to every task of the job's running `srun` steps on this
/// node (each step lists its tasks' pids in a file of `steps`).
pub fn signal_steps(steps: &Path, signo: i32) {
    super::steps::kill_all(&step_tasks(steps), signo);
}

/// The pids of the steps' tasks, as their `srun`s listed them.
fn step_tasks(steps: &Path) -> std::collections::BTreeSet<i32> {
    let Ok(entries) = std::fs::read_dir(steps) else { return Default::default() };
    super::steps::pids_listed(entries.flatten().map(|entry| entry.path())).into_iter().collect()
}

/// `scancel --signal --full`: the steps' tasks, and the batch shell
/// `script` with every process under it but the steps' (a task, and what
/// it started, get the signal once, as a step's).
fn signal_full(steps: &Path, script: i32, signo: i32) {
    let tasks = step_tasks(steps);
    signal_steps(steps, signo);
    super::steps::kill_all(&under(&[script], &tasks), signo);
}

/// `roots` and the processes under them, as one walk of /proc has them
/// now, leaving out those in `apart` and everything under them.
pub(super) fn under(roots: &[i32], apart: &std::collections::BTreeSet<i32>) -> Vec<i32> {
    let mut children: std::collections::BTreeMap<i32, Vec<i32>> = Default::default();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `PID (COMMAND) STATE PPID ...`: the command may hold spaces and ')'.
        let Some(ppid) = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)) else {
            continue;
        };
        if let Ok(ppid) = ppid.parse::<i32>() {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let (mut found, mut next) = (Vec::new(), roots.to_vec());
    while let Some(pid) = next.pop() {
        if apart.contains(&pid) {
            continue;
        }
        found.push(pid);
        next.extend(children.get(&pid).into_iter().flatten());
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `scancel --full` reaches the batch shell's children (a `sleep` it
    /// waits on), but not a step's task again, nor what that task started.
    #[test]
    fn the_processes_under_a_batch_shell_leave_out_the_steps_tasks() {
        let mut shell =
            Command::new("bash").args(["-c", "sleep 30 & bash -c 'sleep 31 & wait' & wait"]).spawn().unwrap();
        let root = shell.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let all = loop {
            let all = under(&[root], &Default::default());
            if all.len() == 4 || std::time::Instant::now() > deadline {
                break all;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(all.len(), 4, "bash, sleep 30, bash, sleep 31, and no more: {all:?}");
        let inner_bash = all.iter().copied().find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with("bash\0-c\0sleep 31"))
        });
        let apart = std::collections::BTreeSet::from([inner_bash.unwrap()]);
        assert_eq!(under(&[root], &apart).len(), 2, "the task and what it started are left out");
        let _ = shell.kill();
        for pid in all {
            // SAFETY: kill with plain numbers: this test's own processes.
            unsafe {
                nix::libc::kill(pid, nix::libc::SIGKILL);
            }
        }
        let _ = shell.wait();
    }

    /// An array task's output in a directory its submitter has not made
    /// yet (submitit makes it after `sbatch` answers): made with the
    /// file; appending keeps what an earlier attempt wrote.
    #[test]
    fn an_output_file_is_opened_in_a_directory_made_for_it() {
        use std::io::Write;
        let root = std::env::temp_dir().join(format!("ebb-step-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let path = root.join("40_2").join("40_2_0_log.out");
        open_output(&path, false).unwrap().write_all(b"first\n").unwrap();
        open_output(&path, true).unwrap().write_all(b"second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first\nsecond\n");
        open_output(&path, false).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "truncated without append");
        // What cannot be made is still an error: a file where the
        // directory would be.
        let blocked = root.join("40_2").join("40_2_0_log.out").join("x.out");
        assert!(open_output(&blocked, false).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn names() -> Names {
        Names {
            job: "42".into(),
            array_job: Some("40".into()),
            array_task: Some("2".into()),
            name: "train".into(),
            node: "node-1".into(),
            user: "ada".into(),
            step: "0".into(),
            task: Some(3),
            node_index: 1,
        }
    }

    #[test]
    fn file_name_patterns_are_expanded_as_slurm_does() {
        let n = names();
        assert_eq!(n.expand("%A_%a_%t_log.out"), "40_2_3_log.out");
        assert_eq!(n.expand("slurm-%j.out"), "slurm-42.out");
        assert_eq!(n.expand("%x-%J-%N-%n-%u-%s-%%"), "train-42.0-node-1-1-ada-0-%");
        assert_eq!(n.expand("%3a.%5j"), "002.00042");
        assert_eq!(n.expand("end%"), "end%");
        assert_eq!(n.expand("%q"), "%q");
        let plain = Names { job: "7".into(), ..Default::default() };
        assert_eq!(plain.expand("%A-%a"), "7-4294967294");
    }

    proptest! {
        /// No pattern a user writes makes the expansion panic.
        #[test]
        fn any_pattern_expands(pattern in "[%a-zA-Z0-9_./-]{0,40}") {
            let _ = names().expand(&pattern);
        }
    }
}
