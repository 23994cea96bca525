//! A simulated fleet: `ebb agent --simulate-nodes N` runs N nodes in one
//! process, so that one small machine can stand in for thousands of nodes
//! when the server is measured.
//!
//! As far as the server can tell, each node is an agent: it has its own
//! name (`{name}-{i:05}`), registers with the join token, keeps the
//! credential it is issued in a data directory of its own
//! (`<data-dir>/nodes/<node>`), follows its command stream at the interval
//! the server gives and reports through a reporter of its own — the
//! agent's own code for all of it ([`Agent`], [`Client`], [`Reporter`]).
//! Only the attempts are simulated ([`Simulated`]): no processes, no
//! cgroups, no ledger, no job directories. The nodes share one
//! [`FleetCheckpoints`], so a job's attempt resumes from what an earlier
//! attempt saved on any node, as through a cluster's checkpoint store.
//!
//! The nodes share one HTTP client, so one connection pool and one TLS
//! trust, and one process's descriptors: each node's command poll holds a
//! connection, and the reports beside the polls take turns at what the
//! open-file limit leaves (at most [`REPORTS_IN_FLIGHT`] at once). A
//! report past the limit would not fail to connect and retry: it waits
//! for a slot. Their starts are paced, a node a millisecond, with at most
//! [`JOINING`] registrations under way at once, so that ten thousand nodes
//! do not all hit the server in the same millisecond; progress is logged
//! every second until every node has joined.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{self, Client};
use crate::commands::Agent;
use crate::drain;
use crate::report::Reporter;
use crate::simulated::{FleetCheckpoints, Simulated};
use crate::supervisor::Supervisor;
use crate::{tls, AgentConfig, AgentError};

/// How far apart the nodes start.
const PACE: Duration = Duration::from_millis(1);

/// At most this many nodes are registering at once.
const JOINING: usize = 256;

/// The most reports the fleet's nodes have in flight at once: enough to
/// keep a server busy, few enough that their connections stay open in the
/// pool for the next ones.
const REPORTS_IN_FLIGHT: u64 = 1024;

/// Descriptors the fleet keeps for what is not a node's connection: its
/// runtime, its log, the files of a node registering.
const SPARE_FILES: u64 = 256;

/// Output a simulated node holds while the server has not taken it: its
/// attempts write one line each.
const OUTPUT_BUFFER: u64 = 64 * 1024;

/// A node of the fleet.
struct SimNode {
    agent: Arc<Agent<Simulated>>,
    /// Its registration and command loop.
    follow: JoinHandle<()>,
}

impl SimNode {
    fn joined(&self) -> bool {
        self.agent.registrations.load(std::sync::atomic::Ordering::Relaxed) > 0
    }
}

type Nodes = Arc<Mutex<Vec<SimNode>>>;

/// The name of node `i` of a fleet named `name`.
pub(crate) fn node_name(name: &str, i: u32) -> String {
    format!("{name}-{i:05}")
}

/// Runs `n` simulated nodes until SIGINT or SIGTERM, then stops their
/// attempts; their connections stay within `files` descriptors.
pub(crate) async fn run(mut config: AgentConfig, n: u32, files: u64) -> Result<(), AgentError> {
    let data_dir = config.data_dir.clone();
    config.data_dir = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(data_dir.join("nodes"))
            .and_then(|()| std::fs::canonicalize(&data_dir))
            .map_err(|source| AgentError::Directory { flag: "--data-dir", path: data_dir, source })
    })
    .await??;
    // Before any node calls the server, as for one agent.
    let trust =
        tls::agent_trust(&config.server, config.ca.as_deref(), config.ca_fingerprint, &config.data_dir)
            .await?;
    let http = crate::http_client(trust.as_ref())?;
    let nodes = Nodes::default();
    let slots = files.saturating_sub(u64::from(n) + SPARE_FILES).clamp(16, REPORTS_IN_FLIGHT);
    let reports = Arc::new(tokio::sync::Semaphore::new(slots as usize));
    tracing::info!(
        nodes = n,
        gpus = config.gpus,
        gpu_model = config.gpu_model,
        reports_in_flight = slots,
        "starting a simulated fleet"
    );
    let fleet = Fleet { config: Arc::new(config), http, trust, checkpoints: Default::default(), reports };
    let mut starting = tokio::spawn(start_all(fleet, n, nodes.clone()));
    let outcome = tokio::select! {
        stopped = crate::until_told_to_stop() => stopped,
        started = &mut starting => match started {
            Ok(Ok(())) => crate::until_told_to_stop().await,
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e.into()),
        },
    };
    starting.abort();
    let nodes = std::mem::take(&mut *nodes.lock().expect("nodes"));
    tracing::info!("stopping: ending the simulated nodes' attempts");
    stop(nodes).await;
    outcome
}

