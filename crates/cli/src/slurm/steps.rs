//! A running job's `srun` steps, as `squeue -s` lists them and `scancel
//! ID.STEP` ends them. The first node's step directory knows them: each
//! step's number is a file claimed in its steps directory, and beside the
//! numbers, in `info/`, what the step is (its name, its nodes, its start),
//! written by whoever claimed it. A signal for a step goes from the
//! directory to every node's step listener, which signals the step's
//! tasks there: the pids each node lists under the step's number.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::remote::{ask, send, Hello, Keyed, StepError, StepRequest};
use crate::client::Client;
use crate::error::{usage, CliError};
use ebb_api as api;

/// What a step is, as its claimer records it beside its number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepInfo {
    /// `srun --job-name`, or the program's own name, as Slurm names a step.
    pub name: String,
    /// The job's node indexes it runs on.
    pub nodes: Vec<u32>,
    /// When it started, in Unix seconds.
    pub started_s: u64,
}

impl StepInfo {
    /// A step starting now, named by `--job-name` or its program.
    pub fn starting(name: Option<&str>, program: &str, nodes: Vec<u32>) -> StepInfo {
        let name = match name {
            Some(name) => name.to_string(),
            None => {
                Path::new(program).file_name().map_or(program.into(), |n| n.to_string_lossy().into_owned())
            }
        };
        let started_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        StepInfo { name, nodes, started_s }
    }
}

/// How a step's tasks are ended (`scancel ID.STEP` without `--signal`):
/// SIGTERM, then SIGKILL to those still there after this long (Slurm's
/// `KillWait`).
pub const KILL_WAIT: Duration = Duration::from_secs(30);

/// What `scancel` asks of a step's tasks on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSignal {
    /// A signal, by number.
    Signal { signo: i32 },
    /// Their end: SIGTERM, then SIGKILL after [`KILL_WAIT`].
    End,
}

fn info_path(steps: &Path, step: u32) -> PathBuf {
    steps.join("info").join(step.to_string())
}

/// Records what step `step` is, beside its claimed number.
pub fn record(steps: &Path, step: u32, info: &StepInfo) {
    let path = info_path(steps, step);
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(text) = serde_json::to_vec(info) {
        let _ = std::fs::write(path, text);
    }
}

/// Forgets step `step`'s record: it ended.
pub fn forget(steps: &Path, step: u32) {
    let _ = std::fs::remove_file(info_path(steps, step));
}

/// The steps claimed in `steps` now, by number, with what each is (a
/// step whose record is not yet written, or unreadable, has none).
pub fn listed(steps: &Path) -> BTreeMap<u32, Option<StepInfo>> {
    let Ok(entries) = std::fs::read_dir(steps) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .map(|step| {
            let info =
                std::fs::read(info_path(steps, step)).ok().and_then(|t| serde_json::from_slice(&t).ok());
            (step, info)
        })
        .collect()
}

/// The files in `steps` that list step `step`'s task pids on this node:
/// `N` (an `srun` here) and `N.I` (node I's share of a step sent here).
fn pid_files(steps: &Path, step: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(steps) else { return Vec::new() };
    let (whole, share) = (step.to_string(), format!("{step}."));
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n == whole || n.starts_with(&share)))
        .map(|e| e.path())
        .collect()
}

/// The task pids that `files` list now (one file per step's share on a
/// node, pids separated by white space; pid 1 and below never).
pub fn pids_listed(files: impl IntoIterator<Item = PathBuf>) -> Vec<i32> {
    files
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect::<Vec<_>>())
        .filter(|p| *p > 1)
        .collect()
}

/// Step `step`'s task pids on this node, as their files list them now.
fn step_pids(steps: &Path, step: u32) -> Vec<i32> {
    pids_listed(pid_files(steps, step))
}

/// Step `step`'s processes on this node: its tasks and every process
/// under them (one walk of /proc), as Slurm signals a step's cgroup.
fn step_processes(steps: &Path, step: u32) -> Vec<i32> {
    let mut all = super::step::under(&step_pids(steps, step), &Default::default());
    all.sort_unstable();
    all.dedup();
    all
}

/// Sends `signo` to each of `pids` (one that is gone is passed over).
pub fn kill_all<'a>(pids: impl IntoIterator<Item = &'a i32>, signo: i32) {
    for &pid in pids {
        // SAFETY: kill with plain numbers.
        unsafe {
            nix::libc::kill(pid, signo);
        }
    }
}

