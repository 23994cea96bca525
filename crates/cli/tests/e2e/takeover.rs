//! A takeover with thousands of jobs: two servers on one PostgreSQL, a
//! simulated fleet of 50 nodes × 8 GPUs full of 400 running jobs and
//! 2,600 more waiting; the leader is killed (`kill -9`) twice. The new
//! leader loads it all, answers, stops and starts nothing (no attempt
//! runs twice, none is lost), every node is back with it, and its first
//! fill is the one the old leader would have made: the queue's next jobs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::plane::Plane;
use crate::support::wait_for;

const NODES: u32 = 50;
const JOBS: usize = 3_000;
const GPUS: usize = NODES as usize * 8;

/// What the database says of the jobs: each live one's id, state,
/// attempt and placement, and every attempt started more than once.
struct Seen {
    live: BTreeMap<u64, (String, i64, String)>,
    started_twice: Vec<(i64, i64)>,
    usage: i64,
    later_attempts: i64,
}

fn seen(db: &mut postgres::Client) -> Seen {
    let mut live = BTreeMap::new();
    for row in db
        .query("SELECT id, state, attempt, record FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')", &[])
        .unwrap()
    {
        let record: Value = serde_json::from_str(row.get::<_, &str>(3)).unwrap();
        let id: i64 = row.get(0);
        live.insert(id as u64, (row.get(1), row.get(2), record["placement"].to_string()));
    }
    let started_twice = db
        .query(
            "SELECT job, attempt FROM events WHERE kind = 'started' GROUP BY job, attempt HAVING count(*) > 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let usage = db.query_one("SELECT count(*) FROM usage", &[]).unwrap().get(0);
    let later_attempts = db.query_one("SELECT count(*) FROM events WHERE attempt > 1", &[]).unwrap().get(0);
    Seen { live, started_twice, usage, later_attempts }
}

fn running(seen: &Seen) -> Vec<u64> {
    seen.live.iter().filter(|(_, (state, _, _))| state == "running").map(|(id, _)| *id).collect()
}

#[test]
fn a_takeover_with_thousands_of_jobs_starts_nothing_twice_and_fills_as_the_old_leader_would() {
    let mut plane = Plane::start_fleet("takeover", NODES);
    let mut db = ebb_server::store::pg_tls::Target::parse(&plane.database()).unwrap().connect().unwrap();
    let http = reqwest::blocking::Client::new();
    let job = json!({"argv": ["simulated"], "gpus": 1});
    for _ in 0..JOBS / 1000 {
        let reply = http
            .post(format!("{}/v1/jobs/batch", plane.urls[0]))
            .bearer_auth(&plane.admin)
            .json(&json!({ "jobs": vec![job.clone(); 1000] }))
            .send()
            .unwrap();
        assert!(reply.status().is_success(), "{}", reply.text().unwrap());
    }
    let before = wait_for("every GPU's job running", Duration::from_secs(60), || {
        let s = seen(&mut db);
        (running(&s).len() == GPUS).then_some(s)
    });
    assert_eq!(before.live.len(), JOBS);
    let placed = before.live.values().filter(|(_, _, p)| p.contains("fleet-")).count();
    assert_eq!(placed, GPUS, "each running job's placement is in the record");

    let mut leader = 0;
    for round in 1..=2 {
        let killed = Instant::now();
        plane.kill_server(leader);
        let other = 1 - leader;
        // The new leader answers: a job it takes (none fits: it waits).
        let id = wait_for("the new leader to take a submission", Duration::from_secs(30), || {
            let reply = http
                .post(format!("{}/v1/jobs", plane.urls[other]))
                .bearer_auth(&plane.admin)
                .json(&job)
                .timeout(Duration::from_secs(5))
                .send()
                .ok()?;
            reply.status().is_success().then(|| reply.json::<Value>().unwrap()["id"].as_u64().unwrap())
        });
        let answered = killed.elapsed();
        plane.wait_role(other, "leader");
        plane.wait_nodes_up(NODES as usize);
        // Nothing moved: the same jobs run where they ran, at attempt 1,
        // and no attempt started again, ended or was billed.
        let after = seen(&mut db);
        assert_eq!(after.started_twice, [], "round {round}");
        assert_eq!((after.usage, after.later_attempts), (0, 0), "round {round}");
        for (id, (state, attempt, placement)) in &before.live {
            assert_eq!(
                after.live.get(id),
                Some(&(state.clone(), *attempt, placement.clone())),
                "job {id}, round {round}"
            );
        }
        assert_eq!(after.live[&id].0, "queued");
        eprintln!("takeover round {round}: the new leader took a submission {answered:?} after the kill");
        plane.start_server(leader);
        plane.wait_role(leader, "follower");
        leader = other;
    }

    // The first fill after the takeovers: 8 running jobs cancelled, and
    // the 8 that waited longest (the lowest ids: one tenant, one
    // priority) take their GPUs, as the old leader would have chosen.
    let seen_now = seen(&mut db);
    let cancelled: Vec<u64> = running(&seen_now)[..8].to_vec();
    let next: Vec<u64> =
        seen_now.live.iter().filter(|(_, (s, _, _))| s == "queued").map(|(id, _)| *id).take(8).collect();
    for id in &cancelled {
        plane.run(&["cancel", &id.to_string()]);
    }
    let after = wait_for("the next 8 running", Duration::from_secs(30), || {
        let s = seen(&mut db);
        next.iter().all(|id| s.live.get(id).is_some_and(|(state, _, _)| state == "running")).then_some(s)
    });
    assert_eq!(running(&after).len(), GPUS, "no other job was placed");
    assert_eq!(after.started_twice, []);
}
