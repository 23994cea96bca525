//! What the server keeps of a job's submission: its own types, not the
//! API's, so that either may change without the other. Each converts
//! from the request it was checked from and into what a node or a view
//! is sent; the stored form reads what earlier servers wrote.

use std::collections::BTreeMap;
use std::sync::Arc;

use ebb_api::JobSubmission;
use serde::{Deserialize, Serialize};

/// What the server keeps of a submission once it is checked: what runs,
/// and the rules for its ends. Tier, GPUs, signal and array are resolved
/// into the record. Its own type, not the API's request: the API may grow
/// without changing what the store holds. Fields read from records of
/// older servers that are not here are ignored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Shared by the tasks of one submission, as `env` is.
    pub argv: Arc<Vec<String>>,
    /// Shared by the tasks of one submission (an array's may be the
    /// submitter's whole environment, 100,000 times).
    #[serde(default, skip_serializing_if = "is_empty_env")]
    pub env: Arc<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// An elastic job's most GPUs (its record's `gpus` is its fewest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_preemptions: Option<u32>,
    /// Its place among its tenant's jobs of its tier: higher first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exit_on_drain_is_success: bool,
    #[serde(default, skip_serializing_if = "Restart::is_never", deserialize_with = "Restart::or_null")]
    pub restart: Restart,
    /// The image it runs in, with the digest resolved at submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<PinnedImage>,
    /// Each attempt's time limit, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// What it waits for before it may run (`after`), checked at submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<super::gates::After>,
    /// At most this many of its array's tasks run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_limit: Option<u32>,
    /// A Slurm batch job's script and options (shared by an array's tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<Arc<SlurmOptions>>,
}

/// What happens when a job's attempt exits (but for a cancel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    /// It ends: succeeded, failed, or retried by `max_retries`.
    #[default]
    Never,
    /// It runs again after every exit, as a service does.
    Always,
}

impl Restart {
    fn is_never(&self) -> bool {
        *self == Restart::Never
    }

    /// Early releases stored `"restart": null` for none.
    fn or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Restart, D::Error> {
        Ok(Option::<Restart>::deserialize(d)?.unwrap_or_default())
    }
}

impl From<JobSubmission> for StoredSpec {
    fn from(s: JobSubmission) -> StoredSpec {
        StoredSpec {
            name: s.name,
            gpu_model: s.gpu_model,
            argv: Arc::new(s.argv),
            env: Arc::new(s.env),
            workdir: s.workdir,
            max_gpus: s.max_gpus,
            max_preemptions: s.max_preemptions,
            priority: s.priority.unwrap_or(0),
            max_retries: s.max_retries,
            exit_on_drain_is_success: s.exit_on_drain_is_success,
            // Validated at submit: `never`, `always` or none.
            restart: if s.restart.as_deref() == Some("always") { Restart::Always } else { Restart::Never },
            image: s.image.zip(s.image_digest).map(|(reference, digest)| PinnedImage { reference, digest }),
            time_limit_ms: s.time_limit_s.map(|s| s.saturating_mul(1000)),
            // Checked against the tenant's jobs before it is set.
            after: None,
            array_limit: s.array_limit,
            slurm: s.slurm.map(|s| Arc::new(SlurmOptions::from(s))),
        }
    }
}

impl StoredSpec {
    /// What its arguments and environment cost the server to keep, as
    /// tenants' limits count them (see [`crate::validate::stored_bytes`]).
    pub fn stored_bytes(&self) -> u64 {
        let script = self.slurm.as_ref().map_or(0, |s| s.script.len() as u64);
        crate::validate::stored_bytes(&self.argv, &self.env).saturating_add(script)
    }
}

/// A job's image: the reference as submitted, pinned to the digest it
/// resolved to at submit, so that every attempt runs the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedImage {
    pub reference: String,
    pub digest: String,
}

impl From<PinnedImage> for ebb_api::JobImage {
    fn from(PinnedImage { reference, digest }: PinnedImage) -> ebb_api::JobImage {
        ebb_api::JobImage { reference, digest }
    }
}

/// A Slurm batch job's script and the options it was submitted with
/// (shared by an array's tasks): what its batch step, its `srun` steps
/// and the Slurm commands need. The stored form is the request's, field
/// for field, so records of earlier servers read back; an option at its
/// default is left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmOptions {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub script: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signal_batch_only: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub routed_signal: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_before_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ebb_api::SlurmComponent>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_nodes: bool,
}

impl From<ebb_api::SlurmBatch> for SlurmOptions {
    fn from(s: ebb_api::SlurmBatch) -> SlurmOptions {
        let ebb_api::SlurmBatch {
            script,
            output,
            error,
            append,
            signal_batch_only,
            routed_signal,
            signal_before_s,
            nodes,
            ntasks,
            ntasks_per_node,
            cpus_per_task,
            partition,
            qos,
            account,
            submit_dir,
            components,
            whole_nodes,
        } = s;
        SlurmOptions {
            script,
            output,
            error,
            append,
            signal_batch_only,
            routed_signal,
            signal_before_s,
            nodes,
            ntasks,
            ntasks_per_node,
            cpus_per_task,
            partition,
            qos,
            account,
            submit_dir,
            components,
            whole_nodes,
        }
    }
}

