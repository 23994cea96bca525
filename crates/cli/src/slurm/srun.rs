//! `srun` inside a batch job: a step of tasks on the allocation's node,
//! each with its Slurm variables (`SLURM_PROCID`, `SLURM_LOCALID`, ...),
//! its output where `--output` says, and its exit gathered into `srun`'s.
//! The tasks' pids are listed in the job's steps directory, so that the
//! batch step can pass them the job's `--signal`; `srun` itself passes on
//! no signal (a task gets each once).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::Signal;

use super::options::{self, Given};
use super::step::{self, Names};
use super::steps::StepInfo;
use crate::error::{failed, file, usage, CliError};

/// A step's tasks, as `srun`'s options and the job's variables say.
struct Plan {
    ntasks: u32,
    /// The job's nodes the step runs on (their indices, `SLURM_NODEID`),
    /// and each task's (node, SLURM_PROCID, SLURM_LOCALID), in task order.
    nodes: Vec<u32>,
    tasks: Vec<(u32, u32, u32)>,
    label: bool,
    kill_on_bad_exit: bool,
    output: Option<String>,
    error: Option<String>,
    append: bool,
    gpus_per_task: Option<u32>,
    cpus_per_task: Option<u32>,
    chdir: Option<String>,
    export: Option<String>,
    program: Vec<String>,
}

fn plan(given: &Given, program: Vec<String>, env: &BTreeMap<String, String>) -> Result<Plan, CliError> {
    if program.is_empty() {
        return Err(usage("no program to run (srun [options] PROGRAM [ARGS...])"));
    }
    // The job's nodes, in order: a heterogeneous job's all components'.
    let all = env.get("EBB_SLURM_ALL_NODES").or_else(|| env.get("SLURM_JOB_NODELIST"));
    let names: Vec<String> = match all {
        Some(list) if !list.is_empty() => {
            ebb_core::hostlist::expand(list).map_err(|e| usage(format!("SLURM_JOB_NODELIST={list}: {e}")))?
        }
        _ => vec![env.get("EBB_NODE").cloned().unwrap_or_default()],
    };
    let (step_nodes, step_tasks) = het_step(given, env, &names)?;
    let allocation = step_nodes.len() as u32;
    let mut nodes: Vec<u32> = match options::last(given, "nodelist") {
        Some(list) => {
            let wanted =
                ebb_core::hostlist::expand(list).map_err(|e| usage(format!("--nodelist={list}: {e}")))?;
            let mut indices = Vec::new();
            for name in &wanted {
                let i = names.iter().position(|n| n == name).ok_or_else(|| {
                    usage(format!(
                        "--nodelist={list}: {name} is not one of this job's nodes ({})",
                        names.join(", ")
                    ))
                })?;
                indices.push(i as u32);
            }
            indices
        }
        None => step_nodes.clone(),
    };
    if let Some((fewest, most)) = options::nodes(given)? {
        if fewest > allocation {
            return Err(usage(format!(
                "--nodes={fewest}: the job has {allocation} node{}",
                if allocation == 1 { "" } else { "s" }
            )));
        }
        // As many as the range allows, as Slurm gives.
        nodes.truncate(most.min(allocation) as usize);
    }
    if allocation > 1 && !env.contains_key("EBB_SLURM_HUB") && nodes.iter().any(|n| *n != 0) {
        return Err(usage(
            "this job's nodes have no step directory (EBB_SLURM_HUB): a step runs on its first node only",
        ));
    }
    let per_node = options::count(given, "ntasks-per-node")?;
    let per_gpu = options::count(given, "ntasks-per-gpu")?;
    let ntasks = match (options::count(given, "ntasks")?, per_node) {
        (Some(n), _) => n,
        (None, Some(per_node)) => per_node.saturating_mul(nodes.len() as u32),
        // So many a GPU, on every GPU of the step's nodes.
        (None, None) if per_gpu.is_some() => {
            let on_node: u32 = env.get("SLURM_GPUS_ON_NODE").and_then(|n| n.parse().ok()).unwrap_or(1);
            per_gpu.unwrap_or(1).saturating_mul(on_node).saturating_mul(nodes.len() as u32)
        }
        // A task a node, on the nodes named or counted.
        (None, None)
            if options::last(given, "nodes").is_some() || options::last(given, "nodelist").is_some() =>
        {
            nodes.len() as u32
        }
        // The allocation's (its components'), as Slurm does inside one.
        (None, None) => step_tasks,
    };
    if ntasks < nodes.len() as u32 {
        nodes.truncate(ntasks as usize);
    }
    // Block distribution: the first node's tasks, then the next's.
    let per = per_node.unwrap_or_else(|| ntasks.div_ceil(nodes.len().max(1) as u32)).max(1);
    let mut tasks = Vec::new();
    for task in 0..ntasks {
        let slot = (task / per) as usize;
        let node = *nodes.get(slot).ok_or_else(|| {
            usage(format!("{ntasks} tasks, {per} a node, need more than the step's {} nodes", nodes.len()))
        })?;
        tasks.push((node, task, task % per));
    }
    let append = match options::last(given, "open-mode") {
        None | Some("truncate") => false,
        Some("append") => true,
        Some(other) => return Err(usage(format!("--open-mode={other}: expected append or truncate"))),
    };
    // `--kill-on-bad-exit[=0|1]`: given alone, on.
    let kill_on_bad_exit = match options::last(given, "kill-on-bad-exit") {
        None | Some("0") => false,
        Some("" | "1") => true,
        Some(other) => return Err(usage(format!("--kill-on-bad-exit={other}: expected 0 or 1"))),
    };
    let gpus_per_task = match options::last(given, "gpus-per-task") {
        Some(text) => Some(options::gpus("gpus-per-task", text)?.1),
        None => None,
    };
    Ok(Plan {
        ntasks,
        nodes,
        tasks,
        label: options::flag(given, "label"),
        kill_on_bad_exit,
        output: options::last(given, "output").map(str::to_string),
        error: options::last(given, "error").map(str::to_string),
        append,
        gpus_per_task,
        cpus_per_task: options::count(given, "cpus-per-task")?,
        chdir: options::last(given, "chdir").map(str::to_string),
        export: options::last(given, "export").map(str::to_string),
        program,
    })
}

