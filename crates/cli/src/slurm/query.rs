//! `squeue`, `sacct`, `scancel`, `scontrol` and `sinfo` over Ebb's API,
//! printing what Slurm prints so that the tools that parse it work. A
//! draining job is `RUNNING` and a requeued one `PENDING`: no state a
//! tool reads as a failure until the job has failed.

use std::fmt::Write;

use ebb_api as api;

use super::fields::{long_format, SQUEUE_NAMES};
use super::options::{self, Command, Given};
use crate::client::{Client, ClientError};
use crate::error::{usage, CliError};

/// Slurm's long state name for a job.
pub fn state(job: &api::Job) -> &'static str {
    match job.state.as_str() {
        "queued" => "PENDING",
        "starting" | "running" | "draining" => "RUNNING",
        "succeeded" => "COMPLETED",
        "failed" if job.timed_out => "TIMEOUT",
        "failed" => "FAILED",
        "cancelled" => "CANCELLED",
        _ => "UNKNOWN",
    }
}

/// Slurm's compact state (`squeue %t`).
fn short_state(long: &str) -> &'static str {
    match long {
        "PENDING" => "PD",
        "RUNNING" => "R",
        "COMPLETED" => "CD",
        "TIMEOUT" => "TO",
        "FAILED" => "F",
        "CANCELLED" => "CA",
        _ => "NF",
    }
}

/// A job's id as Slurm shows it: `A_i` for an array's task.
pub fn job_id(job: &api::Job) -> String {
    match &job.array {
        Some(task) => format!("{}_{}", task.id, task.index),
        None => job.id.to_string(),
    }
}

fn parse_ms(text: &str) -> Option<u64> {
    humantime::parse_rfc3339(text).ok().map(ebb_core::time::unix_ms)
}

fn now_ms() -> u64 {
    ebb_core::time::unix_ms(std::time::SystemTime::now())
}

/// How long it has run: its latest attempt's start to its end (or now).
pub(super) fn elapsed_s(job: &api::Job) -> u64 {
    let Some(start) = job.started_at.as_deref().and_then(parse_ms) else { return 0 };
    let end = match job.ended_at.as_deref().and_then(parse_ms) {
        Some(end) => end,
        None if state(job) == "RUNNING" => now_ms(),
        None => start,
    };
    end.saturating_sub(start) / 1000
}

/// Slurm's duration: `[D-]HH:MM:SS`, or `M:SS` under an hour (squeue).
pub(super) fn duration(seconds: u64, short: bool) -> String {
    let (d, h, m, s) = (seconds / 86400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h) {
        (0, 0) if short => format!("{m}:{s:02}"),
        (0, _) => format!("{h:02}:{m:02}:{s:02}"),
        _ => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

/// Its nodes: where it runs, else as many as it asked for.
pub(super) fn node_count(job: &api::Job) -> u32 {
    match job.placement.len() {
        0 => job.slurm.as_ref().and_then(|s| s.nodes).unwrap_or(1).max(1),
        placed => placed as u32,
    }
}

fn nodes_of(job: &api::Job) -> Vec<&str> {
    job.placement.iter().map(|p| p.node.as_str()).collect()
}

pub(super) fn node_list(job: &api::Job) -> String {
    match nodes_of(job).as_slice() {
        [] if state(job) == "PENDING" => "None assigned".into(),
        [] => String::new(),
        nodes => ebb_core::hostlist::compress(nodes),
    }
}

/// `%R`: why a pending job waits (Ebb's reason), or where it runs.
pub(super) fn reason_or_nodes(job: &api::Job) -> String {
    match state(job) {
        "PENDING" => match &job.pending_reason {
            Some(reason) => format!("({reason})"),
            None if job.attempt > 0 => "(Requeued)".into(),
            None => "(Priority)".into(),
        },
        _ => node_list(job),
    }
}

pub(super) fn time_limit(job: &api::Job, short: bool) -> String {
    match job.time_limit_s {
        Some(s) => duration(s, short),
        None => "UNLIMITED".into(),
    }
}

/// One `squeue -o` field.
fn squeue_field(job: &api::Job, id: &str, letter: char) -> String {
    let slurm = job.slurm.as_ref();
    match letter {
        'i' | 'A' => id.to_string(),
        'j' => super::fields::job_name(job),
        't' => short_state(state(job)).into(),
        'T' => state(job).into(),
        'M' => duration(elapsed_s(job), true),
        'L' => match job.time_limit_s {
            Some(limit) => duration(limit.saturating_sub(elapsed_s(job)), true),
            None => "UNLIMITED".into(),
        },
        'l' => time_limit(job, true),
        'D' => node_count(job).to_string(),
        'C' => slurm.map(|s| s.cpus_per_task.unwrap_or(1) * s.ntasks.unwrap_or(1)).unwrap_or(1).to_string(),
        'b' => format!("gres/gpu:{}", job.gpus / node_count(job)),
        'R' => reason_or_nodes(job),
        'N' => node_list(job),
        'P' => slurm.and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone()),
        'u' => job.tenant.clone(),
        'a' => slurm.and_then(|s| s.account.clone()).unwrap_or_default(),
        'q' => slurm.and_then(|s| s.qos.clone()).unwrap_or_default(),
        'r' => reason_or_nodes(job).trim_matches(['(', ')']).to_string(),
        'V' => job.submitted_at.clone(),
        'S' => job.started_at.clone().unwrap_or_else(|| "N/A".into()),
        'k' => String::new(),
        _ => String::new(),
    }
}

/// A `--format` string: literal text and `%[.][size]letter` fields.
pub fn render(format: &str, field: impl Fn(char) -> String) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let right = chars.peek() == Some(&'.');
        if right {
            chars.next();
        }
        let mut size = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            size.push(*d);
            chars.next();
        }
        let Some(letter) = chars.next() else { break };
        if letter == '%' {
            out.push('%');
            continue;
        }
        let mut value = field(letter);
        match size.parse::<usize>().ok().filter(|s| *s > 0).map(|s| s.min(1024)) {
            Some(size) => {
                value = value.chars().take(size).collect();
                let pad = size - value.chars().count();
                match right {
                    true => out.push_str(&format!("{}{value}", " ".repeat(pad))),
                    false => out.push_str(&format!("{value}{}", " ".repeat(pad))),
                }
            }
            None => out.push_str(&value),
        }
    }
    out
}

