//! Every option of Slurm's `sbatch`, `srun`, `squeue`, `sacct`, `sinfo`,
//! `scontrol` and `scancel` (25.11's, as their getopt tables have them)
//! and what Ebb does with it: honoured, ignored with the reason said once,
//! or refused naming what Ebb does instead. One table, so that what the
//! commands do and what `docs/slurm.md` says cannot part: the page's
//! table is made from this one (`docs_table`) and a test holds them
//! equal, and another holds this table to Slurm's own list
//! (`slurm-25.11-options.txt`).

use super::options::{
    Command::{self, Sacct, Sbatch, Scancel, Scontrol, Sinfo, Squeue, Srun},
    Kind::{Honoured, Ignored, Refused},
    Spec,
    Value::{self},
};

const NONE: Value = Value::None;
const REQUIRED: Value = Value::Required;
const OPTIONAL: Value = Value::Optional;

const BOTH: &[Command] = &[Sbatch, Srun];
const SBATCH: &[Command] = &[Sbatch];
const SRUN: &[Command] = &[Srun];
const SQUEUE: &[Command] = &[Squeue];
const SACCT: &[Command] = &[Sacct];
const SINFO: &[Command] = &[Sinfo];
const SCONTROL: &[Command] = &[Scontrol];
const SCANCEL: &[Command] = &[Scancel];

const NO_MEMORY: &str = "Ebb does not limit memory";
const WHOLE_GPUS: &str = "Ebb places whole GPUs and the nodes that have them free";
const NO_CPUS: &str = "Ebb places GPUs; a job has its node's CPUs";
const NO_MAIL: &str = "Ebb sends no mail; `ebb show` has the job's timeline";
const NO_EFFECT: &str = "it has no effect on Ebb";
const NO_FEATURES: &str = "Ebb has no node features; --gres=gpu:TYPE:N chooses a GPU model";
const EXCLUSIVE: &str =
    "Ebb gives a gang whole nodes, and one GPU to one job only; with no GPU count, sbatch --exclusive takes every GPU of the job's nodes";
const ONE_CLUSTER: &str = "Ebb is one cluster";
const ORDER: &str = "Ebb orders jobs by tier, then submission";
const RESERVATION: &str = "Ebb's reservations are the reserved tier's (--partition)";
const DEPENDENCY_FAILS: &str = "a job whose dependency can no longer be met fails";
const NO_KILL: &str = "a gang whose node is lost is requeued whole, or shrunk if it is elastic";
const OWN_MPI: &str = "tasks are started directly; MPI starts its own";
const TIME_IS_LIMIT: &str = "the time limit is --time";
const OLDEST_FIRST: &str = "jobs are listed oldest first";
const BY_NAME: &str = "nodes are listed by name";
const EVERY_JOB: &str = "sacct lists every job the server keeps";

const fn opt(
    commands: &'static [Command],
    long: &'static str,
    short: &'static str,
    value: Value,
    kind: super::options::Kind,
) -> Spec {
    Spec { commands, long, aliases: &[], short, value, kind }
}

