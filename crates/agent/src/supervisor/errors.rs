//! Why an attempt could not start on this node. The text of each is what
//! the node says: the job's log gets it, and the server keeps it as the
//! exit's start error in the job's timeline.

use std::path::PathBuf;
use std::sync::Arc;

use nix::unistd::Uid;

use crate::cgroup::CgroupError;
use crate::container::{CdiError, PullGivenUp};
use crate::dirs::DirError;
use crate::identity::IdentityError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metadata endpoint: {0}")]
    Endpoint(std::io::Error),
    #[error("metadata endpoint: no random bytes: {0}")]
    Secret(getrandom::Error),
    /// Given up before it ran: a stop, a cancel or a drain came while its
    /// image was pulled (why, as that said).
    #[error("{0}")]
    Abandoned(String),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    #[error("cannot find the agent's own program: {0}")]
    OwnProgram(std::io::Error),
    #[error("cannot start {program:?}: {cause} (as {user}, uid {uid}, in {})", workdir.display())]
    Spawn { program: String, cause: String, user: String, uid: Uid, workdir: PathBuf },
    /// A simulated node's job asked for what it cannot do (`EBB_SIM_*`).
    #[error(transparent)]
    Simulated(#[from] crate::simulated::BehaviourError),
    /// A test's supervisor refused it.
    #[cfg(test)]
    #[error("{0}")]
    Refused(String),
}

/// Why a job in an image could not start.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The node's image cache could not be opened when the agent started.
    #[error("image {reference}: {cache}")]
    NoCache { reference: String, cache: CacheUnavailable },
    #[error("image {reference}: {why}")]
    GivenUp { reference: String, why: PullGivenUp },
    #[error(transparent)]
    Pull(#[from] ebb_image::ImageError),
    #[error("image {0}: jobs in images need an agent that runs as root")]
    NeedsRoot(String),
    #[error("CDI spec {}: {source}", path.display())]
    CdiFile { path: PathBuf, source: std::io::Error },
    #[error("CDI spec {}: {source}", path.display())]
    CdiJson { path: PathBuf, source: serde_json::Error },
    #[error("{}: {source}", path.display())]
    Cdi { path: PathBuf, source: CdiError },
    #[error("image {reference}: cannot write its bundle: {source}")]
    Bundle { reference: String, source: std::io::Error },
    #[error("cannot start the container shim {}: {cause}", exe.display())]
    Shim { exe: PathBuf, cause: String },
}

/// The node's image cache could not be opened: every job in an image
/// fails with this.
#[derive(Clone, Debug, thiserror::Error)]
#[error("this node's image cache {} cannot be opened: {source}", dir.display())]
pub struct CacheUnavailable {
    pub dir: PathBuf,
    pub source: Arc<std::io::Error>,
}

/// Why a Slurm job's script or commands could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    Commands(#[from] CommandsUnavailable),
    #[error("{}: {source}", path.display())]
    Script { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Steps(#[from] DirError),
}

/// The node's Slurm commands could not be installed: every Slurm job
/// fails with this.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the Slurm commands: {}: {source}", path.display())]
pub struct CommandsUnavailable {
    pub path: PathBuf,
    pub source: Arc<std::io::Error>,
}
