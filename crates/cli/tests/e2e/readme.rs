//! The README, run as written: its five-minute tour (the Python setup, a
//! preemption, the resume, a drill, the bill) and its workload commands,
//! from a directory that holds the repository's `examples/` and `sdk/`,
//! against `ebb up` with its defaults. A job runs where it was submitted,
//! with the submitter's environment, so `python3` is the one the README's
//! setup made and the SDK imports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support;
use crate::support::{repo_root, wait_for, Up};
use serde_json::Value;

/// The fenced `sh` blocks of the README section headed `heading`.
fn blocks(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = readme.split(heading).nth(1).unwrap_or_else(|| panic!("no section {heading:?}"));
    let section = section.split("\n## ").next().unwrap();
    section.split("```sh\n").skip(1).map(|b| b.split("```").next().unwrap().to_string()).collect()
}

/// A block's commands: continuation lines joined, comments left out; a
/// new group starts at each comment that begins `# N.`.
fn groups(block: &str) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    let mut current = String::new();
    for line in block.lines() {
        if let Some(comment) = line.trim_start().strip_prefix('#') {
            let numbered = comment.trim_start().split('.').next().is_some_and(|n| n.parse::<u32>().is_ok());
            if numbered && !groups.last().unwrap().is_empty() {
                groups.push(Vec::new());
            }
            continue;
        }
        let line = line.split("  # ").next().unwrap().trim_end();
        if line.trim().is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                groups.last_mut().unwrap().push(std::mem::take(&mut current));
            }
        }
    }
    groups
}

/// The ids a submission printed: "submitted job N" or "... jobs A-B".
fn submitted(text: &str) -> Vec<u64> {
    let last = text.split_whitespace().last().unwrap();
    match last.split_once('-') {
        Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
        None => vec![last.parse().unwrap()],
    }
}

/// A shell in the tour's directory, in the second terminal the README
/// describes: `ebb up`'s export line pasted, `target/release/ebb` there.
struct Terminal {
    here: PathBuf,
    env: Vec<(String, String)>,
    /// The setup block's `alias` and `export` lines, which every later
    /// command of the same terminal has.
    prelude: String,
}

impl Terminal {
    fn run(&self, commands: &str) -> String {
        let script = format!("set -e\nshopt -s expand_aliases\n{}\n{commands}\n", self.prelude);
        let out = Command::new("bash")
            .args(["-c", &script])
            .current_dir(&self.here)
            .env_remove("EBB_CONFIG")
            .envs(self.env.clone())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{commands}\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    }

    fn job(&self, id: u64) -> Value {
        serde_json::from_str(&self.run(&format!("ebb show {id} --json"))).unwrap()
    }
}

fn link(from: &Path, to: &Path) {
    std::os::unix::fs::symlink(from, to).unwrap();
}

