//! Webhooks in the writer: which there are and whose, the deliveries an
//! event makes (each a row of the store's outbox, written in the batch
//! that made the event, handed to the deliverer once it commits), and what
//! the deliverer says of each try. The HTTP side is `crate::webhooks`.

use ebb_api::{Event, JobEvent, Webhook, WebhookDelivery, WebhookRequest};

use super::plan::DRILL_REASON;
use super::*;
use crate::store::{DeliveryRow, WebhookRow};
use crate::webhooks::{body_text, Command, Delivery, JobBody, JobSummary, NodeBody, SlackBody, Tried};

/// The most deliveries one webhook may have waiting; past it, new events
/// for it are dropped (and the log says so) until the receiver takes some.
const MAX_PENDING: u64 = 10_000;

#[derive(Default)]
pub(super) struct Webhooks {
    hooks: BTreeMap<u64, WebhookRow>,
    /// Deliveries the receivers have not taken yet, by id (in order).
    pending: BTreeMap<u64, DeliveryRow>,
    pending_by_hook: HashMap<u64, u64>,
    next_hook: u64,
    next_delivery: u64,
}

/// The webhook event a job's event is, if any.
fn job_event_name(event: &Event) -> Option<&'static str> {
    Some(match event {
        Event::DrainNotice(d) if d.reason == DRILL_REASON => "drill",
        Event::DrainNotice(_) => "preempted",
        Event::Drill(_) => "drill",
        Event::Requeued(_) => "requeued",
        Event::Promoted(_) => "promoted",
        Event::Failed(_) => "failed",
        Event::Succeeded(_) => "succeeded",
        Event::Cancelled(_) => "cancelled",
        _ => return None,
    })
}

impl Webhooks {
    /// The webhooks and the outbox as the store has them; delivery ids go
    /// on past any a previous server gave out.
    pub(super) fn load(
        &mut self,
        key: &crate::sealed::SecretKey,
        hooks: Vec<WebhookRow>,
        deliveries: Vec<DeliveryRow>,
        now: u64,
    ) -> Result<Vec<WebhookRow>, crate::sealed::Unsealable> {
        let mut clear = Vec::new();
        let mut opened = Vec::with_capacity(hooks.len());
        for mut hook in hooks {
            match key.open(&hook.secret, &webhook_row(hook.id))? {
                crate::sealed::Opened::Sealed(secret) => hook.secret = secret,
                crate::sealed::Opened::Clear(secret) => {
                    hook.secret = secret;
                    clear.push(hook.clone());
                }
            }
            opened.push(hook);
        }
        let hooks = opened;
        let w = self;
        w.next_hook = hooks.iter().map(|h| h.id).max().unwrap_or(0) + 1;
        w.hooks = hooks.into_iter().map(|h| (h.id, h)).collect();
        w.next_delivery =
            deliveries.iter().map(|d| d.id + 1).max().unwrap_or(0).max(now.saturating_mul(1024));
        for d in deliveries {
            *w.pending_by_hook.entry(d.webhook).or_insert(0) += 1;
            w.pending.insert(d.id, d);
        }
        Ok(clear)
    }

    /// A webhook as its owner sees it (without its secret).
    fn view(&self, tenants: &Tenants, hook: &WebhookRow) -> Webhook {
        Webhook {
            id: hook.id,
            tenant: hook.tenant.map(|t| tenants.name(t)),
            url: hook.url.clone(),
            events: hook.events.clone(),
            format: hook.format.clone(),
            pending: self.pending_by_hook.get(&hook.id).copied().unwrap_or(0),
            secret: None,
        }
    }