/// The `squeue` format letters Ebb prints, with their headers.
const SQUEUE_FIELDS: &[(char, &str)] = &[
    ('i', "JOBID"),
    ('A', "JOBID"),
    ('j', "NAME"),
    ('t', "ST"),
    ('T', "STATE"),
    ('M', "TIME"),
    ('L', "TIME_LEFT"),
    ('l', "TIME_LIMIT"),
    ('D', "NODES"),
    ('C', "CPUS"),
    ('b', "TRES_PER_NODE"),
    ('R', "NODELIST(REASON)"),
    ('N', "NODELIST"),
    ('P', "PARTITION"),
    ('u', "USER"),
    ('a', "ACCOUNT"),
    ('q', "QOS"),
    ('r', "REASON"),
    ('V', "SUBMIT_TIME"),
    ('S', "START_TIME"),
];

/// The header of a `squeue` format: each field's name in its place.
fn squeue_header(format: &str) -> String {
    render(format, |letter| {
        SQUEUE_FIELDS.iter().find(|(l, _)| *l == letter).map_or("", |(_, name)| name).to_string()
    })
}

/// Every job the caller may see in `states` (an API list), oldest first.
pub async fn list(client: &Client, states: &str) -> Result<Vec<api::Job>, CliError> {
    let mut jobs = Vec::new();
    let mut cursor: Option<u64> = None;
    loop {
        let cursor_text = cursor.map(|c| c.to_string());
        let mut query: Vec<(&str, &str)> = vec![("state", states), ("limit", "500"), ("arrays", "expand")];
        if let Some(c) = &cursor_text {
            query.push(("cursor", c));
        }
        let page: api::JobPage = client.get_query("/v1/jobs", &query).await?;
        jobs.extend(page.jobs);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(jobs),
        }
    }
}

