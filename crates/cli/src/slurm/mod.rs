//! Slurm's front door: `sbatch`, `srun`, `squeue`, `scancel`, `sacct`,
//! `scontrol` and `sinfo`, answered by this binary under those names
//! (`ebb slurm install DIR` makes the links; every Slurm job finds them on
//! its `PATH`). They take the server and token as `ebb` does
//! (`EBB_SERVER`, `EBB_TOKEN`, the config file) and print what Slurm
//! prints. What is honoured, ignored and different: `docs/slurm.md`.

mod attached;
mod fields;
mod json;
mod options;
mod pyxis;
mod query;
mod remote;
mod sbatch;
mod scontrol;
mod sinfo;
#[cfg(test)]
mod skypilot;
mod srun;
mod step;
mod steps;
mod table;

use std::collections::BTreeMap;
use std::process::ExitCode;

use ebb_api as api;

use crate::client::{Client, Connection};

pub use pyxis::enter::main as enter_container;
pub use remote::StepError;
pub use step::batch as batch_step;

use crate::error::{failed, file, usage, CliError};
/// The names this binary answers to as Slurm (the agent links them too).
use ebb_agent::slurm::COMMANDS;

/// The Slurm command this program was run as, if it was.
pub fn called_as(argv0: &str) -> Option<&'static str> {
    let name = std::path::Path::new(argv0).file_name()?.to_str()?;
    COMMANDS.into_iter().find(|c| *c == name)
}

