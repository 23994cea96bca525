//! Pyxis' `--container-*` options on `srun`: a step's tasks in an OCI
//! image, as Pyxis and enroot run them on a Slurm cluster, unprivileged.
//!
//! On each node of the step, before its tasks start, [`prepare`] finds
//! the step's container: a named one the job made earlier on this node
//! (`--container-name`), or a new one from the image, which the node's
//! agent resolves (the server pins the tag with the tenant's registry
//! login, as at submit), pulls into its cache and shows to this attempt
//! alone, read-only, its files owned by the job's user. Each task is then
//! `ebb slurm-container SPEC -- PROGRAM...` ([`enter`]), which enters the
//! container's namespaces, or makes them: a user namespace that maps the
//! job's user to itself, or to root with `--container-remap-root` (root
//! inside, the job's user outside: never the node's root), a mount
//! namespace whose root is the image under an overlay whose upper layer
//! is the container's own (its changes last as long as the job's
//! attempt, and a named container's are seen by the job's later steps).
//! The node's `/proc`, `/sys`, `/dev`, its hosts and resolver files, the
//! job's checkpoint and run directories and (unless told not to) its home
//! are bound in; the network and PIDs are the node's, as with Pyxis.
//! Then the task runs: same pid, same signals, same cgroup as a bare
//! task, so that drains, cancels and `scancel ID.N` reach it unchanged.

pub mod enter;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::options::{self, Given};
use crate::error::{failed, usage, CliError};

/// What `--container-name NAME:FLAG` asks of an existing container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameMode {
    /// Join it if it runs, use its files if it does not, make it if there
    /// is none.
    #[default]
    Auto,
    /// Make it: an error if it exists.
    Create,
    /// Join it: an error unless it runs.
    Exec,
    /// Use its files, in namespaces of the step's own.
    NoExec,
}

/// A `--container-mounts` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// A host path (absolute), or `tmpfs`.
    pub source: String,
    /// Inside the container (absolute).
    pub target: String,
    pub read_only: bool,
}

/// The step's container, as its options ask for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// An image reference as a registry names it (Pyxis' `REGISTRY#IMAGE`
    /// already rewritten).
    pub image: Option<String>,
    pub name: Option<String>,
    pub mode: NameMode,
    pub mounts: Vec<Mount>,
    pub workdir: Option<String>,
    pub remap_root: bool,
    pub mount_home: bool,
    pub writable: bool,
    pub entrypoint: bool,
    /// Variables whose host value wins over the image's.
    pub env: Vec<String>,
    /// Namespaces of its own besides Pyxis' (`net`, `ipc`, `uts`).
    pub unshare: Vec<String>,
}

/// The longest name a container may have.
const MAX_NAME: usize = 128;

