//! The workload kinds end to end, with the Python SDK and the examples in
//! `examples/`: training that resumes bit-identically, an array of shards
//! that completes each shard exactly once, victims chosen by checkpoint,
//! sweeps, preprocessing, gangs, and serving next to batch work. Needs
//! `python3` with numpy, scikit-learn and wandb (`scripts/test` installs them).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::{events, read_env, repo_root, wait_for, Cluster, Options};
use serde_json::Value;

const STEPS: &str = "2000";

fn example(name: &str) -> String {
    repo_root().join("examples").join(name).display().to_string()
}

fn python() -> Command {
    let mut cmd = Command::new("python3");
    cmd.env("PYTHONPATH", repo_root().join("sdk/python"));
    for (key, _) in std::env::vars() {
        if key.starts_with("EBB_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// The final weights of the training run never preempted: the same script,
/// run directly.
fn reference_weights() -> &'static [u8] {
    static WEIGHTS: OnceLock<Vec<u8>> = OnceLock::new();
    WEIGHTS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ebb-reference-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("weights.npy");
        let status = python()
            .args([&example("train_digits.py"), "--steps", STEPS, "--out", out.to_str().unwrap()])
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "the reference run failed");
        let weights = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        weights
    })
}

fn event_details<'a>(job: &'a Value, kind: &str) -> Vec<&'a Value> {
    job["events"].as_array().unwrap().iter().filter(|e| e["kind"] == kind).map(|e| &e["detail"]).collect()
}

fn lost_per_preemption(job: &Value) -> Vec<f64> {
    event_details(job, "requeued")
        .into_iter()
        .filter(|d| d["reason"] == "preempted")
        .map(|d| d["lost_gpu_seconds"].as_f64().unwrap())
        .collect()
}

/// Takes the training job's GPU with an on-demand job and waits until
/// the training job has been requeued for the `n`th time.
fn preempt(c: &Cluster, job: u64, n: u64) {
    c.submit(&["--tier", "on-demand", "--gpus", "1", "--", "sleep", "0.3"]);
    c.wait_job(job, &format!("preemption {n}"), Duration::from_secs(60), |j| j["preemptions"] == n);
}

fn train(c: &Cluster, out: &Path, mode: &[&str]) -> u64 {
    let script = example("train_digits.py");
    let mut args = vec!["--gpus", "1", "--name", "digits", "--", "python3", &script, "--steps", STEPS];
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    args.extend_from_slice(mode);
    c.submit(&args)
}

#[test]
fn training_saved_on_notice_resumes_bit_identical_and_loses_almost_nothing() {
    let reference = reference_weights();
    let c = Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() });
    let out = c.dir.join("weights.npy");
    let job = train(&c, &out, &["--mode", "notice"]);
    for round in 1..=2u64 {
        let started = format!("attempt {round}: training from step");
        // Preempted once this attempt has trained a while: a step line
        // after its start (every 500 steps).
        wait_for("training to run", Duration::from_secs(60), || {
            let output = c.output(job);
            let (_, since) = output.split_once(&started)?;
            since.lines().any(|l| l.starts_with("step ")).then_some(())
        });
        preempt(&c, job, round);
    }
    let done = c.wait_job(job, "to succeed", Duration::from_secs(120), |j| j["state"] == "succeeded");
    assert_eq!((done["attempt"].as_u64(), done["preemptions"].as_u64()), (Some(3), Some(2)));
    assert!(std::fs::read(&out).unwrap() == reference, "final weights differ from the run never preempted");
    // Each attempt after the first resumed from the step saved at notice.
    let output = c.output(job);
    assert!(
        output.contains("attempt 2: training from step")
            && !output.contains("attempt 2: training from step 0\n")
    );
    let lost = lost_per_preemption(&done);
    eprintln!("save on notice: lost GPU-s per preemption {lost:?}");
    assert_eq!(lost.len(), 2);
    // The saves were reported and shown.
    assert_eq!(event_details(&done, "checkpoint").len(), 2);
    for (round, l) in (1..=2u64).zip(&lost) {
        // Each attempt saved after its notice, so nothing it trained before
        // the notice (a step line and more) was lost: at most what it ran from
        // the notice to its exit, however slow the machine.
        let notice = ms_of(&done, "drain_notice", round);
        assert!(
            ms_of(&done, "checkpoint", round) >= notice,
            "attempt {round} saved before its notice: {done}"
        );
        let drain = (ms_of(&done, "exited", round) - notice) as f64 / 1000.0;
        assert!(
            *l <= drain + 0.001,
            "lost {l} GPU-s, more than the {drain:.3} s from notice to exit: {lost:?}"
        );
    }
    let total = done["lost_gpu_seconds"].as_f64().unwrap();
    assert!((total - lost.iter().sum::<f64>()).abs() < 0.01, "{total} lost in all, {lost:?} per preemption");
    assert!(done["last_checkpoint"]["step"].as_u64().unwrap() > 0);
    let shown = c.ebb(&["show", &job.to_string()]);
    assert!(shown.contains("lost work") && shown.contains("interval     checkpoint every"), "{shown}");
}

