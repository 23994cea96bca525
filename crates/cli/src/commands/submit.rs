//! `ebb submit`: a job from flags, a job script's `#EBB` lines and the
//! caller's environment, checked here before the server sees it.

use std::collections::BTreeMap;
use std::path::Path;

use clap::{Args, Parser};
use ebb_api as api;

use crate::client::Connection;
use crate::error::{file, usage, CliError};

#[derive(Args, Clone, Debug, Default)]
pub struct SubmitArgs {
    /// preemptible (default; also spot), on-demand (also ondemand) or
    /// reserved.
    #[arg(long, value_parser = crate::output::tier)]
    pub tier: Option<String>,
    /// Whole GPUs (default 1); MIN:MAX for an elastic job over whole
    /// nodes (e.g. 16:64 on 8-GPU nodes): it starts on MIN, grows into
    /// what no queued job wants, and loses a node rather than all of them
    /// to a preemption. Preemptible jobs only.
    #[arg(long, value_name = "N|MIN:MAX", value_parser = parse_gpus)]
    pub gpus: Option<Gpus>,
    /// GPU model (default: any).
    #[arg(long)]
    pub gpu_model: Option<String>,
    /// A name to tell the job by (`ebb jobs`, `ebb show`).
    #[arg(long)]
    pub name: Option<String>,
    /// Signal sent at the drain notice (default TERM), like Slurm's --signal.
    #[arg(long)]
    pub signal: Option<String>,
    /// Give up after this many preemptions.
    #[arg(long)]
    pub max_preemptions: Option<u32>,
    /// Its place among your own jobs of its tier, -1000 to 1000 or a
    /// class: low (-100), normal (0), high (100). Higher starts first.
    /// Never moves another tenant's jobs.
    #[arg(long, allow_hyphen_values = true, value_name = "N|CLASS", value_parser = parse_priority)]
    pub priority: Option<i32>,
    /// When a preemptible job must be done (2026-12-01T18:00Z): it stays
    /// preemptible while its reported progress fits before then, and moves
    /// to on-demand (billed at that rate from then on) once it would not.
    #[arg(long, value_name = "TIME")]
    pub deadline: Option<String>,
    /// Retries after failures (preemptions do not count).
    #[arg(long)]
    pub max_retries: Option<u32>,
    /// Environment variable for the job, K=V; repeatable. Wins over
    /// what --export takes.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The submitter's environment the job gets, as sbatch's --export:
    /// ALL (the default: every variable but EBB_*, CUDA_VISIBLE_DEVICES,
    /// HOME, USER, LOGNAME and the shell's PWD, OLDPWD, SHLVL, _), NONE,
    /// or a list VAR,VAR=VALUE,... of only those. Ebb's own variables
    /// always win.
    #[arg(long, value_name = "ALL|NONE|VAR,...")]
    pub export: Option<String>,
    /// The job's working directory on the node (default: the directory
    /// ebb submit runs in). A relative one is taken from there.
    #[arg(long, visible_alias = "workdir", value_name = "DIR")]
    pub chdir: Option<String>,
    /// An array of tasks A-B, each with EBB_TASK_INDEX; A-B%N runs at
    /// most N of them at once.
    #[arg(long, value_name = "A-B[%N]")]
    pub array: Option<String>,
    /// A limit on each attempt's run (90m, 2h, 1d): one still running
    /// then gets SIGTERM, SIGKILL 30 s later, and the job fails.
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub time: Option<ebb_core::Span>,
    /// Wait for other jobs first, as Slurm's --dependency:
    /// afterok:ID[:ID...] (they succeeded), afterany:ID (they ended),
    /// afternotok:ID (they failed or were cancelled), several joined by
    /// `,`; or singleton. A condition that can no longer hold fails the job.
    #[arg(long, value_name = "afterok:ID,...")]
    pub after: Option<String>,
    /// A sweep parameter, NAME=V1,V2,...; repeatable. One task per
    /// combination, each with EBB_PARAM_<NAME> and EBB_PARAMS (JSON).
    #[arg(long = "sweep", value_name = "NAME=V1,V2")]
    pub sweep: Vec<String>,
    /// `always`: run again after every exit but a cancel (services).
    #[arg(long, value_name = "never|always")]
    pub restart: Option<String>,
    /// Exit code 0 during a drain counts as success without the SDK's marker.
    #[arg(long)]
    pub exit_on_drain_is_success: bool,
    /// Run the job in this OCI image: HOST[:PORT]/NAME:TAG or
    /// HOST[:PORT]/NAME@sha256:DIGEST. The server resolves a tag to its
    /// digest at submit; every attempt runs that digest. The command runs
    /// inside it (its entrypoint is not used), in --chdir if given (a path
    /// in the image), else in a fresh directory of the job's.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Print one line {"id": N, "ids": [...]} instead of text: the job
    /// (an array's first task) and every job made.
    #[arg(long)]
    pub json: bool,
    /// The program and its arguments, or a job script whose `#EBB` lines
    /// carry the flags above. It starts after `--` or at the first word
    /// that is not one of the flags above; an unknown flag before it is an
    /// error.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Named priority classes and the numbers they stand for.
pub const PRIORITY_CLASSES: [(&str, i32); 3] = [("low", -100), ("normal", 0), ("high", 100)];

/// `--priority`: a number from -1000 to 1000, or a class's name.
fn parse_priority(text: &str) -> Result<i32, CliError> {
    if let Some(&(_, n)) = PRIORITY_CLASSES.iter().find(|(name, _)| *name == text) {
        return Ok(n);
    }
    let classes = PRIORITY_CLASSES.map(|(name, n)| format!("{name} ({n})")).join(", ");
    match text.parse::<i64>() {
        Ok(n) if (-1000..=1000).contains(&n) => Ok(n as i32),
        Ok(n) => Err(usage(format!("{n} is out of range: a priority is -1000 to 1000"))),
        Err(_) => {
            Err(usage(format!("expected a number from -1000 to 1000 or a class: {classes}; got {text:?}")))
        }
    }
}

fn parse_span(text: &str) -> Result<ebb_core::Span, CliError> {
    ebb_core::Span::parse(text).map_err(usage)
}

/// `--gpus`: a count, or an elastic job's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpus {
    pub fewest: u32,
    /// An elastic job's most.
    pub most: Option<u32>,
}