/// The container `srun`'s options (and Pyxis' `PYXIS_CONTAINER_*`
/// variables, which the options override) ask for; none without
/// `--container-image` or `--container-name`.
pub fn from_given(given: &Given, env: &BTreeMap<String, String>) -> Result<Option<Container>, CliError> {
    let var = |name: &str| env.get(&format!("PYXIS_CONTAINER_{name}")).filter(|v| !v.is_empty()).cloned();
    let value = |long: &str, name: &str| options::last(given, long).map(str::to_string).or_else(|| var(name));
    let image = value("container-image", "IMAGE").map(|i| image_reference(&i)).transpose()?;
    let name = value("container-name", "NAME");
    if image.is_none() && name.is_none() {
        if let Some((long, _)) =
            given.iter().find(|(l, _)| l.starts_with("container-") || l.contains("-container-"))
        {
            return Err(usage(format!("--{long} needs --container-image or --container-name")));
        }
        return Ok(None);
    }
    let (name, mode) = match name {
        None => (None, NameMode::Auto),
        Some(text) => {
            let (name, flag) = text.split_once(':').unwrap_or((&text, "auto"));
            let mode = match flag {
                "auto" => NameMode::Auto,
                "create" => NameMode::Create,
                "exec" => NameMode::Exec,
                "no_exec" => NameMode::NoExec,
                other => {
                    return Err(usage(format!(
                        "--container-name={text}: the flag after ':' is auto, create, exec or no_exec, not {other:?}"
                    )))
                }
            };
            (Some(container_name(name)?), mode)
        }
    };
    let switch = |on: &str, off: &str, var_name: &str, default: bool| -> Result<bool, CliError> {
        match (options::flag(given, on), options::flag(given, off)) {
            (true, true) => Err(usage(format!("both --{on} and --{off} were given"))),
            (true, false) => Ok(true),
            (false, true) => Ok(false),
            (false, false) => match var(var_name).as_deref() {
                None => Ok(default),
                Some("1" | "true" | "yes" | "y") => Ok(true),
                Some("0" | "false" | "no" | "n") => Ok(false),
                Some(other) => Err(usage(format!("PYXIS_CONTAINER_{var_name}={other}: give 1 or 0"))),
            },
        }
    };
    let mut mounts = Vec::new();
    for list in given.iter().filter(|(l, _)| *l == "container-mounts").map(|(_, v)| v.clone()) {
        mounts.extend(parse_mounts(&list)?);
    }
    if mounts.is_empty() {
        if let Some(list) = var("MOUNTS") {
            mounts = parse_mounts(&list)?;
        }
    }
    let list = |long: &str, var_name: &str| -> Vec<String> {
        let text = value(long, var_name).unwrap_or_default();
        text.split(',').filter(|w| !w.is_empty()).map(str::to_string).collect()
    };
    let unshare = list("container-unshare", "UNSHARE");
    if let Some(bad) = unshare.iter().find(|n| !["net", "ipc", "uts"].contains(&n.as_str())) {
        return Err(usage(format!("--container-unshare: {bad:?} is not one of net, ipc, uts")));
    }
    let workdir = value("container-workdir", "WORKDIR");
    if let Some(dir) = workdir.as_deref().filter(|d| !d.starts_with('/')) {
        return Err(usage(format!("--container-workdir={dir}: give an absolute path inside the container")));
    }
    Ok(Some(Container {
        image,
        name,
        mode,
        mounts,
        workdir,
        remap_root: switch("container-remap-root", "no-container-remap-root", "REMAP_ROOT", false)?,
        mount_home: switch("container-mount-home", "no-container-mount-home", "MOUNT_HOME", true)?,
        writable: !switch("container-readonly", "container-writable", "READONLY", false)?,
        entrypoint: switch("container-entrypoint", "no-container-entrypoint", "ENTRYPOINT", false)?,
        env: list("container-env", "ENV"),
        unshare,
    }))
}

/// An image as a registry names it, from Pyxis' (enroot's) form:
/// `[docker://][USER@][REGISTRY#]IMAGE[:TAG]`. A squashfs file is
/// refused: Ebb runs images from registries.
pub fn image_reference(given: &str) -> Result<String, CliError> {
    let bare = given.strip_prefix("docker://").unwrap_or(given);
    if bare.is_empty() {
        return Err(usage("--container-image: an image is needed"));
    }
    if bare.starts_with('/') || bare.starts_with('.') || bare.ends_with(".sqsh") {
        return Err(usage(format!(
            "--container-image={given}: Ebb runs images from registries, not squashfs files: push it \
             (skopeo copy) and name it as REGISTRY/IMAGE:TAG"
        )));
    }
    // enroot's `USER@` picks a login from its credentials file; Ebb's is
    // the tenant's (ebb registry login).
    let bare = match bare.split_once('@') {
        Some((user, rest)) if !user.contains('/') && !user.contains('#') && !rest.starts_with("sha256:") => {
            rest
        }
        _ => bare,
    };
    Ok(bare.replacen('#', "/", 1))
}

fn container_name(name: &str) -> Result<String, CliError> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    match fine {
        true => Ok(name.to_string()),
        false => Err(usage(format!(
            "--container-name={name}: a name is 1 to {MAX_NAME} letters, digits, '.', '_' or '-', not starting \
             with '.'"
        ))),
    }
}

