//! Slurm's front door end to end: the tools built on Slurm, from PyPI and
//! unchanged (submitit, dask-jobqueue, simple-slurm), against a real
//! cluster through `ebb slurm install`'s commands; and what needs the
//! agent: a `--time` limit that ends a job, dependencies through sbatch,
//! options ignored and refused by name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{wait_for, Cluster, Options};

/// The Slurm commands for `cluster`, in a directory of its own.
fn install(cluster: &Cluster) -> PathBuf {
    let bin = cluster.dir.join("slurm-bin");
    let out = cluster.ebb(&["slurm", "install", bin.to_str().unwrap()]);
    assert!(out.contains("sbatch ->"), "{out}");
    bin
}

/// A command run as a user of `cluster` would: the Slurm commands first
/// on PATH, the server and the operator's token in the environment, in
/// the submit directory.
fn user(cluster: &Cluster, bin: &Path, program: &str) -> Command {
    let mut cmd = Command::new(program);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (key, _) in std::env::vars() {
        if key.starts_with("EBB_") || key.starts_with("SLURM_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("PATH", path)
        .env("EBB_SERVER", &cluster.url)
        .env("EBB_TOKEN", &cluster.admin)
        .current_dir(cluster.submit_dir());
    cmd
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn ok(out: Output, what: &str) -> String {
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{what}: {}\n{stdout}\n{stderr}", out.status);
    stdout
}

/// `sacct -P -n -o State -j ID`.
fn sacct_state(cluster: &Cluster, bin: &Path, id: &str) -> String {
    let out = user(cluster, bin, "sacct").args(["-P", "-n", "-o", "State", "-j", id]).output().unwrap();
    ok(out, "sacct").trim().to_string()
}

#[test]
fn submitit() {
    let cluster = Cluster::start(Options { nodes: 1, gpus: 4, drain_window: "20s", ..Default::default() });
    let bin = install(&cluster);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/slurm/submitit_jobs.py");
    let folder = cluster.submit_dir().join("submitit");
    let out = user(&cluster, &bin, "python3")
        .arg(&script)
        .arg(&folder)
        .arg(crate::support::ebb_exe())
        .output()
        .unwrap();
    let stdout = ok(out, "the submitit script");
    assert!(stdout.contains("result"), "{stdout}");
    // The preempted job's two requeues were preemptions, not failures.
    let line = stdout.lines().find(|l| l.starts_with("checkpointable")).unwrap();
    let id: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let job = cluster.job(id);
    assert_eq!((job["state"].as_str(), job["preemptions"].as_u64()), (Some("succeeded"), Some(2)), "{job}");
    assert_eq!(job["retries"], 0);
    let line = stdout.lines().find(|l| l.starts_with("cancelled")).unwrap();
    let id = line.split_whitespace().nth(1).unwrap();
    assert_eq!(cluster.job(id.parse().unwrap())["state"], "cancelled");
}

#[test]
fn dask_jobqueue_simple_slurm_time_limits_and_dependencies() {
    let cluster = Cluster::start(Options { nodes: 1, gpus: 4, ..Default::default() });
    let bin = install(&cluster);
    let logs = cluster.submit_dir().join("dask-logs");
    std::fs::create_dir_all(&logs).unwrap();

    // dask-jobqueue: two workers compute; close() cancels their jobs.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/slurm/dask_workers.py");
    let out = user(&cluster, &bin, "python3").arg(&script).arg(&logs).output().unwrap();
    let stdout = ok(out, "the dask-jobqueue script");
    let ids: Vec<String> = stdout.split_whitespace().map(str::to_string).collect();
    assert_eq!(ids.len(), 2, "{stdout}");
    for id in &ids {
        wait_for(&format!("worker job {id} cancelled"), Duration::from_secs(30), || {
            (sacct_state(&cluster, &bin, id) == "CANCELLED").then_some(())
        });
    }

    // simple-slurm sends its script on standard input.
    let program = "from simple_slurm import Slurm\n\
                   slurm = Slurm(job_name='simple', output='simple-%j.out', gres='gpu:1')\n\
                   print(slurm.sbatch('echo hello from $SLURM_JOB_NAME'))\n";
    let out = user(&cluster, &bin, "python3").args(["-c", program]).output().unwrap();
    // It prints sbatch's answer, then the id it read from it.
    let id = ok(out, "simple-slurm").trim().lines().last().unwrap().to_string();
    wait_for("simple-slurm's job", Duration::from_secs(30), || {
        (sacct_state(&cluster, &bin, &id) == "COMPLETED").then_some(())
    });
    let said = std::fs::read_to_string(cluster.submit_dir().join(format!("simple-{id}.out"))).unwrap();
    assert_eq!(said, "hello from simple\n");

    // A time limit ends the job, as TIMEOUT.
    let sbatch = |args: &[&str]| user(&cluster, &bin, "sbatch").args(args).output().unwrap();
    let limited = ok(sbatch(&["--parsable", "--time=0:02", "--wrap", "sleep 600"]), "sbatch --time");
    let limited = limited.trim();
    wait_for("the time limit", Duration::from_secs(60), || {
        (sacct_state(&cluster, &bin, limited) == "TIMEOUT").then_some(())
    });

    // afterok holds a job until its parent succeeds, and fails it with a
    // reason when the parent fails.
    let parent = ok(sbatch(&["--parsable", "--wrap", "sleep 2; exit 3"]), "sbatch parent");
    let parent = parent.trim();
    let dependency = format!("--dependency=afterok:{parent}");
    let child = ok(sbatch(&["--parsable", &dependency, "--wrap", "true"]), "sbatch child");
    let child = child.trim();
    let squeue = user(&cluster, &bin, "squeue").args(["-h", "-j", child, "-o", "%i %t %R"]).output().unwrap();
    assert_eq!(ok(squeue, "squeue").trim(), format!("{child} PD (dependency)"));
    wait_for("the parent's failure", Duration::from_secs(30), || {
        (sacct_state(&cluster, &bin, child) == "FAILED").then_some(())
    });
    let job = cluster.job(child.parse().unwrap());
    let failed = job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "failed").unwrap();
    assert_eq!(
        failed["detail"]["reason"],
        format!("dependency never satisfied: job {parent} failed, and afterok can never hold")
    );

    // Every ignored option is said; an unknown one is refused.
    let out = sbatch(&["--mem=4G", "--exclusive", "--gres=gpu:1", "--wrap", "true"]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.starts_with("Submitted batch job "), "{stdout}");
    assert!(stderr.contains("sbatch: ignoring --mem=4G: Ebb does not limit memory"), "{stderr}");
    assert!(stderr.contains("sbatch: ignoring --exclusive:"), "{stderr}");
    let out = sbatch(&["--frobnicate", "--wrap", "true"]);
    assert!(!out.status.success());
    assert_eq!(text(&out).1, "sbatch: error: unrecognized option '--frobnicate'\n");
    let out = sbatch(&["--begin=now+1hour", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(text(&out).1.starts_with("sbatch: error: --begin=now+1hour: not on Ebb: "), "{:?}", text(&out));

    // A GPU type as sites and tools write it is the node's model.
    for (option, written) in
        [("--gres", "gpu:h100:1"), ("--gpus", "h100_80gb:1"), ("--gpus-per-node", "H100:1")]
    {
        let id = ok(sbatch(&["--parsable", &format!("{option}={written}"), "--wrap", "true"]), option);
        assert_eq!(cluster.job(id.trim().parse().unwrap())["gpu_model"], "H100-80GB", "{option}={written}");
    }
    let out = sbatch(&["--gres=gpu:a100:1", "--wrap", "true"]);
    assert!(text(&out).1.contains("no node has \"a100\""), "{:?}", text(&out));

    // A partition list is any of its partitions: of one tier, a job's price.
    let out = sbatch(&["--partition=preemptible,on-demand", "--wrap", "true"]);
    assert!(
        text(&out).1.contains("preemptible is preemptible, on-demand is on-demand, and a job has one tier"),
        "{:?}",
        text(&out)
    );

    // The query commands as tools call them: grouped, with lists, ended
    // jobs asked for by state; sinfo a node a row in the fields asked for.
    let run = |name: &str, args: &[&str]| ok(user(&cluster, &bin, name).args(args).output().unwrap(), name);
    assert_eq!(
        run("squeue", &["-h", "--states", "all", "-j", parent, "-o", "%i %T"]).trim(),
        format!("{parent} FAILED")
    );
    assert_eq!(
        run("sacct", &["-nPXj", &format!("{parent},{child}"), "-o", "JobID,State"]).trim(),
        format!("{parent}|FAILED\n{child}|FAILED")
    );
    assert_eq!(
        run("sinfo", &["-hNp", "preemptible", "-o", "%N|%G|%P"]).trim(),
        "node-0|gpu:H100-80GB:4|preemptible*"
    );
    assert!(run("scontrol", &["show", "config"]).contains("PreemptMode                     = REQUEUE"));
    assert!(run("sinfo", &["--usage"]).contains("  -N, --Node                           honoured\n"));
    let json: serde_json::Value =
        serde_json::from_str(&run("squeue", &["--json", "--states=all", "-j", parent])).unwrap();
    assert_eq!(
        (json["jobs"][0]["job_id"].as_u64(), json["jobs"][0]["job_state"].clone()),
        (parent.parse().ok(), serde_json::json!(["FAILED"]))
    );
    let json: serde_json::Value = serde_json::from_str(&run("sacct", &["--json", "-j", child])).unwrap();
    assert_eq!(json["jobs"][0]["state"]["current"], serde_json::json!(["FAILED"]));
    let json: serde_json::Value = serde_json::from_str(&run("sinfo", &["--json"])).unwrap();
    assert_eq!(json["sinfo"][0]["gres"]["total"], "gpu:H100-80GB:4");
    let partitions = run("scontrol", &["show", "partitions", "-o"]);
    assert!(
        partitions.lines().next().unwrap().starts_with("PartitionName=preemptible ")
            && partitions.contains(" Default=YES "),
        "{partitions}"
    );
    assert!(run("scontrol", &["show", "node=node-0"]).contains("NodeAddr=127.0.0.1 "));

    // Preemption the Slurm way: --signal=B:USR1 reaches the batch shell
    // alone (its step's task has a trap too, and must not hear it); the
    // shell's trap saves and calls scontrol requeue; the job resumes, its
    // output appended.
    let script = cluster.submit_dir().join("requeue.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#SBATCH --signal=B:USR1@30 --open-mode=append -o requeue-%j.out --requeue\n\
         echo \"attempt $SLURM_RESTART_COUNT of $SLURM_JOB_ID on $(scontrol show hostnames | head -n1)\"\n\
         trap 'echo \"batch got USR1\"; scontrol requeue $SLURM_JOB_ID' USR1\n\
         srun bash -c 'trap \"echo task got USR1\" USR1; sleep 600' &\nwait\n",
    )
    .unwrap();
    let id = ok(sbatch(&["--parsable", script.to_str().unwrap()]), "sbatch requeue.sh");
    let id = id.trim();
    let output = cluster.submit_dir().join(format!("requeue-{id}.out"));
    wait_for("the script to run", Duration::from_secs(30), || {
        std::fs::read_to_string(&output).ok().filter(|t| t.contains("attempt 0")).map(|_| ())
    });
    cluster.submit(&["--tier", "on-demand", "--gpus", "4", "--", "sleep", "1"]);
    let said = wait_for("its second attempt", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&output).ok()?;
        (text.lines().filter(|l| l.starts_with("attempt ")).count() >= 2).then_some(text)
    });
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines[..2], [format!("attempt 0 of {id} on node-0").as_str(), "batch got USR1"], "{said}");
    // Attempt 1, or a later one where another cluster's job on this
    // machine held the step port (its start is then requeued on another
    // port, as on a node where a program holds it).
    let again =
        lines[2].strip_suffix(&format!(" of {id} on node-0")).and_then(|l| l.strip_prefix("attempt "));
    assert!(again.and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n >= 1), "{said}");
    let job = cluster.job(id.parse().unwrap());
    assert_eq!(job["preemptions"].as_u64(), Some(1), "{job}");
    assert_eq!(sacct_state(&cluster, &bin, id), "RUNNING");
    cluster.ebb(&["cancel", id]);
}

