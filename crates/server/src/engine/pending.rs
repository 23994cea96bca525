//! Why a queued job waits, as its owner reads it: a stable code and a
//! sentence with the numbers. The scheduling core gives the reason for the
//! first waiting job of each queue class in every pass (`Plan::pending`);
//! the rest of a class wait behind it; a job whose GPUs are held waits for
//! its victims' drain; the edge's own waits (a restart back-off, a tenant's
//! limit) come before the core sees the job.

use ebb_api::PendingReason;
use ebb_scheduler::Pending;

use super::*;

impl<S: Store> Engine<S> {
    /// Keeps the reasons of a pass: every pass gives them for the first
    /// waiting job of every class, so the latest pass's replace the last.
    pub(super) fn keep_pending(&mut self, pending: Vec<(JobId, Pending)>) {
        self.pending.clear();
        self.pending.extend(pending);
    }

    /// Why a queued job waits; `None` for any other.
    fn why<'s>(&'s self, job: &JobRecord) -> Option<Why<'s>> {
        if job.state != JobState::Queued {
            return None;
        }
        match job.waiting {
            Some(Waiting::Backoff { until_ms }) => return Some(Why::Backoff { until_ms }),
            Some(Waiting::TenantLimit) => return Some(Why::TenantLimit),
            Some(Waiting::Dependency) => return Some(Why::Dependency),
            Some(Waiting::ArrayLimit) => return Some(Why::ArrayLimit),
            None => {}
        }
        let id = job.id;
        if let Some(hold) = self.core.hold(id) {
            return Some(Why::Held(hold));
        }
        let first = self.core.first_in_line(id)?;
        if first != id {
            return Some(Why::Behind(first));
        }
        if let Some(why) = self.pending.get(&id) {
            return Some(Why::Core(why));
        }
        // The pass ended before its tenant's turn: every class of its tier
        // was blocked by tenants ahead of it in the tier's order.
        match self.core.share(job.tier, job.tenant, Time(self.now)).ahead {
            Some(ahead) if ahead > 0 => Some(Why::FairShare(ahead)),
            _ => Some(Why::NotYet),
        }
    }

    /// The queued jobs by tier and reason code, as `why` gives them one by
    /// one, without looking at each (for `/metrics`): those kept out of
    /// the core from the tally, those holding GPUs from the holds, and
    /// from each queue class its first with the pass's reason and the rest
    /// behind it. Any queued job none of these counts is `scheduling`.
    pub(super) fn queued_reasons(&self, out: &mut BTreeMap<crate::metrics::QueueKey, u64>) {
        let mut add = |tier: Tier, reason: PendingReason, n: u64| {
            if n == 0 {
                return;
            }
            *out.entry(crate::metrics::QueueKey { tier: tier.as_str(), reason }).or_insert(0) += n;
        };
        let mut unexplained: BTreeMap<Tier, u64> = Tier::ALL
            .iter()
            .map(|&tier| (tier, self.jobs.tally.jobs.get(&(tier, JobState::Queued)).copied().unwrap_or(0)))
            .collect();
        let mut explain = |tier: Tier, n: u64| {
            let left = unexplained.entry(tier).or_insert(0);
            *left = left.saturating_sub(n);
        };
        for (&(tier, reason), &n) in &self.jobs.tally.waiting {
            add(tier, reason, n);
            explain(tier, n);
        }
        for hold in self.core.holds() {
            let Some(job) = self.core.job(hold.job) else { continue };
            add(job.spec.tier, PendingReason::VictimsDraining, 1);
            explain(job.spec.tier, 1);
        }
        for (tier, first, len) in self.core.queue_heads() {
            let first_why = self.pending.get(&first).map_or(Why::NotYet, Why::Core);
            add(tier, first_why.code(), 1);
            add(tier, PendingReason::Priority, len as u64 - 1);
            explain(tier, len as u64);
        }
        for (tier, n) in unexplained {
            add(tier, PendingReason::Scheduling, n);
        }
    }

    /// A queued job's reason code and sentence; `None` for any other.
    pub(super) fn pending(&self, job: &JobRecord, now_ms: u64) -> Option<(PendingReason, String)> {
        let why = self.why(job)?;
        let text = match &why {
            Why::Backoff { until_ms } => format!(
                "restart back-off until {}: {} quick exits in a row (runs under {} s)",
                rfc3339(*until_ms),
                job.quick_exits,
                QUICK_EXIT_MS / 1000
            ),
            Why::TenantLimit => format!(
                "tenant {} has {} jobs admitted, its limit (ebb tenant limits, ebb server --max-running-jobs)",
                self.tenants.name(job.tenant),
                self.admission.limits_of(job.tenant).max_running_jobs
            ),
            Why::Dependency => {
                let on: Vec<String> = job
                    .spec
                    .after
                    .iter()
                    .flat_map(|a| a.on.iter())
                    .filter(|(_, id)| self.jobs.get(id).is_some_and(|p| !p.state.is_final()))
                    .map(|(_, id)| id.to_string())
                    .collect();
                format!("waits for job{} {} to end (its dependency)", if on.len() == 1 { "" } else { "s" }, on.join(", "))
            }
            Why::ArrayLimit => format!(
                "its array runs at most {} tasks at once, and that many run",
                job.spec.array_limit.unwrap_or(0)
            ),
            Why::Held(hold) => self.victims_draining(hold, now_ms),
            Why::Behind(first) => {
                format!("behind job {}, which is ahead of it in line for the same GPUs and waits too", first.0)
            }
            Why::Core(pending) => self.describe(job, pending),
            Why::FairShare(ahead) => self.fair_share_text(job, *ahead),
            Why::NotYet => "not yet looked at by the scheduler".into(),
        };
        Some((why.code(), text))
    }

    fn describe(&self, job: &JobRecord, why: &Pending) -> String {
        let model = |m: GpuModelId| self.core.model(m).map_or_else(|| m.to_string(), |m| m.name.clone());
        let node = |n: NodeId| self.core.node(n).map_or_else(|| n.to_string(), |n| n.name.clone());
        let gpus = gpus(job.gpus);
        match why {
            Pending::Resources { model: m, largest_free } => {
                let mut text = format!(
                    "waiting for {gpus} of {} free on one node; the most free on any node is {largest_free}",
                    model(*m)
                );
                if job.tier != Tier::Preemptible {
                    text.push_str(", and no preemptible work can make room");
                }
                text
            }
            Pending::Priority { behind } => format!("behind job {}: the GPUs it would fit on are kept for that job, which is ahead of it", behind.0),
            Pending::WholeNodes { model: m, nodes, free, earmarked } => {
                let mut text = format!(
                    "a gang of {gpus} waits for {nodes} whole free {} nodes; {free} free now",
                    model(*m)
                );
                if !earmarked.is_empty() {
                    let names: Vec<String> = earmarked.iter().map(|n| node(*n)).collect();
                    text.push_str(&format!("; kept for it as they empty: {}", names.join(", ")));
                }
                text
            }
            Pending::ReservationCap { model: m, capacity, reserved, used } => format!(
                    "on-demand may use {} of {capacity} {}: {reserved} are reserved, and on-demand work uses {used}",
                    capacity.saturating_sub(*reserved),
                    model(*m)
                ),
            Pending::ReservationFull { model: m, reserved, used } => format!(
                    "its tenant's reservation of {} is {} with {used} in use; it needs {gpus}",
                    model(*m),
                    self::gpus(*reserved)
                ),
            Pending::ReservationNotStarted { model: m, starts: Some(at) } => format!("waits for its tenant's reservation of {}, which starts at {}", model(*m), rfc3339(at.0)),
            Pending::ReservationNotStarted { model: m, starts: None } => format!("its tenant has no reservation of {} now or later", model(*m)),
            Pending::Reclaimed { model: m, limit, used } => format!(
                    "the operator reclaimed preemptible {} capacity: preemptible work may use {limit}, and uses {used} \
                     (ebb reclaim --release lifts it)",
                    model(*m)
                ),
            Pending::NoCapacity { model: m } => {
                let what = m.map_or_else(|| "of any model".to_string(), |m| format!("of {}", model(m)));
                format!("not {gpus} {what} are in service now (nodes are drained, lost or gone)")
            }
            Pending::FairShare { tenants_ahead } => self.fair_share_text(job, *tenants_ahead),
            Pending::Quota { model: m, used, nominal, borrowing } => format!(
                "{} uses {used} of its {nominal} {} {}; borrowing is {}",
                self.tenants.name(job.tenant),
                job.tier,
                model(*m),
                borrowing.map_or_else(|| "unlimited".to_string(), |b| format!("at most {b}"))
            ),
            Pending::QuotaOwed { model: m, owner } => format!(
                "it would borrow {} {} that {} is owed under its quota and waits for",
                job.tier,
                model(*m),
                self.tenants.name(*owner)
            ),
            Pending::QuotaKept { model: m, kept } => format!(
                "{kept} {} {} are kept idle for other tenants' quotas (their lending limits)",
                job.tier,
                model(*m)
            ),
            Pending::ReclaimingQuota { model: m, victims: 0 } => format!(
                "{} is under its {} {} quota: it waits for borrowers' jobs to end (on-demand is never preempted)",
                self.tenants.name(job.tenant),
                job.tier,
                model(*m)
            ),
            Pending::ReclaimingQuota { model: m, victims } => format!(
                "{} is under its {} {} quota: {victims} borrower job{} drain{} to give GPUs back",
                self.tenants.name(job.tenant),
                job.tier,
                model(*m),
                if *victims == 1 { "" } else { "s" },
                if *victims == 1 { "s" } else { "" }
            ),
            Pending::ReclaimingShare { from, victims } => format!(
                "fair-share preemption: {} job{} of {}, furthest above its share, drain{} for {}; it starts when \
                 they have left",
                victims,
                if *victims == 1 { "" } else { "s" },
                self.tenants.name(*from),
                if *victims == 1 { "s" } else { "" },
                self.tenants.name(job.tenant)
            ),
        }
    }

    /// Why a tenant's job waits behind other tenants' in its tier: its
    /// share of the tier's usage against its weight's, and how many
    /// tenants wait ahead of it.
    pub(super) fn fair_share_text(&self, job: &JobRecord, ahead: u32) -> String {
        // The core's time, the latest batch's, not the caller's clock.
        let share = self.core.share(job.tier, job.tenant, Time(self.now));
        let half_life = self.core.fair_share_half_life().human();
        let standing = if share.share > share.weight_share { "over" } else { "within" };
        format!(
            "{} is {standing} its share: {:.0}% of this tier's usage (half-life {half_life}) against a weight of \
             {:.0}%; {ahead} tenant{} ahead",
            self.tenants.name(job.tenant),
            share.share * 100.0,
            share.weight_share * 100.0,
            if ahead == 1 { "" } else { "s" }
        )
    }

    fn victims_draining(&self, hold: &ebb_scheduler::Hold, now_ms: u64) -> String {
        let nodes: Vec<String> =
            hold.alloc.iter().filter_map(|(n, _)| self.core.node(*n)).map(|n| n.name.clone()).collect();
        let deadline = hold
            .waiting_on
            .iter()
            .filter_map(|v| self.core.job(*v).and_then(|j| j.notice))
            .map(|n| n.deadline)
            .max();
        let victims: Vec<String> = hold.waiting_on.iter().map(|v| v.0.to_string()).collect();
        let mut text = match victims.len() {
            0 => "its GPUs are free; it starts now".to_string(),
            1 => format!("waiting for job {} to drain", victims[0]),
            _ => format!("waiting for jobs {} to drain", victims.join(", ")),
        };
        if let Some(deadline) = deadline {
            let left = Span(deadline.0.saturating_sub(now_ms));
            text.push_str(&format!(
                " (deadline {}, in {})",
                rfc3339(deadline.0),
                humantime::format_duration(std::time::Duration::from_secs(left.0.div_ceil(1000)))
            ));
        }
        text.push_str(&format!("; its GPUs are held on {}", nodes.join(", ")));
        text
    }
}

