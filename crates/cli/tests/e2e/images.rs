//! Jobs in container images, end to end: a real registry on loopback
//! (Debian's `docker-registry`), images built by `umoci` and pushed by
//! `skopeo`, root agents running them through `runc`, tenants who share
//! the Unix user `nobody`.

use std::path::Path;
use std::time::Duration;

use crate::support;
use crate::support::{wait_for, Cluster, Options, RunAs};
use ebb_image::testing::{push_busybox_image, File, Registry, PASSWORD};
use serde_json::Value;

const TRAIN: &str = r#"#!/bin/sh
echo "uid=$(id -u) marker=$(cat /marker) gpus=$CUDA_VISIBLE_DEVICES host=$(test -e /usr/bin/python3 && echo seen || echo unseen)"
step=0
if [ -f "$EBB_CHECKPOINT_DIR/step" ]; then step=$(cat "$EBB_CHECKPOINT_DIR/step"); echo "resumed from $step"; fi
trap 'echo $step > "$EBB_CHECKPOINT_DIR/step"; echo "saved $step"; exit 0' TERM
while true; do step=$((step+1)); sleep 0.1; done
"#;

/// Ignores the drain signal, with a `setsid` child that does too.
const STUBBORN: &str = r#"#!/bin/sh
setsid sh -c "trap '' TERM; while true; do sleep 1; done # $1" &
trap "" TERM
echo started
while true; do sleep 1; done
"#;

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn image_files() -> Vec<File<'static>> {
    vec![
        File { path: "/marker", contents: b"first", mode: 0o644 },
        File { path: "/train.sh", contents: TRAIN.as_bytes(), mode: 0o755 },
        File { path: "/stubborn.sh", contents: STUBBORN.as_bytes(), mode: 0o755 },
    ]
}

fn tenant(c: &Cluster, name: &str) -> String {
    let made: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
    made["token"].as_str().unwrap().to_string()
}

fn event<'a>(job: &'a Value, kind: &str) -> Vec<&'a Value> {
    job["events"].as_array().unwrap().iter().filter(|e| e["kind"] == kind).collect()
}

fn wait_output(c: &Cluster, id: u64, text: &str) -> String {
    wait_for(&format!("job {id} to print {text:?}"), Duration::from_secs(60), || {
        let out = c.output(id);
        out.contains(text).then_some(out)
    })
}

