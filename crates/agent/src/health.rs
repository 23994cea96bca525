//! The node's health: NVML's readings of its GPUs (or, with simulated
//! GPUs, the findings a file names), and the operator's own check, read
//! every `--health-interval` and before the node takes work. What is found
//! is reported whole whenever it changes, and with every registration;
//! the server decides what each finding does (`ebb_api::HealthClass`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_api::{AgentEvent, Finding, GpuFinding};
use tokio::sync::Notify;

use crate::gpus::NvmlReadings;
use crate::report::{now_ms, Reporter};

/// How the agent reads its node's health.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// How often the readings and the check are taken (`--health-interval`).
    pub interval: Duration,
    /// The operator's check, run with `sh -c` (`--health-check`).
    pub check: Option<String>,
    /// How long the check may run before it counts as failed.
    pub check_timeout: Duration,
    /// Simulated GPUs' findings: a file of `GpuFinding`s, one JSON object
    /// a line, read at every interval (`--fake-gpu-faults`).
    pub fake_faults: Option<PathBuf>,
}

impl Default for HealthConfig {
    fn default() -> HealthConfig {
        HealthConfig {
            interval: Duration::from_secs(30),
            check: None,
            check_timeout: Duration::from_secs(600),
            fake_faults: None,
        }
    }
}

/// Where the GPUs' readings come from.
enum Source {
    Nvml(Box<NvmlReadings>),
    File(PathBuf),
    None,
}

/// The node's health, read and reported.
pub(crate) struct Monitor {
    config: HealthConfig,
    gpus: u8,
    source: Source,
    /// Xid events seen since the agent started: a GPU that raised one
    /// stays suspect until the agent restarts (after the GPU's reset).
    xids: Mutex<Vec<GpuFinding>>,
    /// What was last found, all of it.
    current: Mutex<Vec<GpuFinding>>,
    /// Read again now (an Xid arrived).
    wake: Notify,
}

impl Monitor {
    /// `real`: the node's GPUs are NVML's (not `--fake-gpus`).
    pub(crate) fn new(config: HealthConfig, gpus: u8, real: bool) -> Arc<Monitor> {
        let source = match (&config.fake_faults, real) {
            (Some(file), _) => Source::File(file.clone()),
            (None, true) => match NvmlReadings::open() {
                Ok(readings) => Source::Nvml(Box::new(readings)),
                Err(e) => {
                    tracing::error!("GPU health is not read: {e}");
                    Source::None
                }
            },
            (None, false) => Source::None,
        };
        Arc::new(Monitor {
            config,
            gpus,
            source,
            xids: Mutex::new(Vec::new()),
            current: Mutex::new(Vec::new()),
            wake: Notify::new(),
        })
    }

    /// What was last found, for a registration.
    pub(crate) fn current(&self) -> Vec<GpuFinding> {
        self.current.lock().expect("health").clone()
    }

    /// Reads everything now; if it changed, remembers it and reports it.
    /// Returns what was found.
    pub(crate) async fn poll(&self, reporter: &Reporter) -> Vec<GpuFinding> {
        let mut found = self.readings();
        found.extend(self.xids.lock().expect("xids").iter().cloned());
        if let Some(check) = &self.config.check {
            found.extend(run_check(check, self.config.check_timeout, self.gpus).await);
        }
        found.retain(|f| f.gpu.is_none_or(|g| g < self.gpus));
        found.sort();
        found.dedup();
        found.truncate(ebb_api::MAX_HEALTH_FINDINGS);
        let changed = {
            let mut current = self.current.lock().expect("health");
            let changed = *current != found;
            current.clone_from(&found);
            changed
        };
        if changed {
            for f in &found {
                tracing::warn!(class = f.class().name(), "{}", f.describe());
            }
            reporter.send(AgentEvent::Health { findings: found.clone(), at_ms: now_ms() });
        }
        found
    }

    /// Polls every interval (sooner when an Xid arrives), for ever.
    pub(crate) async fn run(self: Arc<Self>, reporter: Arc<Reporter>) {
        if matches!(self.source, Source::Nvml(_)) {
            let monitor = self.clone();
            std::thread::Builder::new()
                .name("ebb-xid".into())
                .spawn(move || monitor.watch_xids())
                .expect("a thread for Xid events");
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                _ = self.wake.notified() => {}
            }
            self.poll(&reporter).await;
        }
    }

    fn watch_xids(self: Arc<Self>) {
        let Source::Nvml(readings) = &self.source else { return };
        let result = readings.watch_xids(|gpu, code| {
            if gpu != u8::MAX {
                tracing::error!(gpu, code, "Xid event");
                self.xids
                    .lock()
                    .expect("xids")
                    .push(GpuFinding { gpu: Some(gpu), finding: Finding::Xid { code } });
                self.wake.notify_one();
            }
            // Nobody else holds the monitor: the agent is gone.
            Arc::strong_count(&self) > 1
        });
        if let Err(e) = result {
            tracing::error!("Xid events are not watched: {e}");
        }
    }

    /// The GPUs' readings now, blocking for NVML's calls or the file's read.
    fn readings(&self) -> Vec<GpuFinding> {
        match &self.source {
            Source::Nvml(readings) => readings.read(),
            Source::File(path) => read_fake_faults(path),
            Source::None => Vec::new(),
        }
    }
}

