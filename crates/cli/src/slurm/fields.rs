//! `-O`/`--Format` (`squeue`'s, `sinfo`'s, `squeue -s`'s): Slurm's field
//! names, read as the `%`-letters that print the same.

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
}
