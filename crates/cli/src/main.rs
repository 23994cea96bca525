//! `ebb`: one binary, one subcommand per job. This file only parses
//! arguments and hands them to the library crates.

mod client;
mod command_line;
mod commands;
mod daemons;
mod drill;
mod error;
mod money;
mod output;
mod shown;
mod sim;
mod slurm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use client::Connection;

#[derive(Parser)]
#[command(name = "ebb", version, about = "Preemptible GPU compute with a five-minute drain window")]
struct Cli {
    #[command(flatten)]
    before: client::BeforeCommand,
    #[command(subcommand)]
    command: Command,
}

/// Each command that talks to a server takes `--server` and `--token`
/// (`Connection`, also from `EBB_SERVER` / `EBB_TOKEN`); those that run
/// things here (`server`, `up`, `sim`, ...) take neither, so their help
/// does not offer them.
#[derive(Subcommand)]
enum Command {
    /// Run the control plane.
    Server(daemons::ServerArgs),
    /// Run a node agent.
    Agent(daemons::AgentArgs),
    /// Run a whole local cluster (server + agents with simulated GPUs).
    Up(daemons::UpArgs),
    /// Submit a job: ebb submit [flags] -- CMD ARGS..., or a job script.
    Submit {
        #[command(flatten)]
        args: commands::SubmitArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// List jobs: the newest 100 as a table (arrays as one row), with why
    /// each waiting job waits.
    Jobs {
        #[command(flatten)]
        args: commands::JobsArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// Show a job with its event timeline.
    Show {
        /// The job's id.
        id: u64,
        /// Also why the checkpoint interval is what it is, for a job that
        /// has not reported a checkpoint (for one that has, always).
        #[arg(long)]
        why: bool,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Print a job's output (-f follows it live).
    Logs {
        /// The job's id.
        id: u64,
        /// Keep printing what the job writes until it ends.
        #[arg(short, long)]
        follow: bool,
        /// Write the job's output as it is. By default, on a terminal, its
        /// control characters (other than line breaks and tabs) are shown
        /// as escapes (\x1b), so that a job cannot send commands to the
        /// terminal of whoever reads its log.
        #[arg(long)]
        raw: bool,
        /// Begin each line of a gang's output with the node that wrote it
        /// (`node-1: ...`), as `srun -l` does. A gang's lines are whole
        /// either way, never two nodes' in one.
        #[arg(short, long)]
        label: bool,
        /// Only the last N lines (then, with -f, what comes after them).
        #[arg(short = 'n', long, value_name = "N", conflicts_with = "json")]
        tail: Option<usize>,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Cancel jobs: each ID given, and with --array every task of the
    /// array (its id is its first task's) not yet ended.
    Cancel {
        /// Jobs to cancel.
        #[arg(value_name = "ID", required_unless_present = "array")]
        ids: Vec<u64>,
        /// A whole array or sweep, by its id.
        #[arg(long, value_name = "ID")]
        array: Option<u64>,
        /// How long a running job has between its notice and SIGTERM and
        /// the SIGKILL of what is left: 10s by default (the drain window
        /// if shorter), at most the cluster's drain window (500ms, 3s, 1m).
        #[arg(long, value_name = "DURATION", value_parser = ebb_core::Span::parse)]
        grace: Option<ebb_core::Span>,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// A fire drill of a running preemptible job: a real drain notice with
    /// the cluster's window, requeued at once, followed until its next
    /// attempt resumes; exits 0 only if the job is ready for preemption.
    Drill {
        #[command(flatten)]
        args: drill::DrillArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// What the cluster has and what a job of each tier could get now, per
    /// GPU model (anyone; as sinfo).
    Capacity {
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// List nodes; remove one, rotate the join token (admin).
    #[command(args_conflicts_with_subcommands = true)]
    Nodes {
        #[command(subcommand)]
        command: Option<commands::NodesCommand>,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Drain a node for maintenance (admin).
    Drain {
        /// The node's name, as `ebb nodes` lists it.
        node: String,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Put a drained node back into service, with its GPUs out of service
    /// for a fault; or, with --gpu, one GPU (admin).
    Undrain {
        /// The node's name, as `ebb nodes` lists it.
        node: String,
        /// Return only this GPU (its index on the node) to service; without
        /// it, the node and every GPU of it out of service return.
        #[arg(long, value_name = "N")]
        gpu: Option<u8>,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Take back preemptible capacity with the drain window (admin).
    #[command(group(clap::ArgGroup::new("what").required(true).args(["gpus", "release"])))]
    Reclaim {
        /// GPUs to take back from preemptible work.
        #[arg(long)]
        gpus: Option<u32>,
        /// Lift the reclaim: preemptible work may use any idle GPU again.
        #[arg(long)]
        release: bool,
        /// The model (needed when nodes have several).
        #[arg(long)]
        gpu_model: Option<String>,
        #[command(flatten)]
        out: output::JsonFlag,
        #[command(flatten)]
        conn: Connection,
    },
    /// Manage tenants (admin).
    Tenant {
        #[command(subcommand)]
        command: commands::TenantCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// The price book (set: admin).
    Price {
        #[command(subcommand)]
        command: money::PriceCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// Reservations: committed GPUs of a model for a tenant over a period.
    Reservation {
        #[command(subcommand)]
        command: money::ReservationCommand,
        #[command(flatten)]
        conn: Connection,
    },
    /// A tenant's invoice for a period.
    Bill {
        #[command(flatten)]
        args: money::BillArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// Utilisation and revenue by tier for a period (admin).
    Report {
        #[command(flatten)]
        args: money::ReportArgs,
        #[command(flatten)]
        conn: Connection,
    },
    /// Replay job traces through the scheduler in virtual time.
    Sim(sim::SimArgs),
    /// Slurm's commands (sbatch, srun, squeue, scancel, sacct, scontrol,
    /// sinfo) on this cluster: ebb slurm install ~/bin
    Slurm {
        #[command(subcommand)]
        command: SlurmCommand,
    },
    /// Print shell completions: ebb completions bash > /etc/bash_completion.d/ebb
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): ebb man | man -l -
    Man {
        /// Write a page per command (ebb.1, ebb-submit.1, ...) into DIR instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
}

/// `ebb completions SHELL`, from the command's own definition.
fn completions(shell: clap_complete::Shell) -> String {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ebb", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `ebb man`: the page of `ebb`, or with `--out-dir` one per command.
fn man(out_dir: Option<std::path::PathBuf>) -> Result<String, error::CliError> {
    use clap::CommandFactory;
    let command = Cli::command();
    match out_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(error::given("--out-dir", &dir))?;
            clap_mangen::generate_to(command, &dir).map_err(error::given("--out-dir", &dir))?;
            Ok(format!("wrote the manual pages into {}\n", dir.display()))
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command).render(&mut out).map_err(error::CliError::Output)?;
            Ok(String::from_utf8_lossy(&out).into_owned())
        }
    }
}

/// Writes command output, with no control character a tenant put in it
/// ([`shown`]); a closed pipe (`ebb ... | head`) is not an error.
fn write_stdout(text: &str) -> Result<(), error::CliError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let text = shown::terminal_safe(text);
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(error::CliError::Output(e)),
        _ => Ok(()),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
}

async fn dispatch(cli: Cli) -> Result<(), error::CliError> {
    let before = cli.before;
    let here = |what: &str| before.refuse(what);
    let text = match cli.command {
        Command::Server(args) => {
            here("ebb server")?;
            init_logging();
            return daemons::server(args).await;
        }
        Command::Agent(mut args) => {
            before.refuse_token("ebb agent")?;
            args.server = before.server.clone().or(args.server);
            init_logging();
            return daemons::agent(args).await;
        }
        Command::Up(args) => {
            here("ebb up")?;
            return daemons::up(args).await;
        }
        Command::Sim(args) => {
            here("ebb sim")?;
            return sim::run(args);
        }
        Command::Slurm { command: SlurmCommand::Install { dir } } => {
            here("ebb slurm install")?;
            slurm::install(&dir)?
        }
        Command::Completions { shell } => {
            here("ebb completions")?;
            completions(shell)
        }
        Command::Man { out_dir } => {
            here("ebb man")?;
            man(out_dir)?
        }
        Command::Submit { args, conn } => commands::submit(&before.or(conn), &args).await?,
        Command::Jobs { args, conn } => commands::jobs(&before.or(conn), &args).await?,
        Command::Show { id, why, out, conn } => commands::show(&before.or(conn), id, why, &out).await?,
        Command::Logs { id, follow, raw, label, tail, out, conn } => {
            use std::io::IsTerminal;
            let shown =
                commands::LogView { json: out.json, escape: !raw && std::io::stdout().is_terminal(), label };
            return commands::logs(&before.or(conn), id, follow, tail, shown).await;
        }
        Command::Cancel { ids, array, grace, out, conn } => {
            commands::cancel(&before.or(conn), &ids, array, grace, &out).await?
        }
        Command::Drill { args, conn } => return drill::drill(&before.or(conn), &args).await,
        Command::Capacity { out, conn } => commands::capacity(&before.or(conn), &out).await?,
        Command::Nodes { command: None, out, conn } => commands::nodes(&before.or(conn), &out).await?,
        Command::Nodes { command: Some(command), conn, .. } => {
            commands::nodes_command(&before.or(conn), &command).await?
        }
        Command::Drain { node, out, conn } => commands::drain(&before.or(conn), &node, &out).await?,
        Command::Undrain { node, gpu, out, conn } => {
            commands::undrain(&before.or(conn), &node, gpu, &out).await?
        }
        Command::Reclaim { gpus: Some(gpus), gpu_model, out, conn, .. } => {
            commands::reclaim(&before.or(conn), gpus, gpu_model, &out).await?
        }
        Command::Reclaim { gpus: None, gpu_model, out, conn, .. } => {
            commands::release(&before.or(conn), gpu_model, &out).await?
        }
        Command::Tenant { command, conn } => commands::tenant(&before.or(conn), &command).await?,
        Command::Price { command, conn } => money::price(&before.or(conn), &command).await?,
        Command::Reservation { command, conn } => money::reservation(&before.or(conn), &command).await?,
        Command::Bill { args, conn } => money::bill(&before.or(conn), &args).await?,
        Command::Report { args, conn } => money::report(&before.or(conn), &args).await?,
    };
    write_stdout(&text)
}

#[derive(Subcommand)]
enum SlurmCommand {
    /// Make links named sbatch, srun, squeue, scancel, sacct, scontrol and
    /// sinfo to this program in DIR; with DIR on PATH, they talk to the
    /// server in EBB_SERVER with EBB_TOKEN, as ebb does.
    Install {
        /// Where the links go (made if missing).
        dir: std::path::PathBuf,
    },
}

/// mimalloc, not glibc's malloc: in a 10,000-node fleet's fill, `perf`
/// put a sixth of the server's time in glibc's allocator (what each
/// allocator cost there: docs/simulated-fleet.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `ebb container-shim ...`: what an agent starts for an attempt in an
/// image (see `ebb_agent::container`); not for people. Before any thread
/// exists, since it blocks the signals it passes on.
fn container_shim(args: &[String]) -> ! {
    let value = |flag: &str| {
        args.windows(2).find(|w| w[0] == flag).map(|w| std::path::PathBuf::from(&w[1])).unwrap_or_else(|| {
            eprintln!("ebb container-shim: {flag} is needed (this command is the agent's own)");
            std::process::exit(ebb_agent::container::NOT_STARTED)
        })
    };
    let id = value("--id").display().to_string();
    ebb_agent::container::shim(
        &value("--runtime"),
        &value("--state"),
        &value("--bundle"),
        &id,
        &value("--lower"),
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("container-shim") {
        container_shim(&args[2..]);
    }
    // A Slurm job's batch step, which the agent starts (not for people).
    if args.get(1).map(String::as_str) == Some("slurm-batch") {
        slurm::batch_step(&args[2..]);
    }
    // One task of a Slurm step into its container (srun's own, not for
    // people): before any thread exists, as a user namespace needs.
    if args.get(1).map(String::as_str) == Some("slurm-container") {
        slurm::enter_container(&args[2..]);
    }
    // Run as sbatch, srun, squeue, ...: Slurm's front door.
    if let Some(name) = args.first().and_then(|a| slurm::called_as(a)) {
        return slurm::main(name, args[1..].to_vec());
    }
    let cli: Cli = match command_line::parse(&args) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", shown::terminal_safe(&e.to_string()));
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// What clap alone would answer with an unrelated tip or the wrong
    /// word: a flag the command does not take because it runs its own
    /// server, a negative number, a duration in two words.
    #[test]
    fn flags_that_do_not_apply_and_values_misread_are_named() {
        let words = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let error =
            |line: &str| super::command_line::parse::<Cli>(&words(line)).err().expect(line).to_string();
        for (line, says) in [
            ("ebb up --server http://x", "ebb up takes no --server: it runs its own server and agents"),
            ("ebb sim --token t", "ebb sim takes no --token: it simulates a cluster in this process"),
            ("ebb server --server=http://x", "ebb server takes no --server: it is the server"),
            ("ebb submit --gpus -1 -- true", "invalid value '-1' for '--gpus <N|MIN:MAX>'"),
            ("ebb up --gpus-per-node -1", "invalid value '-1' for '--gpus-per-node"),
            ("ebb up --drain-window 5 minutes", "--drain-window 5 minutes: a duration is one word, as 5m"),
            ("ebb up --drain-window 30 s", "--drain-window 30 s: a duration is one word, as 30s"),
        ] {
            let said = error(line);
            assert!(said.contains(says), "{line}: {said}");
        }
        // Where they do apply, they are taken.
        for line in
            ["ebb up --drain-window 5m", "ebb jobs --server http://127.0.0.1:1", "ebb submit -- sleep -1"]
        {
            assert!(super::command_line::parse::<Cli>(&words(line)).is_ok(), "{line}");
        }
    }

    /// Every argument of every command, by its path (`ebb tenant create
    /// NAME`), that `check` finds wanting.
    fn args_where(check: impl Fn(&clap::Arg) -> bool) -> Vec<String> {
        fn walk(
            command: &clap::Command,
            path: &str,
            check: &dyn Fn(&clap::Arg) -> bool,
            out: &mut Vec<String>,
        ) {
            for arg in command.get_arguments().filter(|a| check(a)) {
                out.push(format!(
                    "{path} {}",
                    arg.get_long().map_or(arg.get_id().to_string(), |l| format!("--{l}"))
                ));
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), check, out);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut out = Vec::new();
        walk(&command, "ebb", &check, &mut out);
        out
    }

    #[test]
    fn every_flag_and_argument_has_help() {
        let missing = args_where(|a| a.get_help().is_none() && a.get_long_help().is_none());
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    /// `--server` and `--token` are offered only by the commands that talk
    /// to a server (and the agent takes only `--server`).
    #[test]
    fn only_commands_that_talk_to_a_server_offer_server_and_token() {
        let offering = args_where(|a| matches!(a.get_long(), Some("server" | "token")));
        for local in
            ["ebb server ", "ebb up ", "ebb sim ", "ebb completions ", "ebb man ", "ebb agent --token"]
        {
            assert!(!offering.iter().any(|a| a.starts_with(local)), "{local}: {offering:#?}");
        }
        for remote in
            ["ebb agent --server", "ebb jobs --server", "ebb tenant create --token", "ebb bill --token"]
        {
            assert!(offering.iter().any(|a| a == remote), "{remote}: {offering:#?}");
        }
    }
}
