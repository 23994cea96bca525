//! The command line as clap reads it, with what clap's own errors get
//! wrong for Ebb said plainly: a negative number is a value (and its
//! parser names what is wrong with it), a duration written as two words
//! is named, and `--server`/`--token` given to a command that runs its
//! own server says why it takes none.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

/// Commands that run things on this machine and talk to no server.
const OWN_SERVER: [(&str, &str); 5] = [
    ("up", "it runs its own server and agents on this machine"),
    ("server", "it is the server"),
    ("sim", "it simulates a cluster in this process"),
    ("completions", "it writes shell completions"),
    ("man", "it writes manual pages"),
];

/// Words that follow a number in a duration written as two words
/// (`--drain-window 5 minutes`), with the unit Ebb writes for each.
const UNITS: [(&str, &str); 12] = [
    ("ms", "ms"),
    ("s", "s"),
    ("sec", "s"),
    ("secs", "s"),
    ("second", "s"),
    ("seconds", "s"),
    ("m", "m"),
    ("min", "m"),
    ("mins", "m"),
    ("minute", "m"),
    ("minutes", "m"),
    ("hours", "h"),
];

/// Parses `args` (the program's name first) as `T`, or the error to print
/// and exit with.
pub fn parse<T: CommandFactory + FromArgMatches>(args: &[String]) -> Result<T, clap::Error> {
    let mut command = T::command().mut_subcommands(|s| s.allow_negative_numbers(true));
    let matches = command.try_get_matches_from_mut(args).map_err(|e| plainer(e, args, &mut command))?;
    T::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// Clap's error, or what Ebb says instead where clap's would mislead.
fn plainer(e: clap::Error, args: &[String], command: &mut clap::Command) -> clap::Error {
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(given)) = e.get(ContextKind::InvalidArg) else { return e };
    let given = given.split('=').next().unwrap_or(given).to_string();
    let mut said = |text: String| command.error(ErrorKind::ArgumentConflict, text);
    let sub = args.get(1).map(String::as_str).unwrap_or("");
    if given == "--server" || given == "--token" {
        if let Some((name, why)) = OWN_SERVER.iter().find(|(name, _)| *name == sub) {
            return said(format!(
                "ebb {name} takes no {given}: {why}; --server and --token are for the commands that talk to a \
                 server (ebb submit, ebb jobs, ...)"
            ));
        }
    }
    // `--flag 5 minutes`: the number was taken as the flag's value.
    let at = args.iter().position(|a| *a == given);
    if let (Some(i), Some((_, unit))) = (at, UNITS.iter().find(|(word, _)| *word == given)) {
        let (flag, number) = (args.get(i.wrapping_sub(2)), args.get(i.wrapping_sub(1)));
        if let (Some(flag), Some(number)) = (flag, number) {
            if flag.starts_with("--") && !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
                return said(format!(
                    "{flag} {number} {given}: a duration is one word, as {number}{unit} (or 300s, 5m, 1h)"
                ));
            }
        }
    }
    e
}
