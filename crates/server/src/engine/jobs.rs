//! Job commands: submission (arrays and sweeps expanded), cancel, tenants' limits and admission.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn visible(&self, principal: &Principal, id: u64) -> Result<(), ApiError> {
        match self.jobs.get(&id) {
            Some(job) if principal.may_see(job.tenant) => Ok(()),
            // Another tenant's job is as good as absent: 404, never 403.
            _ => Err(ApiError::not_found(format!("job {id}: not found"))),
        }
    }

    pub(super) fn submit(
        &mut self,
        principal: &Principal,
        spec: JobSubmission,
        now: u64,
    ) -> Result<Vec<u64>, ApiError> {
        let (tenant, _) =
            principal.tenant.clone().ok_or_else(|| ApiError::forbidden("this token cannot submit jobs"))?;
        let mut spec = spec;
        let limits = self.limits_of(tenant);
        let checked = crate::validate::submission(&spec, &self.core, &limits)?;
        if checked.tier == Tier::Reserved {
            let wanted = spec.gpu_model.as_deref();
            let models: BTreeSet<&str> = self
                .reservations
                .values()
                .filter(|r| r.tenant == tenant && r.end_ms > now && wanted.is_none_or(|m| m == r.gpu_model))
                .map(|r| r.gpu_model.as_str())
                .collect();
            let model = match models.len() {
                0 => {
                    return Err(ApiError::unprocessable(format!(
                    "tier: reserved jobs draw on a reservation, and tenant {} has none{} that has not ended",
                    self.tenant_name(tenant),
                    wanted.map(|m| format!(" of {m}")).unwrap_or_default()
                )))
                }
                1 => models.first().expect("one").to_string(),
                _ => {
                    return Err(ApiError::unprocessable(format!(
                        "gpu_model: tenant {} has reservations of {}; say which",
                        self.tenant_name(tenant),
                        models.into_iter().collect::<Vec<_>>().join(", ")
                    )))
                }
            };
            // A reserved job runs on its reservation's model.
            spec.gpu_model = Some(model);
        }
        let array_id = self.next_job;
        let count = checked.tasks.len() as u64;
        let jobs = count.max(1);
        let bytes = crate::validate::command_bytes(&spec).saturating_mul(jobs);
        let load = self.load.get(&tenant).cloned().unwrap_or_default();
        if load.jobs.saturating_add(jobs) > limits.max_jobs {
            return Err(ApiError::too_many(format!(
                "tenant {}: {} unfinished jobs, and this submission adds {jobs}: over the limit of {} \
                 (ebb server --max-jobs-per-tenant)",
                self.tenant_name(tenant),
                load.jobs,
                limits.max_jobs
            )));
        }
        if load.bytes.saturating_add(bytes) > limits.max_stored_bytes {
            return Err(ApiError::too_many(format!(
                "tenant {}: unfinished jobs' arguments and environments take {} bytes, and this submission \
                 adds {bytes}: over the limit of {} (ebb server --max-stored-bytes-per-tenant)",
                self.tenant_name(tenant),
                load.bytes,
                limits.max_stored_bytes
            )));
        }
        let tasks: Vec<Option<crate::validate::Task>> = match checked.tasks.is_empty() {
            true => vec![None],
            false => checked.tasks.into_iter().map(Some).collect(),
        };
        let mut ids = Vec::with_capacity(tasks.len());
        for task in tasks {
            let mut spec = spec.clone();
            let mut array = None;
            if let Some(task) = &task {
                // Set by ebb, so not subject to the user-variable rules.
                let index = task.index;
                spec.env.insert("EBB_TASK_INDEX".into(), index.to_string());
                spec.env.insert("EBB_TASK_COUNT".into(), count.to_string());
                spec.env.insert("EBB_ARRAY_ID".into(), array_id.to_string());
                let base = spec
                    .name
                    .clone()
                    .unwrap_or_else(|| if task.params.is_empty() { "array" } else { "sweep" }.into());
                if task.params.is_empty() {
                    spec.name = Some(format!("{base}[{index}]"));
                } else {
                    for (name, value) in &task.params {
                        spec.env.insert(format!("EBB_PARAM_{}", name.to_ascii_uppercase()), value.clone());
                    }
                    let params: serde_json::Map<String, serde_json::Value> =
                        task.params.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                    spec.env.insert("EBB_PARAMS".into(), serde_json::Value::Object(params).to_string());
                    let shown: Vec<String> = task.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    spec.name = Some(format!("{base}[{}]", shown.join(",")));
                }
                array = Some(ebb_api::ArrayTask {
                    id: array_id,
                    index,
                    tasks: count,
                    params: task.params.iter().cloned().collect(),
                });
            }
            let id = self.next_job;
            self.next_job += 1;
            let record = JobRecord {
                id,
                tenant,
                tier: checked.tier,
                gpus: checked.gpus,
                signal: checked.signal,
                spec,
                state: JobState::Queued,
                attempt: 0,
                preemptions: 0,
                retries: 0,
                submitted_ms: now,
                placement: Vec::new(),
                started_ms: 0,
                running_on: Vec::new(),
                notice: None,
                exit_code: None,
                exit_signal: None,
                cancel_requested: false,
                vanished: false,
                held: Vec::new(),
                waiting_for: Vec::new(),
                array,
                checkpoints: CheckpointStats::default(),
                run_started_ms: None,
                started_on: Vec::new(),
                attempt_checkpoint_ms: None,
                exited_ms: 0,
                lost_gpu_ms: 0,
                interval: None,
                rendezvous: None,
                billing: None,
                waiting: None,
                quick_exits: 0,
            };
            let stored = crate::validate::command_bytes(&record.spec);
            self.jobs.insert(id, record);
            let admitted = self.load.get(&tenant).map_or(0, |l| l.admitted);
            if admitted < limits.max_running_jobs {
                if let Err(e) = self.core.submit(self.spec_of(id)) {
                    self.jobs.remove(&id);
                    return Err(ApiError::unprocessable(e.to_string()));
                }
                self.load.entry(tenant).or_default().admitted += 1;
            } else {
                self.load.entry(tenant).or_default().waiting.insert(id);
                self.jobs.get_mut(&id).expect("just inserted").waiting = Some(Waiting::TenantLimit);
            }
            let load = self.load.entry(tenant).or_default();
            load.jobs += 1;
            load.bytes += stored;
            if task.is_some() {
                self.arrays.entry(array_id).or_default().push(id);
            }
            self.save(id);
            let index = task.map(|t| t.index);
            let detail = json!({ "tier": checked.tier.as_str(), "gpus": checked.gpus, "task": index });
            self.event(id, "submitted", detail);
            self.counters.submitted += 1;
            ids.push(id);
        }
        Ok(ids)
    }

    pub(super) fn cancel(&mut self, id: u64, now: u64) -> Result<ebb_api::Job, ApiError> {
        let state = self.jobs[&id].state;
        match state {
            s if s.is_final() => {}
            JobState::Queued => {
                match self.jobs[&id].waiting {
                    Some(Waiting::Backoff { until_ms }) => {
                        self.backoff.remove(&(until_ms, id));
                    }
                    Some(Waiting::TenantLimit) => {}
                    None => self.core.cancel(JobId(id)).map_err(|e| ApiError::internal(e.to_string()))?,
                }
                let job = self.jobs.get_mut(&id).expect("visible");
                job.state = JobState::Cancelled;
                self.finished(id);
                self.event(id, "cancelled", json!({ "while": "queued" }));
                self.save(id);
            }
            _ => {
                let job = self.jobs.get_mut(&id).expect("visible");
                if !job.cancel_requested {
                    job.cancel_requested = true;
                    let attempt = AttemptRef { job: id, attempt: job.attempt };
                    for node in job.running_on.clone() {
                        self.push(&node, Action::Stop { attempt, grace_ms: 10_000 });
                    }
                    self.event(id, "cancel_requested", json!({ "at": rfc3339(now) }));
                    self.save(id);
                }
            }
        }
        Ok(self.view(&self.jobs[&id], Vec::new()))
    }

    /// Job `id` reached a final state: its tenant's load shrinks, and the
    /// tenant's next waiting job may be admitted.
    pub(super) fn finished(&mut self, id: u64) {
        let job = self.jobs.get_mut(&id).expect("known job");
        let was_waiting = job.waiting == Some(Waiting::TenantLimit);
        job.waiting = None;
        let (tenant, bytes) = (job.tenant, crate::validate::command_bytes(&job.spec));
        let load = self.load.entry(tenant).or_default();
        load.jobs = load.jobs.saturating_sub(1);
        load.bytes = load.bytes.saturating_sub(bytes);
        if was_waiting {
            load.waiting.remove(&id);
        } else {
            load.admitted = load.admitted.saturating_sub(1);
        }
        self.admit_waiting(tenant);
    }

    /// Admits the tenant's waiting jobs, oldest first, while it is under
    /// its limit of running jobs.
    pub(super) fn admit_waiting(&mut self, tenant: u32) {
        let max = self.limits_of(tenant).max_running_jobs;
        loop {
            let Some(load) = self.load.get_mut(&tenant) else { return };
            if load.admitted >= max {
                return;
            }
            let Some(id) = load.waiting.pop_first() else { return };
            load.admitted += 1;
            self.jobs.get_mut(&id).expect("waiting job").waiting = None;
            if let Err(e) = self.restore_queued(id) {
                tracing::error!(job = id, "not admitted: {}", e.message);
                continue;
            }
            self.event(id, "admitted", json!({ "reason": "its tenant is under its limit of running jobs" }));
            self.save(id);
        }
    }

    /// The server's limits with the tenant's own in place of the defaults.
    pub(super) fn limits_of(&self, tenant: u32) -> crate::validate::Limits {
        let mut limits = self.config.limits.clone();
        if let Some(own) = self.tenant_limits.get(&tenant) {
            limits.max_jobs = own.max_jobs.unwrap_or(limits.max_jobs);
            limits.max_running_jobs = own.max_running_jobs.unwrap_or(limits.max_running_jobs);
            limits.max_stored_bytes = own.max_stored_bytes.unwrap_or(limits.max_stored_bytes);
        }
        limits
    }

    /// A tenant's limits and usage (the tenant itself or an admin); with
    /// `set` (admin), its own limits first. Raising the running limit
    /// admits waiting jobs at once; lowering any refuses nothing already
    /// accepted.
    pub(super) fn tenant_limits(
        &mut self,
        principal: &Principal,
        name: &str,
        set: Option<ebb_api::TenantLimits>,
    ) -> Result<ebb_api::TenantUsage, ApiError> {
        let tenant = self
            .tenant_by_name(name)
            .map_err(|_| ApiError::not_found(format!("tenant {name}: not found")))?;
        if !principal.may_see(tenant) {
            return Err(ApiError::not_found(format!("tenant {name}: not found")));
        }
        if let Some(set) = set {
            if principal.scope != Scope::Admin {
                return Err(ApiError::forbidden("this call needs an admin token"));
            }
            for (field, value) in [
                ("max_jobs", set.max_jobs),
                ("max_running_jobs", set.max_running_jobs),
                ("max_stored_bytes", set.max_stored_bytes),
            ] {
                if value == Some(0) {
                    return Err(ApiError::unprocessable(format!("{field}: must be at least 1, got 0")));
                }
            }
            self.store.put_tenant_limits(tenant, &set).map_err(storage_error)?;
            tracing::info!(tenant = name, ?set, "tenant limits set");
            self.tenant_limits.insert(tenant, set);
            self.admit_waiting(tenant);
        }
        let limits = self.limits_of(tenant);
        let load = self.load.get(&tenant).cloned().unwrap_or_default();
        Ok(ebb_api::TenantUsage {
            tenant: name.to_string(),
            max_jobs: limits.max_jobs,
            max_running_jobs: limits.max_running_jobs,
            max_stored_bytes: limits.max_stored_bytes,
            jobs: load.jobs,
            admitted: load.admitted,
            waiting: load.waiting.len() as u64,
            stored_bytes: load.bytes,
        })
    }

    /// Jobs whose restart back-off is over go back to the scheduler.
    pub(super) fn end_backoffs(&mut self, now: u64) {
        while let Some(&(until_ms, id)) = self.backoff.first() {
            if until_ms > now {
                return;
            }
            self.backoff.pop_first();
            self.jobs.get_mut(&id).expect("backed-off job").waiting = None;
            if let Err(e) = self.restore_queued(id) {
                tracing::error!(job = id, "back-off over, but not requeued: {}", e.message);
            }
            self.save(id);
        }
    }

    pub(super) fn create_tenant(&mut self, name: String) -> Result<ebb_api::TenantCreated, ApiError> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(ApiError::bad_request(format!(
                "name: must be 1-64 letters, digits, '-' or '_', got {name:?}"
            )));
        }
        if self.tenants.values().any(|n| *n == name) {
            return Err(ApiError::conflict(format!("tenant {name}: already exists")));
        }
        let id = self.tenants.keys().max().map_or(1, |m| m + 1);
        self.store.put_tenant(&TenantRow { id, name: name.clone() }).map_err(storage_error)?;
        self.tenants.insert(id, name.clone());
        let token = self.grant(Principal::tenant(Scope::Tenant, id, &name))?;
        Ok(ebb_api::TenantCreated { tenant: name, token })
    }

    pub(super) fn tenant_name(&self, id: u32) -> String {
        self.tenants.get(&id).cloned().unwrap_or_default()
    }

    pub(super) fn tenant_by_name(&self, name: &str) -> Result<u32, ApiError> {
        self.tenants
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| ApiError::unprocessable(format!("tenant: unknown tenant {name:?}")))
    }
}
