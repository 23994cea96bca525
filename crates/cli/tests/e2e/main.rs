//! Ebb end to end: the real `ebb` binary as server and agents on
//! loopback, jobs as real processes, the CLI as a user runs it, a real
//! browser, PostgreSQL and registry. One binary, a module per area, one
//! `support` module for the cluster and the tools around it. Tests that
//! need no process belong in the writer's in-process tests
//! (`crates/server/tests/writer`), not here.

#[path = "../../../server/tests/writer/pg.rs"]
mod pg;
mod support;

mod abuse;
mod agent_stop;
mod cancel_and_metrics;
mod checkpoint_store;
mod containment;
mod dashboard;
mod deadlines;
mod drill;
mod elastic;
mod failover;
mod fairness;
mod first_hour;
mod first_hour_messages;
mod gpu_health;
mod identity;
mod images;
mod lifecycle;
mod money;
mod output;
mod ownership;
mod package;
mod postgres;
mod pyxis;
mod ray_cluster;
mod readme;
mod sim_cli;
mod simulated_fleet;
mod slurm;
mod stream;
mod takeover;
mod tls;
mod webhooks;
mod workloads;
