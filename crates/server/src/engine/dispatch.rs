//! Message dispatch: each message to the handler that owns it. Every
//! reply, reads included, leaves after the batch commits; a store failure
//! in any handler abandons the whole batch.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn handle(&mut self, msg: Msg, now: u64) -> Written {
        match msg {
            msg @ (Msg::Submit { .. }
            | Msg::SubmitBatch { .. }
            | Msg::Jobs { .. }
            | Msg::Job { .. }
            | Msg::Cancel { .. }
            | Msg::Signal { .. }
            | Msg::Steps { .. }
            | Msg::StepImage { .. }
            | Msg::PinStepImage { .. }
            | Msg::Drill { .. }
            | Msg::LogFile { .. }
            | Msg::Capacity { .. }
            | Msg::Partitions { .. }) => self.on_jobs(msg, now),
            msg @ (Msg::Nodes { .. }
            | Msg::DrainNode { .. }
            | Msg::Reclaim { .. }
            | Msg::ReleaseReclaim { .. }
            | Msg::UndrainNode { .. }
            | Msg::Register { .. }
            | Msg::Poll { .. }
            | Msg::Report { .. }
            | Msg::RemoveNode { .. }
            | Msg::RotateJoinToken { .. }
            | Msg::Metrics { .. }) => self.on_fleet(msg, now),
            msg @ (Msg::CreateTenant { .. }
            | Msg::Tenants { .. }
            | Msg::TenantLimits { .. }
            | Msg::RegistryLogins { .. }
            | Msg::RegistryLoginFor { .. }
            | Msg::TenantTokens { .. }
            | Msg::CreateWebhook { .. }
            | Msg::Webhooks { .. }
            | Msg::DeleteWebhook { .. }
            | Msg::WebhookLog { .. }
            | Msg::WebhookTried { .. }) => self.on_tenants(msg, now),
            msg @ (Msg::Prices { .. }
            | Msg::SetPrice { .. }
            | Msg::CreateReservation { .. }
            | Msg::Reservations { .. }
            | Msg::DeleteReservation { .. }
            | Msg::Bill { .. }
            | Msg::OperatorReport { .. }
            | Msg::OperatorReportSeries { .. }) => self.on_money(msg),
            Msg::Tick => {
                self.hear_lines()?;
                let Parts { fleet, mut fx, .. } = self.parts();
                agents::write_contacts(fleet, &mut fx)
            }
        }
    }

    /// Jobs: submission, the queue, one job's view, log and actions.
    fn on_jobs(&mut self, msg: Msg, now: u64) -> Written {
        match msg {
            Msg::Submit { principal, spec, reply } => {
                let result = jobs::submit(&mut self.parts(), &principal, *spec);
                self.answer(reply, result)?;
            }
            Msg::SubmitBatch { principal, specs, reply } => {
                let result = jobs::submit_all(&mut self.parts(), &principal, specs);
                self.answer(reply, result)?;
            }
            Msg::Jobs { principal, query, reply } => {
                let page = self.job_page(&principal, &query);
                self.answer(reply, page)?;
            }
            Msg::Job { principal, id, reply } => {
                let result = self.job_view(&principal, id);
                self.answer(reply, result)?;
            }
            Msg::Cancel { principal, id, req, reply } => {
                let result = self.visible(&principal, id).and_then(|()| self.cancel(id, &req));
                self.answer(reply, result)?;
            }
            Msg::Signal { principal, id, signal, to, reply } => {
                let result = self.visible(&principal, id).and_then(|()| self.signal(id, signal, to));
                self.answer(reply, result)?;
            }
            Msg::Steps { principal, id, reply } => {
                let result = self.visible(&principal, id).and_then(|()| self.step_access(&principal, id));
                self.answer(reply, result)?;
            }
            Msg::StepImage { node, attempt, registry, reference, reply } => {
                let result = self.step_image(&node, attempt, &registry, &reference);
                self.answer(reply, result)?;
            }
            Msg::PinStepImage { attempt, reference, digest, reply } => {
                let pinned = self.pin_step_image(attempt, reference, digest);
                self.outbox.reply(reply, pinned);
            }
            Msg::Drill { principal, id, reply } => {
                let result = self.drill(&principal, id);
                self.answer(reply, result)?;
            }
            Msg::LogFile { principal, id, offset, sources, reply } => {
                let result = match self.visible(&principal, id) {
                    Ok(()) => Ok(self.log_file(id, offset, sources)?),
                    Err(e) => Err(e),
                };
                self.answer(reply, result)?;
            }
            Msg::Capacity { principal, reply } => {
                let capacity = self.capacity(&principal, now);
                self.outbox.reply(reply, capacity);
            }
            Msg::Partitions { reply } => {
                let partitions = self.config.partitions.list();
                self.outbox.reply(reply, partitions);
            }
            _ => unreachable!("dispatched by handle"),
        }
        Ok(())
    }

    /// Nodes: the agent protocol, and the operator's actions on nodes.
    fn on_fleet(&mut self, msg: Msg, now: u64) -> Written {
        match msg {
            Msg::Nodes { reply } => {
                let views = self.fleet.nodes.keys().map(|n| self.node_view(n)).collect();
                self.outbox.reply(reply, views);
            }
            Msg::DrainNode { name, reply } => {
                let result = self.drain_node(&name);
                self.answer(reply, result)?;
            }
            Msg::Reclaim { req, reply } => {
                let Parts { core, mut fx, .. } = self.parts();
                let result = fleet::reclaim(core, &mut fx, req);
                self.answer(reply, result)?;
            }
            Msg::ReleaseReclaim { req, reply } => {
                let Parts { core, mut fx, .. } = self.parts();
                let result = fleet::release_reclaim(core, &mut fx, req);
                self.answer(reply, result)?;
            }
            Msg::UndrainNode { name, gpu, reply } => {
                let result = health::undrain(&mut self.parts(), &name, gpu).map(|()| self.node_view(&name));
                self.answer(reply, result)?;
            }
            Msg::Register { principal, reg, reply } => {
                let result = self.register(&principal, reg, now);
                self.answer(reply, result)?;
            }
            Msg::Poll { node, epoch, after, health, reply } => {
                // After the commit, like every command: an agent never acts
                // on something the store does not say yet.
                let result = self.poll(&node, epoch, after, health, now);
                self.answer(reply, result)?;
            }
            Msg::Report { report, reply } => {
                let result = self.report(report, now);
                self.answer(reply, result)?;
            }
            Msg::RemoveNode { name, reply } => {
                let lines = self.lines.clone();
                let result = fleet::remove_node(&mut self.parts(), &lines, &name);
                self.answer(reply, result)?;
            }
            Msg::RotateJoinToken { reply } => {
                let p = &mut self.parts();
                let result = p.access.rotate_join_token(&p.config.data_dir, &mut p.fx);
                self.answer(reply, result)?;
            }
            Msg::Metrics { reply } => {
                let snapshot = self.metrics_snapshot();
                self.outbox.reply(reply, snapshot);
            }
            _ => unreachable!("dispatched by handle"),
        }
        Ok(())
    }

    /// Tenants: their limits, tokens, registry logins and webhooks.
    fn on_tenants(&mut self, msg: Msg, now: u64) -> Written {
        match msg {
            Msg::CreateTenant { name, reply } => {
                let result = self.tenants.add(&mut self.store, &name).and_then(|id| {
                    self.outbox.changed = true;
                    let p = &mut self.parts();
                    let token = p.access.grant(&mut p.fx, Principal::tenant(Scope::Tenant, id, &name))?;
                    Ok(ebb_api::TenantCreated { tenant: name, token })
                });
                self.answer(reply, result)?;
            }
            Msg::Tenants { reply } => {
                let list = self.tenant_list(now);
                self.outbox.reply(reply, list);
            }
            Msg::TenantLimits { principal, tenant, set, reply } => {
                let result = tenants::tenant_limits(&mut self.parts(), &principal, &tenant, set);
                self.answer(reply, result)?;
            }
            Msg::RegistryLogins { principal, tenant, set, reply } => {
                let (store, key) = (&mut self.store, &self.config.secret_key);
                let result = self.tenants.registry_logins(store, key, &principal, &tenant, set);
                self.answer(reply, result)?;
            }
            Msg::RegistryLoginFor { tenant, registry, reply } => {
                let login = self.tenants.logins.get(&tenant).and_then(|l| l.get(&registry)).cloned();
                self.outbox.reply(reply, login);
            }
            Msg::TenantTokens { name, issue, reply } => {
                let p = &mut self.parts();
                let result = p.access.tenant_tokens(p.tenants, &mut p.fx, &name, issue);
                self.answer(reply, result)?;
            }
            Msg::CreateWebhook { principal, req, reply } => {
                let (tenants, config) = (&self.tenants, &self.config);
                let result = self.webhooks.create((tenants, config), &mut self.store, &principal, req, now);
                self.answer(reply, result)?;
            }
            Msg::Webhooks { principal, tenant, reply } => {
                let result = self.webhooks.list(&self.tenants, &principal, tenant);
                self.answer(reply, result)?;
            }
            Msg::DeleteWebhook { principal, id, reply } => {
                let to = (&mut self.store, &mut self.outbox);
                let result = self.webhooks.delete(&self.tenants, to, &principal, id);
                self.answer(reply, result)?;
            }
            Msg::WebhookLog { principal, id, reply } => {
                let result = self.webhooks.log(&self.tenants, &mut self.store, &principal, id);
                self.answer(reply, result)?;
            }
            Msg::WebhookTried { delivery, attempt, tried, at_ms } => {
                self.webhooks.tried(&mut self.store, (delivery, attempt), tried, at_ms)?;
            }
            _ => unreachable!("dispatched by handle"),
        }
        Ok(())
    }

    /// Money: prices, reservations, bills and the operator's reports.
    fn on_money(&mut self, msg: Msg) -> Written {
        match msg {
            Msg::Prices { reply } => {
                let book = self.money.price_book(&self.config.pricing);
                self.outbox.reply(reply, book);
            }
            Msg::SetPrice { model, update, reply } => {
                let p = &mut self.parts();
                let result = p.money.set_price(p.core, &model, &update, &p.config.pricing, &mut p.fx);
                p.money.rate_models(p.core, &p.config.pricing);
                self.answer(reply, result)?;
            }
            Msg::CreateReservation { req, reply } => {
                let p = &mut self.parts();
                let result =
                    p.money.create_reservation(p.core, p.tenants, &p.config.pricing, &mut p.fx, &req);
                self.answer(reply, result)?;
            }
            Msg::Reservations { principal, reply } => {
                let list = self.reservation_views(&principal);
                self.outbox.reply(reply, list);
            }
            Msg::DeleteReservation { id, reply } => {
                let p = &mut self.parts();
                let result = p.money.delete_reservation(p.core, p.jobs, p.tenants, &mut p.fx, id);
                self.answer(reply, result)?;
            }
            Msg::Bill { principal, tenant, from, to, reply } => {
                let p = &mut self.parts();
                let result = p.money.bill(p.tenants, &mut p.fx, &principal, tenant.as_deref(), (&from, &to));
                self.answer(reply, result)?;
            }
            Msg::OperatorReport { from, to, reply } => {
                let result = money::report(&mut self.parts(), &from, &to);
                self.answer(reply, result)?;
            }
            Msg::OperatorReportSeries { from, to, step, reply } => {
                let result = money::report_series(&mut self.parts(), (&from, &to), &step);
                self.answer(reply, result)?;
            }
            _ => unreachable!("dispatched by handle"),
        }
        Ok(())
    }

    /// Up to 1 MiB of a job's committed log from `offset`: from the store,
    /// or the path of a log that is a file; with the attempts each piece
    /// came from when `sources`.
    fn log_file(&mut self, id: JobId, offset: u64, sources: bool) -> Written<LogFile> {
        let state = self.log_state(id)?;
        let committed = state.bytes;
        let to = committed.min(offset.saturating_add(1 << 20));
        let stored = match state.file {
            false if offset < committed => Some(self.store.output(id, offset, to)?),
            false => Some(Vec::new()),
            true => None,
        };
        let sources = match sources && !state.file && offset < committed {
            true => self.store.output_sources(id, offset, to)?,
            false => Vec::new(),
        };
        let finished = self.jobs[&id].state.is_final();
        let removed_ms = match finished && committed == 0 {
            true => self.store.output_removed(id)?,
            false => None,
        };
        Ok(LogFile { path: self.log_path(id), committed, stored, finished, sources, removed_ms })
    }
}