/// `squeue`'s rows: each job, with an array's pending tasks on one line
/// (`A_[3-9]`) unless `expand` (`--array`).
/// A job as Slurm lists it: itself, or a heterogeneous job's components
/// (`ID+K`), each with its own nodes and GPUs, those of `only` where it
/// names any of them (`-j 12+1`).
pub fn het_parts(job: &api::Job, only: &[String]) -> Vec<(String, api::Job)> {
    let Some(components) = job.slurm.as_ref().map(|s| &s.components).filter(|c| !c.is_empty()) else {
        return vec![(job_id(job), job.clone())];
    };
    let named: Vec<String> = (0..components.len()).map(|k| format!("{}+{k}", job.id)).collect();
    let chosen = |id: &String| !only.iter().any(|w| named.contains(w)) || only.contains(id);
    let mut next = 0usize;
    let mut parts = Vec::new();
    for (part, id) in components.iter().zip(named.iter()) {
        let mut view = job.clone();
        let end = next.saturating_add(part.nodes as usize).min(job.placement.len());
        view.placement = job.placement[next.min(end)..end].to_vec();
        next = end;
        view.gpus = part.nodes.saturating_mul(part.gpus_per_node);
        if let Some(slurm) = view.slurm.as_mut() {
            (slurm.nodes, slurm.ntasks, slurm.cpus_per_task) =
                (Some(part.nodes), part.ntasks, part.cpus_per_task);
        }
        if chosen(id) {
            parts.push((id.clone(), view));
        }
    }
    parts
}

pub fn squeue_rows(jobs: &[api::Job], format: &str, expand: bool, only: &[String]) -> Vec<String> {
    let mut rows = Vec::new();
    let mut i = 0;
    while i < jobs.len() {
        let job = &jobs[i];
        let pending_task = |j: &api::Job| j.state == "queued" && j.array.is_some();
        if !expand && pending_task(job) {
            let array = job.array.as_ref().expect("a task").id;
            let mut indices = vec![job.array.as_ref().expect("a task").index];
            let mut k = i + 1;
            while k < jobs.len()
                && pending_task(&jobs[k])
                && jobs[k].array.as_ref().is_some_and(|a| a.id == array)
            {
                indices.push(jobs[k].array.as_ref().expect("a task").index);
                k += 1;
            }
            let id = if indices.len() == 1 {
                format!("{array}_{}", indices[0])
            } else {
                let names: Vec<String> = indices.iter().map(|n| format!("t{n}")).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let list = ebb_core::hostlist::compress(&refs);
                let inner = list.trim_start_matches('t').trim_start_matches('[').trim_end_matches(']');
                format!("{array}_[{}]", inner.replace(",t", ","))
            };
            rows.push(render(format, |letter| squeue_field(job, &id, letter)));
            i = k;
            continue;
        }
        for (id, part) in het_parts(job, only) {
            rows.push(render(format, |letter| squeue_field(&part, &id, letter)));
        }
        i += 1;
    }
    rows
}

/// The jobs a query names, as `squeue`, `sacct` and `scancel` take them:
/// each list given (comma-separated, the option repeated) narrows them.
#[derive(Default)]
pub struct Filter {
    pub ids: Vec<String>,
    users: Vec<String>,
    names: Vec<String>,
    accounts: Vec<String>,
    partitions: Vec<String>,
    qos: Vec<String>,
    /// Slurm's state names or their short forms, upper case; `ALL`.
    pub states: Vec<String>,
    nodes: Vec<String>,
    reasons: Vec<String>,
    /// `sacct --nnodes=MIN[-MAX]`.
    node_counts: Option<(u32, u32)>,
}