/// The findings a `--fake-gpu-faults` file names now: one `GpuFinding` a
/// line as JSON (`{"gpu":3,"kind":"xid","code":79}`), blank lines and
/// `#` comments skipped. A missing file names none; a line that is not a
/// finding is skipped, saying so.
pub(crate) fn read_fake_faults(path: &std::path::Path) -> Vec<GpuFinding> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match serde_json::from_str::<GpuFinding>(line) {
            Ok(finding) => found.push(finding),
            Err(e) => tracing::error!("{}:{}: not a finding ({e}): {line}", path.display(), n + 1),
        }
    }
    found
}

/// Runs the operator's check: none found when it exits 0. Otherwise one
/// finding per GPU it names on a line of its own (`gpu 3` or `gpu 3:
/// why`), or one for the node when it names none.
async fn run_check(check: &str, timeout: Duration, gpus: u8) -> Vec<GpuFinding> {
    let mut command = tokio::process::Command::new("sh");
    command.arg("-c").arg(check).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let (code, output) = match tokio::time::timeout(timeout, command.output()).await {
        Ok(Ok(out)) if out.status.success() => return Vec::new(),
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            (out.status.code(), text)
        }
        Ok(Err(e)) => (None, format!("cannot run sh -c {check:?}: {e}")),
        Err(_) => (None, format!("ran past {}s", timeout.as_secs())),
    };
    let named: Vec<(u8, String)> =
        output.lines().filter_map(|l| named_gpu(l, gpus).map(|g| (g, l.into()))).collect();
    if named.is_empty() {
        return vec![GpuFinding { gpu: None, finding: Finding::CheckFailed { code, output: tail(&output) } }];
    }
    named
        .into_iter()
        .map(|(gpu, line)| GpuFinding {
            gpu: Some(gpu),
            finding: Finding::CheckFailed { code, output: tail(&line) },
        })
        .collect()
}

/// The GPU a check's line names: `gpu N` at its start, then the end of
/// the line or a non-digit.
fn named_gpu(line: &str, gpus: u8) -> Option<u8> {
    let rest = line.trim_start().strip_prefix("gpu ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<u8>().ok().filter(|g| *g < gpus)
}

/// The end of a check's output, within what a finding carries.
fn tail(text: &str) -> String {
    let chars: Vec<char> = text.trim_end().chars().collect();
    let from = chars.len().saturating_sub(ebb_api::MAX_CHECK_OUTPUT_CHARS);
    chars[from..].iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_names_gpus_by_lines_of_their_own() {
        assert_eq!(named_gpu("gpu 3: ECC test failed", 8), Some(3));
        assert_eq!(named_gpu("  gpu 7", 8), Some(7));
        assert_eq!(named_gpu("gpu 8: no such GPU", 8), None);
        assert_eq!(named_gpu("gpu 300", 8), None);
        assert_eq!(named_gpu("the gpu 3 is fine", 8), None);
        assert_eq!(named_gpu("gpu x", 8), None);
    }

    #[test]
    fn a_long_output_keeps_its_end_within_the_limit() {
        let long = format!("{}end", "é".repeat(5000));
        let kept = tail(&long);
        assert_eq!(kept.chars().count(), ebb_api::MAX_CHECK_OUTPUT_CHARS);
        assert!(kept.ends_with("end"));
    }

    #[tokio::test]
    async fn a_failing_check_marks_the_gpus_it_names_or_the_node() {
        assert!(run_check("true", Duration::from_secs(5), 8).await.is_empty());
        let node = run_check("echo fan stalled; exit 3", Duration::from_secs(5), 8).await;
        assert_eq!(
            node,
            vec![GpuFinding {
                gpu: None,
                finding: Finding::CheckFailed { code: Some(3), output: "fan stalled".into() }
            }]
        );
        let gpus =
            run_check("echo 'gpu 2: memory test'; echo 'gpu 5'; exit 1", Duration::from_secs(5), 8).await;
        assert_eq!(gpus.iter().map(|f| f.gpu).collect::<Vec<_>>(), vec![Some(2), Some(5)]);
        let slow = run_check("sleep 5", Duration::from_millis(200), 8).await;
        assert!(
            matches!(&slow[0].finding, Finding::CheckFailed { code: None, output } if output.contains("ran past"))
        );
    }

    #[test]
    fn a_faults_file_names_findings_and_skips_what_is_not_one() {
        let path = std::env::temp_dir().join(format!("ebb-faults-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        assert!(read_fake_faults(&path).is_empty(), "no file, no finding");
        std::fs::write(
            &path,
            "# GPU 3 fell off the bus\n{\"gpu\":3,\"kind\":\"xid\",\"code\":79}\n\nnonsense\n\
             {\"gpu\":5,\"kind\":\"throttled\",\"reason\":\"thermal\"}\n",
        )
        .unwrap();
        let found = read_fake_faults(&path);
        assert_eq!(
            found,
            vec![
                GpuFinding { gpu: Some(3), finding: Finding::Xid { code: 79 } },
                GpuFinding {
                    gpu: Some(5),
                    finding: Finding::Throttled { reason: ebb_api::Throttle::Thermal }
                },
            ]
        );
        std::fs::remove_file(&path).unwrap();
    }
}
