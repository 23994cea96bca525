//! Fairness between tenants within a tier: each tenant's usage, its weight,
//! and the order of the tenants with queued work that the queue walk
//! follows (`README.md`, "Fair share").
//!
//! A tenant's usage in a tier is its GPU time valued at each model's
//! on-demand rate (µ$ per GPU-hour), decayed with a half-life `h`. What
//! decides its place is its *fair-share key*: that usage plus what it runs
//! now valued over one half-life ahead, divided by its weight. Counting
//! what runs now makes a start move the tenant back at once, so one pass
//! that places many jobs shares them; counting history makes a tenant that
//! had much of the tier lately wait behind one that had little.
//!
//! Nothing decays as time passes: every sum is kept scaled by
//! `g(t) = 2^((t - epoch)/h)`, and since decay multiplies every tenant's
//! usage by the same factor it changes no order. The scale moves forward
//! (every sum multiplied down) once `g` would pass 2^64. Keys are taken at
//! one instant for every tenant (`keys_at`), moved forward every
//! [`KEY_PERIOD_DIVISOR`]th of a half-life at most, so tenants are always
//! compared at the same instant; a tenant's key changes at once when its
//! usage or weight does.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use ebb_core::{GpuModelId, JobId, Span, TenantId, Tier, Time};

use super::{queue_key, QueueClass, QueueKey};
use crate::error::StateError;
use crate::model::{JobSpec, Run};

/// Keys are taken again at most every this fraction of a half-life (and at
/// most a minute apart): between two, usage drifts by under 0.3%.
pub const KEY_PERIOD_DIVISOR: u64 = 256;

/// The weight of a tenant nobody set one for.
pub const DEFAULT_WEIGHT: u32 = 1;

/// A tenant's usage in one tier, scaled by `g` (see the module).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Usage {
    /// Ended use: Σ r·τ·(g(end) − g(start)), in µ$, τ = h / ln 2 in hours.
    pub settled: f64,
    /// µ$ per hour of what it runs now (GPUs × their model's rate).
    pub rate: u64,
    /// Σ r·g(start) over what it runs now.
    pub starts: f64,
    /// Σ of every term `starts` was given since it was last zero: how far
    /// its rounding can have drifted (for `sanity_check`).
    pub magnitude: f64,
}

/// A fair-share key: lower goes first. Totally ordered (keys are finite
/// and not negative; `total_cmp` orders the rest anyway).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ShareKey(pub f64);

impl PartialEq for ShareKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for ShareKey {}

impl PartialOrd for ShareKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ShareKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Where a tenant stands in one tier, for people: [`crate::State::share`].
#[derive(Clone, Debug, PartialEq)]
pub struct TenantShare {
    pub weight: u32,
    /// Its weight over the weights of every tenant with work or usage in
    /// the tier, 0..=1.
    pub weight_share: f64,
    /// Decayed usage, in µ$ at on-demand rates.
    pub usage: f64,
    /// Its decayed usage over the tier's, 0..=1 (0 when the tier has none).
    pub share: f64,
    /// GPUs it runs in the tier now.
    pub running_rate: u64,
    /// Tenants with queued work in the tier ahead of it, when it has some.
    pub ahead: Option<u32>,
}

#[derive(Clone, Debug)]
pub(crate) struct Fair {
    /// Half-life in hours.
    pub h: f64,
    pub epoch: Option<Time>,
    /// The instant keys are taken at, and `g` there.
    pub keys_at: Time,
    pub g_keys: f64,
    /// Looked up on every start, so hashed (see `State::jobs`).
    pub usage: FxHashMap<(Tier, TenantId), Usage>,
    pub weights: FxHashMap<TenantId, u32>,
}

impl Default for Fair {
    fn default() -> Self {
        Fair::new(Span::from_secs(24 * 3600))
    }
}

impl Fair {
    pub fn new(half_life: Span) -> Fair {
        Fair {
            h: half_life.0.max(1) as f64 / 3_600_000.0,
            epoch: None,
            keys_at: Time::ZERO,
            g_keys: 1.0,
            usage: FxHashMap::default(),
            weights: FxHashMap::default(),
        }
    }

    pub fn half_life(&self) -> Span {
        Span((self.h * 3_600_000.0).round() as u64)
    }

    pub fn weight(&self, tenant: TenantId) -> u32 {
        self.weights.get(&tenant).copied().unwrap_or(DEFAULT_WEIGHT)
    }