/// The processes on this machine whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn jobs_run_in_their_images_resume_on_another_node_and_tenants_cannot_see_each_other() {
    let work = std::env::temp_dir().join(format!("ebb-images-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let open = Registry::start(&work.join("open"));
    let locked = Registry::start_with_login(&work.join("locked"));
    let train = push_busybox_image(&work, &open.host, "train", "v1", &image_files(), None);
    let private =
        push_busybox_image(&work, &locked.host, "private", "v1", &image_files(), Some(("alice", PASSWORD)));
    // Both registries are on loopback: allowed, they are reached over plain
    // HTTP without --insecure-registry, as Docker reaches them.
    let named = |flag: &str| [flag.to_string(), open.host.clone(), flag.to_string(), locked.host.clone()];
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: 4,
        drain_window: "3s",
        // Both tenants run as nobody: only the containers keep them apart.
        run_as: Some(RunAs { tenants: vec![("alice", "nobody"), ("bob", "nobody")], default: None }),
        agent_args: named("--allowed-registry").into_iter().map(leak).collect(),
        server_args: named("--allowed-registry").to_vec(),
        ..Options::default()
    });
    let alice = tenant(&c, "alice");
    let bob = tenant(&c, "bob");

    // Refused at submit: an image the registry lacks, one without a host.
    let missing = format!("{}/train:v9", open.host);
    let out = c.ebb_as(&alice, &["submit", "--image", &missing, "--", "/train.sh"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(&format!("image {missing}: not found in the registry")), "{said}");
    let out = c.ebb_as(&alice, &["submit", "--image", "train:v1", "--", "/train.sh"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the registry"));
    assert!(c.jobs().is_empty(), "nothing was accepted");

    // A preemptible job in its image: the image's files, not the node's,
    // as the tenant's user (nobody), with its GPUs.
    let job = c.submit_as(
        &alice,
        &["--image", &train, "--gpus", "2", "--env", "SECRET_A=alice-secret", "--", "/train.sh"],
    );
    let first = wait_output(&c, job, "uid=");
    assert!(first.contains("uid=65534 marker=first"), "{first}");
    assert!(first.contains("host=unseen"), "the node's files are not in the container: {first}");
    let shown = c.job(job);
    let gpus = &shown["placement"][0]["gpus"];
    let visible: Vec<String> = gpus.as_array().unwrap().iter().map(|g| g.to_string()).collect();
    assert!(first.contains(&format!("gpus={}", visible.join(","))), "{first}");
    let digest = shown["image"]["digest"].as_str().unwrap().to_string();
    assert_eq!(shown["image"]["reference"], train.as_str());
    let pulled = event(&shown, "pulled");
    assert!(pulled[0]["detail"]["downloaded_bytes"].as_u64().unwrap() > 500_000, "{pulled:?}");
    let show_text =
        String::from_utf8_lossy(&c.ebb_as(&alice, &["show", &job.to_string()]).stdout).to_string();
    assert!(show_text.contains(&format!("image        {train}  ({digest})")), "{show_text}");

    // Tenant B, also nobody, in the same image on a node that has it: it
    // pulls nothing, and sees none of A's processes, environment or
    // checkpoints.
    let blobs = open.blob_gets();
    let alice_checkpoints = c.checkpoints(job);
    let spy = format!(
        "echo processes=$(ls -d /proc/[0-9]* | wc -l); \
         echo secrets=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c alice-secret); \
         ls {} 2>&1; echo done",
        alice_checkpoints.display()
    );
    let peek = c.submit_as(&bob, &["--image", &train, "--", "sh", "-c", &spy]);
    let seen = c.wait_state(peek, "succeeded");
    let said = c.output(peek);
    assert!(said.contains("secrets=0"), "{said}");
    assert!(said.contains("No such file or directory"), "A's checkpoints are not in B's container: {said}");
    let processes: usize =
        said.split("processes=").nth(1).unwrap().lines().next().unwrap().trim().parse().unwrap();
    assert!(processes <= 5, "only its own processes: {said}");
    assert_eq!(open.blob_gets(), blobs, "the second job's node pulled nothing");
    assert_eq!(event(&seen, "pulled")[0]["detail"]["downloaded_bytes"], 0);

    // Preempted by on-demand work: the job saves inside the container, and
    // attempt 2, on the other node, resumes from it.
    let from = shown["placement"][0]["node"].as_str().unwrap().to_string();
    let filler = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "300"]);
    let filler_node = c.wait_state(filler, "running")["placement"][0]["node"].as_str().unwrap().to_string();
    assert_ne!(filler_node, from, "the filler takes the other node whole");
    let preemptor = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "300"]);
    let requeued = c.wait_job(job, "its preemption", Duration::from_secs(30), |j| j["state"] == "queued");
    assert!(event(&requeued, "requeued").iter().any(|e| e["detail"]["reason"] == "preempted"), "{requeued}");
    c.ebb(&["cancel", &filler.to_string()]);
    let resumed = wait_output(&c, job, "resumed from");
    let saved: u64 = resumed.split("saved ").nth(1).unwrap().lines().next().unwrap().trim().parse().unwrap();
    assert!(saved > 0, "{resumed}");
    assert!(resumed.contains(&format!("resumed from {saved}")), "{resumed}");
    let again = c.job(job);
    assert_eq!(again["attempt"], 2);
    assert_eq!(again["placement"][0]["node"], filler_node.as_str(), "attempt 2 runs on the other node");
    assert_eq!(again["image"]["digest"], digest.as_str());
    c.ebb_as(&alice, &["cancel", &job.to_string()]);
    c.ebb(&["cancel", &preemptor.to_string()]);
    c.wait_state(job, "cancelled");
    c.wait_state(preemptor, "cancelled");

    // The drain deadline holds to the second, and cancel kills a setsid
    // child inside the container.
    let marker = format!("stubborn-child-{}", std::process::id());
    let stubborn = c.submit_as(&alice, &["--image", &train, "--", "/stubborn.sh", &marker]);
    wait_output(&c, stubborn, "started");
    wait_for("the setsid child", Duration::from_secs(10), || {
        (!processes_with(&marker).is_empty()).then_some(())
    });
    let node = c.job(stubborn)["placement"][0]["node"].as_str().unwrap().to_string();
    c.ebb(&["drain", &node]);
    let requeued = c.wait_job(stubborn, "attempt 2", Duration::from_secs(30), |j| j["attempt"] == 2);
    let notice = event(&requeued, "drain_notice")[0].clone();
    let exited = event(&requeued, "exited")[0].clone();
    // The drain window is 3 s.
    let deadline = notice["at_ms"].as_u64().unwrap() + 3_000;
    let late = exited["at_ms"].as_u64().unwrap() as i64 - deadline as i64;
    assert!((-100..1000).contains(&late), "killed {late} ms after the deadline: {notice} {exited}");
    assert_eq!(exited["detail"]["signal"], 9, "{exited}");
    c.ebb(&["undrain", &node]);
    wait_for("attempt 2 to start", Duration::from_secs(30), || {
        (c.output(stubborn).matches("started").count() >= 2).then_some(())
    });
    c.ebb_as(&alice, &["cancel", &stubborn.to_string()]);
    c.wait_state(stubborn, "cancelled");
    wait_for("the setsid child to be gone", Duration::from_secs(10), || {
        processes_with(&marker).is_empty().then_some(())
    });

    // The tag moves after submit: the job runs what was resolved then.
    for n in ["node-0", "node-1"] {
        c.ebb(&["drain", n]);
    }
    let pinned = c.submit_as(&alice, &["--image", &train, "--", "cat", "/marker"]);
    let mut moved = image_files();
    moved[0] = File { path: "/marker", contents: b"second", mode: 0o644 };
    push_busybox_image(&work, &open.host, "train", "v1", &moved, None);
    let after = c.submit_as(&alice, &["--image", &train, "--", "cat", "/marker"]);
    for n in ["node-0", "node-1"] {
        c.ebb(&["undrain", n]);
    }
    c.wait_state(pinned, "succeeded");
    c.wait_state(after, "succeeded");
    assert_eq!(c.output(pinned).trim(), "first");
    assert_eq!(c.output(after).trim(), "second");
    assert_eq!(c.job(pinned)["image"]["digest"], digest.as_str());
    assert_ne!(c.job(after)["image"]["digest"], digest.as_str());

    // A batch of three jobs in one image asks the registry once.
    let asked = open.manifest_requests();
    let batch = serde_json::json!({ "jobs": [
        { "argv": ["true"], "image": train }, { "argv": ["true"], "image": train }, { "argv": ["true"], "image": train }
    ]});
    let made = reqwest::blocking::Client::new()
        .post(format!("{}/v1/jobs/batch", c.url))
        .bearer_auth(&alice)
        .json(&batch)
        .send()
        .unwrap();
    assert_eq!(made.status().as_u16(), 201);
    assert_eq!(open.manifest_requests() - asked, 1, "one resolve for the batch's one image");

    // A registry that wants a login: refused without one and with a wrong
    // one, at submit; with alice's, her job pulls and runs; bob, without
    // a login of his own, is refused.
    let locked_host = locked.host.as_str();
    let refused = c.ebb_as(&alice, &["submit", "--image", &private, "--", "cat", "/marker"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("the registry refused the credentials"));
    let login = |token: &str, password: &str| {
        let mut child = std::process::Command::new(support::ebb_exe())
            .args(["tenant", "registry-login", "alice", locked_host, "-u", "alice", "--password-stdin"])
            .env("EBB_SERVER", &c.url)
            .env("EBB_TOKEN", token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(format!("{password}\n").as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let by_bob = login(&bob, PASSWORD);
    assert!(!by_bob.status.success(), "bob cannot set alice's login");
    assert!(login(&alice, "wrong-password").status.success());
    let wrong = c.ebb_as(&alice, &["submit", "--image", &private, "--", "cat", "/marker"]);
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("the registry refused the credentials"));
    assert!(login(&alice, PASSWORD).status.success());
    let listed = String::from_utf8_lossy(&c.ebb_as(&alice, &["tenant", "registry-logins", "alice"]).stdout)
        .to_string();
    assert_eq!(listed.trim(), format!("{locked_host}  alice"));
    let with_login = c.submit_as(&alice, &["--image", &private, "--", "sh", "-c", "cat /marker; env"]);
    c.wait_state(with_login, "succeeded");
    let out = c.output(with_login);
    assert!(out.starts_with("first"), "{out}");
    assert!(!out.contains(PASSWORD), "the password is not in the job's environment");
    let bobs = c.ebb_as(&bob, &["submit", "--image", &private, "--", "cat", "/marker"]);
    assert!(
        String::from_utf8_lossy(&bobs.stderr).contains("refused the credentials"),
        "logins are per tenant"
    );

    // A program the image lacks: the timeline names it, and where it was
    // looked for.
    let lacking = c.submit_as(&alice, &["--image", &train, "--", "python3", "/app/train.py"]);
    let failed = c.wait_state(lacking, "failed");
    let why = event(&failed, "exited")[0]["detail"]["start_error"].as_str().unwrap_or_default().to_string();
    let said = r#"create: exec: "python3": executable file not found in the image's PATH ("#;
    assert!(why.contains(said) && why.ends_with("/bin)"), "{why}");

    // A layer that does not match its digest: the job fails, saying so.
    let mut unique = image_files();
    unique.push(File { path: "/broken", contents: b"a layer of its own", mode: 0o644 });
    let broken = push_busybox_image(&work, &open.host, "broken", "v1", &unique, None);
    corrupt_layer(&open, "broken");
    let bad = c.submit_as(&alice, &["--image", &broken, "--", "cat", "/marker"]);
    let failed = c.wait_state(bad, "failed");
    let why = event(&failed, "exited")[0]["detail"]["start_error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("does not match its digest"), "{why}");

    // Nothing of the password in any log.
    for log in std::fs::read_dir(c.dir.join("logs")).unwrap().flatten() {
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        assert!(!text.contains(PASSWORD), "{} holds the password", log.path().display());
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&work);
}

/// Flips a byte in the middle of the layer of repository `name`'s image
/// in the registry's storage.
fn corrupt_layer(registry: &Registry, name: &str) {
    let links = registry.dir.join("data/docker/registry/v2/repositories").join(name).join("_layers/sha256");
    let mut biggest: Option<(u64, std::path::PathBuf)> = None;
    for link in std::fs::read_dir(&links).unwrap().flatten() {
        let digest = format!("sha256:{}", link.file_name().to_string_lossy());
        let path = registry.blob_path(&digest);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if biggest.as_ref().is_none_or(|(s, _)| size > *s) {
            biggest = Some((size, path));
        }
    }
    let (_, path) = biggest.expect("a layer");
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(Path::new(&path), bytes).unwrap();
}
