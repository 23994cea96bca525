//! The commands about jobs: `jobs`, `show`, `logs`, `cancel`.

use std::collections::BTreeMap;
use std::fmt::Write;

use clap::Args;
use ebb_api as api;
use ebb_core::{bytes_text, count, Span};

use crate::client::Connection;

use crate::error::{failed, usage, CliError};
use crate::output::{json, JsonFlag};

#[derive(Args)]
pub struct JobsArgs {
    /// Only jobs in these states, comma-separated: queued, starting,
    /// running, draining, succeeded, failed, cancelled; active = the
    /// unfinished four. An array is listed when any task matches.
    #[arg(long, value_name = "STATE[,STATE...]")]
    pub state: Option<String>,
    /// Only jobs of this tier.
    #[arg(long, value_parser = crate::output::tier)]
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

pub async fn jobs(conn: &Connection, args: &JobsArgs) -> Result<String, CliError> {
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
    let mut text = job_table(&jobs, ebb_core::time::unix_ms(std::time::SystemTime::now()));
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
            match j.max_gpus {
                Some(max) => format!("{}:{max}", j.gpus),
                None => j.gpus.to_string(),
            },
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

pub async fn show(conn: &Connection, id: u64, why: bool, out: &JsonFlag) -> Result<String, CliError> {
    let job: api::Job = conn.client()?.get(&format!("/v1/jobs/{id}")).await?;
    if out.json {
        return Ok(json(&job));
    }
    Ok(show_text(&job, why))
}

/// `ebb show` for people; `why`: the checkpoint interval's reasoning even
/// for a job that has never reported a checkpoint.
fn show_text(job: &api::Job, why: bool) -> String {
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
        match job.max_gpus {
            Some(max) => {
                let now: usize = job.placement.iter().map(|p| p.gpus.len()).sum();
                let now = if now > 0 { format!(", on {now} now") } else { String::new() };
                format!("{} to {max} GPUs, elastic{now}", job.gpus)
            }
            None => count(u64::from(job.gpus), "GPU"),
        },
        job.gpu_model.as_ref().map(|m| format!(" of {m}")).unwrap_or_default()
    )
    .unwrap();
    writeln!(text, "  tenant       {}", job.tenant).unwrap();
    if job.priority != 0 {
        let class = super::submit::PRIORITY_CLASSES
            .iter()
            .find(|(_, n)| *n == job.priority)
            .map(|(name, _)| format!(" ({name})"))
            .unwrap_or_default();
        writeln!(
            text,
            "  priority     {}{class}: its place among {}'s own {} jobs, higher first",
            job.priority, job.tenant, job.tier
        )
        .unwrap();
    }
    writeln!(text, "  command      {}", job.argv.join(" ")).unwrap();
    if let Some(image) = &job.image {
        writeln!(text, "  image        {}  ({})", image.reference, image.digest).unwrap();
    }
    if let Some(p) = &job.pulling {
        let percent = (p.done_bytes.saturating_mul(100)).checked_div(p.total_bytes).unwrap_or(100);
        writeln!(text, "  pulling      {}, {percent}% on {}", bytes_text(p.total_bytes), p.node).unwrap();
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
        writeln!(text, "  placement    {}", api::events::on_gpus(&p.node, &p.gpus)).unwrap();
    }
    if let Some(code) = job.exit_code {
        writeln!(text, "  exit code    {code}").unwrap();
    }
    writeln!(text, "  submitted    {}", job.submitted_at).unwrap();
    if !job.run_id.is_empty() {
        writeln!(text, "  run          {}  (EBB_RUN_ID of every attempt: one run in a tracker)", job.run_id)
            .unwrap();
    }
    match &job.last_checkpoint {
        Some(c) => {
            let step = c.step.map(|s| format!("step {s}, ")).unwrap_or_default();
            let bytes = c.bytes.map(|b| format!("{}, ", bytes_text(b))).unwrap_or_default();
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
    // The interval means something to a job that checkpoints; for one that
    // never said it does, only when asked.
    let interval = (job.checkpoint_interval_s, &job.checkpoint_interval_why);
    if let (Some(secs), Some(why), true) = (interval.0, interval.1, why || job.last_checkpoint.is_some()) {
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
            api::events::gpu_time(job.lost_gpu_seconds, Some(job.gpus)),
            count(u64::from(job.preemptions), "preemption")
        )
        .unwrap();
    }
    for u in &job.usage {
        // A promoted attempt's parts at their rates, an elastic one's
        // nodes on their GPUs.
        let rates = match u.segments.as_slice() {
            [] => format!("{} GPU-s at ${}/GPU-h", u.gpu_seconds, crate::money::rate(u.rate_micro_usd)),
            parts => parts
                .iter()
                .map(|p| {
                    let gpu_seconds = p.seconds * u64::from(if p.gpus > 0 { p.gpus } else { u.gpus });
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
        let detail = e.event.describe(job.gpus);
        writeln!(text, "  {}  #{:<3} {:<16} {}", e.at, e.attempt, e.kind(), detail).unwrap();
    }
    text
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
pub async fn logs(
    conn: &Connection,
    id: u64,
    follow: bool,
    tail: Option<usize>,
    view: LogView,
) -> Result<(), CliError> {
    use std::io::Write;
    let client = conn.client()?;
    if follow {
        // A job that has not started has no output yet: say what it waits
        // for, once, on standard error, then follow.
        let job: api::Job = client.get(&format!("/v1/jobs/{id}")).await?;
        if let Some(line) = waiting_line(&job) {
            eprintln!("{line}");
        }
    }
    let mut offset = 0;
    let mut labels = Labels::default();
    if let Some(lines) = tail {
        // The log has no index of lines: it is read to its end, keeping the
        // last `lines` (a job's log is bounded per attempt on its node),
        // then followed from there with --follow.
        let mut last = LastLines::new(lines);
        loop {
            let chunk: api::LogChunk =
                client.get(&format!("/v1/jobs/{id}/logs?offset={offset}&label={}", view.label)).await?;
            if let Some(at) = &chunk.removed {
                return Err(removed(id, at));
            }
            last.push(&if view.label { labels.apply(&chunk) } else { chunk.data.clone() });
            offset = chunk.next_offset;
            if chunk.data.is_empty() || chunk.finished {
                break;
            }
        }
        let text = last.text();
        let text = if view.escape { crate::shown::terminal_safe(&text).into_owned() } else { text };
        let mut stdout = std::io::stdout().lock();
        if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() || !follow {
            return Ok(());
        }
    }
    loop {
        let path = format!("/v1/jobs/{id}/logs?offset={offset}&follow={follow}&label={}", view.label);
        let chunk: api::LogChunk = client.get(&path).await?;
        if let (Some(at), 0) = (&chunk.removed, offset) {
            return Err(removed(id, at));
        }
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

/// What `ebb logs -f` says of a job that has not started yet.
fn waiting_line(job: &api::Job) -> Option<String> {
    if job.state != "queued" {
        return None;
    }
    let why = match (&job.pending_detail, &job.pending_reason) {
        (Some(detail), Some(code)) => format!(": {detail} ({code})"),
        _ => String::new(),
    };
    Some(format!("ebb logs: job {} is queued{why}; its output follows once it starts", job.id))
}

/// Why a finished job's log is empty: its output was removed.
fn removed(id: u64, at: &str) -> CliError {
    failed(format!(
        "job {id}: its output was removed at {at}: the server keeps a finished job's output for its --keep-output"
    ))
}

/// The last `n` lines of a text that comes in pieces (a line may span
/// pieces; one not ended yet counts as a line).
struct LastLines {
    n: usize,
    lines: std::collections::VecDeque<String>,
    open: bool,
}

impl LastLines {
    fn new(n: usize) -> LastLines {
        LastLines { n, lines: std::collections::VecDeque::new(), open: false }
    }

    fn push(&mut self, text: &str) {
        for piece in text.split_inclusive('\n') {
            match (self.open, self.lines.back_mut()) {
                (true, Some(line)) => line.push_str(piece),
                _ => self.lines.push_back(piece.to_string()),
            }
            self.open = !piece.ends_with('\n');
            while self.lines.len() > self.n {
                self.lines.pop_front();
            }
        }
    }

    fn text(&self) -> String {
        self.lines.iter().map(String::as_str).collect()
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
/// fail once the others are done — except a task of the array that ended
/// by itself between the listing and its cancel.
pub async fn cancel(
    conn: &Connection,
    ids: &[u64],
    array: Option<u64>,
    grace: Option<ebb_core::Span>,
    out: &JsonFlag,
) -> Result<String, CliError> {
    let client = conn.client()?;
    let mut wanted = ids.to_vec();
    if let Some(array) = array {
        let job: api::Job = client.get(&format!("/v1/jobs/{array}")).await?;
        let progress =
            job.progress.ok_or_else(|| usage(format!("--array {array}: job {array} is not an array")))?;
        if job.array.as_ref().is_some_and(|a| a.id != array) {
            return Err(usage(format!(
                "--array {array}: job {array} is a task of array {}",
                job.array.unwrap().id
            )));
        }
        let done = ["succeeded", "failed", "cancelled"];
        wanted.extend(progress.tasks.iter().filter(|t| !done.contains(&t.state.as_str())).map(|t| t.id));
    }
    if wanted.is_empty() {
        return Err(usage("nothing to cancel: give job ids, or --array ID"));
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
            Err(e) if e.refused_with() == Some(422) => return Err(e.into()),
            // A task of the array that ended by itself since it was listed
            // is not a failure of the command (a job named is).
            Err(e)
                if !ids.contains(&id)
                    && e.refused_with() == Some(409)
                    && e.to_string().contains(": already ") =>
            {
                writeln!(text, "job {id}: ended before it could be cancelled").unwrap();
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    if out.json {
        text = json(&jobs);
    }
    match failed.is_empty() {
        true => Ok(text),
        false => {
            print!("{text}");
            Err(crate::error::failed(failed.join("\n")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// However the log is cut into chunks, `--tail N` keeps exactly
        /// its last N lines (the last one possibly unfinished), for any N.
        #[test]
        fn the_last_lines_do_not_depend_on_where_chunks_end(
            text in "[a-c\n]{0,200}",
            cuts in proptest::collection::vec(0usize..200, 0..8),
            n in 0usize..12,
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut last = LastLines::new(n);
            let mut from = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                last.push(&text[from..cut]);
                from = cut;
            }
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let want: String = lines[lines.len().saturating_sub(n)..].concat();
            proptest::prop_assert_eq!(last.text(), want);
        }
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
            removed: None,
        };
        let mut labels = Labels::default();
        let first = chunk(0, "up\nloss 1\nsaving", vec![source(0, "node-1"), source(3, "node-0")]);
        assert_eq!(labels.apply(&first), "node-1: up\nnode-0: loss 1\nnode-0: saving");
        let second = chunk(16, " weights\ndone\n", vec![source(10, "node-0"), source(25, "node-1")]);
        assert_eq!(labels.apply(&second), " weights\nnode-1: done\n");
        let mut plain = Labels::default();
        assert_eq!(plain.apply(&chunk(0, "a\nb\n", vec![])), "a\nb\n");
    }

    /// A job that waits, as the API gives it (`writer::reasons` checks
    /// what the server says; this, how the CLI shows it).
    fn waiting(id: u64, reason: Option<&str>, detail: Option<&str>) -> api::Job {
        serde_json::from_value(serde_json::json!({
            "id": id, "tenant": "default", "name": null, "tier": "on-demand", "gpus": 4,
            "gpu_model": "H100-80GB", "argv": ["sleep", "600"], "state": "queued", "attempt": 0,
            "preemptions": 0, "retries": 0, "submitted_at": "2026-12-03T12:00:00Z", "placement": [],
            "lost_gpu_seconds": 0.0, "pending_reason": reason, "pending_detail": detail,
        }))
        .unwrap()
    }

    #[test]
    fn a_waiting_jobs_reason_is_its_rows_last_column_and_its_sentence_in_show() {
        let why = "on-demand may use 4 of 8 H100-80GB: 4 are reserved, and on-demand work uses 4";
        let jobs = [waiting(3, Some("reservation_cap"), Some(why)), waiting(4, None, None)];
        let table = job_table(&jobs, 1_796_300_000_000);
        let mut rows = table.lines();
        assert_eq!(rows.next().unwrap().split_whitespace().last(), Some("REASON"), "{table}");
        assert!(rows.next().unwrap().ends_with(" reservation_cap"), "{table}");
        assert!(rows.next().unwrap().ends_with(" -"), "a job that waits for nothing: {table}");
        let shown = show_text(&jobs[0], false);
        assert!(shown.contains(&format!("\n  waiting      {why} (reservation_cap)\n")), "{shown}");
        assert!(!show_text(&jobs[1], false).contains("waiting "));
    }

    /// `ebb logs -f` of a job that has not started says what it waits
    /// for; of one that has, nothing.
    #[test]
    fn following_a_queued_jobs_log_says_what_it_waits_for() {
        let queued = waiting(9, Some("resources"), Some("waits for 4 free H100-80GB GPUs"));
        assert_eq!(
            waiting_line(&queued).unwrap(),
            "ebb logs: job 9 is queued: waits for 4 free H100-80GB GPUs (resources); its output follows once it starts"
        );
        assert_eq!(
            waiting_line(&waiting(10, None, None)).unwrap(),
            "ebb logs: job 10 is queued; its output follows once it starts"
        );
        let mut running = waiting(11, None, None);
        running.state = "running".into();
        assert_eq!(waiting_line(&running), None);
    }

    /// A job's priority shows in `ebb show`, named when it is a class's,
    /// and not at all when it is the default.
    #[test]
    fn a_jobs_priority_is_shown_with_its_class() {
        let mut job = waiting(5, None, None);
        assert!(!show_text(&job, false).contains("priority"));
        job.priority = 100;
        let shown = show_text(&job, false);
        let line =
            "\n  priority     100 (high): its place among default's own on-demand jobs, higher first\n";
        assert!(shown.contains(line), "{shown}");
        job.priority = -7;
        assert!(show_text(&job, false).contains("\n  priority     -7: its place"));
    }

    #[test]
    fn task_indices_read_as_ranges() {
        assert_eq!(ranges(&[9, 0, 1, 2, 3, 7, 10, 11, 12]), "0-3, 7, 9-12");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
    }
}