/// `SRC:DST[:FLAGS][,SRC:DST...]`, flags joined by `+` (`ro+rprivate`).
pub fn parse_mounts(list: &str) -> Result<Vec<Mount>, CliError> {
    let mut mounts = Vec::new();
    for entry in list.split(',') {
        let bad = |why: &str| usage(format!("--container-mounts: {entry:?}: {why}"));
        let mut parts = entry.splitn(3, ':');
        let (source, target) = match (parts.next(), parts.next()) {
            (Some(s), Some(t)) if !s.is_empty() && !t.is_empty() => (s, t),
            _ => return Err(bad("give SRC:DST[:FLAGS]")),
        };
        let mut read_only = false;
        for flag in parts.next().unwrap_or("").split('+').filter(|f| !f.is_empty()) {
            match flag {
                "ro" => read_only = true,
                "rw" => read_only = false,
                "bind" | "rbind" | "private" | "rprivate" | "slave" | "rslave" | "nosuid" | "nodev"
                | "noexec" => {}
                other => {
                    return Err(bad(&format!("flag {other:?} is not one of ro, rw, rbind, rprivate, rslave")))
                }
            }
        }
        let source = match source {
            "tmpfs" => source.to_string(),
            "umount" => {
                return Err(bad("Ebb mounts nothing it would have to take away again: leave the entry out"))
            }
            s if s.starts_with('/') => s.to_string(),
            s if s.starts_with('.') => std::env::current_dir()
                .map(|d| d.join(s).display().to_string())
                .map_err(|e| bad(&format!("the current directory: {e}")))?,
            _ => return Err(bad("the source is an absolute path, a relative one (./), or tmpfs")),
        };
        let target = match target {
            t if t.starts_with('/') => t.to_string(),
            t if t.starts_with('.') => format!("/{}", t.trim_start_matches("./")),
            _ => return Err(bad("the target is a path inside the container")),
        };
        if target.split('/').any(|part| part == "..") {
            return Err(bad("the target may not climb out with '..'"));
        }
        mounts.push(Mount { source, target, read_only });
    }
    Ok(mounts)
}

/// The image, as this node's agent shows it to the attempt
/// (`POST /ebb/v1/image` on the job's endpoint).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    pub reference: String,
    pub digest: String,
    /// Its files, read-only, owned by the job's user.
    pub rootfs: String,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The node's CDI spec's mounts for the attempt's GPUs (the driver's
    /// libraries): host path, path inside, read-only.
    #[serde(default)]
    pub gpu_mounts: Vec<(String, String, bool)>,
    /// Its variables for them.
    #[serde(default)]
    pub gpu_env: Vec<String>,
}

/// What each task of a step on one node enters or makes
/// ([`enter::enter`]): its directory and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// `<steps>/containers/NAME`: `upper`, `work`, `rootfs`, the pids of
    /// the tasks in it (`pids/`), and the image it was made from.
    pub dir: PathBuf,
    pub image: Shown,
    pub container: Container,
    /// Join the container's namespaces where one of its tasks runs.
    pub join: bool,
    /// Host directories bound at the same path inside: the job's
    /// checkpoint and run directories.
    pub binds: Vec<String>,
    /// The job's home on the host.
    pub home: Option<String>,
    /// Remove the container when the step's tasks here have ended (one
    /// without a name).
    pub remove_after: bool,
}

/// The file in a container's directory that records its image.
const IMAGE_FILE: &str = "image.json";

/// On one node, before a step's tasks start: the container they run in.
/// Asks the node's agent for the image only when the container is new.
/// `step` names an unnamed container's directory.
pub fn prepare(
    container: &Container,
    env: &BTreeMap<String, String>,
    steps: &Path,
    step: u32,
) -> Result<Spec, String> {
    let root = steps.join("containers");
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot make {}: {e}", root.display()))?;
    let lock =
        std::fs::File::create(root.join(".lock")).map_err(|e| format!("cannot lock containers: {e}"))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock containers: {e}"))?;
    let shown_name = container.name.clone().unwrap_or_else(|| format!("step {step}"));
    let dir = match &container.name {
        Some(name) => root.join(name),
        None => root.join(format!(".step-{step}")),
    };
    if container.name.is_none() {
        // An unnamed container is its step's alone: what an earlier step
        // of the same number left is not its.
        remove_tree(&dir);
    }
    let recorded =
        std::fs::read(dir.join(IMAGE_FILE)).ok().and_then(|b| serde_json::from_slice::<Shown>(&b).ok());
    let running = recorded.is_some() && enter::running(&dir).is_some();
    let image = match (&recorded, container.mode) {
        (Some(_), NameMode::Create) => {
            return Err(format!(
                "container {shown_name:?} exists (--container-name=NAME:create makes a new one)"
            ))
        }
        (_, NameMode::Exec) if !running => {
            return Err(format!(
                "container {shown_name:?} is not running (--container-name=NAME:exec joins one)"
            ))
        }
        (Some(shown), _) => shown.clone(),
        (None, _) => {
            let Some(reference) = &container.image else {
                return Err(format!(
                    "no container {shown_name:?} exists on this node and --container-image is not given"
                ));
            };
            let shown = ask_for_image(env, reference)?;
            make_dirs(&dir)?;
            let body = serde_json::to_vec(&shown).map_err(|e| e.to_string())?;
            let temp = dir.join(format!("{IMAGE_FILE}.new"));
            std::fs::write(&temp, body)
                .and_then(|()| std::fs::rename(&temp, dir.join(IMAGE_FILE)))
                .map_err(|e| format!("cannot record the container's image: {e}"))?;
            shown
        }
    };
    make_dirs(&dir)?;
    // The step's tasks here share one container, and join the one that
    // runs, unless told not to (no_exec).
    let join = container.mode != NameMode::NoExec;
    let mut binds: Vec<String> = ["EBB_CHECKPOINT_DIR", "EBB_DRAIN_FILE"]
        .iter()
        .filter_map(|k| env.get(*k))
        .map(|p| match p.ends_with(".json") {
            // The drain file's directory: the run directory, where its
            // notice and completion file are.
            true => Path::new(p).parent().map_or(p.clone(), |d| d.display().to_string()),
            false => p.clone(),
        })
        .collect();
    binds.dedup();
    Ok(Spec {
        dir,
        image,
        container: container.clone(),
        join,
        binds,
        home: env.get("HOME").filter(|_| container.mount_home).cloned(),
        remove_after: container.name.is_none(),
    })
}

