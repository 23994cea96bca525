//! The seam between the writer's handlers and what they cause beyond the
//! parts of the writer they are given: the store's writes and the batch's
//! outbox. A handler over parts (`deadline::judge_deadline`, …) takes the job table
//! and the core it changes, and an `Effects` for the rest; the writer's
//! `Writes` writes the store in the batch's transaction and queues for
//! after the commit, and a test's `Effects` records, with no store, clock
//! or network (HyperQueue's reactor over `&mut Core` and a `Comm`).

use super::table::{JobTable, Saved};
use super::*;

/// What handlers cause beyond the state they change.
pub(super) trait Effects {
    /// The batch's instant: every time written in a batch is this one.
    fn now(&self) -> u64;
    /// Records `event` in `job`'s timeline, at its live attempt, for its
    /// tenant's webhooks and the log.
    fn event(&mut self, job: &JobRecord, event: Event) -> Written;
    /// Writes `job`'s record; `saved` says what saving it changed.
    fn put_job(&mut self, job: &JobRecord, saved: Saved) -> Written;
    /// Queues `action` in `node`'s command stream, sent once the batch
    /// commits.
    fn send(&mut self, node: &str, action: Action);
    /// Drops what is queued for `node` and not yet taken (a node removed).
    fn forget_commands(&mut self, node: &str);
    /// Records what an attempt used, for bills.
    fn add_usage(&mut self, usage: &crate::billing::UsageRow) -> Written;
    /// Job `id`'s record as the store has it: a finished one the table no
    /// longer holds.
    fn stored_job(&mut self, id: JobId) -> Written<Option<JobRecord>>;
    /// The tasks of the array whose first task is `array`, as the store
    /// has them (finished ones too).
    fn array_tasks(&mut self, array: JobId) -> Written<Vec<JobId>>;
    /// What the writer counts for its metrics.
    fn counters(&mut self) -> &mut crate::metrics::Counters;
    /// Writes a node's row.
    fn put_node(&mut self, row: &NodeRow) -> Written;
    /// Records that `node` was heard from at `at_ms`.
    fn heard(&mut self, node: &str, at_ms: u64) -> Written;
    /// Node `node`'s event `name`, said as `text`, for the operator's
    /// webhooks.
    fn node_event(&mut self, node: &str, name: &'static str, text: &str) -> Written;
    /// Writes a model's prices.
    fn put_price(&mut self, row: &PriceRow) -> Written;
    /// Writes a reservation's row.
    fn put_reservation(&mut self, row: &ReservationRow) -> Written;
    /// Removes a reservation that never charged anything.
    fn delete_reservation(&mut self, id: u64) -> Written;
    /// The usage records of attempts that ended from `from_ms` to
    /// `to_ms`: `tenant`'s, or everyone's.
    fn usage(
        &mut self,
        tenant: Option<TenantId>,
        from_ms: u64,
        to_ms: u64,
    ) -> Written<Vec<crate::billing::UsageRow>>;
    /// Writes a token's row (its hash, never the token).
    fn put_token(&mut self, row: &TokenRow) -> Written;
    /// Removes the token whose hash is `hash`.
    fn delete_token(&mut self, hash: &str) -> Written;
    /// Writes the limits the operator set for a tenant.
    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Written;
    /// Writes a model's reclaim: the limit of its preemptible GPUs, or
    /// none (released).
    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Written;
}

/// Saves job `id`: the table's bookkeeping, then its record written.
pub(super) fn save(jobs: &mut JobTable, fx: &mut impl Effects, id: JobId) -> Written {
    let saved = jobs.saved(id, fx.now());
    fx.put_job(&jobs[&id], saved)
}

/// The writer's effects: the parts of the engine its writes touch.
pub(super) struct Writes<'a, S: Store> {
    pub store: &'a mut S,
    pub outbox: &'a mut Outbox,
    pub webhooks: &'a mut webhooks::Webhooks,
    pub tenants: &'a Tenants,
    pub config: &'a EngineConfig,
    pub counters: &'a mut crate::metrics::Counters,
    pub now: u64,
}

