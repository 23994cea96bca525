//! Steps across a Slurm job's nodes. Its first node's batch step keeps a
//! directory (`EBB_SLURM_HUB`, the gang's rendezvous port): the batch step
//! on each other node listens on a port of its own, registers there, and
//! starts the tasks `srun` sends it, streaming their output and exits
//! back. Every message is a line of JSON and carries the attempt's key
//! (`EBB_SLURM_KEY`); one without it is dropped. A node's batch step ends
//! when the first node's does (its registration's connection closes).
//!
//! The listeners are reachable by other tenants' jobs, so each is bounded
//! ([`Bounds`]): it listens on the node's own address (the one the gang's
//! nodes are given) rather than every interface, takes a bounded number
//! of connections at once, closes one whose first line has not come in
//! time or is too long, compares the key in constant time, and throws
//! away whatever a held-open connection sends after it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::attached::{copy_bytes, feed, until_gone};
use super::step::{self, Names};
use super::steps::{self, StepInfo, StepSignal};

/// Why a step could not be run across a job's nodes: the connection
/// between its nodes' batch steps, in words that name the node.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("the step directory on port {port}: {source}")]
    Listen { port: u16, source: std::io::Error },
    /// A node (`what`: which, and where) could not be reached.
    #[error("{what}: {source}")]
    Connect { what: String, source: std::io::Error },
    #[error("the step's connection: {0}")]
    Io(#[from] std::io::Error),
    /// A node said something that is not the step protocol.
    #[error("{what}: {source}")]
    Protocol { what: &'static str, source: serde_json::Error },
    #[error("node {node} of the job did not join its steps within {seconds}s")]
    Missing { node: u32, seconds: u64 },
    #[error("a node's step ended before its tasks did")]
    Ended,
}

/// How long a node's batch step tries to reach the first node's, and
/// `srun` waits for every node to have registered.
const MEET: Duration = Duration::from_secs(60);

/// What one listener takes from whoever connects.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The longest first line (a step's request carries `srun`'s whole
    /// environment).
    pub line_bytes: u64,
    /// How long the first line may take to come.
    pub first_line: Duration,
    /// Connections open at once; more are closed as they come.
    pub connections: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds { line_bytes: 4 << 20, first_line: Duration::from_secs(10), connections: 256 }
    }
}

