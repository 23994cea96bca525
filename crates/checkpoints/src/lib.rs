//! The checkpoint store: jobs' checkpoints in object storage (S3 or any
//! S3-compatible service, or a directory), so that a job preempted on one
//! node resumes on any other without a file system shared by the nodes.
//!
//! The problem: a job writes its checkpoints into a node-local directory
//! (`EBB_CHECKPOINT_DIR`), atomically (temporary, fsync, rename), and
//! reports each one. The agent copies the directory to the store after
//! each report and at the attempt's end, and before the next attempt
//! starts, on whatever node, copies the newest *complete* copy back. An
//! upload may be cut off at any moment (the agent killed, the node gone,
//! the drain deadline), and an object may be damaged in the store; neither
//! may ever be resumed from.
//!
//! The solution, per job, under `<prefix>/<tenant>/<job>/`:
//!
//! * `blobs/<sha256>`: each file's content, named by its SHA-256, so an
//!   unchanged file is stored once however many checkpoints name it;
//! * `manifests/<attempt>-<seq>.json` ([`Manifest`]): one per upload,
//!   written **last**, after every blob it names is stored, naming each
//!   file's path, size and hash (and the step the job reported).
//!
//! The latest checkpoint is the newest manifest ([`manifest::newest_first`]:
//! by attempt, then by upload within it, so a late upload from a node that
//! was lost never hides a newer attempt's). A partial upload has no
//! manifest, so it is never the latest. A restore checks every file's size
//! and hash as it arrives, stages everything before putting any file in
//! place, and on any mismatch refuses that manifest and falls back to the
//! one before ([`sync::restore`]).
//!
//! Where the store is comes from [`location`]: the server's
//! `--checkpoint-store` and its companions, handed to agents when they
//! register; the credentials are each process's own.

pub mod location;
pub mod manifest;
pub mod sync;

pub use location::{Credentials, Store, StoreError};
pub use manifest::{FileEntry, Manifest};
pub use sync::{JobStore, Restored, Rules, UploadCache};
