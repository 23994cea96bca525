//! Checkpoints that follow the job (`ebb server --checkpoint-store`): every
//! agent has a checkpoint root of its own, as nodes without shared storage
//! do, and a job preempted on one node resumes on another from the store
//! — a directory (`file://`) or a real S3-compatible service on loopback
//! (moto's server) — never from a partial upload or a damaged object.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::support;
use crate::support::{wait_for, Cluster, Options, RunAs};

/// A job that resumes from the newest `ckpt-<step>.ckpt` in its checkpoint
/// directory (checking its content), then saves a step every 0.3 s as the
/// contract says (temporary, fsync, rename, report), and at SIGTERM saves
/// once more and exits.
const JOB: &str = r#"
import json, os, signal, sys, time, urllib.request
d = os.environ["EBB_CHECKPOINT_DIR"]
url = os.environ["EBB_METADATA_URL"]
size = int(os.environ.get("CKPT_BYTES", "4096"))
def body(step):
    return (b"%012d" % step) * (size // 12)
def post(path, doc):
    req = urllib.request.Request(url + path, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
steps = sorted(int(f[5:-5]) for f in os.listdir(d) if f.startswith("ckpt-") and f.endswith(".ckpt"))
step = 0
if steps:
    step = steps[-1]
    with open(os.path.join(d, "ckpt-%d.ckpt" % step), "rb") as f:
        assert f.read() == body(step), "checkpoint %d is damaged" % step
    print("resumed from step %d on %s" % (step, os.environ["EBB_NODE"]), flush=True)
    post("/ebb/v1/resumed", {"step": step})
else:
    print("fresh start on %s" % os.environ["EBB_NODE"], flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
def save(step):
    tmp = os.path.join(d, ".ckpt-%d.tmp" % step)
    with open(tmp, "wb") as f:
        f.write(body(step)); f.flush(); os.fsync(f.fileno())
    os.rename(tmp, os.path.join(d, "ckpt-%d.ckpt" % step))
    for old in os.listdir(d):
        if old.startswith("ckpt-") and old.endswith(".ckpt") and int(old[5:-5]) < step - 1:
            os.remove(os.path.join(d, old))
    post("/ebb/v1/checkpoint", {"step": step, "bytes": size, "seconds": 0.01})
while True:
    step += 1
    save(step)
    print("saved step %d" % step, flush=True)
    if stop:
        sys.exit(0)
    for _ in range(3):
        if stop: break
        time.sleep(0.1)
"#;

fn write_job(c: &Cluster) -> String {
    let path = c.submit_dir().join("job.py");
    std::fs::write(&path, JOB).unwrap();
    path.to_str().unwrap().to_string()
}

fn submit(c: &Cluster, bytes: usize) -> u64 {
    let job = write_job(c);
    let env = format!("CKPT_BYTES={bytes}");
    c.submit(&["--gpus", "1", "--env", &env, "--", "python3", &job])
}

/// The node job `id` runs on now.
fn node_of(c: &Cluster, id: u64) -> String {
    let job = c.wait_job(id, "running", Duration::from_secs(30), |j| {
        j["state"] == "running" && j["placement"].as_array().is_some_and(|p| !p.is_empty())
    });
    job["placement"][0]["node"].as_str().unwrap().to_string()
}

/// Waits for the job's log to say `text`; returns the log.
fn wait_log(c: &Cluster, id: u64, text: &str, timeout: Duration) -> String {
    wait_for(&format!("job {id}'s log to say {text:?}"), timeout, || {
        let out = c.output(id);
        out.contains(text).then_some(out)
    })
}

/// The step a log line `prefix<step>...` names, the last such line.
fn last_step(log: &str, prefix: &str) -> u64 {
    let line = log.lines().rev().find_map(|l| l.split(prefix).nth(1)).expect(prefix);
    line.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn file_store(c_dir: &Path) -> (PathBuf, Vec<String>) {
    let store = c_dir.join("store");
    (store.clone(), vec!["--checkpoint-store".into(), format!("file://{}", store.display())])
}

fn cluster_with_store(server_args: Vec<String>, agent_env: Vec<(String, String)>) -> Cluster {
    Cluster::start(Options {
        nodes: 2,
        gpus: 1,
        drain_window: "20s",
        heartbeat_timeout: "2s",
        server_args,
        own_checkpoint_roots: true,
        agent_env,
        ..Options::default()
    })
}

/// The cluster's temporary directory before it starts, for a store inside it.
fn store_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ebb-store-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Drains `from`, so the job moves to the other node, and returns the
/// log once it has resumed there and the step it resumed from.
fn move_job(c: &Cluster, id: u64, from: &str) -> (String, u64) {
    c.ebb(&["drain", from]);
    let log = wait_log(c, id, "resumed from step", Duration::from_secs(60));
    (log.clone(), last_step(&log, "resumed from step "))
}

/// Alice's job: weights in its checkpoint directory, reported as a
/// checkpoint, then it waits.
const ALICE: &str = r#"echo "alice's weights" > "$EBB_CHECKPOINT_DIR/weights.bin"
python3 -c 'import os, urllib.request; urllib.request.urlopen(urllib.request.Request(os.environ["EBB_METADATA_URL"] + "/ebb/v1/checkpoint", b"{\"step\": 1}", {"Content-Type": "application/json"})).read()'
exec sleep 600"#;

/// Bob's job: every file of the store it can read, printed.
const BOB: &str = r#"find "$STORE" -type f 2> /dev/null | while read -r f; do cat "$f" 2> /dev/null; done
echo probed"#;

/// The root agent made a `file://` store's blobs 0644 under 0755
/// directories (no umask), and Bob's job printed Alice's weights. What the
/// store keeps of a job is 0600 and 0700 now, owned by the job's user.
#[test]
fn another_tenants_job_cannot_read_a_jobs_checkpoint_in_a_file_store() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let base = store_dir();
    let (store, args) = file_store(&base);
    let c = Cluster::start(Options {
        nodes: 1,
        gpus: 2,
        server_args: args,
        run_as: Some(RunAs { tenants: vec![], default: None }),
        ..Options::default()
    });
    let token = |name: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let id = c.submit_as(&alice, &["--", "bash", "-c", ALICE]);
    wait_log(&c, id, "checkpoint store: stored", Duration::from_secs(30));
    let store_env = format!("STORE={}", store.display());
    let probe = c.submit_as(&bob, &["--env", &store_env, "--", "bash", "-c", BOB]);
    c.wait_state(probe, "succeeded");
    let out = c.output(probe);
    assert!(!out.contains("alice's weights"), "bob's job read alice's checkpoint: {out}");
    assert_eq!(out, "probed\n", "bob's job read something of the store");
    // Every blob and manifest of alice's is hers alone.
    let alice_uid = std::fs::metadata(c.checkpoints(id)).unwrap().uid();
    let mut checked = 0;
    let mut todo = vec![store.join("alice")];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        assert_eq!((meta.permissions().mode() & 0o777, meta.uid()), (want, alice_uid), "{}", path.display());
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        checked += 1;
    }
    assert!(checked >= 6, "the tenant's and job's directories, blobs and manifests: {checked}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_preempted_job_resumes_on_another_node_from_a_file_store_and_refuses_a_damaged_object() {
    let base = store_dir();
    let (store, args) = file_store(&base);
    let c = cluster_with_store(args, Vec::new());
    let id = submit(&c, 64 * 1024);
    let first = node_of(&c, id);
    wait_log(&c, id, "ebb: checkpoint store: stored step 3", Duration::from_secs(30));

    // Preempted on the first node: its save at the notice is stored before
    // the exit is reported, and the job resumes from it on the other.
    let (log, resumed) = move_job(&c, id, &first);
    let second = node_of(&c, id);
    assert_ne!(first, second);
    let saved_at_exit = last_step(log.split("resumed from step").next().unwrap(), "saved step ");
    assert_eq!(resumed, saved_at_exit, "resumed from the save at the notice\n{log}");
    assert!(log.contains(&format!("ebb: checkpoint store: restored step {resumed}")), "{log}");
    assert!(log.contains(&format!("resumed from step {resumed} on {second}")), "{log}");
    // The timeline says which checkpoint attempt 2 started from, before
    // its start; attempt 1 found nothing to restore.
    let job = c.job(id);
    assert_eq!(job["attempt"].as_u64(), Some(2), "{job}");
    assert_eq!(timeline(&job, "restored", 1), None, "{job}");
    let (at, restored) = timeline(&job, "restored", 2).expect("a restored event");
    let (started_at, _) = timeline(&job, "started", 2).expect("a started event");
    assert!(at < started_at, "{job}");
    let d = &restored["detail"];
    assert_eq!((d["step"].as_u64(), d["from_attempt"].as_u64()), (Some(resumed), Some(1)), "{restored}");
    assert_eq!(d["node"].as_str(), Some(second.as_str()), "{restored}");
    let files = d["files"].as_u64().unwrap();
    assert!(files >= 1 && d["bytes"].as_u64() == Some(files * 65_532), "{restored}");
    let shown = c.ebb(&["show", &id.to_string()]);
    let line = format!(
        "restored         step {resumed} (attempt 1, upload {}) from the checkpoint store on {second}: ",
        d["upload"]
    );
    assert!(shown.contains(&line), "{line:?} not in:\n{shown}");
    // No storage was shared: the first node's directory never reached the second's.
    let dirs: Vec<PathBuf> =
        (0..2).map(|i| c.checkpoint_root(i).join("default").join(id.to_string())).collect();
    assert!(dirs.iter().all(|d| d.is_dir()));

    // Preempt it again with nowhere to go, damage the newest checkpoint's
    // file in the store, and let it run on the first node again.
    c.ebb(&["drain", &second]);
    c.wait_job(id, "requeued", Duration::from_secs(30), |j| j["state"] == "queued");
    let manifests = store.join(format!("default/{id}/manifests"));
    let newest = newest_manifest(&manifests);
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&newest).unwrap()).unwrap();
    let newest_step = manifest["step"].as_u64();
    for file in manifest["files"].as_array().unwrap() {
        let blob = store.join(format!("default/{id}/blobs/{}", file["sha256"].as_str().unwrap()));
        let mut bytes = std::fs::read(&blob).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(&blob, bytes).unwrap();
    }
    let before = c.output(id).len();
    c.ebb(&["undrain", &first]);
    let log = wait_for("the third attempt to resume", Duration::from_secs(60), || {
        let log = c.output(id);
        log[before..].contains("resumed from step").then(|| log[before..].to_string())
    });
    let refused = log.lines().find(|l| l.contains("checkpoint store: refused")).expect(&log);
    assert!(
        refused.contains("is not what its manifest says") && refused.contains("trying the one before"),
        "{refused}"
    );
    let again = last_step(&log, "resumed from step ");
    assert!(
        newest_step.is_none_or(|s| again < s),
        "resumed from {again}, not the damaged {newest_step:?}\n{log}"
    );
    assert!(log.contains(&format!("restored step {again}")), "{log}");
    let job = c.job(id);
    let (_, restored) = timeline(&job, "restored", 3).expect("a restored event");
    assert_eq!(
        restored["detail"]["step"].as_u64(),
        Some(again),
        "the checkpoint before the damaged one: {restored}"
    );
    c.ebb(&["cancel", &id.to_string()]);
    let _ = std::fs::remove_dir_all(&base);
}

/// The first event of `kind` in attempt `attempt`'s timeline, with its
/// place in the timeline.
fn timeline(job: &serde_json::Value, kind: &str, attempt: u64) -> Option<(usize, serde_json::Value)> {
    let events = job["events"].as_array().unwrap();
    let found = events.iter().enumerate().find(|(_, e)| e["kind"] == kind && e["attempt"] == attempt);
    found.map(|(i, e)| (i, e.clone()))
}

fn newest_manifest(dir: &Path) -> PathBuf {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    names.retain(|p| p.extension().is_some_and(|e| e == "json"));
    names.sort();
    names.pop().expect("a manifest")
}

/// Hashes named by the job's manifests, and every blob stored.
fn store_contents(store: &Path, id: u64) -> (Vec<String>, Vec<String>) {
    let mut named = Vec::new();
    for entry in
        std::fs::read_dir(store.join(format!("default/{id}/manifests"))).into_iter().flatten().flatten()
    {
        let Ok(bytes) = std::fs::read(entry.path()) else { continue };
        let Ok(m) = serde_json::from_slice::<serde_json::Value>(&bytes) else { continue };
        named
            .extend(m["files"].as_array().unwrap().iter().map(|f| f["sha256"].as_str().unwrap().to_string()));
    }
    let blobs = std::fs::read_dir(store.join(format!("default/{id}/blobs")))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 64)
        .collect();
    (named, blobs)
}

