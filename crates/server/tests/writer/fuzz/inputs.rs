//! What the fuzzer sends: instants, agents' events, submissions with
//! any value each field admits, and the steps of a sequence.

use super::*;
use ebb_core::{Attempt, JobId};

/// An instant as the fuzzer gives it: fixed, or relative to the batch's.
#[derive(Clone, Copy, Debug)]
pub(super) enum At {
    Fixed(u64),
    Ago(u64),
    Ahead(u64),
}

impl At {
    pub(super) fn resolve(self, now: u64) -> u64 {
        match self {
            At::Fixed(ms) => ms,
            At::Ago(ms) => now.saturating_sub(ms),
            At::Ahead(ms) => now.saturating_add(ms),
        }
    }
}

pub(super) fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        1 => Just(At::Fixed(0)),
        1 => Just(At::Fixed(u64::MAX)),
        1 => Just(At::Fixed(LAST_WRITABLE_MS)),
        1 => Just(At::Fixed(LAST_WRITABLE_MS + 1)),
        1 => any::<u64>().prop_map(At::Fixed),
        4 => (0u64..600_000).prop_map(At::Ago),
        2 => (0u64..10_000).prop_map(At::Ahead),
        1 => any::<u64>().prop_map(At::Ahead),
    ]
}

/// Which attempt an agent's event is about: one the writer started (the
/// `n`-th polled, modulo), or any.
#[derive(Clone, Copy, Debug)]
pub(super) enum Which {
    Started(usize),
    Any(AttemptRef),
}

pub(super) fn which() -> impl Strategy<Value = Which> {
    prop_oneof![
        4 => any::<usize>().prop_map(Which::Started),
        1 => (0u64..12, 0u32..4).prop_map(|(job, attempt)| Which::Any(AttemptRef { job: JobId(job), attempt: Attempt(attempt) })),
        1 => (any::<u64>(), any::<u32>()).prop_map(|(job, attempt)| Which::Any(AttemptRef { job: JobId(job), attempt: Attempt(attempt) })),
    ]
}

pub(super) fn big_u64() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(1), Just(u64::MAX), Just(u64::MAX / 2), Just(i64::MAX as u64), any::<u64>()]
}

pub(super) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("H100".to_string()),
        Just("\u{1b}]0;owned\u{7}\u{1b}[2J".to_string()),
        Just("x".repeat(5000)),
        "[a-z0-9\\-]{1,12}",
        any::<String>(),
    ]
}

#[derive(Clone, Debug)]
pub(super) enum Event {
    Started {
        which: Which,
        pid: u32,
        at: At,
    },
    Exited {
        which: Which,
        code: Option<i32>,
        signal: Option<i32>,
        completed: bool,
        at: At,
        peak: Option<u64>,
        error: Option<String>,
        port: Option<u16>,
        ended_by: Option<ebb_api::EndedBy>,
    },
    Checkpoint {
        which: Which,
        step: Option<u64>,
        bytes: Option<u64>,
        duration_ms: u64,
        at: At,
    },
    Resumed {
        which: Which,
        step: Option<u64>,
        at: At,
    },
    Restored {
        which: Which,
        from_attempt: u32,
        upload: u32,
        step: Option<u64>,
        files: u64,
        bytes: u64,
        duration_ms: u64,
        at: At,
    },
    Progress {
        which: Which,
        fraction: f64,
        at: At,
    },
    Output {
        which: Which,
        data: String,
    },
    Pulling {
        which: Which,
        done: u64,
        total: u64,
        at: At,
    },
    Pulled {
        which: Which,
        downloaded: u64,
        duration_ms: u64,
        at: At,
    },
    Health {
        findings: Vec<ebb_api::GpuFinding>,
        at: At,
    },
    Stopping {
        timeout_ms: u64,
        at: At,
    },
}

