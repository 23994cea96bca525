//! Why a command failed: what `ebb` prints after `error:`, and the exit
//! status scripts can act on.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The servers' answer, or its absence.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// What was asked is not right: a flag, an argument, a setting, what a
    /// file given holds. The text names which.
    #[error("{0}")]
    Usage(String),
    /// The command did what it was asked, and what it found is a failure:
    /// a drill whose verdict is not ready, a job waited for that failed,
    /// a log that was removed. In words.
    #[error("{0}")]
    Failed(String),
    /// A file the command reads or writes.
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    /// A file or directory given with a flag.
    #[error("{flag} {}: {source}", path.display())]
    Given { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error("writing output: {0}")]
    Output(std::io::Error),
    #[error("reading standard input: {0}")]
    Input(std::io::Error),
    /// The agent could not start or run.
    #[error(transparent)]
    Agent(#[from] ebb_agent::AgentError),
    /// A CA given cannot be used.
    #[error(transparent)]
    Trust(#[from] ebb_agent::tls::TrustError),
    /// The node's GPUs cannot be found.
    #[error(transparent)]
    Gpus(#[from] ebb_agent::gpus::GpuError),
    /// The checkpoint store's settings or credentials.
    #[error(transparent)]
    Checkpoints(#[from] ebb_checkpoints::StoreError),
    /// The cluster's checkpoint store did not answer as it should at
    /// start (`--checkpoint-store URL` and where).
    #[error("--checkpoint-store {store}: {source}")]
    CheckpointStore { store: String, source: ebb_checkpoints::StoreError },
    /// A setting of the server's out of its bounds.
    #[error(transparent)]
    Config(#[from] ebb_server::engine::ConfigError),
    /// `--outbound-allow`.
    #[error(transparent)]
    Outbound(#[from] ebb_http::outbound::NotARange),
    /// `--metrics-token-file`.
    #[error(transparent)]
    MetricsToken(#[from] ebb_server::http::scrape::MetricsTokenError),
    /// `--partition-map`, `--default-partition`.
    #[error(transparent)]
    Partitions(#[from] ebb_server::partitions::PartitionsError),
    /// `--gpu-alias`.
    #[error(transparent)]
    GpuAlias(#[from] ebb_server::gpu_names::GpuAliasError),
    /// The server's key for secrets at rest.
    #[error(transparent)]
    SecretKey(#[from] ebb_server::sealed::KeyFileError),
    /// A data directory could not be taken (another process holds it).
    #[error(transparent)]
    Lock(#[from] ebb_server::lock::LockError),
    /// The simulator's traces or settings.
    #[error(transparent)]
    Sim(#[from] ebb_sim::SimError),
    /// The server could not start, or stopped serving.
    #[error(transparent)]
    Serve(#[from] ebb_server::http::ServeError),
    /// The local cluster (`ebb up`) could not start, or stopped: a process
    /// of it exited, or did not come up.
    #[error("{0}")]
    Daemon(String),
    /// A Slurm step could not be run across its job's nodes.
    #[error(transparent)]
    Step(#[from] crate::slurm::StepError),
    /// A process the command starts could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn { what: String, source: std::io::Error },
    #[error("cannot wait for signals: {0}")]
    Signals(std::io::Error),
}

/// Nothing was done, and the same command may succeed later (no server
/// answered, or one refused for now): `EX_TEMPFAIL` of `sysexits.h`.
pub const EXIT_TRY_AGAIN: u8 = 75;
/// The command was used wrongly: as clap's own usage errors.
pub const EXIT_USAGE: u8 = 2;

impl CliError {
    /// The exit status: [`EXIT_USAGE`] for a usage error, [`EXIT_TRY_AGAIN`]
    /// where sending the same command again may succeed, 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.status())
    }

    fn status(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Config(_) | CliError::Partitions(_) | CliError::Outbound(_) => {
                EXIT_USAGE
            }
            CliError::Client(e) if e.retryable() => EXIT_TRY_AGAIN,
            _ => 1,
        }
    }
}

/// A command's outcome that is a failure, in words.
pub fn failed(text: impl Into<String>) -> CliError {
    CliError::Failed(text.into())
}

/// A usage error: the text names the flag or argument.
pub fn usage(text: impl Into<String>) -> CliError {
    CliError::Usage(text.into())
}

/// An error of the file or directory `path` given with `flag`.
pub fn given(flag: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CliError {
    let path = path.into();
    move |source| CliError::Given { flag, path, source }
}

/// A file error of `path`'s.
pub fn file(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CliError {
    let path = path.into();
    move |source| CliError::File { path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_what_may_succeed_later_75_and_the_rest_1() {
        assert_eq!(usage("--gpus: a number").status(), EXIT_USAGE);
        let unreachable = ClientError::Unreachable(vec!["cannot connect to http://127.0.0.1:1".into()]);
        assert_eq!(CliError::from(unreachable).status(), EXIT_TRY_AGAIN);
        let busy = ClientError::Refused { status: 503, message: "electing a leader".into() };
        assert_eq!(CliError::from(busy).status(), EXIT_TRY_AGAIN);
        let refused = ClientError::Refused { status: 404, message: "job 9: not found".into() };
        assert_eq!(CliError::from(refused).status(), 1);
        let unanswered = ClientError::Unanswered { server: "http://a".into(), seconds: 60 };
        assert_eq!(CliError::from(unanswered).status(), 1, "it may have been applied: look first");
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(file("/no/such")(missing).status(), 1);
    }
}