/// The nodes a step may use (indices into `names`) and its tasks by
/// default: the job's, or in a heterogeneous job those of the components
/// `--het-group` names (the first by default, as Slurm's).
fn het_step(
    given: &Given,
    env: &BTreeMap<String, String>,
    names: &[String],
) -> Result<(Vec<u32>, u32), CliError> {
    let tasks = |key: &str| env.get(key).and_then(|n| n.parse::<u32>().ok()).filter(|n| *n > 0);
    let size: usize = env.get("SLURM_HET_SIZE").and_then(|n| n.parse().ok()).unwrap_or(0);
    let groups = match (options::last(given, "het-group"), size) {
        (None, 0) => return Ok(((0..names.len() as u32).collect(), tasks("SLURM_NTASKS").unwrap_or(1))),
        (Some(_), 0) => return Err(usage("--het-group: this job is not heterogeneous")),
        (Some(expr), _) => {
            let expanded = ebb_core::hostlist::expand(&format!("g[{expr}]"))
                .map_err(|_| usage(format!("--het-group={expr}: expected components such as 1 or 0,2-3")))?;
            let mut groups = Vec::new();
            for name in expanded {
                let k: usize = name[1..].parse().map_err(|_| {
                    usage(format!("--het-group={expr}: expected components such as 1 or 0,2-3"))
                })?;
                if k >= size {
                    return Err(usage(format!(
                        "Attempt to run a job step with het-group value of {k}, but the job allocation has maximum \
                         value of {}",
                        size - 1
                    )));
                }
                groups.push(k);
            }
            groups
        }
        (None, _) => vec![0],
    };
    let (mut nodes, mut total) = (Vec::new(), 0u32);
    for k in groups {
        let list = env.get(&format!("SLURM_JOB_NODELIST_HET_GROUP_{k}")).cloned().unwrap_or_default();
        for name in
            ebb_core::hostlist::expand(&list).map_err(|e| usage(format!("component {k}'s nodes: {e}")))?
        {
            let i = names
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| usage(format!("{name}: not this job's")))?;
            nodes.push(i as u32);
        }
        total = total.saturating_add(tasks(&format!("SLURM_NTASKS_HET_GROUP_{k}")).unwrap_or(1));
    }
    Ok((nodes, total.max(1)))
}

