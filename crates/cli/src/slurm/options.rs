//! Slurm's command-line options as its commands take them: long
//! (`--ntasks=2`, `--ntasks 2`) and short (`-n 2`, `-n2`) forms, from the
//! command line and from a script's `#SBATCH` lines, read as getopt_long
//! reads them. What Ebb does with each is in one table (`table.rs`):
//! honoured, accepted and ignored (said once, with why), or refused
//! naming what Ebb does instead; one Slurm does not know is an error, as
//! in Slurm.

use crate::error::{usage, CliError};

pub use super::table::{OPTIONS, PYXIS_OPTIONS};

/// A Slurm command Ebb answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Sbatch,
    Srun,
    Squeue,
    Sacct,
    Sinfo,
    Scontrol,
    Scancel,
}

impl Command {
    pub const ALL: [Command; 7] = [
        Command::Sbatch,
        Command::Srun,
        Command::Squeue,
        Command::Sacct,
        Command::Sinfo,
        Command::Scontrol,
        Command::Scancel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Command::Sbatch => "sbatch",
            Command::Srun => "srun",
            Command::Squeue => "squeue",
            Command::Sacct => "sacct",
            Command::Sinfo => "sinfo",
            Command::Scontrol => "scontrol",
            Command::Scancel => "scancel",
        }
    }

    /// Whether its options end at the first word that is not one (the
    /// script or program, whose own options follow), as `sbatch`'s and
    /// `srun`'s do; the others take options anywhere among their words.
    fn options_end_at_a_word(self) -> bool {
        matches!(self, Command::Sbatch | Command::Srun)
    }
}

/// Whether an option takes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    None,
    Required,
    /// It may be left out (`--kill-on-bad-exit[=0|1]`): given only joined
    /// to the option (`--opt=v`, `-Kv`), never as the next word.
    Optional,
}

/// What Ebb does with an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Ebb does what it asks.
    Honoured,
    /// It changes nothing on Ebb: accepted, and said once, with the reason.
    Ignored(&'static str),
    /// Ebb cannot do what it asks: refused, naming what Ebb does instead.
    Refused(&'static str),
}

/// One option of one or more commands: its long name (and the other
/// names Slurm takes for it), its short letters, its value, and what Ebb
/// does with it.
#[derive(Clone, Copy)]
pub struct Spec {
    pub commands: &'static [Command],
    pub long: &'static str,
    pub aliases: &'static [&'static str],
    pub short: &'static str,
    pub value: Value,
    pub kind: Kind,
}

impl Spec {
    /// The same option under other long names too.
    pub const fn also(self, aliases: &'static [&'static str]) -> Spec {
        Spec { aliases, ..self }
    }

    fn names(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.long).chain(self.aliases.iter().copied())
    }
}

/// `command`'s options.
pub fn specs(command: Command) -> impl Iterator<Item = &'static Spec> {
    OPTIONS.iter().chain(PYXIS_OPTIONS.iter()).filter(move |s| s.commands.contains(&command))
}

