//! Launch details: the checkpoint interval, a gang's rendezvous and its torchrun variables.

use super::table::JobTable;
use super::*;

impl<S: Store> Engine<S> {
    /// The rates an attempt of `tier` on `node` is billed at, per GPU-hour,
    /// fixed now for the whole attempt: (model, its tier's, on-demand's).
    pub(super) fn rates(&mut self, tier: Tier, node: &str) -> Written<(String, i64, i64)> {
        let model = self.fleet.nodes[node].gpu_model.clone();
        let p = &mut self.parts();
        let price = p.money.price_for(&model, &p.config.pricing, &mut p.fx)?;
        let rate = match tier {
            Tier::OnDemand => price.on_demand,
            Tier::Preemptible => {
                crate::billing::preemptible_rate(price.on_demand, self.config.pricing.discount_bps)
            }
            Tier::Reserved => 0,
        };
        Ok((model, rate, price.on_demand))
    }

    /// What a start carries beyond the job's record.
    pub(super) fn launch(&self) -> Launch<'_> {
        Launch { config: &self.config, tenants: &self.tenants, fleet: &self.fleet }
    }
}

/// The text of a checkpoint interval's recommendation, kept for the last
/// one: a backlog's placements in one batch mostly share it.
#[derive(Default)]
pub(super) struct WhyText(Option<(ebb_core::checkpoint::Recommendation, String)>);

impl WhyText {
    pub fn of(&mut self, recommendation: &ebb_core::checkpoint::Recommendation) -> String {
        match &self.0 {
            Some((last, text)) if last == recommendation => text.clone(),
            _ => {
                let text = recommendation.to_string();
                self.0 = Some((recommendation.clone(), text.clone()));
                text
            }
        }
    }
}

/// What a start carries beyond the job's record, read where it is
/// sent: the operator's rules (run-as users, images), tenants' names and
/// registry logins, and the nodes (addresses, exposure, taken ports).
pub(super) struct Launch<'a> {
    pub config: &'a EngineConfig,
    pub tenants: &'a Tenants,
    pub fleet: &'a Fleet,
}

