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

/// What Ebb refuses by name of what SkyPilot sends, and SkyPilot does
/// without: its check for FUSE on a node in a job of its own that must
/// start within 10 s (`srun --immediate`: Ebb queues a job until it fits;
/// SkyPilot then checks the login node).
fn refused(argv: &[String]) -> bool {
    argv[0] == "srun" && argv.iter().any(|a| a.starts_with("--immediate"))
}

#[test]
fn skypilot_command_lines_are_read_as_slurm_reads_them() {
    let lines = recorded("7", "ebb-dev-0123abcd");
    assert!(lines.len() >= 15, "a recording of a whole run: {}", lines.len());
    for argv in lines {
        let command = Command::ALL.into_iter().find(|c| c.name() == argv[0]).expect("a Slurm command");
        let parsed = options::parse(command, &argv[1..], "");
        if refused(&argv) {
            let refusal = parsed.expect_err("refused by name").to_string();
            assert!(refusal.contains("not on Ebb"), "{refusal}");
            continue;
        }
        let (given, words) = parsed.unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        if options::flag(&given, "help") {
            // SkyPilot's check for Pyxis (`srun --help | grep '\[pyxis\]'`):
            // Ebb's srun has the plugin's options.
            assert!(super::table::usage(command).contains("[pyxis]"));
            continue;
        }
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
            Command::Squeue if options::flag(&given, "steps") => {
                // A task's steps, listed to cancel those named sky-N.
                assert_eq!(options::last(&given, "steps"), Some(""), "{argv:?}: -s takes no next word");
                assert_eq!(options::last(&given, "format"), Some("%i %j"), "{argv:?}");
                assert_eq!(words, ["7"], "{argv:?}: -j's job");
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