/// Options given, in order: (long name, value), with the value `""` for
/// those that take none.
pub type Given = Vec<(&'static str, String)>;

/// Parses `command`'s `args`: for `sbatch` and `srun` up to the first
/// word that is not an option (the script or the program), which is
/// returned with the rest; for the others, options anywhere and the
/// other words in order. `--` ends the options. As getopt_long reads
/// them: a long option may be abbreviated to any prefix that names no
/// other option; short options group (`-lu` is `-l -u`; in `-Jname` the
/// rest of the group is `-J`'s value); an optional value is only ever
/// joined to its option. An option Ebb refuses is an error that says
/// what Ebb does instead. `what` names the source in errors
/// (`train.sh:3`; nothing for the command line).
pub fn parse(command: Command, args: &[String], what: &str) -> Result<(Given, Vec<String>), CliError> {
    let at = |message: String| match what {
        "" => usage(message),
        what => usage(format!("{what}: {message}")),
    };
    let mut given = Given::new();
    let mut words = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            words.extend_from_slice(&args[i + 1..]);
            return Ok((given, words));
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let spec = long_option(command, name).map_err(at)?;
            let value = match (spec.value, inline) {
                (Value::None, Some(_)) => {
                    return Err(at(format!("option '--{}' doesn't allow an argument", spec.long)))
                }
                (Value::None | Value::Optional, None) => String::new(),
                (_, Some(v)) => v,
                (Value::Required, None) => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| at(format!("option '--{}' requires an argument", spec.long)))?
                }
            };
            given.push((refused(spec, &value).map_err(at)?, value));
        } else if let Some(group) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (k, letter) in group.char_indices() {
                let spec = specs(command)
                    .find(|s| s.short.contains(letter))
                    .ok_or_else(|| at(format!("invalid option -- '{letter}'")))?;
                if spec.value == Value::None {
                    given.push((refused(spec, "").map_err(at)?, String::new()));
                    continue;
                }
                // The rest of the group is the value (an `=` before it
                // dropped, as Slurm's own options read it).
                let rest = &group[k + letter.len_utf8()..];
                let value = match (rest.is_empty(), spec.value) {
                    (false, _) => rest.strip_prefix('=').unwrap_or(rest).to_string(),
                    (true, Value::Optional) => String::new(),
                    (true, _) => {
                        i += 1;
                        args.get(i)
                            .cloned()
                            .ok_or_else(|| at(format!("option requires an argument -- '{letter}'")))?
                    }
                };
                given.push((refused(spec, &value).map_err(at)?, value));
                break;
            }
        } else if command.options_end_at_a_word() {
            words.extend_from_slice(&args[i..]);
            return Ok((given, words));
        } else {
            words.push(arg.clone());
        }
        i += 1;
    }
    Ok((given, words))
}

/// The option's name, or why Ebb refuses it.
fn refused(spec: &'static Spec, value: &str) -> Result<&'static str, String> {
    match spec.kind {
        Kind::Refused(instead) => {
            let shown = if value.is_empty() {
                format!("--{}", spec.long)
            } else {
                format!("--{}={value}", spec.long)
            };
            Err(format!("{shown}: not on Ebb: {instead}"))
        }
        _ => Ok(spec.long),
    }
}

/// The option `--name` names: the one with that name, or the one option
/// whose names it is a prefix of; an error in getopt_long's words for
/// none or several.
fn long_option(command: Command, name: &str) -> Result<&'static Spec, String> {
    if let Some(spec) = specs(command).find(|s| s.names().any(|n| n == name)) {
        return Ok(spec);
    }
    let matches: Vec<&Spec> =
        specs(command).filter(|s| !name.is_empty() && s.names().any(|n| n.starts_with(name))).collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("unrecognized option '--{name}'")),
        several => {
            let names: Vec<String> = several
                .iter()
                .flat_map(|s| s.names().filter(|n| n.starts_with(name)))
                .map(|n| format!("'--{n}'"))
                .collect();
            Err(format!("option '--{name}' is ambiguous; possibilities: {}", names.join(" ")))
        }
    }
}

/// A script's `#SBATCH` lines, parsed as options: those before its first
/// command (Slurm reads no further), each split as a shell would, with a
/// trailing `# comment` dropped. A heterogeneous job's components are
/// separated by `#SBATCH hetjob` (or the older `packjob`) lines: one list
/// of options for each.
pub fn script_options(script: &str, name: &str) -> Result<Vec<Given>, CliError> {
    let mut components = vec![Given::new()];
    for (number, line) in script.lines().enumerate().skip(1) {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if !trimmed.starts_with('#') {
            break;
        }
        let Some(rest) = trimmed.strip_prefix("#SBATCH") else { continue };
        let at = format!("{name}:{}", number + 1);
        if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
            return Err(usage(format!("{at}: a directive is `#SBATCH --option=value`")));
        }
        let words = shlex::split(rest).ok_or_else(|| usage(format!("{at}: an unclosed quote")))?;
        if let [word] = words.as_slice() {
            if word == "hetjob" || word == "packjob" {
                components.push(Given::new());
                continue;
            }
        }
        let (options, extra) = parse(Command::Sbatch, &words, &at)?;
        if let Some(word) = extra.first() {
            return Err(usage(format!("{at}: {word:?} is not an option")));
        }
        components.last_mut().expect("a component").extend(options);
    }
    Ok(components)
}

/// The options Ebb ignores among `given`, each once, as `sbatch` says
/// them: `ignoring --mem=64G: Ebb does not limit memory`.
pub fn ignored_notes(command: Command, given: &Given) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    for (long, value) in given {
        let Some(Kind::Ignored(why)) = specs(command).find(|s| s.long == *long).map(|s| s.kind) else {
            continue;
        };
        let shown = if value.is_empty() { format!("--{long}") } else { format!("--{long}={value}") };
        let note = format!("ignoring {shown}: {why}");
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    notes
}