/// A node's health findings, valid or not: GPUs it has and has not, every
/// kind at its extremes, a check's output past its bound.
pub(super) fn finding() -> impl Strategy<Value = ebb_api::GpuFinding> {
    use ebb_api::{Finding, Throttle};
    let gpu = prop_oneof![6 => (0u8..8).prop_map(Some), 2 => Just(None), 1 => any::<u8>().prop_map(Some)];
    let code = prop_oneof![Just(79u32), Just(48), Just(74), Just(13), Just(0), Just(u32::MAX), any::<u32>()];
    let kind = prop_oneof![
        4 => code.prop_map(|code| Finding::Xid { code }),
        1 => big_u64().prop_map(|count| Finding::EccDoubleBit { count }),
        1 => (any::<u32>(), any::<bool>()).prop_map(|(count, pending)| Finding::RetiredPages { count, pending }),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(failed, pending)| Finding::RemappedRows { failed, pending }),
        2 => prop_oneof![Just(Throttle::Thermal), Just(Throttle::PowerBrake)].prop_map(|reason| Finding::Throttled { reason }),
        1 => (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(celsius, slowdown_celsius, shutdown_celsius)| {
            Finding::Temperature { celsius, slowdown_celsius, shutdown_celsius }
        }),
        1 => any::<u32>().prop_map(|link| Finding::NvlinkDown { link }),
        2 => (any::<Option<i32>>(), text()).prop_map(|(code, output)| Finding::CheckFailed { code, output }),
    ];
    (gpu, kind).prop_map(|(gpu, finding)| ebb_api::GpuFinding { gpu, finding })
}

pub(super) fn event() -> impl Strategy<Value = Event> {
    let fraction = prop_oneof![
        Just(0.0),
        Just(1.0),
        Just(0.5),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(1e-300),
        any::<f64>()
    ];
    prop_oneof![
        3 => (which(), any::<u32>(), at()).prop_map(|(which, pid, at)| Event::Started { which, pid, at }),
        3 => (which(), any::<Option<i32>>(), any::<Option<i32>>(), any::<bool>(), at(), proptest::option::of(big_u64()), proptest::option::of(text()), rarely(any::<u16>()), ended_by())
            .prop_map(|(which, code, signal, completed, at, peak, error, port, ended_by)| Event::Exited { which, code, signal, completed, at, peak, error, port, ended_by }),
        2 => (which(), proptest::option::of(big_u64()), proptest::option::of(big_u64()), big_u64(), at())
            .prop_map(|(which, step, bytes, duration_ms, at)| Event::Checkpoint { which, step, bytes, duration_ms, at }),
        1 => (which(), proptest::option::of(big_u64()), at()).prop_map(|(which, step, at)| Event::Resumed { which, step, at }),
        1 => (which(), any::<u32>(), any::<u32>(), proptest::option::of(big_u64()), big_u64(), big_u64(), big_u64(), at())
            .prop_map(|(which, from_attempt, upload, step, files, bytes, duration_ms, at)| Event::Restored { which, from_attempt, upload, step, files, bytes, duration_ms, at }),
        2 => (which(), fraction, at()).prop_map(|(which, fraction, at)| Event::Progress { which, fraction, at }),
        1 => (which(), text()).prop_map(|(which, data)| Event::Output { which, data }),
        1 => (which(), big_u64(), big_u64(), at()).prop_map(|(which, done, total, at)| Event::Pulling { which, done, total, at }),
        1 => (which(), big_u64(), big_u64(), at())
            .prop_map(|(which, downloaded, duration_ms, at)| Event::Pulled { which, downloaded, duration_ms, at }),
        2 => (prop_oneof![8 => proptest::collection::vec(finding(), 0..4), 1 => proptest::collection::vec(finding(), 513..514)], at())
            .prop_map(|(findings, at)| Event::Health { findings, at }),
        1 => (prop_oneof![Just(0u64), Just(u64::MAX), big_u64()], at())
            .prop_map(|(timeout_ms, at)| Event::Stopping { timeout_ms, at }),
    ]
}

/// An image and the digest the HTTP layer resolved it to: mostly none; a
/// resolved one, one the HTTP layer would never pass (no digest), and
/// odd text.
pub(super) fn image() -> impl Strategy<Value = (Option<String>, Option<String>)> {
    let digest = format!("sha256:{}", "ab".repeat(32));
    prop_oneof![
        12 => Just((None, None)),
        2 => Just((Some("127.0.0.1:5000/train:v1".to_string()), Some(digest))),
        1 => Just((Some("127.0.0.1:5000/train:v1".to_string()), None)),
        1 => (text(), proptest::option::of(text())).prop_map(|(r, d)| (Some(r), d)),
    ]
}

