//! Tenants: their names, limits, quotas and registry logins. A tenant's
//! limits are a function of the parts they change (admission, the core's
//! weights and quotas, the waiting jobs they admit); names and logins are
//! `Tenants`', written to the store as they change.

use super::effects::Effects;
use super::*;

/// The largest fair-share weight a tenant may be given.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// The largest quota, borrowing or lending limit, in GPUs.
pub const MAX_QUOTA: u32 = 1_000_000;

/// The most quotas one tenant may have (one per tier and model).
pub const MAX_QUOTAS: usize = 64;

/// A quota's tier: on-demand or preemptible.
fn parse_quota_tier(text: &str) -> Option<Tier> {
    text.parse::<Tier>().ok().filter(|t| *t != Tier::Reserved)
}

/// Tenants: their names and registry logins.
#[derive(Default)]
pub(super) struct Tenants {
    pub(super) names: BTreeMap<TenantId, String>,
    /// Each tenant's registry logins, by registry host.
    pub(super) logins: BTreeMap<TenantId, BTreeMap<String, ebb_api::RegistryLogin>>,
}

impl Tenants {
    /// Tenant `id`'s name ("" for one unknown).
    pub(super) fn name(&self, id: TenantId) -> String {
        self.names.get(&id).cloned().unwrap_or_default()
    }

    /// The tenant named `name`.
    pub(super) fn by_name(&self, name: &str) -> Result<TenantId, Refusal> {
        self.names
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| Refusal::unacceptable(format!("tenant: unknown tenant {name:?}")))
    }

    /// A new tenant, named `name`: its id (its token is granted by the
    /// caller, from `Access`).
    pub(super) fn add(&mut self, store: &mut impl Store, name: &str) -> Result<TenantId, Fail> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(Refusal::invalid(format!(
                "name: must be 1-64 letters, digits, '-' or '_', got {name:?}"
            ))
            .into());
        }
        if self.names.values().any(|n| n == name) {
            return Err(Refusal::conflict(format!("tenant {name}: already exists")).into());
        }
        let id = self.names.keys().max().map_or(TenantId(1), |m| TenantId(m.0 + 1));
        store.put_tenant(&TenantRow { id, name: name.to_string() })?;
        self.names.insert(id, name.to_string());
        Ok(id)
    }

    /// A tenant's registry logins (the tenant itself or an admin); with
    /// `set`, first stores or removes one.
    pub(super) fn registry_logins(
        &mut self,
        store: &mut impl Store,
        secret_key: &crate::sealed::SecretKey,
        principal: &Principal,
        name: &str,
        set: Option<(String, Option<ebb_api::RegistryLogin>)>,
    ) -> Result<Vec<ebb_api::RegistryLoginInfo>, Fail> {
        let tenant =
            self.by_name(name).map_err(|_| Refusal::not_found(format!("tenant {name}: not found")))?;
        if !principal.may_see(tenant) {
            return Err(Refusal::not_found(format!("tenant {name}: not found")).into());
        }
        if let Some((registry, login)) = set {
            check_registry_host(&registry)?;
            if let Some(login) = &login {
                if login.username.is_empty()
                    || login.username.len() > 256
                    || login.username.contains(':')
                    || login.username.chars().any(char::is_control)
                {
                    return Err(Refusal::unacceptable(
                        "username: 1 to 256 bytes, without ':' or control characters".to_string(),
                    )
                    .into());
                }
                if login.password.is_empty() || login.password.len() > 4096 || login.password.contains('\0') {
                    return Err(
                        Refusal::unacceptable("password: 1 to 4096 bytes, without NUL".to_string()).into()
                    );
                }
            }
            let sealed = login.as_ref().map(|l| ebb_api::RegistryLogin {
                password: secret_key.seal(&l.password, &login_row(tenant, &registry)),
                ..l.clone()
            });
            store.put_registry_login(tenant, &registry, sealed.as_ref())?;
            tracing::info!(tenant = name, registry, given = login.is_some(), "registry login set");
            let logins = self.logins.entry(tenant).or_default();
            match login {
                Some(login) => logins.insert(registry, login),
                None => logins.remove(&registry),
            };
        }
        Ok(self
            .logins
            .get(&tenant)
            .into_iter()
            .flatten()
            .map(|(registry, l)| ebb_api::RegistryLoginInfo {
                registry: registry.clone(),
                username: l.username.clone(),
            })
            .collect())
    }
}

