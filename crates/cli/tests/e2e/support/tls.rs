//! Servers and agents over TLS for the TLS tests: network namespaces
//! joined to this one by veth pairs (other hosts, as far as the network
//! can tell), a server with a generated certificate, and the processes of
//! one test, ended however it ends.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ebb_server::tls::{ServerTls, TlsConfig};
use serde_json::Value;

use super::{ebb_exe, wait_for};

pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// A network namespace joined to this one by a veth pair, a /30 between
/// them: `host` on this side, `inside` in the namespace, whose default
/// route is `host`.
pub(crate) struct Pair {
    pub(crate) ns: String,
    pub(crate) host_if: String,
    pub(crate) host: Ipv4Addr,
    pub(crate) inside: Ipv4Addr,
}

/// Namespaces made for one test, removed when it ends however it ends.
pub(crate) struct Namespaces {
    pub(crate) pairs: Vec<Pair>,
}

impl Namespaces {
    /// `n` namespaces on 10.213.X.0/30 subnets no interface here uses;
    /// names carry this process's id, so that runs side by side do not
    /// meet (interface names stay within Linux's 15 bytes).
    pub(crate) fn make(n: usize) -> Namespaces {
        let pid = std::process::id();
        let used =
            String::from_utf8(Command::new("ip").args(["-4", "-o", "addr", "show"]).output().unwrap().stdout)
                .unwrap();
        let start = (pid % 200) as usize;
        let base = (start..start + 250)
            .map(|b| b % 250)
            .find(|b| (*b..b + n).all(|x| !used.contains(&format!("10.213.{x}."))))
            .expect("a free 10.213.X.0/30 for the test's namespaces");
        let mut made = Namespaces { pairs: Vec::new() };
        for i in 0..n {
            let octet = u8::try_from(base + i).unwrap();
            let pair = Pair {
                ns: format!("ebb-tls-{pid}-{i}"),
                host_if: format!("eb{pid}h{i}"),
                host: Ipv4Addr::new(10, 213, octet, 1),
                inside: Ipv4Addr::new(10, 213, octet, 2),
            };
            let inner_if = format!("eb{pid}n{i}");
            let (host, inside) = (format!("{}/30", pair.host), format!("{}/30", pair.inside));
            let ns = pair.ns.clone();
            ip(&["netns", "add", &ns]).unwrap_or_else(|e| {
                panic!(
                    "this test runs agents in network namespaces of their own and needs root (CAP_NET_ADMIN) \
                     to make them with `ip netns` and veth pairs: {e}"
                )
            });
            made.pairs.push(pair);
            let pair = made.pairs.last().unwrap();
            for step in [
                &["link", "add", &pair.host_if, "type", "veth", "peer", "name", &inner_if, "netns", &ns][..],
                &["addr", "add", &host, "dev", &pair.host_if],
                &["link", "set", &pair.host_if, "up"],
                &["-n", &ns, "addr", "add", &inside, "dev", &inner_if],
                &["-n", &ns, "link", "set", &inner_if, "up"],
                // Each attempt's metadata endpoint is on the node's loopback.
                &["-n", &ns, "link", "set", "lo", "up"],
                &["-n", &ns, "route", "add", "default", "via", &pair.host.to_string()],
            ] {
                ip(step).unwrap_or_else(|e| panic!("cannot set up namespace {ns}: {e}"));
            }
        }
        made
    }

    /// Bytes this side of pair `i` has received.
    pub(crate) fn received(&self, i: usize) -> u64 {
        let path = format!("/sys/class/net/{}/statistics/rx_bytes", self.pairs[i].host_if);
        std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for pair in &self.pairs {
            // Removing either end removes the pair; the namespace may be
            // gone already with its end.
            let _ = ip(&["link", "del", &pair.host_if]);
            if let Err(e) = ip(&["netns", "del", &pair.ns]) {
                eprintln!("{e}");
            }
        }
    }
}

/// A server with a generated certificate, and what it says.
pub(crate) struct Server {
    pub(crate) dir: PathBuf,
    pub(crate) url: String,
    pub(crate) admin: String,
}

