//! The gates a new job passes before admission, in order: its
//! dependencies (`after`, Slurm's `--dependency`), then its array's limit
//! on tasks running at once (`array_limit`, Slurm's `--array=A-B%N`),
//! then its tenant's limit of admitted jobs. A job at one of the first two
//! is queued outside the core with its `Waiting` reason and counts in
//! neither its tenant's admitted jobs nor the tenant's own queue. Gates
//! open on events, never on a scan: a job's end opens its dependents' and
//! its array's next task's.

use super::*;

/// What a dependency asks of the job it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// It succeeded.
    Ok,
    /// It ended, however.
    Any,
    /// It failed or was cancelled.
    NotOk,
}

impl Condition {
    fn name(self) -> &'static str {
        match self {
            Condition::Ok => "afterok",
            Condition::Any => "afterany",
            Condition::NotOk => "afternotok",
        }
    }

    /// Whether a job that ended in `state` meets it.
    fn met_by(self, state: JobState) -> bool {
        match self {
            Condition::Ok => state == JobState::Succeeded,
            Condition::Any => true,
            Condition::NotOk => matches!(state, JobState::Failed | JobState::Cancelled),
        }
    }
}

/// A job's dependencies as it was submitted with them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct After {
    pub on: Vec<(Condition, JobId)>,
    /// `singleton`: after every earlier unfinished job of the tenant with
    /// its name (those are in `on` as `afterany`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub singleton: bool,
}

/// The most jobs one `after` may name.
pub const MAX_DEPENDENCIES: usize = 1000;

/// `afterok:1:2,afterany:3` or `singleton` (joined by `,`, all must
/// hold). Every refusal names the part that is wrong.
pub fn parse_after(text: &str) -> Result<After, String> {
    let mut after = After::default();
    for part in text.split(',') {
        if part == "singleton" {
            after.singleton = true;
            continue;
        }
        let mut words = part.split(':');
        let condition = match words.next() {
            Some("afterok") => Condition::Ok,
            Some("afterany") => Condition::Any,
            Some("afternotok") => Condition::NotOk,
            _ => {
                return Err(format!(
                "{part:?}: expected afterok:ID, afterany:ID, afternotok:ID or singleton (after, aftercorr, \
                     afterburstbuffer and `?` for any-of are not supported)"
            ))
            }
        };
        let mut any = false;
        for id in words {
            let id: u64 = id.parse().map_err(|_| format!("{part:?}: {id:?} is not a job id"))?;
            after.on.push((condition, JobId(id)));
            any = true;
        }
        if !any {
            return Err(format!("{part:?}: name the job: {}:ID", condition.name()));
        }
        if after.on.len() > MAX_DEPENDENCIES {
            return Err(format!("at most {MAX_DEPENDENCIES} jobs"));
        }
    }
    Ok(after)
}

/// An array with a limit on tasks running at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ArrayGate {
    pub limit: u32,
    /// Its tasks past the gate and not finished.
    pub active: u64,
    /// Its tasks at the gate, by id (index order).
    pub waiting: BTreeSet<JobId>,
}

/// Who waits on what.
#[derive(Default)]
pub(super) struct Gates {
    /// Jobs whose dependencies name each unfinished job.
    pub dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    pub arrays: BTreeMap<JobId, ArrayGate>,
}

/// Where a job's dependencies stand.
enum Standing {
    Met,
    /// Waiting on these unfinished jobs.
    Waiting(Vec<JobId>),
    /// One can never hold: why.
    Never(String),
}

/// The state of job `id` for a dependency: from the table, or the store
/// for a finished job that left it; `None` if the tenant has no such job.
fn state_for_dependency(
    jobs: &JobTable,
    fx: &mut impl Effects,
    tenant: TenantId,
    id: JobId,
) -> Written<Option<JobState>> {
    if let Some(job) = jobs.get(&id) {
        return Ok((job.tenant == tenant).then_some(job.state));
    }
    Ok(fx.stored_job(id)?.filter(|j| j.tenant == tenant).map(|j| j.state))
}

