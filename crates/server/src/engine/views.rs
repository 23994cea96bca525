//! Views: records as the API shows them, and the metrics snapshot.

use super::*;

/// What one active reservation's tenant uses of it, and who borrows the
/// rest: (job, GPUs).
struct Lending {
    in_use: u32,
    borrowers: Vec<(JobId, u32)>,
}

/// Which jobs a page lists, checked by the HTTP layer.
#[derive(Clone, Debug, Default)]
pub struct JobQuery {
    /// The previous page's last id: the page continues past it.
    pub cursor: Option<u64>,
    pub limit: usize,
    /// Newest first.
    pub desc: bool,
    /// Only these states (any task's state, for a collapsed array).
    pub states: Option<Vec<JobState>>,
    pub tier: Option<Tier>,
    /// Only names containing this.
    pub name: Option<String>,
    /// An array is one entry, its first task with the array's progress.
    pub collapse: bool,
}

/// A page of jobs stops once the records read for it hold this much
/// (their arguments and environments, mostly), with a cursor for the
/// rest: 500 jobs of 480,000 empty arguments each were an answer of
/// 115 MB and 3.2 GB of the server's memory, and held up every other
/// tenant's request meanwhile.
pub const MAX_PAGE_RECORD_BYTES: usize = 8 << 20;

impl<S: Store> Engine<S> {
    /// One page of the jobs `principal` may see that match `q`, by id past
    /// the cursor (keyset paging: a page costs what it skips and shows,
    /// and a job submitted meanwhile never shifts one already seen).
    ///
    /// Read from the store, finished jobs and all: the writer's reads are
    /// in its batch's transaction, so the store has every change the
    /// batch made so far, as memory does. A job still in memory is shown
    /// from its record there (with why it waits); the others from the
    /// store's.
    pub(super) fn job_page(&mut self, principal: &Principal, q: &JobQuery) -> Result<ebb_api::JobPage, Fail> {
        let tenant = match (principal.scope, &principal.tenant) {
            (Scope::Admin, _) => None,
            (_, Some((id, _))) => Some(*id),
            (_, None) => return Ok(ebb_api::JobPage { jobs: Vec::new(), next_cursor: None }),
        };
        let query = crate::store::JobPageQuery {
            tenant,
            cursor: q.cursor.map(JobId),
            desc: q.desc,
            limit: q.limit.saturating_add(1),
            states: q.states.as_ref().map(|s| s.iter().map(|s| s.as_str().to_string()).collect()),
            tier: q.tier.map(|t| t.as_str().to_string()),
            name: q.name.clone(),
            collapse: q.collapse,
            max_bytes: MAX_PAGE_RECORD_BYTES,
        };
        let read: crate::store::JobRows<JobRecord> = self.store.job_page(&query).map_err(read_error)?;
        let mut rows = read.rows;
        let more = rows.len() > q.limit || read.cut;
        rows.truncate(q.limit);
        let mut jobs = Vec::with_capacity(rows.len());
        for row in &rows {
            let job = self.jobs.get(&row.id).map_or(row, |j| j);
            let mut view = self.view(job, Vec::new());
            if let Some(array) = job.array.clone().filter(|_| q.collapse) {
                let progress = self.progress_counts(array.id).map_err(read_error)?;
                if view.pending_reason.is_none() && progress.states.contains_key(JobState::Queued.as_str()) {
                    // The row is its first task's; what holds the array's
                    // queued ones back is the first of theirs.
                    let first_queued = (array.id.0..array.id.0.saturating_add(array.tasks))
                        .filter_map(|id| self.jobs.get(&JobId(id)))
                        .find(|task| task.state == JobState::Queued);
                    if let Some((code, detail)) = first_queued.and_then(|task| self.pending(task, now_ms())) {
                        view.pending_reason = Some(code);
                        view.pending_detail = Some(detail);
                    }
                }
                view.progress = Some(progress);
            }
            jobs.push(view);
        }
        let next_cursor = if more { jobs.last().map(|j| j.id) } else { None };
        Ok(ebb_api::JobPage { jobs, next_cursor })
    }

