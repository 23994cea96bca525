//! Recovery: the core rebuilt from the store when the server starts.

use super::ending::EndNote;
use super::*;

impl<S: Store> Engine<S> {
    /// Loads the store (creating the first tenant and tokens on first
    /// start) and rebuilds the core from it.
    pub fn open(
        mut store: S,
        config: EngineConfig,
        tokens: TokenMap,
        now: u64,
    ) -> Result<(Engine<S>, Vec<String>), OpenError> {
        config.validate()?;
        let mut snapshot = store.load::<JobRecord>()?;
        let sched = ebb_scheduler::Config {
            drain_window: config.drain_window,
            victim_policy: ebb_scheduler::VictimPolicy::LostWork,
            heartbeat_timeout: Some(config.heartbeat_timeout),
            min_runtime: config.min_runtime,
            max_starts: None,
            order: ebb_scheduler::Order::FairShare,
            fair_share_preemption: config.fair_share_preemption,
            restart_cost: ebb_scheduler::Config::default().restart_cost,
        };
        let epoch = {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes).map_err(OpenError::Entropy)?;
            u64::from_le_bytes(bytes) >> 1
        };
        let admission = Admission::new(config.limits.clone());
        let mut engine = Engine {
            store,
            config,
            sched,
            core: State::new(),
            now,
            jobs: JobTable::new(JobId(1)),
            output_pruned_ms: 0,
            admission,
            tenants: Tenants::default(),
            access: Access { tokens, node_credentials: BTreeMap::new() },
            fleet: Fleet::default(),
            money: Money::default(),
            webhooks: Default::default(),
            outbox: Outbox::default(),
            epoch,
            lines: Arc::new(Lines::new(epoch)),
            counters: Default::default(),
            pending: HashMap::new(),
            unsettled: false,
            unchecked: 0,
            why: Default::default(),
            step_images: HashMap::new(),
        };
        let mut notes = Vec::new();
        if snapshot.tenants.is_empty() {
            notes = engine.bootstrap()?;
            snapshot = engine.store.load::<JobRecord>()?;
        }
        engine
            .core
            .set_fair_share_half_life(engine.config.fair_share_half_life)
            .map_err(RestoreError::from)?;
        engine.core.set_fair_share_preemption(engine.config.fair_share_preemption.is_some());
        let clear_logins = engine.load_access(&mut snapshot)?;
        engine.load_nodes(std::mem::take(&mut snapshot.nodes), now)?;
        for price in &snapshot.prices {
            engine.money.prices.insert(price.gpu_model.clone(), price.clone());
        }
        engine.money.rate_models(&mut engine.core, &engine.config.pricing);
        tenants::apply_quotas(&mut engine.core, &engine.admission);
        let (hooks, deliveries) =
            (std::mem::take(&mut snapshot.webhooks), std::mem::take(&mut snapshot.deliveries));
        let clear_hooks = engine.webhooks.load(&engine.config.secret_key, hooks, deliveries, now)?;
        engine.load_fair_share_usage(now)?;
        engine.fleet.heard_before = std::mem::take(&mut snapshot.heard).into_iter().collect();
        // Every node's last report at once: a read at each node's first
        // report made a takeover's storm of them a round trip each.
        engine.fleet.reports = engine.store.last_reports()?.into_iter().collect();
        let unrestored = engine.load_jobs(std::mem::take(&mut snapshot.jobs))?;
        engine.count_left_parts(now);
        engine.count_finished()?;
        engine.store.begin()?;
        let to = (&mut engine.store, &engine.config.secret_key);
        webhooks::seal_clear(to, &engine.tenants, clear_hooks, clear_logins)?;
        engine.recover(snapshot, unrestored, now)?;
        engine.store.commit()?;
        engine.outbox.write_log();
        engine.outbox.discard();
        Ok((engine, notes))
    }

    /// Tenants, their limits and every token that has not been revoked;
    /// the registry logins stored in the clear (by an earlier release),
    /// to be sealed.
    fn load_access(
        &mut self,
        snapshot: &mut crate::store::Snapshot<JobRecord>,
    ) -> Result<Vec<(TenantId, String)>, crate::sealed::Unsealable> {
        for t in &snapshot.tenants {
            self.tenants.names.insert(t.id, t.name.clone());
        }
        self.admission.limits = std::mem::take(&mut snapshot.tenant_limits).into_iter().collect();
        for (&tenant, limits) in &self.admission.limits {
            if let Some(weight) = limits.weight {
                let _ = self.core.set_weight(tenant, weight);
            }
        }
        self.tenants.logins.clear();
        let mut clear = Vec::new();
        for (tenant, registry, mut login) in std::mem::take(&mut snapshot.registry_logins) {
            let row = super::tenants::login_row(tenant, &registry);
            match self.config.secret_key.open(&login.password, &row)? {
                crate::sealed::Opened::Sealed(password) => login.password = password,
                crate::sealed::Opened::Clear(password) => {
                    login.password = password;
                    clear.push((tenant, registry.clone()));
                }
            }
            self.tenants.logins.entry(tenant).or_default().insert(registry, login);
        }
        let mut map = self.access.tokens.write().expect("token map");
        for t in &snapshot.tokens {
            let tenant = t.tenant.and_then(|id| self.tenants.names.get(&id).map(|n| (id, n.clone())));
            let principal = Principal { scope: t.scope, tenant, node: t.node.clone() };
            map.insert(t.hash.clone(), TokenState::Valid(principal));
            if let (Scope::Node, Some(node)) = (t.scope, &t.node) {
                self.access.node_credentials.insert(node.clone(), t.hash.clone());
            }
        }
        Ok(clear)
    }

    /// Usage that still counts for fair share, from the usage records of
    /// the last 16 half-lives (what is older weighs under 2^-16 of what
    /// it was).
    fn load_fair_share_usage(&mut self, now: u64) -> Result<(), StoreError> {
        let since = now.saturating_sub(self.config.fair_share_half_life.0.saturating_mul(16));
        for usage in self.store.usage(None, since, u64::MAX)? {
            money::fair_share_usage(&mut self.core, &usage, now, 0);
        }
        Ok(())
    }

    /// Nodes that left elastic attempts still running: counted in fair
    /// share as they left, in no usage record yet.
    fn count_left_parts(&mut self, now: u64) {
        for job in self.jobs.values().filter(|j| j.state.is_live()) {
            let (Some(elastic), Some((model, _, _))) = (job.elastic.as_deref(), &job.billing) else {
                continue;
            };
            let Some(model) = self.core.model_by_name(model) else { continue };
            for left in &elastic.left {
                let span = (Time(left.from_ms), Time(left.to_ms));
                let _ = self.core.record_usage(job.tenant, job.tier, model, left.gpus, span, Time(now));
            }
        }
    }

    /// Every node back in the core, drained or removed as it was.
    fn load_nodes(&mut self, nodes: Vec<NodeRow>, now: u64) -> Result<(), OpenError> {
        for mut node in nodes {
            if node.joined_ms == 0 {
                node.joined_ms = now;
            }
            let spec = NodeSpec {
                name: node.name.clone(),
                gpu_model: node.gpu_model.clone(),
                gpus: node.gpus,
                labels: node.labels.clone(),
            };
            let id = self.core.add_node(spec, Time(now)).map_err(RestoreError::from)?;
            if node.out_mask() != 0 {
                // No attempt is on the node yet: nothing is requeued.
                let _ = self.core.take_gpus_out(id, node.out_mask());
            }
            if node.drained {
                let _ = self.core.drain_node(id);
            }
            if node.removed {
                let _ = self.core.lose_node(id);
            }
            self.outbox.channels.insert(node.name.clone(), Channel::new());
            self.fleet.put(node);
        }
        Ok(())
    }

    /// The finished jobs, which stay in the store, counted for `/metrics`
    /// by tier and state; and the next id, past every job's.
    fn count_finished(&mut self) -> Result<(), StoreError> {
        for count in self.store.finished_counts()? {
            let (Ok(tier), Some(state)) = (count.tier.parse::<Tier>(), JobState::parse(&count.state)) else {
                return Err(StoreError::Unreadable(format!(
                    "jobs: a finished job of tier {:?} in state {:?}, which this ebb does not know",
                    count.tier, count.state
                )));
            };
            self.jobs.tally.add(tier, state, count.jobs, count.gpus);
        }
        self.jobs.next = self.jobs.next.max(self.store.max_job_id()?.next());
        Ok(())
    }

    /// Every unfinished job's record, with its tenant's load; queued and
    /// live jobs back in the core. Returns the live attempts the core
    /// could not take back, and why.
    fn load_jobs(&mut self, jobs: Vec<JobRecord>) -> Result<Vec<(JobId, RestoreError)>, RestoreError> {
        let mut unrestored = Vec::new();
        for job in jobs {
            self.jobs.next = self.jobs.next.max(job.id.next());
            let (id, state, waiting) = (job.id, job.state, job.waiting);
            if !state.is_final() {
                let load = self.admission.load.entry(job.tenant).or_default();
                load.jobs += 1;
                load.bytes += job.spec.stored_bytes();
                match waiting {
                    Some(Waiting::TenantLimit) => {
                        load.waiting.insert(id);
                    }
                    Some(Waiting::Dependency | Waiting::ArrayLimit) => {}
                    _ => load.admitted += 1,
                }
            }
            let mut job = job;
            if let Some(notice) = job.legacy_notice.as_deref().cloned() {
                let drilled =
                    job.drill.as_ref().is_some_and(|d| d.attempt == job.attempt && d.exit.is_none());
                let names = &self.tenants.names;
                let tenant_id = |name: &str| names.iter().find(|(_, n)| *n == name).map(|(id, _)| *id);
                job.drain = Some(Box::new(DrainNotice::from_legacy(notice, drilled, tenant_id)));
            }
            if job.deadline.as_ref().is_some_and(|d| d.promoted.is_none()) && !state.is_final() {
                self.jobs.deadlines.insert(0, id); // judged at the first pass
            }
            if let Some(until_ms) = job.gang_grace_until.filter(|_| state.is_live()) {
                self.jobs.gang_graces.insert(until_ms, id);
            }
            if let Some(at_ms) = super::exits::unstarted_due(&job) {
                self.jobs.unstarted.insert(at_ms, (job.id, job.attempt));
            }
            self.jobs.tally.count(&mut job);
            self.jobs.insert(id, Box::new(job));
            match (state, waiting) {
                (JobState::Queued, Some(Waiting::Backoff { until_ms })) => {
                    self.jobs.backoff.insert(until_ms, id);
                }
                (
                    JobState::Queued,
                    Some(Waiting::TenantLimit | Waiting::Dependency | Waiting::ArrayLimit),
                ) => {}
                (JobState::Queued, None) => self.restore_queued(id)?,
                (s, _) if s.is_live() => {
                    if let Err(e) = self.restore(id) {
                        unrestored.push((id, e));
                    }
                }
                _ => {}
            }
        }
        self.rebuild_gates();
        Ok(unrestored)
    }

    /// What recovery writes, in one transaction: prices, reservations,
    /// attempts that could not be restored (ended as lost, and metered to
    /// their nodes' last contact, as any attempt lost with its node is),
    /// holds, and tenants' waiting jobs the limits now let in.
    fn recover(
        &mut self,
        snapshot: crate::store::Snapshot<JobRecord>,
        unrestored: Vec<(JobId, RestoreError)>,
        now: u64,
    ) -> Written {
        for price in snapshot.prices {
            self.money.prices.insert(price.gpu_model.clone(), price);
        }
        for (model, on_demand, reserved) in self.config.pricing.prices.clone() {
            let row =
                PriceRow { gpu_model: model.clone(), on_demand, reserved: reserved.unwrap_or(on_demand) };
            self.store.put_price(&row)?;
            self.money.prices.insert(model, row);
        }
        let models: Vec<String> = self.fleet.nodes.values().map(|n| n.gpu_model.clone()).collect();
        let p = &mut self.parts();
        for model in models {
            p.money.price_for(&model, &p.config.pricing, &mut p.fx)?;
        }
        for (model, limit) in snapshot.reclaims {
            match self.core.model_by_name(&model) {
                Some(id) => self.core.restore_reclaim(id, limit).expect("known model"),
                None => tracing::warn!(gpu_model = model, "reclaim of a model no node has: not restored"),
            }
        }
        for r in snapshot.reservations {
            // A deleted one is kept for the invoices of its past only.
            if r.deleted_ms.is_none() {
                match money::core_reservation(&self.core, &r).map(|c| self.core.add_reservation(c)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(reservation = r.id, "not restored: {e}"),
                    Err(e) => tracing::error!(reservation = r.id, "not restored: {}", e.message),
                }
            }
            self.money.reservations.insert(r.id, r);
        }
        // Drain notices in the form of releases before typed notices are
        // written in the new one (`load_jobs` read them).
        let legacy: Vec<JobId> =
            self.jobs.values().filter(|j| j.legacy_notice.is_some()).map(|j| j.id).collect();
        for id in legacy {
            self.jobs.get_mut(&id).expect("loaded").legacy_notice = None;
            self.save(id)?;
        }
        for (id, why) in unrestored {
            let job = &self.jobs[&id];
            let heard =
                job.running_on.iter().filter_map(|n| fleet::last_contact(&self.fleet, &self.core, n)).min();
            let end_ms = heard.unwrap_or(job.started_ms).min(now);
            tracing::warn!(job = id.0, "attempt not restored, requeued as lost: {why}");
            let note = EndNote { why: Some(format!("server restart: {why}")), ..Default::default() };
            self.ended(id, ExitEffect::RequeuedLost, end_ms, note)?;
            if let Err(e) = self.restore_queued(id) {
                tracing::error!(job = id.0, "not requeued: {e}");
            }
        }
        // Output of live attempts past the last commit goes, before anyone
        // reads it: only a log that is a file can hold any (the store's
        // output is written in the batch that commits it). Every other
        // log's state is read when it is first needed: one query for each
        // of 100,000 jobs made a takeover on PostgreSQL 2 s longer.
        for (id, state) in self.store.file_logs()? {
            if self.jobs.get(&id).is_some_and(|j| j.state.is_live() && !j.no_output) {
                self.cut_uncommitted(id, state.bytes)?;
                self.jobs.logs.insert(id, state);
            }
        }
        // Holds last: their victims must be back first.
        let holders: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued && !j.held.is_empty())
            .map(|j| j.id)
            .collect();
        for id in holders {
            match self.restore_hold(id) {
                Ok(()) if self.jobs[&id].staged.is_some() => {
                    self.jobs.staged.insert(id);
                }
                Ok(()) => {}
                Err(why) => {
                    tracing::warn!(job = id.0, "hold not restored: {why}");
                    let job = self.jobs.get_mut(&id).expect("loaded");
                    job.held.clear();
                    job.waiting_for.clear();
                    // A staged start it had is spent below.
                    self.save(id)?;
                }
            }
        }
        // A start sent ahead is only ever a holding job's; any other
        // record's (a hold not restored, or none) is spent: its node may
        // have started it, so the next attempt is numbered after it, and
        // the node is told to stop it when it registers.
        let strays: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.staged.is_some() && !self.jobs.staged.contains(&j.id))
            .map(|j| j.id)
            .collect();
        for id in strays {
            let job = self.jobs.get_mut(&id).expect("loaded");
            let staged = job.staged.take().expect("filtered");
            job.spent_attempt = job.spent_attempt.max(staged.attempt);
            // Numbered after it if it queues (nothing to do otherwise).
            let _ = self.core.fence_attempt(id, staged.attempt);
            self.save(id)?;
        }
        // The limits may have been raised since.
        let tenants: Vec<TenantId> = self.admission.load.keys().copied().collect();
        let Parts { jobs, core, admission, mut fx, .. } = self.parts();
        for tenant in tenants {
            admission::admit_waiting(jobs, core, admission, &mut fx, tenant)?;
        }
        Ok(())
    }

    /// First start: the default tenant, an admin token and a join token,
    /// written under the data dir (0600).
    pub(super) fn bootstrap(&mut self) -> Result<Vec<String>, OpenError> {
        self.store.begin()?;
        let tenant = TenantRow { id: TenantId(1), name: "default".into() };
        self.store.put_tenant(&tenant)?;
        let mut notes = Vec::new();
        for (file, scope) in [("admin.token", Scope::Admin), ("join.token", Scope::Agent)] {
            let token = new_token();
            let tenant = (scope == Scope::Admin).then_some(TenantId(1));
            self.store.put_token(&TokenRow { hash: hash_token(&token), tenant, scope, node: None })?;
            let path = self.config.data_dir.join(file);
            write_secret(&path, &token)
                .map_err(|source| OpenError::TokenFile { path: path.clone(), source })?;
            notes.push(path.display().to_string());
        }
        self.store.commit()?;
        Ok(notes)
    }

    /// [`restore_queued`] of job `id`.
    pub(super) fn restore_queued(&mut self, id: JobId) -> Result<(), RestoreError> {
        restore_queued(&self.jobs[&id], &mut self.core)
    }

    /// Puts a job that was running before a restart back into the core.
    pub(super) fn restore(&mut self, id: JobId) -> Result<(), RestoreError> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.placement)?;
        let notice = match &job.drain {
            Some(n) => Some(Notice {
                notice_at: Time(n.notice_at_ms),
                deadline: Time(n.deadline_ms),
                reason: self.drain_reason(&n.cause)?,
            }),
            None => None,
        };
        let (attempt, preemptions, started) = (job.attempt, job.preemptions, job.started_ms);
        let checkpoint = job.attempt_checkpoint_ms.map(Time);
        let node_id =
            |name: &str| self.core.node_by_name(name).ok_or_else(|| RestoreError::NodeGone(name.into()));
        let (mut joined, mut leaving) = (Vec::new(), Vec::new());
        if let Some(elastic) = job.elastic.as_deref() {
            for (name, at) in &elastic.joined {
                joined.push((node_id(name)?, Time(*at)));
            }
            for part in &elastic.leaving {
                let n = &part.notice;
                let notice = Notice {
                    notice_at: Time(n.notice_at_ms),
                    deadline: Time(n.deadline_ms),
                    reason: self.drain_reason(&n.cause)?,
                };
                leaving.push((node_id(&part.node)?, notice));
            }
        }
        let resized_at = job.elastic.as_deref().and_then(|e| e.resized_ms).map(Time);
        self.core.restore_run(
            self.spec_of(id),
            ebb_scheduler::RestoredRun {
                attempt,
                preemptions,
                alloc,
                started_at: Time(started),
                last_checkpoint_at: checkpoint,
                notice,
                joined,
                leaving,
                resized_at,
            },
        )?;
        Ok(restore_marks(&self.jobs[&id], &mut self.core)?)
    }

    /// The core's reason for a stored drain (its node by name).
    fn drain_reason(&self, cause: &Drained) -> Result<DrainReason, RestoreError> {
        Ok(match cause {
            Drained::Preempted { by } => DrainReason::Preempted { by: *by },
            Drained::Node { node } => DrainReason::NodeDrain {
                node: self
                    .core
                    .node_by_name(node)
                    .ok_or_else(|| RestoreError::DrainedNodeGone(node.clone()))?,
            },
            Drained::Reclaim => DrainReason::Reclaim,
            Drained::Drill => DrainReason::Drill,
            Drained::Quota { waiting } => DrainReason::Quota { tenant: *waiting },
            Drained::FairShare { waiting } => DrainReason::FairShare { tenant: *waiting },
        })
    }

    pub(super) fn restore_hold(&mut self, id: JobId) -> Result<(), RestoreError> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.held)?;
        let victims: Vec<JobId> = job.waiting_for.clone();
        let parts: Vec<(JobId, NodeId)> = job
            .waiting_parts
            .iter()
            .filter_map(|(victim, node)| Some((*victim, self.core.node_by_name(node)?)))
            .collect();
        let staged = job.staged.as_ref().map(|s| s.attempt);
        Ok(self.core.restore_hold(id, alloc, &victims, &parts, staged)?)
    }

    /// GPUs by node as the core has them (ids, bit masks) to GPUs by node
    /// as records and agents have them (names, indices), and back.
    pub(super) fn named(&self, alloc: &[(NodeId, u64)]) -> Vec<Part> {
        named(&self.core, alloc)
    }

    pub(super) fn masks(&self, named: &[Part]) -> Result<Vec<(NodeId, u64)>, RestoreError> {
        named
            .iter()
            .map(|Part { node, gpus }| {
                let id = self.core.node_by_name(node).ok_or_else(|| RestoreError::NodeGone(node.clone()))?;
                Ok((id, gpus.iter().fold(0u64, |m, g| m | (1 << g))))
            })
            .collect()
    }

    pub(super) fn spec_of(&self, id: JobId) -> JobSpec {
        self.jobs[&id].core_spec(&self.core)
    }
}

