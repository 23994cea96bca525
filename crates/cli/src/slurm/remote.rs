//! Steps across a Slurm job's nodes. Its first node's batch step keeps a
//! directory (`EBB_SLURM_HUB`, the gang's rendezvous port): the batch step
//! on each other node listens on a port of its own, registers there, and
//! starts the tasks `srun` sends it, streaming their output and exits
//! back. Every message is a line of JSON and carries the attempt's key
//! (`EBB_SLURM_KEY`); one without it is dropped. A node's batch step ends
//! when the first node's does (its registration's connection closes).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::step::{self, Names};

/// How long a node's batch step tries to reach the first node's, and
/// `srun` waits for every node to have registered.
const MEET: Duration = Duration::from_secs(60);

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Hello {
    /// A node's batch step: where it listens.
    Register { node: u32, at: String },
    /// `srun`: where the nodes listen, once `nodes` have registered.
    Directory { nodes: u32 },
}

#[derive(Serialize, Deserialize)]
struct Keyed<T> {
    key: String,
    body: T,
}

/// The tasks of one step on one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepRequest {
    pub step: u32,
    pub argv: Vec<String>,
    /// `srun`'s environment, over the node's own but for what is the
    /// node's (its GPUs, Ebb's variables).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub output: Option<String>,
    pub error: Option<String>,
    pub append: bool,
    /// (SLURM_PROCID, SLURM_LOCALID) of each task here.
    pub tasks: Vec<(u32, u32)>,
    /// Each task's own variables (SLURM_PROCID, ...), by task.
    pub task_env: BTreeMap<u32, BTreeMap<String, String>>,
}

/// What a node sends back: a line a task wrote, or its exit.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepEvent {
    Out { task: u32, line: String, err: bool },
    Exit { task: u32, code: i32 },
    Failed { message: String },
}

fn send<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// The first node's directory, in a thread of its batch step: nodes
/// register, `srun`s ask.
pub fn serve_directory(hub: &str, key: String) -> Result<(), String> {
    let port = hub.rsplit_once(':').map(|(_, p)| p).unwrap_or(hub);
    let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
        .map_err(|e| format!("the step directory on port {port}: {e}"))?;
    let nodes: Arc<Mutex<BTreeMap<u32, String>>> = Arc::default();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (nodes, key) = (nodes.clone(), key.clone());
            std::thread::spawn(move || directory_client(stream, &nodes, &key));
        }
    });
    Ok(())
}

