//! Checking a submission before anything is stored: every refusal names
//! the field that was wrong.

use std::collections::BTreeMap;

use ebb_api::JobSubmission;
use ebb_core::Tier;
use ebb_scheduler::{shape_fits, State};

use crate::Refusal;

mod slurm;

pub struct Checked {
    pub tier: Tier,
    pub gpus: u32,
    pub signal: i32,
    /// When a preemptible job must be done, milliseconds since the epoch.
    pub deadline_ms: Option<u64>,
    /// The tasks of an array or sweep (none for a single job).
    pub tasks: Vec<Task>,
}

/// One task of an array or sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// `EBB_TASK_INDEX`: the array index, or the combination's ordinal.
    pub index: u64,
    /// A sweep task's parameters, in the order they were given.
    pub params: Vec<(String, String)>,
}

pub const MAX_GPUS: u32 = 4096;

/// What one submission may carry and one tenant may have, set by the
/// operator (`ebb server --max-...`). Each refusal names the limit and the
/// flag that sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// One argument, or one `KEY=VALUE` of the environment. Linux refuses
    /// a single string over 128 KiB at `execve` (MAX_ARG_STRLEN), so a
    /// larger one could never start.
    pub max_argument_bytes: u64,
    /// The arguments and the environment together, per task.
    pub max_command_bytes: u64,
    /// Tasks of one array or sweep.
    pub max_array_tasks: u64,
    /// A tenant's jobs that have not finished (queued, waiting, running).
    pub max_jobs: u64,
    /// What a tenant's unfinished jobs may keep in the server: their
    /// arguments and environments, all tasks counted.
    pub max_stored_bytes: u64,
    /// A tenant's jobs admitted to the scheduler at once (running, or
    /// queued for GPUs); the rest wait their turn in submission order.
    pub max_running_jobs: u64,
    /// Times one job may requeue itself outside a drain (`scontrol
    /// requeue`); the next one fails it. Not a tenant's to change.
    pub max_requeues: u64,
}

impl Limits {
    /// Every limit at least 1, and one argument no longer than Linux
    /// takes; what is wrong named as the server's flag.
    pub fn validate(&self) -> Result<(), crate::engine::ConfigError> {
        use crate::engine::ConfigError;
        for (flag, value) in [
            ("--max-argument-bytes", self.max_argument_bytes),
            ("--max-command-bytes", self.max_command_bytes),
            ("--max-array-tasks", self.max_array_tasks),
            ("--max-jobs-per-tenant", self.max_jobs),
            ("--max-stored-bytes-per-tenant", self.max_stored_bytes),
            ("--max-running-jobs", self.max_running_jobs),
            ("--max-requeues", self.max_requeues),
        ] {
            if value == 0 {
                return Err(ConfigError { flag, message: format!("{flag}: must be at least 1") });
            }
        }
        if self.max_argument_bytes > 128 * 1024 {
            let message = format!(
                "--max-argument-bytes {}: Linux refuses a single argument over 131072 bytes at exec",
                self.max_argument_bytes
            );
            return Err(ConfigError { flag: "--max-argument-bytes", message });
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_argument_bytes: 128 * 1024,
            max_command_bytes: 1024 * 1024,
            max_array_tasks: 10_000,
            max_jobs: 20_000,
            max_stored_bytes: 256 * 1024 * 1024,
            max_running_jobs: 5_000,
            max_requeues: 100,
        }
    }
}

/// Bytes a job's arguments and environment take at `execve`: each string
/// with its NUL and its pointer (Linux counts both against its limit), so
/// 480,000 empty arguments are 4.3 MB, not 480 KB.
pub fn command_bytes(argv: &[String], env: &BTreeMap<String, String>) -> u64 {
    const POINTER: u64 = 8;
    let argv: u64 = argv.iter().map(|a| a.len() as u64 + 1 + POINTER).sum();
    let env: u64 = env.iter().map(|(k, v)| (k.len() + v.len()) as u64 + 2 + POINTER).sum();
    argv + env
}

