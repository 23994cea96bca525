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
        store: &mut impl Store,
        outbox: &mut Outbox,
    ) -> Written<PriceRow> {
        if let Some(row) = self.prices.get(model) {
            return Ok(row.clone());
        }
        let price = pricing.default_price;
        let row = PriceRow { gpu_model: model.to_string(), on_demand: price, reserved: price };
        outbox.changed = true;
        store.put_price(&row)?;
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

    /// The operator's prices for a model the caller knows.
    pub(super) fn set_price(
        &mut self,
        model: &str,
        update: &ebb_api::PriceUpdate,
        pricing: &Pricing,
        store: &mut impl Store,
        outbox: &mut Outbox,
    ) -> Result<ebb_api::Price, Fail> {
        let bps = pricing.discount_bps;
        let on_demand = crate::billing::parse_price("on_demand_usd", &update.on_demand_usd, bps)?;
        let reserved = match &update.reserved_usd {
            Some(text) => crate::billing::parse_price("reserved_usd", text, bps)?,
            None => self.prices.get(model).map_or(on_demand, |p| p.reserved),
        };
        let row = PriceRow { gpu_model: model.to_string(), on_demand, reserved };
        outbox.changed = true;
        store.put_price(&row)?;
        tracing::info!(gpu_model = model, on_demand = %crate::billing::usd(on_demand), "price set");
        self.prices.insert(model.to_string(), row.clone());
        Ok(crate::billing::price_view(&row, bps))
    }
}

impl<S: Store> Engine<S> {
    /// Each model's on-demand rate, as fair share weighs its GPU-hours
    /// (the price set for it, else the server's default).
    pub(super) fn rate_models(&mut self) {
        let rates: Vec<(ebb_core::GpuModelId, i64)> = self
            .core
            .models()
            .map(|(id, m)| {
                let rate =
                    self.money.prices.get(&m.name).map_or(self.config.pricing.default_price, |p| p.on_demand);
                (id, rate)
            })
            .collect();
        for (id, rate) in rates {
            self.core.set_model_rate(id, u64::try_from(rate).unwrap_or(0)).expect("a model the core knows");
        }
    }

    pub(super) fn known_model(&self, field: &str, model: &str) -> Result<(), Refusal> {
        if self.core.model_by_name(model).is_some() || self.money.prices.contains_key(model) {
            return Ok(());
        }
        let known: Vec<&str> = self.money.prices.keys().map(String::as_str).collect();
        Err(Refusal::unacceptable(format!(
            "{field}: unknown GPU model {model:?} (known: {})",
            if known.is_empty() { "none yet".to_string() } else { known.join(", ") }
        )))
    }

