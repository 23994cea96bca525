//! Ebb's scheduling core.
//!
//! A pure, deterministic scheduler: [`schedule`] reads a [`State`] and an
//! explicit `now` and returns a [`Plan`]; [`State::apply`] checks the plan
//! against the live state and commits it. No clock, no I/O, no randomness,
//! no async: the server and the simulator run exactly this code, and the
//! same inputs always give the same plan.
//!
//! The policy (priority, packing, backfill, preemption) is described in
//! `src/README.md`.

pub mod deadline;
mod error;
mod index;
mod model;
mod plan;
mod schedule;
mod state;

pub use error::{ApplyError, StateError};
pub use model::*;
pub use plan::*;
pub use schedule::schedule;
pub use state::{
    shape_fits, GpuModel, Hold, Node, Quota, RestoredRun, State, TenantShare, DEFAULT_MODEL_RATE,
    DEFAULT_WEIGHT,
};