/// Does what `scancel` asks to step `step`'s processes on this node. An end
/// waits [`KILL_WAIT`] in a thread of its own before its SIGKILL, which
/// reaches only the tasks of a step still listed then (a step that ended
/// meanwhile took its files with it).
pub fn signal_here(steps: &Path, step: u32, signal: StepSignal) {
    match signal {
        StepSignal::Signal { signo } => kill_all(&step_processes(steps, step), signo),
        StepSignal::End => {
            kill_all(&step_processes(steps, step), nix::libc::SIGTERM);
            let steps = steps.to_path_buf();
            std::thread::spawn(move || {
                std::thread::sleep(KILL_WAIT);
                kill_all(&step_processes(&steps, step), nix::libc::SIGKILL);
            });
        }
    }
}

/// The first node's directory passes `scancel ID.STEP`'s `signal` on to
/// every node's step listener (its own too), each in a thread: a node
/// that cannot be reached holds up none of the others.
pub fn pass_signal(nodes: &BTreeMap<u32, String>, key: &str, step: u32, signal: StepSignal) {
    for at in nodes.values() {
        let request = Keyed {
            key: key.to_string(),
            body: StepRequest { step, signal: Some(signal), ..StepRequest::default() },
        };
        let at = at.clone();
        std::thread::spawn(move || {
            if let Ok(mut stream) = TcpStream::connect(&at) {
                let _ = send(&mut stream, &request);
            }
        });
    }
}

/// How long a first node may take to answer `squeue -s` or `scancel
/// ID.N`: a node that does not is given up.
const ANSWER: Duration = Duration::from_secs(10);

/// The job's steps running now, from its first node's directory.
pub fn list(access: &api::StepAccess) -> Result<BTreeMap<u32, Option<StepInfo>>, StepError> {
    ask(&access.hub, &access.key, Hello::Steps, ANSWER)
}

/// Sends `signal` to step `step`'s tasks on every node of the job;
/// whether the step was running.
pub fn signal(access: &api::StepAccess, step: u32, signal: StepSignal) -> Result<bool, StepError> {
    ask(&access.hub, &access.key, Hello::Signal { step, signal }, ANSWER)
}

/// Where a running job's steps are known: its first node's directory,
/// from the server (`GET /v1/jobs/{id}/steps`); none for a job that is
/// not a running Slurm job, an error for one the caller cannot see.
pub async fn access(client: &Client, job: u64) -> Result<Option<api::StepAccess>, CliError> {
    match client.get::<api::StepAccess>(&format!("/v1/jobs/{job}/steps")).await {
        Ok(access) => Ok(Some(access)),
        Err(e) if e.refused_with() == Some(409) => Ok(None),
        Err(e) if e.refused_with() == Some(404) => Err(usage(format!("Invalid job id specified: {job}"))),
        Err(e) => Err(e.into()),
    }
}

/// `scancel ID.STEP`: the step's job and number, from `ID.STEP`; `None`
/// for a plain job id.
pub fn step_id(id: &str) -> Result<Option<(&str, u32)>, CliError> {
    let Some((job, step)) = id.split_once('.') else { return Ok(None) };
    match step.parse::<u32>() {
        Ok(n) => Ok(Some((job, n))),
        Err(_) if matches!(step, "batch" | "extern" | "interactive") => Err(usage(format!(
            "{id}: Ebb's batch step is the job itself: scancel {job} (or scancel --batch --signal=SIG {job})"
        ))),
        Err(_) => Err(usage(format!("Invalid job id specified: {id}"))),
    }
}

/// A job's steps as `squeue -s` prints them: one row of `format` each.
pub fn rows(job: &api::Job, steps: &BTreeMap<u32, Option<StepInfo>>, format: &str) -> Vec<String> {
    let nodes: Vec<&str> = job.placement.iter().map(|p| p.node.as_str()).collect();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    steps
        .iter()
        .map(|(step, info)| {
            let field = |letter: char| -> String {
                let info = info.as_ref();
                match letter {
                    'i' | 'A' => format!("{}.{step}", job.id),
                    'j' => info.map_or_else(|| "?".into(), |i| i.name.clone()),
                    'P' => job
                        .slurm
                        .as_ref()
                        .and_then(|s| s.partition.clone())
                        .unwrap_or_else(|| job.tier.clone()),
                    'u' => job.tenant.clone(),
                    'M' => {
                        super::query::duration(info.map_or(0, |i| now_s.saturating_sub(i.started_s)), true)
                    }
                    'l' => super::query::time_limit(job, true),
                    'N' => {
                        let names: Vec<&str> = match info {
                            Some(i) => {
                                i.nodes.iter().filter_map(|n| nodes.get(*n as usize).copied()).collect()
                            }
                            None => nodes.clone(),
                        };
                        ebb_core::hostlist::compress(&names)
                    }
                    'S' => info.map_or_else(|| "N/A".into(), |i| slurm_time(i.started_s)),
                    _ => String::new(),
                }
            };
            super::query::render(format, field)
        })
        .collect()
}

