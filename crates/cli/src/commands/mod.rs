//! The user commands: submit, jobs, show, logs, cancel, nodes, drain,
//! reclaim, tenant. Each prints a table for people, or with `--json` the
//! API's JSON for scripts (`crate::output`).

mod fleet;
mod jobs;
mod submit;
mod webhooks;

pub use fleet::*;
pub use jobs::*;
pub use submit::*;
pub use webhooks::*;