/// What every node of the fleet shares.
struct Fleet {
    config: Arc<AgentConfig>,
    /// One connection pool.
    http: reqwest::Client,
    trust: Option<tls::Trust>,
    /// Jobs' newest checkpoints, whichever node reported them.
    checkpoints: Arc<FleetCheckpoints>,
    /// Slots for reports in flight.
    reports: Arc<tokio::sync::Semaphore>,
}

/// Starts the nodes, paced, then logs their joining until all have.
async fn start_all(fleet: Fleet, n: u32, nodes: Nodes) -> Result<(), AgentError> {
    let began = Instant::now();
    let mut progress = Progress { last: began, n };
    // Nodes before this one have all joined.
    let mut first_joining = 0;
    for i in 0..n {
        tokio::time::sleep_until(began + PACE * i).await;
        while joining(&nodes.lock().expect("nodes"), &mut first_joining) >= JOINING {
            progress.log(&nodes);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let node = start_node(&fleet, i).await?;
        nodes.lock().expect("nodes").push(node);
        progress.log(&nodes);
    }
    while progress.log(&nodes) < n as usize {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!("all {n} simulated nodes registered in {:.1}s", began.elapsed().as_secs_f64());
    Ok(())
}

/// How many nodes from `first` on are registering; moves `first` past
/// those that have joined.
fn joining(nodes: &[SimNode], first: &mut usize) -> usize {
    while nodes.get(*first).is_some_and(SimNode::joined) {
        *first += 1;
    }
    nodes[*first..].iter().filter(|node| !node.joined()).count()
}

/// The fleet's joining, logged once a second.
struct Progress {
    last: Instant,
    n: u32,
}

impl Progress {
    /// Logs how many nodes have joined if a second has passed since the
    /// last time; returns how many have.
    fn log(&mut self, nodes: &Nodes) -> usize {
        let now = Instant::now();
        let joined = nodes.lock().expect("nodes").iter().filter(|node| node.joined()).count();
        if now >= self.last + Duration::from_secs(1) {
            tracing::info!("registered {joined}/{}", self.n);
            self.last = now;
        }
        joined
    }
}

/// Starts node `i`: its data directory and credential, its reporter, its
/// command loop.
async fn start_node(fleet: &Fleet, i: u32) -> Result<SimNode, AgentError> {
    let Fleet { config, http, trust, checkpoints, reports } = fleet;
    let name = node_name(&config.name, i);
    let data_dir = config.data_dir.join("nodes").join(&name);
    let dir = data_dir.clone();
    let credential = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir).map_err(|source| AgentError::Directory {
            flag: "--data-dir",
            path: dir.clone(),
            source,
        })?;
        client::load_credential(&dir)
    })
    .await??;
    let client = Arc::new(
        Client::new(http.clone(), &config.server, &config.join_token, &data_dir, credential)
            .trusting(trust.clone()),
    );
    let (reporter, queue) = Reporter::sharing(OUTPUT_BUFFER, Some(reports.clone()));
    let supervisor = Arc::new(Simulated::new(&name, reporter.clone(), checkpoints.clone()));
    let fenced = supervisor.clone();
    tokio::spawn(reporter.clone().run(queue, client.clone(), name.clone(), move |stale| {
        drain::kill_stale(&*fenced, stale, "the server fenced this stale attempt")
    }));
    let node = crate::commands::Node { name, ..crate::node(config) };
    let agent = Arc::new(Agent {
        node,
        client,
        reporter,
        supervisor,
        registrations: Default::default(),
        checkpoints: None,
        health: None,
    });
    let follow = tokio::spawn(agent.clone().follow());
    Ok(SimNode { agent, follow })
}

/// Stops every node: its command loop, then its attempts as a stopping
/// agent does; then gives the reporters a few seconds to deliver the
/// exits.
async fn stop(nodes: Vec<SimNode>) {
    for node in &nodes {
        node.follow.abort();
    }
    let stops: Vec<_> = nodes
        .iter()
        .filter(|node| !node.agent.supervisor.running().is_empty())
        .map(|node| {
            let supervisor = node.agent.supervisor.clone();
            tokio::spawn(async move { drain::stop_all(&supervisor, Duration::from_secs(3)).await })
        })
        .collect();
    for stopping in stops {
        let _ = stopping.await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && nodes.iter().any(|node| !node.agent.reporter.unreported().is_empty()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_after_the_fleet_with_their_number() {
        assert_eq!(node_name("rack7", 0), "rack7-00000");
        assert_eq!(node_name("rack7", 12345), "rack7-12345");
        assert_eq!(node_name("rack7", 99999), "rack7-99999");
    }
}