/// A two-node script as a user writes it: whole GPUs on two nodes, the
/// batch shell told at a drain (B:), MASTER_ADDR from scontrol, srun
/// launching a task per node, a trap that saves and requeues. Preempted by
/// on-demand work, it resumes on both nodes, its output appended.
#[test]
fn a_two_node_script_is_preempted_and_resumes() {
    let cluster = Cluster::start(Options { nodes: 2, gpus: 4, ..Default::default() });
    let bin = install(&cluster);
    let script = cluster.submit_dir().join("two.sh");
    std::fs::write(
        &script,
        r#"#!/bin/bash
#SBATCH --nodes=2 --gres=gpu:4 --signal=B:USR1@60 --requeue
#SBATCH --output=two-%j.out --open-mode=append
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
echo "attempt $SLURM_RESTART_COUNT of $SLURM_NNODES nodes, master $MASTER_ADDR"
trap 'echo "saving at the notice"; scontrol requeue $SLURM_JOB_ID' USR1
srun -l --ntasks-per-node=1 bash -c 'echo "rank $SLURM_PROCID on node $SLURM_NODEID with GPUs $CUDA_VISIBLE_DEVICES, master $MASTER_ADDR"; sleep 600' &
wait
"#,
    )
    .unwrap();
    let out = user(&cluster, &bin, "sbatch").args(["--parsable", script.to_str().unwrap()]).output().unwrap();
    let id = ok(out, "sbatch two.sh").trim().to_string();
    let output = cluster.submit_dir().join(format!("two-{id}.out"));
    // Both ranks' lines after the first attempt's line from `after`
    // (a first start may be retried with another port: it is counted).
    let ranks_after = |after: u32| {
        let output = output.clone();
        move || {
            let text = std::fs::read_to_string(&output).ok()?;
            let (at, attempt) = text.match_indices("attempt ").find_map(|(at, _)| {
                let n: u32 = text[at + 8..].split_whitespace().next()?.parse().ok()?;
                (n >= after).then_some((at, n))
            })?;
            let ranks = text[at..].lines().filter(|l| l.contains(": rank ")).take(2).count();
            (ranks == 2).then(|| (attempt, text[at..].to_string()))
        }
    };
    let (first, text) = wait_for("both ranks of the first attempt", Duration::from_secs(30), ranks_after(0));
    let job = cluster.job(id.parse().unwrap());
    let placed = job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "placed").unwrap();
    let nodes: Vec<&str> = placed["detail"]["placement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes.len(), 2, "{job}");
    let master = nodes[0];
    assert!(text.starts_with(&format!("attempt {first} of 2 nodes, master {master}\n")), "{text}");
    for rank in 0..2 {
        let line = format!("{rank}: rank {rank} on node {rank} with GPUs 0,1,2,3, master {master}");
        assert!(text.contains(&line), "{line:?} in {text}");
    }
    cluster.submit(&["--tier", "on-demand", "--gpus", "8", "--", "sleep", "1"]);
    let (next, text) =
        wait_for("both ranks of the next attempt", Duration::from_secs(60), ranks_after(first + 1));
    assert_eq!(next, first + 1);
    // Between the save and the next attempt only srun may speak: the
    // requeue can end the other node's step while this node's srun still
    // reads it, and srun says so, as Slurm's does at a requeue.
    let all = std::fs::read_to_string(&output).unwrap();
    let before = &all[..all.find(&text).unwrap_or_else(|| panic!("the next attempt in {all}"))];
    let said: Vec<&str> = before.lines().filter(|l| !l.starts_with("srun: ")).collect();
    assert_eq!(said.last(), Some(&"saving at the notice"), "{all}");
    let job = cluster.job(id.parse().unwrap());
    assert_eq!((job["preemptions"].as_u64(), job["retries"].as_u64()), (Some(1), Some(0)), "{job}");
    cluster.ebb(&["cancel", &id]);
}