impl<S: Store> Writes<'_, S> {
    /// Records `event` of job `id` (`job`, when it is in the table; an
    /// event of one that is not is at no attempt and for no webhook).
    pub fn job_event(&mut self, id: JobId, job: Option<&JobRecord>, event: Event) -> Written {
        let at_ms = self.now;
        let attempt = job.map_or(Attempt(0), |j| j.attempt);
        let kind = event.kind();
        let event = JobEvent { at: rfc3339(at_ms), at_ms, attempt: attempt.0, event, text: String::new() };
        self.outbox.changed = true;
        self.store.add_event(id, &event)?;
        if let Some(job) = job {
            let tenant = self.tenants.names.get(&job.tenant).map_or("", String::as_str);
            self.webhooks.job_event(self.store, self.outbox, job, tenant, &event)?;
        }
        // Every event is in the job's timeline. The log has the ones an
        // operator follows; the steps every job takes on its way (a fleet's
        // fill is hundreds of thousands of them) are logged at debug.
        // Written once the batch has committed (`Outbox::write_log`).
        let routine = matches!(
            kind,
            EventKind::Submitted
                | EventKind::Admitted
                | EventKind::Placed
                | EventKind::Started
                | EventKind::Checkpoint
                | EventKind::Restored
                | EventKind::Resumed
                | EventKind::Exited
        );
        let logged = if routine {
            tracing::enabled!(tracing::Level::DEBUG)
        } else {
            tracing::enabled!(tracing::Level::INFO)
        };
        if logged {
            self.outbox.log.push(Logged { job: id, attempt, routine, event: event.event });
        }
        Ok(())
    }
}

impl<S: Store> Effects for Writes<'_, S> {
    fn now(&self) -> u64 {
        self.now
    }

    fn event(&mut self, job: &JobRecord, event: Event) -> Written {
        self.job_event(job.id, Some(job), event)
    }

    fn put_job(&mut self, job: &JobRecord, saved: Saved) -> Written {
        self.outbox.changed = true;
        let stored_state = saved.stored_state.map(JobState::as_str);
        let columns = crate::store::JobColumns { stored_state, ..job.columns() };
        self.store.put_job(job.id, &columns, job)?;
        let keep = self.config.keep_output.as_millis();
        if saved.finishing && keep > 0 && !job.no_output {
            self.store.expire_output(job.id, self.now.saturating_add(keep))?;
        }
        Ok(())
    }

    fn send(&mut self, node: &str, action: Action) {
        self.outbox.push(node, action);
    }

    fn forget_commands(&mut self, node: &str) {
        if let Some(channel) = self.outbox.channels.get_mut(node) {
            channel.commands.clear();
        }
    }

    fn add_usage(&mut self, usage: &crate::billing::UsageRow) -> Written {
        self.store.add_usage(usage)
    }

    fn stored_job(&mut self, id: JobId) -> Written<Option<JobRecord>> {
        self.store.job(id)
    }

    fn array_tasks(&mut self, array: JobId) -> Written<Vec<JobId>> {
        Ok(self.store.array_tasks(array)?.into_iter().map(|t| t.id).collect())
    }

    fn counters(&mut self) -> &mut crate::metrics::Counters {
        self.counters
    }

    fn put_node(&mut self, row: &NodeRow) -> Written {
        self.outbox.changed = true;
        self.store.put_node(row)
    }

    fn heard(&mut self, node: &str, at_ms: u64) -> Written {
        self.store.heard(node, at_ms)
    }

    fn node_event(&mut self, node: &str, name: &'static str, text: &str) -> Written {
        self.webhooks.node_event(self.store, self.outbox, self.now, (node, name, text))
    }

    fn put_price(&mut self, row: &PriceRow) -> Written {
        self.outbox.changed = true;
        self.store.put_price(row)
    }

    fn put_reservation(&mut self, row: &ReservationRow) -> Written {
        self.outbox.changed = true;
        self.store.put_reservation(row)
    }

    fn delete_reservation(&mut self, id: u64) -> Written {
        self.outbox.changed = true;
        self.store.delete_reservation(id)
    }

    fn usage(
        &mut self,
        tenant: Option<TenantId>,
        from_ms: u64,
        to_ms: u64,
    ) -> Written<Vec<crate::billing::UsageRow>> {
        self.store.usage(tenant, from_ms, to_ms)
    }

    fn put_token(&mut self, row: &TokenRow) -> Written {
        self.store.put_token(row)
    }

    fn delete_token(&mut self, hash: &str) -> Written {
        self.store.delete_token(hash)
    }

    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Written {
        self.store.put_tenant_limits(tenant, limits)
    }

    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Written {
        self.store.put_reclaim(model, limit)
    }
}

