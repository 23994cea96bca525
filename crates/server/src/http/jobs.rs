//! Jobs: submit, list, show, cancel, drill, logs.

use super::*;

/// Submit a job. Answered only once the job is durable.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = api::JobSubmission,
    responses((status = 201, body = api::Submitted),
        (status = 422, description = "A well-formed job this cluster refuses: an unknown GPU model, a shape its nodes cannot hold, a reserved job without a reservation, an empty program name, an array range backwards or over 10000 tasks, a sweep with an array, an image the registry does not have or refuses the tenant's login for", body = api::ErrorBody),
        (status = 503, description = "The image's registry cannot be reached: nothing was submitted", body = api::ErrorBody)))]
pub(super) async fn submit(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::Submitted>)> {
    let principal = app.tenant(&headers)?;
    let mut spec: api::JobSubmission = parse(&body)?;
    app.resolve_image(&principal, &mut spec, "").await?;
    let ids = app.ask(|reply| Msg::Submit { principal, spec: Box::new(spec), reply }).await??;
    Ok((StatusCode::CREATED, Json(submitted(ids))))
}

/// Submit several jobs in one request: one transaction, all or none. A
/// refusal names the submission (`jobs[3].gpus: ...`).
#[utoipa::path(post, path = "/v1/jobs/batch", tag = "jobs", request_body = api::JobBatch,
    responses((status = 201, body = api::BatchSubmitted),
        (status = 422, description = "A submission this cluster refuses (named by its index), an empty batch, or over 10000 jobs in all", body = api::ErrorBody),
        (status = 503, description = "An image's registry cannot be reached: nothing was submitted", body = api::ErrorBody)))]
pub(super) async fn submit_batch(
    State(app): State<App>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<(StatusCode, Json<api::BatchSubmitted>)> {
    let principal = app.tenant(&headers)?;
    let batch: api::JobBatch = parse(&body)?;
    if batch.jobs.is_empty() {
        return Err(ApiError::unprocessable("jobs: the batch is empty".into()));
    }
    let mut specs = batch.jobs;
    // One registry round trip per distinct image of the batch.
    let mut resolved: HashMap<String, String> = HashMap::new();
    for (i, spec) in specs.iter_mut().enumerate() {
        if let Some(digest) = spec.image.as_ref().and_then(|r| resolved.get(r)) {
            spec.image_digest = Some(digest.clone());
            continue;
        }
        app.resolve_image(&principal, spec, &format!("jobs[{i}].")).await?;
        if let (Some(reference), Some(digest)) = (&spec.image, &spec.image_digest) {
            resolved.insert(reference.clone(), digest.clone());
        }
    }
    let made = app.ask(|reply| Msg::SubmitBatch { principal, specs, reply }).await??;
    let jobs = made.into_iter().map(submitted).collect();
    Ok((StatusCode::CREATED, Json(api::BatchSubmitted { jobs })))
}

#[derive(Deserialize)]
pub(super) struct JobsQuery {
    #[serde(default)]
    cursor: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arrays: Option<String>,
}

impl JobsQuery {
    /// The engine's query, or a 400 naming the parameter that is wrong.
    fn check(self) -> ApiResult<crate::engine::JobQuery> {
        let limit = self.limit.unwrap_or(JOBS_PAGE);
        if !(1..=JOBS_PAGE).contains(&limit) {
            return Err(ApiError::bad_request(format!(
                "limit: must be between 1 and {JOBS_PAGE}, got {limit}"
            )));
        }
        let desc = match self.order.as_deref() {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!("order: must be asc or desc, got {other:?}")))
            }
        };
        let collapse = match self.arrays.as_deref() {
            None | Some("expand") => false,
            Some("collapse") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "arrays: must be expand or collapse, got {other:?}"
                )))
            }
        };
        let states = match self.state.as_deref() {
            None => None,
            Some(list) => Some(job_states(list)?),
        };
        let tier = match self.tier.as_deref().map(str::parse::<ebb_core::Tier>) {
            None => None,
            Some(Ok(tier)) => Some(tier),
            Some(Err(e)) => return Err(ApiError::bad_request(format!("tier: {e}"))),
        };
        Ok(crate::engine::JobQuery {
            cursor: self.cursor,
            limit,
            desc,
            states,
            tier,
            name: self.name,
            collapse,
        })
    }
}

