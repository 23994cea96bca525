//! Money: prices, reservations, invoices and the operator's report.

use super::*;
use crate::billing::Pricing;

/// How far before now a reservation's start is taken as now rather than
/// as a backdated one.
const PAST_START_SLACK_MS: u64 = 60_000;

impl Money {
    /// The model's prices, adding the default price for a model first seen.
    pub(super) fn price_for(
        &mut self,
        model: &str,
        pricing: &Pricing,
        fx: &mut impl Effects,
    ) -> Written<PriceRow> {
        if let Some(row) = self.prices.get(model) {
            return Ok(row.clone());
        }
        let price = pricing.default_price;
        let row = PriceRow { gpu_model: model.to_string(), on_demand: price, reserved: price };
        fx.put_price(&row)?;
        tracing::info!(gpu_model = model, on_demand = %crate::billing::usd(price), "priced at the default");
        self.prices.insert(model.to_string(), row.clone());
        Ok(row)
    }

    pub(super) fn price_book(&self, pricing: &Pricing) -> ebb_api::PriceBook {
        let bps = pricing.discount_bps;
        ebb_api::PriceBook {
            preemptible_discount_percent: f64::from(bps) / 100.0,
            prices: self.prices.values().map(|p| crate::billing::price_view(p, bps)).collect(),
        }
    }

    /// The operator's prices for a model the core or the price book knows.
    pub(super) fn set_price(
        &mut self,
        core: &State,
        model: &str,
        update: &ebb_api::PriceUpdate,
        pricing: &Pricing,
        fx: &mut impl Effects,
    ) -> Result<ebb_api::Price, Fail> {
        self.known_model(core, "gpu_model", model)?;
        let bps = pricing.discount_bps;
        let on_demand = crate::billing::parse_price("on_demand_usd", &update.on_demand_usd, bps)?;
        let reserved = match &update.reserved_usd {
            Some(text) => crate::billing::parse_price("reserved_usd", text, bps)?,
            None => self.prices.get(model).map_or(on_demand, |p| p.reserved),
        };
        let row = PriceRow { gpu_model: model.to_string(), on_demand, reserved };
        fx.put_price(&row)?;
        tracing::info!(gpu_model = model, on_demand = %crate::billing::usd(on_demand), "price set");
        self.prices.insert(model.to_string(), row.clone());
        Ok(crate::billing::price_view(&row, bps))
    }

    /// Each model's on-demand rate, as fair share weighs its GPU-hours
    /// (the price set for it, else the server's default).
    pub(super) fn rate_models(&self, core: &mut State, pricing: &Pricing) {
        let rates: Vec<(ebb_core::GpuModelId, i64)> = core
            .models()
            .map(|(id, m)| (id, self.prices.get(&m.name).map_or(pricing.default_price, |p| p.on_demand)))
            .collect();
        for (id, rate) in rates {
            core.set_model_rate(id, u64::try_from(rate).unwrap_or(0)).expect("a model the core knows");
        }
    }

    pub(super) fn known_model(&self, core: &State, field: &str, model: &str) -> Result<(), Refusal> {
        if core.model_by_name(model).is_some() || self.prices.contains_key(model) {
            return Ok(());
        }
        let known: Vec<&str> = self.prices.keys().map(String::as_str).collect();
        Err(Refusal::unacceptable(format!(
            "{field}: unknown GPU model {model:?} (known: {})",
            if known.is_empty() { "none yet".to_string() } else { known.join(", ") }
        )))
    }