    /// `g(t)`; the epoch must have been set ([`Fair::advance`]).
    pub fn g(&self, t: Time) -> f64 {
        let epoch = self.epoch.unwrap_or(t);
        let hours = (t.0 as f64 - epoch.0 as f64) / 3_600_000.0;
        (hours / self.h).exp2()
    }

    fn tau(&self) -> f64 {
        self.h / std::f64::consts::LN_2
    }

    /// Makes `g(t)` safe to take: sets the epoch at the first instant seen
    /// and moves it forward once `t` is 64 half-lives past it. Returns
    /// whether the scale moved (every key must then be taken again).
    pub fn advance(&mut self, t: Time) -> bool {
        let Some(epoch) = self.epoch else {
            self.epoch = Some(t);
            self.keys_at = t;
            self.g_keys = 1.0;
            return false;
        };
        if t <= epoch || self.g(t) < 2f64.powi(64) {
            return false;
        }
        let factor = 1.0 / self.g(t);
        for u in self.usage.values_mut() {
            u.settled *= factor;
            u.starts *= factor;
            u.magnitude *= factor;
        }
        self.epoch = Some(t);
        self.g_keys = self.g(self.keys_at);
        true
    }

    /// Whether keys are due to be taken at `now` (see the module).
    pub fn keys_due(&self, now: Time) -> bool {
        let period = ((self.h * 3_600_000.0) as u64 / KEY_PERIOD_DIVISOR).clamp(1_000, 60_000);
        now.0 >= self.keys_at.0.saturating_add(period)
    }

    pub fn take_keys_at(&mut self, now: Time) {
        self.advance(now);
        self.keys_at = now;
        self.g_keys = self.g(now);
    }

    /// Decayed usage, scaled, at the instant where `g` is `g`.
    pub fn scaled_usage(&self, u: &Usage, g: f64) -> f64 {
        (u.settled + self.tau() * (u.rate as f64 * g - u.starts)).max(0.0)
    }

    /// The key of `tenant` in `tier`, with `extra` µ$ per hour started
    /// since (in the pass under way).
    pub fn key(&self, tier: Tier, tenant: TenantId, extra: u64) -> ShareKey {
        let u = self.usage.get(&(tier, tenant)).copied().unwrap_or_default();
        let ahead = (u.rate + extra) as f64 * self.h * self.g_keys;
        ShareKey((self.scaled_usage(&u, self.g_keys) + ahead) / self.weight(tenant) as f64)
    }

    /// A run of `rate` µ$ per hour starts at `at`.
    pub fn start(&mut self, tier: Tier, tenant: TenantId, rate: u64, at: Time) {
        let g = self.g(at) * rate as f64;
        let u = self.usage.entry((tier, tenant)).or_default();
        u.rate += rate;
        u.starts += g;
        u.magnitude += g;
    }

    /// A run that started at `at` ends: what it used is settled by
    /// [`Fair::record`] when the edge meters it.
    pub fn stop(&mut self, tier: Tier, tenant: TenantId, rate: u64, at: Time) {
        let g = self.g(at) * rate as f64;
        let u = self.usage.entry((tier, tenant)).or_default();
        u.rate -= rate;
        if u.rate == 0 {
            (u.starts, u.magnitude) = (0.0, 0.0);
        } else {
            u.starts -= g;
            u.magnitude += g;
        }
    }

    /// `rate` µ$ per hour used from `start` to `end` (both at most `now`).
    pub fn record(&mut self, tier: Tier, tenant: TenantId, rate: u64, start: Time, end: Time) {
        let used = rate as f64 * self.tau() * (self.g(end) - self.g(start));
        self.usage.entry((tier, tenant)).or_default().settled += used.max(0.0);
    }
}

/// Where a queued job sits: its tier, tenant, class and key in the class.
pub(crate) type QueuePlace = (Tier, TenantId, QueueClass, QueueKey);

pub(crate) fn queue_place(spec: &JobSpec) -> QueuePlace {
    (spec.tier, spec.tenant, QueueClass::of(spec), queue_key(spec))
}

/// A tenant's queued work in one tier: its key in the tier's order, how
/// many jobs it has queued, and those jobs by class, each class in the
/// tenant's own order.
#[derive(Clone, Debug, Default)]
pub(crate) struct TenantQueue {
    pub key: ShareKey,
    pub jobs: u32,
    pub classes: BTreeMap<QueueClass, BTreeSet<QueueKey>>,
}