impl Launch<'_> {
    /// What each node of `job`'s attempt, placed as its record says (a
    /// staged start's, placed as it will be), is told to start: the
    /// command, the tenant (its Unix user where the operator mapped it),
    /// and the environment with the checkpoint interval and, for a gang,
    /// its rank's rendezvous.
    pub fn starts(&self, job: &JobRecord) -> Vec<(String, StartAttempt)> {
        let id = job.id;
        let tenant = self.tenants.names.get(&job.tenant).cloned().unwrap_or_default();
        let run_as = self.config.run_as.user(&tenant).map(str::to_string);
        let interval = job.interval.as_ref().map(|(s, _)| s.to_string()).unwrap_or_default();
        let nodes = job.placement.len();
        let slurm = job.spec.slurm.as_ref().map(|_| slurm_env(job));
        // A Slurm job's steps meet at its first node's batch step (the
        // rendezvous port), with its attempt's key.
        let step_key = job.step_key.clone().unwrap_or_default();
        let run = job.run_id();
        let start = |rank: usize, node: &str, gpus: &Vec<u8>| {
            let mut env = (*job.spec.env).clone();
            if let Some(task) = &job.array {
                env.extend(super::jobs::task_env(task));
            }
            if let Some(slurm) = &slurm {
                env.extend(slurm.iter().cloned());
                env.insert("SLURM_NODEID".into(), rank.to_string());
            }
            env.insert("EBB_CHECKPOINT_INTERVAL_S".into(), interval.clone());
            env.extend(run_env(&run, &job.spec.env));
            match (&job.rendezvous, &slurm) {
                (Some((addr, port)), None) if job.spec.max_gpus.is_some() => {
                    env.extend(elastic_env(
                        addr,
                        *port,
                        &run,
                        gpus.len(),
                        (job.gpus, job.spec.max_gpus),
                        (rank, nodes),
                    ));
                    // Where the other nodes reach this one's workers when
                    // its node leads a round: the address it registered
                    // with, not its host name (which may not resolve).
                    if let Some(own) = self.fleet.nodes.get(node).and_then(|n| n.address.clone()) {
                        env.insert("PET_LOCAL_ADDR".into(), own);
                    }
                    // Which node is the first (a launcher's head: Ray's
                    // `ray start --head`); ranks are the launcher's own.
                    if let Some(first) = job.placement.first() {
                        env.insert("EBB_FIRST_NODE".into(), first.node.clone());
                    }
                }
                (Some((addr, port)), None) => {
                    env.extend(gang_env(addr, *port, rank, nodes, gpus.len(), job.gpus))
                }
                (Some((addr, port)), Some(_)) => {
                    let own = self.fleet.nodes.get(node).and_then(|n| n.address.clone());
                    env.insert("EBB_SLURM_HUB".into(), format!("{addr}:{port}"));
                    env.insert("EBB_SLURM_KEY".into(), step_key.clone());
                    env.insert("EBB_SLURM_ADDRESS".into(), own.unwrap_or_else(|| node.to_string()));
                }
                (None, _) => {}
            }
            StartAttempt {
                attempt: AttemptRef { job: id, attempt: job.attempt },
                tier: job.tier.as_str().into(),
                argv: (*job.spec.argv).clone(),
                env,
                workdir: job.spec.workdir.clone(),
                gpus: gpus.clone(),
                signal: job.signal,
                run_as: run_as.clone(),
                tenant: tenant.clone(),
                tenant_id: job.tenant.0,
                // The first node's agent checks the port is free.
                rendezvous_port: job.rendezvous.as_ref().filter(|_| rank == 0).map(|(_, port)| *port),
                image: job.spec.image.as_ref().map(|image| {
                    // Over plain HTTP off loopback, a password would cross
                    // the network in the clear: the agent pulls without it.
                    let login = ebb_image::parse(&image.reference)
                        .ok()
                        .filter(|_| self.config.logins_to_nodes)
                        .and_then(|r| self.tenants.logins.get(&job.tenant)?.get(r.registry()).cloned());
                    ebb_api::StartImage {
                        reference: image.reference.clone(),
                        digest: image.digest.clone(),
                        username: login.as_ref().map(|l| l.username.clone()),
                        password: login.map(|l| l.password),
                        root: self.config.images.root.contains(&tenant),
                    }
                }),
                time_limit_ms: job.spec.time_limit_ms,
                slurm: job.spec.slurm.as_ref().map(|s| s.to_api(true)),
                when_gpus_free: false,
            }
        };
        job.placement
            .iter()
            .enumerate()
            .map(|(rank, p)| (p.node.clone(), start(rank, &p.node, &p.gpus)))
            .collect()
    }

    /// What `srun --jobid` from outside needs of running Slurm job `job`:
    /// where its steps meet (`hub`), their key, and the variables its
    /// processes have in common.
    pub fn step_access(&self, job: &JobRecord, hub: String, key: String) -> ebb_api::StepAccess {
        let mut env: BTreeMap<String, String> = slurm_env(job).into_iter().collect();
        env.insert("EBB_SLURM_HUB".into(), hub.clone());
        env.insert("EBB_SLURM_KEY".into(), key.clone());
        ebb_api::StepAccess { hub, key, env }
    }

    /// Young/Daly for `job` about to run on `placement`: δ from its own
    /// checkpoints, M from the interruptions seen on nodes of that model.
    pub fn recommend(
        &self,
        job: &JobRecord,
        placement: &[Part],
        now: u64,
    ) -> ebb_core::checkpoint::Recommendation {
        let model = placement.first().and_then(|p| self.fleet.nodes.get(&p.node)).map(|n| &n.gpu_model);
        let sums = model.and_then(|m| self.fleet.exposure.get(m)).copied().unwrap_or_default();
        // The nodes' time since they joined: n x now less the sum of their
        // joining times (none joined after now: times are the server's).
        let node_time = (u128::from(now) * u128::from(sums.nodes)).saturating_sub(sums.joined_ms);
        let exposure = ebb_core::checkpoint::Exposure {
            node_time: Span(u64::try_from(node_time).unwrap_or(u64::MAX)),
            interruptions: sums.interruptions,
        };
        let delta = job.checkpoints.checkpoint_time();
        ebb_core::checkpoint::recommend(delta, exposure, placement.len() as u32)
    }

    /// Where a gang led by `leader` meets: the leader's address and the
    /// lowest port from `from` that no live gang there uses and no agent
    /// there found taken by another program.
    pub fn rendezvous(&self, jobs: &JobTable, leader: &str, from: u16) -> (String, u16) {
        let addr = self
            .fleet
            .nodes
            .get(leader)
            .and_then(|n| n.address.clone())
            .unwrap_or_else(|| leader.to_string());
        let taken: BTreeSet<u16> = jobs
            .values()
            .filter(|j| j.state.is_live())
            .filter_map(|j| j.rendezvous.as_ref())
            .filter(|(a, _)| *a == addr)
            .map(|(_, port)| *port)
            .collect();
        let busy = self.fleet.busy_ports.get(&addr);
        let port = (from..u16::MAX)
            .find(|p| !taken.contains(p) && !busy.is_some_and(|b| b.contains(p)))
            .unwrap_or(from);
        (addr, port)
    }
}