/// Mostly `None`: a submission with one bad field is refused whole, so
/// each field is odd only now and then, and most submissions run.
/// What ended an attempt, by a node's word: mostly nothing.
pub(super) fn ended_by() -> impl Strategy<Value = Option<ebb_api::EndedBy>> {
    prop_oneof![
        8 => Just(None),
        2 => Just(Some(ebb_api::EndedBy::Requeue)),
        1 => Just(Some(ebb_api::EndedBy::TimeLimit)),
        1 => Just(Some(ebb_api::EndedBy::NodeStopping)),
    ]
}

/// A Slurm batch job's script and options, valid or not.
pub(super) fn slurm() -> impl Strategy<Value = ebb_api::SlurmBatch> {
    let script = prop_oneof![
        4 => Just("#!/bin/sh\n#SBATCH -n 2\nsrun true\n".to_string()),
        1 => text(),
        1 => Just(format!("#!/bin/sh\n{}", "x".repeat(1024 * 1024))),
    ];
    let count = prop_oneof![4 => Just(None), 1 => any::<u32>().prop_map(Some)];
    (script, rarely(text()), any::<bool>(), count.clone(), count, rarely(text()), rarely(any::<u32>()))
        .prop_map(|(script, output, signal_batch_only, nodes, ntasks, partition, signal_before_s)| {
            ebb_api::SlurmBatch {
                script,
                output,
                signal_batch_only,
                routed_signal: signal_batch_only,
                nodes,
                ntasks,
                partition,
                signal_before_s,
                ..Default::default()
            }
        })
}

pub(super) fn rarely<T: std::fmt::Debug + Clone>(
    odd: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![24 => Just(None), 1 => odd.prop_map(Some)]
}

/// A well-formed elastic job on the fuzzer's 8-GPU nodes, so that the
/// writer's shrinks, parts leaving and grows come up, not only the
/// refusals of the ranges `submission` draws.
pub(super) fn elastic() -> impl Strategy<Value = JobSubmission> {
    (prop_oneof![Just(8u32), Just(16)], prop_oneof![Just(16u32), Just(24)], any::<bool>()).prop_map(
        |(gpus, max, sleeps)| JobSubmission {
            gpus: Some(gpus),
            max_gpus: Some(max.max(gpus + 8)),
            argv: match sleeps {
                true => vec!["sleep".to_string(), "100".to_string()],
                false => vec!["true".to_string()],
            },
            ..Default::default()
        },
    )
}