impl Filter {
    /// The lists `given` names, under whichever of Slurm's names the
    /// command gives them (`--accounts`, `--account`).
    pub fn from(given: &Given) -> Result<Filter, CliError> {
        let lists = |longs: &[&str]| -> Vec<String> {
            given
                .iter()
                .filter(|(l, _)| longs.contains(l))
                .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string))
                .collect()
        };
        let mut nodes = Vec::new();
        for list in lists(&["nodelist"]) {
            nodes.extend(
                ebb_core::hostlist::expand(&list).map_err(|e| usage(format!("--nodelist={list}: {e}")))?,
            );
        }
        let node_counts = match options::last(given, "nnodes") {
            None => None,
            Some(text) => Some(options::nodes(&vec![("nodes", text.to_string())])?.expect("a count")),
        };
        Ok(Filter {
            ids: lists(&["jobs"]),
            users: lists(&["user"]),
            names: lists(&["name"]),
            accounts: lists(&["accounts", "account"]),
            partitions: lists(&["partitions", "partition"]),
            qos: lists(&["qos"]),
            states: lists(&["states", "state"]).iter().map(|s| s.to_ascii_uppercase()).collect(),
            nodes,
            reasons: lists(&["reason"]).iter().map(|s| s.to_ascii_lowercase()).collect(),
            node_counts,
        })
    }

    /// Whether any list narrows the jobs.
    pub fn narrows(&self) -> bool {
        let lists = [&self.ids, &self.users, &self.names, &self.accounts, &self.partitions, &self.qos];
        lists.iter().any(|l| !l.is_empty())
            || !(self.states.is_empty() && self.nodes.is_empty() && self.reasons.is_empty())
            || self.node_counts.is_some()
    }

    /// Whether the states asked for reach past the queue and the running
    /// (Slurm's `squeue` shows ended jobs only when asked).
    pub fn wants_ended(&self) -> bool {
        self.states.iter().any(|s| !["PENDING", "PD", "RUNNING", "R"].contains(&s.as_str()))
    }

    pub fn keeps(&self, job: &api::Job) -> bool {
        let slurm = job.slurm.as_ref();
        let id = job_id(job);
        let array = job.array.as_ref().map(|a| a.id.to_string());
        let within = |list: &[String], value: Option<&str>| {
            list.is_empty() || value.is_some_and(|v| list.iter().any(|w| w == v))
        };
        let partition = slurm.and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone());
        (self.ids.is_empty()
            || self.ids.iter().any(|w| {
                *w == id
                    || Some(w) == array.as_ref()
                    || *w == job.id.to_string()
                    || w.split_once('+').is_some_and(|(leader, _)| leader == job.id.to_string())
            }))
            && within(&self.users, Some(&job.tenant))
            && within(&self.names, job.name.as_deref())
            && within(&self.accounts, slurm.and_then(|s| s.account.as_deref()))
            && (self.partitions.is_empty() || partition.split(',').any(|p| within(&self.partitions, Some(p))))
            && within(&self.qos, slurm.and_then(|s| s.qos.as_deref()))
            && (self.states.is_empty()
                || self.states.iter().any(|s| s == state(job) || s == short_state(state(job)) || s == "ALL"))
            && (self.nodes.is_empty() || nodes_of(job).iter().any(|n| self.nodes.iter().any(|w| w == n)))
            && (self.reasons.is_empty()
                || job.pending_reason.is_some_and(|r| self.reasons.iter().any(|w| w == r.as_str())))
            && self.node_counts.is_none_or(|(fewest, most)| {
                let n = job.placement.len().max(1) as u32;
                (fewest..=most).contains(&n)
            })
    }
}

/// Slurm's job states, long and short, as `--helpstate` lists them.
const STATES: &[(&str, &str)] = &[
    ("PENDING", "PD"),
    ("RUNNING", "R"),
    ("COMPLETED", "CD"),
    ("FAILED", "F"),
    ("TIMEOUT", "TO"),
    ("CANCELLED", "CA"),
];

fn states_help() -> String {
    STATES.iter().map(|(long, short)| format!("{long} ({short})\n")).collect()
}

/// What `--help`, `--usage` and `--version` ask for, if one was given.
pub fn answered(command: Command, given: &Given) -> Option<String> {
    if options::flag(given, "help") || options::flag(given, "usage") {
        return Some(super::table::usage(command));
    }
    options::flag(given, "version").then(|| format!("slurm 25.11.7 (Ebb {})\n", env!("CARGO_PKG_VERSION")))
}

/// The notes for the options Ebb ignores, unless `--quiet`.
pub fn say_ignored(command: Command, given: &Given) {
    if options::flag(given, "quiet") {
        return;
    }
    for note in options::ignored_notes(command, given) {
        eprintln!("{}: {note}", command.name());
    }
}