/// Why a queued job waits, before it is put in words.
enum Why<'s> {
    Backoff {
        until_ms: u64,
    },
    TenantLimit,
    Dependency,
    ArrayLimit,
    /// GPUs are held for it while its victims drain.
    Held(&'s ebb_scheduler::Hold),
    /// Behind the first job of its queue class.
    Behind(JobId),
    /// The latest pass's reason.
    Core(&'s Pending),
    /// Not reached by the latest pass: this many tenants of its tier, ahead
    /// of its own, wait for GPUs first.
    FairShare(u32),
    NotYet,
}

impl Why<'_> {
    fn code(&self) -> PendingReason {
        match self {
            Why::Backoff { .. } => PendingReason::Backoff,
            Why::TenantLimit => PendingReason::TenantLimit,
            Why::Dependency => PendingReason::Dependency,
            Why::ArrayLimit => PendingReason::ArrayLimit,
            Why::Held(_) => PendingReason::VictimsDraining,
            Why::Behind(_) => PendingReason::Priority,
            Why::NotYet => PendingReason::Scheduling,
            Why::FairShare(_) => PendingReason::FairShare,
            Why::Core(pending) => match pending {
                Pending::Resources { .. } => PendingReason::Resources,
                Pending::Priority { .. } => PendingReason::Priority,
                Pending::WholeNodes { .. } => PendingReason::WholeNodes,
                Pending::ReservationCap { .. } => PendingReason::ReservationCap,
                Pending::ReservationFull { .. } => PendingReason::ReservationFull,
                Pending::ReservationNotStarted { .. } => PendingReason::ReservationNotStarted,
                Pending::Reclaimed { .. } => PendingReason::Reclaimed,
                Pending::NoCapacity { .. } => PendingReason::NoCapacity,
                Pending::FairShare { .. } => PendingReason::FairShare,
                Pending::ReclaimingShare { .. } => PendingReason::ReclaimingShare,
                Pending::Quota { .. } | Pending::QuotaOwed { .. } | Pending::QuotaKept { .. } => {
                    PendingReason::Quota
                }
                Pending::ReclaimingQuota { .. } => PendingReason::ReclaimingQuota,
            },
        }
    }
}

