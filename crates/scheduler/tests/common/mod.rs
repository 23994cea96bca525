//! A small harness: a cluster, a clock, and one step = schedule + apply +
//! sanity check.

#![allow(dead_code)]

use std::collections::BTreeMap;

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, Span, TenantId, Tier, Time};
use ebb_scheduler::*;

pub struct Cluster {
    pub state: State,
    pub config: Config,
    pub now: Time,
    /// The next job's id: a restored core's harness starts past those it
    /// was given.
    pub next_job: u64,
    pub plans: Vec<Plan>,
}

impl Cluster {
    pub fn new(nodes: u32, gpus_per_node: u8) -> Cluster {
        let mut state = State::new();
        for i in 0..nodes {
            state
                .add_node(
                    NodeSpec {
                        name: format!("node-{i}"),
                        gpu_model: "H100".into(),
                        gpus: gpus_per_node,
                        labels: BTreeMap::new(),
                    },
                    Time::ZERO,
                )
                .unwrap();
        }
        Cluster {
            state,
            config: Config { drain_window: Span::from_secs(300), ..Config::default() },
            now: Time::ZERO,
            next_job: 1,
            plans: Vec::new(),
        }
    }

    pub fn model(&self) -> GpuModelId {
        self.state.model_by_name("H100").unwrap()
    }

    pub fn submit(&mut self, tier: Tier, gpus: u32) -> JobId {
        self.submit_as(tier, gpus, TenantId(1))
    }

    pub fn submit_as(&mut self, tier: Tier, gpus: u32, tenant: TenantId) -> JobId {
        let id = JobId(self.next_job);
        self.next_job += 1;
        let gpu_model = (tier == Tier::Reserved).then(|| self.model());
        self.state
            .submit(JobSpec {
                id,
                tenant,
                tier,
                gpus,
                max_gpus: None,
                gpu_model,
                submitted_at: self.now,
                priority: 0,
                max_preemptions: None,
            })
            .unwrap();
        id
    }

    /// A preemptible elastic job of `gpus` to `max_gpus` GPUs.
    pub fn submit_elastic(&mut self, gpus: u32, max_gpus: u32, tenant: TenantId) -> JobId {
        let id = JobId(self.next_job);
        self.next_job += 1;
        self.state
            .submit(JobSpec {
                id,
                tenant,
                tier: Tier::Preemptible,
                gpus,
                max_gpus: Some(max_gpus),
                gpu_model: None,
                submitted_at: self.now,
                priority: 0,
                max_preemptions: None,
            })
            .unwrap();
        id
    }

    /// The part of `job` on `node`, told to leave by a shrink, has exited.
    pub fn part_left(&mut self, job: JobId, node: NodeId) {
        let attempt = self.attempt(job);
        self.state.part_left(job, attempt, node).unwrap();
        self.state.sanity_check().unwrap();
    }

    /// GPUs `job` runs on now.
    pub fn gpus_of(&self, job: JobId) -> u32 {
        self.state.job(job).and_then(|j| j.run.as_ref()).map_or(0, |r| r.gpus())
    }

    pub fn advance(&mut self, secs: u64) {
        self.now = self.now + Span::from_secs(secs);
    }

    /// Schedules and applies one pass, checking every invariant after it.
    pub fn step(&mut self) -> Plan {
        let plan = schedule(&self.state, self.now, &self.config);
        self.state.apply(&plan).unwrap_or_else(|e| panic!("apply failed: {e}\n{plan:#?}"));
        self.state.sanity_check().unwrap_or_else(|e| panic!("sanity: {e}\n{plan:#?}"));
        self.plans.push(plan.clone());
        plan
    }

    pub fn phase(&self, job: JobId) -> Option<Phase> {
        self.state.job(job).map(|j| j.phase)
    }

    pub fn attempt(&self, job: JobId) -> Attempt {
        self.state.job(job).unwrap().attempt
    }

    pub fn nodes_of(&self, job: JobId) -> Vec<NodeId> {
        let run = self.state.job(job).unwrap().run.as_ref().unwrap();
        run.alloc.iter().map(|(n, _)| *n).collect()
    }

    pub fn exit(&mut self, job: JobId, kind: ExitKind) -> ExitEffect {
        let attempt = self.attempt(job);
        let effect = self.state.exited(job, attempt, kind).unwrap();
        self.state.sanity_check().unwrap();
        effect
    }

    pub fn checkpoint(&mut self, job: JobId) {
        let attempt = self.attempt(job);
        self.state.checkpointed(job, attempt, self.now).unwrap();
        self.state.sanity_check().unwrap();
    }
}