impl super::State {
    // ---- fair share ------------------------------------------------------

    /// The half-life usage decays with. Set it before anything runs or is
    /// recorded: usage kept so far is forgotten.
    pub fn set_fair_share_half_life(&mut self, half_life: Span) -> Result<(), StateError> {
        if !crate::Config::FAIR_SHARE_HALF_LIFE.contains(&half_life) {
            return Err(StateError::Invalid(format!(
                "fair-share half-life must be from 1s to 365 days, got {}",
                half_life.human()
            )));
        }
        let weights = std::mem::take(&mut self.fair.weights);
        self.fair = Fair { weights, ..Fair::new(half_life) };
        let running: Vec<JobId> = self.jobs.values().filter(|j| j.run.is_some()).map(|j| j.spec.id).collect();
        for id in running {
            let job = &self.jobs[&id];
            let run = job.run.as_ref().expect("filtered");
            let (tier, tenant) = (job.spec.tier, job.spec.tenant);
            for (rate, at) in run.segments() {
                self.fair.advance(at);
                self.fair.start(tier, tenant, rate, at);
            }
        }
        self.rekey_all();
        Ok(())
    }

    pub fn fair_share_half_life(&self) -> Span {
        self.fair.half_life()
    }

    /// A tenant's weight in every tier (at least 1; [`DEFAULT_WEIGHT`]
    /// until set).
    pub fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), StateError> {
        if weight == 0 {
            return Err(StateError::Invalid(format!("tenant {tenant}: weight must be at least 1")));
        }
        self.fair.weights.insert(tenant, weight);
        for tier in Tier::ALL {
            self.rekey(tier, tenant);
        }
        Ok(())
    }

    pub fn weight(&self, tenant: TenantId) -> u32 {
        self.fair.weight(tenant)
    }

    /// A model's on-demand rate, µ$ per GPU-hour: runs that start from
    /// now on weigh this much per GPU-hour in their tenant's usage.
    pub fn set_model_rate(&mut self, model: GpuModelId, rate: u64) -> Result<(), StateError> {
        self.model_mut(model)?.rate = rate;
        Ok(())
    }

    /// What an attempt of `gpus` GPUs of `model` used from `start` to
    /// `end`, as the edge metered it once it ended; both are held to
    /// `now`, so a clock that is wrong cannot push usage into the future.
    pub fn record_usage(
        &mut self,
        tenant: TenantId,
        tier: Tier,
        model: GpuModelId,
        gpus: u32,
        (start, end): (Time, Time),
        now: Time,
    ) -> Result<(), StateError> {
        let rate = self.model(model).ok_or_else(|| StateError::NotFound(format!("gpu model {model}")))?.rate;
        let end = end.min(now);
        let start = start.min(end);
        if self.fair.advance(now) {
            self.rekey_all();
        }
        self.fair.record(tier, tenant, rate.saturating_mul(gpus as u64), start, end);
        self.rekey(tier, tenant);
        Ok(())
    }

    /// Where `tenant` stands in `tier` at `now`. O(tenants with usage in
    /// the tier): for people, not for passes.
    pub fn share(&self, tier: Tier, tenant: TenantId, now: Time) -> TenantShare {
        // An instant too far from the scale's to take `g` at is read as
        // the instant keys were last taken at.
        let g = Some(self.fair.g(now)).filter(|g| g.is_normal()).unwrap_or(self.fair.g_keys);
        let mut weights = 0u64;
        let mut total = 0.0;
        let mut counted = BTreeSet::new();
        // In tenant order, so the sum is the same however the map holds them.
        let in_tier: BTreeMap<TenantId, &Usage> =
            self.fair.usage.iter().filter(|((t, _), _)| *t == tier).map(|(&(_, t), u)| (t, u)).collect();
        for (t, u) in in_tier {
            let used = self.fair.scaled_usage(u, g) / g;
            total += used;
            if used > 0.0 || u.rate > 0 {
                counted.insert(t);
            }
        }
        counted.extend(self.order[tier.rank() as usize].iter().map(|&(_, t)| t));
        counted.insert(tenant);
        for &t in &counted {
            weights += self.fair.weight(t) as u64;
        }
        let u = self.fair.usage.get(&(tier, tenant)).copied().unwrap_or_default();
        let usage = self.fair.scaled_usage(&u, g) / g;
        let weight = self.fair.weight(tenant);
        let ahead = self
            .tenant_queues
            .get(&(tier, tenant))
            .map(|q| self.order[tier.rank() as usize].range(..(q.key, tenant)).count() as u32);
        TenantShare {
            weight,
            weight_share: weight as f64 / weights as f64,
            usage,
            share: if total > 0.0 { usage / total } else { 0.0 },
            running_rate: u.rate,
            ahead,
        }
    }

    /// Every tenant with usage or queued work in `tier`.
    pub fn tenants_in(&self, tier: Tier) -> BTreeSet<TenantId> {
        let mut out: BTreeSet<TenantId> =
            self.fair.usage.keys().filter(|(t, _)| *t == tier).map(|&(_, t)| t).collect();
        out.extend(self.order[tier.rank() as usize].iter().map(|&(_, t)| t));
        out
    }

    // ---- bookkeeping -----------------------------------------------------

    /// The tenant's key in the tier's order taken again, if it has queued
    /// work there.
    pub(crate) fn rekey(&mut self, tier: Tier, tenant: TenantId) {
        let kept = tier == Tier::Preemptible && self.keep_running;
        let q = self.tenant_queues.get_mut(&(tier, tenant));
        if q.is_none() && !kept {
            return;
        }
        let key = self.fair.key(tier, tenant, 0);
        if let Some(q) = q {
            let order = &mut self.order[tier.rank() as usize];
            order.remove(&(q.key, tenant));
            q.key = key;
            order.insert((key, tenant));
        }
        if !kept {
            return;
        }
        let running = &mut self.running_order;
        let runs = self.fair.usage.get(&(tier, tenant)).is_some_and(|u| u.rate > 0);
        match (self.running_keys.get_mut(&tenant), runs) {
            (Some(old), true) => {
                running.remove(&(*old, tenant));
                *old = key;
                running.insert((key, tenant));
            }
            (Some(old), false) => {
                running.remove(&(*old, tenant));
                self.running_keys.remove(&tenant);
            }
            (None, true) => {
                running.insert((key, tenant));
                self.running_keys.insert(tenant, key);
            }
            (None, false) => {}
        }
    }

    /// Every key taken again. The orders are built anew from sorted keys
    /// (a bulk build), not by moving tenants one at a time.
    pub(crate) fn rekey_all(&mut self) {
        let mut order: [Vec<(ShareKey, TenantId)>; 3] =
            std::array::from_fn(|i| Vec::with_capacity(self.order[i].len()));
        for (&(tier, tenant), q) in &mut self.tenant_queues {
            q.key = self.fair.key(tier, tenant, 0);
            order[tier.rank() as usize].push((q.key, tenant));
        }
        for (mut keys, set) in order.into_iter().zip(&mut self.order) {
            keys.sort_unstable();
            *set = keys.into_iter().collect();
        }
        self.running_keys.clear();
        self.running_order.clear();
        if self.keep_running {
            let mut running = Vec::with_capacity(self.running_keys.capacity());
            for (&(tier, tenant), u) in &self.fair.usage {
                if tier == Tier::Preemptible && u.rate > 0 {
                    let key = self.fair.key(tier, tenant, 0);
                    running.push((key, tenant));
                    self.running_keys.insert(tenant, key);
                }
            }
            running.sort_unstable();
            self.running_order = running.into_iter().collect();
        }
    }

    /// Whether fair-share preemption may run (`Config::
    /// fair_share_preemption`): while it may, the tenants running
    /// preemptible work are kept in order of their keys, so that a pass
    /// finds the one furthest above its share at once. Off (the default),
    /// a start or an end does not pay for that order, and a pass
    /// configured for fair-share preemption finds that tenant by looking
    /// at every one.
    pub fn set_fair_share_preemption(&mut self, on: bool) {
        self.keep_running = on;
        self.rekey_all();
    }

    /// The tenant running preemptible work with the highest key, other
    /// than `except`: the one furthest above its share.
    pub(crate) fn furthest_above_share(&self, except: TenantId) -> Option<TenantId> {
        if self.keep_running {
            return self.running_order.iter().rev().find(|(_, t)| *t != except).map(|&(_, t)| t);
        }
        let tier = Tier::Preemptible;
        self.fair
            .usage
            .iter()
            .filter(|(&(t, tenant), u)| t == tier && u.rate > 0 && tenant != except)
            .map(|(&(_, tenant), _)| (self.fair.key(tier, tenant, 0), tenant))
            .max()
            .map(|(_, t)| t)
    }

    /// Before anything at `now` changes usage: the scale kept safe and the
    /// keys taken again when due.
    pub(crate) fn fair_tick(&mut self, now: Time) {
        let moved = self.fair.advance(now);
        if moved || self.fair.keys_due(now) {
            self.fair.take_keys_at(now);
            self.rekey_all();
        }
    }

    /// A run of `job` starts (or is restored) at `at`.
    pub(crate) fn fair_start(&mut self, job: JobId) {
        let j = &self.jobs[&job];
        let run = j.run.as_ref().expect("a run starts");
        let (tier, tenant) = (j.spec.tier, j.spec.tenant);
        if run.resized.is_none() {
            // Every node joined at its start: one segment.
            let (rate, at) = (run.rate(), run.started_at);
            if self.fair.advance(at) {
                self.rekey_all();
            }
            self.fair.start(tier, tenant, rate, at);
            self.rekey(tier, tenant);
            return;
        }
        let latest = run.segments().map(|(_, at)| at).max().expect("a run has its start");
        if self.fair.advance(latest) {
            self.rekey_all();
        }
        let run = self.jobs[&job].run.as_ref().expect("a run starts");
        for (rate, at) in run.segments() {
            self.fair.start(tier, tenant, rate, at);
        }
        self.rekey(tier, tenant);
    }

    /// The run of `job` is about to end (or move tier).
    pub(crate) fn fair_stop(&mut self, tier: Tier, tenant: TenantId, run: &Run) {
        for (rate, at) in run.segments() {
            self.fair.stop(tier, tenant, rate, at);
        }
        self.rekey(tier, tenant);
    }

    /// Puts a queued job in its class and its tenant's place in the tier.
    pub(crate) fn queue_insert(&mut self, id: JobId) {
        let spec = &self.jobs[&id].spec;
        let (class, tenant, tier, key) = (QueueClass::of(spec), spec.tenant, spec.tier, queue_key(spec));
        let in_class = self.class_jobs.entry(class).or_insert(0);
        if *in_class == 0 {
            self.classes_in_tier[tier.rank() as usize] += 1;
        }
        *in_class += 1;
        let q = self.tenant_queues.entry((tier, tenant)).or_default();
        let fresh = q.jobs == 0;
        q.jobs += 1;
        let inserted = q.classes.entry(class).or_default().insert(key);
        debug_assert!(inserted);
        if fresh {
            q.key = self.fair.key(tier, tenant, 0);
            self.order[tier.rank() as usize].insert((q.key, tenant));
        }
    }

    /// Takes a queued job out of its class and, with its last, its tenant
    /// out of the tier's order.
    pub(crate) fn queue_remove(&mut self, id: JobId) {
        self.queue_remove_all(&mut [queue_place(&self.jobs[&id].spec)]);
    }

    /// Takes queued jobs, each given by its tier, tenant, class and key,
    /// out of their classes, as [`Self::queue_remove`] does one. Grouped
    /// by tenant and class, so a plan's starts touch each tenant's queue
    /// once rather than once per job in the plan's order (which goes from
    /// tenant to tenant).
    pub(crate) fn queue_remove_all(&mut self, places: &mut [QueuePlace]) {
        if places.len() > 1 {
            places.sort_unstable();
        }
        for group in places.chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
            let (tier, tenant, class, _) = group[0];
            let q = self.tenant_queues.get_mut(&(tier, tenant)).expect("queued job's tenant");
            let queue = q.classes.get_mut(&class).expect("queued job has a class");
            for (_, _, _, key) in group {
                // A pass starts the first of a tenant's class: no search for it.
                let removed = match queue.first() == Some(key) {
                    true => queue.pop_first().is_some(),
                    false => queue.remove(key),
                };
                debug_assert!(removed);
            }
            let n = group.len() as u32;
            if queue.is_empty() {
                q.classes.remove(&class);
            }
            q.jobs -= n;
            if q.jobs == 0 {
                let key = q.key;
                self.tenant_queues.remove(&(tier, tenant));
                self.order[tier.rank() as usize].remove(&(key, tenant));
            }
            let in_class = self.class_jobs.get_mut(&class).expect("counted");
            *in_class -= n;
            if *in_class == 0 {
                self.class_jobs.remove(&class);
                self.classes_in_tier[tier.rank() as usize] -= 1;
            }
        }
    }
}
