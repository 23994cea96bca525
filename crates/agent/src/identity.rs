//! Who a job runs as, and the environment it is given.
//!
//! A root agent holds the join token and can read everything on the node:
//! a job that inherited its user and environment would too. So a root
//! agent runs each job as the Unix user its tenant is mapped to, or, for a
//! tenant the operator mapped to none, as a uid of the tenant's own (never
//! root, unless the agent runs a personal cluster); and a job's
//! environment is built from a small safe base, the operator's additions,
//! the submission's `env` and Ebb's variables — never the agent's own
//! environment or arguments. Two tenants on one user would be one tenant:
//! each could read the other's `/proc/PID/environ`, checkpoints and
//! completion files.

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
    /// The tenant's own uid from the agent's range, with no account: its
    /// home is the agent's to make.
    pub allocated: bool,
}

/// How a root agent chooses users for jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Users {
    /// A job mapped to root may run (a personal cluster).
    pub allow_root: bool,
    /// The uids (and gids) of tenants the operator mapped to no user: a
    /// tenant's is the range's first plus the tenant's number, the same
    /// on every node, so no two tenants share one.
    pub tenant_uids: std::ops::RangeInclusive<u32>,
    /// Where those tenants' home directories are (`<data dir>/homes`).
    pub homes: PathBuf,
}

/// The default range of tenants' own uids: above the users a system and a
/// directory service hand out, below 2^31 (some tools take uids as signed).
pub const DEFAULT_TENANT_UIDS: &str = "2000000-2999999";

/// Why a job cannot run as the user it would: the refusal names the user
/// or the tenant, and what the operator can change.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "run-as user {wanted}: this agent runs as {own} (uid {uid}), not root, so it runs jobs only as {own}; \
         map this tenant to {own} or run the agent as root"
    )]
    NotRoot { wanted: String, own: String, uid: Uid },
    #[error("run-as user {name}: cannot look it up: {source}")]
    Lookup { name: String, source: nix::Error },
    #[error("run-as user {0}: no such user on this node")]
    NoSuchUser(String),
    #[error(
        "run-as user {0}: refusing to run a job as root (uid 0); map the tenant to an unprivileged user, or \
         start the agent with --allow-root-jobs (a personal cluster)"
    )]
    Root(String),
    #[error("run-as user {0:?}: not a user name")]
    NotAName(String),
    #[error("run-as user {name}: cannot list its groups: {source}")]
    Groups { name: String, source: nix::Error },
    #[error(
        "tenant {tenant} (number {number}): past this agent's --tenant-uids {first}-{last}; widen the range, or \
         map the tenant to a user (ebb server --run-as {tenant}=USER)"
    )]
    PastRange { tenant: String, number: u32, first: u32, last: u32 },
    #[error(
        "tenant {tenant}: its uid {uid} (--tenant-uids {first}-{last}) belongs to the node's user {account}; \
         choose a range no account on the nodes has"
    )]
    Taken { tenant: String, uid: u32, first: u32, last: u32, account: String },
    #[error(transparent)]
    TenantName(#[from] crate::dirs::DirError),
}

/// Why a text is not a range of uids for tenants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAUidRange {
    #[error("{0:?}: expected FIRST-LAST, two uids, e.g. {DEFAULT_TENANT_UIDS}")]
    Form(String),
    #[error("{0:?}: FIRST from 1, LAST at least FIRST and below {max}", max = u32::MAX)]
    Bounds(String),
}

/// `FIRST-LAST`, a range of uids for tenants: never root, never the
/// invalid `(uid_t)-1`.
pub fn parse_uid_range(text: &str) -> Result<std::ops::RangeInclusive<u32>, NotAUidRange> {
    let (first, last) = text
        .split_once('-')
        .and_then(|(f, l)| Some((f.trim().parse::<u32>().ok()?, l.trim().parse::<u32>().ok()?)))
        .ok_or_else(|| NotAUidRange::Form(text.to_string()))?;
    if first == 0 || first > last || last == u32::MAX {
        return Err(NotAUidRange::Bounds(text.to_string()));
    }
    Ok(first..=last)
}