impl Server {
    /// Starts it on `listen`, its process one of `processes`.
    pub(crate) fn start(dir: &Path, listen: &str, processes: &mut Processes) -> Server {
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let server_dir = dir.join("server");
        let child = Command::new(ebb_exe())
            .args([
                "server",
                "--data-dir",
                server_dir.to_str().unwrap(),
                "--listen",
                listen,
                "--tls-generate",
            ])
            .args(["--default-run-as", &current_user(), "--heartbeat-interval", "200ms"])
            .stdout(log(dir, "server"))
            .stderr(log(dir, "server"))
            .spawn()
            .unwrap();
        processes.0.push(child);
        let url = wait_for("server.url", Duration::from_secs(20), || {
            std::fs::read_to_string(server_dir.join("server.url")).ok().filter(|s| !s.trim().is_empty())
        })
        .trim()
        .to_string();
        let admin = std::fs::read_to_string(server_dir.join("admin.token")).unwrap().trim().to_string();
        Server { dir: dir.to_path_buf(), url, admin }
    }

    pub(crate) fn ca(&self) -> PathBuf {
        self.dir.join("server/ca.crt")
    }

    /// The fingerprint the server printed for agents to join with.
    pub(crate) fn printed_fingerprint(&self) -> String {
        wait_for("the server's join hint", Duration::from_secs(10), || {
            let log = std::fs::read_to_string(self.dir.join("logs/server.log")).ok()?;
            let hint =
                log.lines().find(|l| l.starts_with("ebb server: agents join with --ca-fingerprint "))?;
            hint.split_whitespace().find(|w| w.starts_with("sha256:")).map(str::to_string)
        })
    }

    /// The CLI, from this namespace, verifying with `ca`.
    pub(crate) fn ebb(&self, ca: &Path, args: &[&str]) -> Output {
        Command::new(ebb_exe())
            .args(args)
            .current_dir(&self.dir)
            .env("EBB_SERVER", &self.url)
            .env("EBB_TOKEN", &self.admin)
            .env("EBB_CA", ca)
            .env_remove("EBB_CONFIG")
            .output()
            .unwrap()
    }

    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let out = self.ebb(&self.ca(), args);
        assert!(out.status.success(), "ebb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub(crate) fn nodes_up(&self) -> Vec<String> {
        let nodes = self.json(&["nodes", "--json"]);
        let up = nodes.as_array().unwrap().iter().filter(|n| n["status"] == "up");
        up.map(|n| n["name"].as_str().unwrap().to_string()).collect()
    }
}

pub(crate) fn current_user() -> String {
    String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap().trim().to_string()
}

pub(crate) fn log(dir: &Path, name: &str) -> Stdio {
    let path = dir.join("logs").join(format!("{name}.log"));
    Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap())
}

pub(crate) fn read_log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default()
}

/// `ebb agent` in namespace `ns`, with fake GPUs, joining `url` with
/// `trust` (`--ca-fingerprint ...` or `--ca FILE`).
pub(crate) fn agent_in(
    ns: &str,
    dir: &Path,
    url: &str,
    name: &str,
    address: Ipv4Addr,
    trust: &[&str],
) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, ebb_exe(), "agent", "--server", url, "--name", name])
        .args(trust)
        .args(["--join-token-file", dir.join("server/join.token").to_str().unwrap()])
        .args(["--fake-gpus", "2", "--gpu-model", "H100-80GB", "--stop-timeout", "1s"])
        .args(["--data-dir", dir.join("agents").join(name).to_str().unwrap()])
        .args(["--checkpoint-root", dir.join("checkpoints").to_str().unwrap()])
        .args([
            "--address",
            &address.to_string(),
            "--allow-root-jobs",
            "--job-path",
            &std::env::var("PATH").unwrap(),
        ])
        .stdout(log(dir, name))
        .stderr(log(dir, name))
        .spawn()
        .unwrap()
}

/// Processes of one test, ended (SIGTERM, then waited for) when it ends,
/// the last started first: agents end their jobs, then the server.
pub(crate) struct Processes(pub(crate) Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.0.iter_mut().rev() {
            if let Ok(None) = child.try_wait() {
                let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
                let _ = child.wait();
            }
        }
    }
}

pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ebb-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Another CA than the server's, of the same make (same name, another key).
pub(crate) fn another_ca(dir: &Path) -> PathBuf {
    let other = dir.join("other-ca");
    std::fs::create_dir_all(&other).unwrap();
    let config = TlsConfig::Generate { extra_names: Vec::new() };
    ServerTls::prepare(&config, &other, "127.0.0.1:0".parse().unwrap()).unwrap();
    other.join("ca.crt")
}

pub(crate) fn netns_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap()
}