pub(super) fn submission() -> impl Strategy<Value = JobSubmission> {
    let argv = prop_oneof![
        8 => Just(vec!["true".to_string()]),
        4 => Just(vec!["sleep".to_string(), "100".to_string()]),
        1 => Just(Vec::new()),
        1 => Just(vec![String::new()]),
        1 => Just(vec!["a\0b".to_string()]),
        1 => Just(vec!["true".to_string(); 2000]),
        1 => proptest::collection::vec(text(), 1..4),
    ];
    let tier = prop_oneof![
        3 => Just(None),
        2 => Just(Some("on-demand".to_string())),
        1 => Just(Some("reserved".to_string())),
        1 => Just(Some("preemptible".to_string())),
        1 => Just(Some("spot".to_string())),
        1 => Just(Some("cheap".to_string())),
    ];
    let gpus = proptest::option::of(
        prop_oneof![8 => 1u32..=8, 1 => 9u32..=24, 1 => Just(0), 1 => Just(4096), 1 => Just(u32::MAX)],
    );
    let model = rarely(prop_oneof![Just("H100".to_string()), Just("T4".to_string()), text()]);
    let signal = rarely(prop_oneof![
        Just("TERM".to_string()),
        Just("64".to_string()),
        Just("0".to_string()),
        Just("USR1".to_string()),
        text()
    ]);
    let array = rarely(prop_oneof![
        3 => Just("0-3".to_string()),
        1 => Just("5-1".to_string()),
        1 => Just("0-18446744073709551615".to_string()),
        1 => Just("18446744073709551615".to_string()),
        1 => Just("0-99999999".to_string()),
        1 => text(),
    ]);
    let deadline = rarely(prop_oneof![
        3 => Just("2030-01-01".to_string()),
        1 => Just("9999-12-28T23:59:59Z".to_string()),
        1 => Just("1970-01-01".to_string()),
        1 => Just("2030-02-28T00:00:60Z".to_string()),
        1 => text(),
    ]);
    let restart = rarely(prop_oneof![Just("always".to_string()), Just("never".to_string()), text()]);
    let env = prop_oneof![
        4 => Just(BTreeMap::new()),
        1 => proptest::collection::btree_map("[A-Z_]{1,6}|EBB_X|CUDA_VISIBLE_DEVICES|1A", text(), 0..3),
    ];
    let sweep = prop_oneof![
        6 => Just(Vec::new()),
        1 => proptest::collection::vec(
            ("[a-z]{1,4}", proptest::collection::vec("[0-9]{1,3}", 0..4)).prop_map(|(name, values)| SweepParam { name, values }),
            0..3,
        ),
    ];
    (
        (argv, tier, gpus, model, signal, array),
        (deadline, restart, env, sweep, rarely(text()), rarely(any::<u32>())),
        (rarely(any::<u32>()), any::<bool>(), rarely(text()), image()),
        (rarely(any::<u64>()), rarely(any::<u32>()), rarely(text()), rarely(slurm()), rarely(any::<i32>())),
        rarely(prop_oneof![Just(8u32), Just(16), Just(24), Just(32), any::<u32>()]),
    )
        .prop_map(
            |(
                (argv, tier, gpus, gpu_model, signal, array),
                (deadline, restart, env, sweep, name, max_preemptions),
                (max_retries, exit_on_drain_is_success, workdir, (image, image_digest)),
                (time_limit_s, array_limit, after, slurm, priority),
                max_gpus,
            )| JobSubmission {
                max_gpus,
                priority,
                time_limit_s,
                array_limit,
                after,
                slurm,
                image,
                image_digest,
                name,
                tier,
                gpus,
                gpu_model,
                argv,
                env,
                workdir,
                signal,
                max_preemptions,
                max_retries,
                exit_on_drain_is_success,
                array,
                restart,
                sweep,
                deadline,
            },
        )
}

// A generated input: its size in memory does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(super) enum Step {
    Submit {
        alice: bool,
        spec: JobSubmission,
    },
    SubmitBatch {
        specs: Vec<JobSubmission>,
    },
    Cancel {
        id: u64,
        grace_ms: Option<u64>,
        alice: bool,
    },
    Drill {
        id: u64,
        alice: bool,
    },
    /// `scancel --signal`: any number, to the batch shell or the steps.
    Signal {
        id: u64,
        signal: i32,
        batch_only: bool,
        alice: bool,
    },
    Show {
        id: u64,
    },
    List,
    Log {
        id: u64,
        offset: u64,
    },
    /// `join`: with the join token or the node's credential; none: as an
    /// agent would, the join token the first time.
    Register {
        node: usize,
        join: Option<bool>,
        gpus: u8,
        model: String,
        running: Vec<Which>,
        unreported: Vec<Event>,
        /// Says it holds starts back until their GPUs are free, and which
        /// it holds.
        starts_when_free: bool,
        waiting: Vec<Which>,
        /// The CPUs and memory (MiB) it says it has, at and past their
        /// bounds.
        host: (Option<u32>, Option<u64>),
    },
    Poll {
        node: usize,
        epoch: Option<u64>,
        after: Option<u64>,
        failing: Option<Option<String>>,
    },
    Report {
        node: usize,
        events: Vec<Event>,
        id: Option<(u64, u64)>,
    },
    Node {
        node: usize,
        op: u8,
        /// An undrain of one GPU.
        gpu: Option<u8>,
    },
    Reclaim {
        gpus: u32,
        model: Option<String>,
        release: bool,
    },
    Tenant {
        name: String,
        limits: TenantLimits,
        tokens: Option<bool>,
    },
    Price {
        model: String,
        on_demand: String,
        reserved: Option<String>,
    },
    RegistryLogin {
        alice: bool,
        tenant: String,
        registry: String,
        login: Option<(String, String)>,
    },
    Reserve {
        gpus: u32,
        backdate: bool,
        start: String,
        end: String,
        rate: Option<String>,
        delete: Option<u64>,
    },
    Money {
        from: String,
        to: String,
        step: String,
    },
    Metrics,
    /// A webhook added (by alice or an operator, for a tenant or the
    /// operators), removed, its log read, or a try of a delivery reported.
    Webhook {
        alice: bool,
        op: u8,
        req: ebb_api::WebhookRequest,
        id: u64,
        tried: u8,
    },
    Advance {
        ms: u64,
    },
    Restart,
}

