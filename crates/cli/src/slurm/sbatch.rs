//! `sbatch`: a batch script (a file, standard input, or `--wrap`) with
//! its `#SBATCH` lines and the command line's options, as one Ebb job.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use ebb_api as api;

use super::options::{self, Command, Given};
use crate::commands::{not_exported as ebb_leaves_out, valid_name};
use crate::error::{usage, CliError};

/// What `sbatch` sends, and what it says before it does.
#[derive(Debug)]
pub struct Batch {
    pub submission: api::JobSubmission,
    /// `ignoring --mem=64G: ...`, one line per ignored option.
    pub notes: Vec<String>,
    /// `--parsable`: print the id alone.
    pub parsable: bool,
}

/// Variables `sbatch --export=ALL` leaves out: what `ebb submit` does (Ebb's
/// own, the GPUs, who runs it, the shell's bookkeeping), and a submitting
/// job's own Slurm variables (the new job gets its own).
fn not_exported(name: &str) -> bool {
    ebb_leaves_out(name) || ["SLURM_", "SBATCH_", "SRUN_"].iter().any(|p| name.starts_with(p))
}

/// `--export`: `ALL` (the default), `NONE`, or `VAR,VAR=VALUE,...`, where
/// the list may begin with `ALL` or `NONE` (`ALL,EXTRA=1`).
pub fn exported(text: &str, vars: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, CliError> {
    let mut env = BTreeMap::new();
    for (i, item) in text.split(',').enumerate() {
        if i == 0 && item.eq_ignore_ascii_case("all") {
            env.extend(
                vars.iter()
                    .filter(|(k, _)| valid_name(k) && !not_exported(k))
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            continue;
        }
        if i == 0 && item.eq_ignore_ascii_case("none") {
            continue;
        }
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name, value.to_string()),
            None => match vars.get(item) {
                Some(value) => (item, value.clone()),
                None => continue, // Slurm passes on only what is set
            },
        };
        if !valid_name(name) {
            return Err(usage(format!("--export={text}: {name:?} is not a variable name")));
        }
        env.insert(name.to_string(), value);
    }
    Ok(env)
}

/// Reads the batch script: `--wrap`'s command, the file named first in
/// `rest` (its arguments after it), or standard input.
fn script(
    given: &Given,
    rest: &[String],
    stdin: &mut dyn Read,
) -> Result<(String, String, Vec<String>), CliError> {
    if let Some(command) = options::last(given, "wrap") {
        if !rest.is_empty() {
            return Err(usage("--wrap: a script cannot be given with it"));
        }
        return Ok((
            format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"),
            "wrap".into(),
            Vec::new(),
        ));
    }
    let (text, name) = match rest.first() {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| usage(format!("Unable to open file {path}: {e}")))?;
            (bytes, path.clone())
        }
        None => {
            let mut bytes = Vec::new();
            stdin.read_to_end(&mut bytes).map_err(CliError::Input)?;
            (bytes, "sbatch".into())
        }
    };
    if text.len() > api::MAX_SLURM_SCRIPT_BYTES {
        return Err(usage(format!(
            "{name}: {} bytes, over the largest script Ebb takes ({} bytes)",
            text.len(),
            api::MAX_SLURM_SCRIPT_BYTES
        )));
    }
    let text = String::from_utf8(text).map_err(|_| usage(format!("{name}: not UTF-8 text")))?;
    if text.contains('\0') {
        return Err(usage(format!("{name}: a batch script cannot hold NUL bytes")));
    }
    if !text.starts_with("#!") {
        return Err(usage(
            "This does not look like a batch script.  The first line must start with #! followed by the path to \
             an interpreter.\nFor instance: #!/bin/sh",
        ));
    }
    Ok((text, name, rest.iter().skip(1).cloned().collect()))
}