/// `N` or `MIN:MAX` (MIN below MAX); the server checks the numbers
/// against its limits and the cluster's nodes, and says what is wrong.
fn parse_gpus(text: &str) -> Result<Gpus, CliError> {
    let count = |part: &str| {
        part.trim().parse::<u32>().ok().ok_or_else(|| {
            usage(format!(
                "expected a number of GPUs N, or MIN:MAX for an elastic job (e.g. 16:64); got {text:?}"
            ))
        })
    };
    match text.split_once(':') {
        None => Ok(Gpus { fewest: count(text)?, most: None }),
        Some((fewest, most)) => {
            let (fewest, most) = (count(fewest)?, count(most)?);
            if fewest >= most {
                return Err(usage(format!(
                    "{text}: an elastic job's MIN:MAX needs MIN below MAX (for {fewest} GPUs exactly, --gpus {fewest})"
                )));
            }
            Ok(Gpus { fewest, most: Some(most) })
        }
    }
}

/// `#EBB --gpus 2` lines of a job script, parsed like command-line flags.
#[derive(Parser)]
struct ScriptFlags {
    #[command(flatten)]
    flags: SubmitArgs,
}

/// The flags of a job script's `#EBB` lines, in order: each line split as
/// a shell would (quotes, `\` escapes, a `# comment` at its end). An
/// unknown or malformed flag is an error naming the script's line.
fn script_flags(path: &Path) -> Result<Option<SubmitArgs>, CliError> {
    let Ok(text) = std::fs::read(path) else { return Ok(None) };
    let text = String::from_utf8_lossy(&text);
    if text.lines().any(|l| l.starts_with("#SBATCH")) && !text.lines().any(|l| l.starts_with("#EBB")) {
        return Err(usage(format!(
            "{} is a Slurm batch script (#SBATCH lines): submit it with sbatch, which reads them \
             (`ebb slurm install DIR` puts sbatch on your PATH)",
            path.display()
        )));
    }
    let parse = |words: &[String]| {
        let mut argv = vec!["#EBB".to_string()];
        argv.extend(words.iter().cloned());
        argv.extend(["--".to_string(), path.display().to_string()]);
        ScriptFlags::try_parse_from(&argv).map(|s| s.flags)
    };
    let mut words = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("#EBB") else { continue };
        let at = || format!("{}:{}: {}", path.display(), number + 1, line.trim());
        if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
            return Err(usage(format!("{}: a directive is `#EBB --flag value`", at())));
        }
        let line_words = shlex::split(rest).ok_or_else(|| usage(format!("{}: an unclosed quote", at())))?;
        if let Err(e) = parse(&line_words) {
            let message = e.render().to_string();
            let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
            let tip =
                message.lines().find(|l| l.trim().starts_with("tip:")).map(|l| format!(" ({})", l.trim()));
            return Err(usage(format!(
                "{}: {}{}",
                at(),
                first.trim_start_matches("error: "),
                tip.unwrap_or_default()
            )));
        }
        words.extend(line_words);
    }
    if words.is_empty() {
        return Ok(None);
    }
    parse(&words)
        .map(Some)
        .map_err(|e| usage(format!("{}: #EBB lines: {}", path.display(), e.render().to_string().trim())))
}

