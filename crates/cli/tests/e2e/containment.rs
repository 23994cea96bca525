//! A tenant's job cannot hurt the node, the cluster or another tenant: it
//! runs as its tenant's Unix user with an environment built for it, and
//! everything it starts — `setsid` children and double-forked daemons
//! included — lives in the attempt's cgroup and dies with the attempt.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use crate::support::{event, pid_alive, read_env, wait_for, Cluster, Options, RunAs, AGENT_CANARY};
use serde_json::Value;

fn create_tenant(c: &Cluster, name: &str) -> String {
    let v: Value = serde_json::from_str(&c.ebb(&["tenant", "create", name, "--json"])).unwrap();
    v["token"].as_str().unwrap().to_string()
}

fn uid_of(user: &str) -> u32 {
    let out = std::process::Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

/// Tries what a curious job would: reading the server's secrets and the
/// other tenant's checkpoints, writing into them; prints what it managed.
const PROBE: &str = r#"id -u > "$EBB_CHECKPOINT_DIR/uid"
env > "$EBB_CHECKPOINT_DIR/env"
for f in "$@"; do if cat "$f" > /dev/null 2>&1; then echo "read $f"; fi; done
if ls "$OTHER" > /dev/null 2>&1; then echo "listed $OTHER"; fi
if touch "$OTHER/planted" 2> /dev/null; then echo "wrote into $OTHER"; fi
echo probed"#;

#[test]
fn a_tenants_job_runs_as_its_user_and_reaches_neither_the_agent_nor_the_server_nor_another_tenant() {
    let c = Cluster::start(Options {
        run_as: Some(RunAs {
            tenants: vec![
                ("team-a", "daemon"),
                ("team-b", "bin"),
                ("team-r", "root"),
                ("team-x", "no-such-user-ebb"),
            ],
            default: None,
        }),
        ..Options::default()
    });
    let (a, b) = (create_tenant(&c, "team-a"), create_tenant(&c, "team-b"));
    let secret = c.submit_as(&b, &["--", "bash", "-c", r#"echo secret > "$EBB_CHECKPOINT_DIR/secret""#]);
    c.wait_state(secret, "succeeded");
    let other = c.checkpoints(secret);
    assert!(other.join("secret").exists());

    let server = c.dir.join("server");
    let targets =
        [server.join("admin.token"), server.join("join.token"), server.join("ebb.db"), other.join("secret")];
    // Only what the submission names: the submitter's environment is not exported.
    let mut args = vec!["--env", "", "--export", "NONE", "--", "bash", "-c", PROBE, "probe"];
    let other_env = format!("OTHER={}", other.display());
    args[1] = &other_env;
    let target_strings: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
    args.extend(target_strings.iter().map(String::as_str));
    let probe = c.submit_as(&a, &args);
    c.wait_state(probe, "succeeded");
    assert_eq!(c.output(probe), "probed\n", "the job reached what it must not");
    assert!(!other.join("planted").exists());

    let ckpt = c.checkpoints(probe);
    let daemon = uid_of("daemon");
    assert_ne!(daemon, 0);
    assert_eq!(std::fs::read_to_string(ckpt.join("uid")).unwrap().trim(), daemon.to_string());
    // Its checkpoint directory and its tenant's root belong to its user,
    // closed to everyone else.
    for dir in [&ckpt, &ckpt.parent().unwrap().to_path_buf()] {
        let meta = std::fs::metadata(dir).unwrap();
        assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (daemon, 0o700), "{}", dir.display());
    }
    assert_eq!(ckpt.parent().unwrap().file_name().unwrap(), "team-a");

    // A built environment: the base, the submission's, Ebb's; nothing of
    // the agent's (its canary, its join token).
    let env = read_env(&ckpt.join("env"));
    assert!(!env.contains_key(AGENT_CANARY), "the agent's environment leaked: {env:?}");
    let token = c.join_token();
    assert!(env.values().all(|v| !v.contains(&token)), "the join token leaked");
    assert_eq!(env["USER"], "daemon");
    assert_eq!(env["HOME"], "/usr/sbin");
    assert_eq!(env["PATH"], "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    assert_eq!(env["LANG"], "C.UTF-8");
    assert_eq!(env["EBB_JOB_ID"], probe.to_string());

    // A tenant the operator mapped to no user runs as a uid of its own:
    // the range's first plus its number (the default tenant's is 1).
    let anon = c.submit(&["--", "bash", "-c", r#"id -u > "$EBB_CHECKPOINT_DIR/uid""#]);
    c.wait_state(anon, "succeeded");
    assert_eq!(std::fs::read_to_string(c.checkpoints(anon).join("uid")).unwrap().trim(), "2000001");

    // Root, or a user the node does not know: the start fails and says why.
    for (tenant, why) in [
        ("team-r", "refusing to run a job as root"),
        ("team-x", "run-as user no-such-user-ebb: no such user"),
    ] {
        let token = create_tenant(&c, tenant);
        let job = c.submit_as(&token, &["--", "bash", "-c", "id -u"]);
        let failed = c.wait_job(job, "its start to fail", Duration::from_secs(30), |j| {
            j["events"].as_array().unwrap().iter().any(|e| e["kind"] == "exited")
        });
        assert_eq!(event(&failed, "exited")["detail"]["code"], 127);
        let out = c.output(job);
        assert!(out.starts_with("ebb: ") && out.contains(why), "{tenant}: {out}");
    }
}

/// Carol's job, which Dave's will try to reach: it keeps a secret in its
/// environment and its weights in its checkpoint directory, and says
/// where its process and completion file are.
const CAROL: &str = r#"echo weights > "$EBB_CHECKPOINT_DIR/model.pt"
id -u > "$EBB_CHECKPOINT_DIR/uid"
echo "$EBB_COMPLETION_FILE" > "$EBB_CHECKPOINT_DIR/completion"
echo $$ > "$EBB_CHECKPOINT_DIR/pid"
exec sleep 600"#;

/// Dave's job: what another tenant's job on the node would try.
const DAVE: &str = r#"id -u > "$EBB_CHECKPOINT_DIR/uid"
if { tr '\0' '\n' < "/proc/$VICTIM_PID/environ"; } 2> /dev/null | grep -q SECRET_API_KEY; then echo "read the environment"; fi
if echo planted 2> /dev/null > "$VICTIM_DIR/model.pt"; then echo "overwrote the checkpoint"; fi
if touch "$VICTIM_COMPLETION" 2> /dev/null; then echo "touched the completion file"; fi
if kill -0 "$VICTIM_PID" 2> /dev/null; then echo "could signal the process"; fi
echo probed"#;

/// Tenants mapped to no user used to share `nobody`, and so were one
/// tenant: Dave's job read Carol's `SECRET_API_KEY` from
/// `/proc/PID/environ`, overwrote her checkpoint and touched her
/// completion file (her next drain would have ended her job succeeded).
/// Each runs as a uid of its own now, and reaches nothing of the other's.
#[test]
fn two_tenants_without_a_mapping_run_as_different_uids_and_cannot_reach_each_other() {
    let c = Cluster::start(Options {
        run_as: Some(RunAs { tenants: vec![], default: None }),
        ..Options::default()
    });
    let (carol, dave) = (create_tenant(&c, "carol"), create_tenant(&c, "dave"));
    let victim = c.submit_as(&carol, &["--env", "SECRET_API_KEY=hunter2", "--", "bash", "-c", CAROL]);
    c.wait_state(victim, "running");
    let victim_dir = c.checkpoints(victim);
    let pid = wait_for("carol's pid", Duration::from_secs(20), || {
        std::fs::read_to_string(victim_dir.join("pid")).ok().filter(|p| p.ends_with('\n'))
    });
    let completion = std::fs::read_to_string(victim_dir.join("completion")).unwrap();
    let env = |k: &str, v: &str| format!("{k}={}", v.trim());
    let (pid_env, dir_env, completion_env) = (
        env("VICTIM_PID", &pid),
        env("VICTIM_DIR", &victim_dir.display().to_string()),
        env("VICTIM_COMPLETION", &completion),
    );
    let probe = c.submit_as(
        &dave,
        &["--env", &pid_env, "--env", &dir_env, "--env", &completion_env, "--", "bash", "-c", DAVE],
    );
    c.wait_state(probe, "succeeded");
    assert_eq!(c.output(probe), "probed\n", "dave's job reached carol's");
    assert_eq!(std::fs::read_to_string(victim_dir.join("model.pt")).unwrap(), "weights\n");
    assert!(!std::path::Path::new(completion.trim()).exists(), "the completion file was made");
    let uid = |id: u64| {
        std::fs::read_to_string(c.checkpoints(id).join("uid")).unwrap().trim().parse::<u32>().unwrap()
    };
    let (carol_uid, dave_uid) = (uid(victim), uid(probe));
    assert_ne!(carol_uid, dave_uid);
    for u in [carol_uid, dave_uid] {
        assert!((2_000_000..=2_999_999).contains(&u), "uid {u} is not from the tenants' range");
    }
    // Each tenant's checkpoints belong to its own uid, closed to the other.
    let meta = std::fs::metadata(&victim_dir).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (carol_uid, 0o700));
}

/// A job that opens 1,500 connections to its own endpoint from each of
/// two processes (past its agent's open-file limit of 2,048 together) and
/// holds them, saying how many it holds.
const HOARDER: &str = r#"
import os, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port = os.environ["EBB_METADATA_URL"][len("http://"):].split("/")[0].split(":")
pid = os.fork()
held = []
for _ in range(1500):
    s = socket.socket()
    try:
        s.connect((host, int(port)))
        held.append(s)
    except OSError:
        s.close()
print("held", len(held), flush=True)
time.sleep(600)
"#;

/// A job held 2,145 idle connections to its own metadata endpoint, and
/// the root agent ran out of descriptors: the next job placed on the node
/// failed "metadata endpoint: Too many open files". An endpoint holds 32
/// connections at once and closes the rest as they come, so the node goes
/// on starting jobs.
#[test]
fn a_job_that_hoards_connections_to_its_endpoint_does_not_stop_the_next_job_starting() {
    let c = Cluster::start(Options { agent_open_files: Some(2048), ..Options::default() });
    let hoarder = c.submit(&["--gpus", "1", "--", "python3", "-c", HOARDER]);
    let held = c.wait_job(hoarder, "its connections", Duration::from_secs(60), |_| {
        c.output(hoarder).matches("held ").count() == 2
    });
    assert_eq!(held["state"], "running");
    let next = c.submit(&["--gpus", "1", "--", "true"]);
    let done = c.wait_job(next, "the next job", Duration::from_secs(30), |j| {
        j["state"] == "succeeded" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "succeeded", "{}", c.output(next));
    c.ebb(&["cancel", "--grace", "1s", &hoarder.to_string()]);
    c.wait_state(hoarder, "cancelled");
}

/// A job that leaves a `setsid` child and a double-forked daemon behind,
/// both holding its output open, records their pids and ignores SIGTERM.
const ESCAPER: &str = r#"setsid bash -c 'echo $$ > "$EBB_CHECKPOINT_DIR/setsid-$EBB_ATTEMPT"; exec sleep 1000' &
( bash -c 'echo $$ > "$EBB_CHECKPOINT_DIR/daemon-$EBB_ATTEMPT"; exec sleep 1000' & )
trap '' TERM
echo started
while :; do sleep 0.05; done"#;

/// The escaped pids of `job`'s attempt `attempt`, once written.
fn escaped_pids(c: &Cluster, job: u64, attempt: u32) -> Vec<i32> {
    ["setsid", "daemon"]
        .iter()
        .map(|kind| {
            wait_for(&format!("the {kind} pid"), Duration::from_secs(20), || {
                let file = c.checkpoints(job).join(format!("{kind}-{attempt}"));
                std::fs::read_to_string(file).ok()?.trim().parse().ok()
            })
        })
        .collect()
}

fn assert_all_dead(pids: &[i32], when: &str) {
    wait_for(&format!("every escaped process to die {when}"), Duration::from_secs(5), || {
        pids.iter().all(|p| !pid_alive(*p)).then_some(())
    });
}

#[test]
fn a_cancel_kills_escaped_processes_and_ends_the_attempt_at_the_grace() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let job = c.submit(&["--gpus", "2", "--", "bash", "-c", ESCAPER]);
    c.wait_state(job, "running");
    let pids = escaped_pids(&c, job, 1);
    assert!(pids.iter().all(|p| pid_alive(*p)));
    let asked = Instant::now();
    c.ebb(&["cancel", &job.to_string()]);
    // SIGTERM (ignored), then SIGKILL after the 10 s grace: the attempt ends
    // then, though its escaped children hold its output open.
    c.wait_job(job, "cancelled", Duration::from_secs(30), |j| j["state"] == "cancelled");
    let took = asked.elapsed();
    eprintln!("cancel with a 10 s grace ended the attempt after {took:?}");
    assert!(took < Duration::from_secs(13), "the attempt outlived its grace: {took:?}");
    assert_all_dead(&pids, "after cancel");
}

#[test]
fn the_drain_deadline_kills_escaped_processes_and_is_kept_to_the_second() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, drain_window: "3s", ..Options::default() });
    let victim = c.submit(&["--gpus", "2", "--", "bash", "-c", ESCAPER]);
    c.wait_state(victim, "running");
    let pids = escaped_pids(&c, victim, 1);
    let preemptor = c.submit(&["--tier", "on-demand", "--gpus", "2", "--", "sleep", "30"]);
    c.wait_state(preemptor, "running");
    assert_all_dead(&pids, "at the drain deadline");
    let job = c.job(victim);
    let deadline = event(&job, "drain_notice")["detail"]["deadline"].as_str().unwrap().to_string();
    let deadline_ms = humantime::parse_rfc3339_weak(&deadline)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let exited = event(&job, "exited");
    let late_ms = exited["at_ms"].as_i64().unwrap() - deadline_ms;
    eprintln!("the attempt ended {late_ms} ms after its drain deadline");
    assert!(late_ms < 3_000, "the attempt ended {late_ms} ms after its deadline");
    assert_eq!(exited["detail"]["signal"], 9);
}

#[test]
fn a_fenced_attempts_escaped_processes_are_killed_by_the_restarted_agent() {
    let mut c =
        Cluster::start(Options { nodes: 1, gpus: 2, heartbeat_timeout: "1500ms", ..Options::default() });
    let job = c.submit(&["--gpus", "2", "--", "bash", "-c", ESCAPER]);
    c.wait_state(job, "running");
    let pids = escaped_pids(&c, job, 1);
    c.kill_agent(0);
    c.wait_job(job, "requeued as lost", Duration::from_secs(20), |j| j["state"] == "queued");
    assert!(pids.iter().all(|p| pid_alive(*p)), "the orphaned attempt runs while its agent is gone");
    c.start_agent(0);
    c.wait_nodes_up(1);
    assert_all_dead(&pids, "once the agent is back");
    c.wait_job(job, "attempt 2 running", Duration::from_secs(20), |j| {
        j["state"] == "running" && j["attempt"] == 2
    });
}

#[test]
fn peak_memory_is_reported_and_finished_attempts_directories_are_swept_but_never_checkpoints() {
    let c = Cluster::start(Options { agent_args: vec!["--attempt-retention", "1s"], ..Options::default() });
    let script = r#"echo kept > "$EBB_CHECKPOINT_DIR/state"; /usr/bin/python3 -c 'x = bytearray(200 * 1024 * 1024); x[::4096] = b"y" * len(x[::4096])'"#;
    let job = c.submit(&["--", "bash", "-c", script]);
    let done = c.wait_state(job, "succeeded");
    let peak = event(&done, "exited")["detail"]["peak_memory_bytes"].as_u64().expect("peak memory reported");
    eprintln!("peak memory of a 200 MiB job: {peak} bytes");
    assert!(peak >= 200 << 20, "{peak}");
    let shown = c.ebb(&["show", &job.to_string()]);
    assert!(shown.contains("peak memory 2"), "{shown}");

    let agent = c.dir.join("agents/node-0");
    let run_dir = agent.join(format!("run/{job}-1"));
    let work_dir = agent.join(format!("work/{job}"));
    wait_for("the finished attempt's directories to be swept", Duration::from_secs(15), || {
        (!run_dir.exists() && !work_dir.exists()).then_some(())
    });
    assert_eq!(std::fs::read_to_string(c.checkpoints(job).join("state")).unwrap(), "kept\n");
}

/// Plants links where the root agent will write next: in the tenant's
/// checkpoint root, named after the next jobs, and in place of the drain
/// notice's temporary file; then waits for its drain and keeps the notice.
const PLANTER: &str = r#"root="$(dirname "$EBB_CHECKPOINT_DIR")"
for next in 1 2 3; do ln -s "$VICTIM_DIR" "$root/$((EBB_JOB_ID + next))"; done
ln -s "$VICTIM_FILE" "$(dirname "$EBB_DRAIN_FILE")/drain.tmp"
trap 'cp "$EBB_DRAIN_FILE" "$EBB_CHECKPOINT_DIR/notice"; exit 0' TERM
touch "$EBB_CHECKPOINT_DIR/planted"
while :; do sleep 0.05; done"#;

#[test]
fn links_a_job_plants_never_turn_the_root_agents_writes_onto_other_files() {
    let c = Cluster::start(Options {
        run_as: Some(RunAs { tenants: vec![("team-a", "daemon")], default: None }),
        drain_window: "5s",
        ..Options::default()
    });
    let a = create_tenant(&c, "team-a");
    let victim_dir = c.dir.join("victim-dir");
    std::fs::create_dir(&victim_dir).unwrap();
    std::fs::set_permissions(&victim_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim_file = c.dir.join("victim-file");
    std::fs::write(&victim_file, "precious\n").unwrap();
    let env_dir = format!("VICTIM_DIR={}", victim_dir.display());
    let env_file = format!("VICTIM_FILE={}", victim_file.display());
    let planter =
        c.submit_as(&a, &["--gpus", "2", "--env", &env_dir, "--env", &env_file, "--", "bash", "-c", PLANTER]);
    wait_for("the links", Duration::from_secs(20), || {
        c.checkpoints(planter).join("planted").exists().then_some(())
    });

    // The next job's checkpoint directory is a link: its start fails and
    // says why; the link's target is not handed to the tenant's user.
    let next = c.submit_as(&a, &["--", "true"]);
    assert_eq!(next, planter + 1);
    let failed = c.wait_job(next, "its start to fail", Duration::from_secs(20), |j| {
        j["events"].as_array().unwrap().iter().any(|e| e["kind"] == "exited")
    });
    assert_eq!(event(&failed, "exited")["detail"]["code"], 127);
    let out = c.output(next);
    assert!(out.contains("it is a symbolic link, which is refused"), "{out}");
    let meta = std::fs::metadata(&victim_dir).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o7777),
        (0, 0o755),
        "the agent changed the link's target"
    );

    // The drain notice replaces the planted temporary file; it does not
    // write through it.
    let preemptor = c.submit(&["--tier", "on-demand", "--gpus", "4", "--", "true"]);
    c.wait_state(preemptor, "succeeded");
    assert_eq!(std::fs::read_to_string(&victim_file).unwrap(), "precious\n");
    let notice: Value =
        serde_json::from_str(&std::fs::read_to_string(c.checkpoints(planter).join("notice")).unwrap())
            .unwrap();
    assert!(notice["deadline"].is_string(), "{notice}");
}

