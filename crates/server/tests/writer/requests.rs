//! Requests as a client sends them, through the server's router: a batch
//! is one transaction, all or none; paging returns every job once while
//! others are submitted; a tenant sees only its own jobs; and every
//! refusal is a JSON error that names what was wrong.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};

use super::api::{Api, SCRAPE_TOKEN};

fn job(i: usize) -> Value {
    json!({"argv": ["sleep", "600"], "name": format!("b-{i}"), "tier": "preemptible"})
}

#[test]
fn a_batch_is_one_transaction_all_or_none() {
    let mut api = Api::new("batch", |_| {});
    // One GPU: the jobs wait, and nothing but the batches makes jobs.
    api.node("n1", "H100", 1);
    let admin = api.admin.clone();

    let jobs: Vec<Value> = (0..10_000).map(job).collect();
    let made = api.post(&admin, "/v1/jobs/batch", &json!({ "jobs": jobs }));
    assert_eq!(made.status, 201, "{}", made.error());
    let ids: Vec<u64> =
        made.body["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids in the batch's order, one after another");
    assert_eq!(api.all_ids(), ids, "every job of the batch, and nothing else, exists");

    // One bad submission refuses the whole batch, naming it.
    let before = ids.len();
    let mut bad: Vec<Value> = (0..5).map(job).collect();
    bad[3] = json!({"argv": ["true"], "gpus": 0});
    let said = api.post(&admin, "/v1/jobs/batch", &json!({ "jobs": bad }));
    assert_eq!(said.status, 400, "{}", said.body);
    assert!(said.error().starts_with("jobs[3]: gpus"), "{}", said.body);
    assert_eq!(api.all_ids().len(), before, "nothing of a refused batch was made");

    // Arrays count by their tasks; more than 10,000 jobs in all is refused.
    let over =
        json!({"jobs": [{"argv": ["true"], "array": "0-5999"}, {"argv": ["true"], "array": "0-4000"}]});
    let said = api.post(&admin, "/v1/jobs/batch", &over);
    assert_eq!(said.status, 422, "{}", said.body);
    assert_eq!(
        said.error(),
        "jobs: a batch makes at most 10000 jobs (ebb server --max-array-tasks), and this one makes more by jobs[1]"
    );
    let said = api.post(&admin, "/v1/jobs/batch", &json!({"jobs": []}));
    assert_eq!((said.status, said.error().as_str()), (422, "jobs: the batch is empty"));
    let said = api.post(&admin, "/v1/jobs/batch", &json!({"job": []}));
    assert_eq!(said.status, 400, "{}", said.body);
    assert_eq!(api.all_ids().len(), before);

    // A tenant's limit is checked against the batch as a whole.
    let small = api.tenant("small");
    let limited = api.put(&admin, "/v1/tenants/small/limits", &json!({"max_jobs": 3}));
    assert_eq!(limited.status, 200, "{}", limited.body);
    let said = api.post(&small, "/v1/jobs/batch", &json!({"jobs": (0..4).map(job).collect::<Vec<_>>()}));
    assert_eq!(said.status, 429, "{}", said.body);
    assert_eq!(api.all_ids().len(), before, "over its limit, nothing of the tenant's batch was made");
    let said = api.post(&small, "/v1/jobs/batch", &json!({"jobs": (0..3).map(job).collect::<Vec<_>>()}));
    assert_eq!(said.status, 201, "within its limit, the batch is taken: {}", said.body);
}