/// `queued,running`, or `active` for every unfinished state.
pub(super) fn job_states(list: &str) -> ApiResult<Vec<JobState>> {
    let mut states = Vec::new();
    for name in list.split(',') {
        match name {
            "active" => states.extend(JobState::ALL.into_iter().filter(|s| !s.is_final())),
            _ => states.push(JobState::parse(name).ok_or_else(|| {
                let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::bad_request(format!(
                    "state: unknown state {name:?}; states are active, {}",
                    known.join(", ")
                ))
            })?),
        }
    }
    Ok(states)
}

/// Jobs on one page unless asked for fewer.
pub(super) const JOBS_PAGE: usize = 500;

/// The caller's jobs (an admin sees every tenant's), a page at a time by
/// id: `limit` (1-500, default 500) jobs past `cursor`, oldest first
/// (`order=desc`: newest first), filtered by state, tier and name.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    params(("cursor" = Option<u64>, Query, description = "the previous page's next_cursor"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 500),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "asc (oldest first, the default) or desc (newest first)"),
        ("state" = Option<String>, Query, pattern = "^(active|queued|starting|running|draining|succeeded|failed|cancelled)(,(active|queued|starting|running|draining|succeeded|failed|cancelled))*$",
            description = "only these states, comma-separated: queued, starting, running, draining, succeeded, failed, cancelled; active = the unfinished four"),
        ("tier" = Option<String>, Query, pattern = "^(reserved|on-demand|preemptible)$", description = "only this tier: reserved, on-demand or preemptible"),
        ("name" = Option<String>, Query, description = "only jobs whose name contains this"),
        ("arrays" = Option<String>, Query, pattern = "^(expand|collapse)$", description = "expand (every task, the default) or collapse (an array is one entry: its first task, with the array's progress; a state filter matches any task's state)")),
    responses((status = 200, body = api::JobPage), (status = 400, body = api::ErrorBody)))]
pub(super) async fn list_jobs(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<JobsQuery>,
) -> ApiResult<Json<api::JobPage>> {
    let principal = app.tenant(&headers)?;
    let query = q.check()?;
    Ok(Json(app.ask(|reply| Msg::Jobs { principal, query, reply }).await??))
}

/// One job with its event history.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody)))]
pub(super) async fn show_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Job { principal, id, reply }).await??))
}

/// Send a signal to a running job's processes (Slurm's `scancel
/// --signal`): a Slurm batch job's steps' tasks, or its batch shell with
/// `batch_only`; every process of any other job. A job that is not
/// running is a 409 naming its state.
#[utoipa::path(post, path = "/v1/jobs/{id}/signal", tag = "jobs", params(("id" = u64, Path)),
    request_body = api::SignalRequest,
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody),
        (status = 409, description = "The job is not running", body = api::ErrorBody)))]
pub(super) async fn signal_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
    Body(body): Body,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    let req: api::SignalRequest = parse(&body)?;
    let signal = crate::validate::parse_signal(&req.signal).ok_or_else(|| {
        ApiError::bad_request(format!("signal: unknown signal {:?} (e.g. USR1, SIGTERM, 10)", req.signal))
    })?;
    let to = (req.batch_only, req.full && !req.batch_only);
    Ok(Json(app.ask(|reply| Msg::Signal { principal, id, signal, to, reply }).await??))
}

/// How to reach a running Slurm job's steps from outside it (`srun
/// --jobid`): for the job's own tenant only. A job that is not a running
/// Slurm job, or whose steps have no directory, is a 409 saying which.
#[utoipa::path(get, path = "/v1/jobs/{id}/steps", tag = "jobs", params(("id" = u64, Path)),
    responses((status = 200, body = api::StepAccess), (status = 404, description = "No such job of the caller's tenant", body = api::ErrorBody),
        (status = 409, description = "The job is not a running Slurm job with a step directory", body = api::ErrorBody)))]
pub(super) async fn job_steps(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<api::StepAccess>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Steps { principal, id, reply }).await??))
}

/// The Slurm partitions (`sbatch --partition`) and the tier each runs in
/// (any token).
#[utoipa::path(get, path = "/v1/partitions", tag = "jobs", responses((status = 200, body = [api::Partition])))]
pub(super) async fn list_partitions(
    State(app): State<App>,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<api::Partition>>> {
    app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Partitions { reply }).await?))
}

