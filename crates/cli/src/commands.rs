//! The user commands: submit, jobs, show, logs, cancel, nodes, drain,
//! reclaim, tenant. Each prints a table for people, or with `--json` the
//! API's JSON for scripts.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use clap::{Args, Parser, Subcommand};
use ebb_api as api;
use ebb_core::{count, Span};

use crate::client::Connection;

#[derive(Args, Clone, Debug, Default)]
pub struct SubmitArgs {
    /// preemptible (default), on-demand or reserved.
    #[arg(long)]
    pub tier: Option<String>,
    /// Whole GPUs (default 1).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// GPU model (default: any).
    #[arg(long)]
    pub gpu_model: Option<String>,
    /// A name to tell the job by (`ebb jobs`, `ebb show`).
    #[arg(long)]
    pub name: Option<String>,
    /// Signal sent at the drain notice (default TERM), like Slurm's --signal.
    #[arg(long)]
    pub signal: Option<String>,
    /// Give up after this many preemptions.
    #[arg(long)]
    pub max_preemptions: Option<u32>,
    /// When a preemptible job must be done (2026-12-01T18:00Z): it stays
    /// preemptible while its reported progress fits before then, and moves
    /// to on-demand (billed at that rate from then on) once it would not.
    #[arg(long, value_name = "TIME")]
    pub deadline: Option<String>,
    /// Retries after failures (preemptions do not count).
    #[arg(long)]
    pub max_retries: Option<u32>,
    /// Environment variable for the job, K=V; repeatable. Wins over
    /// what --export takes.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The submitter's environment the job gets, as sbatch's --export:
    /// ALL (the default: every variable but EBB_*, CUDA_VISIBLE_DEVICES,
    /// HOME, USER, LOGNAME and the shell's PWD, OLDPWD, SHLVL, _), NONE,
    /// or a list VAR,VAR=VALUE,... of only those. Ebb's own variables
    /// always win.
    #[arg(long, value_name = "ALL|NONE|VAR,...")]
    pub export: Option<String>,
    /// The job's working directory on the node (default: the directory
    /// ebb submit runs in). A relative one is taken from there.
    #[arg(long, visible_alias = "workdir", value_name = "DIR")]
    pub chdir: Option<String>,
    /// An array of tasks A-B, each with EBB_TASK_INDEX.
    #[arg(long, value_name = "A-B")]
    pub array: Option<String>,
    /// A sweep parameter, NAME=V1,V2,...; repeatable. One task per
    /// combination, each with EBB_PARAM_<NAME> and EBB_PARAMS (JSON).
    #[arg(long = "sweep", value_name = "NAME=V1,V2")]
    pub sweep: Vec<String>,
    /// `always`: run again after every exit but a cancel (services).
    #[arg(long, value_name = "never|always")]
    pub restart: Option<String>,
    /// Exit code 0 during a drain counts as success without the SDK's marker.
    #[arg(long)]
    pub exit_on_drain_is_success: bool,
    /// Run the job in this OCI image: HOST[:PORT]/NAME:TAG or
    /// HOST[:PORT]/NAME@sha256:DIGEST. The server resolves a tag to its
    /// digest at submit; every attempt runs that digest. The command runs
    /// inside it (its entrypoint is not used), in --chdir if given (a path
    /// in the image), else in a fresh directory of the job's.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Print one line {"id": N, "ids": [...]} instead of text: the job
    /// (an array's first task) and every job made.
    #[arg(long)]
    pub json: bool,
    /// The program and its arguments, or a job script whose `#EBB` lines
    /// carry the flags above. It starts after `--` or at the first word
    /// that is not one of the flags above; an unknown flag before it is an
    /// error.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `#EBB --gpus 2` lines of a job script, parsed like command-line flags.
#[derive(Parser)]
struct ScriptFlags {
    #[command(flatten)]
    flags: SubmitArgs,
}

/// The flags of a job script's `#EBB` lines, in order: each line split as
/// a shell would (quotes, `\` escapes, a `# comment` at its end). An
/// unknown or malformed flag is an error naming the script's line.
fn script_flags(path: &Path) -> Result<Option<SubmitArgs>, String> {
    let Ok(text) = std::fs::read(path) else { return Ok(None) };
    let text = String::from_utf8_lossy(&text);
    let parse = |words: &[String]| {
        let mut argv = vec!["#EBB".to_string()];
        argv.extend(words.iter().cloned());
        argv.extend(["--".to_string(), path.display().to_string()]);
        ScriptFlags::try_parse_from(&argv).map(|s| s.flags)
    };
    let mut words = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("#EBB") else { continue };
        let at = || format!("{}:{}: {}", path.display(), number + 1, line.trim());
        if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
            return Err(format!("{}: a directive is `#EBB --flag value`", at()));
        }
        let line_words = shlex::split(rest).ok_or_else(|| format!("{}: an unclosed quote", at()))?;
        if let Err(e) = parse(&line_words) {
            let message = e.render().to_string();
            let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
            let tip =
                message.lines().find(|l| l.trim().starts_with("tip:")).map(|l| format!(" ({})", l.trim()));
            return Err(format!(
                "{}: {}{}",
                at(),
                first.trim_start_matches("error: "),
                tip.unwrap_or_default()
            ));
        }
        words.extend(line_words);
    }
    if words.is_empty() {
        return Ok(None);
    }
    parse(&words)
        .map(Some)
        .map_err(|e| format!("{}: #EBB lines: {}", path.display(), e.render().to_string().trim()))
}