/// The parts of the writer a handler over parts is given, borrowed apart:
/// a handler takes those it touches, or the whole (an attempt's end
/// touches them all).
pub(super) struct Parts<'a, F> {
    pub jobs: &'a mut JobTable,
    pub core: &'a mut State,
    pub admission: &'a mut Admission,
    pub fleet: &'a mut Fleet,
    pub tenants: &'a Tenants,
    pub money: &'a mut Money,
    pub access: &'a mut Access,
    pub why: &'a mut launch::WhyText,
    pub config: &'a EngineConfig,
    pub fx: F,
}

impl<S: Store> Engine<S> {
    /// The job table, the core, admission, the fleet, money, access and
    /// the writer's effects, borrowed apart.
    pub(super) fn parts(&mut self) -> Parts<'_, Writes<'_, S>> {
        let Engine {
            store,
            outbox,
            webhooks,
            tenants,
            config,
            now,
            jobs,
            core,
            counters,
            admission,
            fleet,
            money,
            access,
            why,
            ..
        } = self;
        let (config, tenants): (&EngineConfig, &Tenants) = (config, tenants);
        let fx = Writes { store, outbox, webhooks, tenants, config, counters, now: *now };
        Parts { jobs, core, admission, fleet, tenants, money, access, why, config, fx }
    }
}

/// Effects as a test sees them: what would have been written and sent.
#[cfg(test)]
#[derive(Default)]
pub(super) struct Recorded {
    pub now: u64,
    /// Each event, with its job.
    pub events: Vec<(JobId, Event)>,
    /// Each record written, as it was then.
    pub saved: Vec<JobRecord>,
    pub sent: Vec<(String, Action)>,
    pub usage: Vec<crate::billing::UsageRow>,
    /// What the store holds of jobs the table does not.
    pub stored: BTreeMap<JobId, JobRecord>,
    pub counters: crate::metrics::Counters,
    pub nodes: Vec<NodeRow>,
    /// Each node event: the node, its name and text.
    pub node_events: Vec<(String, &'static str, String)>,
    pub prices: Vec<PriceRow>,
    /// Each reservation row written, and each removed (`None`, its id).
    pub reservations: Vec<(u64, Option<ReservationRow>)>,
    /// Each token row written, and each removed (`None`), by hash.
    pub tokens: Vec<(String, Option<TokenRow>)>,
    /// Each tenant's limits written.
    pub limits: Vec<(TenantId, ebb_api::TenantLimits)>,
    /// Each model's reclaim written.
    pub reclaims: Vec<(String, Option<u32>)>,
    /// Each contact written: the node, when.
    pub heard: Vec<(String, u64)>,
}

#[cfg(test)]
impl Effects for Recorded {
    fn now(&self) -> u64 {
        self.now
    }

    fn event(&mut self, job: &JobRecord, event: Event) -> Written {
        self.events.push((job.id, event));
        Ok(())
    }

    fn put_job(&mut self, job: &JobRecord, _saved: Saved) -> Written {
        self.saved.push(job.clone());
        Ok(())
    }

    fn send(&mut self, node: &str, action: Action) {
        self.sent.push((node.to_string(), action));
    }

    fn forget_commands(&mut self, node: &str) {
        self.sent.retain(|(to, _)| to != node);
    }

    fn add_usage(&mut self, usage: &crate::billing::UsageRow) -> Written {
        self.usage.push(usage.clone());
        Ok(())
    }