    /// A reservation of a model's GPUs for a tenant over a period: no
    /// more than the model has, none overlapping the tenant's own.
    pub(super) fn create_reservation(
        &mut self,
        core: &mut State,
        tenants: &Tenants,
        pricing: &Pricing,
        fx: &mut impl Effects,
        req: &ebb_api::ReservationRequest,
    ) -> Result<ebb_api::Reservation, Fail> {
        let now = fx.now();
        let tenant = tenants.by_name(&req.tenant)?;
        self.known_model(core, "gpu_model", &req.gpu_model)?;
        let model = core.model_by_name(&req.gpu_model).ok_or_else(|| {
            Refusal::unacceptable(format!("gpu_model: no node of {} has joined yet", req.gpu_model))
        })?;
        let capacity = core.model(model).expect("known").capacity;
        if req.gpus == 0 || req.gpus > capacity {
            return Err(Refusal::unacceptable(format!(
                "gpus: must be between 1 and the {} of {}, got {}",
                ebb_core::count(u64::from(capacity), "GPU"),
                req.gpu_model,
                req.gpus
            ))
            .into());
        }
        let start = crate::billing::parse_time("start", &req.start)?;
        let end = crate::billing::parse_time("end", &req.end)?;
        // A start in the past charges for time already gone: only when the
        // operator says so. The last minute is now (a client's clock, or
        // `--start` left to the CLI's now, a request's time behind).
        let start = match now.saturating_sub(start) {
            0 => start,
            behind if behind <= PAST_START_SLACK_MS => now,
            _ if req.backdate => start,
            behind => {
                return Err(Refusal::unacceptable(format!(
                    "start: {} is {} in the past, and a reservation is charged from its start; start it \
                     now (leave start out of `ebb reservation create`), or pass backdate (--backdate) \
                     to record a contract that began earlier",
                    req.start.trim(),
                    ebb_core::Span(behind).human()
                ))
                .into())
            }
        };
        if start >= end {
            return Err(
                Refusal::unacceptable(format!("end: {} is not after start: {}", req.end, req.start)).into()
            );
        }
        let overlapping: Vec<&ReservationRow> = self
            .reservations
            .values()
            .filter(|r| r.gpu_model == req.gpu_model && r.start_ms < end && start < r.end_ms)
            .collect();
        if let Some(r) = overlapping.iter().find(|r| r.tenant == tenant) {
            return Err(Refusal::conflict(format!(
                "the period overlaps reservation {} of {} ({} to {}); {}",
                r.id,
                req.tenant,
                rfc3339(r.start_ms),
                rfc3339(r.end_ms),
                if r.deleted_ms.is_some() {
                    "it was deleted, but that time stays charged to it"
                } else {
                    "change that one instead"
                }
            ))
            .into());
        }
        let reserved: u32 = overlapping.iter().map(|r| r.gpus).sum();
        if reserved + req.gpus > capacity {
            return Err(Refusal::conflict(format!(
                "gpus: {reserved} of the {} are already reserved in that period; {} left",
                ebb_core::count(u64::from(capacity), &format!("{} GPU", req.gpu_model)),
                if capacity - reserved == 1 {
                    "1 is".to_string()
                } else {
                    format!("{} are", capacity - reserved)
                }
            ))
            .into());
        }
        let rate = match &req.rate_usd {
            Some(text) => crate::billing::parse_price("rate_usd", text, pricing.discount_bps)?,
            None => self.price_for(&req.gpu_model, pricing, fx)?.reserved,
        };
        let id = self.reservations.keys().max().map_or(1, |m| m + 1);
        let row = ReservationRow {
            id,
            tenant,
            gpu_model: req.gpu_model.clone(),
            gpus: req.gpus,
            start_ms: start,
            end_ms: end,
            rate,
            deleted_ms: None,
        };
        core.add_reservation(core_reservation(core, &row)?).map_err(|e| Refusal::invalid(e.to_string()))?;
        fx.put_reservation(&row)?;
        tracing::info!(reservation = id, tenant = req.tenant, gpus = req.gpus, "reservation created");
        self.reservations.insert(id, row.clone());
        Ok(crate::billing::reservation_view(&row, &req.tenant))
    }

    /// Deletes reservation `id` at `now` without touching what it has
    /// charged: invoices are computed from the reservation rows, so a row
    /// that has charged anything stays. One not started yet is withdrawn
    /// (removed: it never charged); one in force ends now (charged up to
    /// now, nothing after; refused while its reserved jobs run); one
    /// already over only leaves the list. The reply is the reservation as
    /// it is charged from now on (a withdrawn one ends where it starts).
    pub(super) fn delete_reservation(
        &mut self,
        core: &mut State,
        jobs: &JobTable,
        tenants: &Tenants,
        fx: &mut impl Effects,
        id: u64,
    ) -> Result<ebb_api::Reservation, Fail> {
        let now = fx.now();
        let row = self
            .reservations
            .get(&id)
            .filter(|r| r.deleted_ms.is_none())
            .cloned()
            .ok_or_else(|| Refusal::not_found(format!("reservation {id}: not found")))?;
        let in_force = row.start_ms <= now && now < row.end_ms;
        if in_force {
            let live: Vec<JobId> = jobs
                .values()
                .filter(|j| j.tier == Tier::Reserved && j.tenant == row.tenant && j.state.is_live())
                .filter(|j| j.billing.as_ref().is_some_and(|(m, _, _)| *m == row.gpu_model))
                .map(|j| j.id)
                .collect();
            if !live.is_empty() {
                return Err(Refusal::conflict(format!(
                    "reservation {id}: reserved jobs {live:?} are running on it; cancel them first"
                ))
                .into());
            }
        }
        if let Err(e) = core.remove_reservation(ebb_core::ReservationId(id as u32)) {
            // It was not restored at start (logged then): nothing to take back.
            tracing::warn!(reservation = id, "not in the scheduler: {e}");
        }
        let tenant = tenants.name(row.tenant);
        if row.start_ms > now {
            fx.delete_reservation(id)?;
            self.reservations.remove(&id);
            tracing::info!(reservation = id, tenant, "reservation withdrawn before its start");
            let withdrawn = ReservationRow { end_ms: row.start_ms, ..row };
            return Ok(crate::billing::reservation_view(&withdrawn, &tenant));
        }
        let kept = ReservationRow { end_ms: row.end_ms.min(now), deleted_ms: Some(now), ..row };
        fx.put_reservation(&kept)?;
        tracing::info!(reservation = id, tenant, end = %rfc3339(kept.end_ms), "reservation deleted; its charges stay");
        self.reservations.insert(id, kept.clone());
        Ok(crate::billing::reservation_view(&kept, &tenant))
    }