    pub(super) fn create_reservation(
        &mut self,
        req: &ebb_api::ReservationRequest,
        now: u64,
    ) -> Result<ebb_api::Reservation, Fail> {
        let tenant = self.tenant_by_name(&req.tenant)?;
        self.known_model("gpu_model", &req.gpu_model)?;
        let model = self.core.model_by_name(&req.gpu_model).ok_or_else(|| {
            Refusal::unacceptable(format!("gpu_model: no node of {} has joined yet", req.gpu_model))
        })?;
        let capacity = self.core.model(model).expect("known").capacity;
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
            .money
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
            Some(text) => crate::billing::parse_price("rate_usd", text, self.config.pricing.discount_bps)?,
            None => {
                let (money, store, outbox) = (&mut self.money, &mut self.store, &mut self.outbox);
                money.price_for(&req.gpu_model, &self.config.pricing, store, outbox)?.reserved
            }
        };
        let id = self.money.reservations.keys().max().map_or(1, |m| m + 1);
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
        self.core
            .add_reservation(self.core_reservation(&row)?)
            .map_err(|e| Refusal::invalid(e.to_string()))?;
        self.outbox.changed = true;
        self.store.put_reservation(&row)?;
        tracing::info!(reservation = id, tenant = req.tenant, gpus = req.gpus, "reservation created");
        self.money.reservations.insert(id, row.clone());
        Ok(crate::billing::reservation_view(&row, &req.tenant))
    }

    /// Deletes reservation `id` at `now` without touching what it has
    /// charged: invoices are computed from the reservation rows, so a row
    /// that has charged anything stays. One not started yet is withdrawn
    /// (removed: it never charged); one in force ends now (charged up to
    /// now, nothing after; refused while its reserved jobs run); one
    /// already over only leaves the list. The reply is the reservation as
    /// it is charged from now on (a withdrawn one ends where it starts).
    pub(super) fn delete_reservation(&mut self, id: u64, now: u64) -> Result<ebb_api::Reservation, Fail> {
        let row = self
            .money
            .reservations
            .get(&id)
            .filter(|r| r.deleted_ms.is_none())
            .cloned()
            .ok_or_else(|| Refusal::not_found(format!("reservation {id}: not found")))?;
        let in_force = row.start_ms <= now && now < row.end_ms;
        if in_force {
            let live: Vec<JobId> = self
                .jobs
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
        if let Err(e) = self.core.remove_reservation(ebb_core::ReservationId(id as u32)) {
            // It was not restored at start (logged then): nothing to take back.
            tracing::warn!(reservation = id, "not in the scheduler: {e}");
        }
        let tenant = self.tenant_name(row.tenant);
        if row.start_ms > now {
            self.outbox.changed = true;
            self.store.delete_reservation(id)?;
            self.money.reservations.remove(&id);
            tracing::info!(reservation = id, tenant, "reservation withdrawn before its start");
            let withdrawn = ReservationRow { end_ms: row.start_ms, ..row };
            return Ok(crate::billing::reservation_view(&withdrawn, &tenant));
        }
        let kept = ReservationRow { end_ms: row.end_ms.min(now), deleted_ms: Some(now), ..row };
        self.outbox.changed = true;
        self.store.put_reservation(&kept)?;
        tracing::info!(reservation = id, tenant, end = %rfc3339(kept.end_ms), "reservation deleted; its charges stay");
        self.money.reservations.insert(id, kept.clone());
        Ok(crate::billing::reservation_view(&kept, &tenant))
    }

    pub(super) fn bill(
        &mut self,
        principal: &Principal,
        tenant: Option<&str>,
        from: &str,
        to: &str,
    ) -> Result<ebb_api::Invoice, Fail> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        let tenant = match (tenant, &principal.tenant) {
            (Some(name), _) if principal.scope == crate::store::Scope::Admin => self.tenant_by_name(name)?,
            (Some(name), Some((id, own))) if name == own => *id,
            (Some(_), _) => return Err(Refusal::forbidden("only an operator may bill another tenant").into()),
            (None, Some((id, _))) => *id,
            (None, None) => {
                return Err(Refusal::unacceptable("tenant: required for this token".into()).into())
            }
        };
        let usage = self.store.usage(Some(tenant), from_ms, to_ms)?;
        let reservations: Vec<ReservationRow> =
            self.money.reservations.values().filter(|r| r.tenant == tenant).cloned().collect();
        Ok(crate::billing::invoice(&self.tenant_name(tenant), &usage, &reservations, from_ms, to_ms))
    }

    pub(super) fn report_for(
        &mut self,
        from: &str,
        to: &str,
        now: u64,
    ) -> Result<ebb_api::OperatorReport, Fail> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        Ok(crate::billing::report(&self.ledger(from_ms, now)?, from_ms, to_ms))
    }

    pub(super) fn report_series_for(
        &mut self,
        from: &str,
        to: &str,
        step: &str,
        now: u64,
    ) -> Result<ebb_api::ReportSeries, Fail> {
        let (from_ms, to_ms) = crate::billing::period(from, to)?;
        let step_ms = crate::billing::series_step(step, from_ms, to_ms)?;
        Ok(crate::billing::series(&self.ledger(from_ms, now)?, from_ms, to_ms, step_ms))
    }

    /// What the report of a period from `from_ms` is computed from.
    fn ledger(&mut self, from_ms: u64, now: u64) -> Result<crate::billing::Ledger, Fail> {
        // Attempts that started before the period and ended in or after it
        // count for the hours they ran inside it.
        let usage = self.store.usage(None, from_ms, u64::MAX)?;
        let live: Vec<crate::billing::Live> = self
            .jobs
            .values()
            .filter(|j| j.state.is_live())
            .filter_map(|j| {
                Some(crate::billing::Live {
                    tenant: j.tenant,
                    tier: j.tier.as_str().into(),
                    gpus: j.gpus,
                    started_ms: j.run_started_ms?,
                })
            })
            .collect();
        let nodes: Vec<(u64, u32)> =
            self.fleet.nodes.values().map(|n| (n.joined_ms, u32::from(n.gpus))).collect();
        let reservations: Vec<ReservationRow> = self.money.reservations.values().cloned().collect();
        let names = self.tenants.names.clone();
        Ok(crate::billing::Ledger { usage, live, reservations, nodes, now, names })
    }
}

/// An attempt's use, metered, counted in its tenant's fair share.
pub(super) fn fair_share_usage(core: &mut State, usage: &crate::billing::UsageRow, now: u64) {
    let (Some(model), Ok(tier)) = (core.model_by_name(&usage.gpu_model), usage.tier.parse::<Tier>()) else {
        return;
    };
    let span = (Time(usage.started_ms), Time(usage.ended_ms));
    let _ = core.record_usage(usage.tenant, tier, model, usage.gpus, span, Time(now));
}
