//! What a finished replay reports: the summary, its series by hour, and
//! each tenant's figures.

use super::*;

impl Engine<'_> {
    pub(super) fn finish(self, traces: &[Trace], unschedulable: u64) -> SimOutput {
        let config = self.config;
        let book = PriceBook {
            on_demand_per_gpu_hour: config.on_demand_price,
            reserved_per_gpu_hour: config.reserved_price,
            preemptible_discount_bps: config.preemptible_discount_bps,
        };
        let end = self.jobs.iter().filter_map(|j| j.done_at).max().unwrap_or(self.origin);
        let makespan = end.saturating_since(self.origin).0;
        let capacity_ms = self.capacity as u128 * makespan as u128;
        let ratio = |x: u128| if capacity_ms == 0 { 0.0 } else { round(x as f64 / capacity_ms as f64, 6) };
        let hours = |gpu_ms: u128| round(gpu_ms as f64 / HOUR_MS as f64, 3);
        let busy_total: u128 = self.busy.iter().sum();
        let rates = [config.reserved_price, book.on_demand_per_gpu_hour, book.preemptible_per_gpu_hour()];
        let reserved_ms = config.reserved_gpus as u128 * makespan as u128;
        let revenue = [
            MicroUsd::for_gpu_millis(rates[0], reserved_ms),
            MicroUsd::for_gpu_millis(rates[1], self.busy[1]),
            MicroUsd::for_gpu_millis(rates[2], self.busy[2]),
        ];
        let per_tier = |f: &dyn Fn(&SimJob) -> bool| {
            let mut counts = [0u64; 3];
            for job in self.jobs.iter().filter(|j| f(j)) {
                counts[job.tier.rank() as usize] += 1;
            }
            TierFigures::from_array(counts)
        };
        let waits = |tier: Tier| {
            Percentiles::of(
                self.jobs
                    .iter()
                    .filter(|j| j.tier == tier)
                    .filter_map(|j| j.first_start.map(|s| s.saturating_since(j.submit).as_secs_f64()))
                    .collect(),
            )
        };
        let slowdown = Percentiles::of(
            self.jobs
                .iter()
                .filter(|j| j.tier == Tier::Preemptible && j.duration > 0)
                .filter_map(|j| j.done_at.map(|d| d.saturating_since(j.submit).0 as f64 / j.duration as f64))
                .collect(),
        );
        let multi_node = self.multi_node_figures(&hours);
        let summary = Summary {
            jobs: self.jobs.len() as u64 + unschedulable,
            completed: self.jobs.iter().filter(|j| j.done_at.is_some()).count() as u64,
            unschedulable,
            makespan_s: round(makespan as f64 / 1000.0, 3),
            gpu_utilization: ratio(busy_total),
            utilization_by_tier: TierFigures::from_array(self.busy.map(ratio)),
            preemptions: self.preemptions,
            jobs_preempted: self.jobs.iter().filter(|j| j.preemptions > 0).count() as u64,
            jobs_preempted_repeatedly: self.jobs.iter().filter(|j| j.preemptions > 1).count() as u64,
            repeat_preemptions: self.repeat_preemptions,
            quick_repeat_preemptions: self.quick_repeat_preemptions,
            max_preemptions_of_a_job: self.jobs.iter().map(|j| j.preemptions).max().unwrap_or(0),
            lost_gpu_hours: hours(self.lost),
            drain_gpu_hours: hours(self.drain),
            restart_gpu_hours: hours(self.restart),
            idle_gpu_hours: hours(capacity_ms.saturating_sub(busy_total)),
            busy_gpu_hours: TierFigures::from_array(self.busy.map(hours)),
            on_demand_wait_s: waits(Tier::OnDemand),
            preemptible_wait_s: waits(Tier::Preemptible),
            preemptible_slowdown: Percentiles {
                p50: round(slowdown.p50, 4),
                p99: round(slowdown.p99, 4),
                max: round(slowdown.max, 4),
                mean: round(slowdown.mean, 4),
            },
            revenue_usd: TierFigures::from_array(revenue.map(|m| round(m.as_usd_f64(), 2))),
            revenue_micro_usd: TierFigures::from_array(revenue.map(|m| m.0)),
            multi_node,
            tenants: self.tenant_figures(&hours),
            jain_index: self.jain_index(),
            busy_hours: self.busy_hours.iter().filter(|b| **b).count() as u64,
            jobs_by_tier: per_tier(&|_| true),
            completed_by_tier: per_tier(&|j| j.done_at.is_some()),
            deadlines: config.deadline_slack.map(|slack| {
                let with: Vec<&SimJob> = self.jobs.iter().filter(|j| j.deadline.is_some()).collect();
                let met =
                    with.iter().filter(|j| j.done_at.is_some_and(|d| Some(d) <= j.deadline)).count() as u64;
                let cost: i64 = with.iter().map(|j| j.cost).sum();
                let gpu_ms: u128 = with.iter().map(|j| j.gpus as u128 * j.duration as u128).sum();
                let on_demand = MicroUsd::for_gpu_millis(rates[1], gpu_ms);
                DeadlineFigures {
                    slack,
                    policy: match config.deadline_policy {
                        DeadlinePolicy::OnDemand => "on-demand",
                        DeadlinePolicy::Preemptible => "preemptible",
                        DeadlinePolicy::Promote => "promote",
                    }
                    .into(),
                    jobs: with.len() as u64,
                    met,
                    missed: with.len() as u64 - met,
                    promoted: with.iter().filter(|j| j.promoted).count() as u64,
                    cost_usd: round(MicroUsd(cost).as_usd_f64(), 2),
                    cost_micro_usd: cost,
                    on_demand_cost_usd: round(on_demand.as_usd_f64(), 2),
                }
            }),
            window: config.window_until.map(|until| {
                let length = Time::from_secs(until).saturating_since(self.origin).0 as u128;
                let capacity_ms = self.capacity as u128 * length;
                let ratio =
                    |x: u128| if capacity_ms == 0 { 0.0 } else { round(x as f64 / capacity_ms as f64, 6) };
                let busy: u128 = self.busy_in_window.iter().sum();
                let revenue = [
                    MicroUsd::for_gpu_millis(rates[0], config.reserved_gpus as u128 * length),
                    MicroUsd::for_gpu_millis(rates[1], self.busy_in_window[1]),
                    MicroUsd::for_gpu_millis(rates[2], self.busy_in_window[2]),
                ];
                Window {
                    until_s: until as f64,
                    gpu_utilization: ratio(busy),
                    utilization_by_tier: TierFigures::from_array(self.busy_in_window.map(ratio)),
                    idle_gpu_hours: hours(capacity_ms.saturating_sub(busy)),
                    revenue_usd: TierFigures::from_array(revenue.map(|m| round(m.as_usd_f64(), 2))),
                }
            }),
            config: ConfigEcho {
                traces: traces
                    .iter()
                    .map(|t| match (&t.tenant, t.tier) {
                        (Some(o), Some(tier)) => format!("{}={}:{}:{tier}", o.name, t.name, o.weight),
                        (Some(o), None) => format!("{}={}:{}", o.name, t.name, o.weight),
                        (None, Some(tier)) => format!("{tier}={}", t.name),
                        (None, None) => t.name.clone(),
                    })
                    .collect(),
                order: match config.order {
                    ebb_scheduler::Order::FairShare => "fair-share",
                    ebb_scheduler::Order::Fifo => "fifo",
                },
                fair_share_half_life_s: config.fair_share_half_life.as_secs_f64(),
                fair_share_preemption_percent: config.fair_share_preemption,
                nodes: config.nodes,
                gpus_per_node: config.gpus_per_node,
                gpu_model: config.gpu_model.clone(),
                preemptible_fraction: config.preemptible_fraction,
                drain_window_s: config.drain_window.as_secs_f64(),
                notice: match config.notice {
                    NoticeMode::Drain => "drain",
                    NoticeMode::None => "none",
                },
                checkpoint_interval_s: config.checkpoint_interval.map(Span::as_secs_f64),
                drain_checkpoint_s: config.drain_checkpoint.map(Span::as_secs_f64),
                restart_overhead_s: config.restart_overhead.as_secs_f64(),
                elastic: config.elastic,
                victim_policy: policy_name(config.victim_policy),
                min_runtime_s: config.min_runtime.as_secs_f64(),
                on_demand_price_usd_per_gpu_hour: book.on_demand_per_gpu_hour.as_usd_f64(),
                preemptible_price_usd_per_gpu_hour: book.preemptible_per_gpu_hour().as_usd_f64(),
                reserved_gpus: config.reserved_gpus,
            },
        };
        let n_hours = (makespan / HOUR_MS) as usize + 1;
        let mut series = Series::default();
        let mut cumulative = [0u128; 3];
        for h in 0..n_hours {
            let busy = self.busy_by_hour.get(h).copied().unwrap_or([0; 3]);
            series.busy_gpus.push(busy.map(|ms| round(ms as f64 / HOUR_MS as f64, 3)));
            series.queued.push(self.queued_by_hour.get(h).copied().unwrap_or([0; 3]));
            series.preemptions.push(self.preemptions_by_hour.get(h).copied().unwrap_or(0));
            cumulative[0] += config.reserved_gpus as u128 * HOUR_MS as u128;
            cumulative[1] += busy[1];
            cumulative[2] += busy[2];
            series
                .revenue_usd
                .push([0, 1, 2].map(|t| MicroUsd::for_gpu_millis(rates[t], cumulative[t]).as_usd_f64()));
        }
        SimOutput { summary, series, capacity_gpus: self.capacity }
    }

    /// Preemptible jobs over more than one node, apart.
    pub(super) fn multi_node_figures(&self, hours: &dyn Fn(u128) -> f64) -> crate::MultiNodeFigures {
        let per_node = self.config.gpus_per_node as u32;
        let jobs: Vec<&SimJob> = self
            .jobs
            .iter()
            .filter(|j| j.gpus > per_node && (j.tier == Tier::Preemptible || j.min_gpus.is_some()))
            .collect();
        let slowdown = Percentiles::of(
            jobs.iter()
                .filter(|j| j.duration > 0)
                .filter_map(|j| j.done_at.map(|d| d.saturating_since(j.submit).0 as f64 / j.duration as f64))
                .collect(),
        );
        crate::MultiNodeFigures {
            jobs: jobs.len() as u64,
            completed: jobs.iter().filter(|j| j.done_at.is_some()).count() as u64,
            elastic: jobs.iter().filter(|j| j.min_gpus.is_some()).count() as u64,
            slowdown: Percentiles {
                p50: round(slowdown.p50, 4),
                p99: round(slowdown.p99, 4),
                max: round(slowdown.max, 4),
                mean: round(slowdown.mean, 4),
            },
            wait_s: Percentiles::of(
                jobs.iter()
                    .filter_map(|j| j.first_start.map(|s| s.saturating_since(j.submit).as_secs_f64()))
                    .collect(),
            ),
            preemptions: jobs.iter().map(|j| j.preemptions as u64).sum(),
            lost_gpu_hours: hours(jobs.iter().map(|j| j.lost).sum()),
            shrinks: jobs.iter().map(|j| j.shrinks as u64).sum(),
            grows: jobs.iter().map(|j| j.grows as u64).sum(),
        }
    }

    pub(super) fn tenant_figures(
        &self,
        hours: &dyn Fn(u128) -> f64,
    ) -> BTreeMap<String, crate::TenantFigures> {
        let all: u128 = self.owners.iter().map(|o| o.busy).sum();
        let weights: u64 = self.owners.iter().map(|o| o.weight as u64).sum();
        self.owners
            .iter()
            .enumerate()
            .map(|(k, o)| {
                let waits = self
                    .jobs
                    .iter()
                    .filter(|j| j.owner == k)
                    .filter_map(|j| j.first_start.map(|s| s.saturating_since(j.submit).as_secs_f64()))
                    .collect();
                let figures = crate::TenantFigures {
                    weight: o.weight,
                    weight_share: round(o.weight as f64 / weights as f64, 4),
                    gpu_hours: hours(o.busy),
                    share: if all == 0 { 0.0 } else { round(o.busy as f64 / all as f64, 4) },
                    wait_s: Percentiles::of(waits),
                    preemptions: o.preemptions,
                    lost_gpu_hours: hours(o.lost),
                };
                (o.name.clone(), figures)
            })
            .collect()
    }

    /// Jain's index of GPU-time over weight, summed over busy hours.
    pub(super) fn jain_index(&self) -> Option<f64> {
        if self.owners.len() < 2 {
            return None;
        }
        let busy: Vec<usize> = (0..self.busy_hours.len()).filter(|&h| self.busy_hours[h]).collect();
        if busy.is_empty() {
            return None;
        }
        let x: Vec<f64> = self
            .owners
            .iter()
            .map(|o| {
                let used: u128 = busy.iter().map(|&h| o.busy_by_hour.get(h).copied().unwrap_or(0)).sum();
                used as f64 / o.weight as f64
            })
            .collect();
        let sum: f64 = x.iter().sum();
        let squares: f64 = x.iter().map(|v| v * v).sum();
        (squares > 0.0).then(|| round(sum * sum / (x.len() as f64 * squares), 4))
    }
}
