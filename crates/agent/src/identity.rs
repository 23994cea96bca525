//! Who a job runs as, and the environment it is given.
//!
//! A root agent holds the join token and can read everything on the node:
//! a job that inherited its user and environment would too. So a root
//! agent runs each job as the Unix user its tenant is mapped to (never
//! root, unless the agent runs a personal cluster), and a job's
//! environment is built from a small safe base, the operator's additions,
//! the submission's `env` and Ebb's variables — never the agent's own
//! environment or arguments.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;

use nix::unistd::{Gid, Uid, User};

/// The default `PATH` of a job where the operator sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The user a job runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub uid: Uid,
    pub gid: Gid,
    pub home: PathBuf,
    /// Supplementary groups, looked up before the fork.
    pub groups: Vec<Gid>,
    /// Whether the child must switch to this user (a root agent) or already
    /// is it (an agent that runs as this user).
    pub switch: bool,
}

/// Who runs a job asked to run as `run_as`, on an agent running as `me`.
pub fn resolve(run_as: Option<&str>, me: Uid, allow_root: bool) -> Result<Identity, String> {
    if !me.is_root() {
        let own = User::from_uid(me).ok().flatten();
        let own_name = own.as_ref().map_or_else(|| me.to_string(), |u| u.name.clone());
        if let Some(wanted) = run_as.filter(|w| *w != own_name) {
            return Err(format!(
                "run-as user {wanted}: this agent runs as {own_name} (uid {me}), not root, so it runs jobs \
                 only as {own_name}; map this tenant to {own_name} or run the agent as root"
            ));
        }
        return Ok(Identity {
            user: own_name,
            uid: me,
            gid: nix::unistd::getgid(),
            home: own.map_or_else(|| PathBuf::from("/"), |u| u.dir),
            groups: Vec::new(),
            switch: false,
        });
    }
    let name = run_as.unwrap_or("nobody");
    let user = User::from_name(name)
        .map_err(|e| format!("run-as user {name}: cannot look it up: {e}"))?
        .ok_or_else(|| format!("run-as user {name}: no such user on this node"))?;
    if user.uid.is_root() && !allow_root {
        return Err(format!(
            "run-as user {name}: refusing to run a job as root (uid 0); map the tenant to an unprivileged \
             user, or start the agent with --allow-root-jobs (a personal cluster)"
        ));
    }
    let cname = CString::new(name).map_err(|_| format!("run-as user {name:?}: not a user name"))?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid)
        .map_err(|e| format!("run-as user {name}: cannot list its groups: {e}"))?;
    Ok(Identity { user: user.name, uid: user.uid, gid: user.gid, home: user.dir, groups, switch: true })
}

/// A job's whole environment: the base (`PATH`, `HOME`, `LANG`, `USER`,
/// `LOGNAME`), then the operator's `--job-env`, then the submission's
/// `env`, then Ebb's variables; later ones win.
pub fn job_env(
    path: &str,
    who: &Identity,
    operator: &BTreeMap<String, String>,
    submitted: &BTreeMap<String, String>,
    ebb: &[(&str, String)],
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_string(), path.to_string()),
        ("HOME".to_string(), who.home.display().to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("USER".to_string(), who.user.clone()),
        ("LOGNAME".to_string(), who.user.clone()),
    ]);
    env.extend(operator.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(submitted.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(ebb.iter().map(|(k, v)| (k.to_string(), v.clone())));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon() -> Identity {
        Identity {
            user: "daemon".into(),
            uid: Uid::from_raw(1),
            gid: Gid::from_raw(1),
            home: "/usr/sbin".into(),
            groups: vec![],
            switch: true,
        }
    }

    #[test]
    fn the_base_is_small_and_names_the_user() {
        let env = job_env(DEFAULT_PATH, &daemon(), &BTreeMap::new(), &BTreeMap::new(), &[]);
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(keys, ["HOME", "LANG", "LOGNAME", "PATH", "USER"]);
        assert_eq!(env["HOME"], "/usr/sbin");
        assert_eq!(env["USER"], "daemon");
        assert_eq!(env["LANG"], "C.UTF-8");
        assert_eq!(env["PATH"], DEFAULT_PATH);
    }

    #[test]
    fn the_submission_wins_over_the_base_and_ebb_over_both() {
        let operator = BTreeMap::from([("PYTHONPATH".to_string(), "/opt/sdk".to_string())]);
        let submitted = BTreeMap::from([
            ("PATH".to_string(), "/opt/venv/bin".to_string()),
            ("LANG".to_string(), "de_DE.UTF-8".to_string()),
            ("EBB_JOB_ID".to_string(), "forged".to_string()),
        ]);
        let env = job_env("/usr/bin", &daemon(), &operator, &submitted, &[("EBB_JOB_ID", "7".into())]);
        assert_eq!(env["PATH"], "/opt/venv/bin");
        assert_eq!(env["LANG"], "de_DE.UTF-8");
        assert_eq!(env["PYTHONPATH"], "/opt/sdk");
        assert_eq!(env["EBB_JOB_ID"], "7");
    }

    #[test]
    fn a_root_agent_refuses_root_and_unknown_users() {
        let root = Uid::from_raw(0);
        let err = resolve(Some("root"), root, false).unwrap_err();
        assert!(err.contains("refusing to run a job as root"), "{err}");
        assert!(resolve(Some("root"), root, true).is_ok());
        let err = resolve(Some("no-such-user-ebb"), root, false).unwrap_err();
        assert!(err.contains("no such user"), "{err}");
        let daemon = resolve(Some("daemon"), root, false).unwrap();
        assert!(!daemon.uid.is_root() && daemon.switch);
    }

    #[test]
    fn an_unprivileged_agent_runs_jobs_only_as_itself() {
        let me = Uid::from_raw(1); // daemon
        let err = resolve(Some("bin"), me, false).unwrap_err();
        assert!(err.contains("not root"), "{err}");
        let same = resolve(Some("daemon"), me, false).unwrap();
        assert!(!same.switch);
    }
}