/// The longest an agent may take to show an image: a pull of a large
/// one, within the node's own `--pull-timeout`.
const IMAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(1800);

/// Asks this node's agent, on the attempt's endpoint, for `reference`.
fn ask_for_image(env: &BTreeMap<String, String>, reference: &str) -> Result<Shown, String> {
    let endpoint = env
        .get("EBB_METADATA_URL")
        .ok_or("not in an Ebb job (no EBB_METADATA_URL): a container needs the node's agent")?;
    let client = reqwest::blocking::Client::builder()
        .timeout(IMAGE_WAIT)
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot reach the node's agent: {e}"))?;
    let reply = client
        .post(format!("{endpoint}/ebb/v1/image"))
        .json(&serde_json::json!({ "reference": reference }))
        .send()
        .map_err(|e| format!("cannot reach the node's agent: {e}"))?;
    let status = reply.status();
    let body = reply.bytes().map_err(|e| format!("the node's agent: {e}"))?;
    if !status.is_success() {
        let said: Option<String> = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string));
        return Err(said.unwrap_or_else(|| format!("the node's agent answered {status}")));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the node's agent's answer: {e}"))
}

/// The command that runs one task of `argv`: in the container `spec`
/// where there is one.
pub fn task_command(spec: Option<&Spec>, argv: &[String]) -> Result<std::process::Command, CliError> {
    let Some(spec) = spec else {
        let mut command = std::process::Command::new(&argv[0]);
        command.args(&argv[1..]);
        return Ok(command);
    };
    let exe = std::env::current_exe().map_err(|e| failed(format!("cannot find this program: {e}")))?;
    let text = serde_json::to_string(spec).map_err(|e| failed(e.to_string()))?;
    let mut command = std::process::Command::new(exe);
    command.arg("slurm-container").arg(text).arg("--").args(argv);
    Ok(command)
}

/// A container's directories, made where missing.
fn make_dirs(dir: &Path) -> Result<(), String> {
    for sub in ["upper", "work", "rootfs", "pids"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(|e| format!("cannot make {}: {e}", dir.join(sub).display()))?;
    }
    Ok(())
}

/// After a step's tasks here have ended: an unnamed container goes.
pub fn finish(spec: &Spec) {
    if spec.remove_after {
        remove_tree(&spec.dir);
    }
}