    /// `POST /v1/webhooks`.
    pub(super) fn create(
        &mut self,
        (tenants, config): (&Tenants, &EngineConfig),
        store: &mut impl Store,
        principal: &Principal,
        req: WebhookRequest,
        now: u64,
    ) -> Result<Webhook, Fail> {
        let tenant = match (&req.tenant, &principal.tenant, principal.scope) {
            (Some(name), _, _) => {
                let id = tenants.by_name(name)?;
                if !principal.may_see(id) {
                    return Err(Refusal::not_found(format!("tenant {name}: not found")).into());
                }
                Some(id)
            }
            (None, _, Scope::Admin) => None,
            (None, Some((id, _)), _) => Some(*id),
            (None, None, _) => return Err(Refusal::forbidden("a tenant's or an operator's token").into()),
        };
        let allowed: &[&str] =
            if tenant.is_some() { &ebb_api::JOB_WEBHOOK_EVENTS } else { &ebb_api::NODE_WEBHOOK_EVENTS };
        let whose = if tenant.is_some() { "a tenant's webhook" } else { "an operators' webhook" };
        if req.events.is_empty() {
            return Err(
                Refusal::unacceptable(format!("events: at least one of {}", allowed.join(", "))).into()
            );
        }
        let mut events = Vec::new();
        for event in &req.events {
            if !allowed.contains(&event.as_str()) {
                return Err(Refusal::unacceptable(format!(
                    "events: {event:?} is not an event {whose} takes; it takes {}",
                    allowed.join(", ")
                ))
                .into());
            }
            if !events.contains(event) {
                events.push(event.clone());
            }
        }
        let url = check_url(&req.url, &config.outbound)?;
        let format = match req.format.as_deref().unwrap_or("json") {
            f @ ("json" | "slack") => f.to_string(),
            other => {
                return Err(Refusal::unacceptable(format!("format: json or slack, got {other:?}")).into());
            }
        };
        let owned = self.hooks.values().filter(|h| h.tenant == tenant).count();
        if owned >= ebb_api::MAX_WEBHOOKS {
            return Err(Refusal::conflict(format!(
                "at most {} webhooks each; remove one first (ebb tenant webhook remove)",
                ebb_api::MAX_WEBHOOKS
            ))
            .into());
        }
        let id = self.next_hook;
        self.next_hook += 1;
        let secret = crate::webhooks::new_secret();
        let row = WebhookRow { id, tenant, url, events, format, secret: secret.clone(), created_ms: now };
        let sealed =
            WebhookRow { secret: config.secret_key.seal(&row.secret, &webhook_row(id)), ..row.clone() };
        store.put_webhook(&sealed)?;
        tracing::info!(webhook = id, tenant = ?row.tenant, url = row.url, "webhook added");
        let view = Webhook { secret: Some(secret), ..self.view(tenants, &row) };
        self.hooks.insert(id, row);
        Ok(view)
    }

    /// A webhook `principal` may see, or 404.
    fn of(&self, principal: &Principal, id: u64) -> Result<&WebhookRow, Refusal> {
        self.hooks
            .get(&id)
            .filter(|h| match h.tenant {
                Some(t) => principal.may_see(t),
                None => principal.scope == Scope::Admin,
            })
            .ok_or_else(|| Refusal::not_found(format!("webhook {id}: not found")))
    }

    /// `GET /v1/webhooks[?tenant=NAME]`: a tenant's own; an operator's,
    /// every one (or one tenant's).
    pub(super) fn list(
        &self,
        tenants: &Tenants,
        principal: &Principal,
        tenant: Option<String>,
    ) -> Result<Vec<Webhook>, Fail> {
        let only = match tenant {
            Some(name) => {
                let id = tenants
                    .by_name(&name)
                    .map_err(|_| Refusal::not_found(format!("tenant {name}: not found")))?;
                if !principal.may_see(id) {
                    return Err(Refusal::not_found(format!("tenant {name}: not found")).into());
                }
                Some(id)
            }
            None => None,
        };
        Ok(self
            .hooks
            .values()
            .filter(|h| only.is_none_or(|t| h.tenant == Some(t)))
            .filter(|h| self.of(principal, h.id).is_ok())
            .map(|h| self.view(tenants, h))
            .collect())
    }

