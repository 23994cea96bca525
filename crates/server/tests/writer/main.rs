//! The writer in-process, in one test binary: the engine driven directly,
//! batch by batch at explicit instants, over SQLite files and a throwaway
//! PostgreSQL, with agents modelled by the tests. No processes, no
//! sleeps; `Engine::sanity_check` after every batch.
//!
//! * `harness`: `TestEnv`, a store that fails one write on demand, fake
//!   agents; `batches`, `counts`, `gangs` and `staged` (a preemptor's
//!   start sent with the notice, and a property of any order of what
//!   happens to it against a model of the agent) use it.
//! * `billing`, `limits`, `fuzz`: properties over random sequences of
//!   submissions, exits, crashes and restarts, each with its own model of
//!   the agents and of the truth (what ran, what may be kept).
//! * `health`, `gpu_faults`, `migrations`, `store_contract`: a node whose
//!   reports fail, GPUs that go bad, a database an older Ebb left, and the
//!   contract both stores keep.
//! * `api`: the server's router over a `TestEnv`, requests served
//!   in-process; `requests`, `money_requests`, `drills` and `reasons` use
//!   it for what a client sees: statuses, refusals by name, paging,
//!   batches, why a job waits.

mod api;
mod batches;
mod billing;
mod capacity;
mod counts;
mod drills;
mod elastic;
mod fairness;
mod fuzz;
mod gangs;
mod gpu_faults;
mod harness;
mod health;
mod limits;
mod migrations;
mod money_requests;
mod pg;
mod pg_tls;
mod reasons;
mod requests;
mod slurm;
mod staged;
mod store_contract;
mod unstarted;
mod webhooks;