#[test]
fn training_with_periodic_checkpoints_loses_less_than_one_interval_per_preemption() {
    let reference = reference_weights();
    let c = Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() });
    let out = c.dir.join("weights.npy");
    // Short enough that the second attempt still has work left after its
    // first periodic save and the half interval waited below, however fast
    // the machine trains.
    let interval = 1.0;
    let job = train(&c, &out, &["--mode", "periodic", "--every", "1"]);
    for round in 1..=2u64 {
        // Preempt half an interval after a periodic checkpoint of this attempt.
        wait_for("a periodic checkpoint", Duration::from_secs(60), || {
            let j = c.job(job);
            j["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "checkpoint" && e["attempt"] == round)
                .then_some(())
        });
        std::thread::sleep(Duration::from_millis(400));
        preempt(&c, job, round);
    }
    let done = c.wait_job(job, "to succeed", Duration::from_secs(120), |j| j["state"] == "succeeded");
    assert_eq!(done["preemptions"], 2);
    assert!(std::fs::read(&out).unwrap() == reference, "final weights differ from the run never preempted");
    let lost = lost_per_preemption(&done);
    // The interval the job really kept: a save comes at the first step
    // boundary after the interval, and its report reaches the server a
    // moment later, so on a loaded machine the gaps stretch past 1 s.
    let kept = checkpoint_gaps(&done).into_iter().fold(interval, f64::max);
    eprintln!("periodic saves every {interval} s (kept: {kept:.3} s): lost GPU-s per preemption {lost:?}");
    assert_eq!(lost.len(), 2);
    for (round, l) in (1..=2u64).zip(&lost) {
        // The work since the last periodic save is lost, all of it and no
        // more (the save may be one made after the checkpoint waited for
        // above, when its report came late on a loaded machine): the
        // attempt's run from its last save to its exit, as the server
        // stamped their reports (each a few milliseconds after the agent
        // did; a quarter interval allowed for a loaded machine, where
        // counting from the wrong save would be a whole interval off), and
        // never more than one interval before the notice plus what the job
        // ran until it exited after it.
        let exited = ms_of(&done, "exited", round);
        let since_save = (exited - last_checkpoint_ms(&done, round)) as f64 / 1000.0;
        assert!(
            (l - since_save).abs() < interval / 4.0,
            "lost {l} GPU-s, ran {since_save:.3} s since its last save"
        );
        let exit = exited - ms_of(&done, "drain_notice", round);
        let bound = kept + exit as f64 / 1000.0;
        assert!(
            *l > 0.0 && *l < bound,
            "lost {l} GPU-s, over one interval ({kept:.3} s) and the {exit} ms from notice to exit"
        );
    }
}

/// When `job`'s first event of `kind` in attempt `attempt` happened (ms).
fn ms_of(job: &Value, kind: &str, attempt: u64) -> i64 {
    let events = job["events"].as_array().unwrap();
    let event = events.iter().find(|e| e["kind"] == kind && e["attempt"] == attempt);
    event.unwrap_or_else(|| panic!("no {kind} in attempt {attempt}: {job}"))["at_ms"].as_i64().unwrap()
}