/// What one argument costs the server to keep beyond its bytes: its
/// `String` (24 bytes) in the record, its quotes and comma in the stored
/// text, the copy a start's command holds until its node has it, and the
/// allocator's rounding. Measured: jobs of 100,000 empty arguments held
/// about 42 bytes of the server's memory per argument.
pub const ARGUMENT_COST: u64 = 48;
/// What one variable of the environment costs beyond its bytes: two
/// `String`s and its place in the map, twice as an argument.
pub const VARIABLE_COST: u64 = 96;

/// What a job's arguments and environment cost the server to keep, as a
/// tenant's `--max-stored-bytes-per-tenant` counts them: their bytes and
/// what each string costs besides (an empty argument is not free: 80
/// jobs of 480,000 of them took the server from 28 MB to 1.16 GB while
/// counted as 480 KB each). Every task of an array counts whole: each has
/// its own record in the store.
pub fn stored_bytes(argv: &[String], env: &BTreeMap<String, String>) -> u64 {
    let argv: u64 = argv.iter().map(|a| a.len() as u64 + ARGUMENT_COST).sum();
    let env: u64 = env.iter().map(|(k, v)| (k.len() + v.len()) as u64 + VARIABLE_COST).sum();
    argv.saturating_add(env)
}

/// A tenant's priorities among its own jobs run from -this to this.
pub const MAX_PRIORITY: i32 = 1000;

/// A submission checked field by field. Refusals the API document states
/// (a limit, a pattern) are 400s; those it cannot state (what this cluster
/// has, how fields relate, limits the operator sets) are 422s.
pub fn submission(spec: &JobSubmission, core: &State, limits: &Limits) -> Result<Checked, Refusal> {
    command(spec, limits)?;
    let tier = match spec.tier.as_deref() {
        None => Tier::Preemptible,
        Some(t) => t.parse::<Tier>().map_err(|e| Refusal::invalid(format!("tier: {e}")))?,
    };
    let gpus = spec.gpus.unwrap_or(1);
    if gpus == 0 || gpus > MAX_GPUS {
        return bad(format!("gpus: must be between 1 and {MAX_GPUS}, got {gpus}"));
    }
    if let Some(max) = spec.max_gpus {
        if max <= gpus || max > MAX_GPUS {
            return bad(format!(
                "max_gpus: an elastic job's most GPUs must be above gpus ({gpus}) and at most {MAX_GPUS}, got {max}"
            ));
        }
        if tier != Tier::Preemptible {
            return refuse(format!(
                "max_gpus: only preemptible jobs are elastic ({tier} work is never shrunk); drop it or submit as preemptible"
            ));
        }
    }
    if let Some(p) = spec.priority.filter(|p| !(-MAX_PRIORITY..=MAX_PRIORITY).contains(p)) {
        return bad(format!("priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}, got {p}"));
    }
    environment(spec)?;
    let signal = match &spec.signal {
        None => 15,
        Some(name) => parse_signal(name).ok_or_else(|| {
            Refusal::invalid(format!("signal: unknown signal {name:?} (e.g. TERM, SIGUSR1, 10)"))
        })?,
    };
    if let Some(name) = spec.name.as_deref() {
        if name.chars().count() > 256 || name.contains(['\n', '\0']) {
            return bad("name: must be one line of at most 256 characters".into());
        }
    }
    shape_in_cluster(spec, gpus, core)?;
    match spec.restart.as_deref() {
        None | Some("never") | Some("always") => {}
        Some(other) => return bad(format!("restart: expected never or always, got {other:?}")),
    }
    let tasks = tasks(spec, limits)?;
    let deadline_ms = match spec.deadline.as_deref() {
        None => None,
        Some(_) if tier != Tier::Preemptible => {
            return refuse(format!(
                "deadline: only preemptible jobs have deadlines ({tier} jobs are never preempted); drop it or submit as preemptible"
            ))
        }
        Some(text) => Some(crate::billing::parse_time("deadline", text)?),
    };
    match spec.time_limit_s {
        Some(s) if s == 0 || s > MAX_TIME_LIMIT_S => {
            return bad(format!("time_limit_s: must be between 1 and {MAX_TIME_LIMIT_S} (a year), got {s}"));
        }
        _ => {}
    }
    if let Some(slurm) = &spec.slurm {
        slurm::slurm_batch(slurm)?;
        slurm::components(spec, slurm, gpus, !tasks.is_empty())?;
    }
    match spec.array_limit {
        Some(n) if n == 0 || n > 100_000 => {
            return bad(format!("array_limit: must be between 1 and 100000, got {n}"));
        }
        Some(_) if tasks.is_empty() => {
            return refuse("array_limit: only an array or a sweep has tasks to limit".into());
        }
        _ => {}
    }
    if let Some(after) = &spec.after {
        if after.is_empty()
            || after.len() > 4096
            || !after.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ":,_".contains(c))
        {
            return bad(
                "after: expected afterok:ID, afterany:ID, afternotok:ID or singleton, joined by ','".into()
            );
        }
    }
    Ok(Checked { tier, gpus, signal, deadline_ms, tasks })
}

