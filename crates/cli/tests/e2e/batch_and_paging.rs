//! Many jobs at once: a batch of submissions in one request and one
//! transaction, all or none; and keyset paging that returns every job
//! exactly once while others are being submitted.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Cluster, Options};
use serde_json::{json, Value};

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

fn post(c: &Cluster, route: &str, body: &Value) -> (u16, Value) {
    let resp = http().post(format!("{}{route}", c.url)).bearer_auth(&c.admin).json(body).send().unwrap();
    (resp.status().as_u16(), resp.json().unwrap())
}

fn page(c: &Cluster, query: &str) -> Value {
    let resp = http().get(format!("{}/v1/jobs?{query}", c.url)).bearer_auth(&c.admin).send().unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().unwrap()
}

/// Every job the admin sees, by id.
fn all_ids(c: &Cluster) -> Vec<u64> {
    let (mut ids, mut cursor) = (Vec::new(), 0);
    loop {
        let p = page(c, &format!("limit=500&cursor={cursor}"));
        ids.extend(p["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
        match p["next_cursor"].as_u64() {
            Some(next) => cursor = next,
            None => return ids,
        }
    }
}

#[test]
fn a_batch_is_one_transaction_all_or_none() {
    // One GPU: the jobs wait, and nothing but the batches makes jobs.
    let c = Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() });
    let job = |i: usize| json!({"argv": ["sleep", "600"], "name": format!("b-{i}"), "tier": "preemptible"});

    let jobs: Vec<Value> = (0..10_000).map(job).collect();
    let (status, made) = post(&c, "/v1/jobs/batch", &json!({ "jobs": jobs }));
    assert_eq!(status, 201, "{made}");
    let ids: Vec<u64> = made["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids in the batch's order, one after another");
    assert_eq!(all_ids(&c), ids, "every job of the batch, and nothing else, exists");

    // One bad submission refuses the whole batch, naming it.
    let before = all_ids(&c).len();
    let mut bad: Vec<Value> = (0..5).map(job).collect();
    bad[3] = json!({"argv": ["true"], "gpus": 0});
    let (status, said) = post(&c, "/v1/jobs/batch", &json!({ "jobs": bad }));
    assert_eq!(status, 400, "{said}");
    assert!(said["error"].as_str().unwrap().starts_with("jobs[3]: gpus"), "{said}");
    assert_eq!(all_ids(&c).len(), before, "nothing of a refused batch was made");

    // Arrays count by their tasks; more than 10,000 jobs in all is refused.
    let over =
        json!({"jobs": [{"argv": ["true"], "array": "0-5999"}, {"argv": ["true"], "array": "0-4000"}]});
    let (status, said) = post(&c, "/v1/jobs/batch", &over);
    assert_eq!(status, 422, "{said}");
    assert!(said["error"].as_str().unwrap().contains("at most 10000 jobs"), "{said}");
    let (status, said) = post(&c, "/v1/jobs/batch", &json!({"jobs": []}));
    assert_eq!((status, said["error"].as_str().unwrap()), (422, "jobs: the batch is empty"));
    let (status, said) = post(&c, "/v1/jobs/batch", &json!({"job": []}));
    assert_eq!(status, 400, "{said}");
    assert_eq!(all_ids(&c).len(), before);

    // A tenant's limit is checked against the batch as a whole.
    let tenant: Value = serde_json::from_str(&c.ebb(&["tenant", "create", "small", "--json"])).unwrap();
    c.ebb(&["tenant", "limits", "small", "--max-jobs", "3"]);
    let resp = http()
        .post(format!("{}/v1/jobs/batch", c.url))
        .bearer_auth(tenant["token"].as_str().unwrap())
        .json(&json!({"jobs": (0..4).map(job).collect::<Vec<_>>()}))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(all_ids(&c).len(), before, "over its limit, nothing of the tenant's batch was made");
}

#[test]
fn paging_returns_every_job_exactly_once_while_jobs_are_submitted() {
    let c = Arc::new(Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() }));
    let job = json!({"argv": ["sleep", "600"]});
    let (status, _) = post(&c, "/v1/jobs/batch", &json!({ "jobs": vec![job.clone(); 3000] }));
    assert_eq!(status, 201);
    let before: BTreeSet<u64> = all_ids(&c).into_iter().collect();

    // Submitting all along, singly and in batches.
    let stop = Arc::new(AtomicBool::new(false));
    let submitter = {
        let (c, stop, job) = (c.clone(), stop.clone(), job.clone());
        std::thread::spawn(move || {
            let mut made = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (_, one) = post(&c, "/v1/jobs", &job);
                made.push(one["id"].as_u64().unwrap());
                let (_, some) = post(&c, "/v1/jobs/batch", &json!({ "jobs": vec![job.clone(); 7] }));
                made.extend(some["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
            }
            made
        })
    };
    for (order, size) in [("asc", 97), ("desc", 89)] {
        let mut seen = Vec::new();
        let mut cursor: Option<u64> = None;
        loop {
            let query = match cursor {
                Some(at) => format!("order={order}&limit={size}&cursor={at}"),
                None => format!("order={order}&limit={size}"),
            };
            let p = page(&c, &query);
            seen.extend(p["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()));
            match p["next_cursor"].as_u64() {
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
    stop.store(true, Ordering::Relaxed);
    let made = submitter.join().unwrap();
    assert!(made.len() > 8, "the submitter ran alongside the paging ({} jobs)", made.len());
    let everything: BTreeSet<u64> = all_ids(&c).into_iter().collect();
    assert_eq!(everything.len(), before.len() + made.len());
}