/// `squeue`.
pub async fn squeue(client: &Client, args: &[String]) -> Result<String, CliError> {
    let (mut given, words) = options::parse(Command::Squeue, args, "")?;
    // `-j`'s value is optional, so `-j 12` gives it as the first other
    // word, as Slurm's squeue takes it (`-s 12.0` too, without -j); any
    // other word is an error.
    let mut words = words.into_iter();
    if options::flag(&given, "jobs") {
        given.extend(words.next().map(|list| ("jobs", list)));
    } else if options::flag(&given, "steps") {
        given.extend(words.next().map(|list| ("steps", list)));
    }
    if let Some(word) = words.next() {
        return Err(usage(format!("Unrecognized option: {word} (squeue takes -j ID to name jobs)")));
    }
    if options::flag(&given, "helpstate") {
        return Ok(states_help());
    }
    if options::flag(&given, "helpformat") {
        return Ok(SQUEUE_FIELDS.iter().map(|(l, _)| format!("%{l}")).collect::<Vec<_>>().join(" ") + "\n");
    }
    say_ignored(Command::Squeue, &given);
    let long =
        options::last(&given, "Format").map(|spec| long_format(spec, SQUEUE_NAMES, "job")).transpose()?;
    let format =
        match (options::last(&given, "format").map(str::to_string).or(long), options::flag(&given, "long")) {
            (Some(format), _) => format,
            (None, true) => "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R".to_string(),
            (None, false) => "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R".to_string(),
        };
    let filter = Filter::from(&given)?;
    let over = options::last(&given, "running-over").map(options::time_limit).transpose()?.flatten();
    let under = options::last(&given, "running-under").map(options::time_limit).transpose()?.flatten();
    let states = if filter.wants_ended() { ALL_STATES } else { "active" };
    let mut jobs = list(client, states).await?;
    jobs.retain(|job| {
        let ran = elapsed_s(job);
        filter.keeps(job)
            && over.is_none_or(|t| state(job) == "RUNNING" && ran >= t)
            && under.is_none_or(|t| state(job) == "RUNNING" && ran < t)
    });
    if options::flag(&given, "steps") {
        return step_rows(client, &given, &jobs).await;
    }
    if options::flag(&given, "json") {
        super::json::data_parser(&given)?;
        return Ok(super::json::squeue(&jobs));
    }
    let mut out = String::new();
    if !options::flag(&given, "noheader") {
        writeln!(out, "{}", squeue_header(&format)).unwrap();
    }
    for row in squeue_rows(&jobs, &format, options::flag(&given, "array"), &filter.ids) {
        writeln!(out, "{row}").unwrap();
    }
    Ok(out)
}

/// `squeue -s [STEPS]`: the running steps of `jobs` (those of `STEPS`,
/// `ID.N,...`, where it names any), as their first nodes list them.
async fn step_rows(client: &Client, given: &Given, jobs: &[api::Job]) -> Result<String, CliError> {
    if options::flag(given, "json") {
        return Err(usage("--json with --steps: Ebb's squeue --json lists jobs; list steps without --json"));
    }
    let only: Vec<&str> = options::last(given, "steps")
        .map_or_else(Vec::new, |l| l.split(',').filter(|s| !s.is_empty()).collect());
    let long = options::last(given, "Format")
        .map(|spec| long_format(spec, super::steps::NAMES, "step"))
        .transpose()?;
    let format = options::last(given, "format").map(str::to_string).or(long);
    let format = format.as_deref().unwrap_or(super::steps::DEFAULT_FORMAT);
    let mut out = String::new();
    if !options::flag(given, "noheader") {
        writeln!(out, "{}", super::steps::header(format)).unwrap();
    }
    for job in jobs.iter().filter(|j| j.slurm.is_some() && state(j) == "RUNNING") {
        let Some(access) = super::steps::access(client, job.id).await? else { continue };
        // A job whose first node does not answer (one just starting)
        // holds up none of the others.
        let mut steps = match super::steps::list(&access) {
            Ok(steps) => steps,
            Err(e) => {
                eprintln!("squeue: warning: job {}'s steps: {e}", job.id);
                continue;
            }
        };
        if !only.is_empty() {
            steps.retain(|n, _| only.contains(&format!("{}.{n}", job.id).as_str()));
        }
        for row in super::steps::rows(job, &steps, format) {
            writeln!(out, "{row}").unwrap();
        }
    }
    Ok(out)
}

/// Every state a job can be in, as the API lists them.
const ALL_STATES: &str = "queued,starting,running,draining,succeeded,failed,cancelled";