fn bad<T>(m: String) -> Result<T, Refusal> {
    Err(Refusal::invalid(m))
}

fn refuse<T>(m: String) -> Result<T, Refusal> {
    Err(Refusal::unacceptable(m))
}

/// Its command: a program, no NUL bytes, within the operator's sizes.
fn command(spec: &JobSubmission, limits: &Limits) -> Result<(), Refusal> {
    match spec.argv.first() {
        None => return bad("argv: must name a program to run".into()),
        Some(program) if program.is_empty() => return refuse("argv: the program name is empty".into()),
        _ => {}
    }
    if spec.argv.iter().any(|a| a.contains('\0')) {
        return bad("argv: arguments must not contain NUL bytes".into());
    }
    let one = limits.max_argument_bytes;
    if let Some((i, arg)) = spec.argv.iter().enumerate().find(|(_, a)| a.len() as u64 >= one) {
        return refuse(format!(
            "argv[{i}]: {} bytes, over the limit of {} bytes for one argument (ebb server --max-argument-bytes)",
            arg.len(),
            one - 1
        ));
    }
    if let Some((key, value)) = spec.env.iter().find(|(k, v)| (k.len() + v.len()) as u64 + 1 >= one) {
        return refuse(format!(
            "env: {key}={} bytes, over the limit of {} bytes for one variable (ebb server --max-argument-bytes)",
            key.len() + value.len() + 1,
            one - 1
        ));
    }
    let command = command_bytes(&spec.argv, &spec.env);
    if command > limits.max_command_bytes {
        return refuse(format!(
            "argv and env: {command} bytes together, over the limit of {} (ebb server --max-command-bytes)",
            limits.max_command_bytes
        ));
    }
    if let Some(dir) = &spec.workdir {
        if dir.is_empty() || dir.len() > 4096 || dir.contains('\0') || !dir.starts_with('/') {
            return refuse("workdir: must be an absolute path of at most 4096 bytes".into());
        }
    }
    Ok(())
}

/// Its environment: names a shell takes, none of Ebb's own.
fn environment(spec: &JobSubmission) -> Result<(), Refusal> {
    for (key, value) in &spec.env {
        let valid = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return bad(format!("env: {key:?} is not a valid variable name"));
        }
        // `EBB_SIM_*` are the submitter's: they say what a job does on a
        // simulated node (`ebb agent --simulate-nodes`), and a real one
        // passes them on like any variable.
        if (key.starts_with("EBB_") && !key.starts_with("EBB_SIM_")) || key == "CUDA_VISIBLE_DEVICES" {
            return bad(format!("env: {key} is set by ebb and cannot be overridden"));
        }
        if value.contains('\0') {
            return bad(format!("env: the value of {key} contains a NUL byte"));
        }
    }
    Ok(())
}