/// A tenant's limits and usage (the tenant itself or an admin); with
/// `set` (admin), its own limits first. Raising the running limit
/// admits waiting jobs at once; lowering any refuses nothing already
/// accepted.
pub(super) fn tenant_limits(
    p: &mut Parts<impl Effects>,
    principal: &Principal,
    name: &str,
    set: Option<ebb_api::TenantLimits>,
) -> Result<ebb_api::TenantUsage, Fail> {
    let tenant =
        p.tenants.by_name(name).map_err(|_| Refusal::not_found(format!("tenant {name}: not found")))?;
    if !principal.may_see(tenant) {
        return Err(Refusal::not_found(format!("tenant {name}: not found")).into());
    }
    if let Some(set) = set {
        if principal.scope != Scope::Admin {
            return Err(Refusal::forbidden("this call needs an admin token").into());
        }
        for (field, value) in [
            ("max_jobs", set.max_jobs),
            ("max_running_jobs", set.max_running_jobs),
            ("max_stored_bytes", set.max_stored_bytes),
        ] {
            if value == Some(0) {
                return Err(Refusal::unacceptable(format!("{field}: must be at least 1, got 0")).into());
            }
        }
        if set.weight.is_some_and(|w| !(1..=MAX_WEIGHT).contains(&w)) {
            return Err(Refusal::unacceptable(format!(
                "weight: must be between 1 and {MAX_WEIGHT}, got {}",
                set.weight.unwrap_or(0)
            ))
            .into());
        }
        if set.quotas.as_ref().is_some_and(|q| q.len() > MAX_QUOTAS) {
            let msg = format!("quotas: at most {MAX_QUOTAS} a tenant");
            return Err(Refusal::unacceptable(msg).into());
        }
        for (i, q) in set.quotas.iter().flatten().enumerate() {
            check_quota(p.core, p.money, i, q)?;
            let tier = parse_quota_tier(&q.tier).expect("checked");
            let twice = set
                .quotas
                .iter()
                .flatten()
                .take(i)
                .any(|o| parse_quota_tier(&o.tier) == Some(tier) && o.gpu_model == q.gpu_model);
            if twice {
                let msg = format!("quotas[{i}]: a second quota for {} {}", q.tier, q.gpu_model);
                return Err(Refusal::unacceptable(msg).into());
            }
        }
        p.fx.put_tenant_limits(tenant, &set)?;
        tracing::info!(tenant = name, ?set, "tenant limits set");
        let weight = set.weight.unwrap_or(ebb_scheduler::DEFAULT_WEIGHT);
        p.core.set_weight(tenant, weight).expect("checked weight");
        p.admission.limits.insert(tenant, set);
        apply_quotas(p.core, p.admission);
        admission::admit_waiting(p.jobs, p.core, p.admission, &mut p.fx, tenant)?;
    }
    let limits = p.admission.limits_of(tenant);
    let load = p.admission.load.get(&tenant).cloned().unwrap_or_default();
    Ok(ebb_api::TenantUsage {
        tenant: name.to_string(),
        weight: p.core.weight(tenant),
        own: p.admission.limits.get(&tenant).cloned().unwrap_or_default(),
        quotas: quota_usage(p.core, p.admission, tenant),
        max_jobs: limits.max_jobs,
        max_running_jobs: limits.max_running_jobs,
        max_stored_bytes: limits.max_stored_bytes,
        jobs: load.jobs,
        admitted: load.admitted,
        waiting: load.waiting.len() as u64,
        stored_bytes: load.bytes,
    })
}

/// A quota as an operator gave it, checked: its tier, a model the
/// cluster knows, a lending limit within the quota.
fn check_quota(core: &State, money: &Money, i: usize, q: &ebb_api::TenantQuota) -> Result<(), Refusal> {
    let field = format!("quotas[{i}]");
    if parse_quota_tier(&q.tier).is_none() {
        return Err(Refusal::unacceptable(format!(
            "{field}.tier: on-demand or preemptible (reserved work has reservations), got {:?}",
            q.tier
        )));
    }
    money.known_model(core, &format!("{field}.gpu_model"), &q.gpu_model)?;
    for (name, value) in [
        ("nominal", Some(q.nominal)),
        ("borrowing_limit", q.borrowing_limit),
        ("lending_limit", q.lending_limit),
    ] {
        if value.is_some_and(|v| v > MAX_QUOTA) {
            return Err(Refusal::unacceptable(format!("{field}.{name}: at most {MAX_QUOTA}")));
        }
    }
    if q.lending_limit.is_some_and(|l| l > q.nominal) {
        return Err(Refusal::unacceptable(format!(
            "{field}.lending_limit: at most the nominal quota, {}",
            q.nominal
        )));
    }
    Ok(())
}

/// A tenant's quotas, each with the GPUs it uses against it now.
pub(super) fn quota_usage(core: &State, admission: &Admission, tenant: TenantId) -> Vec<ebb_api::QuotaUsage> {
    let quotas = admission.limits.get(&tenant).and_then(|l| l.quotas.clone()).unwrap_or_default();
    quotas
        .into_iter()
        .map(|quota| {
            let used = match (parse_quota_tier(&quota.tier), core.model_by_name(&quota.gpu_model)) {
                (Some(tier), Some(model)) => core.quota_used(tenant, tier, model),
                _ => 0,
            };
            ebb_api::QuotaUsage { quota, used }
        })
        .collect()
}