/// The table, `sbatch` and `srun` first (their options are mostly one
/// set, as in Slurm), each command's by name.
pub static OPTIONS: &[Spec] = &[
    opt(SRUN, "accel-bind", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "account", "A", REQUIRED, Honoured),
    opt(BOTH, "acctg-freq", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SBATCH, "array", "a", REQUIRED, Honoured),
    opt(BOTH, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SBATCH, "batch", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "bb", "", REQUIRED, Refused("Ebb has no burst buffers")),
    opt(BOTH, "bbf", "", REQUIRED, Refused("Ebb has no burst buffers")),
    opt(SRUN, "bcast", "", OPTIONAL, Refused("Ebb copies no programs to nodes: put the program where every node of the job sees it")),
    opt(SRUN, "bcast-exclude", "", REQUIRED, Refused("Ebb copies no programs to nodes: put the program where every node of the job sees it")),
    opt(BOTH, "begin", "b", REQUIRED, Refused("Ebb starts a job as soon as it fits: hold it back with --dependency, or submit it later")),
    opt(BOTH, "chdir", "D", REQUIRED, Honoured),
    opt(BOTH, "cluster-constraint", "", REQUIRED, Ignored(ONE_CLUSTER)),
    opt(BOTH, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(BOTH, "comment", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "compress", "", OPTIONAL, Ignored(NO_EFFECT)),
    opt(BOTH, "consolidate-segments", "", NONE, Ignored(WHOLE_GPUS)),
    opt(BOTH, "constraint", "C", REQUIRED, Ignored(NO_FEATURES)),
    opt(BOTH, "container", "", REQUIRED, Refused("Ebb runs OCI images by reference (ebb submit --image, docs/images.md), not bundle paths")),
    opt(BOTH, "container-id", "", REQUIRED, Refused("Ebb runs OCI images by reference (ebb submit --image, docs/images.md), not bundle paths")),
    opt(BOTH, "context", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "contiguous", "", NONE, Ignored(WHOLE_GPUS)),
    opt(BOTH, "core-spec", "S", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "cores-per-socket", "", REQUIRED, Ignored(NO_CPUS)),
    opt(SRUN, "cpu-bind", "", REQUIRED, Ignored(NO_CPUS)).also(&["cpu_bind"]),
    opt(BOTH, "cpu-freq", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "cpus-per-gpu", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "cpus-per-task", "c", REQUIRED, Honoured),
    opt(BOTH, "deadline", "", REQUIRED, Refused("Slurm's --deadline removes a job that cannot end in time; Ebb's deadline runs it on-demand to make it (ebb submit --deadline)")),
    opt(SRUN, "debugger-test", "", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "delay-boot", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "dependency", "d", REQUIRED, Honoured),
    opt(SRUN, "disable-status", "X", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "distribution", "m", REQUIRED, Ignored(NO_CPUS)),
    opt(SRUN, "epilog", "", REQUIRED, Refused("Ebb runs no per-step epilog: run it in the batch script after srun")),
    opt(BOTH, "error", "e", REQUIRED, Honoured),
    opt(SRUN, "exact", "", NONE, Ignored(NO_CPUS)),
    opt(BOTH, "exclude", "x", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "exclusive", "", OPTIONAL, Ignored(EXCLUSIVE)),
    opt(BOTH, "export", "", REQUIRED, Honoured),
    opt(SBATCH, "export-file", "", REQUIRED, Refused("give the variables with --export")),
    opt(SBATCH, "external", "", NONE, Refused("Ebb runs only the jobs it starts")),
    opt(SRUN, "external-launcher", "", OPTIONAL, Refused("Ebb starts a step's tasks itself; run the launcher as the step")),
    opt(BOTH, "extra", "", REQUIRED, Ignored(NO_FEATURES)),
    opt(BOTH, "extra-node-info", "B", REQUIRED, Ignored(NO_CPUS)),
    opt(SBATCH, "get-user-env", "", NONE, Ignored(NO_EFFECT)),
    opt(SBATCH, "gid", "", REQUIRED, Refused("a job runs as the tenant whose token submits it")),
    opt(BOTH, "gpu-bind", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "gpu-freq", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "gpus", "G", REQUIRED, Honoured),
    opt(BOTH, "gpus-per-node", "", REQUIRED, Honoured),
    opt(BOTH, "gpus-per-socket", "", REQUIRED, Refused("Ebb places GPUs per node, not per socket: give --gpus-per-node")),
    opt(BOTH, "gpus-per-task", "", REQUIRED, Honoured),
    opt(BOTH, "gres", "", REQUIRED, Honoured),
    opt(BOTH, "gres-flags", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "help", "h", NONE, Honoured),
    opt(SRUN, "het-group", "", REQUIRED, Honoured).also(&["pack-group"]),
    opt(BOTH, "hint", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "hold", "H", NONE, Refused("Ebb holds no jobs: submit the job when it should be queued")),
    opt(SBATCH, "ignore-pbs", "", NONE, Ignored(NO_EFFECT)),
    opt(SRUN, "immediate", "I", OPTIONAL, Refused("Ebb queues the job until it fits: scancel it if it should not wait")),
    opt(BOTH, "input", "i", REQUIRED, Refused("a job's standard input is /dev/null")),
    opt(SRUN, "interactive", "", NONE, Refused("Ebb runs no interactive terminals")),
    opt(BOTH, "job-name", "J", REQUIRED, Honoured),
    opt(SRUN, "jobid", "", REQUIRED, Honoured),
    opt(SRUN, "kill-on-bad-exit", "K", OPTIONAL, Honoured),
    opt(SBATCH, "kill-on-invalid-dep", "", REQUIRED, Ignored(DEPENDENCY_FAILS)),
    opt(SRUN, "label", "l", NONE, Honoured),
    opt(BOTH, "licenses", "L", REQUIRED, Refused("Ebb has no licenses")),
    opt(BOTH, "mail-type", "", REQUIRED, Ignored(NO_MAIL)),
    opt(BOTH, "mail-user", "", REQUIRED, Ignored(NO_MAIL)),
    opt(BOTH, "mcs-label", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "mem", "", REQUIRED, Ignored(NO_MEMORY)),
    opt(BOTH, "mem-bind", "", REQUIRED, Ignored(NO_MEMORY)),
    opt(BOTH, "mem-per-cpu", "", REQUIRED, Ignored(NO_MEMORY)),
    opt(BOTH, "mem-per-gpu", "", REQUIRED, Ignored(NO_MEMORY)),
    opt(BOTH, "mincpus", "", REQUIRED, Ignored(NO_CPUS)),
    opt(SRUN, "mpi", "", REQUIRED, Ignored(OWN_MPI)),
    opt(SRUN, "msg-timeout", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "multi-prog", "", NONE, Refused("give every task one program that reads SLURM_PROCID")),
    opt(BOTH, "network", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "nice", "", OPTIONAL, Ignored(ORDER)),
    opt(SRUN, "no-allocate", "Z", NONE, Refused("srun needs an allocation: an Ebb job")),
    opt(BOTH, "no-kill", "k", OPTIONAL, Ignored(NO_KILL)),
    opt(SBATCH, "no-requeue", "", NONE, Honoured),
    opt(BOTH, "nodefile", "F", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(SBATCH, "nodelist", "w", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(SRUN, "nodelist", "w", REQUIRED, Honoured),
    opt(BOTH, "nodes", "N", REQUIRED, Honoured),
    opt(BOTH, "ntasks", "n", REQUIRED, Honoured),
    opt(BOTH, "ntasks-per-core", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "ntasks-per-gpu", "", REQUIRED, Honoured).also(&["ntasks-per-tres"]),
    opt(BOTH, "ntasks-per-node", "", REQUIRED, Honoured).also(&["tasks-per-node"]),
    opt(BOTH, "ntasks-per-socket", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "oom-kill-step", "", OPTIONAL, Ignored(NO_MEMORY)),
    opt(BOTH, "open-mode", "", REQUIRED, Honoured),
    opt(BOTH, "output", "o", REQUIRED, Honoured),
    opt(BOTH, "overcommit", "O", NONE, Ignored(NO_CPUS)),
    opt(SRUN, "overlap", "", OPTIONAL, Honoured),
    opt(BOTH, "oversubscribe", "s", NONE, Ignored(WHOLE_GPUS)),
    opt(SBATCH, "parsable", "", NONE, Honoured),
    opt(BOTH, "partition", "p", REQUIRED, Honoured),
    opt(BOTH, "prefer", "", REQUIRED, Ignored(NO_FEATURES)),
    opt(SRUN, "preserve-env", "E", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "priority", "", REQUIRED, Ignored(ORDER)),
    opt(BOTH, "profile", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "prolog", "", REQUIRED, Refused("Ebb runs no per-step prolog: run it in the batch script before srun")),
    opt(BOTH, "propagate", "", OPTIONAL, Ignored(NO_EFFECT)),
    opt(SRUN, "pty", "", OPTIONAL, Refused("Ebb runs no interactive terminals")),
    opt(BOTH, "qos", "q", REQUIRED, Honoured),
    opt(BOTH, "quiet", "Q", NONE, Honoured),
    opt(SRUN, "quit-on-interrupt", "", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "reboot", "", NONE, Ignored(NO_EFFECT)),
    opt(SRUN, "relative", "r", REQUIRED, Refused("steps start on the allocation's nodes in order: give -w to choose them")),
    opt(SBATCH, "requeue", "", OPTIONAL, Honoured),
    opt(BOTH, "reservation", "", REQUIRED, Ignored(RESERVATION)),
    opt(BOTH, "resources", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "resv-ports", "", OPTIONAL, Ignored(NO_EFFECT)),
    opt(BOTH, "segment", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(SRUN, "send-libs", "", OPTIONAL, Ignored(NO_EFFECT)),
    opt(BOTH, "signal", "", REQUIRED, Honoured),
    opt(SRUN, "slurmd-debug", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "sockets-per-node", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "spread-job", "", NONE, Ignored(WHOLE_GPUS)),
    opt(BOTH, "spread-segments", "", NONE, Ignored(WHOLE_GPUS)),
    opt(BOTH, "stepmgr", "", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "switches", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(SRUN, "task-epilog", "", REQUIRED, Refused("Ebb runs no per-task epilog: run it in the task's own command")),
    opt(SRUN, "task-prolog", "", REQUIRED, Refused("Ebb runs no per-task prolog: run it in the task's own command")),
    opt(BOTH, "test-only", "", NONE, Refused("Ebb does not estimate start times; `ebb sim` replays a workload")),
    opt(BOTH, "thread-spec", "", REQUIRED, Ignored(NO_CPUS)),
    opt(SRUN, "threads", "T", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "threads-per-core", "", REQUIRED, Ignored(NO_CPUS)),
    opt(BOTH, "time", "t", REQUIRED, Honoured),
    opt(BOTH, "time-min", "", REQUIRED, Ignored(TIME_IS_LIMIT)),
    opt(BOTH, "tmp", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "treewidth", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(BOTH, "tres-bind", "", REQUIRED, Ignored(WHOLE_GPUS)),
    opt(BOTH, "tres-per-task", "", REQUIRED, Refused("give GPUs with --gpus-per-task")),
    opt(SBATCH, "uid", "", REQUIRED, Refused("a job runs as the tenant whose token submits it")),
    opt(SRUN, "unbuffered", "u", NONE, Honoured),
    opt(BOTH, "usage", "", NONE, Honoured),
    opt(BOTH, "use-min-nodes", "", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "version", "V", NONE, Honoured),
    opt(SBATCH, "wait", "W", NONE, Refused("sbatch returns at submit: srun waits for its job, or poll with squeue")),
    opt(SRUN, "wait", "W", REQUIRED, Ignored(NO_EFFECT)),
    opt(SBATCH, "wait-all-nodes", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "wait-for-children", "", NONE, Ignored(NO_EFFECT)),
    opt(BOTH, "wckey", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SRUN, "whole", "", NONE, Ignored(NO_CPUS)),
    opt(SBATCH, "wrap", "", REQUIRED, Honoured),
    opt(SRUN, "x11", "", OPTIONAL, Refused("Ebb runs no interactive terminals")),
    // squeue
    opt(SQUEUE, "accounts", "A", REQUIRED, Honoured),
    opt(SQUEUE, "all", "a", NONE, Honoured),
    opt(SQUEUE, "array", "r", NONE, Honoured),
    opt(SQUEUE, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SQUEUE, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(SQUEUE, "expand-patterns", "", NONE, Ignored(NO_EFFECT)),
    opt(SQUEUE, "federation", "", NONE, Ignored(ONE_CLUSTER)),
    opt(SQUEUE, "Format", "O", REQUIRED, Honoured),
    opt(SQUEUE, "format", "o", REQUIRED, Honoured),
    opt(SQUEUE, "help", "", NONE, Honoured),
    opt(SQUEUE, "helpformat", "", NONE, Honoured).also(&["helpFormat"]),
    opt(SQUEUE, "helpstate", "", NONE, Honoured),
    opt(SQUEUE, "hide", "", NONE, Ignored(NO_EFFECT)),
    opt(SQUEUE, "iterate", "i", REQUIRED, Refused("squeue prints once: run it under watch(1)")),
    opt(SQUEUE, "jobs", "j", OPTIONAL, Honoured),
    opt(SQUEUE, "json", "", OPTIONAL, Honoured),
    opt(SQUEUE, "licenses", "L", REQUIRED, Refused("Ebb has no licenses")),
    opt(SQUEUE, "local", "", NONE, Honoured),
    opt(SQUEUE, "long", "l", NONE, Honoured),
    opt(SQUEUE, "me", "", NONE, Honoured),
    opt(SQUEUE, "name", "n", REQUIRED, Honoured),
    opt(SQUEUE, "noconvert", "", NONE, Ignored(NO_EFFECT)),
    opt(SQUEUE, "nodelist", "w", REQUIRED, Honoured).also(&["node", "nodes"]),
    opt(SQUEUE, "noheader", "h", NONE, Honoured),
    opt(SQUEUE, "notme", "", NONE, Refused("a tenant's token lists only that tenant's jobs")),
    opt(SQUEUE, "only-job-state", "", NONE, Honoured),
    opt(SQUEUE, "partitions", "p", REQUIRED, Honoured),
    opt(SQUEUE, "priority", "P", NONE, Ignored(NO_EFFECT)),
    opt(SQUEUE, "qos", "q", REQUIRED, Honoured),
    opt(SQUEUE, "reservation", "R", REQUIRED, Ignored(RESERVATION)),
    opt(SQUEUE, "running-over", "", REQUIRED, Honoured),
    opt(SQUEUE, "running-under", "", REQUIRED, Honoured),
    opt(SQUEUE, "sibling", "", NONE, Ignored(ONE_CLUSTER)).also(&["sib"]),
    opt(SQUEUE, "sort", "S", REQUIRED, Ignored(OLDEST_FIRST)),
    opt(SQUEUE, "start", "", NONE, Refused("Ebb does not estimate start times; `ebb sim` replays a workload")),
    opt(SQUEUE, "states", "t", REQUIRED, Honoured),
    opt(SQUEUE, "steps", "s", OPTIONAL, Honoured),
    opt(SQUEUE, "usage", "", NONE, Honoured),
    opt(SQUEUE, "user", "u", REQUIRED, Honoured).also(&["users"]),
    opt(SQUEUE, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(SQUEUE, "version", "V", NONE, Honoured),
    opt(SQUEUE, "yaml", "", OPTIONAL, Refused("Ebb prints JSON, not YAML: give --json")),
    // sacct
    opt(SACCT, "accounts", "A", REQUIRED, Honoured),
    opt(SACCT, "allclusters", "L", NONE, Ignored(ONE_CLUSTER)),
    opt(SACCT, "allocations", "Xt", NONE, Honoured),
    opt(SACCT, "allusers", "a", NONE, Honoured),
    opt(SACCT, "array", "", NONE, Honoured),
    opt(SACCT, "associations", "x", REQUIRED, Refused("Ebb has tenants, not associations: -u TENANT")),
    opt(SACCT, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SACCT, "batch-script", "B", NONE, Honoured),
    opt(SACCT, "brief", "b", NONE, Honoured),
    opt(SACCT, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(SACCT, "completion", "c", NONE, Refused("Ebb keeps no completion records apart from jobs: leave out -c")),
    opt(SACCT, "constraints", "C", REQUIRED, Refused("Ebb has no node features")),
    opt(SACCT, "delimiter", "", REQUIRED, Honoured),
    opt(SACCT, "duplicates", "D", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "endtime", "E", REQUIRED, Ignored(EVERY_JOB)),
    opt(SACCT, "env-vars", "", NONE, Refused("Ebb keeps no job's environment for sacct: `ebb show ID` has the job's request")),
    opt(SACCT, "expand-patterns", "", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "federation", "", NONE, Ignored(ONE_CLUSTER)),
    opt(SACCT, "file", "f", REQUIRED, Refused("sacct reads Ebb's server, not an accounting file")),
    opt(SACCT, "flags", "F", REQUIRED, Ignored(NO_EFFECT)),
    opt(SACCT, "format", "o", REQUIRED, Honoured).also(&["fields"]),
    opt(SACCT, "gid", "g", REQUIRED, Refused("a job runs as the tenant whose token submits it")).also(&["group"]),
    opt(SACCT, "help", "h", NONE, Honoured),
    opt(SACCT, "helpformat", "e", NONE, Honoured).also(&["help-fields"]),
    opt(SACCT, "helpreason", "", NONE, Honoured),
    opt(SACCT, "helpstate", "", NONE, Honoured),
    opt(SACCT, "jobs", "j", REQUIRED, Honoured),
    opt(SACCT, "json", "", OPTIONAL, Honoured),
    opt(SACCT, "local", "", NONE, Honoured),
    opt(SACCT, "long", "l", NONE, Honoured),
    opt(SACCT, "name", "", REQUIRED, Honoured),
    opt(SACCT, "ncpus", "I", REQUIRED, Ignored(NO_CPUS)),
    opt(SACCT, "nnodes", "i", REQUIRED, Honoured),
    opt(SACCT, "noconvert", "", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "nodelist", "N", REQUIRED, Honoured),
    opt(SACCT, "noheader", "n", NONE, Honoured),
    opt(SACCT, "parsable", "p", NONE, Honoured),
    opt(SACCT, "parsable2", "P", NONE, Honoured),
    opt(SACCT, "partition", "r", REQUIRED, Honoured),
    opt(SACCT, "qos", "q", REQUIRED, Honoured),
    opt(SACCT, "reason", "R", REQUIRED, Honoured),
    opt(SACCT, "starttime", "S", REQUIRED, Ignored(EVERY_JOB)),
    opt(SACCT, "state", "s", REQUIRED, Honoured),
    opt(SACCT, "timelimit-max", "K", REQUIRED, Refused("give -o TimelimitRaw and compare")),
    opt(SACCT, "timelimit-min", "k", REQUIRED, Refused("give -o TimelimitRaw and compare")),
    opt(SACCT, "truncate", "T", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "units", "", REQUIRED, Ignored(NO_MEMORY)),
    opt(SACCT, "usage", "U", NONE, Honoured),
    opt(SACCT, "use-local-uid", "", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "user", "u", REQUIRED, Honoured).also(&["uid"]),
    opt(SACCT, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(SACCT, "version", "V", NONE, Honoured),
    opt(SACCT, "wckeys", "W", REQUIRED, Refused("Ebb has no wckeys")),
    opt(SACCT, "whole-hetjob", "", OPTIONAL, Refused("a heterogeneous job's components are Ebb jobs of their own: list them with -j")),
    opt(SACCT, "yaml", "", OPTIONAL, Refused("Ebb prints JSON, not YAML: give --json")),
    // sinfo
    opt(SINFO, "all", "a", NONE, Honoured),
    opt(SINFO, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SINFO, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(SINFO, "dead", "d", NONE, Honoured),
    opt(SINFO, "exact", "e", NONE, Ignored(NO_EFFECT)),
    opt(SINFO, "federation", "", NONE, Ignored(ONE_CLUSTER)),
    opt(SINFO, "format", "o", REQUIRED, Honoured),
    opt(SINFO, "Format", "O", REQUIRED, Honoured),
    opt(SINFO, "future", "F", NONE, Ignored(NO_EFFECT)),
    opt(SINFO, "help", "", NONE, Honoured),
    opt(SINFO, "helpformat", "", NONE, Honoured).also(&["helpFormat"]),
    opt(SINFO, "helpstate", "", NONE, Honoured),
    opt(SINFO, "hide", "", NONE, Ignored(NO_EFFECT)),
    opt(SINFO, "iterate", "i", REQUIRED, Refused("sinfo prints once: run it under watch(1)")),
    opt(SINFO, "json", "", OPTIONAL, Honoured),
    opt(SINFO, "list-reasons", "R", NONE, Honoured),
    opt(SINFO, "local", "", NONE, Honoured),
    opt(SINFO, "long", "l", NONE, Honoured),
    opt(SINFO, "noconvert", "", NONE, Ignored(NO_EFFECT)),
    opt(SINFO, "Node", "N", NONE, Honoured),
    opt(SINFO, "nodes", "n", REQUIRED, Honoured),
    opt(SINFO, "noheader", "h", NONE, Honoured),
    opt(SINFO, "partition", "p", REQUIRED, Honoured),
    opt(SINFO, "reservation", "T", NONE, Refused("Ebb's reservations are the reserved tier's: `ebb reservations`")),
    opt(SINFO, "responding", "r", NONE, Honoured),
    opt(SINFO, "sort", "S", REQUIRED, Ignored(BY_NAME)),
    opt(SINFO, "states", "t", REQUIRED, Honoured),
    opt(SINFO, "summarize", "s", NONE, Honoured),
    opt(SINFO, "usage", "", NONE, Honoured),
    opt(SINFO, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(SINFO, "version", "V", NONE, Honoured),
    opt(SINFO, "yaml", "", OPTIONAL, Refused("Ebb prints JSON, not YAML: give --json")),
    // scontrol
    opt(SCONTROL, "all", "a", NONE, Ignored(NO_EFFECT)),
    opt(SCONTROL, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SCONTROL, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(SCONTROL, "details", "d", NONE, Ignored(NO_EFFECT)),
    opt(SCONTROL, "federation", "", NONE, Ignored(ONE_CLUSTER)),
    opt(SCONTROL, "future", "F", NONE, Ignored(NO_EFFECT)),
    opt(SCONTROL, "help", "h", NONE, Honoured).also(&["usage"]),
    opt(SCONTROL, "hide", "", NONE, Ignored(NO_EFFECT)),
    opt(SCONTROL, "json", "", OPTIONAL, Refused("scontrol prints Key=Value; squeue, sacct and sinfo give --json")),
    opt(SCONTROL, "local", "", NONE, Honoured),
    opt(SCONTROL, "oneliner", "o", NONE, Honoured),
    opt(SCONTROL, "quiet", "Q", NONE, Honoured),
    opt(SCONTROL, "sibling", "", NONE, Ignored(ONE_CLUSTER)),
    opt(SCONTROL, "uid", "u", REQUIRED, Refused("a job runs as the tenant whose token submits it")),
    opt(SCONTROL, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(SCONTROL, "version", "V", NONE, Honoured),
    opt(SCONTROL, "yaml", "", OPTIONAL, Refused("scontrol prints Key=Value; squeue, sacct and sinfo give --json")),
    // scancel
    opt(SCANCEL, "account", "A", REQUIRED, Honoured),
    opt(SCANCEL, "admin-comment", "", REQUIRED, Ignored(NO_EFFECT)),
    opt(SCANCEL, "autocomplete", "", REQUIRED, Refused("Ebb's Slurm commands have no shell completion")),
    opt(SCANCEL, "batch", "b", NONE, Honoured),
    opt(SCANCEL, "clusters", "M", REQUIRED, Ignored(ONE_CLUSTER)).also(&["cluster"]),
    opt(SCANCEL, "cron", "c", NONE, Refused("Ebb has no cron jobs")),
    opt(SCANCEL, "ctld", "", NONE, Ignored(NO_EFFECT)),
    opt(SCANCEL, "full", "f", NONE, Honoured),
    opt(SCANCEL, "help", "", NONE, Honoured),
    opt(SCANCEL, "hurry", "H", NONE, Ignored(NO_EFFECT)),
    opt(SCANCEL, "interactive", "i", NONE, Refused("scancel asks nothing: it cancels what it is given")),
    opt(SCANCEL, "me", "", NONE, Honoured),
    opt(SCANCEL, "name", "n", REQUIRED, Honoured).also(&["jobname"]),
    opt(SCANCEL, "nodelist", "w", REQUIRED, Honoured),
    opt(SCANCEL, "partition", "p", REQUIRED, Honoured),
    opt(SCANCEL, "qos", "q", REQUIRED, Honoured),
    opt(SCANCEL, "quiet", "Q", NONE, Honoured),
    opt(SCANCEL, "reservation", "R", REQUIRED, Ignored(RESERVATION)),
    opt(SCANCEL, "sibling", "", REQUIRED, Ignored(ONE_CLUSTER)),
    opt(SCANCEL, "signal", "s", REQUIRED, Honoured),
    opt(SCANCEL, "state", "t", REQUIRED, Honoured),
    opt(SCANCEL, "usage", "", NONE, Honoured),
    opt(SCANCEL, "user", "u", REQUIRED, Honoured),
    opt(SCANCEL, "verbose", "v", NONE, Ignored(NO_EFFECT)),
    opt(SCANCEL, "version", "V", NONE, Honoured),
    opt(SCANCEL, "wckey", "", REQUIRED, Ignored(NO_EFFECT)),
];

/// How an option is written: `-A, --account=VALUE`, with its other names.
fn written(spec: &Spec) -> String {
    let value = match spec.value {
        Value::None => "",
        Value::Required => "=VALUE",
        Value::Optional => "[=VALUE]",
    };
    let mut names: Vec<String> = spec.short.chars().map(|c| format!("-{c}")).collect();
    names.push(format!("--{}{value}", spec.long));
    names.extend(spec.aliases.iter().map(|a| format!("--{a}")));
    names.join(", ")
}

fn said(kind: super::options::Kind) -> String {
    match kind {
        Honoured => "honoured".into(),
        Ignored(why) => format!("ignored: {why}"),
        Refused(instead) => format!("refused: {instead}"),
    }
}

/// Pyxis' options (0.24's `spank_opts`), as a site with the plugin has
/// them on `srun` and `sbatch`: a step's tasks in an OCI image, run
/// unprivileged (`slurm/pyxis`); a batch script itself stays on its node. `--help` marks them `[pyxis]`, as the
/// plugin's own lines are, which is how tools (SkyPilot) find the plugin.
pub static PYXIS_OPTIONS: [Spec; 32] = on_srun_and_sbatch([
    opt(SRUN, "container-image", "", REQUIRED, Honoured),
    opt(SRUN, "container-mounts", "", REQUIRED, Honoured),
    opt(SRUN, "container-workdir", "", REQUIRED, Honoured),
    opt(SRUN, "container-name", "", REQUIRED, Honoured),
    opt(SRUN, "container-save", "", REQUIRED, Refused(NO_SAVE)),
    opt(SRUN, "container-mount-home", "", NONE, Honoured),
    opt(SRUN, "no-container-mount-home", "", NONE, Honoured),
    opt(SRUN, "container-remap-root", "", NONE, Honoured),
    opt(SRUN, "no-container-remap-root", "", NONE, Honoured),
    opt(SRUN, "container-entrypoint", "", NONE, Honoured),
    opt(SRUN, "no-container-entrypoint", "", NONE, Honoured),
    opt(SRUN, "container-entrypoint-log", "", NONE, Ignored("the entrypoint's output is the task's own")),
    opt(SRUN, "container-writable", "", NONE, Honoured),
    opt(SRUN, "container-readonly", "", NONE, Honoured),
    opt(SRUN, "container-env", "", REQUIRED, Honoured),
    opt(SRUN, "container-unshare", "", REQUIRED, Honoured),
]);

/// Pyxis' options as `srun` has them, then as `sbatch` has them: each
/// refused there, naming what to do instead.
const fn on_srun_and_sbatch(srun: [Spec; 16]) -> [Spec; 32] {
    let mut both = [srun[0]; 32];
    let mut i = 0;
    while i < 16 {
        both[i] = srun[i];
        both[16 + i] = Spec { commands: SBATCH, kind: Refused(BATCH_ON_NODE), ..srun[i] };
        i += 1;
    }
    both
}

const BATCH_ON_NODE: &str =
    "a batch script runs on its first node: give the --container-* options to its srun lines, \
     or run the whole job in an image (ebb submit --image)";
const NO_SAVE: &str =
    "Ebb writes no image files on nodes: a named container keeps its changes for the job's steps; push an image from a registry";

/// Whether `spec` is one of Pyxis' options.
pub fn is_pyxis(spec: &Spec) -> bool {
    PYXIS_OPTIONS.iter().any(|p| std::ptr::eq(p, spec))
}

/// `command`'s options by name, as `--help` and the page list them.
fn by_name(command: Command) -> Vec<&'static Spec> {
    let mut specs: Vec<&Spec> = super::options::specs(command).collect();
    specs.sort_by_key(|s| (s.long.to_ascii_lowercase(), s.long));
    specs
}

/// `--help` and `--usage`: every option of the command and what Ebb does
/// with it.
pub fn usage(command: Command) -> String {
    let mut out = format!(
        "Usage: {} [OPTIONS...]\nEbb's {0}: Slurm 25.11's options, each honoured, ignored or refused on Ebb \
         (docs/slurm.md)\n",
        command.name()
    );
    for spec in by_name(command) {
        let plugin = if is_pyxis(spec) { "[pyxis] " } else { "" };
        out.push_str(&format!("  {:<36} {plugin}{}\n", written(spec), said(spec.kind)));
    }
    out
}

/// The page's table: a section per command, a row per option.
#[cfg(test)]
pub fn docs_table() -> String {
    let mut out = String::new();
    for command in Command::ALL {
        let specs = by_name(command);
        let count = |f: fn(&Spec) -> bool| specs.iter().filter(|s| f(s)).count();
        out.push_str(&format!(
            "#### {}\n\n{} options: {} honoured, {} ignored, {} refused.\n\n| Option | On Ebb |\n|---|---|\n",
            command.name(),
            specs.len(),
            count(|s| s.kind == Honoured),
            count(|s| matches!(s.kind, Ignored(_))),
            count(|s| matches!(s.kind, Refused(_))),
        ));
        for spec in specs {
            let names: Vec<String> = written(spec).split(", ").map(|n| format!("`{n}`")).collect();
            let plugin = if is_pyxis(spec) { "[pyxis] " } else { "" };
            let said = said(spec.kind).replace('|', "\\|");
            out.push_str(&format!("| {} | {plugin}{said} |\n", names.join(", ")));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::options::{parse, specs, Kind};
    use super::*;

    /// Every option Slurm 25.11's seven commands take (their getopt
    /// tables, `slurm-25.11-options.txt`) is in the table, with the same
    /// letters and the same kind of value, and Ebb reads it: honoured or
    /// ignored, or refused naming what Ebb does instead, never
    /// "unrecognized"; and the table has no option Slurm lacks.
    #[test]
    fn every_option_of_slurm_25_11_is_in_the_table_as_slurm_reads_it() {
        let listed = include_str!("slurm-25.11-options.txt");
        let mut seen: Vec<(Command, &str)> = Vec::new();
        let mut lines = 0;
        for line in listed.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [command, long, short, value] = words[..] else { panic!("a line of four words: {line}") };
            let command = Command::ALL.into_iter().find(|c| c.name() == command).expect(command);
            let value = match value {
                "none" => Value::None,
                "required" => Value::Required,
                "optional" => Value::Optional,
                other => panic!("{line}: value {other}"),
            };
            let spec = match long {
                "-" => specs(command).find(|s| s.short.contains(short)),
                long => specs(command).find(|s| s.long == long || s.aliases.contains(&long)),
            };
            let spec = spec.unwrap_or_else(|| panic!("{line}: not in the table"));
            assert_eq!(spec.value, value, "{line}");
            if short != "-" {
                assert!(spec.short.contains(short), "{line}: the table has -{}", spec.short);
            }
            // Read from the command line in each form Slurm takes.
            let arg = |name: &str| match value {
                Value::None => vec![name.to_string()],
                _ => vec![name.to_string(), "1".to_string()],
            };
            let mut forms = Vec::new();
            if long != "-" {
                forms.push(arg(&format!("--{long}")));
            }
            if short != "-" {
                forms.push(arg(&format!("-{short}")));
            }
            for form in forms {
                let form = match (value, form.as_slice()) {
                    (Value::Optional, [name, v]) if name.starts_with("--") => vec![format!("{name}={v}")],
                    (Value::Optional, [name, v]) => vec![format!("{name}{v}")],
                    _ => form,
                };
                match (parse(command, &form, ""), spec.kind) {
                    (Ok((given, _)), Kind::Honoured | Kind::Ignored(_)) => {
                        assert_eq!(given.len(), 1, "{line}");
                        assert_eq!(given[0].0, spec.long, "{line}");
                    }
                    (Err(e), Kind::Refused(instead)) => {
                        assert!(e.to_string().ends_with(&format!("not on Ebb: {instead}")), "{line}: {e}")
                    }
                    (other, kind) => {
                        panic!("{} {form:?} ({kind:?}): {:?}", command.name(), other.map(|g| g.0))
                    }
                }
            }
            seen.push((command, spec.long));
            lines += 1;
        }
        assert!(lines > 400, "the list is whole: {lines} lines");
        for command in Command::ALL {
            for spec in specs(command).filter(|s| !is_pyxis(s)) {
                assert!(
                    seen.contains(&(command, spec.long)),
                    "{} --{}: Slurm 25.11 has no such option",
                    command.name(),
                    spec.long
                );
            }
        }
    }

    /// Pyxis' options are on `srun` and `sbatch` as the plugin has them,
    /// and `--help` marks them `[pyxis]` as the plugin's lines are.
    #[test]
    fn every_option_of_pyxis_is_in_the_table_and_marked_in_help() {
        let listed = include_str!("pyxis-0.24-options.txt");
        let mut lines = 0;
        for line in listed.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let [long, value] = line.split_whitespace().collect::<Vec<_>>()[..] else { panic!("{line}") };
            let value = if value == "none" { Value::None } else { Value::Required };
            for command in [Command::Srun, Command::Sbatch] {
                let spec = specs(command).find(|s| s.long == long).unwrap_or_else(|| panic!("{line}"));
                assert!(is_pyxis(spec), "{line}");
                assert_eq!(spec.value, value, "{line}");
                let help = usage(command);
                let shown = help.lines().find(|l| l.contains(&format!("--{long}"))).expect(long);
                assert!(shown.contains("[pyxis] "), "{shown}");
            }
            lines += 1;
        }
        assert_eq!(lines, 16);
        assert_eq!(PYXIS_OPTIONS.len(), 2 * lines, "the table has no Pyxis option Pyxis lacks");
    }

    /// `docs/slurm.md`'s table is this one's. `EBB_WRITE_DOCS=1` writes it.
    #[test]
    fn the_pages_option_table_is_made_from_this_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/slurm.md");
        let page = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = ("<!-- slurm-options -->\n", "<!-- end slurm-options -->");
        let from = page.find(begin).expect("the page marks the table") + begin.len();
        let to = page.find(end).expect("the page marks the table's end");
        let table = docs_table();
        if std::env::var_os("EBB_WRITE_DOCS").is_some() {
            std::fs::write(&path, format!("{}{table}{}", &page[..from], &page[to..])).unwrap();
            return;
        }
        assert!(
            page[from..to] == table,
            "docs/slurm.md's option table differs from the code's: EBB_WRITE_DOCS=1 cargo test -p ebb \
             the_pages_option_table writes it"
        );
    }

    #[test]
    fn help_lists_every_option_with_what_ebb_does() {
        let text = usage(Command::Squeue);
        assert!(text.starts_with("Usage: squeue [OPTIONS...]\n"));
        assert!(text.contains("  -j, --jobs[=VALUE]"), "{text}");
        assert!(text.contains("-M, --clusters=VALUE, --cluster"), "{text}");
        assert_eq!(text.lines().count(), specs(Command::Squeue).count() + 2);
    }
}