    /// `DELETE /v1/webhooks/{id}`: the webhook, its outbox and its log.
    pub(super) fn delete(
        &mut self,
        tenants: &Tenants,
        (store, outbox): (&mut impl Store, &mut Outbox),
        principal: &Principal,
        id: u64,
    ) -> Result<Webhook, Fail> {
        let view = self.view(tenants, self.of(principal, id)?);
        store.delete_webhook(id)?;
        self.hooks.remove(&id);
        self.pending.retain(|_, d| d.webhook != id);
        self.pending_by_hook.remove(&id);
        outbox.webhook_sends.push(Command::Forget(id));
        tracing::info!(webhook = id, "webhook removed");
        Ok(view)
    }

    /// `GET /v1/webhooks/{id}/log`.
    pub(super) fn log(
        &self,
        tenants: &Tenants,
        store: &mut impl Store,
        principal: &Principal,
        id: u64,
    ) -> Result<ebb_api::WebhookLog, Fail> {
        let webhook = self.view(tenants, self.of(principal, id)?);
        let deliveries = store.webhook_log(id)?;
        Ok(ebb_api::WebhookLog { webhook, deliveries })
    }

    /// The deliverer tried delivery `id`: logged; delivered or given up,
    /// it leaves the outbox.
    pub(super) fn tried(
        &mut self,
        store: &mut impl Store,
        (id, attempt): (u64, u32),
        tried: Tried,
        at_ms: u64,
    ) -> Written {
        let Some(d) = self.pending.get(&id) else { return Ok(()) };
        let (outcome, status, error, done) = match tried {
            Tried::Delivered { status } => ("delivered", Some(status), None, true),
            Tried::Failed { status, error } => ("failed", status, Some(error), false),
            Tried::GaveUp { status, error } => ("gave_up", status, Some(error), true),
        };
        let entry = WebhookDelivery {
            delivery: id,
            event: d.event.clone(),
            job: d.job.map(|j| j.0),
            node: d.node.clone(),
            attempt,
            at: rfc3339(at_ms),
            outcome: outcome.into(),
            status,
            error,
        };
        let webhook = d.webhook;
        store.add_webhook_log(webhook, &entry)?;
        if done {
            store.delete_delivery(id)?;
            self.pending.remove(&id);
            if let Some(n) = self.pending_by_hook.get_mut(&webhook) {
                *n = n.saturating_sub(1);
            }
        }
        if outcome == "gave_up" {
            tracing::warn!(webhook, delivery = id, "webhook delivery given up after {attempt} tries");
        }
        Ok(())
    }
}

impl<S: Store> Engine<S> {
    /// Deliveries go to `deliverer` from now on, starting with those the
    /// outbox holds.
    pub fn deliver_webhooks(&mut self, deliverer: tokio::sync::mpsc::UnboundedSender<Command>) {
        for d in self.webhooks.pending.values() {
            if let Some(hook) = self.webhooks.hooks.get(&d.webhook) {
                let _ = deliverer.send(Command::Send(delivery(hook, d)));
            }
        }
        self.outbox.webhooks = Some(deliverer);
    }
}

/// Seals what an earlier release stored in the clear (at start-up,
/// in its transaction).
pub(super) fn seal_clear(
    (store, key): (&mut impl Store, &crate::sealed::SecretKey),
    tenants: &Tenants,
    hooks: Vec<WebhookRow>,
    logins: Vec<(TenantId, String)>,
) -> Written {
    for hook in hooks {
        let sealed = WebhookRow { secret: key.seal(&hook.secret, &webhook_row(hook.id)), ..hook };
        store.put_webhook(&sealed)?;
    }
    for (tenant, registry) in logins {
        let Some(login) = tenants.logins.get(&tenant).and_then(|l| l.get(&registry)) else {
            continue;
        };
        let row = super::tenants::login_row(tenant, &registry);
        let sealed = ebb_api::RegistryLogin { password: key.seal(&login.password, &row), ..login.clone() };
        store.put_registry_login(tenant, &registry, Some(&sealed))?;
    }
    Ok(())
}

/// What a delivery is of: its webhook, the event's name, and the job or
/// node it is of.
struct Queued<'a> {
    hook: u64,
    event: &'a str,
    job: Option<JobId>,
    node: Option<String>,
}