/// "1 GPU", "4 GPUs".
fn gpus(n: u32) -> String {
    if n == 1 {
        "1 GPU".into()
    } else {
        format!("{n} GPUs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PendingReason::ALL` (what `/metrics` exports at zero and the docs
    /// list) is exactly the codes a wait can have.
    #[test]
    fn every_reason_code_is_listed_once() {
        let m = GpuModelId(0);
        let hold = ebb_scheduler::Hold {
            job: JobId(1),
            model: m,
            alloc: Vec::new(),
            waiting_on: BTreeSet::new(),
            waiting_parts: BTreeSet::new(),
            staged: None,
        };
        let core = [
            Pending::Resources { model: m, largest_free: 0 },
            Pending::Priority { behind: JobId(1) },
            Pending::WholeNodes { model: m, nodes: 2, free: 0, earmarked: Vec::new() },
            Pending::ReservationCap { model: m, capacity: 8, reserved: 4, used: 4 },
            Pending::ReservationFull { model: m, reserved: 4, used: 4 },
            Pending::ReservationNotStarted { model: m, starts: None },
            Pending::Reclaimed { model: m, limit: 0, used: 0 },
            Pending::NoCapacity { model: None },
            Pending::FairShare { tenants_ahead: 1 },
            Pending::ReclaimingShare { from: TenantId(1), victims: 1 },
            Pending::Quota { model: m, used: 1, nominal: 1, borrowing: None },
            Pending::ReclaimingQuota { model: m, victims: 0 },
        ];
        let mut codes: Vec<PendingReason> = core.iter().map(|p| Why::Core(p).code()).collect();
        for why in [
            Why::Backoff { until_ms: 0 },
            Why::TenantLimit,
            Why::Dependency,
            Why::ArrayLimit,
            Why::Held(&hold),
            Why::Behind(JobId(1)),
            Why::NotYet,
        ] {
            codes.push(why.code());
        }
        codes.sort_unstable();
        codes.dedup();
        let mut listed = PendingReason::ALL.to_vec();
        listed.sort_unstable();
        assert_eq!(codes, listed);
    }
}
