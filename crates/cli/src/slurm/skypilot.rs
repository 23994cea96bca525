//! The Slurm command lines a real SkyPilot run sent its login node
//! (`scripts/skypilot-run` records them; `skypilot-commands.jsonl` holds
//! one of each command and set of options, job ids and SkyPilot's job
//! names as `{JOB}` and `{NAME}`), read by Ebb's front door as Slurm reads
//! them: nothing refused, nothing ignored that SkyPilot relies on, and
//! each read as SkyPilot means it. The end-to-end test
//! `slurm::skypilot_queries_answer_as_skypilot_reads_them` runs the
//! queries among them against a cluster.

use super::options::{self, Command};

/// The recorded command lines, with `job` and `name` for the placeholders.
pub fn recorded(job: &str, name: &str) -> Vec<Vec<String>> {
    include_str!("skypilot-commands.jsonl")
        .lines()
        .map(|line| {
            let line = line.replace("{JOB}", job).replace("{NAME}", name).replace("{DIR}", "/home/sky");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
        })
        .collect()
}

/// SkyPilot's own listing of a task's steps to cancel them (`squeue -s`),
/// which Ebb refuses by name: Ebb's squeue lists jobs, not steps.
fn lists_steps(argv: &[String]) -> bool {
    argv[0] == "squeue" && argv.iter().any(|a| a == "-s")
}

#[test]
fn skypilot_command_lines_are_read_as_slurm_reads_them() {
    let lines = recorded("7", "ebb-dev-0123abcd");
    assert!(lines.len() >= 15, "a recording of a whole run: {}", lines.len());
    for argv in lines {
        let command = Command::ALL.into_iter().find(|c| c.name() == argv[0]).expect("a Slurm command");
        let parsed = options::parse(command, &argv[1..], "");
        if lists_steps(&argv) {
            let refused = parsed.expect_err("squeue -s is refused").to_string();
            assert!(refused.contains("not on Ebb"), "{refused}");
            continue;
        }
        let (given, words) = parsed.unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        // What Ebb only notes (srun's --unbuffered, a step's --mem or
        // --exclusive, which Ebb does not account): none that changes
        // what SkyPilot gets back.
        for note in options::ignored_notes(command, &given) {
            let harmless = ["--unbuffered", "--mem", "--cpus-per-task", "--exclusive"];
            assert!(harmless.iter().any(|h| note.contains(h)), "{argv:?}: {note}");
        }
        match command {
            Command::Srun => {
                assert_eq!(options::last(&given, "jobid"), Some("7"), "{argv:?}");
                let program = words.first().map(String::as_str);
                assert!(
                    matches!(program, Some("bash" | "/bin/bash" | "rsync")),
                    "{argv:?}: runs {program:?}"
                );
            }
            Command::Sbatch => {
                assert_eq!(options::last(&given, "partition"), Some("preemptible"), "{argv:?}");
                assert!(words[0].ends_with(".sh"), "{argv:?}: the provision script");
            }
            Command::Squeue => {
                assert!(options::last(&given, "format").is_some(), "{argv:?}: SkyPilot names its fields");
                let names_the_job =
                    ["jobs", "name", "states", "nodelist"].iter().any(|o| options::flag(&given, o));
                assert!(names_the_job, "{argv:?}");
            }
            Command::Scancel => {
                assert_eq!(options::last(&given, "name"), Some("ebb-dev-0123abcd"), "{argv:?}")
            }
            Command::Scontrol | Command::Sinfo | Command::Sacct => {}
        }
    }
}
