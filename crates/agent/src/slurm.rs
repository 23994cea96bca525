//! Slurm batch jobs on a node: the Slurm commands on the job's `PATH`, and
//! the batch step that runs the job's script (`ebb slurm-batch`, the
//! agent's own program, as `slurmstepd` is Slurm's).
//!
//! The batch step is the attempt's main process, in its cgroup, as its
//! user. It opens the script's `--output` and `--error` files, runs the
//! script, and routes the job's `--signal`: the agent sends that signal to
//! the batch step alone, which passes it to the script (`B:`) or to the
//! tasks the job's `srun` steps started, as Slurm does, never to both.
//! Every other signal the agent sends (a cancel's SIGTERM, SIGKILL at a
//! deadline) goes to the whole cgroup as for any job.

use std::path::{Path, PathBuf};

use ebb_api::{SlurmBatch, StartAttempt};

use crate::supervisor::{CommandsUnavailable, SlurmError};

/// The Slurm commands a job finds on its `PATH`: links to the agent's
/// program, which answers to these names.
pub const COMMANDS: [&str; 7] = ["sbatch", "srun", "squeue", "scancel", "sacct", "scontrol", "sinfo"];

/// What the batch step is to do with a signal the agent queues to it
/// (`sigqueue`, the route as its value): a signal merely sent (`kill`) is
/// one every process of the attempt got, and the batch step lets it be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The job's `--signal` at a drain: where its `B:` says.
    Drain = 1,
    /// `scancel --signal -b`: the batch shell.
    Batch = 2,
    /// `scancel --signal`: the steps' tasks.
    Steps = 3,
    /// `scancel --signal --full`: the steps' tasks, the batch shell and
    /// its children.
    Full = 4,
}

impl Route {
    pub fn from_value(value: usize) -> Option<Route> {
        match value {
            1 => Some(Route::Drain),
            2 => Some(Route::Batch),
            3 => Some(Route::Steps),
            4 => Some(Route::Full),
            _ => None,
        }
    }

    /// Queues `signal` to the batch step `pid` with this route.
    pub(crate) fn send(self, pid: i32, signal: nix::sys::signal::Signal) {
        let value = nix::libc::sigval { sival_ptr: self as usize as *mut nix::libc::c_void };
        // SAFETY: sigqueue reads its arguments only.
        unsafe {
            nix::libc::sigqueue(pid, signal as i32, value);
        }
    }
}

/// A file the first node's batch step writes into the attempt's run
/// directory when the job's step port, found free before the start, was
/// taken by the time it listened: the port. The exit then says so
/// (`port_in_use`), and the server starts the job again on another port.
pub const STEP_PORT_TAKEN: &str = "step-port-taken";

/// The directory of the agent's data dir that holds the links.
fn commands_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("slurm-bin")
}

/// Makes (or remakes) the links to `exe` under the Slurm commands' names,
/// readable by every job's user, and returns their directory.
pub(crate) fn install_commands(data_dir: &Path, exe: &Path) -> Result<PathBuf, CommandsUnavailable> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |e| CommandsUnavailable { path, source: std::sync::Arc::new(e) }
    };
    let dir = commands_dir(data_dir);
    std::fs::create_dir_all(&dir).map_err(failed(&dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(failed(&dir))?;
    for name in COMMANDS {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(exe, &link).map_err(failed(&link))?;
    }
    Ok(dir)
}

/// The batch step's command line for a start: the agent's program as
/// `ebb slurm-batch`, the script written into the attempt's run directory,
/// and the script's own arguments (`argv` after its path).
pub(crate) fn batch_argv(
    exe: &Path,
    script: &Path,
    steps: &Path,
    s: &StartAttempt,
    slurm: &SlurmBatch,
) -> Vec<String> {
    let array = s.env.contains_key("SLURM_ARRAY_TASK_ID");
    let default_output = if array { "slurm-%A_%a.out" } else { "slurm-%j.out" };
    let output = slurm.output.clone().unwrap_or_else(|| default_output.to_string());
    let error = slurm.error.clone().unwrap_or_else(|| output.clone());
    let mut argv = vec![
        exe.display().to_string(),
        "slurm-batch".to_string(),
        "--script".to_string(),
        script.display().to_string(),
        "--steps".to_string(),
        steps.display().to_string(),
        "--output".to_string(),
        output,
        "--error".to_string(),
        error,
        "--open-mode".to_string(),
        if slurm.append { "append" } else { "truncate" }.to_string(),
        "--signal".to_string(),
        s.signal.to_string(),
        "--signal-to".to_string(),
        if slurm.signal_batch_only { "batch" } else { "steps" }.to_string(),
        "--".to_string(),
    ];
    argv.extend(s.argv.iter().skip(1).cloned());
    argv
}

/// Writes the job's script into its run directory (which its user owns),
/// executable by that user alone: a fresh file, owned and moded through
/// its descriptor before it is renamed into place, so that no link the
/// user's other jobs may put there is ever followed. And makes the
/// directory its `srun` steps register in.
pub(crate) fn write_script(
    run_dir: &Path,
    slurm: &SlurmBatch,
    who: &crate::identity::Identity,
) -> Result<(PathBuf, PathBuf), SlurmError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let script = run_dir.join("slurm_script");
    let tmp = run_dir.join("slurm_script.tmp");
    let fail = |source: std::io::Error| SlurmError::Script { path: script.clone(), source };
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
        _ => {}
    }
    // create_new (O_EXCL) follows no link, dangling or not.
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o700).open(&tmp).map_err(fail)?;
    if who.switch {
        std::os::unix::fs::fchown(&file, Some(who.uid.as_raw()), Some(who.gid.as_raw())).map_err(fail)?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    file.write_all(slurm.script.as_bytes()).map_err(fail)?;
    drop(file);
    std::fs::rename(&tmp, &script).map_err(fail)?;
    let steps = run_dir.join("steps");
    crate::dirs::own_dir(&steps, 0o700, Some(who))?;
    Ok((script, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_core::{Attempt, JobId};

    #[test]
    fn the_batch_step_is_told_the_scripts_files_its_signal_and_where_it_goes() {
        let start = StartAttempt {
            attempt: ebb_api::AttemptRef { job: JobId(7), attempt: Attempt(1) },
            tier: "preemptible".into(),
            argv: vec!["train.sh".into(), "--lr".into(), "0.1".into()],
            env: Default::default(),
            workdir: None,
            gpus: vec![],
            signal: 10,
            run_as: None,
            tenant: "t".into(),
            rendezvous_port: None,
            tenant_id: 1,
            image: None,
            time_limit_ms: None,
            slurm: None,
            when_gpus_free: false,
        };
        let slurm = SlurmBatch { signal_batch_only: true, append: true, ..Default::default() };
        let argv = batch_argv(
            Path::new("/usr/bin/ebb"),
            Path::new("/run/s"),
            Path::new("/run/steps"),
            &start,
            &slurm,
        );
        let text = argv.join(" ");
        assert!(text.starts_with("/usr/bin/ebb slurm-batch --script /run/s --steps /run/steps"), "{text}");
        assert!(text.contains("--output slurm-%j.out --error slurm-%j.out --open-mode append"), "{text}");
        assert!(text.ends_with("--signal 10 --signal-to batch -- --lr 0.1"), "{text}");
    }
}