#[test]
fn paging_returns_every_job_exactly_once_while_jobs_are_submitted() {
    let mut api = Api::new("paging", |_| {});
    api.node("n1", "H100", 1);
    let admin = api.admin.clone();
    let one = json!({"argv": ["sleep", "600"]});
    let made = api.post(&admin, "/v1/jobs/batch", &json!({ "jobs": vec![one.clone(); 3000] }));
    assert_eq!(made.status, 201);
    let before: BTreeSet<u64> = api.all_ids().into_iter().collect();

    // Between every two pages, a job alone and a batch of seven.
    let mut made = Vec::new();
    for (order, size) in [("asc", 97), ("desc", 89)] {
        let mut seen = Vec::new();
        let mut cursor: Option<u64> = None;
        loop {
            let query = match cursor {
                Some(at) => format!("/v1/jobs?order={order}&limit={size}&cursor={at}"),
                None => format!("/v1/jobs?order={order}&limit={size}"),
            };
            let page = api.get(&admin, &query);
            assert_eq!(page.status, 200, "{}", page.body);
            seen.extend(page.body["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
            made.push(api.submit(&admin, &one));
            let some = api.post(&admin, "/v1/jobs/batch", &json!({ "jobs": vec![one.clone(); 7] }));
            made.extend(some.body["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
            match page.body["next_cursor"].as_u64() {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let unique: BTreeSet<u64> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "{order}: a job was listed twice");
        assert!(before.is_subset(&unique), "{order}: a job that existed before paging began was missed");
        let sorted = match order {
            "asc" => seen.windows(2).all(|w| w[0] < w[1]),
            _ => seen.windows(2).all(|w| w[0] > w[1]),
        };
        assert!(sorted, "{order}: pages out of order");
    }
    assert!(made.len() > 8 * 60, "submissions came between the pages ({} jobs)", made.len());
    let everything: BTreeSet<u64> = api.all_ids().into_iter().collect();
    assert_eq!(everything.len(), before.len() + made.len());
}

#[test]
fn tenants_see_only_their_own_jobs_and_bad_requests_name_what_was_wrong() {
    let mut api = Api::new("tenancy", |_| {});
    api.node("n1", "H100", 4);
    let (a, b) = (api.tenant("team-a"), api.tenant("team-b"));
    let job = api.submit(&a, &json!({"argv": ["true"]}));

    // Tenant B can neither see nor touch tenant A's job: 404, not 403.
    let list = api.get(&b, "/v1/jobs");
    assert_eq!(list.status, 200);
    assert!(list.body["jobs"].as_array().unwrap().iter().all(|j| j["id"] != job));
    for (method, path) in [
        ("GET", format!("/v1/jobs/{job}")),
        ("POST", format!("/v1/jobs/{job}/cancel")),
        ("GET", format!("/v1/jobs/{job}/logs")),
        ("POST", format!("/v1/jobs/{job}/drill")),
    ] {
        let body = (method == "POST").then(|| json!({}));
        let said = api.call(method, &path, Some(&b), body.as_ref());
        assert_eq!(said.status, 404, "{method} {path}: {}", said.body);
    }
    assert_eq!(api.get(&a, &format!("/v1/jobs/{job}")).status, 200);
    // No token, or a bad one: 401.
    assert_eq!(api.call("GET", "/v1/jobs", None, None).status, 401);
    assert_eq!(api.get("ebb_not-a-token", "/v1/jobs").status, 401);
    // Tenants are not operators; they see nodes (sinfo) but not whose
    // jobs run there.
    assert_eq!(api.post(&a, "/v1/nodes/n1/drain", &json!({})).status, 403);
    let nodes = api.get(&a, "/v1/nodes");
    assert_eq!(nodes.status, 200, "{}", nodes.body);
    assert!(
        nodes
            .body
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["jobs"] == json!([]) && n.get("held").is_none() && n.get("placements").is_none()),
        "{}",
        nodes.body
    );
    let admin = api.admin.clone();
    let seen = api.get(&admin, "/v1/nodes");
    assert!(seen.body.as_array().unwrap().iter().any(|n| n["jobs"] != json!([])), "{}", seen.body);
    // A malformed spec: 400 naming the field; one the API document allows
    // but this cluster cannot take (6 GPUs on nodes of 4): 422.
    for (body, field, expected) in [
        (r#"{"argv": []}"#, "argv", 400),
        (r#"{"argv": ["x"], "gpus": "two"}"#, "gpus", 400),
        (r#"{"argv": ["x"], "gpus": 0}"#, "gpus", 400),
        (r#"{"argv": ["x"], "tier": "cheap"}"#, "tier", 400),
        (r#"{"argv": ["x"], "signal": "SIGFOO"}"#, "signal", 400),
        (r#"{"argv": ["x"], "gpu": 2}"#, "gpu", 400),
        (r#"{"argv": ["x"], "env": {"EBB_JOB_ID": "7"}}"#, "env", 400),
        (r#"{"argv": ["x"], "gpus": 6}"#, "gpus", 422),
    ] {
        let said = api.post(&a, "/v1/jobs", &serde_json::from_str(body).unwrap());
        assert_eq!(said.status, expected, "{body}: {}", said.body);
        let message = said.error();
        assert!(message.starts_with(field) || message.contains(&format!("`{field}`")), "{body}: {message}");
    }
    // The OpenAPI document is served to anyone.
    let doc = api.call("GET", "/openapi.json", None, None);
    assert_eq!(doc.status, 200);
    assert!(doc.body["paths"]["/v1/jobs"].is_object());
    // Every refusal is a JSON ErrorBody, axum's own included: a path
    // parameter or query string that does not parse, a body over the limit,
    // an unknown route, a method the route does not take.
    let huge = format!(r#"{{"argv": ["{}"]}}"#, "x".repeat(3 << 20));
    let admin = api.admin.clone();
    for (token, method, path, body, expected) in [
        (Some(&a), "GET", "/v1/jobs/abc".to_string(), None, 400),
        (Some(&a), "GET", format!("/v1/jobs/{job}/logs?offset=-1"), None, 400),
        (Some(&admin), "GET", "/v1/report?from=".to_string(), None, 400),
        (Some(&a), "POST", "/v1/jobs".to_string(), Some(huge), 413),
        (Some(&a), "GET", "/v1/no-such-thing".to_string(), None, 404),
        (Some(&a), "DELETE", "/v1/jobs".to_string(), None, 405),
        (None, "GET", "/v1/jobs".to_string(), None, 401),
    ] {
        let mut request = Request::builder().method(method).uri(&path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request.header("content-type", "application/json").body(Body::from(body)),
            None => request.body(Body::empty()),
        };
        let said = api.raw(request.unwrap());
        assert_eq!(said.status, expected, "{method} {path}: {}", said.body);
        assert!(said.body["error"].as_str().is_some_and(|m| !m.is_empty()), "{method} {path}: {}", said.body);
    }
}

#[test]
fn a_nodes_row_says_which_job_is_on_which_gpu_and_a_draining_ones_deadline_in_the_same_read() {
    let mut api = Api::new("node-placements", |_| {});
    api.node("n1", "H100", 4);
    let admin = api.admin.clone();
    let victim = api.submit(&admin, &json!({"argv": ["sleep", "600"], "gpus": 2}));
    let other = api.submit(&admin, &json!({"argv": ["sleep", "600"], "gpus": 2}));
    let at_ms = api.env.now;
    let started: Vec<ebb_api::AgentEvent> = api
        .env
        .poll("n1")
        .into_iter()
        .map(|attempt| ebb_api::AgentEvent::Started { attempt, pid: 7, at_ms })
        .collect();
    api.env.report("n1", started);
    let node = |api: &mut Api| {
        let nodes = api.get(&admin, "/v1/nodes");
        assert_eq!(nodes.status, 200, "{}", nodes.body);
        nodes.body[0].clone()
    };
    let row = node(&mut api);
    let placements = row["placements"].as_array().unwrap();
    assert_eq!(placements.len(), 2, "{row}");
    let mut gpus: Vec<u64> = Vec::new();
    for (p, id) in placements.iter().zip([victim, other]) {
        assert_eq!(
            (p["job"].as_u64(), &p["tier"], &p["state"]),
            (Some(id), &json!("preemptible"), &json!("running"))
        );
        assert!(p.get("deadline").is_none(), "{p}");
        gpus.extend(p["gpus"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()));
    }
    gpus.sort();
    assert_eq!(gpus, [0, 1, 2, 3], "every GPU once: {row}");

    // An on-demand job drains one of them: in the same row, the victim is
    // draining with its deadline and its GPUs are held for the newcomer.
    let urgent = api.submit(&admin, &json!({"argv": ["true"], "gpus": 2, "tier": "on-demand"}));
    let row = node(&mut api);
    let draining: Vec<&Value> =
        row["placements"].as_array().unwrap().iter().filter(|p| p["state"] == "draining").collect();
    assert_eq!(draining.len(), 1, "{row}");
    let job = api.get(&admin, &format!("/v1/jobs/{}", draining[0]["job"]));
    let notice = job.body["events"].as_array().unwrap().iter().find(|e| e["kind"] == "drain_notice").unwrap();
    assert_eq!(draining[0]["deadline"], notice["detail"]["deadline"], "{row}");
    assert_eq!(row["held"], json!([{"job": urgent, "gpus": draining[0]["gpus"]}]), "{row}");
}

#[test]
fn a_deadline_is_refused_by_name_for_other_tiers_and_in_the_past() {
    let mut api = Api::new("deadlines", |_| {});
    api.node("n1", "H100", 1);
    let admin = api.admin.clone();
    let later = ebb_server::rfc3339(api.env.now + 3_600_000);
    for (spec, says) in [
        (
            json!({"argv": ["true"], "tier": "on-demand", "deadline": later}),
            "deadline: only preemptible jobs have deadlines",
        ),
        (json!({"argv": ["true"], "deadline": "2020-01-01T00:00:00Z"}), "deadline: 2020-01-01T00:00:00"),
        (json!({"argv": ["true"], "deadline": "tomorrow"}), "deadline: \"tomorrow\" is not a date or time"),
    ] {
        let said = api.post(&admin, "/v1/jobs", &spec);
        assert!(matches!(said.status, 400 | 422), "{spec}: {}", said.body);
        assert!(said.error().contains(says), "{spec}: {}", said.error());
    }
    assert!(api.all_ids().is_empty(), "nothing was submitted");
    // A deadline an hour ahead of the writer's clock is taken.
    let taken = api.post(&admin, "/v1/jobs", &json!({"argv": ["true"], "deadline": later}));
    assert_eq!(taken.status, 201, "{}", taken.body);
}

#[test]
fn metrics_need_an_operators_token_or_the_scrape_token() {
    let mut api = Api::new("metrics", |_| {});
    let tenant = api.tenant("acme");
    let admin = api.admin.clone();
    let scraped = api.get(&admin, "/metrics");
    assert_eq!(scraped.status, 200);
    assert!(scraped.body.as_str().unwrap().contains("ebb_jobs_queued"), "{}", scraped.body);
    assert_eq!(api.get(SCRAPE_TOKEN, "/metrics").status, 200, "the scrape token reads the metrics");
    let refused = api.get(&tenant, "/metrics");
    assert_eq!(refused.status, 403);
    assert!(refused.error().contains("--metrics-token-file"), "{}", refused.error());
    assert_eq!(api.call("GET", "/metrics", None, None).status, 401);
    assert_eq!(api.get("ebb_not-the-scrape-token", "/metrics").status, 401);
    // The scrape token is good for nothing else.
    assert_eq!(api.get(SCRAPE_TOKEN, "/v1/jobs").status, 401);
}
