//! `squeue`, `sacct`, `scancel`, `scontrol` and `sinfo` over Ebb's API,
//! printing what Slurm prints so that the tools that parse it work. A
//! draining job is `RUNNING` and a requeued one `PENDING`: no state a
//! tool reads as a failure until the job has failed.

use std::fmt::Write;

use ebb_api as api;

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
fn elapsed_s(job: &api::Job) -> u64 {
    let Some(start) = job.started_at.as_deref().and_then(parse_ms) else { return 0 };
    let end = match job.ended_at.as_deref().and_then(parse_ms) {
        Some(end) => end,
        None if state(job) == "RUNNING" => now_ms(),
        None => start,
    };
    end.saturating_sub(start) / 1000
}

/// Slurm's duration: `[D-]HH:MM:SS`, or `M:SS` under an hour (squeue).
fn duration(seconds: u64, short: bool) -> String {
    let (d, h, m, s) = (seconds / 86400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h) {
        (0, 0) if short => format!("{m}:{s:02}"),
        (0, _) => format!("{h:02}:{m:02}:{s:02}"),
        _ => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

fn nodes_of(job: &api::Job) -> Vec<&str> {
    job.placement.iter().map(|p| p.node.as_str()).collect()
}

fn node_list(job: &api::Job) -> String {
    match nodes_of(job).as_slice() {
        [] if state(job) == "PENDING" => "None assigned".into(),
        [] => String::new(),
        nodes => ebb_core::hostlist::compress(nodes),
    }
}

/// `%R`: why a pending job waits (Ebb's reason), or where it runs.
fn reason_or_nodes(job: &api::Job) -> String {
    match state(job) {
        "PENDING" => match &job.pending_reason {
            Some(reason) => format!("({reason})"),
            None if job.attempt > 0 => "(Requeued)".into(),
            None => "(Priority)".into(),
        },
        _ => node_list(job),
    }
}

fn time_limit(job: &api::Job, short: bool) -> String {
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
        'j' => job.name.clone().unwrap_or_default(),
        't' => short_state(state(job)).into(),
        'T' => state(job).into(),
        'M' => duration(elapsed_s(job), true),
        'L' => match job.time_limit_s {
            Some(limit) => duration(limit.saturating_sub(elapsed_s(job)), true),
            None => "UNLIMITED".into(),
        },
        'l' => time_limit(job, true),
        'D' => match job.placement.len() {
            0 => slurm.and_then(|s| s.nodes).unwrap_or(1).to_string(),
            placed => placed.to_string(),
        },
        'C' => slurm.map(|s| s.cpus_per_task.unwrap_or(1) * s.ntasks.unwrap_or(1)).unwrap_or(1).to_string(),
        'b' => format!("gres/gpu:{}", job.gpus),
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

/// The header of a `squeue` format: each field's name in its place.
fn squeue_header(format: &str) -> String {
    render(format, |letter| {
        match letter {
            'i' | 'A' => "JOBID",
            'j' => "NAME",
            't' => "ST",
            'T' => "STATE",
            'M' => "TIME",
            'L' => "TIME_LEFT",
            'l' => "TIME_LIMIT",
            'D' => "NODES",
            'C' => "CPUS",
            'b' => "TRES_PER_NODE",
            'R' => "NODELIST(REASON)",
            'N' => "NODELIST",
            'P' => "PARTITION",
            'u' => "USER",
            'a' => "ACCOUNT",
            'q' => "QOS",
            'r' => "REASON",
            'V' => "SUBMIT_TIME",
            'S' => "START_TIME",
            _ => "",
        }
        .to_string()
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
pub fn squeue_rows(jobs: &[api::Job], format: &str, expand: bool) -> Vec<String> {
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
        let id = job_id(job);
        rows.push(render(format, |letter| squeue_field(job, &id, letter)));
        i += 1;
    }
    rows
}

/// `squeue`.
pub async fn squeue(client: &Client, args: &[String]) -> Result<String, CliError> {
    let mut format = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R".to_string();
    let (mut header, mut expand) = (true, false);
    let (mut ids, mut users, mut names, mut states): (Vec<String>, Vec<String>, Vec<String>, Vec<String>) =
        Default::default();
    let mut flags = Flags::new(args);
    while let Some(flag) = flags.next_flag() {
        let mut value = || flags.value();
        match flag.as_str() {
            "-h" | "--noheader" => header = false,
            "-r" | "--array" => expand = true,
            "--me" => {}
            "-a" | "--all" | "-l" | "--long" => {}
            "-o" | "--format" => format = value()?,
            "-j" | "--jobs" => ids.extend(value()?.split(',').map(str::to_string)),
            "-u" | "--user" => users.extend(value()?.split(',').map(str::to_string)),
            "-n" | "--name" => names.extend(value()?.split(',').map(str::to_string)),
            "-t" | "--states" => states.extend(value()?.split(',').map(|s| s.to_ascii_uppercase())),
            "-p" | "--partition" | "-A" | "--account" | "-q" | "--qos" => {
                value()?;
            }
            other => return Err(usage(format!("unrecognized option '{other}'"))),
        }
    }
    let mut jobs = list(client, "active").await?;
    jobs.retain(|job| {
        let id = job_id(job);
        let array = job.array.as_ref().map(|a| a.id.to_string());
        (ids.is_empty()
            || ids.iter().any(|w| *w == id || Some(w) == array.as_ref() || *w == job.id.to_string()))
            && (users.is_empty() || users.contains(&job.tenant))
            && (names.is_empty() || job.name.as_ref().is_some_and(|n| names.contains(n)))
            && (states.is_empty()
                || states.iter().any(|s| s == state(job) || s == short_state(state(job)) || s == "ALL"))
    });
    let mut out = String::new();
    if header {
        writeln!(out, "{}", squeue_header(&format)).unwrap();
    }
    for row in squeue_rows(&jobs, &format, expand) {
        writeln!(out, "{row}").unwrap();
    }
    Ok(out)
}

/// A command line read a flag at a time: `--flag=value`, `--flag value`,
/// `-xVALUE`, `-x value`, or a bare word.
pub struct Flags<'a> {
    args: &'a [String],
    next: usize,
    flag: String,
    inline: Option<String>,
}

impl<'a> Flags<'a> {
    pub fn new(args: &'a [String]) -> Flags<'a> {
        Flags { args, next: 0, flag: String::new(), inline: None }
    }

    /// The next flag (or word), its value held for [`Flags::value`].
    pub fn next_flag(&mut self) -> Option<String> {
        let arg = self.args.get(self.next)?;
        self.next += 1;
        (self.flag, self.inline) = match arg.split_once('=').filter(|_| arg.starts_with("--")) {
            Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
            None if arg.len() > 2 && arg.starts_with('-') && !arg.starts_with("--") => {
                (arg[..2].to_string(), Some(arg[2..].to_string()))
            }
            None => (arg.to_string(), None),
        };
        Some(self.flag.clone())
    }

    /// The current flag's value: given with it, or the next word.
    pub fn value(&mut self) -> Result<String, CliError> {
        if let Some(value) = self.inline.take() {
            return Ok(value);
        }
        let value = self.args.get(self.next).cloned();
        self.next += 1;
        value.ok_or_else(|| usage(format!("option '{}' requires an argument", self.flag)))
    }
}

/// The jobs an id names: `N` (a job, or an array: all its tasks),
/// `A_i` (one task) or `A_[i-j]`.
pub async fn jobs_named(client: &Client, id: &str) -> Result<Vec<api::Job>, CliError> {
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
fn sacct_field(job: &api::Job, field: &str) -> Result<String, CliError> {
    let slurm = job.slurm.as_ref();
    Ok(match field.to_ascii_lowercase().as_str() {
        "jobid" | "jobidraw" => job_id(job),
        "jobname" => job.name.clone().unwrap_or_default(),
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
        "nnodes" => job.placement.len().max(1).to_string(),
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

/// `sacct`.
pub async fn sacct(client: &Client, args: &[String]) -> Result<String, CliError> {
    let mut fields = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode".to_string();
    let (mut header, mut parsable, mut trailing) = (true, false, false);
    let mut ids: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut flags = Flags::new(args);
    while let Some(flag) = flags.next_flag() {
        let mut value = || flags.value();
        match flag.as_str() {
            "-j" | "--jobs" => ids.extend(value()?.split(',').filter(|s| !s.is_empty()).map(str::to_string)),
            "-o" | "--format" => fields = value()?,
            "-P" | "--parsable2" => parsable = true,
            "-p" | "--parsable" => (parsable, trailing) = (true, true),
            "-n" | "--noheader" => header = false,
            "--name" => names.extend(value()?.split(',').map(str::to_string)),
            "-X" | "--allocations" | "-a" | "--allusers" | "-D" | "--duplicates" | "-b" | "--brief" => {}
            "-S" | "--starttime" | "-E" | "--endtime" | "-u" | "--user" | "-s" | "--state" | "-M"
            | "--clusters" => {
                value()?;
            }
            other => return Err(usage(format!("unrecognized option '{other}'"))),
        }
    }
    let fields: Vec<String> =
        fields.split(',').map(|f| f.split('%').next().unwrap_or(f).trim().to_string()).collect();
    let mut jobs = Vec::new();
    if ids.is_empty() {
        jobs = list(client, "queued,starting,running,draining,succeeded,failed,cancelled").await?;
    } else {
        for id in &ids {
            match jobs_named(client, id).await {
                Ok(found) => jobs.extend(found),
                // sacct names nothing for an id it does not know.
                Err(CliError::Usage(why)) if why.starts_with("Invalid job id") => {}
                Err(e) => return Err(e),
            }
        }
    }
    if !names.is_empty() {
        jobs.retain(|j| j.name.as_ref().is_some_and(|n| names.contains(n)));
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    for job in &jobs {
        rows.push(fields.iter().map(|f| sacct_field(job, f)).collect::<Result<_, _>>()?);
    }
    let mut out = String::new();
    if parsable {
        let end = if trailing { "|" } else { "" };
        if header {
            writeln!(out, "{}{end}", fields.join("|")).unwrap();
        }
        for row in rows {
            writeln!(out, "{}{end}", row.join("|")).unwrap();
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

/// `sinfo`: the nodes grouped by partition and state, as Slurm prints them.
pub fn sinfo_rows(nodes: &[api::Node], partitions: &[(String, bool)]) -> String {
    let mut out = String::from("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n");
    for (partition, default) in partitions {
        let mut groups: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for node in nodes {
            // A GPU out of service for a fault is as good as taken.
            let taken = node.gpus_used + node.gpus_held + node.gpus_out.len() as u32;
            let state = match (node.status.as_str(), taken) {
                ("up", 0) => "idle",
                ("up", used) if used >= u32::from(node.gpus) => "alloc",
                ("up", _) => "mix",
                ("draining", 0) => "drained",
                ("draining", _) => "draining",
                ("lost", _) => "down",
                (_, _) => "fail",
            };
            groups.entry(state).or_default().push(&node.name);
        }
        let name = if *default { format!("{partition}*") } else { partition.clone() };
        for (state, names) in groups {
            writeln!(
                out,
                "{name:<9} {:>5} {:>10} {:>6} {state:>6} {}",
                "up",
                "infinite",
                names.len(),
                ebb_core::hostlist::compress(&names)
            )
            .unwrap();
        }
    }
    out
}

/// `scontrol show job`: a job as `Key=Value` words.
pub fn show_job(job: &api::Job) -> String {
    let slurm = job.slurm.as_ref();
    let mut words =
        vec![format!("JobId={}", job.id), format!("JobName={}", job.name.clone().unwrap_or_default())];
    if let Some(task) = &job.array {
        words.push(format!("ArrayJobId={} ArrayTaskId={}", task.id, task.index));
    }
    words.extend([
        format!("UserId={}", job.tenant),
        format!("JobState={} Reason={}", state(job), reason_or_nodes(job).trim_matches(['(', ')'])),
        format!(
            "Requeue=1 Restarts={} ExitCode={}:0",
            job.attempt.saturating_sub(1),
            job.exit_code.unwrap_or(0)
        ),
        format!("RunTime={} TimeLimit={}", duration(elapsed_s(job), false), time_limit(job, false)),
        format!("SubmitTime={}", job.submitted_at.trim_end_matches('Z')),
        format!("Partition={}", slurm.and_then(|s| s.partition.clone()).unwrap_or_else(|| job.tier.clone())),
        format!("NodeList={}", node_list(job)),
        format!("NumNodes={} TRES=gres/gpu={}", job.placement.len().max(1), job.gpus),
        format!("WorkDir={}", job.workdir.clone().unwrap_or_default()),
    ]);
    words.join(" ") + "\n"
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
        assert_eq!(sacct_field(&job(1, "succeeded"), "Elapsed").unwrap(), "01:02:03");
        assert_eq!(sacct_field(&job(1, "succeeded"), "NodeList").unwrap(), "node-1");
        assert!(sacct_field(&job(1, "succeeded"), "Bogus")
            .unwrap_err()
            .to_string()
            .contains("Invalid field"));
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
        let rows = squeue_rows(&tasks, "%i %t", false);
        assert_eq!(rows, ["20_0 R", "20_[1-4] PD"]);
        assert_eq!(squeue_rows(&tasks, "%i", true).len(), 5);
    }

    #[test]
    fn flags_take_their_values_in_every_form() {
        let args: Vec<String> =
            ["-j12,13", "--format=%i", "-o", "%j", "--me", "-t"].map(String::from).to_vec();
        let mut flags = Flags::new(&args);
        let mut seen = Vec::new();
        while let Some(flag) = flags.next_flag() {
            let value =
                if flag == "--me" { Ok(String::new()) } else { flags.value().map_err(|e| e.to_string()) };
            seen.push((flag, value));
        }
        assert_eq!(seen[0], ("-j".to_string(), Ok("12,13".to_string())));
        assert_eq!(seen[1], ("--format".to_string(), Ok("%i".to_string())));
        assert_eq!(seen[2], ("-o".to_string(), Ok("%j".to_string())));
        assert_eq!(seen[4], ("-t".to_string(), Err("option '-t' requires an argument".to_string())));
    }

    proptest::proptest! {
        /// Whatever words a command line holds, reading it ends, without a panic.
        #[test]
        fn any_command_line_is_read_to_its_end(args in proptest::collection::vec("-{0,2}[a-z=%0-9,]{0,6}", 0..8)) {
            let mut flags = Flags::new(&args);
            let mut steps = 0;
            while flags.next_flag().is_some() {
                let _ = flags.value();
                steps += 1;
                proptest::prop_assert!(steps <= args.len());
            }
        }
    }

    #[test]
    fn nodes_are_grouped_by_state() {
        let node = |name: &str, used: u32, status: &str| api::Node {
            name: name.into(),
            gpu_model: "H100".into(),
            gpus: 4,
            status: status.into(),
            unhealthy: None,
            gpus_used: used,
            gpus_held: 0,
            held: Vec::new(),
            last_heartbeat: String::new(),
            jobs: Vec::new(),
            placements: Vec::new(),
            drained_for: None,
            gpus_out: Vec::new(),
            warnings: Vec::new(),
        };
        let mut faulted = node("node-4", 0, "up");
        faulted.gpus_out.push(api::GpuOutOfService {
            gpu: 3,
            reason: "GPU 3: Xid 79 (fallen off the bus)".into(),
            since: String::new(),
            until_returned: false,
        });
        let nodes = [
            node("node-0", 0, "up"),
            node("node-1", 0, "up"),
            node("node-2", 4, "up"),
            node("node-3", 1, "draining"),
            faulted,
        ];
        let text = sinfo_rows(&nodes, &[("spot".into(), true)]);
        assert!(text.contains("spot*        up   infinite      1  alloc node-2"), "{text}");
        assert!(text.contains("spot*        up   infinite      2   idle node-[0-1]"), "{text}");
        assert!(
            text.contains("spot*        up   infinite      1    mix node-4"),
            "a GPU out is taken: {text}"
        );
        assert!(text.contains("draining node-3"), "{text}");
    }
}