/// Who runs a job of `tenant` (its name and number) asked to run as
/// `run_as`, on an agent running as `me`.
///
/// An agent that is not root runs every job as itself (a personal
/// cluster). A root agent runs a job as the user the operator mapped its
/// tenant to, or, where it mapped none, as the tenant's own uid from
/// `users.tenant_uids` — as systemd's `DynamicUser` does, a uid no
/// account has, with a group of the same number and a home of its own —
/// so that tenants never share a user unless the operator says so.
pub fn resolve(
    run_as: Option<&str>,
    tenant: (&str, u32),
    me: Uid,
    users: &Users,
) -> Result<Identity, IdentityError> {
    if !me.is_root() {
        let own = User::from_uid(me).ok().flatten();
        let own_name = own.as_ref().map_or_else(|| me.to_string(), |u| u.name.clone());
        if let Some(wanted) = run_as.filter(|w| *w != own_name) {
            return Err(IdentityError::NotRoot { wanted: wanted.to_string(), own: own_name, uid: me });
        }
        return Ok(Identity {
            user: own_name,
            uid: me,
            gid: nix::unistd::getgid(),
            home: own.map_or_else(|| PathBuf::from("/"), |u| u.dir),
            groups: Vec::new(),
            switch: false,
            allocated: false,
        });
    }
    let Some(name) = run_as else { return tenant_user(tenant, users) };
    let named = || name.to_string();
    let user = User::from_name(name)
        .map_err(|source| IdentityError::Lookup { name: named(), source })?
        .ok_or_else(|| IdentityError::NoSuchUser(named()))?;
    if user.uid.is_root() && !users.allow_root {
        return Err(IdentityError::Root(named()));
    }
    let cname = CString::new(name).map_err(|_| IdentityError::NotAName(named()))?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid)
        .map_err(|source| IdentityError::Groups { name: named(), source })?;
    Ok(Identity {
        user: user.name,
        uid: user.uid,
        gid: user.gid,
        home: user.dir,
        groups,
        switch: true,
        allocated: false,
    })
}

/// Identities looked up, for a few seconds: a start reads the node's user
/// and group databases (`/etc/passwd`, `/etc/group`, or a directory
/// service through NSS) for its job's user, a tenth of a start's own work
/// where jobs are short; as `nscd` and `sssd` do, an answer is kept a
/// while (here [`IdentityCache::TTL`], so a user's new groups or a removed
/// account take effect within it). Refusals are not kept: the fix of an
/// operator's mapping is seen at the next start.
pub struct IdentityCache {
    kept: std::sync::Mutex<std::collections::HashMap<Asked, (std::time::Instant, Identity)>>,
}

/// What a start asks for: the user its tenant is mapped to, if any, and
/// the tenant's name and number.
type Asked = (Option<String>, String, u32);

impl IdentityCache {
    /// How long an answer is kept.
    pub const TTL: std::time::Duration = std::time::Duration::from_secs(10);
    /// Answers kept at most (a node's tenants and their users): past it,
    /// the expired ones go, and if none has, all.
    const MAX: usize = 1024;

    pub fn new() -> IdentityCache {
        IdentityCache { kept: Default::default() }
    }

    /// [`resolve`], or its answer from the last [`IdentityCache::TTL`].
    pub fn resolve(
        &self,
        run_as: Option<&str>,
        tenant: (&str, u32),
        me: Uid,
        users: &Users,
    ) -> Result<Identity, IdentityError> {
        let key = (run_as.map(str::to_string), tenant.0.to_string(), tenant.1);
        let now = std::time::Instant::now();
        if let Some((at, who)) = self.kept.lock().expect("identities").get(&key) {
            if now.duration_since(*at) < Self::TTL {
                return Ok(who.clone());
            }
        }
        let who = resolve(run_as, tenant, me, users)?;
        let mut kept = self.kept.lock().expect("identities");
        if kept.len() >= Self::MAX {
            kept.retain(|_, (at, _)| now.duration_since(*at) < Self::TTL);
            if kept.len() >= Self::MAX {
                kept.clear();
            }
        }
        kept.insert(key, (now, who.clone()));
        Ok(who)
    }
}

impl Default for IdentityCache {
    fn default() -> Self {
        Self::new()
    }
}

