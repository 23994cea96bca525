//! What Slurm's front door needs of the writer, through the API: jobs
//! that wait for others (`after`), arrays that run so many tasks at once
//! (`array_limit`), attempts the agent ended (a time limit, the job's own
//! requeue), signals for running jobs, and partitions as tiers.

use ebb_api::{Action, AgentEvent, AttemptRef, EndedBy};
use ebb_core::{Attempt, JobId};
use serde_json::{json, Value};

use super::api::Api;
use super::harness::exited;

/// One node of 4 GPUs.
fn cluster(name: &str) -> Api {
    let mut api = Api::new(name, |_| {});
    api.node("n1", "H100", 4);
    api
}

/// Runs the attempts `n1` is told to start, at the harness's instant.
fn start_all(api: &mut Api) -> Vec<AttemptRef> {
    let started = api.env.poll("n1");
    let at_ms = api.env.now;
    for &attempt in &started {
        api.env.report("n1", vec![AgentEvent::Started { attempt, pid: 7, at_ms }]);
    }
    started
}

fn end(api: &mut Api, attempt: AttemptRef, code: i32) {
    let at_ms = api.env.now;
    api.env.report("n1", vec![exited(attempt, code, at_ms)]);
}

fn ended_by(api: &mut Api, attempt: AttemptRef, code: i32, why: EndedBy) {
    let at_ms = api.env.now;
    let AgentEvent::Exited { attempt, code, signal, completed, at_ms, .. } = exited(attempt, code, at_ms)
    else {
        unreachable!()
    };
    let event = AgentEvent::Exited {
        attempt,
        code,
        signal,
        completed,
        at_ms,
        peak_memory_bytes: None,
        start_error: None,
        port_in_use: None,
        ended_by: Some(why),
    };
    api.env.report("n1", vec![event]);
}

fn state(job: &Value) -> (&str, Option<&str>) {
    (job["state"].as_str().unwrap(), job["pending_reason"].as_str())
}

fn one_gpu(extra: Value) -> Value {
    let mut spec = json!({"argv": ["true"], "gpus": 1});
    spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    spec
}

#[test]
fn a_dependency_holds_a_job_until_its_parent_ends_as_it_needs_and_fails_it_when_it_cannot() {
    let mut api = cluster("after");
    let admin = api.admin.clone();
    let parent = api.submit(&admin, &one_gpu(json!({})));
    let ok = api.submit(&admin, &one_gpu(json!({"after": format!("afterok:{parent}")})));
    let not_ok = api.submit(&admin, &one_gpu(json!({"after": format!("afternotok:{parent}")})));
    let any = api.submit(&admin, &one_gpu(json!({"after": format!("afterany:{parent}")})));
    // A chain: it waits for `ok`, which waits for the parent.
    let chained = api.submit(&admin, &one_gpu(json!({"after": format!("afterok:{ok}")})));
    assert_eq!(state(&api.job(ok)), ("queued", Some("dependency")));
    assert!(api.job(ok)["pending_detail"].as_str().unwrap().contains(&format!("job {parent}")));
    let started = start_all(&mut api);
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), [parent], "only the parent runs");

    // Across a restart the dependents still wait.
    api.restart();
    api.env.register_node("n1", "H100", 4, started.clone(), Vec::new());
    assert_eq!(state(&api.job(chained)), ("queued", Some("dependency")));

    end(&mut api, started[0], 0);
    assert_eq!(state(&api.job(not_ok)).0, "failed");
    let failed = api.job(not_ok);
    let reason = failed["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == "failed").unwrap();
    assert_eq!(
        reason["detail"]["reason"],
        format!("dependency never satisfied: job {parent} succeeded, and afternotok can never hold")
    );
    let started = start_all(&mut api);
    let mut jobs: Vec<u64> = started.iter().map(|a| a.job.0).collect();
    jobs.sort_unstable();
    assert_eq!(jobs, [ok, any]);
    let failing = started.iter().find(|a| a.job == JobId(ok)).copied().unwrap();
    end(&mut api, failing, 3);
    // `ok` failed: what waits on it with afterok can never run.
    assert_eq!(state(&api.job(chained)).0, "failed");

    // What can never hold, or names a job the tenant does not have, is refused.
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"after": format!("afterok:{ok}")})));
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(refused.error(), format!("after: job {ok} failed, and afterok can never hold"));
    let bob = api.tenant("bob");
    let refused = api.post(&bob, "/v1/jobs", &one_gpu(json!({"after": format!("afterany:{any}")})));
    assert_eq!((refused.status, refused.error()), (422, format!("after: job {any} does not exist")));
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"after": "afterok"})));
    assert_eq!(
        (refused.status, refused.error()),
        (422, "after: \"afterok\": name the job: afterok:ID".to_string())
    );
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"after": "AFTER OK"})));
    assert_eq!(refused.status, 400, "{}", refused.body);
    // A parent that already ended as needed: it runs at once.
    let done = api.submit(&admin, &one_gpu(json!({"after": format!("afterok:{parent}")})));
    assert_eq!(state(&api.job(done)), ("starting", None));
}

