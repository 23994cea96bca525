//! Pyxis' `srun --container-*` end to end: a real registry on loopback,
//! a busybox image pushed by `skopeo`, root agents, a tenant whose jobs
//! run as `nobody`, and a two-node Slurm script whose steps run in the
//! image: as the user, as a remapped root that is `nobody` outside, in a
//! named container that keeps its changes and that a later step joins.

use std::process::Command;

use crate::support::{Cluster, Options, RunAs};
use ebb_image::testing::{push_busybox_image, File, Registry};

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn srun_runs_steps_in_an_image_unprivileged_and_names_what_fails() {
    let work = std::env::temp_dir().join(format!("ebb-pyxis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let registry = Registry::start(&work.join("registry"));
    let files = [File { path: "/marker", contents: b"from-the-image", mode: 0o644 }];
    push_busybox_image(&work, &registry.host, "tools", "v1", &files, None);
    let allowed = ["--allowed-registry".to_string(), registry.host.clone()];
    // A CDI spec as nvidia-ctk writes one: each GPU's device node, and the
    // driver's library mounted into every container.
    let driver = work.join("libcuda.so.1");
    std::fs::write(&driver, b"the node's driver").unwrap();
    let device = |name: &str| serde_json::json!({"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}});
    let cdi = serde_json::json!({
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [device("0"), device("1")],
        "containerEdits": {
            "env": ["NVIDIA_DRIVER_FROM=cdi"],
            "mounts": [{"hostPath": driver, "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
        },
    });
    let cdi_file = work.join("cdi.json");
    std::fs::write(&cdi_file, cdi.to_string()).unwrap();
    let mut agent_args: Vec<&'static str> = allowed.iter().cloned().map(leak).collect();
    agent_args.extend(["--cdi-spec", leak(cdi_file.display().to_string())]);
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: 2,
        run_as: Some(RunAs { tenants: vec![("alice", "nobody")], default: None }),
        agent_args,
        server_args: allowed.to_vec(),
        ..Options::default()
    });
    let made: serde_json::Value =
        serde_json::from_str(&c.ebb(&["tenant", "create", "alice", "--json"])).unwrap();
    let alice = made["token"].as_str().unwrap().to_string();
    let bin = c.dir.join("slurm-bin");
    c.ebb(&["slurm", "install", bin.to_str().unwrap()]);
    let shared = c.submit_dir().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Pyxis' own form of a registry's image: REGISTRY#IMAGE.
    let image = format!("{}#tools:v1", registry.host);
    let script = c.submit_dir().join("pyxis.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/bash
#SBATCH -N2 --gres=gpu:2 --ntasks-per-node=1 -o pyxis-%j.out
IMAGE={image}
echo "batch uid $(id -u)"
srun --container-image=$IMAGE sh -c 'echo "plain $SLURM_PROCID uid=$(id -u) marker=$(cat /marker) python=$(test -e /usr/bin/python3 && echo seen || echo unseen)"' | sort
srun -N1 --container-image=$IMAGE sh -c 'echo "driver: $(cat /usr/lib/x86_64-linux-gnu/libcuda.so.1) $NVIDIA_DRIVER_FROM gpus=$CUDA_VISIBLE_DEVICES libraries=$LD_LIBRARY_PATH"' 
srun -N1 --container-image=$IMAGE --container-remap-root --container-mounts={shared}:/out sh -c 'echo "remapped uid=$(id -u)"; echo mine > /marker; echo "image file now $(cat /marker)"; touch /out/made-inside'
echo "made-inside owner $(stat -c %u {shared}/made-inside)"
srun -N1 --container-image=$IMAGE --container-name=box sh -c 'echo kept > /etc/kept'
srun -N1 --container-name=box sh -c 'echo "named: $(cat /etc/kept) marker=$(cat /marker)"'
srun -N1 --container-name=box sh -c 'echo $$ > /tmp/keeper; sleep 60' &
for i in $(seq 50); do srun -N1 --container-name=box:exec sh -c 'test -s /tmp/keeper' 2>/dev/null && break; sleep 0.2; done
srun -N1 --container-name=box:exec sh -c 'echo "joined the keeper $(cat /tmp/keeper): $(kill -0 $(cat /tmp/keeper) && echo alive)"'
kill %1
srun -N1 --container-image=$IMAGE --container-readonly sh -c 'touch /new 2>/dev/null || echo "read-only"'
srun -N1 --container-name=nothing true; echo "no such container: $?"
srun -N1 --container-image={registry}/absent:v9 true; echo "no such image: $?"
srun -N1 --container-name=box:create true; echo "create twice: $?"
echo "keeper starting"
srun -N1 --container-name=box sh -c 'echo ready > /tmp/ready; sleep 300'
"#,
            shared = shared.display(),
            registry = registry.host,
        ),
    )
    .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("sbatch")
        .args(["--parsable", script.to_str().unwrap()])
        .env("PATH", &path)
        .env("EBB_SERVER", &c.url)
        .env("EBB_TOKEN", &alice)
        .current_dir(c.submit_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // From outside the job, as SkyPilot runs its commands: a step that
    // joins the running named container.
    let outside = |args: &[&str]| {
        Command::new("srun")
            .args(args)
            .env("PATH", &path)
            .env("EBB_SERVER", &c.url)
            .env("EBB_TOKEN", &alice)
            .current_dir(c.submit_dir())
            .output()
            .unwrap()
    };
    let job = id.to_string();
    let exec = ["--jobid", job.as_str(), "-N1", "--container-remap-root", "--container-name=box:exec"];
    crate::support::wait_for("the keeper step", std::time::Duration::from_secs(60), || {
        let probe: Vec<&str> = exec.iter().copied().chain(["test", "-s", "/tmp/ready"]).collect();
        outside(&probe).status.success().then_some(())
    });
    let joined = outside(
        &[&exec[..], &["sh", "-c", "echo \"outside: $(cat /tmp/ready) $(cat /etc/kept) uid=$(id -u)\""]]
            .concat(),
    );
    assert!(joined.status.success(), "{}", String::from_utf8_lossy(&joined.stderr));
    // The container was made without remapping: joining it keeps its user.
    assert_eq!(String::from_utf8_lossy(&joined.stdout), "outside: ready kept uid=65534\n");
    c.ebb_as(&alice, &["cancel", &job]);
    c.wait_state(id, "cancelled");
    let said = std::fs::read_to_string(c.submit_dir().join(format!("pyxis-{id}.out"))).unwrap();
    let expect = |line: &str| assert!(said.contains(line), "{line:?} not in:\n{said}");
    expect("batch uid 65534\n");
    // Both nodes, as the job's user, in the image and not the node.
    expect("plain 0 uid=65534 marker=from-the-image python=unseen\nplain 1 uid=65534 marker=from-the-image");
    // Root inside, with the image's files its own, but nobody outside.
    // The GPUs' driver from the node's CDI spec, and the job's GPUs.
    expect("driver: the node's driver cdi gpus=0,1 libraries=/usr/lib/x86_64-linux-gnu");
    expect("remapped uid=0\nimage file now mine\n");
    expect("made-inside owner 65534\n");
    // A named container keeps its changes; an unnamed one's are gone.
    expect("named: kept marker=from-the-image\n");
    expect("joined the keeper ");
    assert!(said.contains(": alive\n"), "{said}");
    expect("read-only\n");
    expect("no such container: 1\n");
    expect("no such image: 1\n");
    expect("create twice: 1\n");
    for why in [
        "pyxis: no container \"nothing\" exists on this node and --container-image is not given",
        &format!("srun: error: pyxis: image {}/absent:v9: not found in the registry\n", registry.host),
        "container \"box\" exists (--container-name=NAME:create makes a new one)",
    ] {
        expect(why);
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&work);
}