/// A bare job could open every GPU on its node: only
/// `CUDA_VISIBLE_DEVICES` said which were its. Each attempt's cgroup now
/// has a device program refusing the node's other GPUs. Character devices
/// with the NVIDIA major stand in for a real driver's (`mknod`, simulated
/// GPUs): opening its own GPU's reaches the (absent) driver, ENXIO; the
/// other's is refused by the filter first, EPERM.
#[test]
fn a_job_opening_another_gpus_device_node_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: device nodes cannot be made, nor device programs attached");
        return;
    }
    let dev = std::env::temp_dir().join(format!("ebb-devices-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dev);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755)).unwrap();
    for minor in 0..2u64 {
        let node = dev.join(format!("nvidia{minor}"));
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let script = format!(
        r#"import errno, os
mine = int(os.environ["CUDA_VISIBLE_DEVICES"])
for gpu in (0, 1):
    try:
        os.close(os.open("{dev}/nvidia%d" % gpu, os.O_RDWR))
        said = "opened"
    except OSError as e:
        said = errno.errorcode[e.errno]
    print("own" if gpu == mine else "other", said)"#,
        dev = dev.display()
    );
    let id = c.submit(&["--gpus", "1", "--", "python3", "-c", &script]);
    c.wait_state(id, "succeeded");
    let said = c.ebb(&["logs", &id.to_string()]);
    assert!(said.contains("own ENXIO"), "{said}");
    assert!(said.contains("other EPERM"), "{said}");
    // Both GPUs: both its own.
    let id = c.submit(&[
        "--gpus",
        "2",
        "--",
        "python3",
        "-c",
        &script.replace("mine = int(os.environ[\"CUDA_VISIBLE_DEVICES\"])", "mine = None"),
    ]);
    c.wait_state(id, "succeeded");
    let said = c.ebb(&["logs", &id.to_string()]);
    assert_eq!(said.matches("ENXIO").count(), 2, "{said}");
    let _ = std::fs::remove_dir_all(&dev);
}