#[test]
fn a_singleton_waits_for_the_earlier_jobs_of_its_name() {
    let mut api = cluster("singleton");
    let admin = api.admin.clone();
    let first = api.submit(&admin, &one_gpu(json!({"name": "nightly", "after": "singleton"})));
    let second = api.submit(&admin, &one_gpu(json!({"name": "nightly", "after": "singleton"})));
    let third = api.submit(&admin, &one_gpu(json!({"name": "nightly", "after": "singleton"})));
    let started = start_all(&mut api);
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), [first]);
    end(&mut api, started[0], 1);
    // One at a time, whatever the earlier one's end.
    let started = start_all(&mut api);
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), [second]);
    assert_eq!(state(&api.job(third)), ("queued", Some("dependency")));
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"after": "singleton"})));
    assert_eq!((refused.status, refused.error()), (422, "after: singleton needs a job name".to_string()));
}

#[test]
fn an_arrays_limit_runs_that_many_tasks_at_once_in_index_order() {
    let mut api = cluster("array-limit");
    let admin = api.admin.clone();
    let first = api.submit(&admin, &one_gpu(json!({"array": "0-4", "array_limit": 2})));
    let started = start_all(&mut api);
    assert_eq!(started.iter().map(|a| a.job.0).collect::<Vec<_>>(), [first, first + 1]);
    assert_eq!(state(&api.job(first + 2)), ("queued", Some("array_limit")));
    // A waiting task cancelled leaves its place to the next.
    let cancelled = api.post(&admin, &format!("/v1/jobs/{}/cancel", first + 2), &json!({}));
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    api.restart();
    api.env.register_node("n1", "H100", 4, started.clone(), Vec::new());
    end(&mut api, started[0], 0);
    let next = start_all(&mut api);
    assert_eq!(next.iter().map(|a| a.job.0).collect::<Vec<_>>(), [first + 3]);
    assert_eq!(state(&api.job(first + 4)), ("queued", Some("array_limit")));
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"array_limit": 2})));
    assert_eq!(refused.status, 422, "{}", refused.body);
    let refused = api.post(&admin, "/v1/jobs", &one_gpu(json!({"array": "0-1", "array_limit": 0})));
    assert_eq!(refused.status, 400, "{}", refused.body);
}