    fn stored_job(&mut self, id: JobId) -> Written<Option<JobRecord>> {
        Ok(self.stored.get(&id).cloned())
    }

    fn array_tasks(&mut self, array: JobId) -> Written<Vec<JobId>> {
        let tasks = self.stored.values().filter(|j| j.array.as_ref().is_some_and(|a| a.id == array));
        Ok(tasks.map(|j| j.id).collect())
    }

    fn counters(&mut self) -> &mut crate::metrics::Counters {
        &mut self.counters
    }

    fn put_node(&mut self, row: &NodeRow) -> Written {
        self.nodes.push(row.clone());
        Ok(())
    }

    fn heard(&mut self, node: &str, at_ms: u64) -> Written {
        self.heard.push((node.to_string(), at_ms));
        Ok(())
    }

    fn node_event(&mut self, node: &str, name: &'static str, text: &str) -> Written {
        self.node_events.push((node.to_string(), name, text.to_string()));
        Ok(())
    }

    fn put_price(&mut self, row: &PriceRow) -> Written {
        self.prices.push(row.clone());
        Ok(())
    }

    fn put_reservation(&mut self, row: &ReservationRow) -> Written {
        self.reservations.push((row.id, Some(row.clone())));
        Ok(())
    }

    fn delete_reservation(&mut self, id: u64) -> Written {
        self.reservations.push((id, None));
        Ok(())
    }

    /// What was recorded, ended in the period.
    fn usage(
        &mut self,
        tenant: Option<TenantId>,
        from_ms: u64,
        to_ms: u64,
    ) -> Written<Vec<crate::billing::UsageRow>> {
        let mine = |u: &&crate::billing::UsageRow| tenant.is_none_or(|t| u.tenant == t);
        let within = |u: &&crate::billing::UsageRow| from_ms <= u.ended_ms && u.ended_ms < to_ms;
        Ok(self.usage.iter().filter(mine).filter(within).cloned().collect())
    }

    fn put_token(&mut self, row: &TokenRow) -> Written {
        self.tokens.push((row.hash.clone(), Some(row.clone())));
        Ok(())
    }

    fn delete_token(&mut self, hash: &str) -> Written {
        self.tokens.push((hash.to_string(), None));
        Ok(())
    }

    fn put_tenant_limits(&mut self, tenant: TenantId, limits: &ebb_api::TenantLimits) -> Written {
        self.limits.push((tenant, limits.clone()));
        Ok(())
    }

    fn put_reclaim(&mut self, model: &str, limit: Option<u32>) -> Written {
        self.reclaims.push((model.to_string(), limit));
        Ok(())
    }
}

/// The writer's parts owned, with recorded effects: what a test lends a
/// handler over parts.
#[cfg(test)]
pub(super) struct Owned {
    pub jobs: JobTable,
    pub core: State,
    pub admission: Admission,
    pub fleet: Fleet,
    pub tenants: Tenants,
    pub money: Money,
    pub access: Access,
    pub why: launch::WhyText,
    pub config: EngineConfig,
    pub fx: Recorded,
}

#[cfg(test)]
impl Owned {
    /// Empty parts at `now`, the next job `next`.
    pub fn new(next: JobId, now: u64) -> Owned {
        Owned {
            jobs: JobTable::new(next),
            core: State::new(),
            admission: Admission::default(),
            fleet: Fleet::default(),
            tenants: Tenants::default(),
            money: Money::default(),
            access: Access { tokens: Default::default(), node_credentials: BTreeMap::new() },
            why: Default::default(),
            config: EngineConfig::for_tests(&std::env::temp_dir()),
            fx: Recorded { now, ..Recorded::default() },
        }
    }

    /// The parts lent, with the recorded effects moved into them (a test
    /// reads what was recorded from the parts it lent).
    pub fn parts(&mut self) -> Parts<'_, Recorded> {
        let Owned { jobs, core, admission, fleet, tenants, money, access, why, config, fx } = self;
        let fx = std::mem::replace(fx, Recorded { now: fx.now, ..Recorded::default() });
        Parts { jobs, core, admission, fleet, tenants, money, access, why, config, fx }
    }
}