/// Builds the submission: a job script's `#EBB` flags first, the command
/// line's over them.
pub fn submission(args: &SubmitArgs) -> Result<api::JobSubmission, CliError> {
    let mut argv = args.command.clone();
    let script = Path::new(&argv[0]);
    let from_script = if argv.len() == 1 && script.is_file() { script_flags(script)? } else { None };
    if from_script.is_some() || (argv.len() == 1 && script.is_file()) {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(script).map(|m| m.permissions().mode()).unwrap_or(0);
        if mode & 0o111 == 0 {
            return Err(usage(format!("job script {} is not executable (chmod +x it)", script.display())));
        }
        let absolute = std::fs::canonicalize(script).map_err(file(script))?;
        argv = vec![absolute.display().to_string()];
    }
    let base = from_script.unwrap_or_default();
    let mut sweep = Vec::new();
    for param in base.sweep.iter().chain(&args.sweep) {
        let (name, values) = param
            .split_once('=')
            .ok_or_else(|| usage(format!("--sweep {param}: expected NAME=V1,V2,...")))?;
        let values: Vec<String> = values.split(',').map(str::to_string).collect();
        if values.iter().any(String::is_empty) {
            return Err(usage(format!("--sweep {param}: empty value")));
        }
        sweep.push(api::SweepParam { name: name.to_string(), values });
    }
    let image = args.image.clone().or(base.image);
    let chdir = args.chdir.as_deref().or(base.chdir.as_deref());
    // In an image, the directory is the image's, not this machine's.
    let workdir = match (&image, chdir) {
        (Some(_), Some(dir)) if !dir.starts_with('/') => {
            return Err(usage(format!("--chdir {dir}: in an image, give an absolute path inside it")));
        }
        (Some(_), dir) => dir.map(str::to_string),
        (None, dir) => Some(workdir(dir)?),
    };
    let (array, array_limit) = match args.array.as_deref().or(base.array.as_deref()) {
        Some(text) => match text.split_once('%') {
            Some((range, limit)) => {
                let n = limit.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    usage(format!(
                        "--array {text}: %N is a limit on tasks running at once, a positive whole number"
                    ))
                })?;
                (Some(range), Some(n))
            }
            None => (Some(text), None),
        },
        None => (None, None),
    };
    let export = args.export.as_deref().or(base.export.as_deref()).unwrap_or("ALL");
    let mut env = exported(export, std::env::vars_os())?;
    for pair in base.env.iter().chain(&args.env) {
        let (k, v) = pair.split_once('=').ok_or_else(|| usage(format!("--env {pair}: expected K=V")))?;
        env.insert(k.to_string(), v.to_string());
    }
    Ok(api::JobSubmission {
        name: args.name.clone().or(base.name),
        tier: args.tier.clone().or(base.tier),
        gpus: args.gpus.or(base.gpus).map(|g| g.fewest),
        max_gpus: args.gpus.or(base.gpus).and_then(|g| g.most),
        gpu_model: args.gpu_model.clone().or(base.gpu_model),
        argv,
        env,
        workdir,
        signal: args.signal.clone().or(base.signal),
        max_preemptions: args.max_preemptions.or(base.max_preemptions),
        priority: args.priority.or(base.priority),
        max_retries: args.max_retries.or(base.max_retries),
        exit_on_drain_is_success: args.exit_on_drain_is_success || base.exit_on_drain_is_success,
        array: array.map(str::to_string),
        array_limit,
        time_limit_s: args.time.or(base.time).map(|t| t.as_millis().div_ceil(1000)),
        after: args.after.clone().or(base.after),
        slurm: None,
        restart: args.restart.clone().or(base.restart),
        sweep,
        deadline: args.deadline.as_deref().or(base.deadline.as_deref()).map(with_seconds),
        image,
        image_digest: None,
    })
}