/// Builds the submission: a job script's `#EBB` flags first, the command
/// line's over them.
pub fn submission(args: &SubmitArgs) -> Result<api::JobSubmission, String> {
    let mut argv = args.command.clone();
    let script = Path::new(&argv[0]);
    let from_script = if argv.len() == 1 && script.is_file() { script_flags(script)? } else { None };
    if from_script.is_some() || (argv.len() == 1 && script.is_file()) {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(script).map(|m| m.permissions().mode()).unwrap_or(0);
        if mode & 0o111 == 0 {
            return Err(format!("job script {} is not executable (chmod +x it)", script.display()));
        }
        let absolute = std::fs::canonicalize(script).map_err(|e| format!("{}: {e}", script.display()))?;
        argv = vec![absolute.display().to_string()];
    }
    let base = from_script.unwrap_or_default();
    let mut sweep = Vec::new();
    for param in base.sweep.iter().chain(&args.sweep) {
        let (name, values) =
            param.split_once('=').ok_or_else(|| format!("--sweep {param}: expected NAME=V1,V2,..."))?;
        let values: Vec<String> = values.split(',').map(str::to_string).collect();
        if values.iter().any(String::is_empty) {
            return Err(format!("--sweep {param}: empty value"));
        }
        sweep.push(api::SweepParam { name: name.to_string(), values });
    }
    let image = args.image.clone().or(base.image);
    let chdir = args.chdir.as_deref().or(base.chdir.as_deref());
    // In an image, the directory is the image's, not this machine's.
    let workdir = match (&image, chdir) {
        (Some(_), Some(dir)) if !dir.starts_with('/') => {
            return Err(format!("--chdir {dir}: in an image, give an absolute path inside it"));
        }
        (Some(_), dir) => dir.map(str::to_string),
        (None, dir) => Some(workdir(dir)?),
    };
    let export = args.export.as_deref().or(base.export.as_deref()).unwrap_or("ALL");
    let mut env = exported(export, std::env::vars_os())?;
    for pair in base.env.iter().chain(&args.env) {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("--env {pair}: expected K=V"))?;
        env.insert(k.to_string(), v.to_string());
    }
    Ok(api::JobSubmission {
        name: args.name.clone().or(base.name),
        tier: args.tier.clone().or(base.tier),
        gpus: args.gpus.or(base.gpus),
        gpu_model: args.gpu_model.clone().or(base.gpu_model),
        argv,
        env,
        workdir,
        signal: args.signal.clone().or(base.signal),
        max_preemptions: args.max_preemptions.or(base.max_preemptions),
        max_retries: args.max_retries.or(base.max_retries),
        exit_on_drain_is_success: args.exit_on_drain_is_success || base.exit_on_drain_is_success,
        array: args.array.clone().or(base.array),
        restart: args.restart.clone().or(base.restart),
        sweep,
        deadline: args.deadline.as_deref().or(base.deadline.as_deref()).map(with_seconds),
        image,
        image_digest: None,
    })
}

/// `2026-12-01T18:00Z` as the API spells it, `2026-12-01T18:00:00Z`: a
/// time given to the minute gets its seconds.
fn with_seconds(text: &str) -> String {
    let text = text.trim();
    let b = text.as_bytes();
    let to_the_minute =
        b.len() >= 16 && matches!(b[10], b'T' | b' ') && b[13] == b':' && b.get(16) != Some(&b':');
    match to_the_minute {
        true => format!("{}:00{}", &text[..16], &text[16..]),
        false => text.to_string(),
    }
}

/// Variables `--export ALL` leaves out: Ebb's own (and the CLI's token),
/// the GPUs Ebb assigns, who runs the job (the node's user for the
/// tenant), and the submitting shell's bookkeeping.
fn not_exported(name: &str) -> bool {
    name.starts_with("EBB_")
        || ["CUDA_VISIBLE_DEVICES", "HOME", "USER", "LOGNAME", "PWD", "OLDPWD", "SHLVL", "_"].contains(&name)
}