/// When `attempt` of `job` last saved.
fn last_checkpoint_ms(job: &Value, attempt: u64) -> i64 {
    let events = job["events"].as_array().unwrap();
    let saves = events.iter().filter(|e| e["kind"] == "checkpoint" && e["attempt"] == attempt);
    let last = saves.map(|e| e["at_ms"].as_i64().unwrap()).max();
    last.unwrap_or_else(|| panic!("no checkpoint in attempt {attempt}: {job}"))
}

/// The seconds between consecutive checkpoints of each attempt of `job`.
fn checkpoint_gaps(job: &Value) -> Vec<f64> {
    let saves: Vec<(u64, i64)> = job["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "checkpoint")
        .map(|e| (e["attempt"].as_u64().unwrap(), e["at_ms"].as_i64().unwrap()))
        .collect();
    saves.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| (w[1].1 - w[0].1) as f64 / 1000.0).collect()
}

#[test]
fn an_array_of_100_shards_completes_each_shard_exactly_once_under_preemption() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let data = c.dir.join("infer");
    let script = example("batch_inference.py");
    let data_arg = data.to_str().unwrap();
    let prepared =
        python().args([&script, "prepare", "--shards", "100", "--data", data_arg]).status().unwrap();
    assert!(prepared.success());
    let args = ["--array", "0-99", "--name", "infer", "--", "python3", &script, "run", "--data", data_arg];
    let first = c.submit(&args);
    // On-demand work keeps arriving and taking GPUs from the shards.
    // Each burst runs, and the shards take the GPUs back and finish
    // another before the next one comes.
    let progress = |c: &Cluster| c.job(first)["progress"].clone();
    let done = |c: &Cluster| progress(c)["done"].as_u64().unwrap();
    let mut bursts = 0;
    loop {
        let before = done(&c);
        if before == 100 {
            break;
        }
        let burst = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "0.4"]);
        bursts += 1;
        c.wait_state(burst, "succeeded");
        wait_for("a shard to finish after the burst", Duration::from_secs(60), || {
            (done(&c) > before).then_some(())
        });
        assert!(bursts < 200, "the array did not finish: {}", progress(&c));
    }
    let p = progress(&c);
    assert_eq!((p["done"].as_u64(), p["total"].as_u64()), (Some(100), Some(100)));
    let tasks = p["tasks"].as_array().unwrap();
    assert!(tasks.iter().all(|t| t["state"] == "succeeded"));
    let preempted: u64 = tasks.iter().map(|t| t["preemptions"].as_u64().unwrap()).sum();
    assert!(preempted >= 2, "only {preempted} preemptions in {bursts} bursts");
    eprintln!("100 shards: {preempted} preemptions in {bursts} on-demand bursts");
    // Each shard finished once, and never started again after finishing.
    let ledger = std::fs::read_to_string(data.join("ledger")).unwrap();
    for i in 0..100 {
        let lines: Vec<&str> =
            ledger.lines().filter(|l| l.split_whitespace().nth(1) == Some(&i.to_string())).collect();
        let done = lines.iter().filter(|l| l.starts_with("done")).count();
        assert_eq!(done, 1, "shard {i}: {lines:?}");
        assert!(lines.last().unwrap().starts_with("done"), "shard {i} ran again after finishing: {lines:?}");
    }
    for t in tasks {
        let job = c.job(t["id"].as_u64().unwrap());
        assert_eq!(events(&job).iter().filter(|k| *k == "succeeded").count(), 1);
    }
    let check = python().args([&script, "check", "--data", data_arg]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    let shown = c.ebb(&["show", &first.to_string()]);
    assert!(shown.contains("progress     100/100 done") && shown.contains("succeeded  0-99"), "{shown}");
}

/// A preemptible job that reports a checkpoint whenever `go` appears in its
/// checkpoint directory.
const REPORTER: &str = r#"
import os, time, ebb_sdk
d = os.environ["EBB_CHECKPOINT_DIR"]
ebb_sdk.watcher()
step = 0
while not ebb_sdk.drain_requested():
    go = os.path.join(d, "go")
    if os.path.exists(go):
        step += 1
        ebb_sdk.report_checkpoint(step, 1024, 0.01)
        os.unlink(go)
    time.sleep(0.02)
"#;

