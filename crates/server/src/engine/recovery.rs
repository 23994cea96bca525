//! Recovery: the core rebuilt from the store when the server starts.

use super::*;

impl<S: Store> Engine<S> {
    /// Loads the store (creating the first tenant and tokens on first
    /// start) and rebuilds the core from it.
    pub fn open(
        mut store: S,
        config: EngineConfig,
        tokens: TokenMap,
        now: u64,
    ) -> Result<(Engine<S>, Vec<String>), ApiError> {
        let mut snapshot = store.load::<JobRecord>().map_err(storage_error)?;
        let sched = ebb_scheduler::Config {
            drain_window: config.drain_window,
            victim_policy: ebb_scheduler::VictimPolicy::LostWork,
            heartbeat_timeout: Some(config.heartbeat_timeout),
        };
        let mut engine = Engine {
            store,
            config,
            sched,
            core: State::new(),
            jobs: BTreeMap::new(),
            tenants: BTreeMap::new(),
            tokens,
            node_credentials: BTreeMap::new(),
            nodes: BTreeMap::new(),
            channels: HashMap::new(),
            next_job: 1,
            epoch: {
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(e.to_string()))?;
                u64::from_le_bytes(bytes) >> 1
            },
            counters: Default::default(),
            after_commit: Vec::new(),
            woken: BTreeSet::new(),
            arrays: BTreeMap::new(),
            prices: BTreeMap::new(),
            reservations: BTreeMap::new(),
            heard_before: HashMap::new(),
            heard_since_start: BTreeSet::new(),
            load: BTreeMap::new(),
            tenant_limits: BTreeMap::new(),
            backoff: BTreeSet::new(),
            unhealthy: HashMap::new(),
        };
        let mut notes = Vec::new();
        if snapshot.tenants.is_empty() {
            notes = engine.bootstrap()?;
            snapshot = engine.store.load::<JobRecord>().map_err(storage_error)?;
        }
        for t in &snapshot.tenants {
            engine.tenants.insert(t.id, t.name.clone());
        }
        engine.tenant_limits = std::mem::take(&mut snapshot.tenant_limits).into_iter().collect();
        {
            let mut map = engine.tokens.write().expect("token map");
            for t in &snapshot.tokens {
                let tenant = t.tenant.and_then(|id| engine.tenants.get(&id).map(|n| (id, n.clone())));
                let principal = Principal { scope: t.scope, tenant, node: t.node.clone() };
                map.insert(t.hash.clone(), TokenState::Valid(principal));
                if let (Scope::Node, Some(node)) = (t.scope, &t.node) {
                    engine.node_credentials.insert(node.clone(), t.hash.clone());
                }
            }
        }
        for mut node in snapshot.nodes {
            if node.joined_ms == 0 {
                node.joined_ms = now;
            }
            let spec = NodeSpec {
                name: node.name.clone(),
                gpu_model: node.gpu_model.clone(),
                gpus: node.gpus,
                labels: node.labels.clone(),
            };
            let id = engine.core.add_node(spec, Time(now)).map_err(|e| ApiError::internal(e.to_string()))?;
            if node.drained {
                let _ = engine.core.drain_node(id);
            }
            if node.removed {
                let _ = engine.core.lose_node(id);
            }
            engine.channels.insert(node.name.clone(), Channel::new());
            engine.nodes.insert(node.name.clone(), node);
        }
        let mut requeued = Vec::new();
        for job in snapshot.jobs {
            engine.next_job = engine.next_job.max(job.id + 1);
            let id = job.id;
            let state = job.state;
            if let Some(array) = &job.array {
                engine.arrays.entry(array.id).or_default().push(id);
            }
            let waiting = job.waiting;
            if !state.is_final() {
                let load = engine.load.entry(job.tenant).or_default();
                load.jobs += 1;
                load.bytes += crate::validate::command_bytes(&job.spec);
                match waiting {
                    Some(Waiting::TenantLimit) => {
                        load.waiting.insert(id);
                    }
                    _ => load.admitted += 1,
                }
            }
            engine.jobs.insert(id, job);
            match (state, waiting) {
                (JobState::Queued, Some(Waiting::Backoff { until_ms })) => {
                    engine.backoff.insert((until_ms, id));
                }
                (JobState::Queued, Some(Waiting::TenantLimit)) => {}
                (JobState::Queued, None) => engine.restore_queued(id)?,
                (s, _) if s.is_live() => {
                    if let Err(e) = engine.restore(id) {
                        requeued.push((id, e));
                    }
                }
                _ => {}
            }
        }
        engine.store.begin().map_err(storage_error)?;
        engine.heard_before = snapshot.heard.into_iter().collect();
        for price in snapshot.prices {
            engine.prices.insert(price.gpu_model.clone(), price);
        }
        for (model, on_demand, reserved) in engine.config.pricing.prices.clone() {
            let row =
                PriceRow { gpu_model: model.clone(), on_demand, reserved: reserved.unwrap_or(on_demand) };
            engine.store.put_price(&row).map_err(storage_error)?;
            engine.prices.insert(model, row);
        }
        let models: Vec<String> = engine.nodes.values().map(|n| n.gpu_model.clone()).collect();
        for model in models {
            engine.price_for(&model);
        }
        for r in snapshot.reservations {
            if let Err(e) = engine.core.add_reservation(engine.core_reservation(&r)?) {
                tracing::error!(reservation = r.id, "not restored: {e}");
            }
            engine.reservations.insert(r.id, r);
        }
        for (id, why) in requeued {
            let job = engine.jobs.get_mut(&id).expect("loaded");
            job.state = JobState::Queued;
            job.placement.clear();
            job.running_on.clear();
            job.notice = None;
            engine.restore_queued(id)?;
            engine.event(id, "requeued", json!({ "reason": format!("server restart: {why}") }));
            engine.save(id);
        }
        // Holds last: their victims must be back first.
        let holders: Vec<u64> = engine
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued && !j.held.is_empty())
            .map(|j| j.id)
            .collect();
        for id in holders {
            if let Err(why) = engine.restore_hold(id) {
                tracing::warn!(job = id, "hold not restored: {why}");
                let job = engine.jobs.get_mut(&id).expect("loaded");
                job.held.clear();
                job.waiting_for.clear();
                engine.save(id);
            }
        }
        // The limits may have been raised since.
        let tenants: Vec<u32> = engine.load.keys().copied().collect();
        for tenant in tenants {
            engine.admit_waiting(tenant);
        }
        engine.store.commit().map_err(storage_error)?;
        engine.after_commit.clear();
        Ok((engine, notes))
    }

    /// First start: the default tenant, an admin token and a join token,
    /// written under the data dir (0600).
    pub(super) fn bootstrap(&mut self) -> Result<Vec<String>, ApiError> {
        self.store.begin().map_err(storage_error)?;
        let tenant = TenantRow { id: 1, name: "default".into() };
        self.store.put_tenant(&tenant).map_err(storage_error)?;
        let mut notes = Vec::new();
        for (file, scope) in [("admin.token", Scope::Admin), ("join.token", Scope::Agent)] {
            let token = new_token();
            let tenant = (scope == Scope::Admin).then_some(1);
            self.store
                .put_token(&TokenRow { hash: hash_token(&token), tenant, scope, node: None })
                .map_err(storage_error)?;
            let path = self.config.data_dir.join(file);
            write_secret(&path, &token)
                .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
            notes.push(path.display().to_string());
        }
        self.store.commit().map_err(storage_error)?;
        Ok(notes)
    }

    /// Puts a queued job back into the core, with the attempts it has had.
    pub(super) fn restore_queued(&mut self, id: u64) -> Result<(), ApiError> {
        let (attempt, preemptions) = (self.jobs[&id].attempt, self.jobs[&id].preemptions);
        self.core
            .restore_queued(self.spec_of(id), Attempt(attempt), preemptions)
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Puts a job that was running before a restart back into the core.
    pub(super) fn restore(&mut self, id: u64) -> Result<(), String> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.placement)?;
        let notice = job.notice.as_ref().map(|(at, deadline, _)| Notice {
            notice_at: Time(*at),
            deadline: Time(*deadline),
            reason: DrainReason::Reclaim,
        });
        let (attempt, preemptions, started) = (job.attempt, job.preemptions, job.started_ms);
        let checkpoint = job.attempt_checkpoint_ms.map(Time);
        self.core
            .restore_run(
                self.spec_of(id),
                Attempt(attempt),
                preemptions,
                alloc,
                Time(started),
                checkpoint,
                notice,
            )
            .map_err(|e| e.to_string())
    }

    pub(super) fn restore_hold(&mut self, id: u64) -> Result<(), String> {
        let job = &self.jobs[&id];
        let alloc = self.masks(&job.held)?;
        let victims: Vec<JobId> = job.waiting_for.iter().map(|v| JobId(*v)).collect();
        self.core.restore_hold(JobId(id), alloc, &victims).map_err(|e| e.to_string())
    }

    /// GPUs by node as the core has them (ids, bit masks) to GPUs by node
    /// as records and agents have them (names, indices), and back.
    pub(super) fn named(&self, alloc: &[(NodeId, u64)]) -> Vec<(String, Vec<u8>)> {
        alloc
            .iter()
            .map(|(node, mask)| {
                let name = self.core.node(*node).expect("known node").name.clone();
                (name, (0..64u8).filter(|g| mask & (1 << g) != 0).collect())
            })
            .collect()
    }

    pub(super) fn masks(&self, named: &[(String, Vec<u8>)]) -> Result<Vec<(NodeId, u64)>, String> {
        named
            .iter()
            .map(|(node, gpus)| {
                let id = self.core.node_by_name(node).ok_or_else(|| format!("node {node} is gone"))?;
                Ok((id, gpus.iter().fold(0u64, |m, g| m | (1 << g))))
            })
            .collect()
    }

    pub(super) fn spec_of(&self, id: u64) -> JobSpec {
        let job = &self.jobs[&id];
        JobSpec {
            id: JobId(id),
            tenant: TenantId(job.tenant),
            tier: job.tier,
            gpus: job.gpus,
            gpu_model: job.spec.gpu_model.as_deref().and_then(|m| self.core.model_by_name(m)),
            submitted_at: Time(job.submitted_ms),
            max_preemptions: job.spec.max_preemptions,
        }
    }

    pub(super) fn core_reservation(
        &self,
        r: &ReservationRow,
    ) -> Result<ebb_scheduler::Reservation, ApiError> {
        let model = self
            .core
            .model_by_name(&r.gpu_model)
            .ok_or_else(|| ApiError::bad_request(format!("gpu_model: unknown model {:?}", r.gpu_model)))?;
        Ok(ebb_scheduler::Reservation {
            id: ebb_core::ReservationId(r.id as u32),
            tenant: TenantId(r.tenant),
            gpu_model: model,
            gpus: r.gpus,
            start: Time(r.start_ms),
            end: Time(r.end_ms),
        })
    }
}