/// Every tenant's quotas on the models the core knows, in the core
/// (after a start, a change and a model's first node).
pub(super) fn apply_quotas(core: &mut State, admission: &Admission) {
    let existing: Vec<(TenantId, Tier, GpuModelId)> =
        core.quotas().map(|(t, tier, m, _)| (t, tier, m)).collect();
    for (tenant, tier, model) in existing {
        core.set_quota(tenant, tier, model, None).expect("a quota the core has");
    }
    for (&tenant, limits) in &admission.limits {
        for q in limits.quotas.iter().flatten() {
            let (Some(tier), Some(model)) = (parse_quota_tier(&q.tier), core.model_by_name(&q.gpu_model))
            else {
                continue;
            };
            let quota = ebb_scheduler::Quota {
                nominal: q.nominal,
                borrowing_limit: q.borrowing_limit,
                lending_limit: q.lending_limit,
            };
            if let Err(e) = core.set_quota(tenant, tier, model, Some(quota)) {
                tracing::error!(tenant = tenant.0, gpu_model = q.gpu_model, "quota not applied: {e}");
            }
        }
    }
}

/// A registry as a login names it: `HOST[:PORT]`, as image references
/// begin.
fn check_registry_host(registry: &str) -> Result<(), Refusal> {
    let ok = !registry.is_empty()
        && registry.len() <= 253
        && registry.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
        && ebb_image::parse(&format!("{registry}/x:y")).is_ok_and(|r| r.registry() == registry);
    if ok {
        Ok(())
    } else {
        Err(Refusal::unacceptable(format!(
            "registry: {registry:?} is not a registry host (HOST or HOST:PORT, as an image reference begins)"
        )))
    }
}

/// A registry login's row, as its sealed password's associated data.
/// A registry login's row, as its sealed password's associated data.
pub(super) fn login_row(tenant: TenantId, registry: &str) -> String {
    format!("registry login of tenant {tenant} for {registry}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(tier: &str, model: &str, nominal: u32) -> ebb_api::TenantQuota {
        ebb_api::TenantQuota {
            tier: tier.into(),
            gpu_model: model.into(),
            nominal,
            borrowing_limit: None,
            lending_limit: None,
        }
    }

    #[test]
    fn a_tenants_limits_over_the_parts_are_checked_whole_then_set_in_the_core() {
        let mut owned = effects::Owned::new(JobId(1), 1_000);
        let spec = NodeSpec { name: "a".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        owned.core.add_node(spec, Time(0)).unwrap();
        owned.tenants.names.insert(TenantId(2), "acme".into());
        let admin = Principal { scope: Scope::Admin, tenant: None, node: None };
        let acme = Principal::tenant(Scope::Tenant, TenantId(2), "acme");
        let p = &mut owned.parts();
        let set = |p: &mut Parts<effects::Recorded>, who: &Principal, limits| {
            tenant_limits(p, who, "acme", Some(limits)).map_err(|e| match e {
                Fail::Refused(r) => r.message,
                Fail::Store(e) => panic!("{e}"),
            })
        };
        let refused = [
            (ebb_api::TenantLimits { weight: Some(0), ..Default::default() }, "weight: must be between 1"),
            (
                ebb_api::TenantLimits { max_jobs: Some(0), ..Default::default() },
                "max_jobs: must be at least 1",
            ),
            (
                ebb_api::TenantLimits {
                    quotas: Some(vec![quota("reserved", "H100", 1)]),
                    ..Default::default()
                },
                "quotas[0].tier: on-demand or preemptible",
            ),
            (
                ebb_api::TenantLimits {
                    quotas: Some(vec![quota("on-demand", "B200", 1)]),
                    ..Default::default()
                },
                "quotas[0].gpu_model: unknown GPU model \"B200\"",
            ),
            (
                ebb_api::TenantLimits {
                    quotas: Some(vec![quota("on-demand", "H100", 4), quota("on-demand", "H100", 2)]),
                    ..Default::default()
                },
                "quotas[1]: a second quota for on-demand H100",
            ),
        ];
        for (limits, said) in refused {
            let message = set(p, &admin, limits).unwrap_err();
            assert!(message.starts_with(said), "{message}");
        }
        assert!(p.fx.limits.is_empty(), "nothing refused was written");
        let own = set(p, &acme, ebb_api::TenantLimits::default()).unwrap_err();
        assert_eq!(own, "this call needs an admin token");
        let limits = ebb_api::TenantLimits {
            weight: Some(3),
            quotas: Some(vec![quota("on-demand", "H100", 4)]),
            ..Default::default()
        };
        let usage = set(p, &admin, limits.clone()).unwrap();
        assert_eq!((usage.weight, usage.quotas.len(), usage.quotas[0].used), (3, 1, 0));
        assert_eq!(p.fx.limits, vec![(TenantId(2), limits)]);
        assert_eq!(p.core.weight(TenantId(2)), 3);
        assert_eq!(p.core.quotas().count(), 1);
    }
}