    /// A tenant's invoice for a period: its own, or any for an operator.
    pub(super) fn bill(
        &self,
        tenants: &Tenants,
        fx: &mut impl Effects,
        principal: &Principal,
        tenant: Option<&str>,
        (from, to): (&str, &str),
    ) -> Result<ebb_api::Invoice, Fail> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        let tenant = match (tenant, &principal.tenant) {
            (Some(name), _) if principal.scope == crate::store::Scope::Admin => tenants.by_name(name)?,
            (Some(name), Some((id, own))) if name == own => *id,
            (Some(_), _) => return Err(Refusal::forbidden("only an operator may bill another tenant").into()),
            (None, Some((id, _))) => *id,
            (None, None) => {
                return Err(Refusal::unacceptable("tenant: required for this token".into()).into())
            }
        };
        let usage = fx.usage(Some(tenant), from_ms, to_ms)?;
        let reservations: Vec<ReservationRow> =
            self.reservations.values().filter(|r| r.tenant == tenant).cloned().collect();
        Ok(crate::billing::invoice(&tenants.name(tenant), &usage, &reservations, from_ms, to_ms))
    }
}

/// What the operator's report of a period from `from_ms` is computed
/// from: the usage records, the attempts running, the nodes and the
/// reservations.
pub(super) fn ledger(p: &mut Parts<impl Effects>, from_ms: u64) -> Result<crate::billing::Ledger, Fail> {
    // Attempts that started before the period and ended in or after it
    // count for the hours they ran inside it.
    let usage = p.fx.usage(None, from_ms, u64::MAX)?;
    let live: Vec<crate::billing::Live> = p
        .jobs
        .values()
        .filter(|j| j.state.is_live())
        .filter_map(|j| {
            Some(crate::billing::Live {
                tenant: j.tenant,
                tier: j.tier.as_str().into(),
                gpus: j.running_gpus(),
                started_ms: j.run_started_ms?,
            })
        })
        .collect();
    let nodes: Vec<(u64, u32)> = p.fleet.nodes.values().map(|n| (n.joined_ms, u32::from(n.gpus))).collect();
    let reservations: Vec<ReservationRow> = p.money.reservations.values().cloned().collect();
    let names = p.tenants.names.clone();
    Ok(crate::billing::Ledger { usage, live, reservations, nodes, now: p.fx.now(), names })
}

/// The operator's report of a period.
pub(super) fn report(
    p: &mut Parts<impl Effects>,
    from: &str,
    to: &str,
) -> Result<ebb_api::OperatorReport, Fail> {
    let (from_ms, to_ms) = crate::billing::period(from, to)?;
    Ok(crate::billing::report(&ledger(p, from_ms)?, from_ms, to_ms))
}

/// The operator's report of a period, step by step.
pub(super) fn report_series(
    p: &mut Parts<impl Effects>,
    (from, to): (&str, &str),
    step: &str,
) -> Result<ebb_api::ReportSeries, Fail> {
    let (from_ms, to_ms) = crate::billing::period(from, to)?;
    let step_ms = crate::billing::series_step(step, from_ms, to_ms)?;
    Ok(crate::billing::series(&ledger(p, from_ms)?, from_ms, to_ms, step_ms))
}

/// A reservation as the scheduling core holds it.
pub(super) fn core_reservation(
    core: &State,
    r: &ReservationRow,
) -> Result<ebb_scheduler::Reservation, Refusal> {
    let model = core
        .model_by_name(&r.gpu_model)
        .ok_or_else(|| Refusal::invalid(format!("gpu_model: unknown model {:?}", r.gpu_model)))?;
    Ok(ebb_scheduler::Reservation {
        id: ebb_core::ReservationId(r.id as u32),
        tenant: r.tenant,
        gpu_model: model,
        gpus: r.gpus,
        start: Time(r.start_ms),
        end: Time(r.end_ms),
    })
}