#[test]
fn the_victim_is_the_candidate_that_checkpointed_most_recently() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let older = c.submit(&["--name", "a", "--", "python3", "-c", REPORTER]);
    c.wait_state(older, "running");
    // Started apart in time, so that "younger" is the younger.
    std::thread::sleep(Duration::from_millis(100));
    let younger = c.submit(&["--name", "b", "--", "python3", "-c", REPORTER]);
    c.wait_state(younger, "running");
    // With no checkpoints the younger job would lose least; checkpoints
    // change that: the younger saves first, the older one after it.
    for id in [younger, older] {
        std::fs::write(c.checkpoints(id).join("go"), "").unwrap();
        c.wait_job(id, "a checkpoint", Duration::from_secs(20), |j| !j["last_checkpoint"].is_null());
    }
    let od = c.submit(&["--tier", "on-demand", "--", "sleep", "0.2"]);
    let drained = c.wait_job(older, "drained", Duration::from_secs(20), |j| j["preemptions"] == 1);
    assert_eq!(event_details(&drained, "drain_notice")[0]["detail"]["by"], od);
    let spared = c.job(younger);
    assert_eq!(spared["preemptions"], 0);
    assert!(!events(&spared).contains(&"drain_notice".to_string()));
    // The preemptor's record says why: the lost work of the set it chose.
    let lost = event_details(&c.job(od), "preempting")[0]["lost_gpu_seconds"].as_f64().unwrap();
    assert!(lost < 1.0, "{lost}");
}

#[test]
fn checkpoint_reports_set_the_interval_and_a_save_longer_than_the_window_is_warned() {
    let c = Cluster::start(Options { nodes: 1, gpus: 1, drain_window: "2s", ..Options::default() });
    let script =
        r#"env > "$EBB_CHECKPOINT_DIR/env-$EBB_ATTEMPT"; trap 'exit 0' TERM; while :; do sleep 0.05; done"#;
    let job = c.submit(&["--", "bash", "-c", script]);
    let env = |attempt: u32| {
        let path = c.checkpoints(job).join(format!("env-{attempt}"));
        wait_for("the attempt's environment", Duration::from_secs(20), || {
            std::fs::metadata(&path).ok().filter(|m| m.len() > 0).map(|_| read_env(&path))
        })
    };
    let env1 = env(1);
    // Nothing measured yet: δ 30 s, M the prior of 7 node-days, √(2·30·604800) s.
    assert_eq!(env1["EBB_CHECKPOINT_INTERVAL_S"], "6023");
    let report = format!("{}/ebb/v1/checkpoint", env1["EBB_METADATA_URL"]);
    let post = |body: &str| {
        let resp = reqwest::blocking::Client::new()
            .post(&report)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.text().unwrap())
    };
    let (status, body) = post(r#"{"step": 1, "seconds": -1}"#);
    assert!(status == 400 && body.contains("seconds"), "{status} {body}");
    let (status, body) = post(r#"{"step": "ten"}"#);
    assert!(status == 400 && body.contains("step"), "{status} {body}");
    let (status, body) = post(r#"{"step": 1, "bytes": 4096, "seconds": 3.5}"#);
    assert_eq!(status, 202, "{body}");
    let warned =
        c.wait_job(job, "the warning", Duration::from_secs(20), |j| events(j).contains(&"warning".into()));
    let message = event_details(&warned, "warning")[0]["message"].as_str().unwrap().to_string();
    assert!(message.contains("3.5s") && message.contains("2.0s drain window"), "{message}");
    assert_eq!(warned["last_checkpoint"]["step"], 1);
    assert_eq!(warned["last_checkpoint"]["bytes"], 4096);
    // The next attempt's interval uses the measured 3.5 s: √(2·3.5·604800) s.
    c.submit(&["--tier", "on-demand", "--", "sleep", "0.2"]);
    let interval: u64 = env(2)["EBB_CHECKPOINT_INTERVAL_S"].parse().unwrap();
    assert_eq!(interval, 2057);
    let shown = c.ebb(&["show", &job.to_string()]);
    assert!(
        shown.contains("checkpoint every 34m 17s (EBB_CHECKPOINT_INTERVAL_S=2057 for attempt 2)")
            && shown.contains("δ measured"),
        "{shown}"
    );
    assert!(shown.contains("longer than the 2.0s drain window"), "{shown}");
}

#[test]
fn a_sweep_runs_one_trial_per_combination_and_preempted_trials_resume() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let out = c.dir.join("sweep");
    let script = example("sweep.py");
    let first = c.submit(&[
        "--sweep",
        "lr=0.3,0.03",
        "--sweep",
        "batch=16,64",
        "--",
        "python3",
        &script,
        "--out",
        out.to_str().unwrap(),
    ]);
    let task = c.job(first);
    assert_eq!(task["array"]["tasks"], 4);
    assert_eq!(task["name"], "sweep[lr=0.3,batch=16]");
    // Two trials run; take both GPUs once they are training.
    wait_for("two trials to train", Duration::from_secs(60), || {
        let p = c.job(first)["progress"].clone();
        let training = p["tasks"]
            .as_array()?
            .iter()
            .filter(|t| t["state"] == "running" && c.output(t["id"].as_u64().unwrap()).contains("from step"))
            .count();
        (training == 2).then_some(())
    });
    // Past "from step", a trial saves a step of its own at the notice.
    c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "0.3"]);
    let p = c.wait_job(first, "all trials", Duration::from_secs(120), |j| j["progress"]["done"] == 4)
        ["progress"]
        .clone();
    let preempted: Vec<u64> = p["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["preemptions"].as_u64() > Some(0))
        .map(|t| t["index"].as_u64().unwrap())
        .collect();
    assert!(!preempted.is_empty());
    let mut combos = Vec::new();
    for i in 0..4 {
        let result: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(format!("trial-{i}.json"))).unwrap())
                .unwrap();
        combos.push(format!(
            "{}/{}",
            result["params"]["lr"].as_str().unwrap(),
            result["params"]["batch"].as_str().unwrap()
        ));
        assert!(result["accuracy"].as_f64().unwrap() > 0.5, "{result}");
        if preempted.contains(&i) {
            assert!(result["attempt"].as_u64().unwrap() >= 2);
        }
    }
    assert_eq!(combos, ["0.3/16", "0.3/64", "0.03/16", "0.03/64"]);
    for t in p["tasks"].as_array().unwrap() {
        let id = t["id"].as_u64().unwrap();
        if preempted.contains(&t["index"].as_u64().unwrap()) {
            let resumed =
                c.output(id).lines().any(|l| l.contains("from step") && !l.ends_with("from step 0"));
            assert!(resumed, "trial {id} did not resume: {}", c.output(id));
        }
    }
}