/// A quota at the limits: tiers that are refused, unknown models, counts
/// past the largest and a lending limit past the quota.
pub(super) fn quota() -> impl Strategy<Value = ebb_api::TenantQuota> {
    let count = || prop_oneof![Just(0u32), 1u32..16, Just(1_000_000), Just(1_000_001), Just(u32::MAX)];
    (
        prop_oneof![
            Just("preemptible".to_string()),
            Just("on-demand".to_string()),
            Just("reserved".to_string()),
            text()
        ],
        prop_oneof![4 => Just("H100".to_string()), 1 => text()],
        count(),
        proptest::option::of(count()),
        proptest::option::of(count()),
    )
        .prop_map(|(tier, gpu_model, nominal, borrowing_limit, lending_limit)| ebb_api::TenantQuota {
            tier,
            gpu_model,
            nominal,
            borrowing_limit,
            lending_limit,
        })
}

/// A webhook's request, valid or not: either owner, every event name and
/// odd ones, URLs at and past their bounds, a link-local one, both formats.
pub(super) fn webhook_request() -> impl Strategy<Value = ebb_api::WebhookRequest> {
    let event = prop_oneof![
        4 => proptest::sample::select(ebb_api::JOB_WEBHOOK_EVENTS.to_vec()).prop_map(String::from),
        2 => proptest::sample::select(ebb_api::NODE_WEBHOOK_EVENTS.to_vec()).prop_map(String::from),
        1 => text(),
    ];
    let url = prop_oneof![
        6 => Just("http://receiver.test:9/hook".to_string()),
        1 => Just("http://[::ffff:127.0.0.1]:9/hook".to_string()),
        1 => Just(format!("https://example.com/{}", "a".repeat(2029))),
        1 => Just(format!("https://example.com/{}", "a".repeat(2030))),
        1 => Just("http://169.254.169.254/".to_string()),
        1 => text(),
    ];
    let tenant =
        prop_oneof![4 => Just(None), 2 => Just(Some("alice".to_string())), 1 => text().prop_map(Some)];
    let format =
        prop_oneof![4 => Just(None), 1 => Just(Some("slack".to_string())), 1 => text().prop_map(Some)];
    (tenant, url, proptest::collection::vec(event, 0..4), format)
        .prop_map(|(tenant, url, events, format)| ebb_api::WebhookRequest { tenant, url, events, format })
}

pub(super) fn day() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("2030-03-01".to_string()),
        Just("2030-03-02T00:00:00Z".to_string()),
        Just("1970-01-01".to_string()),
        Just("9999-12-28".to_string()),
        text(),
    ]
}

