//! Job commands: submission (arrays and sweeps expanded), cancel, signals and restart back-offs.

use super::effects::{self, Effects};
use super::ending::{cancel_deadline, cancel_grace_ms, cancel_stop};
use super::table::JobTable;
use super::*;

impl<S: Store> Engine<S> {
    /// Whether `principal` may see job `id`. A finished job no longer in
    /// memory is read back from the store for the rest of the batch, so
    /// that what is asked of it is answered as for any finished job.
    pub(super) fn visible(&mut self, principal: &Principal, id: JobId) -> Result<(), Fail> {
        if !self.jobs.contains_key(&id) {
            if let Some(mut job) = self.store.job::<JobRecord>(id).map_err(views::read_error)? {
                if job.state.is_final() {
                    // Counted while it was saved: the tally has it already.
                    job.counted = Some((job.tier, job.state, job.gpus, None));
                    self.jobs.finished.insert(0, id);
                    self.jobs.insert(id, Box::new(job));
                }
            }
        }
        match self.jobs.get(&id) {
            Some(job) if principal.may_see(job.tenant) => Ok(()),
            // Another tenant's job is as good as absent: 404, never 403.
            _ => Err(Refusal::not_found(format!("job {id}: not found")).into()),
        }
    }

    /// Cancels job `id` ([`cancel`]) and answers with its view.
    pub(super) fn cancel(&mut self, id: JobId, req: &ebb_api::CancelRequest) -> Result<ebb_api::Job, Fail> {
        cancel(&mut self.parts(), id, req.grace_ms)?;
        Ok(self.view(&self.jobs[&id], Vec::new()))
    }

    /// Sends `signal` to job `id`'s live attempt on each of its nodes.
    pub(super) fn signal(&mut self, id: JobId, signal: i32, to: (bool, bool)) -> Result<ebb_api::Job, Fail> {
        let Parts { jobs, mut fx, .. } = self.parts();
        send_signal(jobs, &mut fx, id, signal, to)?;
        Ok(self.view(&self.jobs[&id], Vec::new()))
    }

    /// Where the tenant's running Slurm job `id` keeps its steps, and their
    /// key: its own tenant's alone (an admin may see the job, not run in
    /// it: the key is the tenant's processes' own).
    pub(super) fn step_access(&self, principal: &Principal, id: JobId) -> Result<ebb_api::StepAccess, Fail> {
        let job = &self.jobs[&id];
        if principal.tenant.as_ref().is_none_or(|(tenant, _)| *tenant != job.tenant) {
            return Err(Refusal::not_found(format!("job {id}: not a job of this tenant's")).into());
        }
        if job.spec.slurm.is_none() {
            return Err(
                Refusal::conflict(format!("job {id}: not a Slurm job; its processes have no steps")).into()
            );
        }
        if !matches!(job.state, JobState::Running | JobState::Draining) {
            let state = job.state.as_str();
            return Err(
                Refusal::conflict(format!("job {id}: {state}; steps run only in a running job")).into()
            );
        }
        let (Some((addr, port)), Some(key)) = (&job.rendezvous, &job.step_key) else {
            let why = "its start went to its node ahead of its placement, without a step directory";
            return Err(Refusal::conflict(format!("job {id}: no step directory ({why})")).into());
        };
        Ok(self.launch().step_access(job, format!("{addr}:{port}"), key.clone()))
    }

    /// What pinning an image for a step of `a` on `node` needs; refused
    /// unless `a` is its job's live attempt and runs on `node`.
    pub(super) fn step_image(
        &self,
        node: &str,
        a: ebb_api::AttemptRef,
        registry: &str,
        reference: &str,
    ) -> Result<super::StepImageGrant, Fail> {
        let live = self.jobs.get(&a.job).filter(|job| {
            job.attempt == a.attempt
                && matches!(job.state, JobState::Running | JobState::Draining)
                && job.placement.iter().any(|p| p.node == node)
        });
        let Some(job) = live else {
            return Err(Refusal::not_found(format!(
                "attempt {}.{} does not run on node {node}: no image for its steps",
                a.job, a.attempt
            ))
            .into());
        };
        Ok(super::StepImageGrant {
            login: self.tenants.logins.get(&job.tenant).and_then(|l| l.get(registry)).cloned(),
            login_to_node: self.config.logins_to_nodes,
            pinned: self.step_images.get(&a).and_then(|pins| pins.get(reference)).cloned(),
        })
    }

