//! Views: records as the API shows them, and the metrics snapshot.

use super::*;

impl<S: Store> Engine<S> {
    /// One page of the jobs `principal` may see, with ids above `after`.
    pub(super) fn job_page(&self, principal: &Principal, after: u64, limit: usize) -> ebb_api::JobPage {
        let mut visible = self
            .jobs
            .range(after.saturating_add(1)..)
            .map(|(_, j)| j)
            .filter(|j| principal.may_see(j.tenant));
        let jobs: Vec<ebb_api::Job> =
            visible.by_ref().take(limit).map(|j| self.view(j, Vec::new())).collect();
        let next_cursor = match visible.next() {
            Some(_) => jobs.last().map(|j| j.id),
            None => None,
        };
        ebb_api::JobPage { jobs, next_cursor }
    }

    /// One job with its history, usage and its array's progress.
    pub(super) fn job_view(&mut self, principal: &Principal, id: u64) -> Result<ebb_api::Job, Fail> {
        self.visible(principal, id)?;
        let events = self.store.events(id).map_err(read_error)?;
        let usage = self.store.job_usage(id).map_err(read_error)?;
        let mut view = self.view(&self.jobs[&id], events);
        view.progress = self.jobs[&id].array.as_ref().map(|a| self.progress(a.id));
        view.usage = usage.iter().map(|u| u.view(&view.tenant)).collect();
        Ok(view)
    }

    /// `ebb tenant list`: every tenant by name, its working tokens, what
    /// it holds and its reservations not yet ended at `now`.
    pub(super) fn tenant_list(&self, now: u64) -> Vec<ebb_api::TenantSummary> {
        let mut tokens: BTreeMap<u32, u32> = BTreeMap::new();
        for state in self.access.tokens.read().expect("token map").values() {
            if let TokenState::Valid(p) = state {
                if let (Scope::Tenant, Some((id, _))) = (p.scope, &p.tenant) {
                    *tokens.entry(*id).or_default() += 1;
                }
            }
        }
        let mut list: Vec<ebb_api::TenantSummary> = self
            .tenants
            .names
            .iter()
            .map(|(id, name)| {
                let load = self.tenants.load.get(id).cloned().unwrap_or_default();
                let reservations = self
                    .money
                    .reservations
                    .values()
                    .filter(|r| r.tenant == *id && r.deleted_ms.is_none() && r.end_ms > now)
                    .count() as u32;
                ebb_api::TenantSummary {
                    tenant: name.clone(),
                    tokens: tokens.get(id).copied().unwrap_or(0),
                    jobs: load.jobs,
                    admitted: load.admitted,
                    waiting: load.waiting.len() as u64,
                    reservations,
                }
            })
            .collect();
        list.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        list
    }

    pub(super) fn reservation_views(&self, principal: &Principal) -> Vec<ebb_api::Reservation> {
        self.money
            .reservations
            .values()
            .filter(|r| principal.may_see(r.tenant) && r.deleted_ms.is_none())
            .map(|r| crate::billing::reservation_view(r, &self.tenant_name(r.tenant)))
            .collect()
    }

    pub(super) fn view(&self, job: &JobRecord, events: Vec<JobEvent>) -> ebb_api::Job {
        ebb_api::Job {
            id: job.id,
            tenant: self.tenants.names.get(&job.tenant).cloned().unwrap_or_default(),
            name: job.spec.name.clone(),
            tier: job.tier.as_str().into(),
            gpus: job.gpus,
            gpu_model: job.spec.gpu_model.clone(),
            argv: job.spec.argv.clone(),
            state: job.state.as_str().into(),
            attempt: job.attempt,
            preemptions: job.preemptions,
            retries: job.retries,
            submitted_at: rfc3339(job.submitted_ms),
            placement: job
                .placement
                .iter()
                .map(|(node, gpus)| ebb_api::NodeGpus { node: node.clone(), gpus: gpus.clone() })
                .collect(),
            exit_code: job.exit_code,
            usage: Vec::new(),
            last_checkpoint: job.checkpoints.last.clone(),
            checkpoint_interval_s: job.interval.as_ref().map(|(s, _)| *s),
            checkpoint_interval_why: job.interval.as_ref().map(|(_, why)| interval_why(job, why)),
            lost_gpu_seconds: job.lost_gpu_ms as f64 / 1000.0,
            array: job.array.clone(),
            progress: None,
            waiting: job.waiting.map(|w| match w {
                Waiting::Backoff { until_ms } => format!(
                    "restart back-off until {}: {} quick exits in a row (runs under {} s)",
                    rfc3339(until_ms),
                    job.quick_exits,
                    QUICK_EXIT_MS / 1000
                ),
                Waiting::TenantLimit => format!(
                    "tenant {} has {} jobs admitted, its limit (ebb tenant limits, ebb server --max-running-jobs)",
                    self.tenant_name(job.tenant),
                    self.limits_of(job.tenant).max_running_jobs
                ),
            }),
            events,
        }
    }