#[test]
fn preprocessing_chunks_survive_preemption_with_idempotent_outputs() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let out = c.dir.join("features");
    let script = example("preprocess.py");
    let out_arg = out.to_str().unwrap();
    // A chunk's rows take 1.1 s after its imports: the notice, sent half a
    // second into the first two, comes while they work. (At the default 2
    // ms a row, a chunk was done 1.15 s after its start, and a notice sent
    // 0.9 s in could find both chunks finishing, which then completed.)
    let first = c.submit(&[
        "--array",
        "0-7",
        "--",
        "python3",
        &script,
        "--chunks",
        "8",
        "--row-seconds",
        "0.005",
        "--out",
        out_arg,
    ]);
    wait_for("two chunks to run", Duration::from_secs(60), || {
        (c.job(first)["progress"]["states"]["running"] == 2).then_some(())
    });
    // A chunk drained at any point, before its first row or mid-way,
    // writes nothing and is redone whole.
    c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "0.3"]);
    let p = c.wait_job(first, "all chunks", Duration::from_secs(120), |j| j["progress"]["done"] == 8)
        ["progress"]
        .clone();
    let preempted: u64 =
        p["tasks"].as_array().unwrap().iter().map(|t| t["preemptions"].as_u64().unwrap()).sum();
    assert!(preempted >= 1);
    // The chunks put together are the whole data set, standardised.
    let check = r#"
import sys, numpy as np
from sklearn.datasets import load_digits
x = load_digits().data
want = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
got = np.concatenate([np.load(f"{sys.argv[1]}/chunk-{i:05d}.npy") for i in range(8)])
sys.exit(0 if np.array_equal(got, want) else 1)
"#;
    let status = python().args(["-c", check, out_arg]).status().unwrap();
    assert!(status.success(), "preprocessed chunks differ from a direct computation");
}

