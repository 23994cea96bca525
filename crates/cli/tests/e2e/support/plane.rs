//! A control plane of two servers and two agents on one PostgreSQL, for
//! the failover tests, and a client that submits through it continuously.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{ebb_exe, wait_for};
use crate::pg;

pub(crate) const MODEL: &str = "H100-80GB";
pub(crate) const DRAIN_WINDOW_MS: u64 = 8000;

/// Two servers, two agents with two fake GPUs each, on one PostgreSQL.
pub(crate) struct Plane {
    pub(crate) dir: PathBuf,
    _pg: pg::Postgres,
    pub(crate) servers: Vec<Option<Child>>,
    pub(crate) urls: Vec<String>,
    pub(crate) agents: Vec<Child>,
    pub(crate) admin: String,
}

impl Plane {
    pub(crate) fn start(name: &str) -> Plane {
        let mut plane = Plane::servers(name);
        let servers = plane.urls.join(",");
        for i in 0..2 {
            let name = format!("node-{i}");
            let log = plane.log(&name);
            let agent = Command::new(ebb_exe())
                .args([
                    "agent",
                    "--server",
                    &servers,
                    "--name",
                    &name,
                    "--fake-gpus",
                    "2",
                    "--gpu-model",
                    MODEL,
                ])
                .args(["--join-token-file", plane.dir.join("server-0/join.token").to_str().unwrap()])
                .args(["--data-dir", plane.dir.join(&name).to_str().unwrap()])
                .args(["--checkpoint-root", plane.dir.join("checkpoints").to_str().unwrap()])
                .args(["--address", "127.0.0.1", "--allow-root-jobs", "--stop-timeout", "1s"])
                .args(["--job-path", &std::env::var("PATH").unwrap()])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            plane.agents.push(agent);
        }
        plane.wait_nodes_up(2);
        plane
    }