/// The jobs an id names: `N` (a job, or an array: all its tasks),
/// `A_i` (one task) or `A_[i-j]`.
pub async fn jobs_named(client: &Client, id: &str) -> Result<Vec<api::Job>, CliError> {
    // `N+K`: a heterogeneous job's component, which is job N's.
    let id = match id.split_once('+') {
        Some((leader, k)) if k.parse::<u16>().is_ok() => leader,
        _ => id,
    };
    let (main, task) = match id.split_once('_') {
        Some((main, task)) => (main, Some(task)),
        None => (id, None),
    };
    let main: u64 = main.parse().map_err(|_| invalid_id(id))?;
    let job: api::Job = client.get(&format!("/v1/jobs/{main}")).await.map_err(|e| not_found(id, e))?;
    let tasks = match &job.progress {
        Some(progress) if job.array.as_ref().is_some_and(|a| a.id == main) => progress.tasks.clone(),
        _ => Vec::new(),
    };
    let wanted: Vec<u64> = match task {
        None if tasks.is_empty() => return Ok(vec![job]),
        None => tasks.iter().map(|t| t.id).collect(),
        Some(task) => {
            let indices = ebb_core::hostlist::expand(&format!("t{task}")).map_err(|_| invalid_id(id))?;
            let indices: Vec<u64> = indices.iter().filter_map(|n| n[1..].parse().ok()).collect();
            let chosen: Vec<u64> =
                tasks.iter().filter(|t| indices.contains(&t.index)).map(|t| t.id).collect();
            if chosen.is_empty() {
                return Err(invalid_id(id));
            }
            chosen
        }
    };
    let mut jobs = Vec::new();
    for task in wanted {
        jobs.push(client.get(&format!("/v1/jobs/{task}")).await?);
    }
    Ok(jobs)
}

fn not_found(id: &str, e: ClientError) -> CliError {
    match e.refused_with() {
        Some(404) => invalid_id(id),
        _ => e.into(),
    }
}

/// Slurm's words for an id that names no job.
fn invalid_id(id: &str) -> CliError {
    usage(format!("Invalid job id specified: {id}"))
}

/// One `sacct` field of a job.
fn sacct_field(job: &api::Job, id: &str, field: &str) -> Result<String, CliError> {
    let slurm = job.slurm.as_ref();
    Ok(match field.to_ascii_lowercase().as_str() {
        "jobid" | "jobidraw" => id.to_string(),
        "jobname" => super::fields::job_name(job),
        "state" => state(job).into(),
        "exitcode" => match (job.exit_code, state(job)) {
            (Some(code), _) => format!("{code}:0"),
            (None, "FAILED" | "TIMEOUT" | "CANCELLED") => "0:15".into(),
            (None, _) => "0:0".into(),
        },
        "nodelist" => node_list(job),
        "elapsed" => duration(elapsed_s(job), false),
        "elapsedraw" => elapsed_s(job).to_string(),
        "partition" => slurm.and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone()),
        "account" => slurm.and_then(|s| s.account.clone()).unwrap_or_default(),
        "qos" => slurm.and_then(|s| s.qos.clone()).unwrap_or_default(),
        "user" => job.tenant.clone(),
        "nnodes" => node_count(job).to_string(),
        "alloccpus" | "ncpus" => {
            slurm.map(|s| s.cpus_per_task.unwrap_or(1) * s.ntasks.unwrap_or(1)).unwrap_or(1).to_string()
        }
        "allocgres" | "reqgres" => format!("gpu:{}", job.gpus),
        "alloctres" | "reqtres" => {
            format!("billing=1,gres/gpu={},node={}", job.gpus, job.placement.len().max(1))
        }
        "timelimit" => time_limit(job, false),
        "submit" => job.submitted_at.trim_end_matches('Z').to_string(),
        "start" => {
            job.started_at.as_deref().map_or("Unknown".into(), |t| t.trim_end_matches('Z').to_string())
        }
        "end" => job.ended_at.as_deref().map_or("Unknown".into(), |t| t.trim_end_matches('Z').to_string()),
        "restarts" => job.attempt.saturating_sub(1).to_string(),
        "reason" => job.pending_reason.map_or("None".into(), |r| r.as_str().to_string()),
        "workdir" => job.workdir.clone().unwrap_or_default(),
        _ => return Err(usage(format!("Invalid field requested: \"{field}\""))),
    })
}

/// The `sacct` fields Ebb prints, as `--helpformat` lists them.
const SACCT_FIELDS: &[&str] = &[
    "Account",
    "AllocCPUS",
    "AllocGRES",
    "AllocTRES",
    "Elapsed",
    "ElapsedRaw",
    "End",
    "ExitCode",
    "JobID",
    "JobIDRaw",
    "JobName",
    "NCPUS",
    "NNodes",
    "NodeList",
    "Partition",
    "QOS",
    "Reason",
    "ReqGRES",
    "ReqTRES",
    "Restarts",
    "Start",
    "State",
    "Submit",
    "Timelimit",
    "User",
    "WorkDir",
];

