//! What the scheduling core knows about the cluster: nodes, jobs, runs,
//! reservations and the knobs of a scheduling pass.

use std::collections::BTreeMap;

use ebb_core::{Attempt, GpuModelId, JobId, NodeId, ReservationId, Span, TenantId, Tier, Time};

/// Nodes carry their GPUs as a bit mask, so a node holds at most this many.
pub const MAX_GPUS_PER_NODE: u8 = 64;

/// Knobs of a scheduling pass. The same `Config` and state always give the
/// same plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Notice to deadline for every drain, chosen by the operator.
    pub drain_window: Span,
    /// How victims are ranked when a job must preempt.
    pub victim_policy: VictimPolicy,
    /// A node whose last heartbeat is older than this is declared lost and
    /// its jobs requeued. `None` never declares a node lost (the simulator's
    /// nodes do not fail).
    pub heartbeat_timeout: Option<Span>,
    /// How long a job that has been preempted is spared once it runs again:
    /// while it is [settling](Job::settling), no victim is chosen among
    /// settling jobs if victims without them would do. Zero turns the rule
    /// off.
    pub min_runtime: Span,
    /// A pass starts or preempts for at most this many jobs; the rest of
    /// the queue is left, not yet looked at, for the next pass. Bounds the
    /// work one pass hands its caller (a server commits each pass's
    /// effects before the next, so a fleet's backlog reaches its nodes in
    /// pieces rather than all at once). `None` for no bound.
    pub max_starts: Option<usize>,
    /// How jobs of one tier are ordered among tenants.
    pub order: Order,
    /// Fair-share preemption in the preemptible tier, off when `None`: a
    /// tenant whose job waits may have GPUs drained from the tenant
    /// furthest above its share when that tenant's fair-share key exceeds
    /// the waiting tenant's (its job counted) by more than this many
    /// percent (`README.md`, "Fair share").
    pub fair_share_preemption: Option<u32>,
    /// What a change of an elastic job's members costs each GPU that
    /// stays: its rank restarts from the job's last save. A shrink's cost
    /// counts it for every remaining GPU, so the core shrinks a job only
    /// when that loses less than stopping a job whole (`README.md`,
    /// "Elastic jobs").
    pub restart_cost: Span,
}

impl Config {
    /// The longest `min_runtime`: a day. Longer would spare a job
    /// preempted before for most of its life, which is no longer a rule
    /// against thrash (and most likely a slip of the unit).
    pub const MAX_MIN_RUNTIME: Span = Span(24 * 3_600_000);
    /// Fair-share preemption's gap, percent: below 10, tenants near their
    /// shares would trade GPUs back and forth.
    pub const FAIR_SHARE_PREEMPTION: std::ops::RangeInclusive<u32> = 10..=1000;
    /// The fair-share half-life: from a second to a year
    /// (`State::set_fair_share_half_life`).
    pub const FAIR_SHARE_HALF_LIFE: std::ops::RangeInclusive<Span> = Span(1_000)..=Span(365 * 86_400_000);
}

impl Default for Config {
    fn default() -> Self {
        Config {
            drain_window: Span::from_secs(300),
            victim_policy: VictimPolicy::LostWork,
            heartbeat_timeout: None,
            min_runtime: Span::from_secs(300),
            max_starts: None,
            order: Order::FairShare,
            fair_share_preemption: None,
            restart_cost: Span::from_secs(60),
        }
    }
}

/// How the queue walk orders the jobs of one tier. Tiers always come
/// first: reserved, on-demand, preemptible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The tenant furthest below its share first (`README.md`, "Fair
    /// share"), then the tenant's own priority, then submission time.
    FairShare,
    /// Submission time alone, every tenant together: the order before fair
    /// share, kept so the simulator can compare the two.
    Fifo,
}

impl std::str::FromStr for Order {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fair-share" => Ok(Order::FairShare),
            "fifo" => Ok(Order::Fifo),
            other => Err(format!("order: expected fair-share or fifo, got {other:?}")),
        }
    }
}

/// How the scheduler ranks preemptible victims. Every policy evicts whole
/// gangs only and only when the preemptor then fits; they differ in which
/// feasible set they prefer. `LostWork` is the product's policy; the others
/// exist so the simulator can show what it is better than.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimPolicy {
    /// Least GPU-time since the victims' last checkpoint (or start), then
    /// fewest victims.
    LostWork,
    /// Most recently started first.
    Youngest,
    /// Longest running first.
    Oldest,
    /// Fewest GPUs evicted.
    FewestGpus,
    /// A seeded pseudo-random order (deterministic for a seed).
    Random { seed: u64 },
}