/// A time as Slurm prints it: `2026-12-07T05:00:00`.
fn slurm_time(unix_s: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(unix_s);
    humantime::format_rfc3339_seconds(at).to_string().trim_end_matches('Z').to_string()
}

/// `squeue -s -O`'s field names and the `%` letters that print them.
pub const NAMES: &[(&str, char)] = &[
    ("stepid", 'i'),
    ("stepname", 'j'),
    ("partition", 'P'),
    ("username", 'u'),
    ("timeused", 'M'),
    ("timelimit", 'l'),
    ("nodelist", 'N'),
    ("starttime", 'S'),
];

/// `squeue -s`'s default columns, and their headers.
pub const DEFAULT_FORMAT: &str = "%.15i %.8j %.9P %.8u %.9M %N";
const FIELDS: &[(char, &str)] = &[
    ('i', "STEPID"),
    ('A', "STEPID"),
    ('j', "NAME"),
    ('P', "PARTITION"),
    ('u', "USER"),
    ('M', "TIME"),
    ('l', "TIME_LIMIT"),
    ('N', "NODELIST"),
    ('S', "START_TIME"),
];

/// The header of a step format: each field's name in its place.
pub fn header(format: &str) -> String {
    super::query::render(format, |letter| {
        FIELDS.iter().find(|(l, _)| *l == letter).map_or("", |(_, name)| name).to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ebb-steps-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A step's record sits beside its number, and goes with it; files of
    /// pids and the records' directory are not steps.
    #[test]
    fn the_steps_listed_are_the_numbers_claimed_with_their_records() {
        let steps = scratch("listed");
        std::fs::write(steps.join("0"), "").unwrap();
        std::fs::write(steps.join("3"), "").unwrap();
        std::fs::write(steps.join("3.1"), "1234").unwrap();
        let info = StepInfo { name: "sky-1".into(), nodes: vec![0, 1], started_s: 1 };
        record(&steps, 3, &info);
        let listed = listed(&steps);
        assert_eq!(listed.keys().copied().collect::<Vec<_>>(), vec![0, 3]);
        assert_eq!((listed[&0].clone(), listed[&3].clone()), (None, Some(info)));
        forget(&steps, 3);
        assert_eq!(super::listed(&steps)[&3], None);
        let _ = std::fs::remove_dir_all(&steps);
    }

    /// A step's pids are in its own files only: step 1's signal never
    /// reaches step 10's or step 11's tasks.
    #[test]
    fn a_steps_pids_are_its_own_files_not_a_longer_numbers() {
        let steps = scratch("pids");
        for (file, pids) in [("1", "101 102"), ("1.2", "103"), ("10", "110"), ("11.1", "111"), ("info", "")] {
            std::fs::write(steps.join(file), pids).unwrap();
        }
        let mut pids = step_pids(&steps, 1);
        pids.sort();
        assert_eq!(pids, vec![101, 102, 103]);
        assert_eq!(step_pids(&steps, 11), vec![111]);
        assert!(step_pids(&steps, 2).is_empty());
        let _ = std::fs::remove_dir_all(&steps);
    }

    /// A step really ends: SIGTERM to a task that ignores nothing ends it.
    #[test]
    fn a_signal_reaches_a_steps_task_on_this_node() {
        let steps = scratch("signal");
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        std::fs::write(steps.join("4.0"), child.id().to_string()).unwrap();
        signal_here(&steps, 4, StepSignal::Signal { signo: nix::libc::SIGTERM });
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(nix::libc::SIGTERM));
        let _ = std::fs::remove_dir_all(&steps);
    }

    #[test]
    fn step_ids_are_slurms() {
        assert_eq!(step_id("12").unwrap(), None);
        assert_eq!(step_id("12.3").unwrap(), Some(("12", 3)));
        assert!(step_id("12.batch").unwrap_err().to_string().contains("scancel 12"));
        assert!(step_id("12.x").unwrap_err().to_string().contains("Invalid job id specified: 12.x"));
    }

    proptest! {
        /// Any id: a job, a step, or a clear error; never a panic.
        #[test]
        fn any_id_is_a_job_a_step_or_a_clear_error(id in "\\PC{0,40}") {
            if let Err(e) = step_id(&id) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