/// The whole `sbatch` command line as one job. `cwd` and `vars` are the
/// submitter's directory and environment.
pub fn batch(
    args: &[String],
    stdin: &mut dyn Read,
    cwd: &Path,
    vars: &BTreeMap<String, String>,
) -> Result<Batch, CliError> {
    // `sbatch A : B script`: a heterogeneous job's components' options.
    let (mut cli, mut rest) = (Vec::new(), args.to_vec());
    loop {
        let (given, after) = options::parse(Command::Sbatch, &rest, "")?;
        cli.push(given);
        match after.split_first() {
            Some((colon, more)) if colon == ":" => rest = more.to_vec(),
            _ => {
                rest = after;
                break;
            }
        }
    }
    let (text, script_name, script_args) = script(&cli[0], &rest, stdin)?;
    let mut parts = options::script_options(&text, &script_name)?;
    parts.resize(parts.len().max(cli.len()), Given::new());
    for (part, cli) in parts.iter_mut().zip(cli) {
        part.extend(cli);
    }
    let given = parts.remove(0);
    let mut notes = options::ignored_notes(Command::Sbatch, &given);
    for note in parts.iter().flat_map(|part| options::ignored_notes(Command::Sbatch, part)) {
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    let last = |long: &str| options::last(&given, long);

    let nodes = match options::nodes(&given)? {
        Some((fewest, most)) if most > fewest => {
            notes.push(format!(
                "--nodes={fewest}-{most}: Ebb starts the job on {fewest} nodes, its count fixed after (Slurm's \
                 meaning allows any count in the range); for a job that grows to {most} and is shrunk rather \
                 than stopped, see docs/elastic.md"
            ));
            Some(fewest)
        }
        range => range.map(|(n, _)| n),
    };
    let ntasks = options::count(&given, "ntasks")?;
    let ntasks_per_node = options::count(&given, "ntasks-per-node")?;
    let cpus_per_task = options::count(&given, "cpus-per-task")?;
    let node_count = nodes.unwrap_or(1);
    // `--exclusive` and no GPU count: every GPU of its nodes, as a site's
    // exclusive nodes give them (the server knows their size).
    let asks_gpus = given.iter().any(|(l, _)| GPU_OPTIONS.contains(l) || *l == "ntasks-per-gpu");
    let whole_nodes = !asks_gpus && options::flag(&given, "exclusive") && parts.is_empty();
    if whole_nodes {
        notes.retain(|n| !n.starts_with("ignoring --exclusive"));
    }
    let (gpu_model, gpus) = match whole_nodes {
        true => (None, 0),
        false => gpu_request(&given, node_count, ntasks)?,
    };
    let components = match parts.is_empty() {
        true => Vec::new(),
        false => het_components(&given, &parts)?,
    };
    // A heterogeneous job is one gang of its components' nodes and GPUs.
    let (nodes, gpus) = match components.is_empty() {
        true => (nodes, gpus),
        false => (
            Some(components.iter().map(|c| c.nodes).fold(0u32, u32::saturating_add)),
            components
                .iter()
                .map(|c| c.nodes.saturating_mul(c.gpus_per_node))
                .fold(0u32, u32::saturating_add),
        ),
    };
    // `--ntasks-per-gpu`: so many tasks a GPU, or GPUs enough for the tasks.
    let ntasks = match (options::count(&given, "ntasks-per-gpu")?, ntasks) {
        (Some(per_gpu), None) if !whole_nodes => Some(per_gpu.saturating_mul(gpus)),
        (_, ntasks) => ntasks,
    };
    let (array, array_limit) = match last("array") {
        Some(text) => {
            let (range, limit) = options::array(text)?;
            (Some(range), limit)
        }
        None => (None, None),
    };
    let append = match last("open-mode") {
        None | Some("truncate") => false,
        Some("append") => true,
        Some(other) => return Err(usage(format!("--open-mode={other}: expected append or truncate"))),
    };
    let (signal, signal_batch_only, signal_before_s) = match last("signal") {
        Some(text) => {
            let (sig, batch, secs) = options::signal(text)?;
            (Some(sig), batch, secs)
        }
        None => (None, false, None),
    };
    let time_limit_s = last("time").map(options::time_limit).transpose()?.flatten();
    let workdir = match last("chdir") {
        Some(dir) => cwd.join(dir),
        None => cwd.to_path_buf(),
    };
    let workdir = workdir.display().to_string();
    let env = exported(last("export").unwrap_or("ALL"), vars)?;
    let name = last("job-name").map(str::to_string).unwrap_or_else(|| {
        Path::new(&script_name).file_name().map_or(script_name.clone(), |n| n.to_string_lossy().into_owned())
    });
    let mut argv = vec![script_name];
    argv.extend(script_args);
    let submission = api::JobSubmission {
        name: Some(name),
        gpus: (!whole_nodes).then_some(gpus),
        gpu_model,
        argv,
        env,
        workdir: Some(workdir.clone()),
        signal,
        // Slurm's --no-requeue: a preemption ends the job.
        max_preemptions: options::flag(&given, "no-requeue").then_some(0).filter(|_| !requeue_last(&given)),
        // A batch script that exits 0 during a drain finished its work.
        exit_on_drain_is_success: true,
        array,
        time_limit_s,
        slurm: Some(api::SlurmBatch {
            script: text,
            output: last("output").map(str::to_string),
            error: last("error").map(str::to_string),
            append,
            signal_batch_only,
            routed_signal: last("signal").is_some(),
            signal_before_s,
            nodes,
            ntasks,
            ntasks_per_node,
            cpus_per_task,
            partition: last("partition").map(str::to_string),
            qos: last("qos").map(str::to_string),
            account: last("account").map(str::to_string),
            submit_dir: Some(cwd.display().to_string()),
            components,
            whole_nodes,
        }),
        array_limit,
        after: last("dependency").map(str::to_string),
        ..Default::default()
    };
    if options::flag(&given, "quiet") {
        notes.clear();
    }
    Ok(Batch { submission, notes, parsable: options::flag(&given, "parsable") })
}

/// What a component after the first may say: its own resources. The
/// rest is the job's, given in the first.
const COMPONENT_OPTIONS: [&str; 9] = [
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "cpus-per-task",
    "gpus",
    "gpus-per-node",
    "gres",
    "gpus-per-task",
    "ntasks-per-gpu",
];

/// A heterogeneous job's components (`first` and `rest`), each its nodes,
/// GPUs a node and tasks; all of one GPU model.
fn het_components(first: &Given, rest: &[Given]) -> Result<Vec<api::SlurmComponent>, CliError> {
    let mut components = Vec::new();
    let mut models = Vec::new();
    for (k, given) in std::iter::once(first).chain(rest).enumerate() {
        let at = |why: String| usage(format!("heterogeneous job component {k}: {why}"));
        if k > 0 {
            let job_wide = given.iter().find(|(long, _)| {
                !COMPONENT_OPTIONS.contains(long)
                    && options::specs(Command::Sbatch)
                        .any(|s| s.long == *long && s.kind == options::Kind::Honoured)
            });
            if let Some((long, _)) = job_wide {
                return Err(at(format!("--{long} is the job's: give it in the first component")));
            }
        }
        let nodes = match options::nodes(given).map_err(|e| at(e.to_string()))? {
            Some((fewest, most)) if most > fewest => {
                return Err(at(format!("--nodes={fewest}-{most}: a component's node count is fixed")))
            }
            nodes => nodes.map_or(1, |(n, _)| n),
        };
        let ntasks = options::count(given, "ntasks").map_err(|e| at(e.to_string()))?;
        let (model, gpus) = gpu_request(given, nodes, ntasks).map_err(|e| at(e.to_string()))?;
        if !gpus.is_multiple_of(nodes) {
            return Err(at(format!(
                "{gpus} GPUs on {nodes} nodes: each node of a component has the same GPUs"
            )));
        }
        models.push(model);
        components.push(api::SlurmComponent {
            nodes,
            gpus_per_node: gpus / nodes,
            ntasks: match (options::count(given, "ntasks-per-gpu")?, ntasks) {
                (Some(per_gpu), None) => Some(per_gpu.saturating_mul(gpus)),
                (_, ntasks) => ntasks,
            },
            ntasks_per_node: options::count(given, "ntasks-per-node").map_err(|e| at(e.to_string()))?,
            cpus_per_task: options::count(given, "cpus-per-task").map_err(|e| at(e.to_string()))?,
        });
    }
    models.dedup();
    if models.len() > 1 {
        return Err(usage(format!(
            "heterogeneous job: its components ask for GPU models {models:?}: a heterogeneous job is one gang of \
             one model"
        )));
    }
    Ok(components)
}

/// Whether `--requeue` came after the last `--no-requeue`.
fn requeue_last(given: &Given) -> bool {
    let at = |long: &str| given.iter().rposition(|(l, _)| *l == long);
    at("requeue") > at("no-requeue")
}

/// The job's GPUs and model from `--gpus`, `--gpus-per-node`, `--gres`
/// (per node) or `--gpus-per-task`, the last given winning; a job that
/// asks for none gets one (Ebb places GPUs).
/// The options that ask for GPUs.
const GPU_OPTIONS: [&str; 4] = ["gpus", "gpus-per-node", "gres", "gpus-per-task"];

fn gpu_request(given: &Given, nodes: u32, ntasks: Option<u32>) -> Result<(Option<String>, u32), CliError> {
    let Some((long, text)) = given.iter().rev().find(|(l, _)| GPU_OPTIONS.contains(l)) else {
        if let (Some(per_gpu), Some(ntasks)) = (options::count(given, "ntasks-per-gpu")?, ntasks) {
            return Ok((None, ntasks.div_ceil(per_gpu)));
        }
        if nodes > 1 {
            return Err(usage(format!(
                "--nodes={nodes} without GPUs: Ebb places GPUs; give --gpus-per-node or --gres=gpu:N, or \
                 --exclusive for every GPU of the nodes"
            )));
        }
        return Ok((None, 1));
    };
    let (model, n) = match *long {
        "gres" => options::gres(text)?,
        _ => options::gpus(long, text)?,
    };
    let total = match *long {
        "gpus" => n,
        "gpus-per-task" => n.saturating_mul(ntasks.unwrap_or(nodes)),
        _ => n.saturating_mul(nodes),
    };
    Ok((model, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &str, script: &str) -> Result<Batch, CliError> {
        // A directory per call: the tests run at once.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("ebb-sbatch-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("train.sh");
        std::fs::write(&path, script).unwrap();
        let mut words: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        words.push(path.display().to_string());
        words.extend(["--epochs".to_string(), "3".to_string()]);
        let vars = BTreeMap::from([
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("SLURM_JOB_ID".to_string(), "99".to_string()),
            ("EBB_TOKEN".to_string(), "secret".to_string()),
        ]);
        let made = batch(&words, &mut std::io::empty(), Path::new("/home/me/project"), &vars);
        let _ = std::fs::remove_dir_all(&dir);
        made
    }

    #[test]
    fn a_two_node_script_as_a_user_writes_it() {
        let script = "#!/bin/bash\n#SBATCH --nodes=2 --gres=gpu:4\n#SBATCH --signal=B:USR1@60 --requeue\n#SBATCH -J train -t 1:00:00\n#SBATCH --mem=64G --exclusive\nsrun python train.py\n";
        let b = run("--partition=spot", script).unwrap();
        let s = &b.submission;
        let slurm = s.slurm.as_ref().unwrap();
        assert_eq!((s.gpus, slurm.nodes, s.name.as_deref()), (Some(8), Some(2), Some("train")));
        assert_eq!(
            (s.signal.as_deref(), slurm.signal_batch_only, slurm.signal_before_s),
            (Some("USR1"), true, Some(60))
        );
        assert!(slurm.routed_signal && s.exit_on_drain_is_success);
        assert_eq!(s.time_limit_s, Some(3600));
        assert_eq!(slurm.partition.as_deref(), Some("spot"));
        assert_eq!(s.argv[1..], ["--epochs", "3"]);
        assert_eq!(s.workdir.as_deref(), Some("/home/me/project"));
        assert_eq!(s.env.get("PATH").map(String::as_str), Some("/usr/bin"));
        assert!(!s.env.contains_key("SLURM_JOB_ID") && !s.env.contains_key("EBB_TOKEN"), "{:?}", s.env);
        assert_eq!(b.notes[0], "ignoring --mem=64G: Ebb does not limit memory");
        assert!(
            b.notes[1].starts_with("ignoring --exclusive: Ebb gives a gang whole nodes"),
            "{:?}",
            b.notes
        );
        assert_eq!(b.notes.len(), 2);
        assert_eq!(s.max_preemptions, None);
    }

    #[test]
    fn the_command_line_wins_over_the_script_and_bad_input_is_named() {
        let script = "#!/bin/sh\n#SBATCH --job-name=a --gpus=2 --no-requeue\necho\n";
        let b = run("-J b --chdir sub --export=NONE,X=1 --open-mode=append", script).unwrap();
        let s = &b.submission;
        assert_eq!((s.name.as_deref(), s.gpus, s.max_preemptions), (Some("b"), Some(2), Some(0)));
        assert_eq!(s.workdir.as_deref(), Some("/home/me/project/sub"));
        assert_eq!(s.env, BTreeMap::from([("X".to_string(), "1".to_string())]));
        assert!(s.slurm.as_ref().unwrap().append);
        assert!(run("", "echo no shebang\n")
            .unwrap_err()
            .to_string()
            .contains("does not look like a batch script"));
        assert_eq!(
            run("--open-mode=sometimes", script).err().unwrap().to_string(),
            "--open-mode=sometimes: expected append or truncate"
        );
        assert!(run("--nodes=2", "#!/bin/sh\n").unwrap_err().to_string().contains("without GPUs"));
        assert!(run("--gres=fpga:1", "#!/bin/sh\n").unwrap_err().to_string().contains("not \"fpga\""));
        let b = run("", "#!/bin/sh\necho\n").unwrap();
        assert_eq!(b.submission.gpus, Some(1));
        assert_eq!(b.submission.name.as_deref(), Some("train.sh"));
    }

    /// Slurm's `--nodes=MIN-MAX`: any count in the range, chosen at the
    /// start and fixed after. Ebb takes the fewest, says so once, and
    /// counts GPUs per node on that many; a range it cannot read is named.
    #[test]
    fn a_node_range_starts_on_its_fewest_fixed_after_and_says_so() {
        let b = run("--nodes=2-4 --gpus-per-node=8", "#!/bin/sh\nsrun torchrun train.py\n").unwrap();
        assert_eq!((b.submission.gpus, b.submission.max_gpus), (Some(16), None));
        assert_eq!(b.submission.slurm.as_ref().unwrap().nodes, Some(2));
        assert_eq!(b.notes.len(), 1, "{:?}", b.notes);
        assert!(b.notes[0].starts_with("--nodes=2-4: Ebb starts the job on 2 nodes, its count fixed after"));
        let b = run("-N 3-3 --gres=gpu:8", "#!/bin/sh\n").unwrap();
        assert_eq!((b.submission.gpus, b.notes.len()), (Some(24), 0));
        for bad in ["4-2", "0-2", "2-", "-2", "a-b", "2-4-6", "1-99999999999"] {
            let err =
                run(&format!("--nodes={bad} --gpus-per-node=8"), "#!/bin/sh\n").unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "--nodes={bad}: expected a count or a range MIN-MAX of positive whole numbers, MIN first"
                )
            );
        }
    }

    proptest::proptest! {
        /// Any components, any counts (none, huge, ranges), from the
        /// command line: a job whose GPUs are its components' or a clear
        /// error, never a panic.
        #[test]
        fn any_heterogeneous_command_line_is_read_or_refused(
            parts in proptest::collection::vec(
                (proptest::option::of(0u32..u32::MAX), proptest::option::of("[0-9a-z:]{0,12}"), proptest::option::of(0u32..u32::MAX)),
                1..5,
            ),
        ) {
            let mut args = String::new();
            for (k, (nodes, gres, ntasks)) in parts.iter().enumerate() {
                if k > 0 {
                    args.push_str(" : ");
                }
                if let Some(n) = nodes { args.push_str(&format!(" -N{n}")); }
                if let Some(g) = gres { args.push_str(&format!(" --gres=gpu:{g}")); }
                if let Some(n) = ntasks { args.push_str(&format!(" -n{n}")); }
            }
            if let Ok(b) = run(&args, "#!/bin/sh\n") {
                let slurm = b.submission.slurm.unwrap();
                let total = slurm.components.iter().map(|c| u64::from(c.nodes) * u64::from(c.gpus_per_node)).sum::<u64>();
                proptest::prop_assert!(slurm.components.is_empty() || total.min(u64::from(u32::MAX)) == u64::from(b.submission.gpus.unwrap()));
            }
        }
    }

    /// `--exclusive` with no GPU count takes every GPU of its nodes (the
    /// server, which knows their size, counts them); with one, it is
    /// ignored and said so, as before.
    #[test]
    fn exclusive_nodes_without_a_gpu_count_are_taken_whole() {
        let b = run("-N 4 --exclusive --ntasks-per-node=8", "#!/bin/sh\n").unwrap();
        let slurm = b.submission.slurm.as_ref().unwrap();
        assert_eq!((b.submission.gpus, slurm.whole_nodes, slurm.nodes), (None, true, Some(4)));
        assert!(b.notes.is_empty(), "{:?}", b.notes);
        let b = run("-N 2 --exclusive --gres=gpu:8", "#!/bin/sh\n").unwrap();
        let slurm = b.submission.slurm.as_ref().unwrap();
        assert_eq!((b.submission.gpus, slurm.whole_nodes), (Some(16), false));
        assert!(b.notes[0].starts_with("ignoring --exclusive: "), "{:?}", b.notes);
        assert!(run("-N 4", "#!/bin/sh\n").unwrap_err().to_string().contains("--exclusive for every GPU"));
    }

    /// `--ntasks-per-gpu`: so many tasks a GPU asked for, or GPUs enough
    /// for the tasks asked for.
    #[test]
    fn ntasks_per_gpu_gives_tasks_for_gpus_or_gpus_for_tasks() {
        let script = "#!/bin/sh\nsrun python train.py\n";
        let b = run("--gpus=4 --ntasks-per-gpu=2", script).unwrap();
        assert_eq!((b.submission.gpus, b.submission.slurm.as_ref().unwrap().ntasks), (Some(4), Some(8)));
        let b = run("--ntasks=6 --ntasks-per-gpu=4", script).unwrap();
        assert_eq!((b.submission.gpus, b.submission.slurm.as_ref().unwrap().ntasks), (Some(2), Some(6)));
        let b = run("-n 3 --gpus=1 --ntasks-per-gpu=2 --mem=1G --quiet", script).unwrap();
        assert_eq!((b.submission.gpus, b.submission.slurm.as_ref().unwrap().ntasks), (Some(1), Some(3)));
        assert!(b.notes.is_empty(), "--quiet: {:?}", b.notes);
        assert_eq!(
            run("--ntasks-per-gpu=0", script).unwrap_err().to_string(),
            "--ntasks-per-gpu=0: expected a positive whole number"
        );
    }

    /// A heterogeneous job's components, from `#SBATCH hetjob` lines or
    /// `sbatch A : B`, the command line's for each component winning:
    /// one gang of their nodes and GPUs, each component's own in order.
    #[test]
    fn a_heterogeneous_job_is_one_gang_of_its_components() {
        let script = "#!/bin/bash\n#SBATCH -J het -N1 --gres=gpu:8 -n1 -c4\n#SBATCH hetjob\n#SBATCH -N2 --gpus-per-node=8 --ntasks-per-node=8 --mem=1G\nsrun --het-group=1 train\n";
        let b = run("", script).unwrap();
        let slurm = b.submission.slurm.as_ref().unwrap();
        assert_eq!((b.submission.gpus, slurm.nodes, slurm.ntasks), (Some(24), Some(3), Some(1)));
        let parts: Vec<(u32, u32, Option<u32>, Option<u32>)> = slurm
            .components
            .iter()
            .map(|c| (c.nodes, c.gpus_per_node, c.ntasks, c.ntasks_per_node))
            .collect();
        assert_eq!(parts, [(1, 8, Some(1), None), (2, 8, None, Some(8))]);
        assert_eq!(b.notes, ["ignoring --mem=1G: Ebb does not limit memory"]);
        // The same from the command line, its second component's nodes changed there.
        let b =
            run("-N1 --gres=gpu:8 : -N3", "#!/bin/sh\n#SBATCH hetjob\n#SBATCH -N2 --gres=gpu:8\n").unwrap();
        let slurm = b.submission.slurm.as_ref().unwrap();
        assert_eq!((b.submission.gpus, slurm.components[1].nodes), (Some(32), 3));
        // What is the job's belongs in the first component.
        assert_eq!(
            run("-N1 --gres=gpu:8 : -N1 --gres=gpu:8 -p spot", "#!/bin/sh\n").unwrap_err().to_string(),
            "heterogeneous job component 1: --partition is the job's: give it in the first component"
        );
        assert!(run("--gres=gpu:a100:8 : --gres=gpu:h100:8", "#!/bin/sh\n")
            .unwrap_err()
            .to_string()
            .contains("one gang of one model"));
        assert!(run("--gres=gpu:8 : -N1-2 --gres=gpu:8", "#!/bin/sh\n")
            .unwrap_err()
            .to_string()
            .contains("fixed"));
        assert!(run("--gres=gpu:8 : -N2 --gpus=3", "#!/bin/sh\n")
            .unwrap_err()
            .to_string()
            .contains("the same GPUs"));
        // An ordinary job has none.
        assert!(run("", "#!/bin/sh\n").unwrap().submission.slurm.unwrap().components.is_empty());
    }

    #[test]
    fn wrap_and_standard_input_are_scripts_too() {
        let vars = BTreeMap::new();
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let b = batch(&words("--wrap=hostname --parsable"), &mut std::io::empty(), Path::new("/"), &vars)
            .unwrap();
        assert!(b.parsable);
        assert!(b.submission.slurm.unwrap().script.ends_with("\nhostname\n"));
        let mut stdin = "#!/bin/sh\n#SBATCH -J piped\necho hi\n".as_bytes();
        let b = batch(&[], &mut stdin, Path::new("/"), &vars).unwrap();
        assert_eq!(b.submission.name.as_deref(), Some("piped"));
        assert_eq!(b.submission.argv, ["sbatch"]);
    }
}