/// The last value given for `long`, if any (a later one wins, as the
/// command line wins over the script).
pub fn last<'a>(given: &'a Given, long: &str) -> Option<&'a str> {
    given.iter().rev().find(|(l, _)| *l == long).map(|(_, v)| v.as_str())
}

/// Whether a flag without a value was given.
pub fn flag(given: &Given, long: &str) -> bool {
    given.iter().any(|(l, _)| *l == long)
}

/// A count: a positive whole number.
pub fn count(given: &Given, long: &str) -> Result<Option<u32>, CliError> {
    match last(given, long) {
        None => Ok(None),
        Some(text) => match text.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(usage(format!("--{long}={text}: expected a positive whole number"))),
        },
    }
}

/// `--nodes`: `N`, or `MIN-MAX`, any count in the range (Slurm's
/// meaning: the count is chosen at the start and fixed after).
pub fn nodes(given: &Given) -> Result<Option<(u32, u32)>, CliError> {
    match last(given, "nodes") {
        Some(text) if text.contains('-') => {
            let (a, b) = text.split_once('-').expect("a dash");
            match (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
                (Ok(a), Ok(b)) if a > 0 && a <= b => Ok(Some((a, b))),
                _ => Err(usage(format!(
                    "--nodes={text}: expected a count or a range MIN-MAX of positive whole numbers, MIN first"
                ))),
            }
        }
        _ => Ok(count(given, "nodes")?.map(|n| (n, n))),
    }
}

/// A GPU count with an optional model: `N` or `TYPE:N`, as `--gpus` and
/// `--gpus-per-node` take it.
pub fn gpus(long: &str, text: &str) -> Result<(Option<String>, u32), CliError> {
    let (model, n) = match text.rsplit_once(':') {
        Some((model, n)) => (Some(model.to_string()), n),
        None => (None, text),
    };
    match n.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok((model, n)),
        _ => Err(usage(format!("--{long}={text}: expected [TYPE:]N GPUs"))),
    }
}

/// `--gres=gpu[:TYPE][:N]` (N 1 by default); other resources are refused
/// by name, as Ebb has none.
pub fn gres(text: &str) -> Result<(Option<String>, u32), CliError> {
    let mut gpu = None;
    for item in text.split(',') {
        let parts: Vec<&str> = item.split(':').collect();
        match parts.as_slice() {
            ["gpu"] => gpu = Some((None, 1)),
            ["gpu", n] if n.parse::<u32>().is_ok() => gpu = Some((None, gpus("gres", n)?.1)),
            ["gpu", model] => gpu = Some((Some(model.to_string()), 1)),
            ["gpu", model, n] => gpu = Some((Some(model.to_string()), gpus("gres", n)?.1)),
            [name, ..] => {
                return Err(usage(format!(
                    "--gres={text}: Ebb schedules GPUs only, not {name:?} (gpu[:TYPE][:N])"
                )))
            }
            [] => {}
        }
    }
    gpu.ok_or_else(|| usage(format!("--gres={text}: expected gpu[:TYPE][:N]")))
}

/// Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`,
/// or `UNLIMITED`/`INFINITE` (no limit). Seconds.
pub fn time_limit(text: &str) -> Result<Option<u64>, CliError> {
    let bad = || usage(format!("--time={text}: expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"));
    let t = text.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let number = |s: &str| -> Result<u64, CliError> {
        if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u64>().map_err(|_| bad())
    };
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(number(d)?), rest),
        None => (None, t),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let parts: Vec<u64> = parts.iter().map(|p| number(p)).collect::<Result<_, _>>()?;
    let seconds = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    if seconds == 0 {
        // Slurm: a limit of 0 is no limit.
        return Ok(None);
    }
    Ok(Some(seconds))
}