fn standing(jobs: &JobTable, fx: &mut impl Effects, tenant: TenantId, after: &After) -> Written<Standing> {
    let mut waiting = Vec::new();
    for &(condition, id) in &after.on {
        match state_for_dependency(jobs, fx, tenant, id)? {
            None => return Ok(Standing::Never(format!("job {id} does not exist"))),
            Some(state) if !state.is_final() => waiting.push(id),
            Some(state) if condition.met_by(state) => {}
            Some(state) => {
                return Ok(Standing::Never(format!(
                    "job {id} {}, and {} can never hold",
                    state.as_str(),
                    condition.name()
                )))
            }
        }
    }
    waiting.sort_unstable();
    waiting.dedup();
    Ok(match waiting.is_empty() {
        true => Standing::Met,
        false => Standing::Waiting(waiting),
    })
}

/// Puts a new job (in the table, queued, in no gate yet) through its
/// gates: it waits at the first that is closed, or is admitted.
pub(super) fn enter(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    fx: &mut impl Effects,
    id: JobId,
) -> Result<(), Fail> {
    let job = &jobs[&id];
    let tenant = job.tenant;
    if let Some(after) = &job.spec.after {
        if let Standing::Waiting(parents) = standing(jobs, fx, tenant, after)? {
            for parent in parents {
                admission.gates.dependents.entry(parent).or_default().insert(id);
            }
            jobs.get_mut(&id).expect("entering").waiting = Some(Waiting::Dependency);
            return Ok(());
        }
    }
    Ok(past_dependencies(jobs, core, admission, id)?)
}

/// A job whose dependencies are met: its array's gate, then its tenant's
/// limit.
fn past_dependencies(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    id: JobId,
) -> Result<(), Refusal> {
    let job = &jobs[&id];
    if let (Some(task), Some(limit)) = (&job.array, job.spec.array_limit) {
        let gate = admission
            .gates
            .arrays
            .entry(task.id)
            .or_insert_with(|| ArrayGate { limit, ..Default::default() });
        if gate.active >= u64::from(gate.limit) {
            gate.waiting.insert(id);
            jobs.get_mut(&id).expect("entering").waiting = Some(Waiting::ArrayLimit);
            return Ok(());
        }
        gate.active += 1;
    }
    past_gates(jobs, core, admission, id)
}

/// Past its own gates: admitted, or at its tenant's limit.
fn past_gates(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    id: JobId,
) -> Result<(), Refusal> {
    let tenant = jobs[&id].tenant;
    let max = admission.limits_of(tenant).max_running_jobs;
    let load = admission.load.entry(tenant).or_default();
    let job = jobs.get_mut(&id).expect("entering");
    if load.admitted < max {
        load.admitted += 1;
        job.waiting = None;
        super::recovery::restore_queued(job, core).map_err(|e| Refusal::internal(e.to_string()))
    } else {
        load.waiting.insert(id);
        job.waiting = Some(Waiting::TenantLimit);
        Ok(())
    }
}

/// Job `id` has ended: its place in its array's gate goes to the next
/// task, and its dependents' gates are judged again. `was` is the gate it
/// was waiting at, if any. A dependent that can now never run fails, and
/// its own dependents are judged in turn.
pub(super) fn open_gates(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    fx: &mut impl Effects,
    id: JobId,
    was: Option<Waiting>,
) -> Written {
    let mut ended = vec![(id, was)];
    while let Some((id, was)) = ended.pop() {
        array_slot_freed(jobs, core, admission, fx, id, was)?;
        let Some(children) = admission.gates.dependents.remove(&id) else { continue };
        for child in children {
            let Some(job) = jobs.get(&child) else { continue };
            if job.state != JobState::Queued || job.waiting != Some(Waiting::Dependency) {
                continue;
            }
            let after = job.spec.after.clone().unwrap_or_default();
            match standing(jobs, fx, job.tenant, &after)? {
                Standing::Waiting(_) => {}
                Standing::Met => {
                    jobs.get_mut(&child).expect("dependent").waiting = None;
                    if let Err(e) = past_dependencies(jobs, core, admission, child) {
                        tracing::error!(job = child.0, "not admitted: {}", e.message);
                    }
                    let reason = "its dependencies are met".into();
                    fx.event(&jobs[&child], Event::Admitted(AdmittedDetail { reason }))?;
                    effects::save(jobs, fx, child)?;
                }
                Standing::Never(why) => {
                    let reason = format!("dependency never satisfied: {why}");
                    let job = jobs.get_mut(&child).expect("dependent");
                    job.state = JobState::Failed;
                    job.waiting = None;
                    let failed = FailedDetail { reason: Some(reason), ..Default::default() };
                    fx.event(job, Event::Failed(failed))?;
                    admission.release(job, Some(Waiting::Dependency));
                    effects::save(jobs, fx, child)?;
                    ended.push((child, Some(Waiting::Dependency)));
                }
            }
        }
    }
    Ok(())
}

