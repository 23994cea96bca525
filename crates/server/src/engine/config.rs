//! The writer's configuration: one `EngineConfig`, validated before the
//! writer starts, its bounds the core's where the core owns them.

use super::*;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub drain_window: Span,
    /// A job preempted before is spared as a victim until its new attempt
    /// has run this long, while another victim fits; zero turns it off.
    pub min_runtime: Span,
    /// A tenant's usage, by which fair share orders tenants within a tier,
    /// halves over this long.
    pub fair_share_half_life: Span,
    /// Fair-share preemption's threshold in percent; off when `None`.
    pub fair_share_preemption: Option<u32>,
    pub heartbeat_timeout: Span,
    pub heartbeat_interval: Span,
    /// How long a finished job's record stays in the writer's memory; after
    /// it (and after a restart) it is read from the store when asked for.
    pub keep_finished: Span,
    /// How long a finished job's output stays in the store (zero: for
    /// ever); the job, its timeline and its bills stay.
    pub keep_output: Span,
    /// How far ahead of the server's clock an event time from a node may
    /// be before the report is refused.
    pub max_clock_skew: Span,
    /// How long a gang's other parts may run on after one part exited 0
    /// before they are stopped and the attempt fails: torchrun's nodes end
    /// milliseconds apart, and a rank 0 may save its final weights after
    /// its peers are done.
    pub gang_exit_grace: Span,
    pub pricing: crate::billing::Pricing,
    pub limits: crate::validate::Limits,
    pub run_as: RunAs,
    /// Where agents keep jobs' checkpoints (`--checkpoint-store`), told to
    /// each at registration; none: their shared checkpoint root.
    pub checkpoint_store: Option<ebb_api::CheckpointStoreLocation>,
    pub images: Images,
    /// Where the server's own requests (webhooks' deliveries; registries
    /// at submit, through `ServerConfig::registries`) may connect.
    pub outbound: ebb_http::Outbound,
    /// Seals tenants' registry passwords and webhooks' secrets in the
    /// store (`--secret-key-file`).
    pub secret_key: crate::sealed::SecretKey,
    /// Whether registry passwords may go to the agents with a start: only
    /// where the agents' connection is TLS or loopback; elsewhere a job
    /// in a private image fails with why.
    pub logins_to_nodes: bool,
    /// Slurm's partitions, each a tier (`--partition-map`).
    pub partitions: crate::partitions::Partitions,
    /// The names GPU models answer to besides their own (`--gpu-alias`).
    pub gpu_names: crate::gpu_names::GpuNames,
}

/// A setting out of its bounds: the flag that sets it, and a message that
/// names it, its value and the bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub message: String,
}

impl ConfigError {
    fn new(flag: &'static str, message: String) -> ConfigError {
        ConfigError { flag, message }
    }
}

/// What the CLI prints.
impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        e.message
    }
}

/// The scheduling policy's settings, as the operator gives them (the flags
/// of `ebb server` and `ebb up`), checked against the core's bounds.
pub fn check_policy(
    drain_window: Span,
    min_runtime: Span,
    half_life: Span,
    fair_share_preemption: Option<u32>,
) -> Result<(), ConfigError> {
    use ebb_scheduler::Config;
    if drain_window.as_millis() == 0 {
        let why = "--drain-window 0s: more than 0 (a drain with no window is a kill)".to_string();
        return Err(ConfigError::new("--drain-window", why));
    }
    if min_runtime > Config::MAX_MIN_RUNTIME {
        let why = format!("--min-runtime {}: at most 24h (0 turns the rule off)", min_runtime.human());
        return Err(ConfigError::new("--min-runtime", why));
    }
    if !Config::FAIR_SHARE_HALF_LIFE.contains(&half_life) {
        let why = format!("--fair-share-half-life {}: from 1s to 365 days", half_life.human());
        return Err(ConfigError::new("--fair-share-half-life", why));
    }
    match fair_share_preemption {
        Some(t) if !Config::FAIR_SHARE_PREEMPTION.contains(&t) => Err(ConfigError::new(
            "--fair-share-preemption",
            format!(
                "--fair-share-preemption {t}: a gap from 10 to 1000 percent (below 10, tenants near their \
                 shares trade GPUs back and forth)"
            ),
        )),
        _ => Ok(()),
    }
}

/// The writer's times, as the operator gives them: a heartbeat timeout at
/// least twice the interval, finished jobs kept in memory at most a week.
pub fn check_times(
    heartbeat_interval: Span,
    heartbeat_timeout: Span,
    keep_finished: Span,
) -> Result<(), ConfigError> {
    let (interval, timeout) = (heartbeat_interval, heartbeat_timeout);
    if interval.as_millis() == 0 {
        let why = format!("--heartbeat-interval {}: more than 0", interval.human());
        return Err(ConfigError::new("--heartbeat-interval", why));
    }
    if u128::from(timeout.as_millis()) < 2 * u128::from(interval.as_millis()) {
        let why = format!(
            "--heartbeat-timeout {} with --heartbeat-interval {}: the timeout must be at least twice the \
             interval, or a node that misses one check-in is lost (e.g. --heartbeat-timeout {})",
            timeout.human(),
            interval.human(),
            Span::from_millis(interval.as_millis().saturating_mul(3)).human()
        );
        return Err(ConfigError::new("--heartbeat-timeout", why));
    }
    if keep_finished > MAX_KEEP_FINISHED {
        let why = format!(
            "--keep-finished {}: at most 168h, a week (finished jobs are read from the database after it; 0 \
             drops them from memory at once)",
            keep_finished.human()
        );
        return Err(ConfigError::new("--keep-finished", why));
    }
    Ok(())
}