/// The gang tests take turns: one of them holds port 29500, where every
/// cluster's first gang would meet.
pub(crate) static GANG_PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_gang_gets_torchrun_variables_starts_together_and_drains_together() {
    let _turn = GANG_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::start(Options { nodes: 2, gpus: 2, ..Options::default() });
    let script = r#"env > "$EBB_CHECKPOINT_DIR/env-$EBB_NODE-$EBB_ATTEMPT"
trap 'if [ "$NODE_RANK" = 1 ]; then sleep 1; fi; touch "$EBB_CHECKPOINT_DIR/term-$EBB_NODE-$EBB_ATTEMPT"; exit 0' TERM
while :; do sleep 0.05; done"#;
    // Rank 1 takes a second to save: rank 0's exit must not cut it short.
    let gang = c.submit(&["--gpus", "4", "--name", "gang", "--", "bash", "-c", script]);
    let ckpt = c.checkpoints(gang);
    let envs: Vec<_> = ["node-0", "node-1"]
        .iter()
        .map(|n| {
            let path = ckpt.join(format!("env-{n}-1"));
            wait_for("both parts to start", Duration::from_secs(20), || {
                std::fs::metadata(&path).ok().filter(|m| m.len() > 0).map(|_| read_env(&path))
            })
        })
        .collect();
    let job = c.wait_state(gang, "running");
    assert_eq!(job["placement"].as_array().unwrap().len(), 2);
    let mut ranks: Vec<String> = envs.iter().map(|e| e["NODE_RANK"].clone()).collect();
    ranks.sort();
    assert_eq!(ranks, ["0", "1"]);
    for env in &envs {
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["MASTER_PORT"], envs[0]["MASTER_PORT"]);
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["NNODES"], "2");
        assert_eq!(env["PET_NPROC_PER_NODE"], "2");
        assert_eq!(env["PET_MASTER_PORT"], env["MASTER_PORT"]);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0,1");
        assert!(env["EBB_CHECKPOINT_INTERVAL_S"].parse::<u64>().unwrap() >= 10);
    }
    // An on-demand job needing one node drains the whole gang, on both nodes.
    c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "0.3"]);
    for n in ["node-0", "node-1"] {
        let term = ckpt.join(format!("term-{n}-1"));
        wait_for("the drain on both nodes", Duration::from_secs(20), || term.exists().then_some(()));
    }
    let job = c.wait_job(gang, "requeued and back", Duration::from_secs(30), |j| {
        j["preemptions"] == 1 && j["state"] == "running"
    });
    assert_eq!(job["attempt"], 2);
    assert_eq!(event_details(&job, "drain_notice").len(), 1, "one notice for the gang");
}

#[test]
fn serving_on_demand_is_never_drained_while_batch_work_is() {
    let c = Cluster::start(Options { nodes: 1, gpus: 4, ..Options::default() });
    let serve = c.submit(&[
        "--tier",
        "on-demand",
        "--restart",
        "always",
        "--name",
        "digits-api",
        "--",
        "python3",
        &example("serve.py"),
    ]);
    let port_file = c.checkpoints(serve).join("port");
    let port: u16 = wait_for("the server to listen", Duration::from_secs(60), || {
        std::fs::read_to_string(&port_file).ok()?.trim().parse().ok()
    });
    let batch = c.submit(&["--array", "0-5", "--", "bash", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]);
    wait_for("batch on the other GPUs", Duration::from_secs(20), || {
        (c.job(batch)["progress"]["states"]["running"] == 3).then_some(())
    });
    // More on-demand work: batch tasks are drained, the server is not.
    c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "1"]);
    wait_for("batch preempted", Duration::from_secs(20), || {
        let p = c.job(batch)["progress"].clone();
        let preempted: u64 = p["tasks"].as_array()?.iter().map(|t| t["preemptions"].as_u64().unwrap()).sum();
        (preempted >= 2).then_some(())
    });
    let answer: Value =
        reqwest::blocking::get(format!("http://127.0.0.1:{port}/predict?row=17")).unwrap().json().unwrap();
    assert_eq!(answer["row"], 17);
    let server = c.job(serve);
    assert_eq!((server["state"].as_str(), server["attempt"].as_u64()), (Some("running"), Some(1)));
    assert!(!events(&server).contains(&"drain_notice".to_string()));
    c.ebb(&["cancel", &serve.to_string()]);
    c.wait_state(serve, "cancelled");
}

