//! Job traces in the ITP format: `job_id,submission_time,duration,num_gpu`,
//! times in seconds. A bad file is refused whole, with the line and the
//! field that was wrong.

use std::path::Path;

use ebb_core::Tier;

use crate::SimError;

/// One job as the trace records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    pub id: String,
    pub submit_s: u64,
    pub duration_s: u64,
    pub gpus: u32,
}

/// A trace and, if given as `--trace TIER=PATH`, the tier of all its
/// jobs; given as `--tenant NAME=PATH:WEIGHT[:TIER]`, the tenant whose
/// jobs it holds.
#[derive(Clone, Debug)]
pub struct Trace {
    pub name: String,
    pub tier: Option<Tier>,
    pub tenant: Option<TraceTenant>,
    pub jobs: Vec<TraceJob>,
}

/// The tenant a trace's jobs are submitted as, with its fair-share weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceTenant {
    pub name: String,
    pub weight: u32,
}

const COLUMNS: [&str; 4] = ["job_id", "submission_time", "duration", "num_gpu"];

impl Trace {
    /// Parses `--trace` arguments: `PATH` or `TIER=PATH`.
    pub fn load_arg(arg: &str) -> Result<Trace, SimError> {
        let (tier, path) = match arg.split_once('=') {
            // A file whose name holds '=' is still a file.
            Some(_) if Path::new(arg).is_file() => (None, arg),
            Some((tier, path)) => {
                let tier =
                    tier.parse::<Tier>().map_err(|e| SimError::Config(format!("--trace {arg}: {e}")))?;
                (Some(tier), path)
            }
            None => (None, arg),
        };
        Trace::load(Path::new(path), tier)
    }

    /// Parses `--tenant` arguments: `NAME=PATH[:WEIGHT[:TIER]]`, weight 1
    /// unless given; a tenant's tier is on-demand or preemptible (untagged:
    /// `--preemptible-fraction` decides per job).
    pub fn load_tenant_arg(arg: &str) -> Result<Trace, SimError> {
        let bad = |m: String| SimError::Config(format!("--tenant {arg}: {m}"));
        let (name, rest) =
            arg.split_once('=').ok_or_else(|| bad("expected NAME=PATH[:WEIGHT[:TIER]]".into()))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(bad(format!("a tenant's name is letters, digits, '-', '_' and '.', got {name:?}")));
        }
        let mut parts = rest.splitn(3, ':');
        let path = parts.next().unwrap_or_default();
        let weight = match parts.next() {
            None => 1,
            Some(w) => {
                w.parse::<u32>().ok().filter(|w| (1..=1_000_000).contains(w)).ok_or_else(|| {
                    bad(format!("weight must be a whole number from 1 to 1000000, got {w:?}"))
                })?
            }
        };
        let tier = match parts.next() {
            None => None,
            Some(t) => match t.parse::<Tier>().map_err(|e| bad(e.to_string()))? {
                Tier::Reserved => return Err(bad("a tenant's tier is on-demand or preemptible".into())),
                tier => Some(tier),
            },
        };
        let mut trace = Trace::load(Path::new(path), tier)?;
        trace.tenant = Some(TraceTenant { name: name.to_string(), weight });
        Ok(trace)
    }

    pub fn load(path: &Path, tier: Option<Tier>) -> Result<Trace, SimError> {
        let text = std::fs::read(path).map_err(|e| SimError::Io(path.display().to_string(), e))?;
        let name = path.display().to_string();
        let jobs = parse(&name, &text)?;
        Ok(Trace { name, tier, tenant: None, jobs })
    }
}

/// Parses trace text; `name` is used in error messages.
pub fn parse(name: &str, text: &[u8]) -> Result<Vec<TraceJob>, SimError> {
    let bad = |line: u64, field: &str, message: String| SimError::Trace {
        trace: name.to_string(),
        line,
        field: field.to_string(),
        message,
    };
    let mut reader = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(text);
    let header = reader.headers().map_err(|e| bad(1, "header", e.to_string()))?.clone();
    let columns: Vec<&str> = header.iter().collect();
    if columns != COLUMNS {
        return Err(bad(1, "header", format!("expected {}, got {}", COLUMNS.join(","), columns.join(","))));
    }
    let mut jobs = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            bad(line, "record", e.to_string())
        })?;
        let line = record.position().map_or(0, |p| p.line());
        let number = |i: usize| -> Result<u64, SimError> {
            let text = &record[i];
            text.parse::<u64>()
                .map_err(|_| bad(line, COLUMNS[i], format!("expected a non-negative integer, got {text:?}")))
        };
        let id = record[0].to_string();
        if id.is_empty() {
            return Err(bad(line, "job_id", "must not be empty".into()));
        }
        let submit_s = number(1)?;
        let duration_s = number(2)?;
        let gpus = number(3)?;
        if gpus == 0 || gpus > u32::MAX as u64 {
            return Err(bad(line, "num_gpu", format!("must be at least 1, got {gpus}")));
        }
        jobs.push(TraceJob { id, submit_s, duration_s, gpus: gpus as u32 });
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse("t.csv", text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn parses_the_itp_format() {
        let jobs = parse("t.csv", b"job_id,submission_time,duration,num_gpu\na,10,20,2\nb,11,5,1\n").unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0], TraceJob { id: "a".into(), submit_s: 10, duration_s: 20, gpus: 2 });
    }

    #[test]
    fn bad_input_names_the_line_and_field() {
        let header = "job_id,submission_time,duration,num_gpu\n";
        assert_eq!(
            err(&format!("{header}a,10,20,2\nb,x,5,1\n")),
            "t.csv line 3: submission_time: expected a non-negative integer, got \"x\""
        );
        assert_eq!(
            err(&format!("{header}a,10,-3,2\n")),
            "t.csv line 2: duration: expected a non-negative integer, got \"-3\""
        );
        assert_eq!(err(&format!("{header}a,10,3,0\n")), "t.csv line 2: num_gpu: must be at least 1, got 0");
        assert!(
            err(&format!("{header}a,10,3\n")).starts_with("t.csv line 2: record:"),
            "{}",
            err(&format!("{header}a,10,3\n"))
        );
        assert!(err("id,submit,duration,gpus\n").starts_with("t.csv line 1: header: expected job_id,"));
    }

    /// The tier of `--trace TIER=PATH` is read as everywhere else in Ebb:
    /// `spot=` is preemptible, and a wrong one names the names.
    #[test]
    fn a_traces_tier_takes_the_aliases_ebb_takes_everywhere() {
        let path = std::env::temp_dir().join(format!("ebb-trace-tier-{}.csv", std::process::id()));
        std::fs::write(&path, "job_id,submission_time,duration,num_gpu\na,0,5,1\n").unwrap();
        let spot = Trace::load_arg(&format!("spot={}", path.display())).unwrap();
        assert_eq!(spot.tier, Some(Tier::Preemptible));
        let ondemand = Trace::load_arg(&format!("ondemand={}", path.display())).unwrap();
        assert_eq!(ondemand.tier, Some(Tier::OnDemand));
        let wrong = Trace::load_arg(&format!("cheap={}", path.display())).unwrap_err().to_string();
        assert!(
            wrong.contains("expected preemptible (also spot), on-demand (also ondemand) or reserved"),
            "{wrong}"
        );
        let _ = std::fs::remove_file(&path);
    }
}