/// Real `#SBATCH` headers from public training repositories
/// (`slurm/headers/`, with their sources and licences), each submitted
/// unchanged to a cluster shaped as its site's (simulated nodes of 8, 4 or
/// 1 GPUs; the 4-GPU site's model an A100, which `gpu:a100:4` names by
/// family), the sites' partitions mapped to tiers as their operators
/// would: each is accepted and runs on the nodes and GPUs it asks for
/// (an `--exclusive` one with no GPU count on every GPU of its nodes).
#[test]
fn public_sbatch_headers_run_with_the_resources_they_ask_for() {
    let headers = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/slurm/headers");
    let map = |pairs: &str| {
        vec![
            "--partition-map".to_string(),
            format!("preemptible=preemptible,{pairs}"),
            "--default-partition".to_string(),
            "preemptible".to_string(),
        ]
    };
    // GPUs a node, the site's model and partitions, and each header's
    // nodes and GPUs a node.
    type Site = (u8, &'static str, &'static str, &'static [(&'static str, usize, usize)]);
    let sites: [Site; 3] = [
        (
            8,
            "H100-80GB",
            "hopper-prod=preemptible,gpu_p5=preemptible,llmc=preemptible,standard-g=preemptible,g40423=preemptible",
            &[
                ("open-r1-train.slurm", 1, 8),
                ("alignment-handbook-launch.slurm", 1, 8),
                ("bigscience-tr11-176B-ml.slurm", 48, 8),
                ("llm.c-gpt2-124M-fs.sbatch", 2, 8),
                ("olmo-7b-on-lumi.sh", 8, 8),
                // No GPU count, --exclusive: every GPU of its 32 nodes.
                ("gpt-neox-multinode-runner.sbatch", 32, 8),
            ],
        ),
        (
            4,
            "A100-SXM4-80GB",
            "gputest=on-demand",
            &[
                ("accelerate-multigpu.sh", 1, 4),
                ("accelerate-multinode.sh", 4, 4),
                ("csc-gpu4-dist-mahti.sh", 1, 4),
            ],
        ),
        (1, "L4", "gpu=preemptible", &[("pytorch-ddp-tutorial.sh", 4, 1), ("pytorch-mingpt-ddp.sh", 2, 1)]),
    ];
    let mut count = 0;
    for (gpus, model, partitions, jobs) in sites {
        let nodes: usize = jobs.iter().map(|(_, n, _)| n).sum();
        let cluster = Cluster::start(Options {
            nodes: 1,
            simulated_nodes: nodes as u32,
            gpus,
            gpu_model: Some(model),
            server_args: map(partitions),
            ..Default::default()
        });
        let bin = install(&cluster);
        for (file, nodes, per_node) in jobs {
            let out =
                user(&cluster, &bin, "sbatch").arg("--parsable").arg(headers.join(file)).output().unwrap();
            let id: u64 = ok(out, file).trim().parse().unwrap();
            let job = cluster.wait_state(id, "running");
            let placement = job["placement"].as_array().unwrap();
            let shape: Vec<usize> = placement.iter().map(|p| p["gpus"].as_array().unwrap().len()).collect();
            assert_eq!(shape, vec![*per_node; *nodes], "{file}: {job}");
            if file.starts_with("csc") {
                assert_eq!(job["gpu_model"], model, "gpu:a100:4 is the site's A100 model");
            }
            count += 1;
        }
    }
    assert_eq!(count, 11);
}