/// A name a job's environment can carry: what the server accepts.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The submitter's variables the job gets, for `--export`.
fn exported(
    mode: &str,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<BTreeMap<String, String>, String> {
    let vars: BTreeMap<String, String> =
        vars.filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    match mode {
        all if all.eq_ignore_ascii_case("all") => {
            Ok(vars.into_iter().filter(|(k, _)| valid_name(k) && !not_exported(k)).collect())
        }
        none if none.eq_ignore_ascii_case("none") => Ok(BTreeMap::new()),
        list => {
            let mut env = BTreeMap::new();
            for item in list.split(',') {
                let (name, value) = match item.split_once('=') {
                    Some((name, value)) => (name, value.to_string()),
                    None => {
                        let value = vars.get(item).ok_or_else(|| {
                            format!("--export {item}: not set here (ALL, NONE, or VAR,VAR=VALUE,...)")
                        })?;
                        (item, value.clone())
                    }
                };
                if !valid_name(name) {
                    return Err(format!(
                        "--export {item}: {name:?} is not a variable name (ALL, NONE, or VAR,VAR=VALUE,...)"
                    ));
                }
                env.insert(name.to_string(), value);
            }
            Ok(env)
        }
    }
}

/// The job's working directory: `--chdir` made absolute, or where the
/// submitter is.
fn workdir(chdir: Option<&str>) -> Result<String, String> {
    let here =
        std::env::current_dir().map_err(|e| format!("the current directory: {e} (pass --chdir DIR)"))?;
    let dir = match chdir {
        Some(dir) => here.join(dir),
        None => here,
    };
    dir.into_os_string().into_string().map_err(|d| format!("--chdir {}: not UTF-8", d.to_string_lossy()))
}

#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum TenantCommand {
    /// List the tenants: their working tokens, unfinished jobs and
    /// reservations not yet ended.
    List(JsonFlag),
    /// Create a tenant and print its token (shown once).
    Create {
        /// 1 to 64 letters, digits, `-` or `_`.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Show a tenant's limits and usage; with a flag, set its own limits
    /// (admin). Unset ones follow the server's defaults.
    Limits {
        /// The tenant.
        name: String,
        /// Unfinished jobs (queued, waiting or running).
        #[arg(long, value_name = "N")]
        max_jobs: Option<u64>,
        /// Jobs admitted to the scheduler at once.
        #[arg(long, value_name = "N")]
        max_running_jobs: Option<u64>,
        /// Bytes of arguments and environments its unfinished jobs may keep.
        #[arg(long, value_name = "BYTES")]
        max_stored_bytes: Option<u64>,
        /// Drop the tenant's own limits: the server's defaults apply.
        #[arg(long, conflicts_with_all = ["max_jobs", "max_running_jobs", "max_stored_bytes"])]
        defaults: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Give the login a tenant's images are pulled from REGISTRY with
    /// (the tenant's own token or an operator's). The password is read
    /// from standard input, never from the command line.
    RegistryLogin {
        /// The tenant.
        name: String,
        /// The registry: HOST or HOST:PORT, as image references begin.
        registry: String,
        /// The user name the registry knows.
        #[arg(long, short = 'u')]
        username: String,
        /// Read the password from standard input (the only way).
        #[arg(long, required = true)]
        password_stdin: bool,
    },
    /// Remove a tenant's login for REGISTRY.
    RegistryLogout {
        /// The tenant.
        name: String,
        /// The registry: HOST or HOST:PORT.
        registry: String,
    },
    /// List the registries a tenant has logins for.
    RegistryLogins {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// A tenant's tokens: rotate or revoke.
    Token {
        #[command(subcommand)]
        command: TenantTokenCommand,
    },
}

#[derive(Subcommand)]
pub enum TenantTokenCommand {
    /// Issue a new token (shown once) and revoke every older one.
    Rotate {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Revoke every token of the tenant.
    Revoke {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
}

#[derive(Subcommand)]
pub enum NodesCommand {
    /// Take a node out: revoke its credential at once and requeue its
    /// attempts as lost. It may join again with the join token.
    Remove {
        /// The node's name, as `ebb nodes` lists it.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// The agents' join token.
    JoinToken {
        #[command(subcommand)]
        command: JoinTokenCommand,
    },
}

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Issue a new join token (written to the server's join.token and
    /// printed); the old one is refused at once, joined nodes keep working.
    Rotate {
        #[command(flatten)]
        out: JsonFlag,
    },
}

fn json<T: serde::Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("serialisable");
    text.push('\n');
    text
}

pub async fn submit(conn: &Connection, args: &SubmitArgs) -> Result<String, String> {
    let spec = submission(args)?;
    let submitted: api::Submitted = conn.client()?.post("/v1/jobs", &spec).await?;
    Ok(if args.json {
        // One line, for scripts: the job (or an array's first task) and
        // every job made.
        let ids = if submitted.ids.is_empty() { vec![submitted.id] } else { submitted.ids.clone() };
        format!("{}\n", serde_json::json!({ "id": submitted.id, "ids": ids }))
    } else if submitted.ids.is_empty() {
        format!("submitted job {}\n", submitted.id)
    } else {
        let (first, last) = (submitted.ids[0], submitted.ids[submitted.ids.len() - 1]);
        format!("submitted {} tasks: jobs {first}-{last}\n", submitted.ids.len())
    })
}

#[derive(Args)]
pub struct JobsArgs {
    /// Only jobs in these states, comma-separated: queued, starting,
    /// running, draining, succeeded, failed, cancelled; active = the
    /// unfinished four. An array is listed when any task matches.
    #[arg(long, value_name = "STATE[,STATE...]")]
    pub state: Option<String>,
    /// Only jobs of this tier.
    #[arg(long, value_parser = ["reserved", "on-demand", "preemptible"])]
    pub tier: Option<String>,
    /// Only jobs whose name contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,
    /// A row per task of an array instead of one per array.
    #[arg(long)]
    pub expand: bool,
    /// The newest N jobs (default: 100 in the table, every job with --json).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000), conflicts_with = "all")]
    pub limit: Option<u64>,
    /// Every job, however many.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub out: JsonFlag,
}

/// Rows the table shows unless asked for more.
const JOBS_SHOWN: u64 = 100;

pub async fn jobs(conn: &Connection, args: &JobsArgs) -> Result<String, String> {
    let client = conn.client()?;
    // The table collapses arrays and shows the newest rows; --json gives
    // every matching job record.
    let collapse = !args.out.json && !args.expand;
    let limit = match (args.all, args.limit) {
        (true, _) => None,
        (false, Some(n)) => Some(n),
        (false, None) => (!args.out.json).then_some(JOBS_SHOWN),
    };
    let mut query: Vec<(&str, String)> =
        vec![("order", "desc".into()), ("arrays", if collapse { "collapse" } else { "expand" }.into())];
    for (key, value) in [("state", &args.state), ("tier", &args.tier), ("name", &args.name)] {
        if let Some(value) = value {
            query.push((key, value.clone()));
        }
    }
    let mut jobs: Vec<api::Job> = Vec::new();
    let mut cursor: Option<u64> = None;
    let more = loop {
        let wanted = limit.map_or(500, |l| (l - jobs.len() as u64).min(500));
        let mut page_query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (cursor_text, limit_text) = (cursor.map(|c| c.to_string()), wanted.to_string());
        page_query.push(("limit", &limit_text));
        if let Some(c) = &cursor_text {
            page_query.push(("cursor", c));
        }
        let page: api::JobPage = client.get_query("/v1/jobs", &page_query).await?;
        jobs.extend(page.jobs);
        match page.next_cursor {
            Some(next) if limit.is_none_or(|l| (jobs.len() as u64) < l) => cursor = Some(next),
            next => break next.is_some(),
        }
    };
    jobs.reverse(); // oldest first, the newest beside the prompt
    if args.out.json {
        return Ok(json(&jobs));
    }
    let mut text = job_table(&jobs, crate::now_ms());
    if more {
        writeln!(text, "(the newest {}; --limit N or --all for more)", jobs.len()).unwrap();
    }
    Ok(text)
}

/// The jobs as an aligned table, one row per job or collapsed array.
fn job_table(jobs: &[api::Job], now_ms: u64) -> String {
    use comfy_table::{presets::NOTHING, CellAlignment, Table};
    let mut table = Table::new();
    table
        .load_style(NOTHING)
        .set_header(["ID", "NAME", "TENANT", "TIER", "GPUS", "STATE", "ATTEMPT", "AGE", "NODE", "REASON"]);
    for j in jobs {
        let mut name = j.name.clone().unwrap_or_else(|| j.argv.join(" "));
        let (id, state) = match (&j.array, &j.progress) {
            (Some(a), Some(p)) => {
                // The array's name, without its first task's "[0]".
                if let Some((base, _)) = name.strip_suffix(']').and_then(|n| n.rsplit_once('[')) {
                    name = base.to_string();
                }
                (
                    format!("{}-{}", a.id, a.id + a.tasks.saturating_sub(1)),
                    format!("{}/{} done", p.done, p.total),
                )
            }
            _ => (j.id.to_string(), j.state.clone()),
        };
        let node = j.placement.iter().map(|p| p.node.as_str()).collect::<Vec<_>>().join(",");
        table.add_row([
            id,
            truncate(&name, 32),
            j.tenant.clone(),
            j.tier.clone(),
            j.gpus.to_string(),
            state,
            attempt(j),
            humantime::parse_rfc3339(&j.submitted_at)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or_else(|| "?".into(), |t| Span(now_ms.saturating_sub(t.as_millis() as u64)).human()),
            if node.is_empty() { "-".into() } else { node },
            j.pending_reason.map_or_else(|| "-".into(), |r| r.to_string()),
        ]);
    }
    for column in [0, 4, 6, 7] {
        if let Some(c) = table.column_mut(column) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut text = table.trim_fmt();
    text.push('\n');
    text
}

/// The attempt a job runs as, or for a queued job that has run before,
/// the attempt it will run as next ("3 next").
fn attempt(job: &api::Job) -> String {
    match (job.state.as_str(), job.attempt) {
        ("queued", 0) => "-".into(),
        ("queued", n) => format!("{} next", n + 1),
        (_, n) => n.to_string(),
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        text.chars().take(max - 1).chain(['…']).collect()
    }
}

pub async fn show(conn: &Connection, id: u64, out: &JsonFlag) -> Result<String, String> {
    let job: api::Job = conn.client()?.get(&format!("/v1/jobs/{id}")).await?;
    if out.json {
        return Ok(json(&job));
    }
    let mut text = String::new();
    match &job.name {
        Some(name) => writeln!(text, "job {}  {name}", job.id),
        None => writeln!(text, "job {}", job.id),
    }
    .unwrap();
    writeln!(text, "  state        {}", job.state).unwrap();
    if let (Some(code), Some(why)) = (&job.pending_reason, &job.pending_detail) {
        writeln!(text, "  waiting      {why} ({code})").unwrap();
    }
    writeln!(
        text,
        "  tier         {}  ({}{})",
        job.tier,
        count(u64::from(job.gpus), "GPU"),
        job.gpu_model.map(|m| format!(" of {m}")).unwrap_or_default()
    )
    .unwrap();
    writeln!(text, "  tenant       {}", job.tenant).unwrap();
    writeln!(text, "  command      {}", job.argv.join(" ")).unwrap();
    if let Some(image) = &job.image {
        writeln!(text, "  image        {}  ({})", image.reference, image.digest).unwrap();
    }
    if let Some(p) = &job.pulling {
        let percent = (p.done_bytes.saturating_mul(100)).checked_div(p.total_bytes).unwrap_or(100);
        writeln!(text, "  pulling      {}, {percent}% on {}", human_bytes(p.total_bytes), p.node).unwrap();
    }
    let workdir = job.workdir.as_deref().unwrap_or("a fresh directory on its node");
    writeln!(text, "  workdir      {workdir}").unwrap();
    if !job.env.is_empty() {
        let n = job.env.len();
        writeln!(
            text,
            "  environment  {n} variable{} (ebb show {} --json lists them)",
            if n == 1 { "" } else { "s" },
            job.id
        )
        .unwrap();
    }
    writeln!(
        text,
        "  attempt      {}  (preempted {}, retried {})",
        job.attempt, job.preemptions, job.retries
    )
    .unwrap();
    for p in &job.placement {
        writeln!(text, "  placement    {}", on_gpus(&p.node, &p.gpus)).unwrap();
    }
    if let Some(code) = job.exit_code {
        writeln!(text, "  exit code    {code}").unwrap();
    }
    writeln!(text, "  submitted    {}", job.submitted_at).unwrap();
    match &job.last_checkpoint {
        Some(c) => {
            let step = c.step.map(|s| format!("step {s}, ")).unwrap_or_default();
            let bytes = c.bytes.map(|b| format!("{}, ", human_bytes(b))).unwrap_or_default();
            writeln!(
                text,
                "  checkpoint   {} ({step}{bytes}took {}, attempt {})",
                c.at,
                Span::from_secs_f64(c.seconds).human(),
                c.attempt
            )
            .unwrap();
        }
        None => writeln!(text, "  checkpoint   none reported").unwrap(),
    }
    if let Some(d) = &job.deadline {
        writeln!(text, "  deadline     {} — {}", d.deadline, d.summary).unwrap();
    }
    if let (Some(secs), Some(why)) = (job.checkpoint_interval_s, &job.checkpoint_interval_why) {
        // The interval the latest attempt was given at its start, and why
        // (the server's words, which say whether reports since are in it).
        writeln!(
            text,
            "  interval     checkpoint every {} (EBB_CHECKPOINT_INTERVAL_S={secs} for attempt {}): {why}",
            Span::from_secs(secs).human(),
            job.attempt
        )
        .unwrap();
    }
    if job.preemptions > 0 || job.lost_gpu_seconds > 0.0 {
        writeln!(
            text,
            "  lost work    {} over {}",
            gpu_time(job.lost_gpu_seconds),
            count(u64::from(job.preemptions), "preemption")
        )
        .unwrap();
    }
    for u in &job.usage {
        // A promoted attempt: each part at its own rate.
        let rates = match u.segments.as_slice() {
            [] => format!("{} GPU-s at ${}/GPU-h", u.gpu_seconds, crate::money::rate(u.rate_micro_usd)),
            parts => parts
                .iter()
                .map(|p| {
                    let gpu_seconds = p.seconds * u64::from(u.gpus);
                    format!(
                        "{gpu_seconds} GPU-s {} at ${}/GPU-h",
                        p.tier,
                        crate::money::rate(p.rate_micro_usd)
                    )
                })
                .collect::<Vec<_>>()
                .join(" + "),
        };
        writeln!(
            text,
            "  billed       attempt {}: {} x {} = {rates} = ${} ({})",
            u.attempt,
            count(u64::from(u.gpus), "GPU"),
            Span::from_secs(u.seconds).human(),
            crate::money::amount(u.amount_micro_usd),
            u.outcome
        )
        .unwrap();
    }
    if let Some(d) = &job.drill {
        for (i, line) in crate::drill::summary(d).iter().enumerate() {
            writeln!(text, "  {:<12} {line}", if i == 0 { "drill" } else { "" }).unwrap();
        }
    }
    if let Some(a) = &job.array {
        let params: Vec<String> = a.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let params = if params.is_empty() { String::new() } else { format!(" ({})", params.join(", ")) };
        writeln!(text, "  task         {} of array {} ({} tasks){params}", a.index, a.id, a.tasks).unwrap();
    }
    if let Some(p) = &job.progress {
        let states: Vec<String> = p.states.iter().map(|(s, n)| format!("{n} {s}")).collect();
        writeln!(text, "  progress     {}/{} done  ({})", p.done, p.total, states.join(", ")).unwrap();
        let mut by_state: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for t in &p.tasks {
            by_state.entry(t.state.as_str()).or_default().push(t.index);
        }
        for (state, indices) in by_state {
            writeln!(text, "    {state:<10} {}", ranges(&indices)).unwrap();
        }
    }
    writeln!(text, "events:").unwrap();
    for e in &job.events {
        let detail = describe_event(&e.event);
        writeln!(text, "  {}  #{:<3} {:<16} {}", e.at, e.attempt, e.kind(), detail).unwrap();
    }
    Ok(text)
}

/// `0-3, 7, 9-12` from sorted or unsorted indices.
fn ranges(indices: &[u64]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        parts.push(if sorted[i] == start { start.to_string() } else { format!("{start}-{}", sorted[i]) });
        i += 1;
    }
    parts.join(", ")
}

/// `node-0: GPU 3`, `node-1: GPUs 0,1,2,3`.
fn on_gpus(node: &str, gpus: &[u8]) -> String {
    let list = gpus.iter().map(u8::to_string).collect::<Vec<_>>().join(",");
    format!("{node}: {} {list}", if gpus.len() == 1 { "GPU" } else { "GPUs" })
}

/// GPU-seconds of work for people: `3ms of GPU time`, `2m 05s of GPU time`.
fn gpu_time(gpu_seconds: f64) -> String {
    format!("{} of GPU time", Span::from_secs_f64(gpu_seconds).human())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// One line of an event's details for people.
fn describe_event(event: &api::Event) -> String {
    use api::events::DrillDetail;
    use api::Event as E;
    let took = |seconds: f64| Span::from_secs_f64(seconds).human();
    let exit = |code: Option<i32>, signal: Option<i32>| match (code, signal) {
        (_, Some(signal)) => Some(format!("by signal {signal}")),
        (Some(code), _) => Some(format!("with code {code}")),
        _ => None,
    };
    match event {
        E::Submitted(d) => {
            let task = d.task.map(|t| format!(", task {t}")).unwrap_or_default();
            format!("{}, {} {}{task}", d.tier, d.gpus, if d.gpus == 1 { "GPU" } else { "GPUs" })
        }
        E::Admitted(d) => d.reason.clone(),
        E::Placed(d) => d.placement.iter().map(|p| on_gpus(&p.node, &p.gpus)).collect::<Vec<_>>().join("; "),
        E::Started(d) => format!("on {} (pid {})", d.node, d.pid),
        E::DrainNotice(d) => format!("{}; kill at {}", d.reason, d.deadline),
        E::Exited(d) => {
            let how = match exit(d.code, d.signal) {
                Some(how) => format!("on {} {how}", d.node),
                None => format!("on {} ({})", d.node, if d.vanished { "vanished" } else { "unknown status" }),
            };
            let how = match d.peak_memory_bytes {
                Some(peak) => format!("{how}, peak memory {}", human_bytes(peak)),
                None => how,
            };
            // A start that failed: the agent's words, here and not only in the log.
            match &d.start_error {
                Some(why) => format!("{how}: {why}"),
                None => how,
            }
        }
        E::Requeued(d) => {
            let why = d.why.as_ref().map(|why| format!(": {why}")).unwrap_or_default();
            match d.lost_gpu_seconds {
                Some(lost) => format!("{}{why} (lost {})", d.reason, gpu_time(lost)),
                None => format!("{}{why}", d.reason),
            }
        }
        E::Checkpoint(d) => {
            let step = d.step.map(|n| format!("step {n}, ")).unwrap_or_default();
            let bytes = d.bytes.map(|b| format!("{}, ", human_bytes(b))).unwrap_or_default();
            format!("{step}{bytes}took {}", took(d.seconds))
        }
        E::Warning(d) => d.message.clone(),
        E::Pulling(d) => {
            format!(
                "{} on {} ({})",
                human_bytes(d.total_bytes),
                d.node,
                d.digest.as_deref().unwrap_or("no digest")
            )
        }
        E::Pulled(d) => match d.downloaded_bytes {
            0 => format!("on {}: in its cache", d.node),
            n => format!("on {}: {} in {}", d.node, human_bytes(n), took(d.seconds)),
        },
        E::GangStopped(d) => d.reason.clone(),
        E::Preempting(d) => {
            let victims: Vec<String> = d.victims.iter().map(u64::to_string).collect();
            format!("victims {} (lost {})", victims.join(", "), gpu_time(d.lost_gpu_seconds))
        }
        E::Succeeded(d) => d.ran_ms.map(|ms| format!("ran {}", Span(ms).human())).unwrap_or_default(),
        E::Failed(d) => {
            let how = d.reason.clone().or_else(|| exit(d.code, d.signal)).unwrap_or_default();
            match d.lost_gpu_seconds {
                Some(lost) => format!("{how} (lost {})", gpu_time(lost)),
                None => how,
            }
        }
        E::Cancelled(d) => d.while_.as_ref().map(|w| format!("while {w}")).unwrap_or_default(),
        E::CancelRequested(d) => match (&d.deadline, d.grace_seconds) {
            (Some(deadline), Some(grace)) => format!("SIGTERM, kill at {deadline} (grace {})", took(grace)),
            _ => String::new(),
        },
        E::Drill(DrillDetail::Notice(d)) => format!(
            "notice sent to attempt {}; kill at {} (window {})",
            d.attempt,
            d.deadline,
            took(d.window_seconds)
        ),
        E::Drill(DrillDetail::Verdict(d)) => {
            let verdict = d.verdict.as_deref().unwrap_or("none");
            match d.failures.is_empty() {
                true => format!("verdict: {verdict}"),
                false => format!("verdict: {verdict}: {}", d.failures.join("; ")),
            }
        }
        E::Promoted(d) => format!(
            "to on-demand{}: {}",
            if d.running { " where it runs" } else { " in the queue" },
            d.reason
        ),
        E::Resumed(d) => match d.step {
            Some(step) => format!("from step {step}"),
            None => "from its latest checkpoint".into(),
        },
        E::Restored(d) => {
            let what = match d.step {
                Some(step) => format!("step {step}"),
                None => "the state at exit".into(),
            };
            format!(
                "{what} (attempt {}, upload {}) from the checkpoint store on {}: {} {}, {}, took {}",
                d.from_attempt,
                d.upload,
                d.node,
                d.files,
                if d.files == 1 { "file" } else { "files" },
                human_bytes(d.bytes),
                took(d.seconds)
            )
        }
    }
}

/// How `ebb logs` shows a job's output.
#[derive(Clone, Copy, Debug)]
pub struct LogView {
    /// One `LogChunk` object per line.
    pub json: bool,
    /// Control characters as escapes (a terminal, without `--raw`; see
    /// [`crate::shown`]).
    pub escape: bool,
    /// Each line of a gang's output begins with its node.
    pub label: bool,
}

/// `ebb logs`: the job's output, as `view` says.
pub async fn logs(conn: &Connection, id: u64, follow: bool, view: LogView) -> Result<(), String> {
    use std::io::Write;
    let client = conn.client()?;
    let mut offset = 0;
    let mut labels = Labels::default();
    loop {
        let path = format!("/v1/jobs/{id}/logs?offset={offset}&follow={follow}&label={}", view.label);
        let chunk: api::LogChunk = client.get(&path).await?;
        // A chunk is at most 1 MiB: without --follow, read on until the
        // log has no more.
        let last = if follow { chunk.finished } else { chunk.data.is_empty() || chunk.finished };
        let mut stdout = std::io::stdout().lock();
        // With --json: one LogChunk object per line (a log's empty end
        // only when it is all there is).
        let text = if view.json {
            format!("{}\n", serde_json::to_string(&chunk).expect("serialisable"))
        } else {
            let text = if view.label { labels.apply(&chunk) } else { chunk.data.clone() };
            match view.escape {
                true => crate::shown::terminal_safe(&text).into_owned(),
                false => text,
            }
        };
        let shown = !chunk.data.is_empty() || (view.json && (follow || offset == 0));
        if shown && stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
            return Ok(()); // the reader went away
        }
        offset = chunk.next_offset;
        if last {
            return Ok(());
        }
    }
}

/// Labels a gang's lines with their nodes, across chunks: a chunk may end
/// in the middle of a line.
#[derive(Default)]
struct Labels {
    in_line: bool,
    node: Option<String>,
}

impl Labels {
    /// `chunk`'s text with each line begun there preceded by the node whose
    /// piece of the log it starts in (`node-1: `); a job on one node's
    /// lines as they are.
    fn apply(&mut self, chunk: &api::LogChunk) -> String {
        let mut out = String::with_capacity(chunk.data.len());
        let mut offset = chunk.offset;
        for line in chunk.data.split_inclusive('\n') {
            if let Some(source) = chunk.sources.iter().take_while(|s| s.offset <= offset).last() {
                self.node = Some(source.node.clone());
            }
            if let (false, Some(node)) = (self.in_line, &self.node) {
                out.push_str(node);
                out.push_str(": ");
            }
            out.push_str(line);
            self.in_line = !line.ends_with('\n');
            offset += line.len() as u64;
        }
        out
    }
}

/// `ebb cancel ID...` and `ebb cancel --array ID`: every job named, and
/// every task of the array not yet ended, each running one with `grace`
/// (the server's default if none). Each is tried; one that cannot be
/// cancelled (already ended, not found) is said, and makes the command
/// fail once the others are done.
pub async fn cancel(
    conn: &Connection,
    ids: &[u64],
    array: Option<u64>,
    grace: Option<ebb_core::Span>,
    out: &JsonFlag,
) -> Result<String, String> {
    let client = conn.client()?;
    let mut wanted = ids.to_vec();
    if let Some(array) = array {
        let job: api::Job = client.get(&format!("/v1/jobs/{array}")).await?;
        let progress = job.progress.ok_or_else(|| format!("--array {array}: job {array} is not an array"))?;
        if job.array.as_ref().is_some_and(|a| a.id != array) {
            return Err(format!("--array {array}: job {array} is a task of array {}", job.array.unwrap().id));
        }
        let done = ["succeeded", "failed", "cancelled"];
        wanted.extend(progress.tasks.iter().filter(|t| !done.contains(&t.state.as_str())).map(|t| t.id));
    }
    if wanted.is_empty() {
        return Err("nothing to cancel: give job ids, or --array ID".into());
    }
    let request = api::CancelRequest { grace_ms: grace.map(|g| g.0) };
    let (mut text, mut jobs, mut failed) = (String::new(), Vec::new(), Vec::new());
    for id in wanted {
        match client.post::<_, api::Job>(&format!("/v1/jobs/{id}/cancel"), &request).await {
            Ok(job) => {
                let what = if job.state == "cancelled" { "cancelled" } else { "stopping" };
                writeln!(text, "job {id}: {what}").unwrap();
                jobs.push(job);
            }
            // The request itself is refused (a grace over the drain
            // window): it would be for every job.
            Err(e) if e.ends_with("(HTTP 422)") => return Err(e),
            Err(e) => failed.push(e),
        }
    }
    if out.json {
        text = json(&jobs);
    }
    match failed.is_empty() {
        true => Ok(text),
        false => {
            print!("{text}");
            Err(failed.join("\n"))
        }
    }
}

pub async fn nodes(conn: &Connection, out: &JsonFlag) -> Result<String, String> {
    let nodes: Vec<api::Node> = conn.client()?.get("/v1/nodes").await?;
    if out.json {
        return Ok(json(&nodes));
    }
    let mut text = format!(
        "{:<16} {:<10} {:<14} {:>4} {:>5} {:>5}  {}\n",
        "NODE", "STATUS", "MODEL", "GPUS", "USED", "HELD", "JOBS"
    );
    for n in nodes {
        let jobs = n.jobs.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        writeln!(
            text,
            "{:<16} {:<10} {:<14} {:>4} {:>5} {:>5}  {}",
            n.name, n.status, n.gpu_model, n.gpus, n.gpus_used, n.gpus_held, jobs
        )
        .unwrap();
        if let Some(why) = &n.unhealthy {
            writeln!(text, "  {}: unhealthy, takes no new work: {why}", n.name).unwrap();
        }
    }
    Ok(text)
}

pub async fn nodes_command(conn: &Connection, command: &NodesCommand) -> Result<String, String> {
    match command {
        NodesCommand::Remove { name, out } => {
            let removed: api::NodeRemoved = conn.client()?.delete(&format!("/v1/nodes/{name}")).await?;
            Ok(if out.json {
                json(&removed)
            } else {
                let jobs = removed.requeued.iter().map(u64::to_string).collect::<Vec<_>>();
                format!(
                    "node {}: removed; {}; {}\n",
                    removed.node,
                    if removed.credential_revoked {
                        "its credential is revoked"
                    } else {
                        "it had no credential"
                    },
                    if jobs.is_empty() {
                        "no attempts were running there".to_string()
                    } else {
                        format!("jobs requeued as lost: {}", jobs.join(", "))
                    }
                )
            })
        }
        NodesCommand::JoinToken { command: JoinTokenCommand::Rotate { out } } => {
            let rotated: api::JoinToken =
                conn.client()?.post("/v1/agent/join-token", &serde_json::json!({})).await?;
            Ok(if out.json {
                json(&rotated)
            } else {
                format!(
                    "new join token (written to {} on the server; the old one is refused from now, joined nodes \
                     keep their own credentials):\n{}\n",
                    rotated.path, rotated.token
                )
            })
        }
    }
}

pub async fn drain(conn: &Connection, node: &str, out: &JsonFlag) -> Result<String, String> {
    let n: api::Node =
        conn.client()?.post(&format!("/v1/nodes/{node}/drain"), &serde_json::json!({})).await?;
    Ok(if out.json { json(&n) } else { format!("node {}: {}\n", n.name, n.status) })
}

pub async fn undrain(conn: &Connection, node: &str, out: &JsonFlag) -> Result<String, String> {
    let n: api::Node =
        conn.client()?.post(&format!("/v1/nodes/{node}/undrain"), &serde_json::json!({})).await?;
    Ok(if out.json { json(&n) } else { format!("node {}: {}\n", n.name, n.status) })
}

pub async fn release(conn: &Connection, gpu_model: Option<String>, out: &JsonFlag) -> Result<String, String> {
    let reply: api::ReclaimReleased =
        conn.client()?.post("/v1/reclaim/release", &api::ReclaimRelease { gpu_model }).await?;
    Ok(if out.json {
        json(&reply)
    } else {
        match reply.released_limit {
            Some(limit) => format!(
                "released the reclaim of {} (preemptible work was held to {}): it may use any idle GPU again\n",
                reply.gpu_model,
                count(u64::from(limit), "GPU")
            ),
            None => format!("{}: no reclaim to release\n", reply.gpu_model),
        }
    })
}

pub async fn reclaim(
    conn: &Connection,
    gpus: u32,
    gpu_model: Option<String>,
    out: &JsonFlag,
) -> Result<String, String> {
    let reply: api::ReclaimReply =
        conn.client()?.post("/v1/reclaim", &api::ReclaimRequest { gpus, gpu_model }).await?;
    Ok(if out.json {
        json(&reply)
    } else {
        format!(
            "reclaimed {}: preemptible work may now hold at most {}\n",
            count(u64::from(gpus), &format!("{} GPU", reply.gpu_model)),
            reply.preemptible_limit
        )
    })
}

pub async fn tenant(conn: &Connection, command: &TenantCommand) -> Result<String, String> {
    match command {
        TenantCommand::List(out) => {
            let tenants: Vec<api::TenantSummary> = conn.client()?.get("/v1/tenants").await?;
            if out.json {
                return Ok(json(&tenants));
            }
            let mut text = format!(
                "{:<24} {:>6} {:>8} {:>8} {:>8} {:>12}\n",
                "TENANT", "TOKENS", "JOBS", "ADMITTED", "WAITING", "RESERVATIONS"
            );
            for t in tenants {
                writeln!(
                    text,
                    "{:<24} {:>6} {:>8} {:>8} {:>8} {:>12}",
                    t.tenant, t.tokens, t.jobs, t.admitted, t.waiting, t.reservations
                )
                .unwrap();
            }
            Ok(text)
        }
        TenantCommand::Create { name, out } => {
            let created: api::TenantCreated =
                conn.client()?.post("/v1/tenants", &api::TenantRequest { name: name.clone() }).await?;
            Ok(if out.json {
                json(&created)
            } else {
                format!("tenant {} created; its token (shown once):\n{}\n", created.tenant, created.token)
            })
        }
        TenantCommand::Limits { name, max_jobs, max_running_jobs, max_stored_bytes, defaults, out } => {
            let client = conn.client()?;
            let path = format!("/v1/tenants/{name}/limits");
            let set = api::TenantLimits {
                max_jobs: *max_jobs,
                max_running_jobs: *max_running_jobs,
                max_stored_bytes: *max_stored_bytes,
            };
            let usage: api::TenantUsage = if *defaults || set != api::TenantLimits::default() {
                client.put(&path, &set).await?
            } else {
                client.get(&path).await?
            };
            if out.json {
                return Ok(json(&usage));
            }
            Ok(format!(
                "tenant {}\n  jobs          {} unfinished of at most {} ({} admitted, {} waiting)\n  \
                 running jobs  at most {} admitted at once\n  stored        {} bytes of at most {}\n",
                usage.tenant,
                usage.jobs,
                usage.max_jobs,
                usage.admitted,
                usage.waiting,
                usage.max_running_jobs,
                usage.stored_bytes,
                usage.max_stored_bytes
            ))
        }
        TenantCommand::RegistryLogin { name, registry, username, password_stdin: _ } => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password).map_err(|e| format!("reading the password: {e}"))?;
            let password = password.trim_end_matches(['\n', '\r']).to_string();
            if password.is_empty() {
                return Err("no password on standard input".into());
            }
            let login = api::RegistryLogin { username: username.clone(), password };
            let path = format!("/v1/tenants/{name}/registry-logins/{registry}");
            let _: Vec<api::RegistryLoginInfo> = conn.client()?.put(&path, &login).await?;
            Ok(format!("tenant {name}: pulls from {registry} log in as {username}\n"))
        }
        TenantCommand::RegistryLogout { name, registry } => {
            let path = format!("/v1/tenants/{name}/registry-logins/{registry}");
            let _: Vec<api::RegistryLoginInfo> = conn.client()?.delete(&path).await?;
            Ok(format!("tenant {name}: no login for {registry}\n"))
        }
        TenantCommand::RegistryLogins { name, out } => {
            let logins: Vec<api::RegistryLoginInfo> =
                conn.client()?.get(&format!("/v1/tenants/{name}/registry-logins")).await?;
            if out.json {
                return Ok(json(&logins));
            }
            let mut text = String::new();
            for l in &logins {
                writeln!(text, "{}  {}", l.registry, l.username).unwrap();
            }
            if logins.is_empty() {
                text = format!("tenant {name} has no registry logins\n");
            }
            Ok(text)
        }
        TenantCommand::Token { command } => {
            let client = conn.client()?;
            let (reply, out): (api::TenantTokens, &JsonFlag) = match command {
                TenantTokenCommand::Rotate { name, out } => {
                    (client.post(&format!("/v1/tenants/{name}/tokens"), &serde_json::json!({})).await?, out)
                }
                TenantTokenCommand::Revoke { name, out } => {
                    (client.delete(&format!("/v1/tenants/{name}/tokens")).await?, out)
                }
            };
            Ok(if out.json {
                json(&reply)
            } else {
                match &reply.token {
                    Some(token) => format!(
                        "tenant {}: {} older token(s) revoked; its new token (shown once):\n{token}\n",
                        reply.tenant, reply.revoked
                    ),
                    None => format!("tenant {}: {} token(s) revoked\n", reply.tenant, reply.revoked),
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_to_the_minute_gets_its_seconds() {
        assert_eq!(with_seconds("2026-12-01T18:00Z"), "2026-12-01T18:00:00Z");
        assert_eq!(with_seconds("2026-12-01T18:00"), "2026-12-01T18:00:00");
        assert_eq!(with_seconds("2026-12-01T18:00:30Z"), "2026-12-01T18:00:30Z");
        assert_eq!(with_seconds("2026-12-01"), "2026-12-01");
    }

    /// A gang's lines begin with their node, across chunks that end in
    /// the middle of a line; a job on one node's are left as they are.
    #[test]
    fn a_gangs_lines_are_labelled_with_their_nodes() {
        let source = |offset, node: &str| api::LogSource { offset, node: node.into() };
        let chunk = |offset, data: &str, sources| api::LogChunk {
            offset,
            next_offset: offset + data.len() as u64,
            data: data.into(),
            finished: false,
            sources,
        };
        let mut labels = Labels::default();
        let first = chunk(0, "up\nloss 1\nsaving", vec![source(0, "node-1"), source(3, "node-0")]);
        assert_eq!(labels.apply(&first), "node-1: up\nnode-0: loss 1\nnode-0: saving");
        let second = chunk(16, " weights\ndone\n", vec![source(10, "node-0"), source(25, "node-1")]);
        assert_eq!(labels.apply(&second), " weights\nnode-1: done\n");
        let mut plain = Labels::default();
        assert_eq!(plain.apply(&chunk(0, "a\nb\n", vec![])), "a\nb\n");
    }

    #[test]
    fn task_indices_read_as_ranges() {
        assert_eq!(ranges(&[9, 0, 1, 2, 3, 7, 10, 11, 12]), "0-3, 7, 9-12");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
    }
}
