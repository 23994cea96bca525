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
    /// First and last task index of an array job.
    pub array: Option<(u64, u64)>,
}

pub const MAX_GPUS: u32 = 4096;

pub fn submission(spec: &JobSubmission, core: &State) -> Result<Checked, ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m));
    match spec.argv.first() {
        None => return bad("argv: must name a program to run".into()),
        Some(program) if program.is_empty() => return bad("argv: the program name is empty".into()),
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
        if name.len() > 256 || name.contains(['\n', '\0']) {
            return bad("name: must be one line of at most 256 bytes".into());
        }
    }
    // Against the cluster as it is: a model that exists, a shape that fits.
    let models: Vec<_> = core.models().collect();
    if let Some(wanted) = &spec.gpu_model {
        if !models.is_empty() && core.model_by_name(wanted).is_none() {
            let known: Vec<&str> = models.iter().map(|(_, m)| m.name.as_str()).collect();
            return bad(format!("gpu_model: unknown model {wanted:?} (nodes have {})", known.join(", ")));
        }
    }
    let candidates: Vec<_> =
        models.iter().filter(|(_, m)| spec.gpu_model.as_deref().is_none_or(|w| w == m.name)).collect();
    if !candidates.is_empty() && !candidates.iter().any(|(_, m)| shape_fits(gpus, m.gpus_per_node)) {
        let per_node = candidates[0].1.gpus_per_node;
        return bad(format!(
            "gpus: {gpus} GPUs cannot be placed on nodes of {per_node} GPUs (at most {per_node}, or a multiple of {per_node})"
        ));
    }
    let array = match spec.array.as_deref() {
        None => None,
        Some(text) => Some(parse_array(text).map_err(|e| ApiError::bad_request(format!("array: {e}")))?),
    };
    if tier == Tier::Reserved {
        return bad("tier: reserved jobs draw on a reservation, and this cluster has none yet".into());
    }
    Ok(Checked { tier, gpus, signal, array })
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