/// Runs Slurm command `name` with `args` (after the command's name), as
/// Slurm's would: `NAME: error: ...` and exit 1 on failure.
pub fn main(name: &str, args: Vec<String>) -> ExitCode {
    // The command line first: a bad option is named before the server is
    // looked for; `--help`, `--usage` and `--version` are answered here.
    if let Some(command) = options::Command::ALL.into_iter().find(|c| c.name() == name) {
        match options::parse(command, &args, "") {
            Err(e) => return fail(name, &e.to_string()),
            Ok((given, _)) => {
                if let Some(text) = query::answered(command, &given) {
                    print!("{text}");
                    return ExitCode::SUCCESS;
                }
            }
        }
    }
    // srun into a running job from outside it: the server says where.
    let attaching = match name {
        "srun" => srun::attaching(&args),
        _ => Ok(None),
    };
    match attaching {
        Err(e) => return fail(name, &e.to_string()),
        Ok(Some(id)) => return attach(&id, &args),
        Ok(None) => {}
    }
    // srun in a job's step is the job's own process: no runtime, no server.
    if name == "srun" && srun::inside() {
        return match srun::in_allocation(&args) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => fail(name, &e.to_string()),
        };
    }
    if name == "scontrol"
        && args.first().map(String::as_str) == Some("show")
        && args.get(1).map(String::as_str) == Some("hostnames")
    {
        return match scontrol::hostnames(&args[2..]) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(name, &e.to_string()),
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(name, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(run(name, &args)) {
        Ok(Done::Print(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Done::Exit(code)) => ExitCode::from(code),
        Err(e) => fail(name, &e.to_string()),
    }
}

/// `srun --jobid=ID ...` from outside job ID: the job's step access from
/// the server, then the step (synchronous: threads, no runtime).
fn attach(id: &str, args: &[String]) -> ExitCode {
    let fetched = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the runtime: {e}")))
        .and_then(|runtime| {
            runtime.block_on(async {
                let id: u64 = id.parse().map_err(|_| usage(format!("--jobid={id}: expected a job id")))?;
                let access: api::StepAccess = client()?.get(&format!("/v1/jobs/{id}/steps")).await?;
                Ok::<_, CliError>(access)
            })
        });
    match fetched.and_then(|access| srun::attached(args, access)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => fail("srun", &e.to_string()),
    }
}

fn fail(name: &str, message: &str) -> ExitCode {
    for line in message.lines() {
        eprintln!("{name}: error: {}", crate::shown::terminal_safe(line));
    }
    ExitCode::FAILURE
}

enum Done {
    Print(String),
    Exit(u8),
}

/// The server's client, from `EBB_SERVER`, `EBB_TOKEN`, `EBB_CA` and the
/// config file, as every `ebb` command finds them.
fn client() -> Result<Client, CliError> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let connection =
        Connection { server: var("EBB_SERVER"), token: var("EBB_TOKEN"), ca: var("EBB_CA").map(Into::into) };
    // These commands take no --server or --token: say what they read.
    connection.client().map_err(|e| match &e {
        CliError::Usage(text) if text.starts_with("no server:") => usage(
            "no server: set EBB_SERVER (e.g. http://127.0.0.1:7300), or put \"server\" in ~/.config/ebb/config.json",
        ),
        CliError::Usage(text) if text.starts_with("no token:") => {
            usage("no token: set EBB_TOKEN, or put \"token\" in ~/.config/ebb/config.json")
        }
        _ => e,
    })
}

async fn run(name: &str, args: &[String]) -> Result<Done, CliError> {
    match name {
        "sbatch" => submit(args).await,
        "srun" => allocate_and_run(args).await,
        "squeue" => Ok(Done::Print(query::squeue(&client()?, args).await?)),
        "sacct" => Ok(Done::Print(query::sacct(&client()?, args).await?)),
        "scancel" => scancel(args).await.map(Done::Print),
        "scontrol" => scontrol::scontrol(args).await.map(Done::Print),
        "sinfo" => sinfo(args).await.map(Done::Print),
        other => Err(usage(format!("{other} is not a Slurm command Ebb answers to"))),
    }
}

fn vars() -> BTreeMap<String, String> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

async fn submit(args: &[String]) -> Result<Done, CliError> {
    let cwd = std::env::current_dir().map_err(|e| usage(format!("the current directory: {e}")))?;
    let mut batch = sbatch::batch(args, &mut std::io::stdin().lock(), &cwd, &vars())?;
    for note in &batch.notes {
        eprintln!("sbatch: {note}");
    }
    let client = client()?;
    if let Some(after) = batch.submission.after.take() {
        batch.submission.after = Some(task_ids(&client, &after).await?);
    }
    let submitted: api::Submitted = client.post("/v1/jobs", &batch.submission).await?;
    Ok(Done::Print(match batch.parsable {
        true => format!("{}\n", submitted.id),
        false => format!("Submitted batch job {}\n", submitted.id),
    }))
}

/// A `--dependency` with Slurm's array tasks (`12_3`) as their job ids;
/// an array's own id stands for all its tasks (the server's rule).
async fn task_ids(client: &Client, dependency: &str) -> Result<String, CliError> {
    let mut parts = Vec::new();
    for part in dependency.split(',') {
        let mut words: Vec<String> = Vec::new();
        for (i, word) in part.split(':').enumerate() {
            match (i, word.split_once('_')) {
                (0, _) | (_, None) => words.push(word.to_string()),
                (_, Some(_)) => {
                    let jobs = query::jobs_named(client, word).await.map_err(|e| match e {
                        CliError::Usage(why) => usage(format!("--dependency={dependency}: {why}")),
                        other => other,
                    })?;
                    words.extend(jobs.iter().map(|j| j.id.to_string()));
                }
            }
        }
        parts.push(words.join(":"));
    }
    Ok(parts.join(","))
}

/// `srun` outside an allocation: a job of one step, whose output is
/// followed here; `srun` ends as the step did.
async fn allocate_and_run(args: &[String]) -> Result<Done, CliError> {
    let (given, program) = options::parse(options::Command::Srun, args, "")?;
    if program.is_empty() {
        return Err(usage("no program to run (srun [options] PROGRAM [ARGS...])"));
    }
    if options::last(&given, "het-group").is_some() {
        return Err(usage(
            "--het-group: names a component of the heterogeneous job srun runs in; outside a job, submit one \
             with sbatch (#SBATCH hetjob)",
        ));
    }
    if program.iter().any(|w| w == ":") {
        return Err(usage(
            "srun A : B runs in a heterogeneous job: submit one with sbatch (#SBATCH hetjob) and run srun A : B \
             in its script",
        ));
    }
    // The allocation's options go to sbatch; the step takes them all.
    let quoted: Vec<String> =
        args.iter().map(|a| shlex::try_quote(a).map(|q| q.into_owned()).unwrap_or_default()).collect();
    let mut sbatch_args: Vec<String> = Vec::new();
    for (long, value) in &given {
        let passes = [
            "job-name",
            "nodes",
            "ntasks",
            "ntasks-per-node",
            "gpus",
            "gpus-per-node",
            "gres",
            "gpus-per-task",
            "cpus-per-task",
            "time",
            "partition",
            "chdir",
            "export",
            "signal",
        ];
        if passes.contains(long) {
            sbatch_args.push(format!("--{long}={value}"));
        }
    }
    if options::last(&given, "job-name").is_none() {
        let name = std::path::Path::new(&program[0])
            .file_name()
            .map_or(program[0].clone(), |n| n.to_string_lossy().into_owned());
        sbatch_args.push(format!("--job-name={name}"));
    }
    sbatch_args.push(format!("--wrap=exec srun {}", quoted.join(" ")));
    sbatch_args.extend(["--output=/dev/stdout".to_string(), "--error=/dev/stderr".to_string()]);
    let cwd = std::env::current_dir().map_err(|e| usage(format!("the current directory: {e}")))?;
    let batch = sbatch::batch(&sbatch_args, &mut std::io::empty(), &cwd, &vars())?;
    let client = client()?;
    let submitted: api::Submitted = client.post("/v1/jobs", &batch.submission).await?;
    let id = submitted.id;
    eprintln!("srun: job {id} queued and waiting for resources");
    let mut offset = 0u64;
    loop {
        let path = format!("/v1/jobs/{id}/logs");
        let offset_text = offset.to_string();
        let chunk: api::LogChunk =
            client.get_query(&path, &[("offset", offset_text.as_str()), ("follow", "true")]).await?;
        print!("{}", chunk.data);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        offset = chunk.next_offset;
        if chunk.finished {
            break;
        }
    }
    let job: api::Job = client.get(&format!("/v1/jobs/{id}")).await?;
    Ok(Done::Exit(match (job.state.as_str(), job.exit_code) {
        ("succeeded", _) => 0,
        (_, Some(code)) => u8::try_from(code).unwrap_or(1).max(1),
        _ => 1,
    }))
}

async fn scancel(args: &[String]) -> Result<String, CliError> {
    let (given, words) = options::parse(options::Command::Scancel, args, "")?;
    query::say_ignored(options::Command::Scancel, &given);
    let all: Vec<&str> = words.iter().flat_map(|w| w.split(',')).filter(|s| !s.is_empty()).collect();
    let filter = query::Filter::from(&given)?;
    // Named before anything is signalled: a wrong name signals nothing.
    let signal = options::last(&given, "signal")
        .map(|name| srun::signal_named(name).ok_or_else(|| usage(format!("Unknown job signal: {name}"))))
        .transpose()?;
    let client = client()?;
    let (mut ids, mut stepped) = (Vec::new(), false);
    for id in all {
        match steps::step_id(id)? {
            Some((job, step)) => {
                let signal =
                    signal.map_or(steps::StepSignal::End, |s| steps::StepSignal::Signal { signo: s as i32 });
                cancel_step(&client, id, (job, step), signal).await?;
                stepped = true;
            }
            None => ids.push(id),
        }
    }
    let (mut jobs, mut ended) = (Vec::new(), Vec::new());
    let active = ["queued", "starting", "running", "draining"];
    for id in &ids {
        let named = query::jobs_named(&client, id).await?;
        // A job that has ended is said to have, as Slurm says it.
        if !named.is_empty() && !named.iter().any(|j| active.contains(&j.state.as_str())) {
            ended.push(format!("Kill job error on job id {id}: Job/step already completing or completed"));
        }
        jobs.extend(named);
    }
    if ids.is_empty() && stepped {
        return Ok(String::new()); // steps alone
    }
    if ids.is_empty() {
        if !filter.narrows() && !options::flag(&given, "me") {
            return Err(usage("No job identification provided"));
        }
        jobs = query::list(&client, "active").await?;
    }
    jobs.retain(|j| filter.keeps(j));
    jobs.retain(|j| active.contains(&j.state.as_str()));
    if let Some(signal) = options::last(&given, "signal").filter(|_| signal.is_some()) {
        for job in &jobs {
            let request = api::SignalRequest {
                signal: signal.to_string(),
                batch_only: options::flag(&given, "batch"),
                full: options::flag(&given, "full"),
            };
            let _: api::Job = client.post(&format!("/v1/jobs/{}/signal", job.id), &request).await?;
        }
        return Ok(String::new());
    }
    for job in &jobs {
        let request = api::CancelRequest { grace_ms: None };
        let _: api::Job = client.post(&format!("/v1/jobs/{}/cancel", job.id), &request).await?;
    }
    match ended.is_empty() {
        true => Ok(String::new()),
        false => Err(usage(ended.join("\nscancel: error: "))),
    }
}

/// `scancel JOB.STEP`: the step's tasks on every node of the job get
/// `--signal`'s signal, or, without it, end (SIGTERM, then SIGKILL after
/// Slurm's `KillWait`); the job goes on.
async fn cancel_step(
    client: &Client,
    id: &str,
    (job, step): (&str, u32),
    signal: steps::StepSignal,
) -> Result<(), CliError> {
    let job: u64 = job.parse().map_err(|_| usage(format!("Invalid job id specified: {id}")))?;
    let gone =
        || usage(format!("Kill job error on job step id {id}: Job/step already completing or completed"));
    let Some(access) = steps::access(client, job).await? else { return Err(gone()) };
    match steps::signal(&access, step, signal)? {
        true => Ok(()),
        false => Err(gone()),
    }
}

async fn sinfo(args: &[String]) -> Result<String, CliError> {
    sinfo::sinfo(&client()?, args).await
}

/// `ebb slurm install DIR`: links to this program under the Slurm
/// commands' names, in `DIR` (made if missing).
pub fn install(dir: &std::path::Path) -> Result<String, CliError> {
    let exe = std::env::current_exe().map_err(|e| failed(format!("cannot find this program: {e}")))?;
    std::fs::create_dir_all(dir).map_err(file(dir))?;
    let mut out = String::new();
    for name in COMMANDS {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(meta) if meta.file_type().is_symlink() => std::fs::remove_file(&link).map_err(file(&link))?,
            Ok(_) => {
                return Err(usage(format!(
                    "{}: exists and is not a link Ebb made; not replaced",
                    link.display()
                )))
            }
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&exe, &link).map_err(file(&link))?;
        out.push_str(&format!("{} -> {}\n", link.display(), exe.display()));
    }
    out.push_str(&format!("put {} first on PATH to use them\n", dir.display()));
    Ok(out)
}
