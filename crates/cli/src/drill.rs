//! `ebb drill JOB`: a fire drill of a running preemptible job's drain.
//! The server gives the job a real notice with the cluster's window and
//! requeues it at once when it exits; this command starts the drill,
//! follows it by reading the job, says each step as it happens, and ends
//! with the verdict: exit status 0 only for `ready`.

use std::fmt::Write;
use std::time::{Duration, Instant};

use clap::Args;
use ebb_api as api;
use ebb_core::Span;

use crate::client::Connection;
use crate::error::{failed, CliError};
use crate::output::json;

#[derive(Args)]
pub struct DrillArgs {
    /// The job's id: a running preemptible job.
    pub id: u64,
    /// How long to wait for the next attempt to start once the drilled
    /// one has exited, and then for it to report resuming (500ms, 30s, 5m).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = Span::parse)]
    pub timeout: Span,
    /// Print the drill's report (the API's `drill` object) once it is
    /// over, instead of its steps as they happen.
    #[arg(long)]
    pub json: bool,
}

/// What the command waits for once the drilled attempt has exited.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Start,
    Resume,
}

/// How often the job is read while the drill goes on.
const POLL: Duration = Duration::from_millis(200);

pub async fn drill(conn: &Connection, args: &DrillArgs) -> Result<(), CliError> {
    let client = conn.client()?;
    let id = args.id;
    let mut job: api::Job = client.post(&format!("/v1/jobs/{id}/drill"), &serde_json::json!({})).await?;
    let mut said = Said::default();
    let timeout = Duration::from_millis(args.timeout.0);
    // The step waited for (after the exit: the next start; after that
    // start: the resume) and since when.
    let mut waiting: Option<(Wait, Instant)> = None;
    let drill = loop {
        let drill =
            job.drill.clone().ok_or_else(|| failed(format!("job {id}: the server shows no drill")))?;
        let text = said.news(&drill, &job);
        if !args.json {
            crate::write_stdout(&text)?;
        }
        if drill.verdict.is_some() {
            break drill;
        }
        // Until the exit, the deadline bounds the wait.
        let wait = match (drill.exited_ms, drill.next_started_ms) {
            (None, _) => None,
            (Some(_), None) => Some(Wait::Start),
            (Some(_), Some(_)) => Some(Wait::Resume),
        };
        match (wait, waiting) {
            (Some(wait), Some((was, since))) if wait == was => {
                if since.elapsed() >= timeout {
                    if args.json {
                        crate::write_stdout(&json(&drill))?;
                    }
                    let within = args.timeout.human();
                    return Err(failed(match (wait, drill.next_attempt) {
                        (Wait::Start, Some(next)) => {
                            format!("job {id}: attempt {next} did not start within {within}")
                        }
                        (Wait::Start, None) => format!("job {id}: not placed again within {within}"),
                        (Wait::Resume, next) => format!(
                            "job {id}: resume not confirmed within {within} of attempt {}'s start",
                            next.unwrap_or_default()
                        ),
                    }));
                }
            }
            (Some(wait), _) => waiting = Some((wait, Instant::now())),
            (None, _) => waiting = None,
        }
        tokio::time::sleep(POLL).await;
        job = client.get(&format!("/v1/jobs/{id}")).await?;
    };
    if args.json {
        crate::write_stdout(&json(&drill))?;
    }
    match drill.verdict.as_deref() {
        Some("ready") => Ok(()),
        _ => Err(failed(format!("job {id}: the drill failed: {}", drill.failures.join("; ")))),
    }
}

/// `+1.5s` from the notice; `-3s` before it.
fn since_notice(drill: &api::Drill, at_ms: u64) -> String {
    match at_ms.checked_sub(drill.notice_at_ms) {
        Some(after) => format!("+{}", Span(after).human()),
        None => format!("-{}", Span(drill.notice_at_ms - at_ms).human()),
    }
}

/// The steps of a drill already said, so that each is said once.
#[derive(Default)]
struct Said {
    notice: bool,
    /// The checkpoint said, by the time it was reported.
    checkpoint: Option<u64>,
    exit: bool,
    placed: bool,
    started: bool,
    resumed: bool,
}