/// `2026-12-01T18:00Z` as the API spells it, `2026-12-01T18:00:00Z`: a
/// time given to the minute gets its seconds.
fn with_seconds(text: &str) -> String {
    let text = text.trim();
    let b = text.as_bytes();
    let to_the_minute =
        b.len() >= 16 && matches!(b[10], b'T' | b' ') && b[13] == b':' && b.get(16) != Some(&b':');
    match to_the_minute {
        true => format!("{}:00{}", &text[..16], &text[16..]),
        false => text.to_string(),
    }
}

/// Variables `--export ALL` leaves out: Ebb's own (and the CLI's token),
/// the GPUs Ebb assigns, who runs the job (the node's user for the
/// tenant), and the submitting shell's bookkeeping.
pub(crate) fn not_exported(name: &str) -> bool {
    name.starts_with("EBB_")
        || ["CUDA_VISIBLE_DEVICES", "HOME", "USER", "LOGNAME", "PWD", "OLDPWD", "SHLVL", "_"].contains(&name)
}

/// A name a job's environment can carry: what the server accepts.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The submitter's variables the job gets, for `--export`.
fn exported(
    mode: &str,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<BTreeMap<String, String>, CliError> {
    let vars: BTreeMap<String, String> =
        vars.filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    match mode {
        all if all.eq_ignore_ascii_case("all") => {
            Ok(vars.into_iter().filter(|(k, _)| valid_name(k) && !not_exported(k)).collect())
        }
        none if none.eq_ignore_ascii_case("none") => Ok(BTreeMap::new()),
        list => {
            let mut env = BTreeMap::new();
            for item in list.split(',') {
                let (name, value) = match item.split_once('=') {
                    Some((name, value)) => (name, value.to_string()),
                    None => {
                        let value = vars.get(item).ok_or_else(|| {
                            usage(format!("--export {item}: not set here (ALL, NONE, or VAR,VAR=VALUE,...)"))
                        })?;
                        (item, value.clone())
                    }
                };
                if !valid_name(name) {
                    return Err(usage(format!(
                        "--export {item}: {name:?} is not a variable name (ALL, NONE, or VAR,VAR=VALUE,...)"
                    )));
                }
                env.insert(name.to_string(), value);
            }
            Ok(env)
        }
    }
}

/// The job's working directory: `--chdir` made absolute, or where the
/// submitter is.
fn workdir(chdir: Option<&str>) -> Result<String, CliError> {
    let here = std::env::current_dir()
        .map_err(|e| usage(format!("the current directory: {e} (pass --chdir DIR)")))?;
    let dir = match chdir {
        Some(dir) => here.join(dir),
        None => here,
    };
    dir.into_os_string()
        .into_string()
        .map_err(|d| usage(format!("--chdir {}: not UTF-8", d.to_string_lossy())))
}

pub async fn submit(conn: &Connection, args: &SubmitArgs) -> Result<String, CliError> {
    let spec = submission(args)?;
    let submitted: api::Submitted = conn.client()?.post("/v1/jobs", &spec).await?;
    Ok(if args.json {
        // One line, for scripts: the job (or an array's first task) and
        // every job made.
        let ids = if submitted.ids.is_empty() { vec![submitted.id] } else { submitted.ids.clone() };
        format!("{}\n", serde_json::json!({ "id": submitted.id, "ids": ids }))
    } else if submitted.ids.is_empty() {
        format!("submitted job {}\n", submitted.id)
    } else {
        let (first, last) = (submitted.ids[0], submitted.ids[submitted.ids.len() - 1]);
        format!("submitted {} tasks: jobs {first}-{last}\n", submitted.ids.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> SubmitArgs {
        let mut argv = vec!["#EBB"];
        argv.extend_from_slice(words);
        ScriptFlags::try_parse_from(argv).unwrap().flags
    }

    /// A priority is a number in range or a class's name, from the command
    /// line and from a script's `#EBB` lines alike; anything else is refused
    /// with what was expected.
    #[test]
    fn a_priority_is_a_number_in_range_or_a_class() {
        for (word, n) in
            [("high", 100), ("normal", 0), ("low", -100), ("-1000", -1000), ("1000", 1000), ("+7", 7)]
        {
            assert_eq!(
                submission(&args(&["--priority", word, "--", "true"])).unwrap().priority,
                Some(n),
                "{word}"
            );
        }
        for word in ["1001", "-1001", "99999999999999999999", "HIGH", "", "1e3", "urgent"] {
            let refused = ScriptFlags::try_parse_from(["#EBB", "--priority", word, "--", "true"]);
            let text = refused.err().expect(word).to_string();
            assert!(text.contains("--priority"), "{text}");
            assert!(text.contains("-1000 to 1000"), "{text}");
        }
    }

    #[test]
    fn gpus_are_a_count_or_an_elastic_range() {
        assert_eq!(parse_gpus("8").unwrap(), Gpus { fewest: 8, most: None });
        assert_eq!(parse_gpus("16:64").unwrap(), Gpus { fewest: 16, most: Some(64) });
        // 0 is the server's to refuse, by its limits.
        assert_eq!(parse_gpus("0").unwrap(), Gpus { fewest: 0, most: None });
        for (text, words) in [
            ("8:8", "needs MIN below MAX"),
            ("16:8", "needs MIN below MAX"),
            (":8", "expected a number"),
            ("8:", "expected a number"),
            ("8:16:24", "expected a number"),
            ("-8", "expected a number"),
        ] {
            let err = parse_gpus(text).unwrap_err().to_string();
            assert!(err.contains(words), "{text}: {err}");
        }
    }

    proptest::proptest! {
        /// Every number is taken exactly when it is in range, and any text
        /// at all is answered, never a panic.
        #[test]
        fn any_gpus_text_is_a_count_a_range_or_refused(a in 0u64..100_000, b in 0u64..100_000, text in ".{0,24}") {
            let range = parse_gpus(&format!("{a}:{b}"));
            proptest::prop_assert_eq!(range.is_ok(), a < b && b <= u32::MAX as u64);
            if let Ok(g) = range {
                proptest::prop_assert_eq!((g.fewest as u64, g.most.map(u64::from)), (a, Some(b)));
            }
            let _ = parse_gpus(&text);
        }

        #[test]
        fn any_priority_text_is_taken_in_range_or_refused(n in proptest::prelude::any::<i64>(), text in ".{0,24}") {
            proptest::prop_assert_eq!(parse_priority(&n.to_string()).is_ok(), (-1000..=1000).contains(&n));
            let _ = parse_priority(&text);
        }
    }

    #[test]
    fn an_arrays_limit_a_time_limit_and_dependencies_reach_the_submission() {
        let s = submission(&args(&[
            "--array",
            "0-9%3",
            "--time",
            "90m",
            "--after",
            "afterok:4,singleton",
            "--",
            "true",
        ]))
        .unwrap();
        assert_eq!((s.array.as_deref(), s.array_limit), (Some("0-9"), Some(3)));
        assert_eq!(s.time_limit_s, Some(5400));
        assert_eq!(s.after.as_deref(), Some("afterok:4,singleton"));
        let bad = submission(&args(&["--array", "0-9%x", "--", "true"])).unwrap_err();
        assert!(matches!(&bad, CliError::Usage(_)), "{bad:?}");
        assert_eq!(
            bad.to_string(),
            "--array 0-9%x: %N is a limit on tasks running at once, a positive whole number"
        );
    }

    #[test]
    fn a_slurm_script_is_sent_to_sbatch() {
        let dir = std::env::temp_dir().join(format!("ebb-submit-sbatch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("job.sh");
        std::fs::write(&script, "#!/bin/sh\n#SBATCH --gres=gpu:2\necho hi\n").unwrap();
        let err = submission(&args(&[script.to_str().unwrap()])).unwrap_err().to_string();
        assert!(err.contains("is a Slurm batch script (#SBATCH lines): submit it with sbatch"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_deadline_to_the_minute_gets_its_seconds() {
        assert_eq!(with_seconds("2026-12-01T18:00Z"), "2026-12-01T18:00:00Z");
        assert_eq!(with_seconds("2026-12-01T18:00"), "2026-12-01T18:00:00");
        assert_eq!(with_seconds("2026-12-01T18:00:30Z"), "2026-12-01T18:00:30Z");
        assert_eq!(with_seconds("2026-12-01"), "2026-12-01");
    }
}