/// `sacct`.
pub async fn sacct(client: &Client, args: &[String]) -> Result<String, CliError> {
    let (given, words) = options::parse(Command::Sacct, args, "")?;
    if let Some(word) = words.first() {
        return Err(usage(format!("{word:?} is not an option (sacct takes -j ID to name jobs)")));
    }
    if options::flag(&given, "helpformat") {
        return Ok(SACCT_FIELDS.join(" ") + "\n");
    }
    if options::flag(&given, "helpstate") {
        return Ok(states_help());
    }
    if options::flag(&given, "helpreason") {
        return Ok(api::PendingReason::ALL.iter().map(|r| format!("{}\n", r.as_str())).collect());
    }
    say_ignored(Command::Sacct, &given);
    let fields = match options::last(&given, "format") {
        Some(fields) => fields.to_string(),
        None if options::flag(&given, "brief") => "JobID,State,ExitCode".into(),
        None if options::flag(&given, "long") => SACCT_FIELDS.join(","),
        None => "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode".into(),
    };
    let header = !options::flag(&given, "noheader");
    let (parsable, trailing) = match (options::flag(&given, "parsable2"), options::flag(&given, "parsable")) {
        (true, _) => (true, false),
        (false, parsable) => (parsable, parsable),
    };
    let delimiter = options::last(&given, "delimiter").unwrap_or("|");
    let filter = Filter::from(&given)?;
    let fields: Vec<String> =
        fields.split(',').map(|f| f.split('%').next().unwrap_or(f).trim().to_string()).collect();
    let mut jobs = Vec::new();
    if filter.ids.is_empty() {
        jobs = list(client, ALL_STATES).await?;
    } else {
        for id in &filter.ids {
            match jobs_named(client, id).await {
                Ok(found) => jobs.extend(found),
                // sacct names nothing for an id it does not know.
                Err(CliError::Usage(why)) if why.starts_with("Invalid job id") => {}
                Err(e) => return Err(e),
            }
        }
    }
    // The ids chose the jobs; the other lists narrow them.
    let filter_ids = filter.ids.clone();
    let narrowing = Filter { ids: Vec::new(), ..filter };
    jobs.retain(|job| narrowing.keeps(job));
    if options::flag(&given, "json") {
        super::json::data_parser(&given)?;
        return Ok(super::json::sacct(&jobs));
    }
    if options::flag(&given, "batch-script") {
        let mut out = String::new();
        for job in &jobs {
            let script = job.slurm.as_ref().map_or("NONE\n", |s| s.script.as_str());
            write!(out, "Batch Script for {}\n{}\n{script}", job_id(job), "-".repeat(80)).unwrap();
        }
        return Ok(out);
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    for job in &jobs {
        for (id, part) in het_parts(job, &filter_ids) {
            rows.push(fields.iter().map(|f| sacct_field(&part, &id, f)).collect::<Result<_, _>>()?);
        }
    }
    let mut out = String::new();
    if parsable {
        let end = if trailing { delimiter } else { "" };
        if header {
            writeln!(out, "{}{end}", fields.join(delimiter)).unwrap();
        }
        for row in rows {
            writeln!(out, "{}{end}", row.join(delimiter)).unwrap();
        }
        return Ok(out);
    }
    let widths: Vec<usize> = fields
        .iter()
        .map(|f| match f.to_ascii_lowercase().as_str() {
            "jobid" | "jobidraw" | "start" | "end" | "submit" => 19,
            "nodelist" => 15,
            _ => 10,
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| {
                let c: String = c.chars().take(*w).collect();
                format!("{c:>w$}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if header {
        writeln!(out, "{}", line(&fields)).unwrap();
        let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        writeln!(out, "{}", dashes.join(" ")).unwrap();
    }
    for row in &rows {
        writeln!(out, "{}", line(row)).unwrap();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, state: &str) -> api::Job {
        serde_json::from_value(serde_json::json!({
            "id": id, "tenant": "alice", "name": "train", "tier": "preemptible", "gpus": 2,
            "gpu_model": null, "argv": ["x"], "state": state, "attempt": 1, "preemptions": 0,
            "retries": 0, "submitted_at": "2026-12-03T10:00:00Z", "exit_code": null,
            "placement": [{"node": "node-1", "gpus": [0, 1]}],
            "started_at": "2026-12-03T10:00:00Z", "ended_at": "2026-12-03T11:02:03Z"
        }))
        .unwrap()
    }

    #[test]
    fn states_are_slurms_and_a_drain_or_a_requeue_is_never_a_failure() {
        assert_eq!(state(&job(1, "draining")), "RUNNING");
        assert_eq!(state(&job(1, "queued")), "PENDING");
        let mut timed_out = job(1, "failed");
        timed_out.timed_out = true;
        assert_eq!(state(&timed_out), "TIMEOUT");
        assert_eq!(sacct_field(&job(1, "succeeded"), "1", "Elapsed").unwrap(), "01:02:03");
        assert_eq!(sacct_field(&job(1, "succeeded"), "1", "NodeList").unwrap(), "node-1");
        assert!(sacct_field(&job(1, "succeeded"), "1", "Bogus")
            .unwrap_err()
            .to_string()
            .contains("Invalid field"));
    }

    /// `-O`'s names print what their letters print.
    #[test]
    fn a_long_format_prints_what_its_letters_do() {
        let j = job(12, "running");
        let format = long_format("jobid:4,name:.6", SQUEUE_NAMES, "job").unwrap();
        assert_eq!(render(&format, |l| squeue_field(&j, "12", l)), "12   train");
    }

    #[test]
    fn formats_justify_and_truncate_as_squeue_does() {
        let j = job(12, "running");
        assert_eq!(render("%.6i|%4j|%5t|%%", |l| squeue_field(&j, "12", l)), "    12|trai|R    |%");
        assert_eq!(squeue_header("%i %j %t"), "JOBID NAME ST");
    }

    #[test]
    fn pending_tasks_of_an_array_share_a_line() {
        let mut tasks: Vec<api::Job> = (0..5).map(|i| job(20 + i, "queued")).collect();
        for (i, t) in tasks.iter_mut().enumerate() {
            t.array = Some(api::ArrayTask { id: 20, index: i as u64, tasks: 5, params: Default::default() });
        }
        tasks[0].state = "running".into();
        let rows = squeue_rows(&tasks, "%i %t", false, &[]);
        assert_eq!(rows, ["20_0 R", "20_[1-4] PD"]);
        assert_eq!(squeue_rows(&tasks, "%i", true, &[]).len(), 5);
    }

    /// The query commands read options as getopt does, anywhere among
    /// their words (`sacct -nu root`, `scancel 12 -s USR1`), and each list
    /// given narrows the jobs: ids, users, names, accounts, partitions,
    /// QOS, states (long or short), nodes (a host list), node counts.
    #[test]
    fn query_options_group_and_permute_and_each_list_narrows_the_jobs() {
        let words = |t: &str| t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let (given, rest) = options::parse(Command::Sacct, &words("-nPu alice -j12,13 -s CD,F"), "").unwrap();
        assert!(rest.is_empty());
        assert!(options::flag(&given, "noheader") && options::flag(&given, "parsable2"));
        let filter = Filter::from(&given).unwrap();
        assert_eq!((filter.ids.clone(), filter.states.clone()), (words("12 13"), words("CD F")));
        let (given, rest) = options::parse(Command::Scancel, &words("12 -s USR1 13_2"), "").unwrap();
        assert_eq!((rest, options::last(&given, "signal")), (words("12 13_2"), Some("USR1")));
        assert_eq!(
            options::parse(Command::Squeue, &words("-h -t"), "").unwrap_err().to_string(),
            "option requires an argument -- 't'"
        );
        let (given, _) =
            options::parse(Command::Squeue, &words("--partitions=spot --user=alice -w node-[0-1]"), "")
                .unwrap();
        let filter = Filter::from(&given).unwrap();
        let mut on_node_1 = job(1, "running");
        on_node_1.slurm = Some(api::SlurmBatch { partition: Some("spot".into()), ..Default::default() });
        assert!(filter.keeps(&on_node_1));
        let mut elsewhere = on_node_1.clone();
        elsewhere.placement[0].node = "node-7".into();
        assert!(!filter.keeps(&elsewhere), "not on node-[0-1]");
        let mut bob = on_node_1.clone();
        bob.tenant = "bob".into();
        assert!(!filter.keeps(&bob), "not alice's");
        assert!(!filter.keeps(&job(1, "running")), "in the tier's partition, not spot");
        let (given, _) = options::parse(Command::Sacct, &words("--nnodes=2-3 -s r"), "").unwrap();
        let filter = Filter::from(&given).unwrap();
        assert!(!filter.keeps(&job(1, "running")), "one node");
        let mut two = job(1, "running");
        two.placement.push(api::NodeGpus { node: "node-2".into(), gpus: vec![0] });
        assert!(filter.keeps(&two));
        assert!(!filter.wants_ended());
    }
}