    /// Pins `reference` to `digest` for `a`'s steps unless a step pinned
    /// it first; returns the pin. Pins of attempts no longer live go.
    pub(super) fn pin_step_image(
        &mut self,
        a: ebb_api::AttemptRef,
        reference: String,
        digest: String,
    ) -> String {
        let jobs = &self.jobs;
        self.step_images.retain(|pinned, _| {
            jobs.get(&pinned.job).is_some_and(|job| {
                job.attempt == pinned.attempt && matches!(job.state, JobState::Running | JobState::Draining)
            })
        });
        self.step_images.entry(a).or_default().entry(reference).or_insert(digest).clone()
    }

    /// Jobs whose restart back-off is over go back to the scheduler.
    pub(super) fn end_backoffs(&mut self, now: u64) -> Written {
        let Parts { jobs, core, mut fx, .. } = self.parts();
        end_backoffs(jobs, core, &mut fx, now)
    }
}

/// One submission ([`submit_all`]): its jobs' ids.
pub(super) fn submit(
    p: &mut Parts<impl Effects>,
    principal: &Principal,
    spec: JobSubmission,
) -> Result<Vec<JobId>, Fail> {
    let mut ids = submit_all(p, principal, vec![spec])?;
    Ok(ids.pop().expect("one submission"))
}

/// Several submissions at once, all or none: each is checked (an
/// error names its index in a batch of more than one), the tenant's
/// limits against them together, and only then is any job made. The
/// ids of each, in order.
pub(super) fn submit_all(
    p: &mut Parts<impl Effects>,
    principal: &Principal,
    specs: Vec<JobSubmission>,
) -> Result<Vec<Vec<JobId>>, Fail> {
    let (tenant, _) =
        principal.tenant.clone().ok_or_else(|| Refusal::forbidden("this token cannot submit jobs"))?;
    let limits = p.admission.limits_of(tenant);
    let several = specs.len() > 1;
    let mut prepared = Vec::with_capacity(specs.len());
    let mut first_id = p.jobs.next;
    let mut all_tasks = 0usize;
    for (i, spec) in specs.into_iter().enumerate() {
        let named = |e: Refusal| match several {
            true => e.within(&format!("jobs[{i}]")),
            false => e,
        };
        let (after_text, name) = (spec.after.clone(), spec.name.clone());
        let mut one = prepare(p, tenant, spec, first_id, &limits).map_err(named)?;
        let after = match after_text.as_deref() {
            Some(text) => {
                Some(gates::check_after(p, tenant, text, name.as_deref()).map_err(|e| match e {
                    Fail::Refused(e) => Fail::Refused(named(e)),
                    store => store,
                })?)
            }
            None => None,
        };
        for (spec, _) in &mut one.1 {
            spec.after = after.clone();
        }
        first_id = JobId(first_id.0 + one.1.len() as u64);
        all_tasks += one.1.len();
        if several && all_tasks as u64 > limits.max_array_tasks {
            return Err(Refusal::unacceptable(format!(
                "jobs: a batch makes at most {} jobs (ebb server --max-array-tasks), and this one makes more by jobs[{i}]",
                limits.max_array_tasks
            ))
            .into());
        }
        prepared.push(one);
    }
    check_room(
        p.admission,
        p.tenants,
        tenant,
        &limits,
        prepared.iter().flat_map(|(_, tasks)| tasks.iter().map(|(spec, _)| spec)),
    )?;
    make_jobs(p, tenant, prepared)
}