/// `srun` in an allocation: runs the step and ends with its exit: the
/// highest of its tasks' codes, or 128+N for a task killed by signal N.
/// Its tasks on this node are its children; those on the job's other
/// nodes are started there by their batch steps (`remote.rs`).
pub fn in_allocation(args: &[String]) -> Result<i32, CliError> {
    let (given, program) = options::parse(options::Command::Srun, args, "")?;
    let mut env: BTreeMap<String, String> = std::env::vars().collect();
    if program.iter().any(|w| w == ":") {
        return heterogeneous_step(args, &env);
    }
    super::query::say_ignored(options::Command::Srun, &given);
    let mut plan = plan(&given, program, &env)?;
    // A part of `srun A : B`: its tasks' ranks follow the parts before it.
    // Its tasks do not inherit that (an srun of theirs is a step of its own).
    let (base, total) = (env.remove(RANK_BASE), env.remove(STEP_TASKS));
    std::env::remove_var(RANK_BASE);
    std::env::remove_var(STEP_TASKS);
    if let Some(total) = total.and_then(|n| n.parse::<u32>().ok()) {
        let base: u32 = base.and_then(|n| n.parse().ok()).unwrap_or(0);
        plan.tasks.iter_mut().for_each(|t| t.1 = t.1.saturating_add(base));
        plan.ntasks = total;
    }
    let steps = env
        .get("EBB_SLURM_STEPS")
        .map(std::path::PathBuf::from)
        .ok_or_else(|| usage("not in a batch job's step"))?;
    let container = super::pyxis::from_given(&given, &env)?;
    let (step_id, step_file) = step::claim_step(&steps)?;
    let info = StepInfo::starting(options::last(&given, "job-name"), &plan.program[0], plan.nodes.clone());
    super::steps::record(&steps, step_id, &info);
    let claim = Claim { steps: &steps, step: step_id, file: step_file.clone() };
    let here: u32 = env.get("SLURM_NODEID").and_then(|n| n.parse().ok()).unwrap_or(0);
    // This node's container before any node's tasks start.
    let spec = match (&container, plan.tasks.iter().any(|t| t.0 == here)) {
        (Some(c), true) => {
            Some(super::pyxis::prepare(c, &env, &steps, step_id).map_err(|e| failed(format!("pyxis: {e}")))?)
        }
        _ => None,
    };
    let waited = step::waited_signals();
    waited.thread_block().map_err(|e| CliError::Signals(e.into()))?;
    let all_names: Vec<String> = env
        .get("EBB_SLURM_ALL_NODES")
        .or_else(|| env.get("SLURM_JOB_NODELIST"))
        .and_then(|l| ebb_core::hostlist::expand(l).ok())
        .unwrap_or_default();
    let task_env = task_vars(&plan, &all_names, step_id);
    // The other nodes' shares first: they start while this one's do. A
    // task that fails with --kill-on-bad-exit ends the step everywhere:
    // `failed` is set, this process woken, and the other nodes' streams
    // shut (each node's batch step then kills its tasks).
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut streams = Vec::new();
    let mut remote = Vec::new();
    let others: Vec<u32> = plan.nodes.iter().copied().filter(|n| *n != here).collect();
    if !others.is_empty() {
        let hub = env.get("EBB_SLURM_HUB").ok_or_else(|| usage("no step directory (EBB_SLURM_HUB)"))?;
        let key = env.get("EBB_SLURM_KEY").cloned().unwrap_or_default();
        let nodes = super::remote::directory(hub, &key, all_names.len() as u32)?;
        for node in others {
            let tasks: Vec<(u32, u32)> =
                plan.tasks.iter().filter(|t| t.0 == node).map(|&(_, task, local)| (task, local)).collect();
            let request = super::remote::StepRequest {
                step: step_id,
                argv: plan.program.clone(),
                env: match &plan.export {
                    Some(export) => super::sbatch::exported(export, &env)?,
                    None => env.clone(),
                },
                cwd: plan
                    .chdir
                    .clone()
                    .or_else(|| std::env::current_dir().ok().map(|d| d.display().to_string())),
                output: plan.output.clone(),
                error: plan.error.clone(),
                append: plan.append,
                task_env: tasks.iter().map(|&(task, _)| (task, task_env(node, task))).collect(),
                tasks: tasks.clone(),
                attached: false,
                signal: None,
                container: container.clone(),
            };
            let at = nodes
                .get(&node)
                .ok_or_else(|| usage(format!("node {node} of the job has no step address")))?;
            let stream = super::remote::start_remote(at, &key, &request)?;
            streams.push(stream.try_clone().map_err(crate::slurm::StepError::from)?);
            let (label, kill_on_bad_exit, failed) = (plan.label, plan.kill_on_bad_exit, failed.clone());
            let count = tasks.len();
            remote.push(std::thread::spawn(move || {
                follow_node(stream, count, label, |code| {
                    if code != 0
                        && kill_on_bad_exit
                        && !failed.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        // SAFETY: a signal to this process, which waits for it.
                        unsafe {
                            nix::libc::kill(std::process::id() as i32, nix::libc::SIGUSR1);
                        }
                    }
                })
            }));
        }
    }
    let mut names = Names::from_env(&env);
    names.step = step_id.to_string();
    let gpus: Vec<String> = env
        .get("CUDA_VISIBLE_DEVICES")
        .map(|g| g.split(',').filter(|g| !g.is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    let mut shared_files: BTreeMap<String, std::fs::File> = BTreeMap::new();
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut readers = Vec::new();
    for &(_, task, local) in plan.tasks.iter().filter(|t| t.0 == here) {
        names.task = Some(task);
        let mut command = super::pyxis::task_command(spec.as_ref(), &plan.program)?;
        step::unblocked(&mut command).stdin(Stdio::null());
        if let Some(export) = &plan.export {
            let vars = super::sbatch::exported(export, &env)?;
            command.env_clear().envs(vars);
            for key in ["PATH", "EBB_SLURM_STEPS", "EBB_METADATA_URL", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"] {
                if let Some(v) = env.get(key) {
                    command.env(key, v);
                }
            }
        }
        if let Some(dir) = &plan.chdir {
            command.current_dir(dir);
        }
        command.envs(task_env(here, task)).env("SLURM_LOCALID", local.to_string());
        if let Some(per_task) = plan.gpus_per_task {
            let from = (local * per_task) as usize;
            let mine: Vec<&str> =
                gpus.iter().skip(from).take(per_task as usize).map(String::as_str).collect();
            if mine.len() < per_task as usize {
                return Err(usage(format!(
                    "--gpus-per-task={per_task}: this node's tasks need {} GPUs, it has {}",
                    (local + 1) * per_task,
                    gpus.len()
                )));
            }
            command.env("CUDA_VISIBLE_DEVICES", mine.join(","));
        }
        let mut file = |pattern: &Option<String>| -> Result<Option<std::fs::File>, CliError> {
            let Some(pattern) = pattern else { return Ok(None) };
            let path = names.expand(pattern);
            if let Some(open) = shared_files.get(&path) {
                return open.try_clone().map(Some).map_err(file(&path));
            }
            let opened = step::open_output(std::path::Path::new(&path), plan.append).map_err(file(&path))?;
            shared_files.insert(path.clone(), opened.try_clone().map_err(file(&path))?);
            Ok(Some(opened))
        };
        let out = file(&plan.output)?;
        let err = match &plan.error {
            Some(_) => file(&plan.error)?,
            None => out.as_ref().map(|f| f.try_clone()).transpose().map_err(CliError::Output)?,
        };
        // Labelled, or with tasks elsewhere whose lines come here too: one
        // writer per line.
        let piped = plan.label || !remote.is_empty();
        match out {
            Some(f) => command.stdout(f),
            None if piped => command.stdout(Stdio::piped()),
            None => command.stdout(Stdio::inherit()),
        };
        match err {
            Some(f) => command.stderr(f),
            None if piped => command.stderr(Stdio::piped()),
            None => command.stderr(Stdio::inherit()),
        };
        let mut child = command
            .spawn()
            .map_err(|source| CliError::Spawn { what: format!("{:?}", plan.program[0]), source })?;
        if let Some(pipe) = child.stdout.take() {
            readers.push(label(pipe, plan.label.then_some(task), false));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(label(pipe, plan.label.then_some(task), true));
        }
        children.push(Some(child));
    }
    let pids: Vec<String> = children.iter().flatten().map(|c| c.id().to_string()).collect();
    std::fs::write(&step_file, pids.join("\n")).map_err(file(&step_file))?;
    let mut code = wait_all(&mut children, &waited, plan.kill_on_bad_exit, &failed);
    if let Some(spec) = &spec {
        super::pyxis::finish(spec);
    }
    if failed.load(std::sync::atomic::Ordering::SeqCst) {
        for stream in &streams {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
    drop(claim);
    for reader in readers {
        let _ = reader.join();
    }
    for node in remote {
        code = code.max(node.join().unwrap_or(1));
    }
    Ok(code)
}

/// A step's number and record in its steps directory, given back when
/// the step ends, whichever way it ends.
struct Claim<'a> {
    steps: &'a std::path::Path,
    step: u32,
    file: std::path::PathBuf,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        super::steps::forget(self.steps, self.step);
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Where a part of `srun A : B` learns the rank of its first task and the
/// step's tasks in all (its parent `srun` sets them).
const RANK_BASE: &str = "EBB_SLURM_HET_STEP_RANK_BASE";
const STEP_TASKS: &str = "EBB_SLURM_HET_STEP_TASKS";

/// `srun [OPTIONS] A [ARGS] : [OPTIONS] B [ARGS] ...` in a heterogeneous
/// job: one part on each component in turn (the first on component 0,
/// unless a part names its own `--het-group`), all at once, each with its
/// own options, the tasks' ranks (`SLURM_PROCID`) running on across the
/// parts and `SLURM_NTASKS` their sum, as in Slurm's heterogeneous step.
/// Each part is an `srun` of its own (a step number each); this one ends
/// with the highest of their codes.
fn heterogeneous_step(args: &[String], env: &BTreeMap<String, String>) -> Result<i32, CliError> {
    let size: usize = env.get("SLURM_HET_SIZE").and_then(|n| n.parse().ok()).unwrap_or(0);
    if size == 0 {
        return Err(usage(
            "srun A : B runs a part on each component of a heterogeneous job (#SBATCH hetjob); this job has one",
        ));
    }
    let mut parts: Vec<Vec<String>> = args.split(|a| a == ":").map(<[String]>::to_vec).collect();
    if parts.len() > size {
        return Err(usage(format!(
            "srun A : B: {} parts, but the job allocation has {size} components",
            parts.len()
        )));
    }
    let mut bases = Vec::new();
    let mut total = 0u32;
    for (k, part) in parts.iter_mut().enumerate() {
        let (given, program) = options::parse(options::Command::Srun, part, "")?;
        if options::last(&given, "het-group").is_none() {
            part.insert(0, format!("--het-group={k}"));
        }
        let (given, _) = options::parse(options::Command::Srun, part, "")?;
        if program.is_empty() {
            return Err(usage(format!("srun A : B: part {k} has no program to run")));
        }
        let plan = plan(&given, program, env)?;
        bases.push(total);
        total = total.saturating_add(plan.ntasks);
    }
    let exe = std::env::current_exe().map_err(|e| usage(format!("cannot find this program: {e}")))?;
    let mut children = Vec::new();
    for (part, base) in parts.iter().zip(bases) {
        use std::os::unix::process::CommandExt;
        let child = Command::new(&exe)
            .arg0("srun")
            .args(part)
            .env(RANK_BASE, base.to_string())
            .env(STEP_TASKS, total.to_string())
            .spawn()
            .map_err(|source| CliError::Spawn { what: "srun".into(), source })?;
        children.push(child);
    }
    let mut code = 0;
    for mut child in children {
        code = code.max(child.wait().map_or(1, step::exit_code));
    }
    Ok(code)
}

/// Whether `srun` with these options reaches into another job than the
/// one it runs in (`--jobid` from a login node, or naming another job):
/// the job it names, if so.
pub fn attaching(args: &[String]) -> Result<Option<String>, CliError> {
    let (given, _) = options::parse(options::Command::Srun, args, "")?;
    let Some(id) = options::last(&given, "jobid") else { return Ok(None) };
    // A job's own id, from inside it, is the job srun runs in.
    let own = std::env::var("SLURM_JOB_ID").ok().filter(|_| inside());
    Ok((own.as_deref() != Some(id)).then(|| id.to_string()))
}

/// `srun --jobid=ID` from outside job ID (a login node): the step runs in
/// the job's allocation, its tasks the job's processes on its nodes,
/// started there by their batch steps (the first node's too). `access`
/// is the tenant's, from the server. Its tasks' output comes back byte
/// for byte and `srun`'s standard input goes to each of them (`rsync -e`
/// works through it); the step ends, its tasks killed, when `srun` does.
/// It ends with its tasks' highest code.
pub fn attached(args: &[String], access: ebb_api::StepAccess) -> Result<i32, CliError> {
    let (given, program) = options::parse(options::Command::Srun, args, "")?;
    super::query::say_ignored(options::Command::Srun, &given);
    blocking_stdio();
    // The login shell's own, without another job's variables, over the
    // job's: what a step's tasks see there.
    let mut env: BTreeMap<String, String> = super::vars()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("SLURM_") && !k.starts_with("EBB_SLURM"))
        .collect();
    env.extend(access.env.clone());
    let plan = plan(&given, program, &env)?;
    let container = super::pyxis::from_given(&given, &env)?;
    if plan.output.is_some() || plan.error.is_some() {
        return Err(usage("--output/--error: a step from outside its job writes to srun's own output"));
    }
    let all_names: Vec<String> = env
        .get("EBB_SLURM_ALL_NODES")
        .or_else(|| env.get("SLURM_JOB_NODELIST"))
        .and_then(|l| ebb_core::hostlist::expand(l).ok())
        .unwrap_or_default();
    let info = StepInfo::starting(options::last(&given, "job-name"), &plan.program[0], plan.nodes.clone());
    let (attached, claim) = super::remote::attach(&access.hub, &access.key, all_names.len() as u32, info)?;
    let task_env = task_vars(&plan, &all_names, attached.step);
    let exported = match &plan.export {
        Some(export) => super::sbatch::exported(export, &env)?,
        None => env.clone(),
    };
    let cwd = plan.chdir.clone().or_else(|| std::env::current_dir().ok().map(|d| d.display().to_string()));
    let mut followers = Vec::new();
    let mut inputs = Vec::new();
    for &node in &plan.nodes {
        let tasks: Vec<(u32, u32)> =
            plan.tasks.iter().filter(|t| t.0 == node).map(|&(_, task, local)| (task, local)).collect();
        let request = super::remote::StepRequest {
            step: attached.step,
            argv: plan.program.clone(),
            env: exported.clone(),
            cwd: cwd.clone(),
            output: None,
            error: None,
            append: plan.append,
            task_env: tasks.iter().map(|&(task, _)| (task, task_env(node, task))).collect(),
            tasks: tasks.clone(),
            attached: !plan.label,
            signal: None,
            container: container.clone(),
        };
        let at = attached
            .nodes
            .get(&node)
            .ok_or_else(|| usage(format!("node {node} of the job has no step address")))?;
        let stream = super::remote::start_remote(at, &access.key, &request)?;
        inputs.push(stream.try_clone().map_err(super::StepError::from)?);
        let label = plan.label;
        followers.push(std::thread::spawn(move || follow_node(stream, tasks.len(), label, |_| {})));
    }
    std::thread::spawn(move || super::attached::send_input(inputs));
    let code = followers.into_iter().map(|f| f.join().unwrap_or(1)).max().unwrap_or(0);
    drop(claim);
    Ok(code)
}

/// Follows one node's share of a step: its tasks' output to `srun`'s own
/// (each line begun with its task with `label`), each task's exit code to
/// `exited`. The highest code, or at least 1 where the node could not run
/// the tasks or its stream broke.
fn follow_node(stream: std::net::TcpStream, tasks: usize, label: bool, mut exited: impl FnMut(i32)) -> i32 {
    use super::remote::StepEvent;
    let mut code = 0;
    let followed = super::remote::follow(stream, tasks, |event| match event {
        StepEvent::Out { task, line, err } => {
            let text = if label { format!("{task}: {line}\n") } else { format!("{line}\n") };
            let _ = match err {
                true => std::io::stderr().lock().write_all(text.as_bytes()),
                false => std::io::stdout().lock().write_all(text.as_bytes()),
            };
        }
        StepEvent::Data { data, err, .. } => super::attached::write_data(&data, err),
        StepEvent::Exit { code: c, .. } => {
            code = code.max(c);
            exited(c);
        }
        StepEvent::Failed { message } => {
            eprintln!("srun: error: {message}");
            code = code.max(1);
        }
    });
    if let Err(e) = followed {
        eprintln!("srun: error: {e}");
        code = code.max(1);
    }
    code
}

/// Makes `srun`'s standard input, output and error blocking: rsync hands
/// its `-e` program a non-blocking socket (as it does ssh, which copes),
/// and a copy that met "try again" would lose bytes or end early.
fn blocking_stdio() {
    use nix::libc::{fcntl, F_GETFL, F_SETFL, O_NONBLOCK};
    for fd in 0..3 {
        // SAFETY: fcntl on the standard descriptors, flags only.
        unsafe {
            let flags = fcntl(fd, F_GETFL);
            if flags >= 0 && flags & O_NONBLOCK != 0 {
                fcntl(fd, F_SETFL, flags & !O_NONBLOCK);
            }
        }
    }
}

/// Each task's own variables (`SLURM_PROCID`, its step's ...), by node
/// index and task, for step `step_id` of `plan` in a job of nodes `all_names`.
fn task_vars<'a>(
    plan: &'a Plan,
    all_names: &[String],
    step_id: u32,
) -> impl Fn(u32, u32) -> BTreeMap<String, String> + 'a {
    let step_names: Vec<&str> =
        plan.nodes.iter().filter_map(|n| all_names.get(*n as usize)).map(String::as_str).collect();
    let step_nodelist = ebb_core::hostlist::compress(&step_names);
    let per_node: Vec<String> =
        plan.nodes.iter().map(|n| plan.tasks.iter().filter(|t| t.0 == *n).count().to_string()).collect();
    let per_node = per_node.join(",");
    move |node: u32, task: u32| -> BTreeMap<String, String> {
        let mut vars = BTreeMap::from([
            ("SLURM_PROCID".to_string(), task.to_string()),
            ("SLURM_NODEID".to_string(), node.to_string()),
            ("SLURM_STEP_ID".to_string(), step_id.to_string()),
            ("SLURM_STEPID".to_string(), step_id.to_string()),
            ("SLURM_STEP_NUM_TASKS".to_string(), plan.ntasks.to_string()),
            ("SLURM_STEP_NUM_NODES".to_string(), plan.nodes.len().to_string()),
            ("SLURM_STEP_NODELIST".to_string(), step_nodelist.clone()),
            ("SLURM_STEP_TASKS_PER_NODE".to_string(), per_node.clone()),
            ("SLURM_NTASKS".to_string(), plan.ntasks.to_string()),
            ("SLURM_NPROCS".to_string(), plan.ntasks.to_string()),
        ]);
        if let Some(cpus) = plan.cpus_per_task {
            vars.insert("SLURM_CPUS_PER_TASK".to_string(), cpus.to_string());
        }
        vars
    }
}

