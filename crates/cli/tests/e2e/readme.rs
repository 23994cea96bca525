//! The README's workload commands, run as written: from a directory with
//! the repository's `examples/`, with the virtual environment `scripts/test`
//! makes on `PATH`, against `ebb up`. A job runs where it was submitted,
//! with the submitter's environment, so `python3` is the environment's and
//! the SDK imports.

use std::process::Command;
use std::time::Duration;

use crate::support;
use crate::support::{repo_root, wait_for, Up};
use serde_json::Value;

/// The README's workload block: one command per entry, continuation lines
/// joined, comments and placeholders (`ebb show ID`) left out.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section =
        readme.split("### Workloads that survive preemption").nth(1).expect("the workloads section");
    let block = section.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.split(" # ").next().unwrap().trim_end();
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands.retain(|c| !c.contains(" ID"));
    commands
}

/// The ids a submission printed: "submitted job N" or "... jobs A-B".
fn submitted(text: &str) -> Vec<u64> {
    let last = text.split_whitespace().last().unwrap();
    match last.split_once('-') {
        Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
        None => vec![last.parse().unwrap()],
    }
}

#[test]
fn the_readme_workload_commands_work_as_written() {
    let commands = readme_commands();
    assert!(commands.len() >= 6, "{commands:?}");
    let here = std::env::temp_dir().join(format!("ebb-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&here);
    std::fs::create_dir_all(&here).unwrap();
    std::os::unix::fs::symlink(repo_root().join("examples"), here.join("examples")).unwrap();
    let up = Up::start_with(&here.join("ebb-data"), 2);
    // `alias ebb=...` and `export PATH=$PWD/target/py/bin:$PATH`, as the README says.
    let bin = std::path::Path::new(support::ebb_exe()).parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        repo_root().join("target/py/bin").display(),
        std::env::var("PATH").unwrap()
    );
    let run = |command: &str| -> String {
        let out = Command::new("bash")
            .args(["-c", command])
            .current_dir(&here)
            .env("PATH", &path)
            .envs(up.env.clone())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let mut batch = Vec::new();
    let mut service = None;
    for command in &commands {
        let said = run(command);
        if command.starts_with("ebb submit") {
            let ids = submitted(&said);
            if command.contains("--restart always") {
                service = Some(ids[0]);
            } else {
                batch.extend(ids);
            }
        }
    }
    let job = |id: u64| -> Value { serde_json::from_str(&run(&format!("ebb show {id} --json"))).unwrap() };
    for id in &batch {
        let j = wait_for(&format!("job {id} to end"), Duration::from_secs(300), || {
            let j = job(*id);
            matches!(j["state"].as_str(), Some("succeeded" | "failed" | "cancelled")).then_some(j)
        });
        assert_eq!(j["state"], "succeeded", "job {id}: {}", run(&format!("ebb logs {id}")));
    }
    assert!(here.join("weights.npy").exists(), "the training run's weights");
    run("python3 examples/batch_inference.py check --data infer");
    // The service serves, on-demand, until cancelled.
    let service = service.expect("the README starts a service");
    wait_for("the service to run", Duration::from_secs(60), || {
        (job(service)["state"] == "running").then_some(())
    });
    run(&format!("ebb cancel {service}"));
    drop(up);
    let _ = std::fs::remove_dir_all(&here);
}
