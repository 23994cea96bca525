//! Checking a submission before anything is stored: every refusal names
//! the field that was wrong.

use ebb_api::JobSubmission;
use ebb_core::Tier;
use ebb_scheduler::{shape_fits, State};

use crate::ApiError;

pub struct Checked {
    pub tier: Tier,
    pub gpus: u32,
    pub signal: i32,
    /// The tasks of an array or sweep (none for a single job).
    pub tasks: Vec<Task>,
}

/// One task of an array or sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// `EBB_TASK_INDEX`: the array index, or the combination's ordinal.
    pub index: u64,
    /// A sweep task's parameters, in the order they were given.
    pub params: Vec<(String, String)>,
}

pub const MAX_GPUS: u32 = 4096;

/// Refusals the API document states (a limit, a pattern) are 400s; those
/// it cannot state (what this cluster has, how fields relate) are 422s.
pub fn submission(spec: &JobSubmission, core: &State) -> Result<Checked, ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m));
    let refuse = |m: String| Err(ApiError::unprocessable(m));
    match spec.argv.first() {
        None => return bad("argv: must name a program to run".into()),
        Some(program) if program.is_empty() => return refuse("argv: the program name is empty".into()),
        _ => {}
    }
    if spec.argv.iter().any(|a| a.contains('\0')) {
        return bad("argv: arguments must not contain NUL bytes".into());
    }
    let tier = match spec.tier.as_deref() {
        None => Tier::Preemptible,
        Some(t) => t.parse::<Tier>().map_err(|e| ApiError::bad_request(format!("tier: {e}")))?,
    };
    let gpus = spec.gpus.unwrap_or(1);
    if gpus == 0 || gpus > MAX_GPUS {
        return bad(format!("gpus: must be between 1 and {MAX_GPUS}, got {gpus}"));
    }
    for (key, value) in &spec.env {
        let valid = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return bad(format!("env: {key:?} is not a valid variable name"));
        }
        if key.starts_with("EBB_") || key == "CUDA_VISIBLE_DEVICES" {
            return bad(format!("env: {key} is set by ebb and cannot be overridden"));
        }
        if value.contains('\0') {
            return bad(format!("env: the value of {key} contains a NUL byte"));
        }
    }
    let signal = match &spec.signal {
        None => 15,
        Some(name) => parse_signal(name).ok_or_else(|| {
            ApiError::bad_request(format!("signal: unknown signal {name:?} (e.g. TERM, SIGUSR1, 10)"))
        })?,
    };
    if let Some(name) = spec.name.as_deref() {
        if name.chars().count() > 256 || name.contains(['\n', '\0']) {
            return bad("name: must be one line of at most 256 characters".into());
        }
    }
    // Against the cluster as it is: a model that exists, a shape that fits.
    let models: Vec<_> = core.models().collect();
    if let Some(wanted) = &spec.gpu_model {
        if !models.is_empty() && core.model_by_name(wanted).is_none() {
            let known: Vec<&str> = models.iter().map(|(_, m)| m.name.as_str()).collect();
            return refuse(format!("gpu_model: unknown model {wanted:?} (nodes have {})", known.join(", ")));
        }
    }
    let candidates: Vec<_> =
        models.iter().filter(|(_, m)| spec.gpu_model.as_deref().is_none_or(|w| w == m.name)).collect();
    if !candidates.is_empty() && !candidates.iter().any(|(_, m)| shape_fits(gpus, m.gpus_per_node)) {
        let per_node = candidates[0].1.gpus_per_node;
        return refuse(format!(
            "gpus: {gpus} GPUs cannot be placed on nodes of {per_node} GPUs (at most {per_node}, or a multiple of {per_node})"
        ));
    }
    match spec.restart.as_deref() {
        None | Some("never") | Some("always") => {}
        Some(other) => return bad(format!("restart: expected never or always, got {other:?}")),
    }
    let mut tasks = match spec.array.as_deref() {
        None => Vec::new(),
        Some(text) => {
            let (first, last) = parse_array(text).map_err(|e| {
                let message = format!("array: {e}");
                // 400 for text the document's pattern rules out; 422 for a
                // range it allows that runs backwards or is too long.
                if array_pattern_allows(text) {
                    ApiError::unprocessable(message)
                } else {
                    ApiError::bad_request(message)
                }
            })?;
            (first..=last).map(|index| Task { index, params: Vec::new() }).collect()
        }
    };
    if !spec.sweep.is_empty() {
        if spec.array.is_some() {
            return refuse(
                "sweep: cannot be combined with array (a sweep is an array of its combinations)".into(),
            );
        }
        tasks = sweep_tasks(&spec.sweep).map_err(|e| ApiError::unprocessable(format!("sweep: {e}")))?;
    }
    Ok(Checked { tier, gpus, signal, tasks })
}