/// Copies a task's pipe to `srun`'s own output, line by line, each begun
/// with the task's number with `srun -l`.
fn label(
    pipe: impl std::io::Read + Send + 'static,
    task: Option<u32>,
    err: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(pipe);
        for line in reader.split(b'\n').map_while(Result::ok) {
            let mut bytes = task.map(|t| format!("{t}: ")).unwrap_or_default().into_bytes();
            bytes.extend_from_slice(&line);
            bytes.push(b'\n');
            let _ = match err {
                true => std::io::stderr().lock().write_all(&bytes),
                false => std::io::stdout().lock().write_all(&bytes),
            };
        }
    })
}

/// Waits for every task; with `kill_on_bad_exit`, the first that fails
/// has the others killed. The step's code: the highest of the tasks'.
fn wait_all(
    children: &mut [Option<Child>],
    waited: &nix::sys::signal::SigSet,
    kill_on_bad_exit: bool,
    failed: &std::sync::atomic::AtomicBool,
) -> i32 {
    use std::sync::atomic::Ordering;
    let mut code = 0;
    loop {
        if kill_on_bad_exit && failed.load(Ordering::SeqCst) {
            // A task elsewhere failed: this node's go too.
            for other in children.iter_mut().flatten() {
                let _ = other.kill();
            }
        }
        let mut left = 0;
        for slot in children.iter_mut() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let this = step::exit_code(status);
                    code = code.max(this);
                    *slot = None;
                    if this != 0 && kill_on_bad_exit {
                        failed.store(true, Ordering::SeqCst);
                        for other in children.iter_mut().flatten() {
                            let _ = other.kill();
                        }
                        break;
                    }
                }
                Ok(None) => left += 1,
                Err(_) => *slot = None,
            }
        }
        if left == 0 && children.iter().all(Option::is_none) {
            return code;
        }
        // Every signal is taken here: the tasks have their own.
        if step::next_signal(waited).is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Whether this process runs inside a batch job's step, where `srun`