#[test]
fn the_readme_tour_and_workload_commands_work_as_written() {
    let tour = blocks("## Five minutes with Ebb");
    let (setup, tour) = (&groups(&tour[0])[0], groups(&tour[1]));
    assert!(setup.len() == 3 && tour.len() == 4, "{setup:?} {tour:?}");
    let here = std::env::temp_dir().join(format!("ebb-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&here);
    std::fs::create_dir_all(here.join("target/release")).unwrap();
    link(&repo_root().join("examples"), &here.join("examples"));
    link(&repo_root().join("sdk"), &here.join("sdk"));
    link(Path::new(support::ebb_exe()), &here.join("target/release/ebb"));
    // `ebb up`, as the README's first command starts it (on any free port).
    let up = Up::start_default(&here.join("ebb-data"));
    let mut terminal = Terminal { here: here.clone(), env: up.env.clone(), prelude: String::new() };
    // The Python setup, once; its alias and export hold for what follows.
    terminal.run(&setup.join("\n"));
    terminal.prelude = setup
        .iter()
        .filter(|l| l.starts_with("alias ") || l.starts_with("export "))
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");

    // 1-2: the training starts, the notebook takes the other node. A
    // reader takes longer than a script to type the next command: the
    // training has begun by then.
    for group in &tour[..2] {
        terminal.run(&group.join("\n"));
    }
    wait_for("the training to begin", Duration::from_secs(60), || {
        terminal.run("ebb logs 1").contains("attempt 1: training from step 0").then_some(())
    });
    // 3: serving preempts the training, which saves on the notice and leaves.
    let (submit, look) = tour[2].split_first().unwrap();
    terminal.run(submit);
    wait_for("the training to be requeued", Duration::from_secs(60), || {
        (terminal.job(1)["preemptions"] == 1).then_some(())
    });
    let shown = terminal.run(&look.join("\n"));
    for kind in ["drain_notice", "checkpoint", "exited", "requeued"] {
        assert!(shown.lines().any(|l| l.contains(&format!("#1   {kind}"))), "{kind}: {shown}");
    }
    assert!(
        shown.contains("preempted by job 3") && shown.contains("requeued         preempted; lost"),
        "{shown}"
    );
    assert!(shown.contains("drain notice: saved step"), "the job's own log: {shown}");
    // 4: once serving has ended, attempt 2 resumes from the save.
    wait_for("the training to resume", Duration::from_secs(90), || {
        let job = terminal.job(1);
        job["events"].as_array()?.iter().any(|e| e["kind"] == "resumed" && e["attempt"] == 2).then_some(())
    });
    let said = terminal.run(&tour[3].join("\n"));
    assert!(said.contains("#2   resumed          from step "), "{said}");
    assert!(said.contains("verdict: ready"), "{said}");
    let bill = said.lines().find(|l| l.starts_with("preemptible ")).unwrap_or_else(|| panic!("{said}"));
    assert!(bill.contains("1.0000"), "{said}");
    for id in [1, 2] {
        wait_for("the tour's jobs to end", Duration::from_secs(30), || {
            (terminal.job(id)["state"] == "cancelled").then_some(())
        });
    }
    // The training's own log tells a cancel from a drain.
    let log = terminal.run("ebb logs 1");
    assert!(
        log.contains("cancel notice: saved step") && log.contains("(cancelled: no attempt follows)"),
        "{log}"
    );

    // The workload commands, each as written, then every batch job to its end.
    let workloads = blocks("## Workloads that survive preemption");
    let commands = &groups(&workloads[0])[0];
    assert!(commands.len() >= 6, "{commands:?}");
    let mut batch = Vec::new();
    let mut service = None;
    for command in commands {
        let said = terminal.run(command);
        if command.starts_with("ebb submit") {
            let ids = submitted(&said);
            match command.contains("--restart always") {
                true => service = Some(ids[0]),
                false => batch.extend(ids),
            }
        }
    }
    // Taking a node away drained some of the batch work, which resumed.
    wait_for("the reclaim to drain batch work", Duration::from_secs(60), || {
        batch.iter().any(|id| terminal.job(*id)["preemptions"].as_u64() >= Some(1)).then_some(())
    });
    for id in &batch {
        let j = wait_for(&format!("job {id} to end"), Duration::from_secs(300), || {
            let j = terminal.job(*id);
            matches!(j["state"].as_str(), Some("succeeded" | "failed" | "cancelled")).then_some(j)
        });
        assert_eq!(j["state"], "succeeded", "job {id}: {}", terminal.run(&format!("ebb logs {id}")));
    }
    assert!(here.join("tour/weights-periodic.npy").exists(), "the training run's weights");
    terminal.run("python3 examples/batch_inference.py check --data tour/infer");
    // The service serves, on-demand, until cancelled.
    let service = service.expect("the README starts a service");
    wait_for("the service to run", Duration::from_secs(60), || {
        (terminal.job(service)["state"] == "running").then_some(())
    });
    terminal.run(&format!("ebb cancel {service}"));
    drop(up);
    let _ = std::fs::remove_dir_all(&here);
}
