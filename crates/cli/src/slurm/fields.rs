//! `-O`/`--Format` (`squeue`'s, `sinfo`'s, `squeue -s`'s): Slurm's field
//! names, read as the `%`-letters that print the same; and a job's name
//! as those fields show it.

use ebb_api as api;

use crate::error::{usage, CliError};

/// `squeue -O`'s field names and the `%` letters that print them.
pub const SQUEUE_NAMES: &[(&str, char)] = &[
    ("jobid", 'A'),
    ("jobarrayid", 'i'),
    ("name", 'j'),
    ("statecompact", 't'),
    ("state", 'T'),
    ("timeused", 'M'),
    ("timeleft", 'L'),
    ("timelimit", 'l'),
    ("numnodes", 'D'),
    ("numcpus", 'C'),
    ("tres-per-node", 'b'),
    ("reasonlist", 'R'),
    ("nodelist", 'N'),
    ("partition", 'P'),
    ("username", 'u'),
    ("account", 'a'),
    ("qos", 'q'),
    ("reason", 'r'),
    ("submittime", 'V'),
    ("starttime", 'S'),
];

/// `-O`/`--Format` (`squeue`'s, `sinfo`'s): comma-separated fields, each
/// `name[:[.][size][suffix]]` (a name in any case, `.` to justify right,
/// 20 wide where no size is given, a suffix printed after it), as the
/// `%`-format that prints the same. A name Ebb does not print is an
/// error that lists those it does.
pub fn long_format(spec: &str, names: &[(&str, char)], what: &str) -> Result<String, CliError> {
    let mut format = String::new();
    for field in spec.split(',').filter(|f| !f.is_empty()) {
        let (name, rest) = field.split_once(':').unwrap_or((field, ""));
        let Some(&(_, letter)) = names.iter().find(|(n, _)| n.eq_ignore_ascii_case(name.trim())) else {
            let known: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
            return Err(usage(format!(
                "Invalid {what} format specification: {name} (Ebb prints {})",
                known.join(", ")
            )));
        };
        let right = rest.starts_with('.');
        let rest = rest.trim_start_matches('.');
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let size = match rest[..digits].parse::<usize>() {
            Ok(size) => size.min(1024),
            Err(_) => 20,
        };
        let suffix = rest[digits..].replace('%', "%%");
        format.push_str(&format!("%{}{size}{letter}{suffix}", if right { "." } else { "" }));
    }
    Ok(format)
}

/// A job's name as Slurm shows it: an Ebb array's task by its array's
/// name (Ebb names each task `NAME[INDEX]` or `NAME[k=v,...]`, which a
/// narrow column would cut mid-token), a job given none by its program's.
pub(super) fn job_name(job: &api::Job) -> String {
    match (&job.name, &job.array) {
        (Some(name), Some(_)) if name.ends_with(']') => {
            // The '[' that opens the last group (whose values may hold
            // brackets of their own).
            let mut depth = 0usize;
            let opening = name.char_indices().rev().find(|&(_, c)| {
                match c {
                    ']' => depth += 1,
                    '[' => depth -= 1,
                    _ => {}
                }
                depth == 0
            });
            opening.map_or(name.as_str(), |(at, _)| &name[..at]).to_string()
        }
        (Some(name), _) => name.clone(),
        (None, _) => {
            job.argv.first().map(|p| p.rsplit('/').next().unwrap_or(p).to_string()).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-O`'s fields are `-o`'s letters: 20 wide unless sized, `.` to the
    /// right, a suffix after, any case; a name Ebb does not print is named.
    #[test]
    fn long_formats_are_the_letters_they_name() {
        let squeue = |spec: &str| long_format(spec, SQUEUE_NAMES, "job");
        assert_eq!(squeue("JobID,Name:10,State:.8|,partition:5 ").unwrap(), "%20A%10j%.8T|%5P ");
        assert_eq!(squeue("name:.%").unwrap(), "%.20j%%");
        assert_eq!(squeue("").unwrap(), "");
        assert_eq!(
            long_format("StepId,stepname:10", crate::slurm::steps::NAMES, "step").unwrap(),
            "%20i%10j"
        );
        let refused = squeue("JobID,Licenses").unwrap_err().to_string();
        assert!(
            refused.contains("Invalid job format specification: Licenses (Ebb prints jobid,"),
            "{refused}"
        );
    }

    proptest::proptest! {
        /// Any spec: a format or a clear error, never a panic.
        #[test]
        fn any_long_format_is_a_format_or_a_clear_error(spec in "\\PC{0,60}") {
            match long_format(&spec, SQUEUE_NAMES, "job") {
                Ok(format) => { super::super::query::render(&format, |_| String::new()); }
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("Invalid job format")),
            }
        }
    }

    #[test]
    fn a_jobs_name_is_its_arrays_or_its_programs_where_it_has_none_of_its_own() {
        let mut j: api::Job = serde_json::from_value(serde_json::json!({
            "id": 12, "tenant": "default", "name": null, "tier": "preemptible", "gpus": 1,
            "gpu_model": null, "argv": [], "state": "running", "attempt": 1, "preemptions": 0,
            "retries": 0, "submitted_at": "2026-12-07T08:00:00Z", "placement": [], "lost_gpu_seconds": 0.0,
        }))
        .unwrap();
        j.name = None;
        j.argv = vec!["/usr/bin/python3".into(), "train.py".into()];
        assert_eq!(job_name(&j), "python3");
        j.name = Some("infer2[7]".into());
        j.array = Some(api::ArrayTask { id: 5, index: 7, tasks: 9, params: Default::default() });
        assert_eq!(job_name(&j), "infer2");
        j.name = Some("sweep[lr=0.1,bs=[1,2]]".into());
        assert_eq!(job_name(&j), "sweep");
        j.name = Some("a[b][3]".into());
        assert_eq!(job_name(&j), "a[b]");
        j.name = Some("odd]".into());
        assert_eq!(job_name(&j), "odd]", "no group: the name whole");
        j.name = Some("sweep[lr=0.1]".into());
        assert_eq!(job_name(&j), "sweep");
        j.array = None;
        j.name = Some("plain[1]".into());
        assert_eq!(job_name(&j), "plain[1]", "a name of its own is kept whole");
        j.argv.clear();
        j.name = None;
        assert_eq!(job_name(&j), "");
    }
}