impl SlurmOptions {
    /// What a node's batch step is sent (`with_script`), or what a view
    /// shows (the script is the tenant's to keep; a listing need not
    /// carry it).
    pub fn to_api(&self, with_script: bool) -> ebb_api::SlurmBatch {
        let SlurmOptions {
            script,
            output,
            error,
            append,
            signal_batch_only,
            routed_signal,
            signal_before_s,
            nodes,
            ntasks,
            ntasks_per_node,
            cpus_per_task,
            partition,
            qos,
            account,
            submit_dir,
            components,
            whole_nodes,
        } = self;
        ebb_api::SlurmBatch {
            script: if with_script { script.clone() } else { String::new() },
            output: output.clone(),
            error: error.clone(),
            append: *append,
            signal_batch_only: *signal_batch_only,
            routed_signal: *routed_signal,
            signal_before_s: *signal_before_s,
            nodes: *nodes,
            ntasks: *ntasks,
            ntasks_per_node: *ntasks_per_node,
            cpus_per_task: *cpus_per_task,
            partition: partition.clone(),
            qos: qos.clone(),
            account: account.clone(),
            submit_dir: submit_dir.clone(),
            components: components.clone(),
            whole_nodes: *whole_nodes,
        }
    }
}

fn is_empty_env(env: &Arc<BTreeMap<String, String>>) -> bool {
    env.is_empty()
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("[ -~]{0,12}")
    }

    fn count() -> impl Strategy<Value = Option<u32>> {
        proptest::option::of(any::<u32>())
    }

    prop_compose! {
        fn slurm_batch()(
            script in "(#![ -~]{0,20})?",
            (output, error, partition, qos, account, submit_dir) in (text(), text(), text(), text(), text(), text()),
            (append, signal_batch_only, routed_signal, whole_nodes) in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
            (signal_before_s, nodes, ntasks, ntasks_per_node, cpus_per_task) in (count(), count(), count(), count(), count()),
            components in proptest::collection::vec(
                (any::<u32>(), any::<u32>(), count(), count(), count()).prop_map(|(nodes, gpus_per_node, ntasks, ntasks_per_node, cpus_per_task)| {
                    ebb_api::SlurmComponent { nodes, gpus_per_node, ntasks, ntasks_per_node, cpus_per_task }
                }),
                0..3,
            ),
        ) -> ebb_api::SlurmBatch {
            ebb_api::SlurmBatch {
                script, output, error, append, signal_batch_only, routed_signal, signal_before_s,
                nodes, ntasks, ntasks_per_node, cpus_per_task, partition, qos, account, submit_dir, components,
                whole_nodes,
            }
        }
    }

    proptest! {
        /// Earlier servers stored the request's own type: what they wrote
        /// reads back as the same options, what this one writes reads back
        /// in them, and what a node is sent is what was submitted.
        #[test]
        fn slurm_options_read_what_earlier_servers_wrote_and_back(batch in slurm_batch()) {
            let options = SlurmOptions::from(batch.clone());
            let written_before = serde_json::to_value(&batch).unwrap();
            prop_assert_eq!(&serde_json::from_value::<SlurmOptions>(written_before).unwrap(), &options);
            let written_now = serde_json::to_value(&options).unwrap();
            prop_assert_eq!(&serde_json::from_value::<ebb_api::SlurmBatch>(written_now.clone()).unwrap(), &batch);
            prop_assert_eq!(&serde_json::from_value::<SlurmOptions>(written_now).unwrap(), &options);
            prop_assert_eq!(&options.to_api(true), &batch);
            prop_assert_eq!(options.to_api(false), ebb_api::SlurmBatch { script: String::new(), ..batch });
        }
    }

    #[test]
    fn an_image_and_what_ended_an_attempt_are_stored_as_earlier_servers_stored_them() {
        let api = ebb_api::JobImage { reference: "registry:5000/train:1".into(), digest: "sha256:ab".into() };
        let pinned: PinnedImage = serde_json::from_value(serde_json::to_value(&api).unwrap()).unwrap();
        assert_eq!(serde_json::to_value(&pinned).unwrap(), serde_json::to_value(&api).unwrap());
        assert_eq!(ebb_api::JobImage::from(pinned), api);
        for by in [ebb_api::EndedBy::Requeue, ebb_api::EndedBy::TimeLimit, ebb_api::EndedBy::NodeStopping] {
            let stored = serde_json::to_value(by).unwrap();
            assert_eq!(serde_json::to_value(super::super::EndedBy::from(by)).unwrap(), stored);
            assert_eq!(serde_json::from_value::<super::super::EndedBy>(stored).unwrap(), by.into());
        }
    }
}
