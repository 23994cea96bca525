//! Message dispatch: each message to the handler that owns it, its reply held until the commit.

use super::*;

impl<S: Store> Engine<S> {
    pub(super) fn handle(&mut self, msg: Msg, now: u64) {
        match msg {
            Msg::Submit { principal, spec, reply } => {
                let result = self.submit(&principal, spec, now);
                self.reply(reply, result);
            }
            Msg::Jobs { principal, after, limit, reply } => {
                let mut visible = self
                    .jobs
                    .range(after.saturating_add(1)..)
                    .map(|(_, j)| j)
                    .filter(|j| principal.may_see(j.tenant));
                let jobs: Vec<ebb_api::Job> =
                    visible.by_ref().take(limit).map(|j| self.view(j, Vec::new())).collect();
                let next_cursor = match visible.next() {
                    Some(_) => jobs.last().map(|j| j.id),
                    None => None,
                };
                let _ = reply.send(ebb_api::JobPage { jobs, next_cursor });
            }
            Msg::Job { principal, id, reply } => {
                let result = self.visible(&principal, id).and_then(|()| {
                    let events = self.store.events(id).map_err(storage_error)?;
                    let usage = self.store.job_usage(id).map_err(storage_error)?;
                    let mut view = self.view(&self.jobs[&id], events);
                    view.progress = self.jobs[&id].array.as_ref().map(|a| self.progress(a.id));
                    view.usage = usage.iter().map(|u| u.view(&view.tenant)).collect();
                    Ok(view)
                });
                let _ = reply.send(result);
            }
            Msg::Cancel { principal, id, reply } => {
                let result = self.visible(&principal, id).and_then(|()| self.cancel(id, now));
                self.reply(reply, result);
            }
            Msg::LogFile { principal, id, reply } => {
                let result = self
                    .visible(&principal, id)
                    .map(|()| (self.log_path(id), self.jobs[&id].state.is_final()));
                let _ = reply.send(result);
            }
            Msg::Nodes { reply } => {
                let nodes = self.nodes.keys().cloned().collect::<Vec<_>>();
                let views = nodes.iter().map(|n| self.node_view(n)).collect();
                let _ = reply.send(views);
            }
            Msg::DrainNode { name, reply } => {
                let result = self.drain_node(&name);
                self.reply(reply, result);
            }
            Msg::Reclaim { req, reply } => {
                let result = self.reclaim(req);
                self.reply(reply, result);
            }
            Msg::CreateTenant { name, reply } => {
                let result = self.create_tenant(name);
                self.reply(reply, result);
            }
            Msg::TenantLimits { principal, tenant, set, reply } => {
                let result = self.tenant_limits(&principal, &tenant, set);
                self.reply(reply, result);
            }
            Msg::Register { principal, reg, reply } => {
                let result = self.register(&principal, reg, now);
                self.reply(reply, result);
            }
            Msg::Poll { node, epoch, after, health, reply } => {
                // After the commit, like every command: an agent never acts
                // on something the store does not say yet.
                let result = self.poll(&node, epoch, after, health, now);
                self.reply(reply, result);
            }
            Msg::Report { report, reply } => {
                let result = self.report(report, now);
                self.reply(reply, result);
            }
            Msg::Metrics { reply } => {
                let _ = reply.send(self.metrics_snapshot());
            }
            Msg::RemoveNode { name, reply } => {
                let result = self.remove_node(&name, now);
                self.reply(reply, result);
            }
            Msg::RotateJoinToken { reply } => {
                let result = self.rotate_join_token();
                self.reply(reply, result);
            }
            Msg::TenantTokens { name, issue, reply } => {
                let result = self.tenant_tokens(&name, issue);
                self.reply(reply, result);
            }
            Msg::Prices { reply } => {
                let _ = reply.send(self.price_book());
            }
            Msg::SetPrice { model, update, reply } => {
                let result = self.set_price(&model, &update);
                self.reply(reply, result);
            }
            Msg::CreateReservation { req, reply } => {
                let result = self.create_reservation(&req);
                self.reply(reply, result);
            }
            Msg::Reservations { principal, reply } => {
                let list = self
                    .reservations
                    .values()
                    .filter(|r| principal.may_see(r.tenant))
                    .map(|r| crate::billing::reservation_view(r, &self.tenant_name(r.tenant)))
                    .collect();
                let _ = reply.send(list);
            }
            Msg::DeleteReservation { id, reply } => {
                let result = self.delete_reservation(id);
                self.reply(reply, result);
            }
            Msg::Bill { principal, tenant, from, to, reply } => {
                let _ = reply.send(self.bill(&principal, tenant.as_deref(), &from, &to));
            }
            Msg::OperatorReport { from, to, reply } => {
                let _ = reply.send(self.report_for(&from, &to, now));
            }
            Msg::Tick => {}
        }
    }
}