/// `ebb submit --gpus 4 -- bash -c 'if [ "$NODE_RANK" = 0 ]; then sleep 3;
/// fi; echo done'` on nodes of 2 GPUs: when rank 1 exited 0 the server
/// stopped rank 0 at once, rank 0 never printed, and the job succeeded. A
/// gang ends when all its parts have: rank 0 finishes and both print.
#[test]
fn a_gang_whose_rank_0_finishes_last_waits_for_it_and_succeeds_only_with_every_part() {
    let _turn = GANG_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::start(Options { nodes: 2, gpus: 2, ..Options::default() });
    let script = r#"if [ "$NODE_RANK" = 0 ]; then sleep 3; fi; echo "done $NODE_RANK""#;
    let gang = c.submit(&["--gpus", "4", "--", "bash", "-c", script]);
    let job = c.wait_job(gang, "its end", Duration::from_secs(60), |j| {
        ["succeeded", "failed"].contains(&j["state"].as_str().unwrap())
    });
    assert_eq!(job["state"], "succeeded", "{job}");
    let out = c.output(gang);
    assert!(out.contains("done 0") && out.contains("done 1"), "rank 0 was cut short: {out:?}");

    // With a grace shorter than rank 0's work, rank 0 is stopped and the
    // gang fails saying why: never a success with rank 0 killed.
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: 2,
        server_args: vec!["--gang-exit-grace".into(), "1s".into()],
        ..Options::default()
    });
    let script = r#"if [ "$NODE_RANK" = 0 ]; then sleep 30; fi; echo "done $NODE_RANK""#;
    let gang = c.submit(&["--gpus", "4", "--", "bash", "-c", script]);
    let job = c.wait_job(gang, "its end", Duration::from_secs(60), |j| {
        ["succeeded", "failed"].contains(&j["state"].as_str().unwrap())
    });
    assert_eq!(job["state"], "failed", "{job}");
    let stopped = event_details(&job, "gang_stopped");
    assert!(stopped[0]["reason"].as_str().unwrap().contains("gang exit grace of 1.0s"), "{job}");
    assert!(!c.output(gang).contains("done 0"));
    let shown = c.ebb(&["show", &gang.to_string()]);
    assert!(shown.contains("gang exit grace"), "{shown}");
}

/// With another program listening on 29500 (a second `ebb up` on the
/// host, say), a gang given MASTER_PORT 29500 failed with EADDRINUSE and
/// was not retried. The first node's agent checks the port before the
/// start: the gang is requeued, uncounted, and meets on another port.
#[test]
fn a_gang_starts_with_port_29500_taken() {
    let _turn = GANG_PORT.lock().unwrap_or_else(|e| e.into_inner());
    // Held for the test; if something else holds it already, so much the better.
    let _taken = std::net::TcpListener::bind(("0.0.0.0", 29500));
    let c = Cluster::start(Options { nodes: 2, gpus: 2, ..Options::default() });
    let script = r#"
import os, socket
if os.environ["NODE_RANK"] == "0":
    s = socket.socket()
    s.bind(("", int(os.environ["MASTER_PORT"])))
    s.listen()
print("rank", os.environ["NODE_RANK"], "on", os.environ["MASTER_PORT"], flush=True)
"#;
    let gang = c.submit(&["--gpus", "4", "--", "python3", "-c", script]);
    let job = c.wait_job(gang, "its end", Duration::from_secs(60), |j| {
        ["succeeded", "failed"].contains(&j["state"].as_str().unwrap())
    });
    assert_eq!(job["state"], "succeeded", "{job}\n{}", c.output(gang));
    assert_eq!(
        (job["attempt"].as_u64(), job["retries"].as_u64(), job["preemptions"].as_u64()),
        (Some(2), Some(0), Some(0))
    );
    let out = c.output(gang);
    assert!(out.contains("rendezvous port 29500 (MASTER_PORT) is in use"), "{out}");
    assert!(out.contains("rank 0 on 29501") && out.contains("rank 1 on 29501"), "{out}");
}