    /// The two servers, with a simulated fleet of `nodes` nodes of 8 GPUs
    /// (`ebb agent --simulate-nodes`, named `fleet-NNNNN`) instead of
    /// real agents.
    pub(crate) fn start_fleet(name: &str, nodes: u32) -> Plane {
        let mut plane = Plane::servers(name);
        let log = plane.log("fleet");
        let agent = Command::new(ebb_exe())
            .args(["agent", "--server", &plane.urls.join(","), "--name", "fleet"])
            .args(["--simulate-nodes", &nodes.to_string(), "--fake-gpus", "8", "--gpu-model", MODEL])
            .args(["--join-token-file", plane.dir.join("server-0/join.token").to_str().unwrap()])
            .args(["--data-dir", plane.dir.join("fleet").to_str().unwrap(), "--address", "127.0.0.1"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        plane.agents.push(agent);
        plane.wait_nodes_up(nodes as usize);
        plane
    }

    pub(crate) fn wait_nodes_up(&self, n: usize) {
        wait_for("the nodes up", Duration::from_secs(60), || {
            let nodes: Value = serde_json::from_slice(&self.ebb(&["nodes", "--json"]).stdout).ok()?;
            (nodes.as_array()?.iter().filter(|n| n["status"] == "up").count() == n).then_some(())
        });
    }

    /// Two servers on a PostgreSQL of their own: 0 leads, 1 follows.
    fn servers(name: &str) -> Plane {
        let pg = pg::Postgres::start(name);
        let dir = std::env::temp_dir().join(format!("ebb-failover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("submit")).unwrap();
        let mut plane = Plane {
            dir,
            servers: Vec::new(),
            urls: Vec::new(),
            agents: Vec::new(),
            admin: String::new(),
            _pg: pg,
        };
        for i in 0..2 {
            plane.start_server(i);
            let role = if i == 0 { "leader" } else { "follower" };
            plane.wait_role(i, role);
        }
        plane.admin = std::fs::read_to_string(plane.dir.join("server-0/admin.token")).unwrap().trim().into();
        plane
    }

    pub(crate) fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .unwrap()
    }

    pub(crate) fn start_server(&mut self, i: usize) {
        let data = self.dir.join(format!("server-{i}"));
        let listen =
            self.urls.get(i).map_or("127.0.0.1:0".to_string(), |u| u.trim_start_matches("http://").into());
        let _ = std::fs::remove_file(data.join("server.url"));
        let log = self.log(&format!("server-{i}"));
        let child = Command::new(ebb_exe())
            .args(["server", "--data-dir", data.to_str().unwrap(), "--listen", &listen])
            .args(["--database", &self._pg.url(), "--lease", "2s", "--price", &format!("{MODEL}=3.60")])
            .args(["--drain-window", &format!("{DRAIN_WINDOW_MS}ms"), "--heartbeat-interval", "200ms"])
            .args([
                "--default-run-as",
                &nix::unistd::User::from_uid(nix::unistd::getuid()).unwrap().unwrap().name,
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let url = wait_for("server.url", Duration::from_secs(20), || {
            std::fs::read_to_string(data.join("server.url")).ok().filter(|s| !s.trim().is_empty())
        });
        if self.servers.len() <= i {
            self.servers.push(Some(child));
            self.urls.push(url.trim().to_string());
        } else {
            self.servers[i] = Some(child);
        }
    }

    pub(crate) fn health(&self, i: usize) -> Option<Value> {
        let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(1)).build().ok()?;
        http.get(format!("{}/healthz", self.urls[i])).send().ok()?.json().ok()
    }

    pub(crate) fn wait_role(&self, i: usize, role: &str) -> Value {
        wait_for(&format!("server {i} to be {role}"), Duration::from_secs(30), || {
            self.health(i).filter(|h| h["role"] == role)
        })
    }

    /// The CLI as the admin, given both servers.
    pub(crate) fn ebb(&self, args: &[&str]) -> Output {
        Command::new(ebb_exe())
            .args(args)
            .current_dir(self.dir.join("submit"))
            .env("EBB_SERVER", self.urls.join(","))
            .env("EBB_TOKEN", &self.admin)
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    }

    pub(crate) fn run(&self, args: &[&str]) -> String {
        let out = self.ebb(args);
        assert!(out.status.success(), "ebb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub(crate) fn submit(&self, args: &[&str]) -> u64 {
        let mut full = vec!["submit", "--json"];
        full.extend_from_slice(args);
        let v: Value = serde_json::from_str(&self.run(&full)).unwrap();
        v["id"].as_u64().unwrap()
    }

    pub(crate) fn job(&self, id: u64) -> Value {
        serde_json::from_str(&self.run(&["show", &id.to_string(), "--json"])).unwrap()
    }

    pub(crate) fn wait_job(&self, id: u64, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        wait_for(&format!("job {id}: {what}"), Duration::from_secs(60), || {
            let job = self.job(id);
            check(&job).then_some(job)
        })
    }

    /// The database both servers share, as a client of it.
    pub(crate) fn database(&self) -> String {
        self._pg.url()
    }

    pub(crate) fn checkpoints(&self, id: u64) -> PathBuf {
        self.dir.join("checkpoints/default").join(id.to_string())
    }

    pub(crate) fn signal(&self, i: usize, signal: &str) {
        let pid = self.servers[i].as_ref().unwrap().id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    pub(crate) fn kill_server(&mut self, i: usize) {
        let mut child = self.servers[i].take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub(crate) fn server_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("server-{i}.log"))).unwrap_or_default()
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        let term = |child: &Child| {
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        };
        self.agents.iter().for_each(term);
        for agent in &mut self.agents {
            let _ = agent.wait();
        }
        for server in self.servers.iter_mut().flatten() {
            term(server);
            let _ = server.wait();
        }
        if std::thread::panicking() {
            eprintln!("failover files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Submits jobs one after another until stopped, through both servers;
/// keeps the ids of those answered 2xx.
pub(crate) struct Submitter {
    stop: Arc<AtomicBool>,
    /// Submissions answered 2xx so far.
    answered: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<(Vec<u64>, usize)>,
}

impl Submitter {
    /// As a tenant of its own, so that the bill of the jobs under test is
    /// theirs alone.
    pub(crate) fn start(plane: &Plane) -> Submitter {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let tenant: Value =
            serde_json::from_str(&plane.run(&["tenant", "create", "steady", "--json"])).unwrap();
        let token = tenant["token"].as_str().unwrap().to_string();
        let (flag, dir, servers, admin) =
            (stop.clone(), plane.dir.join("submit"), plane.urls.join(","), token);
        let count = answered.clone();
        let thread = std::thread::spawn(move || {
            let (mut answered, mut refused) = (Vec::new(), 0);
            while !flag.load(Ordering::SeqCst) {
                let out = Command::new(ebb_exe())
                    .args(["submit", "--json", "--name", "steady", "--", "true"])
                    .current_dir(&dir)
                    .env("EBB_SERVER", &servers)
                    .env("EBB_TOKEN", &admin)
                    .stderr(Stdio::null())
                    .output()
                    .unwrap();
                match serde_json::from_slice::<Value>(&out.stdout) {
                    Ok(v) if out.status.success() => {
                        answered.push(v["id"].as_u64().unwrap());
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => refused += 1,
                }
            }
            (answered, refused)
        });
        Submitter { stop, answered, thread }
    }

    /// How many submissions have been answered 2xx so far.
    pub(crate) fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits until `n` submissions in all have been answered 2xx.
    pub(crate) fn wait_answered(&self, n: usize) {
        wait_for(&format!("{n} submissions answered"), Duration::from_secs(60), || {
            (self.answered() >= n).then_some(())
        });
    }

    pub(crate) fn finish(self) -> (Vec<u64>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}
