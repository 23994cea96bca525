//! Plan effects: what a scheduling pass decided, made into records, events and commands.

use super::*;

impl<S: Store> Engine<S> {
    /// Plans and applies until the core has nothing more to do.
    pub(super) fn schedule(&mut self, now: u64) {
        self.end_backoffs(now);
        for _ in 0..1000 {
            let started = std::time::Instant::now();
            let plan = ebb_scheduler::schedule(&self.core, Time(now), &self.sched);
            if plan.is_empty() {
                return;
            }
            if let Err(e) = self.core.apply(&plan) {
                tracing::error!("plan refused: {e}");
                return;
            }
            self.counters.passes += 1;
            self.counters.pass_seconds += started.elapsed().as_secs_f64();
            for &node in &plan.lost_nodes {
                let name = self.core.node(node).expect("known").name.clone();
                let requeued: Vec<u64> = plan
                    .requeues
                    .iter()
                    .filter(|r| matches!(r.reason, ebb_scheduler::RequeueReason::NodeLost(n) if n == node))
                    .map(|r| r.job.0)
                    .collect();
                self.node_gone(&name, &requeued, "no heartbeat within the timeout", now);
            }
            for d in &plan.drains {
                let id = d.job.0;
                let (reason, detail) = match d.reason {
                    DrainReason::Preempted { by } => {
                        (format!("preempted by job {}", by.0), json!({ "by": by.0 }))
                    }
                    DrainReason::NodeDrain { node } => {
                        let name = self.core.node(node).expect("known").name.clone();
                        (format!("node {name} drained by the operator"), json!({ "node": name }))
                    }
                    DrainReason::Reclaim => {
                        ("preemptible capacity reclaimed by the operator".into(), json!({}))
                    }
                };
                let job = self.jobs.get_mut(&id).expect("known job");
                job.state = JobState::Draining;
                job.notice = Some((d.notice_at.0, d.deadline.0, reason.clone()));
                let attempt = AttemptRef { job: id, attempt: d.attempt.0 };
                let drain = DrainAttempt {
                    attempt,
                    notice_at_ms: d.notice_at.0,
                    deadline_ms: d.deadline.0,
                    reason: reason.clone(),
                };
                for node in job.running_on.clone() {
                    self.push(&node, Action::Drain(drain.clone()));
                }
                self.event(
                    id,
                    "drain_notice",
                    json!({ "reason": reason, "notice_at": rfc3339(d.notice_at.0), "deadline": rfc3339(d.deadline.0), "detail": detail }),
                );
                self.save(id);
            }
            for p in &plan.preemptions {
                let victims: Vec<u64> = p.victims.iter().map(|v| v.0).collect();
                let held = self.named(&p.hold);
                let job = self.jobs.get_mut(&p.preemptor.0).expect("known job");
                job.held = held;
                job.waiting_for = victims.clone();
                self.save(p.preemptor.0);
                let lost = p.lost_gpu_ms as f64 / 1000.0;
                self.event(
                    p.preemptor.0,
                    "preempting",
                    json!({ "victims": victims, "lost_gpu_seconds": lost }),
                );
            }
            for p in &plan.placements {
                let id = p.job.0;
                let placement = self.named(&p.alloc);
                let recommendation = self.recommend(id, &placement, now);
                let rendezvous = (placement.len() > 1).then(|| self.rendezvous(&placement[0].0));
                let model = self.nodes[&placement[0].0].gpu_model.clone();
                let price = self.price_for(&model);
                let tier = self.jobs[&id].tier;
                let rate = match tier {
                    Tier::OnDemand => price.on_demand,
                    Tier::Preemptible => {
                        crate::billing::preemptible_rate(price.on_demand, self.config.pricing.discount_bps)
                    }
                    Tier::Reserved => 0,
                };
                let job = self.jobs.get_mut(&id).expect("known job");
                job.billing = Some((model, rate, price.on_demand));
                job.interval = Some((recommendation.interval.as_secs(), recommendation.to_string()));
                job.rendezvous = rendezvous.clone();
                job.run_started_ms = None;
                job.started_on.clear();
                job.attempt_checkpoint_ms = None;
                job.exited_ms = 0;
                job.state = JobState::Starting;
                job.attempt = p.attempt.0;
                job.placement = placement.clone();
                job.running_on = placement.iter().map(|(n, _)| n.clone()).collect();
                job.started_ms = now;
                job.notice = None;
                job.held.clear();
                job.waiting_for.clear();
                job.exit_code = None;
                job.exit_signal = None;
                let interval = recommendation.interval.as_secs().to_string();
                let nodes = placement.len();
                let tenant = self.tenants.get(&job.tenant).cloned().unwrap_or_default();
                let run_as = self.config.run_as.user(&tenant).to_string();
                let start = |rank: usize, gpus: &Vec<u8>, job: &JobRecord| {
                    let mut env = job.spec.env.clone();
                    env.insert("EBB_CHECKPOINT_INTERVAL_S".into(), interval.clone());
                    if let Some((addr, port)) = &job.rendezvous {
                        env.extend(gang_env(addr, *port, rank, nodes, gpus.len(), job.gpus));
                    }
                    StartAttempt {
                        attempt: AttemptRef { job: id, attempt: p.attempt.0 },
                        tier: job.tier.as_str().into(),
                        argv: job.spec.argv.clone(),
                        env,
                        workdir: job.spec.workdir.clone(),
                        gpus: gpus.clone(),
                        signal: job.signal,
                        run_as: Some(run_as.clone()),
                        tenant: tenant.clone(),
                    }
                };
                let starts: Vec<(String, StartAttempt)> = placement
                    .iter()
                    .enumerate()
                    .map(|(rank, (node, gpus))| (node.clone(), start(rank, gpus, job)))
                    .collect();
                for (node, start) in starts {
                    self.push(&node, Action::Start(start));
                }
                let shown: Vec<serde_json::Value> =
                    placement.iter().map(|(n, g)| json!({ "node": n, "gpus": g })).collect();
                let interval = json!({ "seconds": recommendation.interval.as_secs(), "why": recommendation.to_string() });
                self.event(
                    id,
                    "placed",
                    json!({ "placement": shown, "from_hold": p.from_hold, "checkpoint_interval": interval }),
                );
                self.save(id);
            }
        }
        tracing::error!("the scheduler did not settle in 1000 passes");
    }
}