pub(super) fn step() -> impl Strategy<Value = Step> {
    let node = 0..NODES.len();
    prop_oneof![
        6 => (any::<bool>(), submission()).prop_map(|(alice, spec)| Step::Submit { alice, spec }),
        2 => (any::<bool>(), elastic()).prop_map(|(alice, spec)| Step::Submit { alice, spec }),
        1 => proptest::collection::vec(submission(), 0..4).prop_map(|specs| Step::SubmitBatch { specs }),
        2 => (0u64..14, proptest::option::of(big_u64()), any::<bool>()).prop_map(|(id, grace_ms, alice)| Step::Cancel { id, grace_ms, alice }),
        2 => (0u64..14, any::<bool>()).prop_map(|(id, alice)| Step::Drill { id, alice }),
        1 => (0u64..14, prop_oneof![4 => 1i32..65, 1 => any::<i32>()], any::<bool>(), any::<bool>())
            .prop_map(|(id, signal, batch_only, alice)| Step::Signal { id, signal, batch_only, alice }),
        1 => (0u64..14).prop_map(|id| Step::Show { id }),
        1 => Just(Step::List),
        1 => (0u64..14, big_u64()).prop_map(|(id, offset)| Step::Log { id, offset }),
        3 => (node.clone(), rarely(any::<bool>()), prop_oneof![4 => Just(8u8), 1 => any::<u8>()], prop_oneof![4 => Just("H100".to_string()), 1 => text()],
              proptest::collection::vec(which(), 0..3), proptest::collection::vec(event(), 0..3), any::<bool>(), proptest::collection::vec(which(), 0..3),
              (proptest::option::of(prop_oneof![Just(0u32), 1u32..256, Just(1 << 20), Just((1 << 20) + 1), Just(u32::MAX)]),
               proptest::option::of(prop_oneof![Just(0u64), 1u64..1 << 20, Just(1 << 40), Just((1 << 40) + 1), Just(u64::MAX)])))
            .prop_map(|(node, join, gpus, model, running, unreported, starts_when_free, waiting, host)| Step::Register { node, join, gpus, model, running, unreported, starts_when_free, waiting, host }),
        10 => (node.clone(), rarely(big_u64()), rarely(big_u64()), rarely(proptest::option::of(text())))
            .prop_map(|(node, epoch, after, failing)| Step::Poll { node, epoch, after, failing }),
        8 => (node.clone(), proptest::collection::vec(event(), 0..5), proptest::option::of((0u64..3, big_u64())))
            .prop_map(|(node, events, id)| Step::Report { node, events, id }),
        1 => (node.clone(), 0u8..3, rarely(prop_oneof![0u8..8, Just(8), Just(u8::MAX)]))
            .prop_map(|(node, op, gpu)| Step::Node { node, op, gpu }),
        1 => (prop_oneof![Just(0u32), 1u32..16, Just(u32::MAX)], proptest::option::of(text()), any::<bool>())
            .prop_map(|(gpus, model, release)| Step::Reclaim { gpus, model, release }),
        1 => (text(), (proptest::option::of(big_u64()), proptest::option::of(big_u64()), proptest::option::of(big_u64()),
                       proptest::option::of(prop_oneof![Just(0u32), 1u32..5, Just(1_000_000), Just(1_000_001), Just(u32::MAX)])),
              proptest::option::of(proptest::collection::vec(quota(), 0..4)), proptest::option::of(any::<bool>()))
            .prop_map(|(name, (max_jobs, max_running_jobs, max_stored_bytes, weight), quotas, tokens)| Step::Tenant {
                name, limits: TenantLimits { max_jobs, max_running_jobs, max_stored_bytes, weight, quotas }, tokens }),
        1 => (prop_oneof![Just("H100".to_string()), text()], prop_oneof![Just("2.50".to_string()), Just("92233720368547.75807".to_string()), Just("-1".to_string()), Just("1e308".to_string()), text()], proptest::option::of(text()))
            .prop_map(|(model, on_demand, reserved)| Step::Price { model, on_demand, reserved }),
        1 => (prop_oneof![1u32..8, Just(0), Just(u32::MAX)], day(), day(), proptest::option::of(prop_oneof![Just("92233720368547.75807".to_string()), text()]), proptest::option::of(0u64..4), any::<bool>())
            .prop_map(|(gpus, start, end, rate, delete, backdate)| Step::Reserve { gpus, backdate, start, end, rate, delete }),
        1 => (day(), day(), prop_oneof![Just("1d".to_string()), Just("1ms".to_string()), Just("18446744073709551615s".to_string()), text()])
            .prop_map(|(from, to, step)| Step::Money { from, to, step }),
        1 => (any::<bool>(), prop_oneof![Just("alice".to_string()), Just("default".to_string()), text()],
              prop_oneof![Just("127.0.0.1:5000".to_string()), Just("registry.example.com".to_string()), text()],
              proptest::option::of((prop_oneof![Just("u".to_string()), text()], prop_oneof![Just("p".to_string()), text()])))
            .prop_map(|(alice, tenant, registry, login)| Step::RegistryLogin { alice, tenant, registry, login }),
        1 => Just(Step::Metrics),
        2 => (any::<bool>(), 0u8..4, webhook_request(), prop_oneof![0u64..4, big_u64()], 0u8..3)
            .prop_map(|(alice, op, req, id, tried)| Step::Webhook { alice, op, req, id, tried }),
        4 => prop_oneof![8 => 0u64..2_000, 2 => 0u64..30_000, 1 => 0u64..400_000, 1 => 0u64..30 * 86_400_000]
            .prop_map(|ms| Step::Advance { ms }),
        1 => Just(Step::Restart),
    ]
}