/// Accepts on `listener` within `bounds`, each connection in a thread of
/// its own running `serve` with its first line, which came in time, was
/// no longer than the bound and carried `key`.
fn accept<T: serde::de::DeserializeOwned + Send + 'static>(
    listener: TcpListener,
    key: String,
    bounds: Bounds,
    serve: impl Fn(TcpStream, BufReader<TcpStream>, T) + Send + Sync + 'static,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            if open.fetch_add(1, Ordering::SeqCst) >= bounds.connections {
                open.fetch_sub(1, Ordering::SeqCst);
                continue; // dropped: closed at once
            }
            let (open, serve, key) = (open.clone(), serve.clone(), key.clone());
            std::thread::spawn(move || {
                if let Some((reader, body)) = first_line::<T>(&stream, &key, bounds) {
                    serve(stream, reader, body);
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
}

/// The connection's first line as a keyed `T`, or None (and the
/// connection dropped): late, too long, not a `T`, or another key.
fn first_line<T: serde::de::DeserializeOwned>(
    stream: &TcpStream,
    key: &str,
    bounds: Bounds,
) -> Option<(BufReader<TcpStream>, T)> {
    stream.set_read_timeout(Some(bounds.first_line)).ok()?;
    let started = Instant::now();
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = Vec::new();
    // One read at a time, so that a trickle of bytes cannot stretch the
    // time the line may take.
    while !line.ends_with(b"\n") {
        let left = bounds.first_line.checked_sub(started.elapsed())?;
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok()?;
        let room = bounds.line_bytes.saturating_sub(line.len() as u64);
        if room == 0 {
            return None;
        }
        let n = (&mut reader).take(room).read_until(b'\n', &mut line).ok()?;
        if n == 0 {
            return None;
        }
    }
    stream.set_read_timeout(None).ok()?;
    let keyed: Keyed<T> = serde_json::from_slice(&line).ok()?;
    same_key(&keyed.key, key).then_some((reader, keyed.body))
}

/// Whether two keys are the same, in a time that does not depend on
/// where they differ.
fn same_key(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let mut differ = u8::from(a.len() != b.len());
    for (i, byte) in b.iter().enumerate() {
        differ |= byte ^ a.get(i).copied().unwrap_or(0);
    }
    differ == 0
}

/// Reads and throws away what the other end sends until it closes.
fn until_closed(reader: &mut impl Read) {
    let _ = std::io::copy(reader, &mut std::io::sink());
}

/// A listener on `address`'s host at `port` (the node's own address, the
/// one the gang's nodes reach it at); on every interface where that host
/// is not this machine's (an address behind a NAT).
fn listen(address: &str, port: u16) -> std::io::Result<TcpListener> {
    let host =
        address.rsplit_once(':').map_or(address, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    match TcpListener::bind((host, port)) {
        Ok(listener) => Ok(listener),
        Err(_) => TcpListener::bind(("0.0.0.0", port)),
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Hello {
    /// A node's batch step: where it listens.
    Register { node: u32, at: String },
    /// `srun`: where the nodes listen, once `nodes` have registered.
    Directory { nodes: u32 },
    /// `srun --jobid` from outside the job: a step number, claimed for as
    /// long as this connection is open, and where every node (the first
    /// too) listens, once `nodes` have registered; `info` is what the
    /// step is, for `squeue -s`.
    Attach {
        nodes: u32,
        #[serde(default)]
        info: Option<StepInfo>,
    },
    /// `squeue -s`: the steps running now ([`steps::listed`]).
    Steps,
    /// `scancel ID.STEP`: `signal` to step `step`'s tasks on every node;
    /// answers whether the step runs.
    Signal { step: u32, signal: StepSignal },
}

/// The directory's answer to [`Hello::Attach`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Attached {
    pub step: u32,
    pub nodes: BTreeMap<u32, String>,
}

/// The first node's own step listener and steps directory, which its
/// directory serves `srun --jobid` with.
pub struct FirstNode {
    pub at: String,
    pub steps: std::path::PathBuf,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Keyed<T> {
    pub key: String,
    pub body: T,
}

/// The tasks of one step on one node (or, with `signal`, a signal to
/// them).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    /// From `srun --jobid` outside the job: the tasks' output comes back
    /// byte for byte ([`StepEvent::Data`]) and their standard input from
    /// `srun`'s ([`super::attached::StepInput`]); a directory missing here is `/tmp`, as
    /// Slurm's.
    #[serde(default)]
    pub attached: bool,
    /// `scancel ID.STEP`, passed on by the first node: no tasks to start,
    /// a signal to those of step `step` here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<StepSignal>,
    /// Pyxis' options: the tasks run in this container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<super::pyxis::Container>,
}

/// What a node sends back: a line a task wrote, or its exit.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepEvent {
    Out {
        task: u32,
        line: String,
        err: bool,
    },
    /// An attached step's output, bytes in base64.
    Data {
        task: u32,
        data: String,
        err: bool,
    },
    Exit {
        task: u32,
        code: i32,
    },
    Failed {
        message: String,
    },
}

pub(super) fn send<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// The first node's directory, in a thread of its batch step: nodes
/// register, `srun`s ask; `first`, the first node's own step listener,
/// is where `srun --jobid` reaches this node.
pub fn serve_directory(hub: &str, key: String, first: FirstNode) -> Result<(), StepError> {
    serve_directory_within(hub, key, Some(first), Bounds::default()).map(|_| ())
}

/// [`serve_directory`] within `bounds`; the port it listens on.
fn serve_directory_within(
    hub: &str,
    key: String,
    first: Option<FirstNode>,
    bounds: Bounds,
) -> Result<u16, StepError> {
    let port: u16 = hub.rsplit_once(':').map_or(hub, |(_, p)| p).parse().unwrap_or(0);
    let listener = listen(hub, port).map_err(|source| StepError::Listen { port, source })?;
    let port = listener.local_addr().map(|a| a.port())?;
    let mut known = BTreeMap::new();
    let steps = first.map(|f| {
        known.insert(0, f.at);
        f.steps
    });
    let nodes: Arc<Mutex<BTreeMap<u32, String>>> = Arc::new(Mutex::new(known));
    let own_key = key.clone();
    accept(listener, key, bounds, move |stream, mut reader, hello: Hello| {
        directory_client(stream, &mut reader, (&nodes, &own_key), steps.as_deref(), hello)
    });
    Ok(port)
}

fn directory_client(
    mut stream: TcpStream,
    reader: &mut BufReader<TcpStream>,
    (nodes, key): (&Mutex<BTreeMap<u32, String>>, &str),
    steps: Option<&Path>,
    hello: Hello,
) {
    // Every node in `from..wanted` registered, or the time to meet gone.
    let met = |from: u32, wanted: u32| {
        let deadline = Instant::now() + MEET;
        loop {
            let known = nodes.lock().expect("directory").clone();
            if (from..wanted).all(|n| known.contains_key(&n)) || Instant::now() > deadline {
                return known;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    match hello {
        Hello::Register { node, at } => {
            nodes.lock().expect("directory").insert(node, at);
            // Held open: the node's batch step ends when this one does.
            until_closed(reader);
        }
        Hello::Directory { nodes: wanted } => {
            let _ = send(&mut stream, &met(1, wanted));
        }
        Hello::Attach { nodes: wanted, info } => {
            let Some(steps) = steps else { return };
            let Ok((step, claimed)) = step::claim_step(steps) else { return };
            if let Some(info) = &info {
                steps::record(steps, step, info);
            }
            let known = met(0, wanted);
            if send(&mut stream, &Attached { step, nodes: known }).is_ok() {
                // The number is the step's while its srun is connected.
                until_closed(reader);
            }
            steps::forget(steps, step);
            let _ = std::fs::remove_file(claimed);
        }
        Hello::Steps => {
            let listed = steps.map(steps::listed).unwrap_or_default();
            let _ = send(&mut stream, &listed);
        }
        Hello::Signal { step, signal } => {
            let runs = steps.is_some_and(|s| s.join(step.to_string()).exists());
            if runs {
                steps::pass_signal(&nodes.lock().expect("directory").clone(), key, step, signal);
            }
            let _ = send(&mut stream, &runs);
        }
    }
}

/// Where the job's nodes are, and a step number, for `srun --jobid` from
/// outside the job: from the first node's directory at `hub`. The
/// connection returned holds the number; close it when the step ends.
pub fn attach(hub: &str, key: &str, nodes: u32, info: StepInfo) -> Result<(Attached, TcpStream), StepError> {
    // A job just started may not have its directory up yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(hub) {
            Ok(stream) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(source) => {
                return Err(StepError::Connect { what: format!("the job's first node ({hub})"), source })
            }
        }
    };
    send(&mut stream, &Keyed { key: key.to_string(), body: Hello::Attach { nodes, info: Some(info) } })?;
    let mut line = String::new();
    BufReader::new(stream.try_clone()?).read_line(&mut line)?;
    if line.is_empty() {
        return Err(StepError::Ended);
    }
    let attached: Attached = serde_json::from_str(&line)
        .map_err(|source| StepError::Protocol { what: "the step directory", source })?;
    if let Some(node) = (0..nodes).find(|n| !attached.nodes.contains_key(n)) {
        return Err(StepError::Missing { node, seconds: MEET.as_secs() });
    }
    Ok((attached, stream))
}

/// This node's step listener, on its own address (`EBB_SLURM_ADDRESS`):
/// it runs the steps `srun` sends it, as the job's processes (this
/// process's children, whose variables `env` are). Where it listens.
pub fn serve_steps(key: String, steps: &Path, env: BTreeMap<String, String>) -> Result<String, StepError> {
    let address = env.get("EBB_SLURM_ADDRESS").cloned().unwrap_or_default();
    let listener = listen(&address, 0).map_err(|source| StepError::Listen { port: 0, source })?;
    let port = listener.local_addr().map(|a| a.port())?;
    let steps_dir = steps.to_path_buf();
    accept(listener, key, Bounds::default(), move |stream, reader, request: StepRequest| {
        run_remote_step(stream, reader, request, &steps_dir, &env)
    });
    Ok(format!("{address}:{port}"))
}

/// Where the other nodes' batch steps listen, once `nodes` have registered.
pub fn directory(hub: &str, key: &str, nodes: u32) -> Result<BTreeMap<u32, String>, StepError> {
    let known: BTreeMap<u32, String> =
        ask(hub, key, Hello::Directory { nodes }, MEET + Duration::from_secs(10))?;
    if let Some(node) = (1..nodes).find(|n| !known.contains_key(n)) {
        return Err(StepError::Missing { node, seconds: MEET.as_secs() });
    }
    Ok(known)
}

/// Asks the job's first node's directory at `hub` one question: its
/// answer, given up if it does not come within `within` (or the node
/// cannot be reached within seconds).
pub(super) fn ask<T: serde::de::DeserializeOwned>(
    hub: &str,
    key: &str,
    hello: Hello,
    within: Duration,
) -> Result<T, StepError> {
    use std::net::ToSocketAddrs;
    let connect = || {
        let address = hub.to_socket_addrs()?.next().ok_or(std::io::ErrorKind::AddrNotAvailable)?;
        let stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(within))?;
        Ok::<_, std::io::Error>(stream)
    };
    let mut stream = connect()
        .map_err(|source| StepError::Connect { what: format!("the job's first node ({hub})"), source })?;
    send(&mut stream, &Keyed { key: key.to_string(), body: hello })?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        return Err(StepError::Ended);
    }
    serde_json::from_str(&line).map_err(|source| StepError::Protocol { what: "the step directory", source })
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
    let at = serve_steps(key.clone(), steps, env.clone())
        .unwrap_or_else(|e| fail(format!("cannot listen for steps: {e}")));
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
        until_closed(&mut registration);
        std::process::exit(0);
    });
    loop {
        match step::next_signal(&waited) {
            // No batch shell runs here: a B: signal has no one to reach.
            Some((signo, Some(route))) => {
                use ebb_agent::slurm::Route;
                let to_steps = match route {
                    Route::Drain => !to_batch,
                    Route::Steps | Route::Full => true,
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
fn run_remote_step(
    stream: TcpStream,
    mut reader: BufReader<TcpStream>,
    request: StepRequest,
    steps: &Path,
    own_env: &BTreeMap<String, String>,
) {
    if let Some(signal) = request.signal {
        steps::signal_here(steps, request.step, signal);
        return;
    }
    if request.argv.is_empty() {
        return;
    }
    let out = Arc::new(Mutex::new(stream));
    let emit = |event: StepEvent| {
        let _ = send(&mut out.lock().expect("step stream"), &event);
    };
    let mut names = Names::from_env(own_env);
    names.step = request.step.to_string();
    let file = steps.join(format!("{}.{}", request.step, names.node_index));
    // An attached step's directory, where it is here; else Slurm's /tmp.
    let cwd = match &request.cwd {
        Some(dir) if request.attached && !Path::new(dir).is_dir() => {
            let line = format!(
                "slurmstepd: error: couldn't chdir to `{dir}': No such file or directory: going to /tmp instead\n"
            );
            let task = request.tasks.first().map_or(0, |t| t.0);
            emit(StepEvent::Data { task, data: BASE64.encode(line), err: true });
            Some("/tmp".to_string())
        }
        other => other.clone(),
    };
    let container =
        request.container.as_ref().map(|c| super::pyxis::prepare(c, own_env, steps, request.step));
    let spec = match container.transpose() {
        Ok(spec) => spec,
        Err(e) => return emit(StepEvent::Failed { message: format!("pyxis: {e} (on {})", names.node) }),
    };
    let mut children = Vec::new();
    let mut inputs = Vec::new();
    let mut readers = Vec::new();
    for &(task, local) in &request.tasks {
        names.task = Some(task);
        let mut command = match super::pyxis::task_command(spec.as_ref(), &request.argv) {
            Ok(command) => command,
            Err(e) => return emit(StepEvent::Failed { message: e.to_string() }),
        };
        let stdin = if request.attached { Stdio::piped() } else { Stdio::null() };
        step::unblocked(&mut command).stdin(stdin).env_clear();
        let mut env = own_env.clone();
        env.extend(request.env.iter().filter(|(k, _)| !node_own(k)).map(|(k, v)| (k.clone(), v.clone())));
        env.extend(request.task_env.get(&task).cloned().unwrap_or_default());
        env.insert("SLURM_LOCALID".into(), local.to_string());
        command.envs(env);
        if let Some(dir) = &cwd {
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
        inputs.extend(child.stdin.take());
        for (pipe, err) in [
            (child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), false),
            (child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), true),
        ] {
            if let Some(pipe) = pipe {
                let out = out.clone();
                let attached = request.attached;
                readers.push(std::thread::spawn(move || match attached {
                    true => copy_bytes(pipe, |data| {
                        let data = BASE64.encode(data);
                        send(&mut out.lock().expect("step stream"), &StepEvent::Data { task, data, err })
                    }),
                    false => {
                        for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
                            let line = String::from_utf8_lossy(&line).into_owned();
                            let event = StepEvent::Out { task, line, err };
                            let _ = send(&mut out.lock().expect("step stream"), &event);
                        }
                    }
                }));
            }
        }
        children.push((task, child));
    }
    let pids: Vec<String> = children.iter().map(|(_, c)| c.id().to_string()).collect();
    let _ = std::fs::write(&file, pids.join("\n"));
    // The srun at the other end gone: its tasks here go too. An attached
    // step's input comes this way first.
    let pids_for_kill: Vec<i32> = children.iter().map(|(_, c)| c.id() as i32).collect();
    let kill = move || {
        for &pid in &pids_for_kill {
            // SAFETY: kill with plain numbers.
            unsafe {
                nix::libc::kill(pid, nix::libc::SIGKILL);
            }
        }
    };
    if let Some(watched) = inputs.first().and_then(|_| reader.get_ref().try_clone().ok()) {
        let kill = kill.clone();
        std::thread::spawn(move || {
            until_gone(&watched);
            kill();
        });
    }
    std::thread::spawn(move || {
        if !inputs.is_empty() {
            feed(&mut reader, inputs);
        }
        until_closed(&mut reader);
        kill();
    });
    for reader in readers {
        let _ = reader.join();
    }
    for (task, mut child) in children {
        let code = child.wait().map_or(1, step::exit_code);
        emit(StepEvent::Exit { task, code });
    }
    if let Some(spec) = &spec {
        super::pyxis::finish(spec);
    }
    let _ = std::fs::remove_file(&file);
}

/// Sends node `node` (at `at`) its share of a step; returns the stream
/// its events come back on.
pub fn start_remote(at: &str, key: &str, request: &StepRequest) -> Result<TcpStream, StepError> {
    let mut stream = TcpStream::connect(at)
        .map_err(|source| StepError::Connect { what: format!("the job's node at {at}"), source })?;
    send(&mut stream, &Keyed { key: key.to_string(), body: request.clone() })?;
    Ok(stream)
}

/// Reads a node's step events until it has sent `tasks` exits, passing
/// each to `event`.
pub fn follow(stream: TcpStream, tasks: usize, mut event: impl FnMut(StepEvent)) -> Result<(), StepError> {
    let mut exits = 0;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let parsed: StepEvent = serde_json::from_str(&line)
            .map_err(|source| StepError::Protocol { what: "a node's step", source })?;
        let exit = matches!(parsed, StepEvent::Exit { .. });
        let failed = matches!(parsed, StepEvent::Failed { .. });
        event(parsed);
        exits += usize::from(exit);
        if exits == tasks || failed {
            return Ok(());
        }
    }
    Err(StepError::Ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads until the other end closes (Some(bytes read)) or `within`
    /// passes (None).
    fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<usize> {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        let mut total = 0;
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return Some(total),
                Ok(n) => total += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(total),
                Err(_) => return None,
            }
        }
    }

    fn keyed(key: &str, hello: &Hello) -> Vec<u8> {
        let mut line = serde_json::to_vec(&Keyed { key: key.to_string(), body: hello }).unwrap();
        line.push(b'\n');
        line
    }

    /// Another tenant's job at a batch step's listener: a line without end
    /// (it grew a step to 795 MB), nothing at all, the wrong key, or a
    /// thousand connections (threads) at once. Each is dropped, and the
    /// gang's own nodes still meet.
    #[test]
    fn a_listener_drops_endless_silent_and_unkeyed_lines_and_bounds_its_connections() {
        let bounds = Bounds { line_bytes: 1024, first_line: Duration::from_millis(500), connections: 4 };
        let port = serve_directory_within("127.0.0.1:0", "k".repeat(32), None, bounds).unwrap();
        let at = format!("127.0.0.1:{port}");

        let mut endless = TcpStream::connect(&at).unwrap();
        let sent = (0..64).take_while(|_| endless.write_all(&[b'x'; 4096]).is_ok()).count();
        assert!(
            sent < 64 || closed_within(&mut endless, Duration::from_secs(5)).is_some(),
            "an endless line is cut"
        );

        let mut silent = TcpStream::connect(&at).unwrap();
        assert!(
            closed_within(&mut silent, Duration::from_secs(5)).is_some(),
            "a silent connection is closed"
        );

        let mut unkeyed = TcpStream::connect(&at).unwrap();
        unkeyed.write_all(&keyed(&"x".repeat(32), &Hello::Directory { nodes: 1 })).unwrap();
        assert_eq!(closed_within(&mut unkeyed, Duration::from_secs(5)), Some(0), "another key gets nothing");

        // Four held open (within their first line's time), a fifth closed at once.
        let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&at).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let mut fifth = TcpStream::connect(&at).unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut fifth, Duration::from_secs(5)).is_some());
        assert!(started.elapsed() < Duration::from_millis(400), "the fifth waited {:?}", started.elapsed());
        drop(held);
        std::thread::sleep(Duration::from_millis(100));

        // The gang's own: a node registers, srun asks, the directory answers.
        let mut node = TcpStream::connect(&at).unwrap();
        node.write_all(&keyed(&"k".repeat(32), &Hello::Register { node: 1, at: "10.0.0.2:7".into() }))
            .unwrap();
        let known = wait_for_directory(&at, &"k".repeat(32));
        assert_eq!(known.get(&1).map(String::as_str), Some("10.0.0.2:7"));
        // What a registration sends afterwards is thrown away, not kept.
        for _ in 0..256 {
            node.write_all(&[b'y'; 4096]).unwrap();
        }
    }

    fn wait_for_directory(at: &str, key: &str) -> BTreeMap<u32, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match directory(at, key, 2) {
                Ok(known) => return known,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// `srun --jobid`'s claim: node 0 is the first node's own listener,
    /// each attach gets a step number of its own while connected, and
    /// another key gets nothing.
    #[test]
    fn an_attach_claims_a_step_number_while_connected_and_lists_every_node() {
        let steps = std::env::temp_dir().join(format!("ebb-attach-{}", std::process::id()));
        std::fs::create_dir_all(&steps).unwrap();
        let key = "k".repeat(32);
        let first = FirstNode { at: "10.0.0.1:5".into(), steps: steps.clone() };
        let port =
            serve_directory_within("127.0.0.1:0", key.clone(), Some(first), Bounds::default()).unwrap();
        let hub = format!("127.0.0.1:{port}");
        let mut node = TcpStream::connect(&hub).unwrap();
        node.write_all(&keyed(&key, &Hello::Register { node: 1, at: "10.0.0.2:7".into() })).unwrap();
        let info = |name: &str| StepInfo { name: name.into(), nodes: vec![0, 1], started_s: 5 };
        let (one, held) = attach(&hub, &key, 2, info("sky-1")).unwrap();
        let (two, _second) = attach(&hub, &key, 2, info("rsync")).unwrap();
        assert_eq!(one.nodes.values().collect::<Vec<_>>(), ["10.0.0.1:5", "10.0.0.2:7"]);
        assert_ne!(one.step, two.step);
        assert!(steps.join(one.step.to_string()).exists());
        // squeue -s: both, by number, with what each is.
        let access = ebb_api::StepAccess { hub: hub.clone(), key: key.clone(), env: Default::default() };
        let listed = steps::list(&access).unwrap();
        assert_eq!(listed.get(&one.step), Some(&Some(info("sky-1"))));
        assert_eq!(listed.get(&two.step), Some(&Some(info("rsync"))));
        assert!(!steps::signal(&access, 99, StepSignal::End).unwrap(), "no step 99 runs");
        drop(held);
        wait_until(|| !steps.join(one.step.to_string()).exists());
        assert!(!steps::list(&access).unwrap().contains_key(&one.step), "an ended step is not listed");
        assert!(attach(&hub, &"x".repeat(32), 2, info("x")).is_err(), "another key is answered");
        let _ = std::fs::remove_dir_all(&steps);
    }

    fn wait_until(done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "not within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn keys_compare_equal_only_when_equal() {
        assert!(same_key("abc", "abc"));
        for other in ["abd", "ab", "abcd", "", "ABC"] {
            assert!(!same_key(other, "abc"), "{other}");
        }
    }
}