/// Why the writer could not start from its store.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A setting out of its bounds (`EngineConfig::validate`).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// What the store holds could not be made into the writer's state.
    #[error("restoring the state: {0}")]
    Restore(#[from] RestoreError),
    /// A secret stored sealed did not open (another key's, or damaged).
    #[error("restoring the state: {0}")]
    Sealed(#[from] crate::sealed::Unsealable),
    #[error("the system's random source: {0}")]
    Entropy(getrandom::Error),
    /// A first start's token file could not be written.
    #[error("{}: {source}", path.display())]
    TokenFile { path: PathBuf, source: std::io::Error },
}

/// Why a stored job or hold could not be put back into the core.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// Its GPUs are on a node the core no longer has.
    #[error("node {0} is gone")]
    NodeGone(String),
    /// Its drain was a drain of a node the core no longer has.
    #[error("drained on unknown node {0}")]
    DrainedNodeGone(String),
    /// The core refused it.
    #[error(transparent)]
    Core(#[from] ebb_scheduler::StateError),
}

/// GPUs by node as the core has them (ids, bit masks), as records and
/// agents have them (names, indices).
pub(super) fn named(core: &State, alloc: &[(NodeId, u64)]) -> Vec<Part> {
    alloc
        .iter()
        .map(|(node, mask)| {
            let name = core.node(*node).expect("known node").name.clone();
            Part::new(name, gpu_indices(*mask))
        })
        .collect()
}

/// The GPU indices a mask names, in order.
pub(super) fn gpu_indices(mask: u64) -> Vec<u8> {
    (0..64u8).filter(|g| mask & (1 << g) != 0).collect()
}

/// Puts queued `job` back into the core, with the attempts it has had and
/// what a drill or its own requeue told the core of it.
pub(super) fn restore_queued(job: &JobRecord, core: &mut State) -> Result<(), RestoreError> {
    // A number spent on a start sent ahead is not used again.
    let attempt = job.attempt.max(job.spent_attempt);
    core.restore_queued(job.core_spec(core), attempt, job.preemptions)?;
    Ok(restore_marks(job, core)?)
}

/// Tells the core what `job`'s record says of its requeues since it was
/// last preempted: it requeued itself, or a drill requeued it.
fn restore_marks(job: &JobRecord, core: &mut State) -> Result<(), ebb_scheduler::StateError> {
    if job.requeued_itself {
        core.restore_requeued_itself(job.id)?;
    }
    if job.drilled_since_preempted {
        core.restore_drilled(job.id)?;
    }
    Ok(())
}