impl std::str::FromStr for VictimPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lost-work" => Ok(VictimPolicy::LostWork),
            "youngest" => Ok(VictimPolicy::Youngest),
            "oldest" => Ok(VictimPolicy::Oldest),
            "fewest-gpus" => Ok(VictimPolicy::FewestGpus),
            other => match other.strip_prefix("random:") {
                Some(seed) => seed
                    .parse()
                    .map(|seed| VictimPolicy::Random { seed })
                    .map_err(|_| format!("victim policy: random seed must be an integer, got {seed:?}")),
                None => Err(format!(
                    "victim policy: expected lost-work, youngest, oldest, fewest-gpus or random:SEED, got {other:?}"
                )),
            },
        }
    }
}

/// What the edge tells the core about a new job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub id: JobId,
    pub tenant: TenantId,
    pub tier: Tier,
    /// Whole GPUs. More than one node's worth makes a gang over whole nodes,
    /// so it must then be a multiple of the model's GPUs per node. For an
    /// elastic job, the fewest it runs on: it starts with this many.
    pub gpus: u32,
    /// An elastic job: it may run on any whole number of nodes from
    /// `gpus` up to this many GPUs, grown into capacity no queued job
    /// wants and shrunk, a node at a time, instead of being stopped
    /// (`README.md`, "Elastic jobs"). Only preemptible jobs over whole
    /// nodes are elastic. `None`: rigid, it runs on exactly `gpus`.
    pub max_gpus: Option<u32>,
    /// `None`: any model that fits. Reserved jobs name the model of their
    /// reservation.
    pub gpu_model: Option<GpuModelId>,
    pub submitted_at: Time,
    /// The tenant's own order among its jobs of one tier: higher first.
    /// Never compared across tenants.
    pub priority: i32,
    /// Requeue at most this many times after preemption; `None` = unbounded.
    pub max_preemptions: Option<u32>,
}

impl JobSpec {
    /// The most GPUs it runs on: an elastic job's maximum, else `gpus`.
    pub fn most_gpus(&self) -> u32 {
        self.max_gpus.unwrap_or(self.gpus)
    }

    pub fn is_elastic(&self) -> bool {
        self.max_gpus.is_some()
    }
}

/// One attempt's hold on concrete GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub attempt: Attempt,
    pub model: GpuModelId,
    /// GPUs by node, as bit masks of GPU indices; one entry per node. The
    /// first is the job's first node (rank 0, the rendezvous host): an
    /// elastic job never loses it alone.
    pub alloc: Vec<(NodeId, u64)>,
    pub started_at: Time,
    pub last_checkpoint_at: Option<Time>,
    /// What a GPU of it is worth per hour at on-demand rates (µ$): its
    /// model's rate when it started. Its tenant's usage grows by this for
    /// every GPU it holds.
    pub gpu_rate: u64,
    /// An elastic job's changes of nodes since its start: `None` until
    /// the first (and for every rigid job, which pays a pointer for it).
    pub resized: Option<Box<Resized>>,
}

/// What an elastic job's changes of nodes left its run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    /// Nodes it grew onto after its start, with when each joined; every
    /// other node of `alloc` joined at `started_at`.
    pub joined: Vec<(NodeId, Time)>,
    /// Nodes it was shrunk off: each has its notice and keeps its GPUs
    /// until its part exits ([`crate::State::part_left`]).
    pub leaving: Vec<(NodeId, Notice)>,
    /// When its nodes last changed: a shrink's notice or a grow.
    pub at: Time,
}

impl Run {
    pub fn gpus(&self) -> u32 {
        self.alloc.iter().map(|(_, mask)| mask.count_ones()).sum()
    }

    /// GPUs of the nodes that stay: all but those leaving on a shrink.
    pub fn active_gpus(&self) -> u32 {
        match self.leaving() {
            [] => self.gpus(),
            _ => self.alloc.iter().filter(|(n, _)| !self.is_leaving(*n)).map(|(_, m)| m.count_ones()).sum(),
        }
    }

    pub fn is_leaving(&self, node: NodeId) -> bool {
        self.leaving().iter().any(|(n, _)| *n == node)
    }

    /// Nodes it grew onto after its start, with when each joined.
    pub fn joined(&self) -> &[(NodeId, Time)] {
        self.resized.as_ref().map_or(&[], |r| &r.joined)
    }