/// The tenant's own uid from the range, refused where the range has none
/// left for its number or an account of the node already has it.
fn tenant_user((tenant, number): (&str, u32), users: &Users) -> Result<Identity, IdentityError> {
    let dir = crate::dirs::tenant_dir_name(tenant)?;
    let (first, last) = (*users.tenant_uids.start(), *users.tenant_uids.end());
    let uid = first
        .checked_add(number)
        .filter(|uid| *uid <= last)
        .ok_or_else(|| IdentityError::PastRange { tenant: tenant.to_string(), number, first, last })?;
    if let Ok(Some(account)) = User::from_uid(Uid::from_raw(uid)) {
        let account = account.name;
        return Err(IdentityError::Taken { tenant: tenant.to_string(), uid, first, last, account });
    }
    Ok(Identity {
        user: format!("ebb-{dir}"),
        uid: Uid::from_raw(uid),
        gid: Gid::from_raw(uid),
        home: users.homes.join(dir),
        groups: Vec::new(),
        switch: true,
        allocated: true,
    })
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

/// The user running the tests, as a job's (root may run jobs as root).
#[cfg(test)]
pub(crate) fn test_user() -> Identity {
    let me = nix::unistd::geteuid();
    let name = User::from_uid(me).ok().flatten().map(|u| u.name).expect("the tests' user has a name");
    let users = Users { allow_root: true, tenant_uids: 2_000_000..=2_999_999, homes: std::env::temp_dir() };
    resolve(Some(&name), ("default", 1), me, &users).expect("the tests' user")
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
            allocated: false,
        }
    }

    fn users(allow_root: bool) -> Users {
        Users { allow_root, tenant_uids: 2_000_000..=2_000_009, homes: "/var/lib/ebb/homes".into() }
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
        let alice = ("alice", 2);
        let err = resolve(Some("root"), alice, root, &users(false)).unwrap_err();
        assert!(matches!(&err, IdentityError::Root(name) if name == "root"), "{err:?}");
        assert!(err.to_string().contains("refusing to run a job as root"), "{err}");
        assert!(resolve(Some("root"), alice, root, &users(true)).is_ok());
        let err = resolve(Some("no-such-user-ebb"), alice, root, &users(false)).unwrap_err();
        assert!(
            matches!(err, IdentityError::NoSuchUser(_)) && err.to_string().contains("no such user"),
            "{err}"
        );
        let daemon = resolve(Some("daemon"), alice, root, &users(false)).unwrap();
        assert!(!daemon.uid.is_root() && daemon.switch && !daemon.allocated);
    }

    /// Tenants the operator mapped to no user used to share `nobody`:
    /// each could read the other's environment and overwrite its
    /// checkpoints. Each runs as its own uid now, the same on every node.
    #[test]
    fn a_root_agent_gives_each_unmapped_tenant_a_uid_of_its_own() {
        let root = Uid::from_raw(0);
        let alice = resolve(None, ("alice", 2), root, &users(false)).unwrap();
        let bob = resolve(None, ("bob", 3), root, &users(false)).unwrap();
        assert_eq!((alice.uid.as_raw(), alice.gid.as_raw()), (2_000_002, 2_000_002));
        assert_eq!(bob.uid.as_raw(), 2_000_003);
        assert!(alice.switch && alice.allocated && alice.groups.is_empty());
        assert_eq!(alice.user, "ebb-alice");
        assert_eq!(alice.home, PathBuf::from("/var/lib/ebb/homes/alice"));
        assert_eq!(resolve(None, ("alice", 2), root, &users(false)).unwrap(), alice, "not the same twice");
        let err = resolve(None, ("late", 10), root, &users(false)).unwrap_err().to_string();
        assert!(err.contains("--tenant-uids 2000000-2000009") && err.contains("--run-as late=USER"), "{err}");
        let err = resolve(None, ("odd/name", 4), root, &users(false)).unwrap_err();
        assert!(matches!(err, IdentityError::TenantName(crate::dirs::DirError::TenantName(_))), "{err:?}");
        assert!(err.to_string().contains("not a valid tenant name"), "{err}");
        // A range that holds an account of the node (daemon is uid 1).
        let clash = Users { tenant_uids: 1..=10, ..users(false) };
        let err = resolve(None, ("t", 0), root, &clash).unwrap_err().to_string();
        assert!(err.contains("belongs to the node's user daemon"), "{err}");
    }

    /// A start looks its job's user up at most every few seconds: the
    /// answer kept is the lookup's, a refusal is not kept, and the cache
    /// stays bounded however many tenants come.
    #[test]
    fn identities_are_kept_a_few_seconds_and_refusals_not_at_all() {
        let root = Uid::from_raw(0);
        let cache = IdentityCache::new();
        let alice = cache.resolve(None, ("alice", 2), root, &users(false)).unwrap();
        assert_eq!(alice, resolve(None, ("alice", 2), root, &users(false)).unwrap());
        // Within the TTL the answer kept is given, not a new lookup's (a
        // range moved since would give another uid).
        let moved = Users { tenant_uids: 3_000_000..=3_000_009, ..users(false) };
        assert_eq!(cache.resolve(None, ("alice", 2), root, &moved).unwrap(), alice);
        assert_eq!(cache.resolve(None, ("bob", 3), root, &moved).unwrap().uid.as_raw(), 3_000_003);
        // A refusal is looked up again: the operator's fix is seen at once.
        let narrow = Users { tenant_uids: 2_000_000..=2_000_001, ..users(false) };
        assert!(cache.resolve(None, ("carol", 5), root, &narrow).is_err());
        assert!(cache.resolve(None, ("carol", 5), root, &users(false)).is_ok());
        let many = Users { tenant_uids: 2_000_000..=2_999_999, ..users(false) };
        for n in 0..(IdentityCache::MAX as u32 + 10) {
            cache.resolve(None, (&format!("t{n}"), n), root, &many).unwrap();
        }
        assert!(cache.kept.lock().unwrap().len() <= IdentityCache::MAX);
    }

    #[test]
    fn uid_ranges_are_checked() {
        assert_eq!(parse_uid_range(DEFAULT_TENANT_UIDS), Ok(2_000_000..=2_999_999));
        for bad in ["", "5", "0-10", "10-5", "1-4294967295", "a-b", "-1-5"] {
            assert!(parse_uid_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unprivileged_agent_runs_jobs_only_as_itself() {
        let me = Uid::from_raw(1); // daemon
        let err = resolve(Some("bin"), ("alice", 2), me, &users(false)).unwrap_err().to_string();
        assert!(err.contains("not root"), "{err}");
        let same = resolve(Some("daemon"), ("alice", 2), me, &users(false)).unwrap();
        assert!(!same.switch);
        let unmapped = resolve(None, ("alice", 2), me, &users(false)).unwrap();
        assert_eq!(unmapped.uid, me);
    }
}