/// An attempt's use, metered, counted in its tenant's fair share: an
/// elastic attempt's node by node, but for the first `counted` nodes'
/// (those that left, counted as each did).
pub(super) fn fair_share_usage(core: &mut State, usage: &crate::billing::UsageRow, now: u64, counted: usize) {
    let (Some(model), Ok(tier)) = (core.model_by_name(&usage.gpu_model), usage.tier.parse::<Tier>()) else {
        return;
    };
    if usage.segments.iter().any(|s| s.gpus > 0) {
        for part in usage.parts().iter().skip(counted) {
            let span = (Time(part.from_ms), Time(part.to_ms));
            let _ = core.record_usage(usage.tenant, tier, model, part.gpus, span, Time(now));
        }
        return;
    }
    let span = (Time(usage.started_ms), Time(usage.ended_ms));
    let _ = core.record_usage(usage.tenant, tier, model, usage.gpus, span, Time(now));
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;
    /// 2027-01-15T08:00:00Z.
    const NOW: u64 = 1_800_000_000_000;

    fn request(tenant: &str, gpus: u32, start_ms: u64, end_ms: u64) -> ebb_api::ReservationRequest {
        ebb_api::ReservationRequest {
            tenant: tenant.into(),
            gpu_model: "H100".into(),
            gpus,
            start: rfc3339(start_ms),
            end: rfc3339(end_ms),
            rate_usd: None,
            backdate: false,
        }
    }

    fn refusal(result: Result<ebb_api::Reservation, Fail>) -> String {
        match result {
            Err(Fail::Refused(refusal)) => refusal.message,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn reservations_over_the_parts_stay_within_the_model_and_a_deleted_one_keeps_what_it_charged() {
        let mut owned = effects::Owned::new(JobId(1), NOW);
        let spec = NodeSpec { name: "a".into(), gpu_model: "H100".into(), gpus: 8, labels: BTreeMap::new() };
        owned.core.add_node(spec, Time(0)).unwrap();
        owned.tenants.names.insert(TenantId(1), "acme".into());
        owned.tenants.names.insert(TenantId(2), "beta".into());
        let p = &mut owned.parts();
        let create = |p: &mut Parts<effects::Recorded>, req| {
            p.money.create_reservation(p.core, p.tenants, &p.config.pricing, &mut p.fx, &req)
        };

        // Acme's, in force from now, at the price book's reserved rate,
        // priced at the default for a model first seen.
        let acme = create(p, request("acme", 6, NOW, NOW + HOUR)).unwrap();
        assert_eq!((acme.id, acme.gpus, acme.start_ms), (1, 6, NOW));
        assert_eq!(p.fx.prices.len(), 1);
        assert_eq!(acme.rate_micro_usd, p.fx.prices[0].reserved);
        // Two of the eight left for beta, none overlapping acme's own.
        let over = refusal(create(p, request("beta", 3, NOW, NOW + HOUR)));
        assert_eq!(over, "gpus: 6 of the 8 H100 GPUs are already reserved in that period; 2 are left");
        let own = refusal(create(p, request("acme", 1, NOW + HOUR / 2, NOW + 2 * HOUR)));
        assert!(own.starts_with("the period overlaps reservation 1 of acme"), "{own}");
        let unknown = refusal(create(p, request("nobody", 1, NOW, NOW + HOUR)));
        assert_eq!(unknown, "tenant: unknown tenant \"nobody\"");
        // Beta's, later: withdrawn before its start, it leaves the store.
        let later = create(p, request("beta", 8, NOW + 2 * HOUR, NOW + 3 * HOUR)).unwrap();
        let withdrawn = p.money.delete_reservation(p.core, p.jobs, p.tenants, &mut p.fx, later.id).unwrap();
        assert_eq!(withdrawn.end_ms, withdrawn.start_ms);
        assert_eq!(p.fx.reservations.last(), Some(&(later.id, None)));
        // Acme's, in force: it ends now and its row stays for its charges.
        p.money.delete_reservation(p.core, p.jobs, p.tenants, &mut p.fx, acme.id).unwrap();
        let (id, kept) = p.fx.reservations.last().unwrap();
        let kept = kept.as_ref().unwrap();
        assert_eq!((*id, kept.end_ms, kept.deleted_ms), (1, NOW, Some(NOW)));
        let gone = p.money.delete_reservation(p.core, p.jobs, p.tenants, &mut p.fx, acme.id);
        assert_eq!(refusal(gone), "reservation 1: not found");
        // The GPUs are free again: beta may have all eight now.
        assert!(create(p, request("beta", 8, NOW, NOW + HOUR)).is_ok());
    }
}