/// Removes `dir` and what it holds, its own directories opened to their
/// owner first (the overlay leaves its work directory mode 000).
fn remove_tree(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
    if meta.is_dir() {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            remove_tree(&entry.path());
        }
        let _ = std::fs::remove_dir(dir);
    } else {
        let _ = std::fs::remove_file(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(args: &str) -> Given {
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        let (given, _) = options::parse(options::Command::Srun, &args, "").unwrap();
        given
    }

    fn container(args: &str) -> Result<Option<Container>, String> {
        from_given(&given(args), &BTreeMap::new()).map_err(|e| e.to_string())
    }

    #[test]
    fn pyxis_options_read_as_pyxis_reads_them() {
        let c = container(
            "--container-image=nvcr.io#nvidia/pytorch:24.01-py3 --container-name=box:exec --container-remap-root \
             --no-container-mount-home --container-mounts=/data:/data:ro,/scratch:/s --container-mounts=tmpfs:/t \
             --container-workdir=/work --container-env=A,B --container-unshare=ipc -- true",
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.image.as_deref(), Some("nvcr.io/nvidia/pytorch:24.01-py3"));
        assert_eq!(c.name.as_deref(), Some("box"));
        assert_eq!(c.mode, NameMode::Exec);
        assert!(c.remap_root && !c.mount_home && c.writable && !c.entrypoint);
        assert_eq!(c.mounts.len(), 3);
        assert_eq!(c.mounts[0], Mount { source: "/data".into(), target: "/data".into(), read_only: true });
        assert_eq!(c.mounts[2].source, "tmpfs");
        assert_eq!(c.workdir.as_deref(), Some("/work"));
        assert_eq!(c.env, ["A", "B"]);
        assert_eq!(c.unshare, ["ipc"]);
        // Without an image or a name there is no container.
        assert_eq!(container("-n 2"), Ok(None));
    }

    #[test]
    fn enroot_image_forms_become_registry_references() {
        for (given, want) in [
            ("docker://alice@reg.example:5000#team/img:v1", "reg.example:5000/team/img:v1"),
            ("127.0.0.1:5000/img:v1", "127.0.0.1:5000/img:v1"),
            ("reg.example/img@sha256:00", "reg.example/img@sha256:00"),
        ] {
            assert_eq!(image_reference(given).unwrap(), want, "{given}");
        }
        for bad in ["/enroot/pytorch.sqsh", "./img.sqsh", "docker://"] {
            assert!(image_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wrong_container_options_name_what_is_wrong() {
        for (args, says) in [
            (
                "--container-remap-root --no-container-remap-root --container-image=r/i",
                "both --container-remap-root",
            ),
            ("--container-name=box:later", "auto, create, exec or no_exec"),
            ("--container-name=../etc", "a name is 1 to 128"),
            ("--container-image=r/i --container-mounts=/a", "give SRC:DST"),
            ("--container-image=r/i --container-mounts=/a:/b:suid", "flag \"suid\""),
            ("--container-image=r/i --container-mounts=host:/b", "the source is an absolute path"),
            ("--container-image=r/i --container-mounts=/a:/b/../../etc", "climb out"),
            ("--container-image=r/i --container-unshare=pid", "not one of net, ipc, uts"),
            ("--container-image=r/i --container-workdir=work", "absolute path"),
            ("--container-remap-root", "needs --container-image or --container-name"),
        ] {
            let e = container(args).expect_err(args);
            assert!(e.contains(says), "{args}: {e}");
        }
    }

    #[test]
    fn pyxis_variables_stand_in_for_options_the_command_line_leaves_out() {
        let env = BTreeMap::from([
            ("PYXIS_CONTAINER_IMAGE".to_string(), "reg/one:v1".to_string()),
            ("PYXIS_CONTAINER_REMAP_ROOT".to_string(), "1".to_string()),
            ("PYXIS_CONTAINER_MOUNTS".to_string(), "/a:/b".to_string()),
        ]);
        let c = from_given(&given("--container-image=reg/two:v2"), &env).unwrap().unwrap();
        assert_eq!(c.image.as_deref(), Some("reg/two:v2"));
        assert!(c.remap_root);
        assert_eq!(c.mounts[0].target, "/b");
    }

    proptest::proptest! {
        /// Any option values: a container or a clear error, never a panic.
        #[test]
        fn any_container_options_parse_or_are_refused(
            image in "\\PC{0,40}",
            name in "\\PC{0,40}",
            mounts in "[/a-z.:+,]{0,40}",
            unshare in "[a-z,]{0,12}",
        ) {
            let args = vec![
                format!("--container-image={image}"),
                format!("--container-name={name}"),
                format!("--container-mounts={mounts}"),
                format!("--container-unshare={unshare}"),
                "true".to_string(),
            ];
            if let Ok((given, _)) = options::parse(options::Command::Srun, &args, "") {
                match from_given(&given, &BTreeMap::new()) {
                    Ok(Some(c)) => {
                        proptest::prop_assert!(c.mounts.iter().all(|m| m.target.starts_with('/')));
                        if let Some(n) = &c.name {
                            proptest::prop_assert!(!n.contains('/') && !n.starts_with('.'));
                        }
                    }
                    Ok(None) => proptest::prop_assert!(false, "an image or a name was given"),
                    Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
                }
            }
        }
    }
}