    /// One job with its history, usage and its array's progress.
    pub(super) fn job_view(&mut self, principal: &Principal, id: JobId) -> Result<ebb_api::Job, Fail> {
        self.visible(principal, id)?;
        let events = self.store.events(id).map_err(read_error)?;
        let usage = self.store.job_usage(id).map_err(read_error)?;
        let progress = match self.jobs[&id].array.as_ref().map(|a| a.id) {
            Some(array) => Some(self.progress(array).map_err(read_error)?),
            None => None,
        };
        let mut view = self.view(&self.jobs[&id], events);
        view.progress = progress;
        view.usage = usage.iter().map(|u| u.view(&view.tenant)).collect();
        view.env = (*self.jobs[&id].spec.env).clone();
        view.drill = self.jobs[&id].drill.as_deref().map(DrillRecord::view);
        Ok(view)
    }

    /// `ebb tenant list`: every tenant by name, its working tokens, what
    /// it holds and its reservations not yet ended at `now`.
    pub(super) fn tenant_list(&self, now: u64) -> Vec<ebb_api::TenantSummary> {
        let mut tokens: BTreeMap<TenantId, u32> = BTreeMap::new();
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
                let load = self.admission.load.get(id).cloned().unwrap_or_default();
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
                    weight: self.core.weight(*id),
                    shares: self.tier_shares(*id),
                    quotas: tenants::quota_usage(&self.core, &self.admission, *id),
                }
            })
            .collect();
        list.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        list
    }

    /// A tenant's standing in each tier where it has work or usage.
    pub(super) fn tier_shares(&self, tenant: TenantId) -> Vec<ebb_api::TierShare> {
        Tier::ALL
            .into_iter()
            .filter(|&tier| self.core.tenants_in(tier).contains(&tenant))
            .map(|tier| {
                let share = self.core.share(tier, tenant, Time(self.now));
                ebb_api::TierShare {
                    tier: tier.as_str().to_string(),
                    share_percent: (share.share * 1000.0).round() / 10.0,
                    weight_percent: (share.weight_share * 1000.0).round() / 10.0,
                    usage_usd: ebb_core::MicroUsd(share.usage.round() as i64).amount_text(),
                    ahead: share.ahead,
                }
            })
            .collect()
    }

    /// The reservations `principal` may see, each with what its tenant
    /// uses of it now and what it lends to preemptible work, and to whom.
    pub(super) fn reservation_views(&self, principal: &Principal) -> Vec<ebb_api::Reservation> {
        let now = now_ms();
        let lending = self.lending(now);
        self.money
            .reservations
            .values()
            .filter(|r| principal.may_see(r.tenant) && r.deleted_ms.is_none())
            .map(|r| {
                let mut view = crate::billing::reservation_view(r, &self.tenants.name(r.tenant));
                if let Some(share) = lending.get(&r.id) {
                    view.active = true;
                    view.in_use = share.in_use;
                    view.lent = share.borrowers.iter().map(|(_, gpus)| gpus).sum();
                    view.borrowers = share
                        .borrowers
                        .iter()
                        .filter_map(|&(job, gpus)| {
                            let tenant = self.jobs.get(&job)?.tenant;
                            principal.may_see(tenant).then(|| ebb_api::Borrower {
                                job: job.0,
                                tenant: self.tenants.name(tenant),
                                gpus,
                            })
                        })
                        .collect();
                }
                view
            })
            .collect()
    }

    /// What each active reservation's tenant uses of it now, and which
    /// preemptible jobs use the GPUs it leaves idle. Reserved capacity is
    /// a count, not fixed GPUs: on each model, preemptible GPUs beyond
    /// what the unreserved capacity leaves them (after on-demand work) are
    /// lent, and are put down to the preemptible jobs that started last.
    /// A tenant's use and the lent GPUs fill reservations in id order.
    fn lending(&self, now: u64) -> BTreeMap<u64, Lending> {
        #[derive(Default)]
        struct Model {
            on_demand: u32,
            reserved: BTreeMap<TenantId, u32>,
            /// Preemptible jobs by start, latest first: (start, job, GPUs).
            preemptible: Vec<(Time, JobId, u32)>,
        }
        let mut models: BTreeMap<GpuModelId, Model> = BTreeMap::new();
        for job in self.core.jobs() {
            let Some(run) = &job.run else { continue };
            let model = models.entry(run.model).or_default();
            match job.spec.tier {
                Tier::Reserved => *model.reserved.entry(job.spec.tenant).or_default() += run.gpus(),
                Tier::OnDemand => model.on_demand += run.gpus(),
                Tier::Preemptible => model.preemptible.push((run.started_at, job.spec.id, run.gpus())),
            }
        }
        let mut lending = BTreeMap::new();
        for (name, rows) in self.active_reservations(now) {
            let Some(id) = self.core.model_by_name(&name) else { continue };
            let capacity = self.core.model(id).map_or(0, |m| m.capacity);
            let mut model = models.remove(&id).unwrap_or_default();
            let reserved: u32 = rows.iter().map(|r| r.gpus).sum();
            let unreserved_free = capacity.saturating_sub(reserved).saturating_sub(model.on_demand);
            let preemptible: u32 = model.preemptible.iter().map(|p| p.2).sum();
            let mut borrowed = preemptible.saturating_sub(unreserved_free);
            model.preemptible.sort_by(|a, b| b.cmp(a));
            let mut borrowers = model.preemptible.into_iter().map(|(_, job, gpus)| (job, gpus));
            let mut current: Option<(JobId, u32)> = None;
            for r in rows {
                let used = model.reserved.entry(r.tenant).or_default();
                let in_use = (*used).min(r.gpus);
                *used -= in_use;
                let mut idle = (r.gpus - in_use).min(borrowed);
                borrowed -= idle;
                let mut share = Lending { in_use, borrowers: Vec::new() };
                while idle > 0 {
                    let Some((job, left)) = current.take().or_else(|| borrowers.next()) else { break };
                    let take = left.min(idle);
                    share.borrowers.push((job, take));
                    idle -= take;
                    if take < left {
                        current = Some((job, left - take));
                    }
                }
                lending.insert(r.id, share);
            }
        }
        lending
    }

    /// Active reservations by GPU model, in id order.
    fn active_reservations(&self, now: u64) -> BTreeMap<String, Vec<&ReservationRow>> {
        let mut by_model: BTreeMap<String, Vec<&ReservationRow>> = BTreeMap::new();
        for r in self.money.reservations.values() {
            if r.deleted_ms.is_none() && r.start_ms <= now && now < r.end_ms {
                by_model.entry(r.gpu_model.clone()).or_default().push(r);
            }
        }
        by_model
    }

    pub(super) fn view(&self, job: &JobRecord, mut events: Vec<JobEvent>) -> ebb_api::Job {
        let pending = self.pending(job, now_ms());
        for e in &mut events {
            e.text = e.event.describe(job.gpus);
        }
        ebb_api::Job {
            id: job.id.0,
            tenant: self.tenants.names.get(&job.tenant).cloned().unwrap_or_default(),
            name: job.spec.name.clone(),
            tier: job.tier.as_str().into(),
            gpus: job.gpus,
            max_gpus: job.spec.max_gpus,
            gpu_model: job.spec.gpu_model.clone(),
            argv: (*job.spec.argv).clone(),
            state: job.state.as_str().into(),
            attempt: job.attempt.0,
            preemptions: job.preemptions,
            retries: job.retries,
            submitted_at: rfc3339(job.submitted_ms),
            run_id: job.run_id(),
            placement: job.placement.iter().map(Part::view).collect(),
            exit_code: job.exit_code,
            usage: Vec::new(),
            last_checkpoint: job.checkpoints.last.as_deref().map(SavedCheckpoint::view),
            checkpoint_interval_s: job.interval.as_ref().map(|(s, _)| *s),
            checkpoint_interval_why: job.interval.as_ref().map(|(_, why)| interval_why(job, why)),
            lost_gpu_seconds: job.lost_gpu_ms as f64 / 1000.0,
            array: job.array.as_ref().map(ArrayTask::view),
            progress: None,
            pending_reason: pending.as_ref().map(|(code, _)| *code),
            pending_detail: pending.map(|(_, detail)| detail),
            workdir: job.spec.workdir.clone(),
            env: BTreeMap::new(),
            events,
            drill: None,
            deadline: job
                .deadline
                .as_ref()
                .map(|d| deadline::status(job, d, self.now, self.config.drain_window)),
            image: job.spec.image.clone().map(Into::into),
            pulling: job.pulling.as_ref().map(|(node, done, total)| ebb_api::PullProgress {
                node: node.clone(),
                done_bytes: *done,
                total_bytes: *total,
            }),
            time_limit_s: job.spec.time_limit_ms.map(|ms| ms / 1000),
            // The script is the tenant's to keep; a listing need not carry it.
            slurm: job.spec.slurm.as_ref().map(|s| s.to_api(false)),
            timed_out: job.timed_out,
            priority: job.spec.priority,
            started_at: (job.attempt > Attempt(0))
                .then(|| rfc3339(job.run_started_ms.unwrap_or(job.started_ms))),
            ended_at: (job.state.is_final() && job.exited_ms > 0).then(|| rfc3339(job.exited_ms)),
        }
    }

    /// An array's finished tasks over all, and each task's state, from
    /// the store (which has every task, finished ones that left memory too).
    pub(super) fn progress(&mut self, array: JobId) -> Result<ebb_api::ArrayProgress, StoreError> {
        let mut progress =
            ebb_api::ArrayProgress { done: 0, total: 0, states: BTreeMap::new(), tasks: Vec::new() };
        for task in self.store.array_tasks(array)? {
            progress.total += 1;
            progress.done += u64::from(task.state == JobState::Succeeded.as_str());
            *progress.states.entry(task.state.clone()).or_insert(0) += 1;
            progress.tasks.push(ebb_api::TaskState {
                id: task.id.0,
                index: task.index,
                state: task.state,
                attempt: task.attempt.0,
                preemptions: task.preemptions,
            });
        }
        Ok(progress)
    }

    /// An array's progress without its tasks: counts by state, as a page
    /// of the listing shows a collapsed array.
    fn progress_counts(&mut self, array: JobId) -> Result<ebb_api::ArrayProgress, StoreError> {
        let states: BTreeMap<String, u64> = self.store.array_states(array)?.into_iter().collect();
        Ok(ebb_api::ArrayProgress {
            done: states.get(JobState::Succeeded.as_str()).copied().unwrap_or(0),
            total: states.values().sum(),
            states,
            tasks: Vec::new(),
        })
    }

    pub(super) fn node_view(&self, name: &str) -> ebb_api::Node {
        let id: NodeId = self.core.node_by_name(name).expect("known node");
        let n = self.core.node(id).expect("known node");
        let row = &self.fleet.nodes[name];
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
            held: self
                .core
                .holds()
                .filter_map(|h| {
                    let (_, mask) = h.alloc.iter().find(|(node, _)| *node == id)?;
                    Some(ebb_api::HeldGpus { job: h.job.0, gpus: gpu_indices(*mask) })
                })
                .collect(),
            last_heartbeat: rfc3339(n.last_heartbeat.0),
            jobs: n.jobs().map(|j| j.0).collect(),
            placements: n
                .jobs()
                .filter_map(|j| {
                    let job = self.jobs.get(&j)?;
                    let Part { gpus, .. } = job.placement.iter().find(|p| p.node == name)?;
                    let deadline = job
                        .drain
                        .as_ref()
                        .filter(|_| job.state == JobState::Draining)
                        .map(|n| rfc3339(n.deadline_ms));
                    Some(ebb_api::NodeJob {
                        job: j.0,
                        gpus: gpus.clone(),
                        tier: job.tier.as_str().into(),
                        state: job.state.as_str().into(),
                        deadline,
                    })
                })
                .collect(),
            drained_for: row.drained_for.clone().filter(|_| n.status == NodeStatus::Cordoned),
            gpus_out: row
                .gpus_out
                .iter()
                .map(|o| ebb_api::GpuOutOfService {
                    gpu: o.gpu,
                    reason: o.reason.clone(),
                    since: rfc3339(o.since_ms),
                    until_returned: o.until_returned,
                })
                .collect(),
            warnings: row
                .health
                .iter()
                .filter(|f| f.class() == ebb_api::HealthClass::Warn)
                .map(|f| f.describe())
                .collect(),
            address: row.address.clone(),
            cpus: row.cpus,
            memory_mib: row.memory_mib,
        }
    }

    /// Per GPU model: nodes and GPUs in and out of service, idle, in use by
    /// tier, and what one job of each tier could get at `now`. O(nodes).
    pub(super) fn capacity(&self, principal: &Principal, now: u64) -> ebb_api::Capacity {
        let mut models: Vec<ebb_api::ModelCapacity> = self
            .core
            .models()
            .map(|(id, m)| ebb_api::ModelCapacity {
                gpu_model: m.name.clone(),
                nodes: 0,
                gpus: m.capacity,
                nodes_out_of_service: 0,
                gpus_out_of_service: 0,
                gpus_faulted: 0,
                idle: 0,
                idle_on_one_node: 0,
                in_use: ebb_api::TierGpus {
                    reserved: m.reserved_used,
                    on_demand: m.on_demand_used,
                    preemptible: m.preemptible_active,
                },
                draining: 0,
                reserved: self.core.reserved_total(id, Time(now)),
                reserved_for_you: principal
                    .tenant
                    .as_ref()
                    .map_or(0, |(t, _)| self.core.reserved_capacity(*t, id, Time(now))),
                available: ebb_api::TierGpus::default(),
            })
            .collect();
        // One pass over the nodes, each counted to its model.
        for node in self.core.nodes() {
            let c = &mut models[usize::from(node.model.0)];
            if node.status != NodeStatus::Up {
                c.nodes_out_of_service += 1;
                c.gpus_out_of_service += u32::from(node.gpus);
                continue;
            }
            let free = node.free_mask().count_ones();
            c.gpus_faulted += node.out_mask().count_ones();
            c.gpus_out_of_service += node.out_mask().count_ones();
            c.nodes += 1;
            c.idle += free;
            c.idle_on_one_node = c.idle_on_one_node.max(free);
        }
        for ((_, m), c) in self.core.models().zip(&mut models) {
            let busy = c.in_use.reserved + c.in_use.on_demand + c.in_use.preemptible;
            c.draining = m.capacity.saturating_sub(c.idle).saturating_sub(busy);
            let reclaim_left =
                m.preemptible_limit.map_or(u32::MAX, |l| l.saturating_sub(m.preemptible_active));
            let outside_reservations = m.capacity.saturating_sub(c.reserved).saturating_sub(m.on_demand_used);
            c.available = ebb_api::TierGpus {
                reserved: c.reserved_for_you,
                on_demand: outside_reservations.min(c.idle + m.preemptible_active),
                preemptible: c.idle.min(reclaim_left),
            };
        }
        ebb_api::Capacity { models }
    }

    /// What `/metrics` exports, counted now: by job record (every job,
    /// finished ones too), by the core's holds and by node.
    pub(super) fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut snapshot = crate::metrics::Snapshot { counters: self.counters.clone(), ..Default::default() };
        snapshot.counters.polls_quiet = self.lines.answered();
        snapshot.counters.polls_woken = self.lines.woken_answered();
        // Jobs and their GPUs from the tally kept as records are saved.
        for (&(tier, state), &count) in &self.jobs.tally.jobs {
            *snapshot.jobs.entry((tier.as_str(), state.as_str())).or_insert(0) += count;
            let gpu_state = match state {
                JobState::Starting | JobState::Running => "running",
                JobState::Draining => "draining",
                _ => continue,
            };
            *snapshot.gpus.entry((tier.as_str(), gpu_state)).or_insert(0) +=
                self.jobs.tally.gpus[&(tier, state)];
        }
        self.queued_reasons(&mut snapshot.queued);
        // Held GPUs a victim still runs on are counted as its (draining).
        for hold in self.core.holds() {
            let Some(job) = self.core.job(hold.job) else { continue };
            let free_held: u32 = hold
                .alloc
                .iter()
                .filter_map(|(node, mask)| Some((mask & !self.core.node(*node)?.used_mask()).count_ones()))
                .sum();
            *snapshot.gpus.entry((job.spec.tier.as_str(), "held")).or_insert(0) += u64::from(free_held);
        }
        for (_, m) in self.core.models() {
            snapshot.gpus_total += m.capacity as u64;
        }
        for tier in Tier::ALL {
            for tenant in self.core.tenants_in(tier) {
                let share = self.core.share(tier, tenant, Time(self.now));
                let name = self.tenants.name(tenant);
                snapshot
                    .shares
                    .insert((name, tier.as_str()), (share.share, share.weight_share, share.usage / 1e6));
            }
        }
        for (tenant, tier, model, quota) in self.core.quotas() {
            let name = self.core.model(model).map_or_else(String::new, |m| m.name.clone());
            let used = self.core.quota_used(tenant, tier, model);
            let key = (self.tenants.name(tenant), tier.as_str(), name);
            snapshot.quotas.insert(key, (quota.nominal.into(), used.into()));
        }
        for node in self.core.nodes() {
            *snapshot.nodes.entry(status_name(node.status)).or_insert(0) += 1;
            if node.status != NodeStatus::Lost {
                snapshot.gpus_faulted += u64::from(node.out_mask().count_ones());
            }
            if node.status == NodeStatus::Up {
                snapshot.gpus_idle += u64::from(node.free_mask().count_ones());
            }
        }
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
    Fail::Refused(Refusal::internal(format!("storage: {e}")))
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