fn directory_client(stream: TcpStream, nodes: &Mutex<BTreeMap<u32, String>>, key: &str) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let Ok(hello) = serde_json::from_str::<Keyed<Hello>>(&line) else { return };
    if hello.key != key {
        return;
    }
    let mut stream = stream;
    match hello.body {
        Hello::Register { node, at } => {
            nodes.lock().expect("directory").insert(node, at);
            // Held open: the node's batch step ends when this one does.
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut reader, &mut rest);
        }
        Hello::Directory { nodes: wanted } => {
            let deadline = Instant::now() + MEET;
            loop {
                let known = nodes.lock().expect("directory").clone();
                if (1..wanted).all(|n| known.contains_key(&n)) || Instant::now() > deadline {
                    let _ = send(&mut stream, &known);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Where the other nodes' batch steps listen, once `nodes` have registered.
pub fn directory(hub: &str, key: &str, nodes: u32) -> Result<BTreeMap<u32, String>, String> {
    let mut stream = TcpStream::connect(hub).map_err(|e| format!("the job's first node ({hub}): {e}"))?;
    send(&mut stream, &Keyed { key: key.to_string(), body: Hello::Directory { nodes } })
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(|e| e.to_string())?;
    let known: BTreeMap<u32, String> =
        serde_json::from_str(&line).map_err(|e| format!("the step directory: {e}"))?;
    if let Some(missing) = (1..nodes).find(|n| !known.contains_key(n)) {
        return Err(format!("node {missing} of the job did not join its steps within {}s", MEET.as_secs()));
    }
    Ok(known)
}

/// The batch step of a node other than the job's first: it registers with
/// the first node's directory, runs the steps sent to it, passes the
/// job's signals to their tasks, and ends when the first node's batch
/// step does.
pub fn node_step(steps: &Path, to_batch: bool) -> ! {
    let fail = |message: String| -> ! {
        eprintln!("ebb slurm-batch: {message}");
        std::process::exit(1)
    };
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let get = |k: &str| env.get(k).cloned().unwrap_or_default();
    let (hub, key) = (get("EBB_SLURM_HUB"), get("EBB_SLURM_KEY"));
    let node: u32 = get("SLURM_NODEID").parse().unwrap_or(0);
    let waited = step::waited_signals();
    if let Err(e) = waited.thread_block() {
        fail(format!("cannot block signals: {e}"));
    }
    let listener =
        TcpListener::bind("0.0.0.0:0").unwrap_or_else(|e| fail(format!("cannot listen for steps: {e}")));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_else(|e| fail(e.to_string()));
    let at = format!("{}:{port}", get("EBB_SLURM_ADDRESS"));
    let deadline = Instant::now() + MEET;
    let mut registration = loop {
        match TcpStream::connect(&hub) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => fail(format!("cannot reach the job's first node at {hub}: {e}")),
        }
    };
    let hello = Keyed { key: key.clone(), body: Hello::Register { node, at } };
    send(&mut registration, &hello).unwrap_or_else(|e| fail(e.to_string()));
    // The first node's batch step is gone: so is this one.
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut registration, &mut rest);
        std::process::exit(0);
    });
    let steps_dir = steps.to_path_buf();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (key, steps, env) = (key.clone(), steps_dir.clone(), env.clone());
            std::thread::spawn(move || run_remote_step(stream, &key, &steps, &env));
        }
    });
    loop {
        match step::next_signal(&waited) {
            // No batch shell runs here: a B: signal has no one to reach.
            Some((signo, Some(route))) => {
                use ebb_agent::slurm::Route;
                let to_steps = match route {
                    Route::Drain => !to_batch,
                    Route::Steps => true,
                    Route::Batch => false,
                };
                if to_steps {
                    step::signal_steps(steps, signo);
                }
            }
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Variables that are each node's own: a step's tasks on this node keep
/// this node's.
fn node_own(name: &str) -> bool {
    name.starts_with("EBB_")
        || ["CUDA_VISIBLE_DEVICES", "SLURM_NODEID", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "HOSTNAME"]
            .contains(&name)
}

/// One step's tasks on this node, for the `srun` at the other end.
fn run_remote_step(stream: TcpStream, key: &str, steps: &Path, own_env: &BTreeMap<String, String>) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let Ok(request) = serde_json::from_str::<Keyed<StepRequest>>(&line) else { return };
    if request.key != key {
        return;
    }
    let request = request.body;
    let out = Arc::new(Mutex::new(stream));
    let emit = |event: StepEvent| {
        let _ = send(&mut out.lock().expect("step stream"), &event);
    };
    let mut names = Names::from_env(own_env);
    names.step = request.step.to_string();
    let file = steps.join(format!("{}.{}", request.step, names.node_index));
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for &(task, local) in &request.tasks {
        names.task = Some(task);
        let mut command = Command::new(&request.argv[0]);
        step::unblocked(&mut command).args(&request.argv[1..]).stdin(Stdio::null()).env_clear();
        let mut env = own_env.clone();
        env.extend(request.env.iter().filter(|(k, _)| !node_own(k)).map(|(k, v)| (k.clone(), v.clone())));
        env.extend(request.task_env.get(&task).cloned().unwrap_or_default());
        env.insert("SLURM_LOCALID".into(), local.to_string());
        command.envs(env);
        if let Some(dir) = &request.cwd {
            command.current_dir(dir);
        }
        let open = |pattern: &Option<String>| -> Option<std::fs::File> {
            let path = names.expand(pattern.as_deref()?);
            step::open_output(Path::new(&path), request.append).ok()
        };
        match open(&request.output) {
            Some(f) => command.stdout(f),
            None => command.stdout(Stdio::piped()),
        };
        match (open(&request.error), request.error.is_none() && request.output.is_some()) {
            (Some(f), _) => command.stderr(f),
            (None, true) => command.stderr(open(&request.output).map_or(Stdio::piped(), Stdio::from)),
            (None, false) => command.stderr(Stdio::piped()),
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                emit(StepEvent::Failed {
                    message: format!("cannot run {:?} on {}: {e}", request.argv[0], names.node),
                });
                return;
            }
        };
        for (pipe, err) in [
            (child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), false),
            (child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), true),
        ] {
            if let Some(pipe) = pipe {
                let out = out.clone();
                readers.push(std::thread::spawn(move || {
                    for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
                        let line = String::from_utf8_lossy(&line).into_owned();
                        let _ =
                            send(&mut out.lock().expect("step stream"), &StepEvent::Out { task, line, err });
                    }
                }));
            }
        }
        children.push((task, child));
    }
    let pids: Vec<String> = children.iter().map(|(_, c)| c.id().to_string()).collect();
    let _ = std::fs::write(&file, pids.join("\n"));
    // The srun at the other end gone: its tasks here go too.
    let pids_for_kill: Vec<i32> = children.iter().map(|(_, c)| c.id() as i32).collect();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reader, &mut rest);
        for pid in pids_for_kill {
            // SAFETY: kill with plain numbers.
            unsafe {
                nix::libc::kill(pid, nix::libc::SIGKILL);
            }
        }
    });
    for reader in readers {
        let _ = reader.join();
    }
    for (task, mut child) in children {
        let code = child.wait().map_or(1, step::exit_code);
        emit(StepEvent::Exit { task, code });
    }
    let _ = std::fs::remove_file(&file);
}

/// Sends node `node` (at `at`) its share of a step; returns the stream
/// its events come back on.
pub fn start_remote(at: &str, key: &str, request: &StepRequest) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(at).map_err(|e| format!("the job's node at {at}: {e}"))?;
    send(&mut stream, &Keyed { key: key.to_string(), body: request.clone() }).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Reads a node's step events until it has sent `tasks` exits, passing
/// each to `event`.
pub fn follow(stream: TcpStream, tasks: usize, mut event: impl FnMut(StepEvent)) -> Result<(), String> {
    let mut exits = 0;
    for line in BufReader::new(stream).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let parsed: StepEvent = serde_json::from_str(&line).map_err(|e| format!("a node's step: {e}"))?;
        let exit = matches!(parsed, StepEvent::Exit { .. });
        let failed = matches!(parsed, StepEvent::Failed { .. });
        event(parsed);
        exits += usize::from(exit);
        if exits == tasks || failed {
            return Ok(());
        }
    }
    Err("a node's step ended before its tasks did".into())
}