/// `--signal=[B:]SIG[@SECS]`: the signal, whether only the batch shell
/// gets it, and how long before the time limit.
pub fn signal(text: &str) -> Result<(String, bool, Option<u32>), CliError> {
    let (batch, rest) = match text.split_once(':') {
        Some(("B", rest)) => (true, rest),
        Some(("R", rest)) | Some(("RB", rest)) | Some(("BR", rest)) => {
            return Err(usage(format!(
                "--signal={text}: R: (reservation ends) has no meaning on Ebb; use [B:]SIG[@SECS] ({rest})"
            )))
        }
        Some(_) => return Err(usage(format!("--signal={text}: expected [B:]SIG[@SECS]"))),
        None => (false, text),
    };
    let (sig, secs) = match rest.split_once('@') {
        Some((sig, secs)) => {
            let secs =
                secs.parse::<u32>().ok().filter(|s| *s <= 65535).ok_or_else(|| {
                    usage(format!("--signal={text}: SECS must be a whole number up to 65535"))
                })?;
            (sig, Some(secs))
        }
        None => (rest, None),
    };
    if sig.is_empty() {
        return Err(usage(format!("--signal={text}: expected [B:]SIG[@SECS]")));
    }
    Ok((sig.to_string(), batch, secs))
}

/// `--array=A-B[%N]` or `N[%N]`: the range as the API takes it and the
/// limit on tasks running at once.
pub fn array(text: &str) -> Result<(String, Option<u32>), CliError> {
    let (range, limit) = match text.split_once('%') {
        Some((range, limit)) => {
            let n = limit
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| usage(format!("--array={text}: %N must be a positive whole number")))?;
            (range, Some(n))
        }
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = match range.split_once('-') {
        Some((a, b)) => digits(a) && digits(b),
        None => digits(range),
    };
    if !ok {
        return Err(usage(format!(
            "--array={text}: Ebb takes a range A-B or one index N, with %N for a limit (not lists or steps)"
        )));
    }
    Ok((range.to_string(), limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SBATCH: Command = Command::Sbatch;
    const SRUN: Command = Command::Srun;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn long_and_short_forms_with_equals_or_a_space_are_the_same_option() {
        let (given, rest) =
            parse(SBATCH, &words("--ntasks=2 -N 3 -J name --gres gpu:2 -c4 train.sh --lr 1"), "").unwrap();
        assert_eq!(last(&given, "ntasks"), Some("2"));
        assert_eq!(last(&given, "nodes"), Some("3"));
        assert_eq!(last(&given, "job-name"), Some("name"));
        assert_eq!(last(&given, "gres"), Some("gpu:2"));
        assert_eq!(last(&given, "cpus-per-task"), Some("4"));
        assert_eq!(rest, words("train.sh --lr 1"));
    }

    #[test]
    fn unknown_options_and_missing_values_are_errors_that_name_them() {
        assert_eq!(
            parse(SBATCH, &words("--bogus=1"), "").unwrap_err().to_string(),
            "unrecognized option '--bogus'"
        );
        assert_eq!(parse(SBATCH, &words("-z"), "").unwrap_err().to_string(), "invalid option -- 'z'");
        assert_eq!(
            parse(SBATCH, &words("--time"), "").unwrap_err().to_string(),
            "option '--time' requires an argument"
        );
        assert_eq!(
            parse(SBATCH, &words("--parsable=yes"), "").unwrap_err().to_string(),
            "option '--parsable' doesn't allow an argument"
        );
    }

    /// getopt_long's reading, which the tools built on Slurm write to:
    /// grouped short options, a value joined to its letter, a long option
    /// abbreviated to a prefix no other shares, an optional value only
    /// ever joined to its option.
    #[test]
    fn options_read_as_getopt_reads_them() {
        let (given, rest) = parse(SRUN, &words("-lu -N2 -Jname -K -n 4 train.py"), "").unwrap();
        let longs: Vec<&str> = given.iter().map(|(l, _)| *l).collect();
        assert_eq!(longs, ["label", "unbuffered", "nodes", "job-name", "kill-on-bad-exit", "ntasks"]);
        assert_eq!((last(&given, "nodes"), last(&given, "job-name")), (Some("2"), Some("name")));
        assert_eq!((last(&given, "kill-on-bad-exit"), last(&given, "ntasks")), (Some(""), Some("4")));
        assert_eq!(rest, words("train.py"), "an optional value never takes the next word");
        let (given, rest) =
            parse(SRUN, &words("-luK0 --kill-on-bad-exit=1 --kill-on-bad-exit prog"), "").unwrap();
        let values: Vec<&str> = given.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(values, ["", "", "0", "1", ""]);
        assert_eq!(rest, words("prog"));
        // Abbreviations: a unique prefix names its option; a shared one is refused.
        let (given, _) = parse(SBATCH, &words("--job=a --gpus-per-n=8 --parsab"), "").unwrap();
        assert_eq!(
            given,
            [("job-name", "a".into()), ("gpus-per-node", "8".into()), ("parsable", String::new())]
        );
        assert_eq!(
            parse(SBATCH, &words("--gpus-per"), "").unwrap_err().to_string(),
            "option '--gpus-per' is ambiguous; possibilities: '--gpus-per-node' '--gpus-per-socket' '--gpus-per-task'"
        );
        assert_eq!(
            parse(SBATCH, &words("--nodes=1 --no"), "").unwrap_err().to_string(),
            "option '--no' is ambiguous; possibilities: '--no-kill' '--no-requeue' '--nodefile' '--nodelist' '--nodes' \
             '--no-container-mount-home' '--no-container-remap-root' '--no-container-entrypoint'"
        );
        // A letter that takes a value ends its group; a missing one is named.
        assert_eq!(
            parse(SRUN, &words("-lN"), "").unwrap_err().to_string(),
            "option requires an argument -- 'N'"
        );
        assert_eq!(parse(SRUN, &words("-lz"), "").unwrap_err().to_string(), "invalid option -- 'z'");
        assert_eq!(
            parse(SBATCH, &words("--"), "").unwrap(),
            (Given::new(), Vec::new()),
            "`--` alone ends the options"
        );
    }

    /// An option Ebb cannot honour is refused with what Ebb does instead,
    /// from the command line or a script's line; an ignored one is said
    /// once; options of one name (`--cluster`, `--clusters`) are one.
    #[test]
    fn a_refused_option_says_what_ebb_does_instead() {
        assert_eq!(
            parse(SBATCH, &words("--begin=now+1hour train.sh"), "").unwrap_err().to_string(),
            "--begin=now+1hour: not on Ebb: Ebb starts a job as soon as it fits: hold it back with \
             --dependency, or submit it later"
        );
        assert_eq!(
            script_options("#!/bin/sh\n#SBATCH -H\n", "s.sh").unwrap_err().to_string(),
            "s.sh:2: --hold: not on Ebb: Ebb holds no jobs: submit the job when it should be queued"
        );
        assert!(parse(SRUN, &words("--pty bash"), "")
            .unwrap_err()
            .to_string()
            .contains("no interactive terminals"));
        let (given, _) = parse(SBATCH, &words("--cluster=a -M b --mem=1G --mem 2G x"), "").unwrap();
        assert_eq!(given.iter().map(|(l, _)| *l).collect::<Vec<_>>(), ["clusters", "clusters", "mem", "mem"]);
        assert_eq!(
            ignored_notes(SBATCH, &given),
            [
                "ignoring --clusters=a: Ebb is one cluster",
                "ignoring --clusters=b: Ebb is one cluster",
                "ignoring --mem=1G: Ebb does not limit memory",
                "ignoring --mem=2G: Ebb does not limit memory"
            ]
        );
    }

    #[test]
    fn sbatch_lines_end_at_the_first_command_and_take_trailing_comments_and_repeats() {
        let script = "#!/bin/bash\n#SBATCH --job-name=a # the name\n\n#SBATCH -n 2\n#SBATCH --job-name b\n# a comment\n#SBATCH --mem=4G\necho hi\n#SBATCH --ntasks=9\n";
        let given = script_options(script, "s.sh").unwrap().remove(0);
        assert_eq!(last(&given, "job-name"), Some("b"));
        assert_eq!(last(&given, "ntasks"), Some("2"));
        assert_eq!(ignored_notes(SBATCH, &given), ["ignoring --mem=4G: Ebb does not limit memory"]);
        let bad = script_options("#!/bin/sh\n#SBATCH --frobnicate\n", "s.sh").unwrap_err().to_string();
        assert_eq!(bad, "s.sh:2: unrecognized option '--frobnicate'");
        assert!(script_options("#!/bin/sh\n#SBATCH --job-name='x\n", "s.sh")
            .unwrap_err()
            .to_string()
            .contains("unclosed quote"));
    }

    #[test]
    fn times_gpus_signals_and_arrays_read_as_slurm_writes_them() {
        assert_eq!(time_limit("5").unwrap(), Some(300));
        assert_eq!(time_limit("0:05").unwrap(), Some(5));
        assert_eq!(time_limit("1:00:00").unwrap(), Some(3600));
        assert_eq!(time_limit("2-0").unwrap(), Some(172800));
        assert_eq!(time_limit("1-2:3:4").unwrap(), Some(93784));
        assert_eq!(time_limit("UNLIMITED").unwrap(), None);
        assert!(time_limit("1:2:3:4").is_err() && time_limit("soon").is_err() && time_limit("").is_err());
        assert_eq!(gres("gpu:a100:4").unwrap(), (Some("a100".into()), 4));
        assert_eq!(gres("gpu:2").unwrap(), (None, 2));
        assert_eq!(gres("gpu").unwrap(), (None, 1));
        assert!(gres("nvme:1").unwrap_err().to_string().contains("not \"nvme\""));
        assert_eq!(signal("B:USR1@60").unwrap(), ("USR1".into(), true, Some(60)));
        assert_eq!(signal("USR2").unwrap(), ("USR2".into(), false, None));
        assert!(signal("X:USR1").is_err() && signal("USR1@-1").is_err());
        assert_eq!(array("0-19%5").unwrap(), ("0-19".into(), Some(5)));
        assert_eq!(array("7").unwrap(), ("7".into(), None));
        assert!(array("1,3,5").unwrap_err().to_string().contains("not lists"));
    }

    proptest! {
        /// Whatever words a command line or an #SBATCH line holds, parsing
        /// answers (options, or an error), never panics.
        #[test]
        fn any_words_parse_or_are_refused(words in proptest::collection::vec("-{0,2}[a-zA-Zé=:@%0-9-]{0,12}", 0..8)) {
            for command in Command::ALL {
                let _ = parse(command, &words, command.name());
            }
            let line = format!("#!/bin/sh\n#SBATCH {}\n", words.join(" "));
            let _ = script_options(&line, "s");
        }

        #[test]
        fn any_option_value_reads_or_is_refused(text in "[A-Za-z0-9:@%,\\-]{0,24}") {
            let _ = time_limit(&text);
            let _ = gres(&text);
            let _ = signal(&text);
            let _ = array(&text);
            let _ = gpus("gpus", &text);
            let _ = nodes(&vec![("nodes", text.clone())]);
        }

        /// getopt_long's abbreviations: a prefix that is one of an
        /// option's names names it; else any prefix of a name that no
        /// other option of the command has a name starting with names that
        /// option, with its value; a prefix several share is refused as
        /// ambiguous. Every command, every option.
        #[test]
        fn a_long_options_unshared_prefixes_name_it(which in 0usize..1000, cut in 1usize..40) {
            for command in Command::ALL {
                let all: Vec<&Spec> = specs(command).collect();
                let names: Vec<(&str, &Spec)> = all.iter().flat_map(|s| s.names().map(move |n| (n, *s))).collect();
                let (name, _) = names[which % names.len()];
                let prefix = &name[..cut.min(name.len())];
                let mut sharing: Vec<&str> = names.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, s)| s.long).collect();
                sharing.dedup();
                let named = names.iter().find(|(n, _)| *n == prefix).map(|(_, s)| *s).or_else(|| {
                    (sharing.len() == 1).then(|| names.iter().find(|(n, _)| n.starts_with(prefix)).expect("one").1)
                });
                // Given with a value where the option named takes one.
                let word = match named.is_some_and(|s| s.value != Value::None) {
                    true => format!("--{prefix}=v"),
                    false => format!("--{prefix}"),
                };
                match (parse(command, &[word], ""), named) {
                    (Ok((given, _)), Some(spec)) => {
                        let value = if spec.value != Value::None { "v" } else { "" };
                        prop_assert_eq!(given, vec![(spec.long, value.to_string())]);
                    }
                    (Err(e), Some(spec)) => prop_assert!(matches!(spec.kind, Kind::Refused(_)) && e.to_string().contains("not on Ebb"), "{}", e),
                    (Err(e), None) => prop_assert!(e.to_string().contains("is ambiguous"), "{}", e),
                    (other, _) => prop_assert!(false, "{} --{} ({:?} share it): {:?}", command.name(), prefix, sharing, other.map(|g| g.0)),
                }
            }
        }
    }
}