/// A heterogeneous job as Slurm's documentation writes one: a component
/// of one node for the batch script and a component of two for the
/// workers, one gang whose components take its nodes in turn; each
/// component's `_HET_GROUP_` variables, a step on the first by default and
/// on the second with `--het-group=1`, `srun A : B` with one part on each
/// and its ranks running on across them, and `ID+K` rows in squeue and
/// sacct.
#[test]
fn a_heterogeneous_job_runs_its_components_on_their_own_nodes() {
    let cluster = Cluster::start(Options { nodes: 3, gpus: 4, ..Default::default() });
    let bin = install(&cluster);
    let script = cluster.submit_dir().join("het.sh");
    std::fs::write(
        &script,
        r#"#!/bin/bash
#SBATCH -J het -N1 --gres=gpu:4 -n1 -o het-%j.out
#SBATCH hetjob
#SBATCH -N2 --gres=gpu:4 --ntasks-per-node=2
echo "size $SLURM_HET_SIZE: $SLURM_JOB_NODELIST_HET_GROUP_0 ($SLURM_NTASKS_HET_GROUP_0) and $SLURM_JOB_NODELIST_HET_GROUP_1 ($SLURM_NTASKS_HET_GROUP_1)"
srun bash -c 'echo "leader task $SLURM_PROCID on node $SLURM_NODEID"'
srun --het-group=1 bash -c 'echo "worker task $SLURM_PROCID on node $SLURM_NODEID"' | sort
srun bash -c 'echo "mpmd server $SLURM_PROCID/$SLURM_NTASKS on node $SLURM_NODEID ${EBB_SLURM_HET_STEP_TASKS:-alone}"' : -n2 bash -c 'echo "mpmd client $SLURM_PROCID/$SLURM_NTASKS on node $SLURM_NODEID"' | sort
"#,
    )
    .unwrap();
    let out = user(&cluster, &bin, "sbatch").args(["--parsable", script.to_str().unwrap()]).output().unwrap();
    let id = ok(out, "sbatch het.sh").trim().to_string();
    let job = cluster.wait_state(id.parse().unwrap(), "succeeded");
    let placed = job["events"].as_array().unwrap().iter().find(|e| e["kind"] == "placed").unwrap();
    let nodes: Vec<&str> = placed["detail"]["placement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["node"].as_str().unwrap())
        .collect();
    assert_eq!((nodes.len(), job["gpus"].as_u64()), (3, Some(12)), "{job}");
    let said = std::fs::read_to_string(cluster.submit_dir().join(format!("het-{id}.out"))).unwrap();
    let workers = ebb_core::hostlist::compress(&nodes[1..]);
    let expected = format!(
        "size 2: {} (1) and {} (4)\nleader task 0 on node 0\nworker task 0 on node 1\nworker task 1 on node 1\n\
         worker task 2 on node 2\nworker task 3 on node 2\n\
         mpmd client 1/3 on node 1\nmpmd client 2/3 on node 2\nmpmd server 0/3 on node 0 alone\n",
        nodes[0], workers,
    );
    assert_eq!(said, expected);
    let run = |name: &str, args: &[&str]| ok(user(&cluster, &bin, name).args(args).output().unwrap(), name);
    assert_eq!(
        run("sacct", &["-nP", "-j", &id, "-o", "JobID,NNodes,State"]),
        format!("{id}+0|1|COMPLETED\n{id}+1|2|COMPLETED\n")
    );
    assert_eq!(
        run("sacct", &["-nP", "-j", &format!("{id}+1"), "-o", "JobID,NNodes"]).trim(),
        format!("{id}+1|2")
    );
    assert_eq!(
        run("squeue", &["-h", "-t", "all", "-j", &id, "-o", "%i %D %b"]),
        format!("{id}+0 1 gres/gpu:4\n{id}+1 2 gres/gpu:4\n")
    );
}

/// `srun --jobid` from outside a running job, as from a login node (and
/// as SkyPilot runs everything): its tasks run on the job's nodes with the
/// job's variables, output and input byte for byte (rsync copies through
/// it both ways), its exit is the task's, ending srun ends them, `squeue
/// -s` lists the steps and `scancel ID.N` ends one, and only the job's
/// own tenant gets in, only while it runs; `scancel --full` ends the job's
/// shell's children too.
#[test]
fn srun_jobid_runs_a_step_in_a_running_job_from_outside_it() {
    let cluster = Cluster::start(Options { nodes: 2, gpus: 4, ..Default::default() });
    let bin = install(&cluster);
    let run = |args: &[&str]| user(&cluster, &bin, args[0]).args(&args[1..]).output().unwrap();
    let script = "trap 'echo the shell got TERM; exit 0' TERM; sleep 600";
    let id = ok(
        run(&["sbatch", "--parsable", "-N2", "--gpus-per-node=4", "-o", "full-%j.out", "--wrap", script]),
        "sbatch",
    );
    let id = id.trim().to_string();
    cluster.wait_state(id.parse().unwrap(), "running");
    let jobid = format!("--jobid={id}");
    let nodes_list = ok(run(&["squeue", "-h", "-j", &id, "-o", "%N"]), "squeue");
    let nodes = ebb_core::hostlist::expand(nodes_list.trim()).unwrap();
    // The same by -O's names: JobID 8 wide, the node list 20.
    let long = ok(run(&["squeue", "-h", "-j", &id, "-O", "JobID:8,nodelist"]), "squeue -O");
    assert_eq!(long, format!("{id:<8}{:<20}\n", nodes_list.trim()), "{long:?}");

    let said = ok(
        run(&[
            "srun",
            &jobid,
            "--overlap",
            "-N2",
            "-l",
            "bash",
            "-c",
            "echo $SLURM_JOB_ID $SLURM_NODEID $SLURM_NNODES",
        ]),
        "srun -N2",
    );
    let mut lines: Vec<&str> = said.lines().collect();
    lines.sort();
    assert_eq!(lines, [format!("0: {id} 0 2"), format!("1: {id} 1 2")], "{said}");

    let second = ["--nodelist", nodes[1].as_str(), "--nodes=1", "--ntasks=1"];
    let failed = run(&[&["srun", &jobid][..], &second, &["bash", "-c", "exit 3"]].concat());
    assert_eq!(failed.status.code(), Some(3), "{:?}", text(&failed));

    // Every byte value, in and out, through cat on the second node.
    let bytes: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 256) as u8).collect();
    let blob = cluster.submit_dir().join("blob.bin");
    std::fs::write(&blob, &bytes).unwrap();
    let cat = user(&cluster, &bin, "srun")
        .args([&[jobid.as_str()][..], &second, &["cat"]].concat())
        .stdin(std::fs::File::open(&blob).unwrap())
        .output()
        .unwrap();
    assert!(cat.status.success(), "{:?}", text(&cat));
    assert!(
        cat.stdout == bytes,
        "cat through srun --jobid gave {} bytes back, not the same",
        cat.stdout.len()
    );

    // rsync both ways, srun as its remote shell, as SkyPilot's file sync.
    let shell = cluster.submit_dir().join("srun-shell");
    std::fs::write(
        &shell,
        "#!/bin/bash\njob=${1%%+*}; node=${1#*+}; shift\n\
         exec srun --quiet --overlap --jobid=\"$job\" --nodelist=\"$node\" --nodes=1 --ntasks=1 \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&shell, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (there, back) = (cluster.submit_dir().join("there"), cluster.submit_dir().join("back"));
    let remote = format!("{id}+{}:{}/", nodes[1], there.display());
    let e = shell.to_str().unwrap();
    ok(run(&["rsync", "-a", "-e", e, blob.to_str().unwrap(), &remote]), "rsync up");
    ok(run(&["rsync", "-a", "-e", e, &remote, back.to_str().unwrap()]), "rsync down");
    assert!(
        std::fs::read(back.join("blob.bin")).unwrap() == bytes,
        "rsync through srun --jobid changed the bytes"
    );

    // srun ended: its task on the node goes too, even one that does not
    // read the input srun still sends it.
    let pid_file = cluster.submit_dir().join("task.pid");
    let script = format!("echo $$ > {}; exec sleep 999", pid_file.display());
    let mut held = user(&cluster, &bin, "srun")
        .args([&jobid, "-N1", "-n1", "bash", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // More than its pipe holds, never read: the node's feed of it waits on
    // the task (and TCP holds back what is past the node's buffer: a
    // flood's srun, gone, is seen only when the kernel gives it up).
    let mut input = held.stdin.take().unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(&vec![b'y'; 80 << 10]);
        std::thread::sleep(Duration::from_secs(30));
    });
    let pid: i32 = wait_for("the attached task's pid", Duration::from_secs(20), || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    std::thread::sleep(Duration::from_millis(500));
    held.kill().unwrap();
    held.wait().unwrap();
    wait_for("the attached task to end with its srun", Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });

    // A task's steps, listed and ended by number, as SkyPilot's `sky
    // cancel` does: `squeue -s` names each running step, `scancel ID.N`
    // ends one (its tasks and what they started) and the job runs on.
    let mut named = user(&cluster, &bin, "srun")
        .args([&jobid, "--job-name=sky-1", "-N2", "bash", "-c", "trap 'exit 7' TERM; sleep 600 & wait"])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listed = |id: &str| text(&run(&["squeue", "-s", "-j", id, "-h", "-o", "%i %j"])).0;
    let step = wait_for("the named step in squeue -s", Duration::from_secs(20), || {
        let said = listed(&id);
        said.lines().find(|l| l.ends_with(" sky-1")).map(|l| l.split(' ').next().unwrap().to_string())
    });
    assert!(step.starts_with(&format!("{id}.")), "{step}");
    let table = ok(run(&["squeue", "--steps", &step]), "squeue --steps ID.N");
    let (header, row) = table.split_once('\n').unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["STEPID", "NAME", "PARTITION", "USER", "TIME", "NODELIST"]
    );
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((columns[0], columns[1], columns[5]), (step.as_str(), "sky-1", nodes_list.trim()), "{table}");
    ok(run(&["scancel", &step]), "scancel ID.N");
    assert_eq!(named.wait().unwrap().code(), Some(7), "the tasks' TERM trap");
    assert!(!listed(&id).contains("sky-1"), "{}", listed(&id));
    assert_eq!(cluster.job(id.parse().unwrap())["state"], "running");
    let missing = run(&["scancel", &format!("{id}.999")]);
    assert!(!missing.status.success(), "{:?}", text(&missing));
    assert!(text(&missing).1.contains("already completing or completed"), "{:?}", text(&missing));
    let batch = run(&["scancel", &format!("{id}.batch")]);
    assert!(text(&batch).1.contains("Ebb's batch step is the job itself"), "{:?}", text(&batch));

    // Another tenant's token: no such job. Not running: said.
    let other: serde_json::Value =
        serde_json::from_str(&cluster.ebb(&["tenant", "create", "outsider", "--json"])).unwrap();
    let outsider = user(&cluster, &bin, "srun")
        .args([&jobid, "true"])
        .env("EBB_TOKEN", other["token"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(!outsider.status.success() && text(&outsider).1.contains("not found"), "{:?}", text(&outsider));
    // Nor can it list or end the job's steps.
    let as_outsider = |name: &str, args: &[&str]| {
        user(&cluster, &bin, name)
            .args(args)
            .env("EBB_TOKEN", other["token"].as_str().unwrap())
            .output()
            .unwrap()
    };
    let step0 = format!("{id}.0");
    let cancel = as_outsider("scancel", &[&step0]);
    assert!(!cancel.status.success(), "{:?}", text(&cancel));
    assert!(text(&cancel).1.contains(&format!("Invalid job id specified: {id}")), "{:?}", text(&cancel));
    assert_eq!(ok(as_outsider("squeue", &["-s", "-h"]), "squeue -s as another tenant"), "");
    // `scancel --full` reaches the shell's `sleep` too (SkyPilot's `sky
    // down`): the shell's trap runs at once and the job ends as it says.
    ok(run(&["scancel", "--signal", "TERM", "--full", &id]), "scancel --full");
    cluster.wait_state(id.parse().unwrap(), "succeeded");
    let said = std::fs::read_to_string(cluster.submit_dir().join(format!("full-{id}.out"))).unwrap();
    // (bash says its `sleep` was "Terminated" first, as under Slurm.)
    assert!(said.ends_with("the shell got TERM\n"), "{said}");
    let ended = run(&["srun", &jobid, "true"]);
    assert!(text(&ended).1.contains("steps run only in a running job"), "{:?}", text(&ended));
    // Cancelling a job that has ended says so, as Slurm does.
    let late = run(&["scancel", &id]);
    assert!(!late.status.success());
    assert_eq!(
        text(&late).1,
        format!("scancel: error: Kill job error on job id {id}: Job/step already completing or completed\n")
    );
}

/// The queries a real SkyPilot run sent its login node
/// (`src/slurm/skypilot-commands.jsonl`, recorded by
/// `scripts/skypilot-run`), replayed against a running job named as
/// SkyPilot names its clusters' jobs; each answer is read as SkyPilot's
/// Slurm adaptor reads it (`sky/adaptors/slurm.py`): numbers where it
/// calls `int()`, states it knows, the node's address an IP it need not
/// resolve, one default partition.
#[test]
fn skypilot_queries_answer_as_skypilot_reads_them() {
    let cluster = Cluster::start(Options { nodes: 2, gpus: 4, ..Default::default() });
    let bin = install(&cluster);
    let run = |args: &[&str]| user(&cluster, &bin, args[0]).args(&args[1..]).output().unwrap();
    let name = "ebb-dev-0123abcd";
    let sbatch = ["sbatch", "--parsable", "-J", name, "-N1", "--gpus-per-node=1", "--wrap", "sleep 600"];
    let id = ok(run(&sbatch), "sbatch").trim().to_string();
    cluster.wait_state(id.parse().unwrap(), "running");
    let recorded = include_str!("../../src/slurm/skypilot-commands.jsonl");
    let mut replayed = 0;
    for line in recorded.lines() {
        let line = line.replace("{JOB}", &id).replace("{NAME}", name);
        let argv: Vec<String> = serde_json::from_str(&line).unwrap();
        if !["squeue", "sinfo", "scontrol"].contains(&argv[0].as_str()) || argv.iter().any(|a| a == "-s") {
            continue;
        }
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let said = ok(run(&args), &line);
        // (scontrol's -o is its one-line flag, not a format)
        let format = match argv[0].as_str() {
            "scontrol" => "",
            _ => argv.iter().position(|a| a == "-o").and_then(|i| argv.get(i + 1)).map_or("", String::as_str),
        };
        let rows: Vec<&str> = said.lines().collect();
        match (argv[0].as_str(), format) {
            (_, "%T") => assert!(
                rows.iter().all(|s| ["PENDING", "RUNNING", "COMPLETED", "CANCELLED", "FAILED"].contains(s)),
                "{line}: {said}"
            ),
            (_, "%i") => assert!(rows.iter().all(|r| r.parse::<u64>().is_ok()), "{line}: {said}"),
            (_, "%N") => {
                assert_eq!(ebb_core::hostlist::expand(said.trim()).unwrap().len(), 1, "{line}: {said}")
            }
            // SkyPilot's separator is the four characters `\x1f`.
            ("sinfo", f) if f.contains("\\x1f") => {
                for row in &rows {
                    let fields: Vec<&str> = row.split("\\x1f").collect();
                    assert_eq!(fields.len(), 6, "{line}: {row}");
                    assert!(fields[3].parse::<u32>().is_ok() && fields[4].parse::<u64>().is_ok(), "{row}");
                }
            }
            ("scontrol", _) if argv[1] == "show" && argv[2] == "partitions" => {
                assert!(rows.iter().all(|r| r.starts_with("PartitionName=")), "{said}");
                assert_eq!(rows.iter().filter(|r| r.contains(" Default=YES")).count(), 1, "{said}");
            }
            ("scontrol", _) if argv[1] == "show" && argv[2] == "node" => {
                assert_eq!(rows.len(), 2, "a line a node: {said}");
                for row in &rows {
                    let addr = row.split_whitespace().find_map(|w| w.strip_prefix("NodeAddr=")).unwrap();
                    assert!(addr.parse::<std::net::IpAddr>().is_ok(), "{row}");
                }
            }
            ("scontrol", _) if argv[1] == "show" && argv[2] == "config" => {
                assert!(said.contains("ClusterName"), "{said}")
            }
            _ => {}
        }
        replayed += 1;
    }
    assert!(replayed >= 8, "{replayed} queries replayed");
    // SkyPilot's own pipeline for a job's nodes and their addresses.
    let nodes = format!(
        "nodelist=$(squeue -h --jobs {id} -o \"%N\"); scontrol show hostnames $nodelist | while read -r node; do \
         node_addr=$(scontrol show node=$node | grep NodeAddr= | awk -F= '{{print $2}}' | awk '{{print $1}}'); \
         echo \"$node $node_addr\"; done"
    );
    let said = ok(run(&["bash", "-c", &nodes]), "the nodes pipeline");
    let (node, addr) = said.trim().split_once(' ').unwrap_or_else(|| panic!("{said}"));
    assert!(node.starts_with("node-") && addr.parse::<std::net::IpAddr>().is_ok(), "{said}");
}