#[test]
fn an_agent_killed_mid_upload_leaves_the_previous_checkpoint_as_the_latest() {
    let base = store_dir();
    let (store, args) = file_store(&base);
    // Each stored blob waits 1.5 s before the next step of its upload, so
    // the test can kill the agent between a blob and its manifest.
    let mut c = cluster_with_store(args, vec![("EBB_X_CHECKPOINT_PAUSE_MS".into(), "1500".into())]);
    let id = submit(&c, 4096);
    let first = node_of(&c, id);
    let i: usize = first.trim_start_matches("node-").parse().unwrap();
    // A complete checkpoint, then a blob of a later one without its manifest.
    let latest = wait_for("an upload half done", Duration::from_secs(60), || {
        let (named, blobs) = store_contents(&store, id);
        let dir = store.join(format!("default/{id}/manifests"));
        let partial = blobs.iter().any(|b| !named.contains(b));
        (!named.is_empty() && partial).then(|| newest_manifest(&dir))
    });
    c.kill_agent(i); // SIGKILL
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&latest).unwrap()).unwrap();
    let complete_step = manifest["step"].as_u64().unwrap();
    let (named, blobs) = store_contents(&store, id);
    assert!(blobs.iter().any(|b| !named.contains(b)), "the cut-off upload left a blob without a manifest");

    // The node is lost; the job resumes on the other from the last
    // complete checkpoint.
    let log = wait_log(&c, id, "resumed from step", Duration::from_secs(60));
    assert_eq!(last_step(&log, "resumed from step "), complete_step, "{log}");
    assert!(log.contains(&format!("ebb: checkpoint store: restored step {complete_step}")), "{log}");
    // The killed agent's job is still running on its node: a restarted
    // agent kills what its previous life left.
    c.start_agent(i);
    c.ebb(&["cancel", &id.to_string()]);
    let _ = std::fs::remove_dir_all(&base);
}