    /// An array's finished tasks over all, and each task's state.
    pub(super) fn progress(&self, array: u64) -> ebb_api::ArrayProgress {
        let mut progress =
            ebb_api::ArrayProgress { done: 0, total: 0, states: BTreeMap::new(), tasks: Vec::new() };
        for id in self.arrays.get(&array).map(Vec::as_slice).unwrap_or_default() {
            let job = &self.jobs[id];
            progress.total += 1;
            progress.done += u64::from(job.state == JobState::Succeeded);
            *progress.states.entry(job.state.as_str().to_string()).or_insert(0) += 1;
            progress.tasks.push(ebb_api::TaskState {
                id: *id,
                index: job.array.as_ref().map_or(0, |a| a.index),
                state: job.state.as_str().into(),
                attempt: job.attempt,
                preemptions: job.preemptions,
            });
        }
        progress
    }

    pub(super) fn node_view(&self, name: &str) -> ebb_api::Node {
        let id: NodeId = self.core.node_by_name(name).expect("known node");
        let n = self.core.node(id).expect("known node");
        let status = status_name(n.status);
        let unhealthy = match n.status {
            NodeStatus::Unhealthy => self.fleet.unhealthy.get(name).cloned(),
            _ => None,
        };
        ebb_api::Node {
            name: n.name.clone(),
            gpu_model: self.core.model(n.model).expect("known").name.clone(),
            gpus: n.gpus,
            status: status.into(),
            unhealthy,
            gpus_used: n.used_mask().count_ones(),
            gpus_held: n.held_mask().count_ones(),
            last_heartbeat: rfc3339(n.last_heartbeat.0),
            jobs: n.jobs().map(|j| j.0).collect(),
        }
    }

    pub(super) fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut snapshot = crate::metrics::Snapshot { counters: self.counters.clone(), ..Default::default() };
        for job in self.jobs.values() {
            *snapshot.jobs.entry((job.tier.as_str(), job.state.as_str())).or_insert(0) += 1;
            if job.state.is_live() {
                *snapshot.gpus_in_use.entry(job.tier.as_str()).or_insert(0) += job.gpus as u64;
            }
        }
        for (_, m) in self.core.models() {
            snapshot.gpus_total += m.capacity as u64;
        }
        for node in self.core.nodes() {
            let status = status_name(node.status);
            *snapshot.nodes.entry(status).or_insert(0) += 1;
        }
        snapshot.queued =
            self.core.jobs().filter(|j| matches!(j.phase, Phase::Queued | Phase::Holding)).count() as u64;
        snapshot
    }
}

/// A node's status as the API and metrics name it.
pub(super) fn status_name(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Up => "up",
        NodeStatus::Cordoned => "draining",
        NodeStatus::Unhealthy => "unhealthy",
        NodeStatus::Lost => "lost",
    }
}

/// A read the store could not answer: the caller gets a 500, and the
/// batch goes on (nothing was written).
pub(super) fn read_error(e: StoreError) -> Fail {
    Fail::Refused(ApiError::internal(format!("storage: {e}")))
}

/// Why the latest attempt got its interval, computed at its placement,
/// and, when the job has reported checkpoints since, that the reports
/// shown beside it are not in it yet: the attempt keeps the interval it
/// started with, a next attempt's uses them.
fn interval_why(job: &JobRecord, why: &str) -> String {
    let since_placement = job.checkpoints.last.as_ref().is_some_and(|c| c.at_ms >= job.started_ms);
    match job.checkpoints.checkpoint_time() {
        Some(delta) if since_placement => format!(
            "{why}; checkpoints reported since this attempt started (δ now {}) are for a next attempt's interval",
            delta.human()
        ),
        _ => why.to_string(),
    }
}