impl Webhooks {
    /// Node `node`'s event `name` (`text` says what happened), for the
    /// operator's webhooks that take it.
    pub(super) fn node_event(
        &mut self,
        store: &mut impl Store,
        outbox: &mut Outbox,
        at_ms: u64,
        (node, name, text): (&str, &'static str, &str),
    ) -> Written {
        let hooks: Vec<u64> = self
            .hooks
            .values()
            .filter(|h| h.tenant.is_none() && h.events.iter().any(|e| e == name))
            .map(|h| h.id)
            .collect();
        for hook in hooks {
            let body = |delivery: u64, format: &str| match format {
                "slack" => body_text(&SlackBody { text: format!("Ebb: node {node} {name}: {text}") }),
                _ => body_text(&NodeBody {
                    delivery,
                    webhook: hook,
                    event: name,
                    at: rfc3339(at_ms),
                    at_ms,
                    node,
                    text,
                }),
            };
            let queued = Queued { hook, event: name, job: None, node: Some(node.to_string()) };
            self.enqueue(store, outbox, at_ms, queued, body)?;
        }
        Ok(())
    }

    /// Job `job`'s event, for the webhooks of its tenant (`tenant_name`)
    /// that take it.
    pub(super) fn job_event(
        &mut self,
        store: &mut impl Store,
        outbox: &mut Outbox,
        job: &JobRecord,
        tenant_name: &str,
        event: &JobEvent,
    ) -> Written {
        if self.hooks.is_empty() {
            return Ok(());
        }
        let Some(name) = job_event_name(&event.event) else { return Ok(()) };
        let (id, tenant) = (job.id, job.tenant);
        let hooks: Vec<u64> = self
            .hooks
            .values()
            .filter(|h| h.tenant == Some(tenant) && h.events.iter().any(|e| e == name))
            .map(|h| h.id)
            .collect();
        if hooks.is_empty() {
            return Ok(());
        }
        let text = event.event.describe(job.gpus);
        let run_id = job.run_id();
        let what = match &job.spec.name {
            Some(n) => format!("job {id} ({n})"),
            None => format!("job {id}"),
        };
        let (tier, state) = (job.tier.as_str(), job.state.as_str());
        for hook in hooks {
            let body = |delivery: u64, format: &str| match format {
                "slack" => body_text(&SlackBody { text: format!("Ebb: {what} {name}: {text}") }),
                _ => body_text(&JobBody {
                    delivery,
                    webhook: hook,
                    event: name,
                    at: &event.at,
                    at_ms: event.at_ms,
                    tenant: tenant_name,
                    job: JobSummary {
                        id,
                        name: job.spec.name.as_deref(),
                        tier,
                        state,
                        attempt: event.attempt,
                        run_id: run_id.clone(),
                    },
                    text: &text,
                    detail: event.event.detail(),
                }),
            };
            let queued = Queued { hook, event: name, job: Some(id), node: None };
            self.enqueue(store, outbox, event.at_ms, queued, body)?;
        }
        Ok(())
    }

    /// One delivery in the outbox, handed over once the batch commits
    /// (`body` makes it for the delivery's id and the webhook's format).
    fn enqueue(
        &mut self,
        store: &mut impl Store,
        outbox: &mut Outbox,
        now: u64,
        queued: Queued<'_>,
        body: impl FnOnce(u64, &str) -> String,
    ) -> Written {
        let Queued { hook, event, job, node } = queued;
        let id = self.next_delivery;
        self.next_delivery += 1;
        let waiting = self.pending_by_hook.get(&hook).copied().unwrap_or(0);
        if waiting >= MAX_PENDING {
            let entry = WebhookDelivery {
                delivery: id,
                event: event.into(),
                job: job.map(|j| j.0),
                node,
                attempt: 0,
                at: rfc3339(now),
                outcome: "dropped".into(),
                status: None,
                error: Some(format!("{MAX_PENDING} deliveries are waiting for the receiver already")),
            };
            return store.add_webhook_log(hook, &entry);
        }
        let format = self.hooks[&hook].format.clone();
        let row = DeliveryRow {
            id,
            webhook: hook,
            event: event.into(),
            job,
            node,
            body: body(id, &format),
            created_ms: now,
        };
        store.put_delivery(&row)?;
        outbox.webhook_sends.push(Command::Send(delivery(&self.hooks[&hook], &row)));
        *self.pending_by_hook.entry(hook).or_insert(0) += 1;
        self.pending.insert(id, row);
        Ok(())
    }
}

fn delivery(hook: &WebhookRow, d: &DeliveryRow) -> Delivery {
    Delivery {
        id: d.id,
        webhook: hook.id,
        url: hook.url.clone(),
        secret: hook.secret.clone(),
        event: d.event.clone(),
        body: d.body.clone(),
        created_ms: d.created_ms,
    }
}

/// A webhook's URL: `http://` or `https://` with a host, at most 2048
/// bytes; never an address `outbound` refuses (loopback, link-local: a
/// cloud's metadata service), which is checked again as each delivery
/// connects, names included.
fn check_url(url: &str, outbound: &ebb_http::Outbound) -> Result<String, Refusal> {
    if url.len() > ebb_api::MAX_WEBHOOK_URL_BYTES {
        return Err(Refusal::unacceptable(format!(
            "url: at most {} bytes, got {}",
            ebb_api::MAX_WEBHOOK_URL_BYTES,
            url.len()
        )));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| Refusal::unacceptable(format!("url: {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Refusal::unacceptable(format!("url: http:// or https://, got {}://", parsed.scheme())));
    }
    if parsed.host_str().is_none_or(|h| h.is_empty()) {
        return Err(Refusal::unacceptable(format!("url: {url:?} has no host")));
    }
    if let Err(why) = outbound.check_url(&parsed) {
        return Err(Refusal::unacceptable(format!("url: {url:?}: {why}: not a receiver")));
    }
    Ok(parsed.to_string())
}

/// A webhook's row, as its sealed secret's associated data.
fn webhook_row(id: u64) -> String {
    format!("webhook {id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebb_api::EventKind;

    #[test]
    fn a_webhooks_url_is_http_with_a_host_and_never_loopback_or_link_local() {
        let policy = ebb_http::Outbound::default();
        let check_url = |url: &str| super::check_url(url, &policy);
        assert_eq!(
            check_url("https://hooks.slack.com/services/T0/B0/x").unwrap(),
            "https://hooks.slack.com/services/T0/B0/x"
        );
        assert!(check_url("http://10.0.0.7:9000/ebb").is_ok());
        for (bad, said) in [
            ("ftp://example.com/", "http:// or https://"),
            ("http://169.254.169.254/latest/meta-data/", "link-local"),
            ("http://[::ffff:169.254.169.254]/", "link-local"),
            ("http://[fe80::1]/", "link-local"),
            ("http://127.0.0.1:9000/ebb", "loopback"),
            ("http://[::ffff:127.0.0.1]/", "loopback"),
            ("http://[::1]/", "loopback"),
            ("http://0.0.0.0:7300/", "unspecified"),
            ("not a url", "url: \"not a url\""),
            ("unix:/run/x", "http:// or https://"),
        ] {
            let e = check_url(bad).unwrap_err();
            assert!(e.message.contains(said), "{bad}: {}", e.message);
        }
        let loopback = ebb_http::Outbound::with_loopback();
        assert!(super::check_url("http://127.0.0.1:9000/ebb", &loopback).is_ok());
        let long = format!("https://example.com/{}", "a".repeat(2048));
        assert!(check_url(&long).unwrap_err().message.starts_with("url: at most 2048 bytes"));
    }

    #[test]
    fn a_drill_is_a_drill_and_every_other_notice_a_preemption() {
        let notice = |reason: &str| {
            Event::DrainNotice(ebb_api::events::DrainNoticeDetail {
                reason: reason.into(),
                ..Default::default()
            })
        };
        assert_eq!(job_event_name(&notice(DRILL_REASON)), Some("drill"));
        assert_eq!(job_event_name(&notice("preempted by job 7")), Some("preempted"));
        assert_eq!(job_event_name(&Event::unknown(EventKind::Placed)), None);
        assert_eq!(job_event_name(&Event::unknown(EventKind::Succeeded)), Some("succeeded"));
    }
}