/// The one run every attempt of job `id` is part of, for the trackers
/// that would otherwise start a new run at each resumption: `ebb-`, the
/// job, its submission instant in base 36 (so that two clusters' job 7,
/// or one cluster's after its database was made anew, are different
/// runs), and 64 random bits drawn at submit (`nonce`), so that a run id
/// cannot be guessed from what another tenant can see; a job of an
/// earlier release (`nonce` 0) keeps the id its runs have. Letters,
/// digits and dashes only, at most 52 characters: a valid run id for
/// Weights & Biases, whose ids may not hold `/ \ # ? % :`.
pub(crate) fn run_id(id: JobId, submitted_ms: u64, nonce: u64) -> String {
    match nonce {
        0 => format!("ebb-{id}-{}", base36(submitted_ms)),
        _ => format!("ebb-{id}-{}-{}", base36(submitted_ms), base36(nonce)),
    }
}

fn base36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ascii")
}

/// `EBB_RUN_ID`, and the variables that make Weights & Biases resume that
/// run rather than start another (`wandb.init()` reads them), unless the
/// submission set its own run id: then Ebb says nothing of resuming
/// either, so that a run id the submission chose (another's, perhaps)
/// is resumed only if the submission itself asks.
fn run_env(run: &str, submitted: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env = vec![("EBB_RUN_ID".to_string(), run.to_string())];
    if !submitted.contains_key("WANDB_RUN_ID") {
        env.push(("WANDB_RUN_ID".to_string(), run.to_string()));
        if !submitted.contains_key("WANDB_RESUME") {
            env.push(("WANDB_RESUME".to_string(), "allow".to_string()));
        }
    }
    env
}