/// The longest `keep_finished`: a week. Memory grows with the jobs that
/// finish within it, and the store answers for them as well after it.
pub const MAX_KEEP_FINISHED: Span = Span(7 * 24 * 3_600_000);

impl EngineConfig {
    /// Every setting within its bounds, or what is not, named as the
    /// server's flag: the writer starts only from a configuration that
    /// passes (`Engine::open`), and the CLI asks before it starts anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_policy(
            self.drain_window,
            self.min_runtime,
            self.fair_share_half_life,
            self.fair_share_preemption,
        )?;
        check_times(self.heartbeat_interval, self.heartbeat_timeout, self.keep_finished)?;
        self.limits.validate()
    }

    /// A writer for a test in `dir`: a 3 s drain window, a minute's
    /// heartbeat timeout, $3.60 per GPU-hour on demand at the fixed 50%
    /// discount, no limits, finished jobs read back from the store. Tests
    /// change what they exercise with `..EngineConfig::for_tests(dir)`.
    pub fn for_tests(dir: &std::path::Path) -> EngineConfig {
        EngineConfig {
            data_dir: dir.to_path_buf(),
            drain_window: Span(3_000),
            min_runtime: Span(300_000),
            fair_share_half_life: Span(86_400_000),
            fair_share_preemption: None,
            heartbeat_timeout: Span(60_000),
            heartbeat_interval: Span(500),
            keep_finished: Span(0),
            keep_output: Span(0),
            max_clock_skew: Span(5_000),
            gang_exit_grace: Span(600_000),
            pricing: crate::billing::Pricing {
                prices: Vec::new(),
                default_price: 3_600_000,
                discount_bps: ebb_core::PriceBook::DEFAULT_DISCOUNT_BPS,
            },
            limits: Default::default(),
            run_as: Default::default(),
            checkpoint_store: None,
            images: Default::default(),
            outbound: Default::default(),
            secret_key: crate::sealed::SecretKey::from_bytes([7; 32]),
            logins_to_nodes: true,
            partitions: Default::default(),
            gpu_names: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> EngineConfig {
        EngineConfig::for_tests(std::path::Path::new("/nonexistent"))
    }

    #[test]
    fn each_bound_names_its_flag() {
        let refused = |c: EngineConfig| c.validate().unwrap_err().message;
        assert!(config().validate().is_ok(), "the tests' configuration is valid");
        assert!(refused(EngineConfig { min_runtime: Span(24 * 3_600_000 + 1), ..config() })
            .starts_with("--min-runtime "));
        assert!(refused(EngineConfig { fair_share_half_life: Span(999), ..config() })
            .starts_with("--fair-share-half-life"));
        assert!(refused(EngineConfig { fair_share_preemption: Some(9), ..config() })
            .starts_with("--fair-share-preemption 9:"));
        assert!(refused(EngineConfig { drain_window: Span(0), ..config() }).starts_with("--drain-window"));
        let timeout =
            EngineConfig { heartbeat_interval: Span(5_000), heartbeat_timeout: Span(9_999), ..config() };
        assert!(refused(timeout).contains("at least twice the interval"));
        assert!(refused(EngineConfig { keep_finished: Span(MAX_KEEP_FINISHED.0 + 1), ..config() })
            .starts_with("--keep-finished"));
        let limits = crate::Limits { max_requeues: 0, ..config().limits };
        let error = EngineConfig { limits, ..config() }.validate().unwrap_err();
        assert_eq!(
            (error.flag, error.message.as_str()),
            ("--max-requeues", "--max-requeues: must be at least 1")
        );
    }

    proptest! {
        /// At the extremes, validation never panics, and what it accepts
        /// is within every bound.
        #[test]
        fn validation_accepts_exactly_what_is_within_bounds(
            min_runtime in any::<u64>(), half_life in any::<u64>(), gap in proptest::option::of(any::<u32>()),
            drain in any::<u64>(), interval in any::<u64>(), timeout in any::<u64>(), keep in any::<u64>(),
        ) {
            let c = EngineConfig {
                min_runtime: Span(min_runtime),
                fair_share_half_life: Span(half_life),
                fair_share_preemption: gap,
                drain_window: Span(drain),
                heartbeat_interval: Span(interval),
                heartbeat_timeout: Span(timeout),
                keep_finished: Span(keep),
                ..config()
            };
            let within = min_runtime <= 24 * 3_600_000
                && (1_000..=365 * 86_400_000).contains(&half_life)
                && gap.is_none_or(|g| (10..=1000).contains(&g))
                && drain > 0
                && interval > 0
                && u128::from(timeout) >= 2 * u128::from(interval)
                && keep <= MAX_KEEP_FINISHED.0;
            prop_assert_eq!(c.validate().is_ok(), within, "{:?}", c.validate());
        }
    }
}