#[test]
fn an_attempt_ended_at_its_time_limit_fails_the_job_and_one_the_job_requeued_does_not() {
    let mut api = cluster("ended-by");
    let admin = api.admin.clone();
    let limited = api.submit(&admin, &one_gpu(json!({"time_limit_s": 60, "max_retries": 3})));
    let requeued = api.submit(&admin, &one_gpu(json!({})));
    let started = start_all(&mut api);
    assert_eq!(started.len(), 2);
    let start = |job: u64| *started.iter().find(|a| a.job == JobId(job)).unwrap();
    let commands = api.env.commands("n1");
    assert!(commands.is_empty());
    ended_by(&mut api, start(limited), -1, EndedBy::TimeLimit);
    let job = api.job(limited);
    assert_eq!((job["state"].as_str(), job["timed_out"].as_bool()), (Some("failed"), Some(true)), "{job}");
    assert_eq!(job["time_limit_s"], 60);
    let failed = job["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == "failed").unwrap();
    assert_eq!(failed["detail"]["reason"], "time limit: it ran past its limit of 1m 00s", "no retry either");

    ended_by(&mut api, start(requeued), 255, EndedBy::Requeue);
    // A quick one (under 10 s) waits out the restart back-off first.
    assert_eq!(start_all(&mut api), []);
    let job = api.job(requeued);
    let said = job["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == "requeued").unwrap();
    assert_eq!(said["detail"]["backoff_seconds"], 1.0, "{said}");
    api.env.now += 1_000;
    api.env.tick();
    let again = start_all(&mut api);
    assert_eq!(
        again,
        [AttemptRef { job: JobId(requeued), attempt: Attempt(2) }],
        "back in the queue and placed again"
    );
    let job = api.job(requeued);
    assert_eq!((job["retries"].as_u64(), job["preemptions"].as_u64()), (Some(0), Some(0)), "{job}");
    assert_eq!(job["usage"][0]["outcome"], "requeued", "{job}");
    let said = job["events"].as_array().unwrap().iter().rev().find(|e| e["kind"] == "requeued").unwrap();
    assert_eq!(said["detail"]["reason"], "requeued by the job (scontrol requeue)");
}

/// A job that requeues itself in a loop (35 attempts a second before):
/// each quick requeue waits the restart back-off, doubling, and the one
/// past `--max-requeues` fails the job with its reason.
#[test]
fn a_job_requeueing_itself_backs_off_and_fails_past_the_bound() {
    let mut api = Api::new("requeue-loop", |c| c.limits.max_requeues = 3);
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let job = api.submit(&admin, &one_gpu(json!({"max_retries": 5})));
    let mut backoffs = Vec::new();
    for attempt in 1..=4 {
        let started = start_all(&mut api);
        assert_eq!(started, [AttemptRef { job: JobId(job), attempt: Attempt(attempt) }]);
        ended_by(&mut api, started[0], 0, EndedBy::Requeue);
        let shown = api.job(job);
        let last = shown["events"].as_array().unwrap().last().unwrap().clone();
        if attempt == 4 {
            assert_eq!(shown["state"], "failed", "{shown}");
            assert_eq!(
                last["detail"]["reason"],
                "requeued itself 3 times, the most a job may (--max-requeues)"
            );
            break;
        }
        let backoff = last["detail"]["backoff_seconds"].as_f64().unwrap();
        backoffs.push(backoff);
        assert_eq!(start_all(&mut api), [], "placed again before its back-off");
        api.env.now += (backoff * 1000.0) as u64;
        api.env.tick();
    }
    assert_eq!(backoffs, [1.0, 2.0, 4.0]);
}

#[test]
fn a_running_job_takes_a_signal_and_one_that_is_not_running_is_refused_by_state() {
    let mut api = cluster("signal");
    let admin = api.admin.clone();
    let job = api.submit(&admin, &one_gpu(json!({})));
    let started = start_all(&mut api);
    let sent = api.post(
        &admin,
        &format!("/v1/jobs/{job}/signal"),
        &json!({"signal": "SIGUSR2", "batch_only": true}),
    );
    assert_eq!(sent.status, 200, "{}", sent.body);
    let commands = api.env.commands("n1");
    assert_eq!(commands, [Action::Signal { attempt: started[0], signal: 12, batch_only: true, full: false }]);
    // `scancel --full`: steps, shell and its children; with -b, the shell.
    for (body, full) in [
        (json!({"signal": "TERM", "full": true}), true),
        (json!({"signal": "TERM", "full": true, "batch_only": true}), false),
    ] {
        let sent = api.post(&admin, &format!("/v1/jobs/{job}/signal"), &body);
        assert_eq!(sent.status, 200, "{}", sent.body);
        let batch_only = !full;
        assert_eq!(
            api.env.commands("n1"),
            [Action::Signal { attempt: started[0], signal: 15, batch_only, full }]
        );
    }
    let bad = api.post(&admin, &format!("/v1/jobs/{job}/signal"), &json!({"signal": "USR9"}));
    assert_eq!(bad.status, 400, "{}", bad.body);
    let bob = api.tenant("bob");
    let other = api.post(&bob, &format!("/v1/jobs/{job}/signal"), &json!({"signal": "USR1"}));
    assert_eq!(other.status, 404, "another tenant's job is not found");
    end(&mut api, started[0], 0);
    let ended = api.post(&admin, &format!("/v1/jobs/{job}/signal"), &json!({"signal": "USR1"}));
    assert_eq!(
        (ended.status, ended.error()),
        (409, format!("job {job}: succeeded; only a running job can be signalled"))
    );
}

#[test]
fn a_slurm_jobs_partition_chooses_its_tier() {
    let mut api = Api::new("partitions", |c| {
        c.partitions =
            ebb_server::partitions::Partitions::parse(Some("spot=preemptible,gpu=on-demand"), Some("spot"))
                .unwrap();
    });
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let listed = api.get(&admin, "/v1/partitions");
    assert_eq!(
        listed.body,
        json!([{"name": "spot", "tier": "preemptible", "default": true}, {"name": "gpu", "tier": "on-demand", "default": false}])
    );
    let batch = |partition: Option<&str>| {
        let mut slurm = json!({"script": "#!/bin/sh\nsrun true\n", "ntasks": 2});
        if let Some(p) = partition {
            slurm["partition"] = json!(p);
        }
        one_gpu(json!({"slurm": slurm}))
    };
    let gpu = api.submit(&admin, &batch(Some("gpu")));
    assert_eq!(api.job(gpu)["tier"], "on-demand");
    let spot = api.submit(&admin, &batch(None));
    assert_eq!(api.job(spot)["tier"], "preemptible");
    let refused = api.post(&admin, "/v1/jobs", &batch(Some("debug")));
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(refused.error(), "slurm.partition: no partition \"debug\"; this cluster's are spot, gpu");
    // The script is the tenant's; a job's view shows the options, not it.
    assert!(api.job(gpu)["slurm"].get("script").is_none(), "{}", api.job(gpu));
    assert_eq!(api.job(gpu)["slurm"]["ntasks"], 2);
    let started = start_all(&mut api);
    assert_eq!(started.len(), 2);
    let no_shebang = api.post(&admin, "/v1/jobs", &one_gpu(json!({"slurm": {"script": "echo hi"}})));
    assert_eq!(no_shebang.status, 400, "{}", no_shebang.body);
    let no_script = api.post(&admin, "/v1/jobs", &one_gpu(json!({"slurm": {"ntasks": 2}})));
    assert_eq!(no_script.status, 422, "{}", no_script.body);
    assert_eq!(no_script.error(), "slurm.script: a Slurm job's submission needs its script");
}