/// One submission checked and expanded into its tasks, the first of
/// which will be job `first_id`.
fn prepare(
    p: &Parts<impl Effects>,
    tenant: TenantId,
    spec: JobSubmission,
    first_id: JobId,
    limits: &crate::validate::Limits,
) -> Result<(crate::validate::Checked, Tasks), Refusal> {
    let now = p.fx.now();
    let mut spec = spec;
    if let (None, Some(slurm)) = (&spec.tier, &spec.slurm) {
        // A Slurm job's tier is its partition's.
        spec.tier = Some(p.config.partitions.tier_of(slurm.partition.as_deref())?.as_str().to_string());
    }
    if spec.slurm.as_ref().is_some_and(|s| s.whole_nodes) {
        spec.gpus = Some(whole_nodes(&spec, p.core)?);
    }
    if let Some(wanted) = &spec.gpu_model {
        // The model a name answers to, as the fleet has it now.
        let models: Vec<&str> = p.core.models().map(|(_, m)| m.name.as_str()).collect();
        if let Some(model) = p.config.gpu_names.resolve(wanted, &models).map_err(Refusal::unacceptable)? {
            spec.gpu_model = Some(model.to_string());
        }
    }
    let mut checked = crate::validate::submission(&spec, p.core, limits)?;
    if let Some(deadline_ms) = checked.deadline_ms.filter(|ms| *ms <= now) {
        return Err(Refusal::unacceptable(format!(
            "deadline: {} is not in the future (the server's time is {})",
            rfc3339(deadline_ms),
            rfc3339(now)
        )));
    }
    let tenant_name = p.tenants.name(tenant);
    match (&spec.image, &spec.image_digest) {
        (None, _) if p.config.images.required_for(&tenant_name) => {
            return Err(Refusal::unacceptable(format!(
                "image: tenant {tenant_name}'s jobs must name an image to run in (ebb submit --image \
                 HOST/NAME:TAG; ebb server --require-image)"
            )));
        }
        (Some(image), None) => {
            // The HTTP layer resolves every image before the writer sees it.
            return Err(Refusal::unacceptable(format!("image: {image} was not resolved to a digest")));
        }
        _ => {}
    }
    let mut spec = StoredSpec::from(spec);
    if checked.tier == Tier::Reserved {
        // A reserved job runs on its reservation's model.
        spec.gpu_model = Some(reserved_model(p.money, p.tenants, tenant, spec.gpu_model.as_deref(), now)?);
    }
    check_capacity(p.fleet, ("gpus", checked.gpus), spec.gpu_model.as_deref())?;
    if let Some(max) = spec.max_gpus {
        check_capacity(p.fleet, ("max_gpus", max), spec.gpu_model.as_deref())?;
    }
    let tasks = expand(&spec, std::mem::take(&mut checked.tasks), first_id);
    Ok((checked, tasks))
}

/// `sbatch --exclusive` with no GPU count: every GPU of its nodes, where
/// the nodes it may run on (of its model, if it names one) are of one size.
fn whole_nodes(spec: &JobSubmission, core: &ebb_scheduler::State) -> Result<u32, Refusal> {
    let slurm = spec.slurm.as_ref().expect("a Slurm job");
    if spec.gpus.is_some() || !slurm.components.is_empty() {
        return Err(Refusal::invalid(
            "slurm.whole_nodes: a job that takes its nodes whole names no GPUs and no components".into(),
        ));
    }
    let wanted = spec.gpu_model.as_deref();
    let sizes: BTreeSet<u8> = core
        .models()
        .filter(|(_, m)| wanted.is_none_or(|w| w.eq_ignore_ascii_case(&m.name)))
        .map(|(_, m)| m.gpus_per_node)
        .collect();
    let nodes = slurm.nodes.unwrap_or(1).clamp(1, 4096);
    match sizes.iter().collect::<Vec<_>>().as_slice() {
        [size] => Ok(nodes.saturating_mul(u32::from(**size))),
        [] => Err(Refusal::unacceptable(
            "slurm.whole_nodes: no node of the job's model has joined yet: give --gpus-per-node".into(),
        )),
        several => Err(Refusal::unacceptable(format!(
            "slurm.whole_nodes: this cluster's nodes have {} GPUs: give --gpus-per-node (or --gres=gpu:TYPE:N)",
            several.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" or ")
        ))),
    }
}