    /// Nodes a shrink told to leave, each with its notice.
    pub fn leaving(&self) -> &[(NodeId, Notice)] {
        self.resized.as_ref().map_or(&[], |r| &r.leaving)
    }

    /// When its nodes last changed: its start, a shrink's notice or a
    /// grow. An elastic job grows only `min_runtime` after.
    pub fn resized_at(&self) -> Time {
        self.resized.as_ref().map_or(self.started_at, |r| r.at)
    }

    /// Its record of changes, made at its first.
    pub(crate) fn resized_mut(&mut self) -> &mut Resized {
        let at = self.started_at;
        self.resized.get_or_insert_with(|| Box::new(Resized { joined: Vec::new(), leaving: Vec::new(), at }))
    }

    /// The first node: rank 0's.
    pub fn first_node(&self) -> NodeId {
        self.alloc[0].0
    }

    /// When the part on `node` joined.
    pub fn joined_at(&self, node: NodeId) -> Time {
        self.joined().iter().find(|(n, _)| *n == node).map_or(self.started_at, |(_, t)| *t)
    }

    /// What it is worth per hour at on-demand rates (µ$): every GPU it holds.
    pub fn rate(&self) -> u64 {
        self.gpu_rate.saturating_mul(self.gpus() as u64)
    }

    /// Its worth per hour (µ$) by when it began: the nodes of its start
    /// together, then each node it grew onto. Fair share counts a run's
    /// use from these.
    pub fn segments(&self) -> impl Iterator<Item = (u64, Time)> + '_ {
        if self.resized.is_none() {
            return Segments::One(std::iter::once((self.rate(), self.started_at)));
        }
        let grown: u32 = self
            .joined()
            .iter()
            .map(|(n, _)| self.alloc.iter().find(|(a, _)| a == n).map_or(0, |(_, m)| m.count_ones()))
            .sum();
        let first = self.gpu_rate.saturating_mul((self.gpus() - grown) as u64);
        Segments::Grown(std::iter::once((first, self.started_at)).chain(self.joined().iter().map(
            |&(node, at)| {
                let gpus = self.alloc.iter().find(|(a, _)| *a == node).map_or(0, |(_, m)| m.count_ones());
                (self.gpu_rate.saturating_mul(gpus as u64), at)
            },
        )))
    }

    /// Work since this instant is lost if the attempt is killed now.
    pub fn progress_saved_at(&self) -> Time {
        self.last_checkpoint_at.map_or(self.started_at, |ckpt| ckpt.max(self.started_at))
    }
}

/// [`Run::segments`]: one for a run whose nodes never changed.
enum Segments<A, B> {
    One(A),
    Grown(B),
}

impl<A: Iterator<Item = (u64, Time)>, B: Iterator<Item = (u64, Time)>> Iterator for Segments<A, B> {
    type Item = (u64, Time);

    fn next(&mut self) -> Option<(u64, Time)> {
        match self {
            Segments::One(a) => a.next(),
            Segments::Grown(b) => b.next(),
        }
    }
}

/// Why a running job is being drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainReason {
    /// Its GPUs are held for a reserved or on-demand job.
    Preempted { by: JobId },
    /// Fair-share preemption: its tenant is furthest above its share of
    /// the preemptible tier, and `tenant`, below it, waits.
    FairShare { tenant: TenantId },
    /// Its tenant borrows past its quota, and `tenant`, under its own
    /// quota of the model, waits for GPUs.
    Quota { tenant: TenantId },
    /// The operator drains its node.
    NodeDrain { node: NodeId },
    /// The operator reclaims preemptible capacity.
    Reclaim,
    /// A fire drill of the drain, asked for by the job's owner: the real
    /// notice and window, then the job is requeued at once. It counts as
    /// neither a preemption nor a failure.
    Drill,
}

/// A drain notice: notice now, forced kill at the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    pub notice_at: Time,
    pub deadline: Time,
    pub reason: DrainReason,
}

/// Where a job is in the core's view. Finished jobs leave the core; their
/// history is the edge's business.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Queued,
    /// Queued with GPUs held for it while its victims drain.
    Holding,
    Running,
    Draining,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub spec: JobSpec,
    /// The latest attempt started; `Attempt(0)` before the first.
    pub attempt: Attempt,
    pub preemptions: u32,
    pub phase: Phase,
    /// Present while running or draining.
    pub run: Option<Run>,
    /// Present while draining.
    pub notice: Option<Notice>,
    /// It was requeued by a drill since it was last preempted: the attempt
    /// after a drill resumes from no preemption, so it does not settle.
    pub drilled: bool,
    /// Its last attempt requeued itself outside a drain: the attempts since
    /// resume from no preemption and are no young work either, so neither
    /// settling nor fair share's `min_runtime` spares them. Were they
    /// spared, a job that requeued itself every minute would never be a
    /// victim, and another tenant's older, costlier job would be drained
    /// in its place. Cleared by a preemption.
    pub requeued_itself: bool,
    /// The node its last single-node run ended on: where its image is
    /// cached (and a node-local checkpoint lies). A placement among equally
    /// good free nodes takes this one.
    pub last_node: Option<NodeId>,
}