/// A task of a limited array ended (`was`: the gate it waited at): the
/// array's next tasks take its place.
fn array_slot_freed(
    jobs: &mut JobTable,
    core: &mut State,
    admission: &mut Admission,
    fx: &mut impl Effects,
    id: JobId,
    was: Option<Waiting>,
) -> Written {
    let Some(array) = jobs.get(&id).and_then(|j| j.array.as_ref()).map(|a| a.id) else {
        return Ok(());
    };
    let Some(gate) = admission.gates.arrays.get_mut(&array) else { return Ok(()) };
    match was {
        Some(Waiting::ArrayLimit) => {
            gate.waiting.remove(&id);
        }
        // Never past the array's gate.
        Some(Waiting::Dependency) => {}
        _ => gate.active = gate.active.saturating_sub(1),
    }
    loop {
        let Some(gate) = admission.gates.arrays.get_mut(&array) else { return Ok(()) };
        if gate.active == 0 && gate.waiting.is_empty() {
            admission.gates.arrays.remove(&array);
            return Ok(());
        }
        if gate.active >= u64::from(gate.limit) {
            return Ok(());
        }
        let Some(next) = gate.waiting.pop_first() else { return Ok(()) };
        gate.active += 1;
        jobs.get_mut(&next).expect("gated task").waiting = None;
        if let Err(e) = past_gates(jobs, core, admission, next) {
            tracing::error!(job = next.0, "not admitted: {}", e.message);
        }
        let reason = "a task of its array ended: it runs within the array's limit".into();
        fx.event(&jobs[&next], Event::Admitted(AdmittedDetail { reason }))?;
        effects::save(jobs, fx, next)?;
    }
}

impl<S: Store> Engine<S> {
    /// The gates as the records say, after a restart.
    pub(super) fn rebuild_gates(&mut self) {
        self.admission.gates = Gates::default();
        let mut dependents: Vec<(JobId, JobId)> = Vec::new();
        for (id, job) in &self.jobs {
            if job.state.is_final() {
                continue;
            }
            if job.waiting == Some(Waiting::Dependency) {
                for &(_, parent) in job.spec.after.iter().flat_map(|a| a.on.iter()) {
                    if self.jobs.get(&parent).is_some_and(|p| !p.state.is_final()) {
                        dependents.push((parent, *id));
                    }
                }
                continue;
            }
            if let (Some(task), Some(limit)) = (&job.array, job.spec.array_limit) {
                let gate = self
                    .admission
                    .gates
                    .arrays
                    .entry(task.id)
                    .or_insert_with(|| ArrayGate { limit, ..Default::default() });
                match job.waiting {
                    Some(Waiting::ArrayLimit) => {
                        gate.waiting.insert(*id);
                    }
                    _ => gate.active += 1,
                }
            }
        }
        for (parent, child) in dependents {
            self.admission.gates.dependents.entry(parent).or_default().insert(child);
        }
    }