/// Against the cluster as it is: a model that exists, a shape that fits.
fn shape_in_cluster(spec: &JobSubmission, gpus: u32, core: &State) -> Result<(), Refusal> {
    let models: Vec<_> = core.models().collect();
    if let Some(wanted) = &spec.gpu_model {
        if !models.is_empty() && core.model_by_name(wanted).is_none() {
            let known: Vec<String> =
                models.iter().map(|(_, m)| format!("{} {} GPUs in service", m.name, m.capacity)).collect();
            return refuse(format!(
                "gpu_model: no node has {wanted:?}; the cluster has {}",
                known.join(", ")
            ));
        }
    }
    let candidates: Vec<_> =
        models.iter().filter(|(_, m)| spec.gpu_model.as_deref().is_none_or(|w| w == m.name)).collect();
    if let Some(max) = spec.max_gpus {
        let whole = |m: &ebb_scheduler::GpuModel| {
            let per = u32::from(m.gpus_per_node);
            gpus.is_multiple_of(per) && max.is_multiple_of(per)
        };
        if !candidates.is_empty() && !candidates.iter().any(|(_, m)| whole(m)) {
            let per_node = candidates[0].1.gpus_per_node;
            return refuse(format!(
                "max_gpus: an elastic job runs on whole nodes of {}: {gpus}:{max} are not both multiples of {per_node}",
                ebb_core::count(u64::from(per_node), "GPU")
            ));
        }
    }
    if let Some(part) = spec.slurm.as_ref().and_then(|s| s.components.first()) {
        if !candidates.is_empty()
            && !candidates.iter().any(|(_, m)| u32::from(m.gpus_per_node) == part.gpus_per_node)
        {
            let sizes: Vec<String> = candidates.iter().map(|(_, m)| m.gpus_per_node.to_string()).collect();
            return refuse(format!(
                "slurm.components: {} GPUs a node, and a heterogeneous job takes whole nodes: this cluster's have {}",
                part.gpus_per_node,
                sizes.join(" or ")
            ));
        }
    }
    if !candidates.is_empty() && !candidates.iter().any(|(_, m)| shape_fits(gpus, m.gpus_per_node)) {
        let per_node = candidates[0].1.gpus_per_node;
        return refuse(format!(
            "gpus: {gpus} GPUs cannot be placed on nodes of {} (at most {per_node}, or a multiple of {per_node})",
            ebb_core::count(u64::from(per_node), "GPU")
        ));
    }
    Ok(())
}

/// An array's or a sweep's tasks (none for a single job).
fn tasks(spec: &JobSubmission, limits: &Limits) -> Result<Vec<Task>, Refusal> {
    let mut tasks = match spec.array.as_deref() {
        None => Vec::new(),
        Some(text) => {
            let (first, last) = parse_array(text, limits.max_array_tasks).map_err(|e| {
                let message = format!("array: {e}");
                // 400 for text the document's pattern rules out; 422 for a
                // range it allows that runs backwards or is too long.
                if array_pattern_allows(text) {
                    Refusal::unacceptable(message)
                } else {
                    Refusal::invalid(message)
                }
            })?;
            (first..=last).map(|index| Task { index, params: Vec::new() }).collect()
        }
    };
    if !spec.sweep.is_empty() {
        if spec.array.is_some() {
            return refuse(
                "sweep: cannot be combined with array (a sweep is an array of its combinations)".into(),
            );
        }
        tasks = sweep_tasks(&spec.sweep, limits.max_array_tasks)
            .map_err(|e| Refusal::unacceptable(format!("sweep: {e}")))?;
    }
    Ok(tasks)
}

/// The longest time limit: a year.
pub const MAX_TIME_LIMIT_S: u64 = 365 * 24 * 3600;