/// Cancel a job: a queued job ends at once, a running one gets a notice
/// (`reason` `cancel`), SIGTERM, and SIGKILL after the grace. A job that
/// has already ended is a 409 naming its state.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = u64, Path)),
    request_body(content = Option<api::CancelRequest>, description = "Optional: an empty body takes the defaults"),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody),
        (status = 409, description = "The job has already ended", body = api::ErrorBody),
        (status = 422, description = "A grace longer than the cluster's drain window", body = api::ErrorBody)))]
pub(super) async fn cancel_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
    Body(body): Body,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    // No body, or the document's `null`, takes the defaults.
    let req: api::CancelRequest = match body.trim_ascii() {
        b"" | b"null" => api::CancelRequest::default(),
        _ => parse(&body)?,
    };
    Ok(Json(app.ask(|reply| Msg::Cancel { principal, id, req, reply }).await??))
}

/// A fire drill: the running preemptible job gets a real drain notice
/// with the cluster's drain window (its notice file, its endpoint, its
/// signal, SIGKILL at the deadline) and is requeued at once when it exits,
/// counted as neither a preemption nor a failure and billed as run time.
/// `drill` in the answer, and in `GET /v1/jobs/{id}` as it goes on, says
/// what it did and, once its next attempt reported resuming, the verdict.
#[utoipa::path(post, path = "/v1/jobs/{id}/drill", tag = "jobs", params(("id" = u64, Path)),
    responses((status = 200, body = api::Job), (status = 404, description = "No such job the caller may see", body = api::ErrorBody),
        (status = 409, description = "The job is not running, is already draining, or is being cancelled", body = api::ErrorBody),
        (status = 422, description = "The job is not preemptible", body = api::ErrorBody)))]
pub(super) async fn drill_job(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<api::Job>> {
    let principal = app.tenant(&headers)?;
    Ok(Json(app.ask(|reply| Msg::Drill { principal, id, reply }).await??))
}

#[derive(Deserialize)]
pub(super) struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
    /// With where each gang node's lines start (`LogChunk::sources`).
    #[serde(default)]
    label: bool,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A job's output from `offset`; with `follow`, waits for more.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = u64, Path), ("offset" = Option<u64>, Query), ("follow" = Option<bool>, Query), ("wait_ms" = Option<u64>, Query, description = "With follow: how long to wait for output, at most 60000"), ("label" = Option<bool>, Query, description = "With where each of a gang's nodes' lines start (sources)")),
    responses((status = 200, body = api::LogChunk), (status = 404, description = "No such job the caller may see", body = api::ErrorBody)))]
pub(super) async fn job_logs(
    State(app): State<App>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> ApiResult<Json<api::LogChunk>> {
    let principal = app.tenant(&headers)?;
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(20_000).min(60_000));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let p = principal.clone();
        let (offset, sources) = (q.offset, q.label);
        let log = app.ask(|reply| Msg::LogFile { principal: p, id, offset, sources, reply }).await??;
        let (path, finished) = (log.path, log.finished);
        let data = match log.stored {
            Some(data) => data,
            None => read_from(&path, q.offset, log.committed).await,
        };
        if !data.is_empty() || !q.follow || finished || tokio::time::Instant::now() >= deadline {
            let next_offset = q.offset + data.len() as u64;
            let data = String::from_utf8_lossy(&data).into_owned();
            // Finished only once everything has been read.
            let finished = finished && next_offset >= log.committed;
            let sources =
                log.sources.into_iter().map(|(offset, node)| api::LogSource { offset, node }).collect();
            let removed = log.removed_ms.map(crate::rfc3339);
            return Ok(Json(api::LogChunk {
                offset: q.offset,
                next_offset,
                data,
                finished,
                sources,
                removed,
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Up to 1 MiB of the log from `offset`, never past what is committed.
pub(super) async fn read_from(path: &std::path::Path, offset: u64, committed: u64) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut file) = tokio::fs::File::open(path).await else { return Vec::new() };
    if offset >= committed || file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut data = Vec::new();
    let _ = file.take((committed - offset).min(1 << 20)).read_to_end(&mut data).await;
    data
}

/// What a submission made, as the API says it: the first job's id, and
/// every id when it made more than one (an array or sweep).
fn submitted(ids: Vec<JobId>) -> api::Submitted {
    let id = ids[0].0;
    let ids = if ids.len() > 1 { ids.iter().map(|j| j.0).collect() } else { Vec::new() };
    api::Submitted { id, ids }
}