/// `ebb logs` of a gang interleaved its nodes' output mid-line, with no
/// node named. Each line is whole now, and `--label` names its node.
#[test]
fn a_gangs_log_keeps_lines_whole_and_labels_them_with_their_node() {
    let _turn = GANG_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::start(Options { nodes: 2, gpus: 2, ..Options::default() });
    // Each line written in two pieces, both ranks at once.
    let script = r#"for i in $(seq 30); do printf "rank $NODE_RANK "; sleep 0.01; printf "line $i\n"; done"#;
    let gang = c.submit(&["--gpus", "4", "--", "bash", "-c", script]);
    c.wait_state(gang, "succeeded");
    let log = c.output(gang);
    assert_eq!(log.lines().count(), 60, "{log}");
    for line in log.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        assert!(
            words.len() == 4 && words[0] == "rank" && words[2] == "line",
            "a line made of two nodes' pieces: {line:?}\n{log}"
        );
    }
    let labelled = c.ebb(&["logs", "--label", &gang.to_string()]);
    assert_eq!(labelled.lines().count(), 60, "{labelled}");
    let mut rank_node = std::collections::BTreeMap::new();
    for line in labelled.lines() {
        let (node, rest) = line.split_once(": ").unwrap_or_else(|| panic!("no label: {line:?}"));
        assert!(node == "node-0" || node == "node-1", "{line:?}");
        let rank = rest.split(' ').nth(1).unwrap().to_string();
        let seen = rank_node.entry(rank).or_insert_with(|| node.to_string());
        assert_eq!(seen, node, "one rank's lines from two nodes: {labelled}");
    }
    assert_eq!(rank_node.len(), 2, "both ranks' lines: {labelled}");
}

/// Training that logs to Weights & Biases (the `wandb` package, offline):
/// each attempt calls a bare `wandb.init()`, notes the run it got, and
/// saves at the notice.
const TRACKED: &str = r#"
import os, signal, sys, time
import wandb
d, attempt = os.environ["EBB_CHECKPOINT_DIR"], os.environ["EBB_ATTEMPT"]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
run = wandb.init(project="ebb", dir=d, mode="offline")
run.log({"attempt": int(attempt)})
with open(f"{d}/run-{attempt}", "w") as f:
    f.write(f"{os.environ['EBB_RUN_ID']} {os.environ['WANDB_RUN_ID']} {run.id}\n")
while attempt != "3" and not stop:
    time.sleep(0.05)
run.finish()
"#;

#[test]
fn a_job_preempted_twice_is_one_run_in_its_tracker() {
    let c = Cluster::start(Options { nodes: 1, gpus: 1, drain_window: "20s", ..Options::default() });
    let job = c.submit(&["--env", "WANDB_SILENT=true", "--", "python3", "-c", TRACKED]);
    let run = |attempt: u32| {
        let path = c.checkpoints(job).join(format!("run-{attempt}"));
        wait_for(&format!("attempt {attempt}'s run"), Duration::from_secs(60), || {
            let line = std::fs::read_to_string(&path).ok().filter(|s| s.ends_with('\n'))?;
            Some(line.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        })
    };
    let first = run(1);
    for attempt in 2..=3 {
        c.submit(&["--tier", "on-demand", "--", "sleep", "0.2"]);
        assert_eq!(run(attempt), first, "attempt {attempt}: EBB_RUN_ID, WANDB_RUN_ID and wandb's run id");
    }
    let done = c.wait_job(job, "succeeded", Duration::from_secs(60), |j| j["state"] == "succeeded");
    assert_eq!(done["preemptions"], 2);
    let id = &first[0];
    assert!(id.starts_with(&format!("ebb-{job}-")), "{id}");
    assert!(first.iter().all(|x| x == id), "{first:?}");
    assert_eq!(done["run_id"], id.as_str());
    let shown = c.ebb(&["show", &job.to_string()]);
    assert!(shown.contains(&format!("run          {id}  (EBB_RUN_ID of every attempt")), "{shown}");
    // wandb kept each attempt's offline log under the one run's id: what
    // `wandb sync` uploads as one run.
    let logs: Vec<String> = std::fs::read_dir(c.checkpoints(job).join("wandb"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("offline-run-"))
        .collect();
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert!(logs.iter().all(|name| name.ends_with(&format!("-{id}"))), "{logs:?}");
}