    /// The gates are what the records say: each limited array's active
    /// and waiting tasks, and every job waiting on a dependency waits on
    /// an unfinished job.
    pub(super) fn check_gates(&self) -> Result<(), String> {
        let mut arrays: BTreeMap<JobId, ArrayGate> = BTreeMap::new();
        // Who waits on an unfinished job, once.
        let waiting_on_live: BTreeSet<JobId> = self
            .admission
            .gates
            .dependents
            .iter()
            .filter(|(parent, _)| self.jobs.get(parent).is_some_and(|p| !p.state.is_final()))
            .flat_map(|(_, children)| children.iter().copied())
            .collect();
        for (id, job) in &self.jobs {
            if job.state.is_final() {
                continue;
            }
            match job.waiting {
                Some(Waiting::Dependency) => {
                    if !waiting_on_live.contains(id) {
                        return Err(format!("job {id}: waits on a dependency, but on no unfinished job"));
                    }
                }
                waiting => {
                    if let (Some(task), Some(limit)) = (&job.array, job.spec.array_limit) {
                        let gate = arrays
                            .entry(task.id)
                            .or_insert_with(|| ArrayGate { limit, ..Default::default() });
                        match waiting {
                            Some(Waiting::ArrayLimit) => {
                                gate.waiting.insert(*id);
                            }
                            _ => gate.active += 1,
                        }
                    }
                }
            }
        }
        let kept: BTreeMap<JobId, ArrayGate> = self
            .admission
            .gates
            .arrays
            .iter()
            .filter(|(_, g)| g.active > 0 || !g.waiting.is_empty())
            .map(|(a, g)| (*a, g.clone()))
            .collect();
        if kept != arrays {
            return Err(format!("array gates {kept:?}, the records say {arrays:?}"));
        }
        for (array, gate) in &arrays {
            if !gate.waiting.is_empty() && gate.active < u64::from(gate.limit) {
                return Err(format!(
                    "array {array}: tasks wait at its limit of {} with {} running",
                    gate.limit, gate.active
                ));
            }
        }
        Ok(())
    }
}

/// A new submission's dependencies, checked: its `after` parsed, with
/// `singleton` made a dependency on each earlier unfinished job of the
/// tenant's with its name. One that names a job the tenant does not
/// have, or can never hold, is refused.
pub(super) fn check_after(
    p: &mut Parts<impl Effects>,
    tenant: TenantId,
    text: &str,
    name: Option<&str>,
) -> Result<After, Fail> {
    let mut after = parse_after(text).map_err(|e| Refusal::unacceptable(format!("after: {e}")))?;
    if after.singleton {
        let name = name.ok_or_else(|| Refusal::unacceptable("after: singleton needs a job name".into()))?;
        // Rare by nature (a tenant's singleton submits): a scan.
        let earlier: Vec<JobId> = p
            .jobs
            .values()
            .filter(|j| j.tenant == tenant && !j.state.is_final() && j.spec.name.as_deref() == Some(name))
            .map(|j| j.id)
            .collect();
        after.on.extend(earlier.into_iter().map(|id| (Condition::Any, id)));
    }
    // An array's id (its first task's) stands for all its tasks, as in Slurm.
    let mut on = Vec::with_capacity(after.on.len());
    for &(condition, id) in &after.on {
        let head = match p.jobs.get(&id) {
            Some(job) => job.array.as_ref().is_some_and(|a| a.id == id && a.tasks > 1),
            None => p.fx.stored_job(id)?.and_then(|j| j.array).is_some_and(|a| a.id == id && a.tasks > 1),
        };
        match head {
            true => on.extend(p.fx.array_tasks(id)?.into_iter().map(|t| (condition, t))),
            false => on.push((condition, id)),
        }
    }
    if on.len() > MAX_DEPENDENCIES {
        return Err(Refusal::unacceptable(format!(
            "after: at most {MAX_DEPENDENCIES} jobs, arrays' tasks counted"
        ))
        .into());
    }
    after.on = on;
    if let Standing::Never(why) = standing(p.jobs, &mut p.fx, tenant, &after)? {
        return Err(Refusal::unacceptable(format!("after: {why}")).into());
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dependencies_read_as_slurm_writes_them_and_the_rest_is_refused_by_name() {
        let after = parse_after("afterok:4:5,afterany:6,singleton").unwrap();
        assert_eq!(
            after.on,
            [(Condition::Ok, JobId(4)), (Condition::Ok, JobId(5)), (Condition::Any, JobId(6))]
        );
        assert!(after.singleton);
        assert!(parse_after("after:4").unwrap_err().contains("expected afterok"));
        assert!(parse_after("afterok").unwrap_err().contains("name the job"));
        assert!(parse_after("afterok:x").unwrap_err().contains("not a job id"));
        assert!(parse_after("afterok:4?afterany:5").unwrap_err().contains("not a job id"));
        let many = format!("afterok:{}", vec!["1"; 1001].join(":"));
        assert!(parse_after(&many).unwrap_err().contains("at most 1000"));
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused(text in "[a-z0-9:,_?]{0,40}") {
            let _ = parse_after(&text);
        }
    }
}