/// `A-B` (inclusive) or a single index `N`, of at most `max_tasks` tasks.
/// The count is computed in `u128`: `0-18446744073709551615` has 2^64
/// tasks, which `u64` arithmetic would wrap to 0.
fn parse_array(text: &str, max_tasks: u64) -> Result<(u64, u64), String> {
    let bad = || format!("expected A-B with A <= B, got {text:?}");
    let (a, b): (u64, u64) = match text.split_once('-') {
        Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
        None => {
            let n = text.trim().parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    if a > b {
        return Err(bad());
    }
    let count = u128::from(b) - u128::from(a) + 1;
    if count > u128::from(max_tasks) {
        return Err(format!("at most {max_tasks} tasks (ebb server --max-array-tasks), got {count}"));
    }
    Ok((a, b))
}

/// The API document's pattern for `array`, `^0*[0-9]{1,19}(-0*[0-9]{1,19})?$`:
/// one or two runs of digits, each at most 19 digits after leading zeros.
fn array_pattern_allows(text: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.trim_start_matches('0').len() <= 19
    };
    match text.split_once('-') {
        Some((a, b)) => part(a) && part(b),
        None => part(text),
    }
}

/// One task per combination of the parameters' values, the last parameter
/// varying fastest.
fn sweep_tasks(params: &[ebb_api::SweepParam], max_tasks: u64) -> Result<Vec<Task>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut total: u64 = 1;
    for p in params {
        let valid = !p.name.is_empty()
            && p.name.len() <= 64
            && !p.name.starts_with(|c: char| c.is_ascii_digit())
            && p.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{:?} is not a valid parameter name (letters, digits, '_')", p.name));
        }
        if !seen.insert(p.name.to_ascii_uppercase()) {
            return Err(format!("parameter {} is given twice", p.name));
        }
        if p.values.is_empty() {
            return Err(format!("parameter {} has no values", p.name));
        }
        if let Some(v) = p.values.iter().find(|v| v.contains('\0') || v.chars().count() > 4096) {
            return Err(format!(
                "parameter {}: value {v:?} has a NUL byte or is over 4096 characters",
                p.name
            ));
        }
        total = total.saturating_mul(p.values.len() as u64);
        if total > max_tasks {
            return Err(format!(
                "at most {max_tasks} combinations (ebb server --max-array-tasks), this grid has more"
            ));
        }
    }
    let tasks = (0..total)
        .map(|index| {
            let mut rest = index;
            let mut chosen = vec![(String::new(), String::new()); params.len()];
            for (slot, p) in chosen.iter_mut().zip(params).rev() {
                let n = p.values.len() as u64;
                *slot = (p.name.clone(), p.values[(rest % n) as usize].clone());
                rest /= n;
            }
            Task { index, params: chosen }
        })
        .collect();
    Ok(tasks)
}