/// What `torchrun` and `torch.distributed` expect on each node of a gang,
/// including the `PET_*` defaults so that a bare `torchrun train.py` joins
/// the right rendezvous with one worker per GPU.
pub(super) fn gang_env(
    addr: &str,
    port: u16,
    rank: usize,
    nodes: usize,
    local_gpus: usize,
    total_gpus: u32,
) -> Vec<(String, String)> {
    let pairs = [
        ("MASTER_ADDR", addr.to_string()),
        ("MASTER_PORT", port.to_string()),
        ("WORLD_SIZE", total_gpus.to_string()),
        ("NODE_RANK", rank.to_string()),
        ("GROUP_RANK", rank.to_string()),
        ("NNODES", nodes.to_string()),
        ("LOCAL_WORLD_SIZE", local_gpus.to_string()),
        ("PET_NNODES", nodes.to_string()),
        ("PET_NODE_RANK", rank.to_string()),
        ("PET_NPROC_PER_NODE", local_gpus.to_string()),
        ("PET_MASTER_ADDR", addr.to_string()),
        ("PET_MASTER_PORT", port.to_string()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// What an elastic job's nodes are told: its range and its nodes now
/// (`EBB_GPUS_MIN`, `EBB_GPUS_MAX`, `EBB_NODES`), and what a bare
/// `torchrun train.py` needs to join its elastic rendezvous on the first
/// node: `--nnodes MIN:MAX` in nodes, the c10d backend, the endpoint and
/// the run's id, restarts enough for every change of nodes, and the
/// rendezvous store not shared with the workers (with it shared, a node
/// that joins later waits for keys the first round set). The store lives
/// on the first node, which never leaves alone (`is_host`: torchrun would
/// otherwise host it on whichever node came first where every node's
/// address is the same); a round closes 5 s after its fewest nodes have
/// joined (torchrun's 30 s would be added to every change of nodes).
pub(super) fn elastic_env(
    addr: &str,
    port: u16,
    run: &str,
    local_gpus: usize,
    (fewest, most): (u32, Option<u32>),
    (rank, nodes): (usize, usize),
) -> Vec<(String, String)> {
    let per_node = (local_gpus as u32).max(1);
    let most = most.unwrap_or(fewest);
    let pairs = [
        ("EBB_GPUS_MIN", fewest.to_string()),
        ("EBB_GPUS_MAX", most.to_string()),
        ("EBB_NODES", nodes.to_string()),
        ("MASTER_ADDR", addr.to_string()),
        ("MASTER_PORT", port.to_string()),
        ("LOCAL_WORLD_SIZE", local_gpus.to_string()),
        ("PET_NNODES", format!("{}:{}", fewest / per_node, most / per_node)),
        ("PET_NPROC_PER_NODE", local_gpus.to_string()),
        ("PET_RDZV_BACKEND", "c10d".to_string()),
        ("PET_RDZV_ENDPOINT", format!("{addr}:{port}")),
        ("PET_RDZV_ID", run.to_string()),
        ("PET_RDZV_CONF", format!("is_host={},last_call_timeout=5", rank == 0)),
        ("PET_MAX_RESTARTS", "1000".to_string()),
        ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1".to_string()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// What Slurm sets for every process of a batch job, the same on each of
/// its nodes and across its attempts (but `SLURM_RESTART_COUNT`): its
/// ids, name, nodes in Slurm's host-list form, and tasks. `srun` adds each
/// task's own (`SLURM_PROCID`, `SLURM_LOCALID`, ...).
fn slurm_env(job: &JobRecord) -> Vec<(String, String)> {
    let slurm = job.spec.slurm.as_deref().expect("a Slurm job");
    let all: Vec<&str> = job.placement.iter().map(|p| p.node.as_str()).collect();
    // A heterogeneous job's plain variables are its first component's, as
    // Slurm's are; each component's carry `_HET_GROUP_<k>`.
    let groups = het_groups(&slurm.components, &all);
    let (nodes, tasks, cpus) = match groups.first() {
        Some(first) => (first.nodes.as_slice(), first.tasks, first.cpus_per_task),
        None => (all.as_slice(), (slurm.ntasks, slurm.ntasks_per_node), slurm.cpus_per_task),
    };
    let gpus_on_node = job.placement.first().map_or(0, |p| p.gpus.len());
    let mut env = vec![
        ("SLURM_JOB_ID", job.id.to_string()),
        ("SLURM_JOBID", job.id.to_string()),
        ("SLURM_JOB_NAME", job.spec.name.clone().unwrap_or_default()),
        ("SLURM_JOB_GPUS", (0..gpus_on_node).map(|g| g.to_string()).collect::<Vec<_>>().join(",")),
        ("SLURM_GPUS_ON_NODE", gpus_on_node.to_string()),
        ("SLURM_RESTART_COUNT", job.attempt.0.saturating_sub(1).to_string()),
        ("SLURM_CLUSTER_NAME", "ebb".to_string()),
        ("SLURM_JOB_PARTITION", slurm.partition.clone().unwrap_or_default()),
    ];
    env.extend(allocation_vars(nodes, tasks, cpus));
    if let Some(dir) = &slurm.submit_dir {
        env.push(("SLURM_SUBMIT_DIR", dir.clone()));
    }
    if !groups.is_empty() {
        env.push(("SLURM_HET_SIZE", groups.len().to_string()));
        env.push(("EBB_SLURM_ALL_NODES", ebb_core::hostlist::compress(&all)));
    }
    let mut het: Vec<(String, String)> = Vec::new();
    for (k, group) in groups.iter().enumerate() {
        let vars = std::iter::once(("SLURM_JOB_ID", job.id.to_string())).chain(allocation_vars(
            &group.nodes,
            group.tasks,
            group.cpus_per_task,
        ));
        het.extend(vars.map(|(key, value)| (format!("{key}_HET_GROUP_{k}"), value)));
    }
    if let Some(task) = &job.array {
        // An array's tasks have consecutive ids in index order.
        let min = task.index.saturating_sub(job.id.0.saturating_sub(task.id.0));
        env.push(("SLURM_ARRAY_JOB_ID", task.id.to_string()));
        env.push(("SLURM_ARRAY_TASK_ID", task.index.to_string()));
        env.push(("SLURM_ARRAY_TASK_COUNT", task.tasks.to_string()));
        env.push(("SLURM_ARRAY_TASK_MIN", min.to_string()));
        env.push(("SLURM_ARRAY_TASK_MAX", min.saturating_add(task.tasks.saturating_sub(1)).to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).chain(het).collect()
}

/// An allocation's nodes and tasks as Slurm names them: the job's, or a
/// heterogeneous job's component's (suffixed `_HET_GROUP_<k>` there).
fn allocation_vars(
    nodes: &[&str],
    tasks: (Option<u32>, Option<u32>),
    cpus_per_task: Option<u32>,
) -> Vec<(&'static str, String)> {
    let list = ebb_core::hostlist::compress(nodes);
    let count = nodes.len().max(1) as u32;
    let (per_node, ntasks) = task_counts(tasks, count);
    let mut vars = vec![
        ("SLURM_JOB_NODELIST", list.clone()),
        ("SLURM_NODELIST", list),
        ("SLURM_NNODES", count.to_string()),
        ("SLURM_JOB_NUM_NODES", count.to_string()),
        ("SLURM_NTASKS", ntasks.to_string()),
        ("SLURM_NPROCS", ntasks.to_string()),
        ("SLURM_NTASKS_PER_NODE", per_node.to_string()),
        ("SLURM_TASKS_PER_NODE", format!("{per_node}(x{count})")),
    ];
    if let Some(cpus) = cpus_per_task {
        vars.push(("SLURM_CPUS_PER_TASK", cpus.to_string()));
    }
    vars
}

/// One component of a heterogeneous job as placed: its nodes (the gang's
/// in turn), its task counts (`--ntasks`, `--ntasks-per-node`) and CPUs
/// a task.
struct HetGroup<'a> {
    nodes: Vec<&'a str>,
    tasks: (Option<u32>, Option<u32>),
    cpus_per_task: Option<u32>,
}

fn het_groups<'a>(components: &[ebb_api::SlurmComponent], nodes: &[&'a str]) -> Vec<HetGroup<'a>> {
    let mut next = 0usize;
    components
        .iter()
        .map(|part| {
            let end = next.saturating_add(part.nodes as usize).min(nodes.len());
            let group = HetGroup {
                nodes: nodes[next.min(end)..end].to_vec(),
                tasks: (part.ntasks, part.ntasks_per_node),
                cpus_per_task: part.cpus_per_task,
            };
            next = end;
            group
        })
        .collect()
}

/// Tasks a node and in all, from `--ntasks` and `--ntasks-per-node` on
/// `count` nodes: one a node when neither is given.
fn task_counts((ntasks, per_node): (Option<u32>, Option<u32>), count: u32) -> (u32, u32) {
    let per_node = per_node.unwrap_or_else(|| ntasks.map_or(1, |n| n.div_ceil(count)));
    (per_node, ntasks.unwrap_or(per_node.saturating_mul(count)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A heterogeneous job's components take the gang's nodes in turn,
    /// each with its own tasks.
    #[test]
    fn components_take_the_nodes_in_turn() {
        let part =
            |nodes, ntasks| ebb_api::SlurmComponent { nodes, gpus_per_node: 8, ntasks, ..Default::default() };
        let nodes = ["a", "b", "c"];
        let groups = het_groups(&[part(1, Some(1)), part(2, None)], &nodes);
        assert_eq!((groups[0].nodes.clone(), groups[1].nodes.clone()), (vec!["a"], vec!["b", "c"]));
        assert_eq!(task_counts(groups[0].tasks, 1), (1, 1));
        assert_eq!(task_counts(groups[1].tasks, 2), (1, 2), "a task a node by default");
        assert_eq!(task_counts((Some(5), None), 2), (3, 5));
        assert_eq!(task_counts((None, Some(8)), 2), (8, 16));
        // Fewer nodes than the components ask (never placed so): no panic.
        assert!(het_groups(&[part(2, None), part(2, None)], &nodes)[1].nodes == ["c"]);
    }

    #[test]
    fn a_run_id_names_the_job_and_its_submission() {
        assert_eq!(run_id(JobId(7), 0, 0), "ebb-7-0", "a job of an earlier release keeps its run");
        assert_eq!(run_id(JobId(7), 35, 0), "ebb-7-z");
        assert_eq!(run_id(JobId(42), 1_796_360_904_317, 36), "ebb-42-mx8iwgot-10");
        assert_eq!(
            run_id(JobId(u64::MAX), u64::MAX, u64::MAX),
            "ebb-18446744073709551615-3w5e11264sgsf-3w5e11264sgsf"
        );
    }

    #[test]
    fn the_submission_keeps_its_own_tracker_variables() {
        let none = BTreeMap::new();
        let env: BTreeMap<String, String> = run_env("ebb-7-z", &none).into_iter().collect();
        assert_eq!(env["EBB_RUN_ID"], "ebb-7-z");
        assert_eq!(env["WANDB_RUN_ID"], "ebb-7-z");
        assert_eq!(env["WANDB_RESUME"], "allow");
        let own = BTreeMap::from([("WANDB_RUN_ID".to_string(), "mine".to_string())]);
        let env: BTreeMap<String, String> = run_env("ebb-7-z", &own).into_iter().collect();
        assert_eq!(env.get("WANDB_RUN_ID"), None, "the submission's is left as it is");
        assert_eq!(env.get("WANDB_RESUME"), None, "nor is a run id it chose resumed behind its back");
        assert_eq!(env["EBB_RUN_ID"], "ebb-7-z");
        let resume = BTreeMap::from([("WANDB_RESUME".to_string(), "never".to_string())]);
        let env: BTreeMap<String, String> = run_env("ebb-7-z", &resume).into_iter().collect();
        assert_eq!((env["WANDB_RUN_ID"].as_str(), env.get("WANDB_RESUME")), ("ebb-7-z", None));
    }

    proptest! {
        /// Any job, instant and random bits: a short id of the allowed
        /// characters, and two different triples never share one.
        #[test]
        fn run_ids_are_valid_and_distinct(
            a in (any::<u64>(), any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]),
            b in (any::<u64>(), any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]),
        ) {
            let (ra, rb) = (run_id(JobId(a.0), a.1, a.2), run_id(JobId(b.0), b.1, b.2));
            prop_assert!(ra.len() <= 52, "{ra}");
            prop_assert!(ra.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'), "{ra}");
            prop_assert_eq!(ra == rb, a == b);
        }
    }
}