impl Said {
    /// The lines for what happened since the last call.
    fn news(&mut self, d: &api::Drill, job: &api::Job) -> String {
        let mut text = String::new();
        if !std::mem::replace(&mut self.notice, true) {
            writeln!(
                text,
                "job {}: drain notice sent to attempt {} on {}; SIGKILL at {} (+{})",
                job.id,
                d.attempt,
                d.nodes.join(", "),
                d.deadline,
                Span::from_secs_f64(d.window_seconds).human()
            )
            .unwrap();
        }
        // While the attempt drains, its checkpoints show on the job; once
        // it exited, the drill says which one the next attempt is to
        // resume from.
        let saved = match (&d.checkpoint, &job.last_checkpoint) {
            (Some(c), _) => Some((c.at_ms, c.step)),
            (None, Some(c))
                if d.exited_ms.is_none() && c.attempt == d.attempt && c.at_ms >= d.notice_at_ms =>
            {
                Some((c.at_ms, c.step))
            }
            _ => None,
        };
        if let Some((at_ms, step)) = saved {
            if self.checkpoint != Some(at_ms) {
                self.checkpoint = Some(at_ms);
                let step = step.map(|s| format!(" (step {s})")).unwrap_or_default();
                writeln!(text, "checkpoint reported at {}{step}", since_notice(d, at_ms)).unwrap();
            }
        }
        if let (Some(exited_ms), Some(how)) = (d.exited_ms, &d.exit) {
            if !std::mem::replace(&mut self.exit, true) {
                let margin = d.margin_seconds.unwrap_or(0.0);
                let fit = match d.fit_window {
                    Some(true) => format!("{} before the deadline", Span::from_secs_f64(margin).human()),
                    _ => "past the window".to_string(),
                };
                let lost = d.lost_seconds.unwrap_or(0.0);
                writeln!(
                    text,
                    "{how} at {}: {fit}; {} of work since its last save",
                    since_notice(d, exited_ms),
                    Span::from_secs_f64(lost).human()
                )
                .unwrap();
                if d.requeued {
                    writeln!(text, "requeued at once").unwrap();
                }
            }
        }
        if let (Some(next), Some(node)) = (d.next_attempt, &d.next_node) {
            if !std::mem::replace(&mut self.placed, true) {
                writeln!(text, "attempt {next} placed on {node}").unwrap();
            }
            if let Some(started) = d.next_started_ms {
                if !std::mem::replace(&mut self.started, true) {
                    writeln!(text, "attempt {next} started at {}", since_notice(d, started)).unwrap();
                }
            }
        }
        if let Some(at_ms) = d.resumed_ms {
            if !std::mem::replace(&mut self.resumed, true) {
                let step = match d.resumed_step {
                    Some(step) => format!("step {step}"),
                    None => "its latest checkpoint".to_string(),
                };
                writeln!(text, "resumed from {step} at {}", since_notice(d, at_ms)).unwrap();
            }
        }
        if d.verdict.is_some() {
            text.push_str(&verdict(d));
        }
        text
    }
}

/// `verdict: ready`, or `verdict: failed` and a line per failure.
pub fn verdict(d: &api::Drill) -> String {
    let mut text = format!("verdict: {}\n", d.verdict.as_deref().unwrap_or("pending"));
    for failure in &d.failures {
        writeln!(text, "  - {failure}").unwrap();
    }
    text
}

/// The drill as `ebb show` prints it: where it stands, in a few lines.
pub fn summary(d: &api::Drill) -> Vec<String> {
    let mut lines = vec![format!(
        "attempt {} on {}: notice {}, deadline +{}",
        d.attempt,
        d.nodes.join(", "),
        d.notice_at,
        Span::from_secs_f64(d.window_seconds).human()
    )];
    let mut exit = Vec::new();
    if let Some(c) = &d.checkpoint {
        let step = c.step.map(|s| format!(" of step {s}")).unwrap_or_default();
        exit.push(format!("checkpoint{step} at {}", since_notice(d, c.at_ms)));
    }
    if let (Some(at_ms), Some(how)) = (d.exited_ms, &d.exit) {
        let margin = d.margin_seconds.unwrap_or(0.0);
        let margin = match d.fit_window {
            Some(true) => format!("{} before the deadline", Span::from_secs_f64(margin).human()),
            _ => "past the window".into(),
        };
        let lost = Span::from_secs_f64(d.lost_seconds.unwrap_or(0.0)).human();
        exit.push(format!("{how} at {} ({margin}, lost {lost})", since_notice(d, at_ms)));
    }
    if !exit.is_empty() {
        lines.push(exit.join("; "));
    }
    if let (Some(next), Some(node)) = (d.next_attempt, &d.next_node) {
        let mut line = format!("attempt {next} on {node}");
        if let Some(at_ms) = d.next_started_ms {
            write!(line, " started at {}", since_notice(d, at_ms)).unwrap();
        }
        if let Some(at_ms) = d.resumed_ms {
            let step = d.resumed_step.map(|s| format!(" from step {s}")).unwrap_or_default();
            write!(line, ", resumed{step} at {}", since_notice(d, at_ms)).unwrap();
        }
        lines.push(line);
    }
    match d.verdict.as_deref() {
        Some(v) if d.failures.is_empty() => lines.push(format!("verdict: {v}")),
        Some(v) => lines.push(format!("verdict: {v}: {}", d.failures.join("; "))),
        None => lines.push("verdict: pending".into()),
    }
    lines
}