/// The model a reserved job of `tenant` runs on: that of its one
/// reservation not yet ended (of `wanted`, if given).
fn reserved_model(
    money: &Money,
    tenants: &Tenants,
    tenant: TenantId,
    wanted: Option<&str>,
    now: u64,
) -> Result<String, Refusal> {
    let models: BTreeSet<&str> = money
        .reservations
        .values()
        .filter(|r| r.tenant == tenant && r.end_ms > now && wanted.is_none_or(|m| m == r.gpu_model))
        .map(|r| r.gpu_model.as_str())
        .collect();
    match models.len() {
        0 => Err(Refusal::unacceptable(format!(
            "tier: reserved jobs draw on a reservation, and tenant {} has none{} that has not ended",
            tenants.name(tenant),
            wanted.map(|m| format!(" of {m}")).unwrap_or_default()
        ))),
        1 => Ok(models.first().expect("one").to_string()),
        _ => Err(Refusal::unacceptable(format!(
            "gpu_model: tenant {} has reservations of {}; say which",
            tenants.name(tenant),
            models.into_iter().collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Refuses a job larger than all the nodes of its model (of any model,
/// if it names none) that have joined could ever give it together,
/// naming what the cluster has. A cluster no node has joined yet
/// takes any size: the nodes may be on their way.
fn check_capacity(fleet: &Fleet, (field, gpus): (&str, u32), model: Option<&str>) -> Result<(), Refusal> {
    let registered = &fleet.registered;
    let fits = |m: &str| registered.get(m).is_some_and(|(have, _)| u64::from(gpus) <= *have);
    let fitting = match model {
        Some(m) => fits(m),
        None => registered.keys().any(|m| fits(m)),
    };
    if fitting || registered.values().all(|(have, _)| *have == 0) {
        return Ok(());
    }
    let has: Vec<String> = registered
        .iter()
        .filter(|(m, (have, _))| *have > 0 && model.is_none_or(|w| w == m.as_str()))
        .map(|(m, (have, nodes))| format!("{have} {m} on {nodes} node{}", if *nodes == 1 { "" } else { "s" }))
        .collect();
    Err(Refusal::unacceptable(format!(
        "{field}: {gpus} GPUs{}, but the cluster has {} in all: more than its nodes could ever give one job",
        model.map(|m| format!(" of {m}")).unwrap_or_default(),
        if has.is_empty() { "none of that model".to_string() } else { has.join(", ") }
    )))
}

/// Refuses a submission that would take the tenant over its limits of
/// unfinished jobs or their stored bytes.
fn check_room<'a>(
    admission: &Admission,
    tenants: &Tenants,
    tenant: TenantId,
    limits: &crate::validate::Limits,
    specs: impl Iterator<Item = &'a StoredSpec>,
) -> Result<(), Refusal> {
    let (jobs, bytes) =
        specs.fold((0u64, 0u64), |(jobs, bytes), spec| (jobs + 1, bytes.saturating_add(spec.stored_bytes())));
    let load = admission.load.get(&tenant).cloned().unwrap_or_default();
    if load.jobs.saturating_add(jobs) > limits.max_jobs {
        return Err(Refusal::over_limit(format!(
            "tenant {}: {} unfinished jobs, and this submission adds {jobs}: over the limit of {} \
             (ebb server --max-jobs-per-tenant)",
            tenants.name(tenant),
            load.jobs,
            limits.max_jobs
        )));
    }
    if load.bytes.saturating_add(bytes) > limits.max_stored_bytes {
        return Err(Refusal::over_limit(format!(
            "tenant {}: the arguments and environments of its jobs in the server (unfinished, or finished \
             within --keep-finished) take {} bytes, and this submission adds {bytes}: over the limit of {} \
             (ebb server --max-stored-bytes-per-tenant)",
            tenants.name(tenant),
            load.bytes,
            limits.max_stored_bytes
        )));
    }
    Ok(())
}

/// The jobs one submission makes, with the ids they will get from
/// `first_id` on: one job, or one per task of an array or sweep (sharing
/// the array id, the first task's, and the submission's environment),
/// each with its task and name. A pure function of the submission.
type Tasks = Vec<(StoredSpec, Option<ArrayTask>)>;

pub(super) fn expand(
    spec: &StoredSpec,
    tasks: Vec<crate::validate::Task>,
    first_id: JobId,
) -> Vec<(StoredSpec, Option<ArrayTask>)> {
    if tasks.is_empty() {
        return vec![(spec.clone(), None)];
    }
    let count = tasks.len() as u64;
    let array_id = first_id;
    tasks
        .into_iter()
        .map(|task| {
            let mut spec = spec.clone();
            let index = task.index;
            let base = spec
                .name
                .clone()
                .unwrap_or_else(|| if task.params.is_empty() { "array" } else { "sweep" }.into());
            if spec.slurm.is_some() {
                // Slurm's tasks share their array's name (SLURM_JOB_NAME, %x).
            } else if task.params.is_empty() {
                spec.name = Some(format!("{base}[{index}]"));
            } else {
                let shown: Vec<String> = task.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                spec.name = Some(format!("{base}[{}]", shown.join(",")));
            }
            let array =
                ArrayTask { id: array_id, index, tasks: count, params: task.params.into_iter().collect() };
            (spec, Some(array))
        })
        .collect()
}

/// A task's own variables, set by ebb (so not subject to the rules for
/// users' variables): its index, the array's size and id, and a sweep
/// task's parameters, each as `EBB_PARAM_<NAME>` and all as JSON.
pub(super) fn task_env(task: &ArrayTask) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("EBB_TASK_INDEX".to_string(), task.index.to_string()),
        ("EBB_TASK_COUNT".to_string(), task.tasks.to_string()),
        ("EBB_ARRAY_ID".to_string(), task.id.to_string()),
    ]);
    if !task.params.is_empty() {
        for (name, value) in &task.params {
            env.insert(format!("EBB_PARAM_{}", name.to_ascii_uppercase()), value.clone());
        }
        let params: serde_json::Map<String, serde_json::Value> =
            task.params.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        env.insert("EBB_PARAMS".into(), serde_json::Value::Object(params).to_string());
    }
    env
}

/// Jobs whose restart back-off is over by `now` go back to the scheduler.
pub(super) fn end_backoffs(
    jobs: &mut JobTable,
    core: &mut State,
    fx: &mut impl Effects,
    now: u64,
) -> Written {
    while let Some((_, id)) = jobs.backoff.pop_due(now) {
        let job = jobs.get_mut(&id).expect("backed-off job");
        job.waiting = None;
        if let Err(e) = super::recovery::restore_queued(job, core) {
            tracing::error!(job = id.0, "back-off over, but not requeued: {e}");
        }
        effects::save(jobs, fx, id)?;
    }
    Ok(())
}

/// The jobs of checked submissions of `tenant`, each into the table and
/// through its gates, with its submitted event and its deadline judged;
/// the ids of each submission's, in order.
pub(super) fn make_jobs(
    p: &mut Parts<'_, impl Effects>,
    tenant: TenantId,
    prepared: Vec<(crate::validate::Checked, Tasks)>,
) -> Result<Vec<Vec<JobId>>, Fail> {
    let now = p.fx.now();
    let mut all = Vec::with_capacity(prepared.len());
    for (checked, tasks) in prepared {
        let mut ids = Vec::with_capacity(tasks.len());
        for (spec, array) in tasks {
            let id = p.jobs.mint();
            let index = array.as_ref().map(|a| a.index);
            let mut record =
                JobRecord::queued(id, tenant, spec, checked.tier, checked.gpus, checked.signal, now);
            record.deadline =
                checked.deadline_ms.map(|at_ms| Box::new(Deadline { at_ms, ..Deadline::default() }));
            record.array = array;
            admit(p, record)?;
            // No output yet: its first is appended without asking the store
            // (two round trips to PostgreSQL for each new job).
            p.jobs.logs.insert(id, crate::store::LogState::default());
            let max_gpus = p.jobs[&id].spec.max_gpus;
            let detail = SubmittedDetail {
                tier: checked.tier.as_str().into(),
                gpus: checked.gpus,
                max_gpus,
                task: index,
            };
            p.fx.event(&p.jobs[&id], Event::Submitted(detail))?;
            p.fx.counters().submitted += 1;
            deadline::judge_deadline(p.jobs, p.core, p.config.drain_window, &mut p.fx, id, now)?;
            ids.push(id);
        }
        all.push(ids);
    }
    Ok(all)
}

/// A new job into the table and through its gates (`gates.rs`): its
/// dependencies, its array's limit, then its tenant's limit of running
/// jobs; it waits at the first that is closed, or goes into the core.
fn admit(p: &mut Parts<'_, impl Effects>, record: JobRecord) -> Result<(), Fail> {
    let (id, tenant, stored) = (record.id, record.tenant, record.spec.stored_bytes());
    p.jobs.insert(id, Box::new(record));
    let load = p.admission.load.entry(tenant).or_default();
    load.jobs += 1;
    load.bytes += stored;
    if let Err(e) = gates::enter(p.jobs, p.core, p.admission, &mut p.fx, id) {
        let load = p.admission.load.entry(tenant).or_default();
        load.jobs -= 1;
        load.bytes -= stored;
        p.jobs.remove(&id);
        return Err(e);
    }
    Ok(effects::save(p.jobs, &mut p.fx, id)?)
}

/// Sends `signal` to job `id`'s live attempt on each of its nodes (to its
/// batch shell alone where `batch_only`; steps, shell and its children
/// where `full`).
fn send_signal(
    jobs: &JobTable,
    fx: &mut impl Effects,
    id: JobId,
    signal: i32,
    (batch_only, full): (bool, bool),
) -> Result<(), Refusal> {
    let job = &jobs[&id];
    if !job.state.is_live() {
        let message = format!("job {id}: {}; only a running job can be signalled", job.state.as_str());
        return Err(Refusal::conflict(message));
    }
    let attempt = AttemptRef { job: id, attempt: job.attempt };
    tracing::info!(job = id.0, signal, batch_only, full, "signal sent to the job");
    for node in &job.running_on {
        fx.send(node, Action::Signal { attempt, signal, batch_only, full });
    }
    Ok(())
}

/// Cancels job `id`: a queued one ends now; a running one is told (its
/// notice, then SIGTERM) and killed at the end of its grace (`grace_ms`
/// asked, within the drain window).
pub(super) fn cancel(p: &mut Parts<'_, impl Effects>, id: JobId, grace_ms: Option<u64>) -> Result<(), Fail> {
    let grace_ms = cancel_grace_ms(grace_ms, p.config.drain_window)?;
    let now = p.fx.now();
    let job = p.jobs.get_mut(&id).expect("visible");
    match job.state {
        s if s.is_final() => {
            let message = format!("job {id}: already {}; there is nothing to cancel", s.as_str());
            return Err(Refusal::conflict(message).into());
        }
        JobState::Queued => {
            match job.waiting {
                Some(Waiting::Backoff { until_ms }) => {
                    p.jobs.backoff.remove(until_ms, id);
                }
                Some(Waiting::TenantLimit | Waiting::Dependency | Waiting::ArrayLimit) => {}
                None => p.core.cancel(id).map_err(|e| Refusal::internal(e.to_string()))?,
            }
            p.jobs.get_mut(&id).expect("visible").state = JobState::Cancelled;
            exits::finished(p.jobs, p.core, p.admission, &mut p.fx, id)?;
            let cancelled = CancelledDetail { while_: Some("queued".into()) };
            p.fx.event(&p.jobs[&id], Event::Cancelled(cancelled))?;
            effects::save(p.jobs, &mut p.fx, id)?;
        }
        _ => {
            let Some(deadline) = cancel_deadline(job, grace_ms, now) else { return Ok(()) };
            job.cancel_requested = true;
            job.cancel_notice = Some((now, deadline));
            let stop = cancel_stop(job, AttemptRef { job: id, attempt: job.attempt }, now);
            for node in &job.running_on {
                p.fx.send(node, stop.clone());
            }
            p.jobs.note_unstarted(id);
            let detail = CancelRequestedDetail {
                at: Some(rfc3339(now)),
                deadline: Some(rfc3339(deadline)),
                grace_seconds: Some(deadline.saturating_sub(now) as f64 / 1000.0),
            };
            p.fx.event(&p.jobs[&id], Event::CancelRequested(detail))?;
            effects::save(p.jobs, &mut p.fx, id)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{Limits, Task};

    fn submission(argv: &str, gpus: u32) -> JobSubmission {
        JobSubmission { argv: vec![argv.into()], gpus: Some(gpus), ..Default::default() }
    }

    fn refused<T: std::fmt::Debug>(result: Result<T, Fail>) -> String {
        match result {
            Err(Fail::Refused(refusal)) => refusal.message,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_submission_over_the_parts_is_checked_whole_before_any_job_is_made() {
        let mut owned = effects::Owned::new(JobId(1), 1_000);
        let spec = NodeSpec { name: "a".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        owned.core.add_node(spec, Time(0)).unwrap();
        owned.fleet.registered.insert("H100".into(), (8, 1));
        owned.tenants.names.insert(TenantId(1), "acme".into());
        owned.admission = Admission::new(Limits { max_jobs: 3, ..Limits::default() });
        let acme = Principal::tenant(Scope::Tenant, TenantId(1), "acme");
        let p = &mut owned.parts();

        // A batch whose second job no node could ever hold: nothing made.
        let too_big = refused(submit_all(p, &acme, vec![submission("a", 1), submission("b", 16)]));
        assert_eq!(
            too_big,
            "jobs[1]: gpus: 16 GPUs, but the cluster has 8 H100 on 1 node in all: more than its nodes could \
             ever give one job"
        );
        let singleton = JobSubmission { after: Some("singleton".into()), ..submission("c", 1) };
        assert_eq!(refused(submit(p, &acme, singleton)), "after: singleton needs a job name");
        assert!(p.jobs.len() == 0 && p.fx.saved.is_empty());

        // An array of two and a job: ids in order, each submitted.
        let array = JobSubmission { array: Some("0-1".into()), ..submission("d", 2) };
        let ids = submit_all(p, &acme, vec![array, submission("e", 1)]).unwrap();
        assert_eq!(ids, [vec![JobId(1), JobId(2)], vec![JobId(3)]]);
        let kinds: Vec<(JobId, &str)> = p.fx.events.iter().map(|(id, e)| (*id, e.kind().as_str())).collect();
        assert!(kinds.contains(&(JobId(3), "submitted")), "{kinds:?}");
        // At the tenant's limit of unfinished jobs, the next is refused.
        let over = refused(submit(p, &acme, submission("f", 1)));
        assert!(over.starts_with("tenant acme: 3 unfinished jobs, and this submission adds 1"), "{over}");
        assert_eq!(p.jobs.len(), 3);
        // A job the tenant does not have cannot be waited for.
        let after = JobSubmission { after: Some("afterok:99".into()), ..submission("g", 1) };
        p.admission.defaults.max_jobs = 10;
        assert!(refused(submit(p, &acme, after)).starts_with("after: "));
    }

    #[test]
    fn an_array_becomes_one_job_per_task_sharing_the_first_id_with_its_index_and_name() {
        let spec =
            StoredSpec { name: Some("prep".into()), argv: vec!["x".into()].into(), ..Default::default() };
        let tasks = (3..5).map(|index| Task { index, params: Vec::new() }).collect();
        let jobs = expand(&spec, tasks, JobId(40));
        assert_eq!(jobs.len(), 2);
        let (first, array) = &jobs[0];
        assert_eq!(first.name.as_deref(), Some("prep[3]"));
        assert!(Arc::ptr_eq(&first.env, &jobs[1].0.env), "the tasks share one environment");
        assert!(Arc::ptr_eq(&first.argv, &jobs[1].0.argv), "and one argument list");
        let array = array.as_ref().expect("a task");
        let env = task_env(array);
        assert_eq!(env["EBB_TASK_INDEX"], "3");
        assert_eq!(env["EBB_TASK_COUNT"], "2");
        assert_eq!(env["EBB_ARRAY_ID"], "40");
        assert_eq!((array.id, array.index, array.tasks), (JobId(40), 3, 2));
        assert_eq!(jobs[1].1.as_ref().map(|a| (a.id, a.index)), Some((JobId(40), 4)));
    }

    #[test]
    fn a_sweep_task_gets_its_parameters_as_variables_and_in_its_name() {
        let spec = StoredSpec { argv: vec!["x".into()].into(), ..Default::default() };
        let params = vec![("lr".to_string(), "0.1".to_string()), ("depth".to_string(), "4".to_string())];
        let jobs = expand(&spec, vec![Task { index: 0, params }], JobId(7));
        let (task, array) = &jobs[0];
        assert_eq!(task.name.as_deref(), Some("sweep[lr=0.1,depth=4]"));
        let env = task_env(array.as_ref().expect("a task"));
        assert_eq!(env["EBB_PARAM_LR"], "0.1");
        assert_eq!(env["EBB_PARAM_DEPTH"], "4");
        let params: serde_json::Value = serde_json::from_str(&env["EBB_PARAMS"]).expect("json");
        assert_eq!(params, serde_json::json!({ "lr": "0.1", "depth": "4" }));
    }

    #[test]
    fn a_single_job_is_left_as_it_was() {
        let spec =
            StoredSpec { name: Some("one".into()), argv: vec!["x".into()].into(), ..Default::default() };
        assert_eq!(expand(&spec, Vec::new(), JobId(1)), vec![(spec, None)]);
    }
}