pub const MAX_ARRAY_TASKS: u64 = 10_000;

/// `A-B` (inclusive) or a single index `N`.
fn parse_array(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("expected A-B with A <= B, got {text:?}");
    let (a, b) = match text.split_once('-') {
        Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
        None => {
            let n = text.trim().parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    if a > b {
        return Err(bad());
    }
    if b - a + 1 > MAX_ARRAY_TASKS {
        return Err(format!("at most {MAX_ARRAY_TASKS} tasks, got {}", b - a + 1));
    }
    Ok((a, b))
}

/// The API document's pattern for `array`, `^0*[0-9]{1,19}(-0*[0-9]{1,19})?$`:
/// one or two runs of digits, each at most 19 digits after leading zeros.
fn array_pattern_allows(text: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.trim_start_matches('0').len() <= 19
    };
    match text.split_once('-') {
        Some((a, b)) => part(a) && part(b),
        None => part(text),
    }
}

/// One task per combination of the parameters' values, the last parameter
/// varying fastest.
fn sweep_tasks(params: &[ebb_api::SweepParam]) -> Result<Vec<Task>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut total: u64 = 1;
    for p in params {
        let valid = !p.name.is_empty()
            && p.name.len() <= 64
            && !p.name.starts_with(|c: char| c.is_ascii_digit())
            && p.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{:?} is not a valid parameter name (letters, digits, '_')", p.name));
        }
        if !seen.insert(p.name.to_ascii_uppercase()) {
            return Err(format!("parameter {} is given twice", p.name));
        }
        if p.values.is_empty() {
            return Err(format!("parameter {} has no values", p.name));
        }
        if let Some(v) = p.values.iter().find(|v| v.contains('\0') || v.chars().count() > 4096) {
            return Err(format!(
                "parameter {}: value {v:?} has a NUL byte or is over 4096 characters",
                p.name
            ));
        }
        total = total.saturating_mul(p.values.len() as u64);
        if total > MAX_ARRAY_TASKS {
            return Err(format!("at most {MAX_ARRAY_TASKS} combinations, this grid has more"));
        }
    }
    let tasks = (0..total)
        .map(|index| {
            let mut rest = index;
            let mut chosen = vec![(String::new(), String::new()); params.len()];
            for (slot, p) in chosen.iter_mut().zip(params).rev() {
                let n = p.values.len() as u64;
                *slot = (p.name.clone(), p.values[(rest % n) as usize].clone());
                rest /= n;
            }
            Task { index, params: chosen }
        })
        .collect();
    Ok(tasks)
}

/// `TERM`, `SIGTERM`, `sigterm` or a number.
pub fn parse_signal(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = match bare {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "WINCH" => 28,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_api::SweepParam;

    fn param(name: &str, values: &[&str]) -> SweepParam {
        SweepParam { name: name.into(), values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn a_sweep_is_the_grid_in_order() {
        let tasks =
            sweep_tasks(&[param("lr", &["1e-3", "3e-4"]), param("bs", &["32", "64", "128"])]).unwrap();
        assert_eq!(tasks.len(), 6);
        let shown: Vec<String> = tasks
            .iter()
            .map(|t| t.params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(
            shown,
            [
                "lr=1e-3,bs=32",
                "lr=1e-3,bs=64",
                "lr=1e-3,bs=128",
                "lr=3e-4,bs=32",
                "lr=3e-4,bs=64",
                "lr=3e-4,bs=128"
            ]
        );
        assert_eq!(tasks.iter().map(|t| t.index).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_array_pattern_is_the_documents() {
        assert!(array_pattern_allows("0-99") && array_pattern_allows("7") && array_pattern_allows("007-9"));
        assert!(array_pattern_allows("0-9999999999999999999"));
        for text in ["", "1-", "-1", "a-b", "1-2-3", " 1", "0-18446744073709551615", "1_000"] {
            assert!(!array_pattern_allows(text), "{text:?}");
        }
    }

    #[test]
    fn bad_sweeps_say_what_is_wrong() {
        let err = |p: &[SweepParam]| sweep_tasks(p).unwrap_err();
        assert!(err(&[param("1lr", &["1"])]).contains("not a valid parameter name"));
        assert!(err(&[param("lr", &[])]).contains("no values"));
        assert!(err(&[param("lr", &["1"]), param("LR", &["2"])]).contains("twice"));
        let big: Vec<String> = (0..101).map(|i| i.to_string()).collect();
        let big: Vec<&str> = big.iter().map(|s| s.as_str()).collect();
        assert!(err(&[param("a", &big), param("b", &big)]).contains("at most"));
    }
}