/// moto's S3 server on a free loopback port, stopped when dropped.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("python3")
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 with moto[server] (scripts/test installs it)");
    let endpoint = format!("http://127.0.0.1:{port}");
    let http = reqwest::blocking::Client::new();
    wait_for("moto to answer", Duration::from_secs(30), || http.get(&endpoint).send().ok());
    Moto { child, endpoint }
}

const KEYS: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];

#[test]
fn a_preempted_job_resumes_on_another_node_from_an_s3_store() {
    let s3 = moto();
    // The bucket, made as an operator would (moto takes unsigned requests).
    let made = reqwest::blocking::Client::new().put(format!("{}/ckpts", s3.endpoint)).send().unwrap();
    assert!(made.status().is_success(), "{:?}", made.text());
    let base = store_dir();
    let credentials = base.join("credentials");
    std::fs::write(&credentials, "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        .unwrap();
    let args = vec![
        "--checkpoint-store".into(),
        "s3://ckpts/cluster-a".into(),
        "--checkpoint-store-endpoint".into(),
        s3.endpoint.clone(),
        "--checkpoint-store-credentials".into(),
        credentials.to_str().unwrap().into(),
    ];
    let env = KEYS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let c = cluster_with_store(args, env);
    let id = submit(&c, 1 << 20);
    let first = node_of(&c, id);
    wait_log(&c, id, "ebb: checkpoint store: stored step 2", Duration::from_secs(30));
    let (log, resumed) = move_job(&c, id, &first);
    assert_ne!(node_of(&c, id), first);
    let saved_at_exit = last_step(log.split("resumed from step").next().unwrap(), "saved step ");
    assert_eq!(resumed, saved_at_exit, "{log}");
    // From the store: the step as reported, or, when the report of the
    // save at notice was still on its way as the job exited, the state
    // the agent stored at the exit (a loaded machine).
    assert!(
        log.contains(&format!("ebb: checkpoint store: restored step {resumed}"))
            || log.contains("ebb: checkpoint store: restored the state at exit"),
        "{log}"
    );
    // Objects are kept under the job's tenant and id.
    let listing = reqwest::blocking::get(format!(
        "{}/ckpts?list-type=2&prefix=cluster-a/default/{id}/manifests/",
        s3.endpoint
    ))
    .unwrap()
    .text()
    .unwrap();
    assert!(listing.contains("<Key>cluster-a/default/"), "{listing}");
    c.ebb(&["cancel", &id.to_string()]);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_bad_checkpoint_store_stops_the_server_at_start_naming_the_flag() {
    let s3 = moto();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let dir = store_dir();
        let out = Command::new(support::ebb_exe())
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir", dir.join("server").to_str().unwrap()])
            .args(args)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--checkpoint-store", "gcs://b/p"], &[]);
    assert!(err.contains("--checkpoint-store gcs://b/p: unknown scheme gcs://"), "{err}");
    let err = run(&["--checkpoint-store", "s3://b"], &[]);
    assert!(err.contains("no credentials") && err.contains("--checkpoint-store-credentials"), "{err}");
    let ep = s3.endpoint.as_str();
    let err = run(&["--checkpoint-store", "s3://no-such-bucket/p", "--checkpoint-store-endpoint", ep], &KEYS);
    assert!(
        err.contains("--checkpoint-store s3://no-such-bucket/p at http") && err.contains("NoSuchBucket"),
        "{err}"
    );
    let err =
        run(&["--checkpoint-store", "s3://b/p", "--checkpoint-store-endpoint", "http://127.0.0.1:9"], &KEYS);
    assert!(err.contains("--checkpoint-store s3://b/p at http://127.0.0.1:9"), "{err}");
}