/// starts a step; outside one it makes an allocation first.
pub fn inside() -> bool {
    std::env::var_os("EBB_SLURM_STEPS").is_some()
}

/// The signal a step passes on, by name or number, for `scancel -s`.
pub fn signal_named(name: &str) -> Option<Signal> {
    let n = ebb_server::parse_signal(name)?;
    Signal::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(args: &str) -> (Given, Vec<String>) {
        let words: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        options::parse(options::Command::Srun, &words, "srun").unwrap()
    }

    #[test]
    fn a_steps_tasks_are_spread_over_its_nodes_in_blocks() {
        let env = BTreeMap::from([
            ("SLURM_NTASKS".to_string(), "3".to_string()),
            ("SLURM_JOB_NODELIST".to_string(), "node-[0-1]".to_string()),
            ("EBB_SLURM_HUB".to_string(), "127.0.0.1:29500".to_string()),
            ("EBB_NODE".to_string(), "node-0".to_string()),
        ]);
        let (g, program) = given("--unbuffered -l python x.py");
        let p = plan(&g, program, &env).unwrap();
        assert_eq!((p.ntasks, p.label, p.program.len()), (3, true, 2));
        assert_eq!(p.tasks, [(0, 0, 0), (0, 1, 1), (1, 2, 0)]);
        let (g, program) = given("--ntasks-per-node=1 -K -o out-%t.log true");
        let p = plan(&g, program, &env).unwrap();
        assert_eq!(p.tasks, [(0, 0, 0), (1, 1, 0)]);
        assert!(p.kill_on_bad_exit);
        let (g, program) = given("-N 1 true");
        assert_eq!(plan(&g, program, &env).unwrap().tasks, [(0, 0, 0)]);
        let (g, program) = given("-w node-1 true");
        assert_eq!(plan(&g, program, &env).unwrap().tasks, [(1, 0, 0)]);
        let (g, program) = given("-w node-7 true");
        assert!(plan(&g, program, &env).err().unwrap().to_string().contains("not one of this job's nodes"));
        let (g, program) = given("-N 3 true");
        assert!(plan(&g, program, &env).err().unwrap().to_string().contains("the job has 2 nodes"));
        let (g, program) = given("-n 2");
        assert!(plan(&g, program, &env).err().unwrap().to_string().contains("no program"));
    }

    /// In a heterogeneous job a step runs on the components `--het-group`
    /// names (the first by default), with their tasks, numbered as the
    /// job's nodes; a component the job lacks is Slurm's error.
    #[test]
    fn a_step_of_a_heterogeneous_job_runs_on_the_components_it_names() {
        let env = BTreeMap::from(
            [
                ("SLURM_HET_SIZE", "2"),
                ("EBB_SLURM_ALL_NODES", "node-[0-2]"),
                ("SLURM_JOB_NODELIST", "node-0"),
                ("SLURM_NTASKS", "1"),
                ("SLURM_JOB_NODELIST_HET_GROUP_0", "node-0"),
                ("SLURM_NTASKS_HET_GROUP_0", "1"),
                ("SLURM_JOB_NODELIST_HET_GROUP_1", "node-[1-2]"),
                ("SLURM_NTASKS_HET_GROUP_1", "4"),
                ("EBB_SLURM_HUB", "127.0.0.1:1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let (g, program) = given("hostname");
        assert_eq!(plan(&g, program, &env).unwrap().tasks, [(0, 0, 0)]);
        let (g, program) = given("--het-group=1 hostname");
        assert_eq!(plan(&g, program, &env).unwrap().tasks, [(1, 0, 0), (1, 1, 1), (2, 2, 0), (2, 3, 1)]);
        let (g, program) = given("--het-group=0-1 -n 3 hostname");
        assert_eq!(plan(&g, program, &env).unwrap().tasks, [(0, 0, 0), (1, 1, 0), (2, 2, 0)]);
        let (g, program) = given("--het-group=2 hostname");
        assert_eq!(
            plan(&g, program, &env).err().unwrap().to_string(),
            "Attempt to run a job step with het-group value of 2, but the job allocation has maximum value of 1"
        );
        // srun A : B: a part a component, no more parts than components.
        let words = |line: &str| line.split(' ').map(str::to_string).collect::<Vec<_>>();
        let three = heterogeneous_step(&words("a : b : c"), &env).unwrap_err().to_string();
        assert!(three.contains("3 parts, but the job allocation has 2 components"), "{three}");
        let empty = heterogeneous_step(&words("a : -n 2"), &env).unwrap_err().to_string();
        assert!(empty.contains("part 1 has no program"), "{empty}");
        let mut plain = env.clone();
        plain.remove("SLURM_HET_SIZE");
        let one = heterogeneous_step(&words("a : b"), &plain).unwrap_err().to_string();
        assert!(one.contains("this job has one"), "{one}");
        let (g, program) = given("--het-group=1 hostname");
        assert!(plan(&g, program, &plain).err().unwrap().to_string().contains("not heterogeneous"));
    }
}