impl Job {
    /// Whether the job is *settling* at `now`: it has been preempted before,
    /// its current attempt is the one that resumed from that preemption
    /// (not one a drill requeued since), and it started less than
    /// `min_runtime` ago.
    ///
    /// Thrash is one job preempted again and again before it can make
    /// progress, and the lost-work policy invites it: a job that has just
    /// resumed has lost nothing since its start, so it is the cheapest
    /// victim there is. What protects it is run time since it resumed, not
    /// time since its notice: the drain and the wait in the queue make no
    /// progress, and a rule counted from the notice would often have
    /// expired before the job ran again. A first attempt is not settling:
    /// preempting a job once is the tier's bargain, not thrash, and
    /// sparing every young attempt would push preemptions onto jobs that
    /// have more unsaved work to lose. The preemption count is the core's
    /// own, which the edge restores after a restart, so the rule holds
    /// across one.
    ///
    /// A drill starts no settling period: were it to, a tenant could drill
    /// its job just before an on-demand job arrives and have another's
    /// drained in its place, as often as it liked, at no cost. Nor does a
    /// job's own requeue, for the same reason.
    pub fn settling(&self, now: Time, min_runtime: Span) -> bool {
        self.preemptions > 0
            && !self.drilled
            && !self.requeued_itself
            && self.run.as_ref().is_some_and(|run| now.saturating_since(run.started_at) < min_runtime)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStatus {
    /// Takes new work.
    Up,
    /// Takes no new work; its preemptible jobs are drained, others finish.
    Cordoned,
    /// Takes no new work, and its jobs run on undisturbed: its agent says it
    /// cannot deliver what happens there (its reports keep failing), so
    /// the node cannot be trusted with more until they get through.
    Unhealthy,
    /// Declared lost; its jobs were requeued.
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub gpu_model: String,
    pub gpus: u8,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: ReservationId,
    pub tenant: TenantId,
    pub gpu_model: GpuModelId,
    pub gpus: u32,
    pub start: Time,
    pub end: Time,
}

impl Reservation {
    pub fn is_active(&self, now: Time) -> bool {
        self.start <= now && now < self.end
    }
}

/// What the edge reports about an attempt's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// Exit code 0 with the completion marker (or, for a job that was not
    /// draining, a plain success).
    Completed,
    /// A failure; `requeue` says whether the job's retry budget allows
    /// another attempt. During a drain this is a preemption instead.
    Failed { requeue: bool },
    /// Stopped by its owner; never requeued.
    Cancelled,
    /// The job asked to go back to the queue (its own requeue): during a
    /// drain, its preemption; otherwise requeued, counted neither as a
    /// failure nor as a preemption, and its next attempts earn no
    /// protection (see [`Job::requeued_itself`]).
    Requeue,
    /// The attempt vanished (its node restarted, or never started it): it
    /// is requeued, counted neither as a failure nor as a preemption.
    Lost,
    /// The job runs again after every exit (a service, `--restart
    /// always`): requeued, counted neither as a failure nor as a preemption.
    Restart,
}

/// What [`State::promote`] did with a preemptible job whose deadline
/// needs it to run on-demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promoted {
    /// It was queued: it waits in the on-demand queue, in its place by
    /// submission time.
    Queued,
    /// It was running: it runs on as on-demand where it is, no longer a
    /// candidate victim.
    Running,
}

/// What the core did with an exited job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitEffect {
    Finished,
    Failed,
    Cancelled,
    /// Back in the queue; `preempted` when the exit ended a drain.
    Requeued {
        preempted: bool,
    },
    /// Preempted once more than its `max_preemptions` allows.
    PreemptionLimitReached,
    /// Requeued after its attempt was lost.
    RequeuedLost,
    /// Requeued to run again, as its restart policy asks.
    Restarted,
    /// Requeued at once after the exit that ended a drill: neither a
    /// preemption (its `max_preemptions` is not consulted) nor a failure.
    Drilled,
}