/// `TERM`, `SIGTERM`, `sigterm` or a number.
pub fn parse_signal(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = match bare {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "WINCH" => 28,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_api::SweepParam;

    fn param(name: &str, values: &[&str]) -> SweepParam {
        SweepParam { name: name.into(), values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn a_sweep_is_the_grid_in_order() {
        let tasks = sweep_tasks(&[param("lr", &["1e-3", "3e-4"]), param("bs", &["32", "64", "128"])], 10_000)
            .unwrap();
        assert_eq!(tasks.len(), 6);
        let shown: Vec<String> = tasks
            .iter()
            .map(|t| t.params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(
            shown,
            [
                "lr=1e-3,bs=32",
                "lr=1e-3,bs=64",
                "lr=1e-3,bs=128",
                "lr=3e-4,bs=32",
                "lr=3e-4,bs=64",
                "lr=3e-4,bs=128"
            ]
        );
        assert_eq!(tasks.iter().map(|t| t.index).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_array_pattern_is_the_documents() {
        assert!(array_pattern_allows("0-99") && array_pattern_allows("7") && array_pattern_allows("007-9"));
        assert!(array_pattern_allows("0-9999999999999999999"));
        for text in ["", "1-", "-1", "a-b", "1-2-3", " 1", "0-18446744073709551615", "1_000"] {
            assert!(!array_pattern_allows(text), "{text:?}");
        }
    }

    #[test]
    fn bad_sweeps_say_what_is_wrong() {
        let err = |p: &[SweepParam]| sweep_tasks(p, 10_000).unwrap_err();
        assert!(err(&[param("1lr", &["1"])]).contains("not a valid parameter name"));
        assert!(err(&[param("lr", &[])]).contains("no values"));
        assert!(err(&[param("lr", &["1"]), param("LR", &["2"])]).contains("twice"));
        let big: Vec<String> = (0..101).map(|i| i.to_string()).collect();
        let big: Vec<&str> = big.iter().map(|s| s.as_str()).collect();
        assert!(err(&[param("a", &big), param("b", &big)]).contains("at most"));
    }
}

/// Every parser a request reaches, fed whatever a client could send: none
/// may panic, and the limits they enforce hold for every input they accept.
#[cfg(test)]
mod properties {
    use std::collections::BTreeMap;

    use ebb_api::{JobSubmission, SweepParam};
    use ebb_core::Time;
    use ebb_scheduler::{NodeSpec, State};
    use proptest::prelude::*;

    use super::*;

    /// Text that looks like what the parsers expect, and text that does not.
    fn numberish() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{0,24}(-[0-9]{0,24})?",
            "[0-9 .:+TZ-]{0,32}",
            any::<(u64, u64)>().prop_map(|(a, b)| format!("{a}-{b}")),
            ".{0,40}",
        ]
    }

    fn cluster() -> State {
        let mut core = State::new();
        let node = NodeSpec { name: "n".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        core.add_node(node, Time(0)).unwrap();
        core
    }

    fn submission_strategy() -> impl Strategy<Value = JobSubmission> {
        (
            proptest::collection::vec(".{0,8}", 0..4),
            proptest::collection::btree_map("[A-Za-z_0-9]{0,6}", ".{0,8}", 0..3),
            proptest::option::of(any::<u32>()),
            proptest::option::of(prop_oneof![Just("preemptible".to_string()), ".{0,12}"]),
            proptest::option::of(numberish()),
            proptest::option::of(".{0,10}"),
            proptest::option::of(".{0,8}"),
            proptest::collection::vec(
                ("[a-z]{0,4}", proptest::collection::vec(".{0,4}", 0..4))
                    .prop_map(|(name, values)| SweepParam { name, values }),
                0..3,
            ),
            proptest::option::of(".{0,6}"),
            (
                proptest::option::of(prop_oneof![any::<i32>(), -1001i32..=1001]),
                proptest::option::of(prop_oneof![any::<u32>(), 0u32..=64]),
            ),
        )
            .prop_map(
                |(argv, env, gpus, tier, array, signal, restart, sweep, workdir, (priority, max_gpus))| {
                    JobSubmission {
                        priority,
                        max_gpus,
                        argv,
                        env,
                        gpus,
                        tier,
                        array,
                        signal,
                        restart,
                        sweep,
                        workdir,
                        ..JobSubmission::default()
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn an_array_is_accepted_only_within_the_task_limit(text in numberish(), max in 1u64..20_000) {
            if let Ok((a, b)) = parse_array(&text, max) {
                prop_assert!(a <= b);
                prop_assert!(u128::from(b) - u128::from(a) < u128::from(max));
            }
        }

        #[test]
        fn every_range_within_the_limit_is_accepted(a in any::<u64>(), n in 0u64..10_000) {
            let b = a.saturating_add(n);
            prop_assert_eq!(parse_array(&format!("{a}-{b}"), 10_000), Ok((a, b)));
        }

        #[test]
        fn no_submission_panics_the_validator(spec in submission_strategy()) {
            let limits = Limits { max_array_tasks: 50, ..Limits::default() };
            if let Ok(checked) = submission(&spec, &cluster(), &limits) {
                prop_assert!(checked.tasks.len() as u64 <= limits.max_array_tasks);
                prop_assert!((1..=MAX_GPUS).contains(&checked.gpus));
                prop_assert!(command_bytes(&spec.argv, &spec.env) <= limits.max_command_bytes);
            }
        }

        /// A range is accepted exactly when it is preemptible, above its
        /// fewest, within the limit and in whole nodes of the cluster's
        /// (8 GPUs); at the extremes of `u32` too.
        #[test]
        fn an_elastic_range_is_accepted_only_in_whole_nodes_above_its_fewest(
            gpus in prop_oneof![Just(0u32), 1u32..=64, Just(MAX_GPUS), Just(u32::MAX)],
            max in prop_oneof![Just(0u32), 1u32..=128, Just(MAX_GPUS), Just(MAX_GPUS + 1), Just(u32::MAX)],
            on_demand in any::<bool>(),
        ) {
            let spec = JobSubmission {
                argv: vec!["train".into()],
                gpus: Some(gpus),
                max_gpus: Some(max),
                tier: on_demand.then(|| "on-demand".to_string()),
                ..JobSubmission::default()
            };
            let ok = !on_demand
                && (1..=MAX_GPUS).contains(&gpus)
                && max > gpus
                && max <= MAX_GPUS
                && gpus.is_multiple_of(8)
                && max.is_multiple_of(8);
            match submission(&spec, &cluster(), &Limits::default()) {
                Ok(checked) => prop_assert!(ok && checked.gpus == gpus, "{gpus}:{max} accepted"),
                Err(refused) => {
                    prop_assert!(!ok, "{gpus}:{max} refused: {}", refused.message);
                    let named = ["gpus:", "max_gpus:"].iter().any(|f| refused.message.starts_with(f));
                    prop_assert!(named, "{}", refused.message);
                }
            }
        }

        #[test]
        fn no_text_panics_the_other_parsers(text in numberish(), discount in 0u32..10_000) {
            let _ = parse_signal(&text);
            let _ = crate::billing::parse_time("from", &text);
            let _ = crate::billing::period(&text, &text);
            let _ = crate::billing::parse_price("price", &text, discount);
            let _ = ebb_core::Span::parse(&text);
            let _ = ebb_core::MicroUsd::parse_usd(&text);
        }
    }

    /// `0-18446744073709551615` has 2^64 tasks: `b - a + 1` wrapped to 0 in
    /// `u64`, passed the cap, and the writer died allocating them.
    #[test]
    fn the_overflowing_array_is_refused_by_name() {
        let err = parse_array("0-18446744073709551615", 10_000).unwrap_err();
        assert!(err.contains("at most 10000 tasks"), "{err}");
        assert!(err.contains("18446744073709551616"), "{err}");
    }

    #[test]
    fn a_200_kb_argument_is_refused_naming_the_limit() {
        let spec =
            JobSubmission { argv: vec!["echo".into(), "x".repeat(200_000)], ..JobSubmission::default() };
        let err = submission(&spec, &cluster(), &Limits::default()).err().unwrap();
        assert_eq!(crate::http::status(err.kind), 422);
        assert!(err.message.starts_with("argv[1]: 200000 bytes"), "{}", err.message);
        assert!(err.message.contains("--max-argument-bytes"), "{}", err.message);
    }

    #[test]
    fn ebb_variables_are_refused_but_those_for_simulated_nodes() {
        let with = |key: &str| JobSubmission {
            argv: vec!["train".into()],
            env: [(key.to_string(), "1".to_string())].into(),
            ..JobSubmission::default()
        };
        let err = submission(&with("EBB_JOB_ID"), &cluster(), &Limits::default()).err().unwrap();
        assert_eq!(err.message, "env: EBB_JOB_ID is set by ebb and cannot be overridden");
        assert!(submission(&with("EBB_SIM_DURATION"), &cluster(), &Limits::default()).is_ok());
    }
}
