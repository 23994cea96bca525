//! `ebb`: one binary, one subcommand per job. This file only parses
//! arguments and hands them to the library crates.

mod client;
mod commands;
mod daemons;
mod money;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ebb", version, about = "Preemptible GPU compute with a five-minute drain window")]
struct Cli {
    #[command(flatten)]
    conn: client::Connection,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the control plane.
    Server(daemons::ServerArgs),
    /// Run a node agent.
    Agent(daemons::AgentArgs),
    /// Run a whole local cluster (server + agents with simulated GPUs).
    Up(daemons::UpArgs),
    /// Submit a job: ebb submit [flags] -- CMD ARGS..., or a job script.
    Submit(commands::SubmitArgs),
    /// List jobs: the newest 100 as a table (arrays as one row), with why
    /// each waiting job waits.
    Jobs(commands::JobsArgs),
    /// Show a job with its event timeline.
    Show {
        id: u64,
        #[command(flatten)]
        out: commands::JsonFlag,
    },
    /// Print a job's output (-f follows it live).
    Logs {
        id: u64,
        #[arg(short, long)]
        follow: bool,
        #[command(flatten)]
        out: commands::JsonFlag,
    },
    /// Cancel jobs: each ID given, and with --array every task of the
    /// array (its id is its first task's) not yet ended.
    Cancel {
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
        out: commands::JsonFlag,
    },
    /// List nodes; remove one, rotate the join token (admin).
    #[command(args_conflicts_with_subcommands = true)]
    Nodes {
        #[command(subcommand)]
        command: Option<commands::NodesCommand>,
        #[command(flatten)]
        out: commands::JsonFlag,
    },
    /// Drain a node for maintenance (admin).
    Drain {
        node: String,
        #[command(flatten)]
        out: commands::JsonFlag,
    },
    /// Put a drained node back into service (admin).
    Undrain {
        node: String,
        #[command(flatten)]
        out: commands::JsonFlag,
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
        out: commands::JsonFlag,
    },
    /// Manage tenants (admin).
    Tenant {
        #[command(subcommand)]
        command: commands::TenantCommand,
    },
    /// The price book (set: admin).
    Price {
        #[command(subcommand)]
        command: money::PriceCommand,
    },
    /// Reservations: committed GPUs of a model for a tenant over a period.
    Reservation {
        #[command(subcommand)]
        command: money::ReservationCommand,
    },
    /// A tenant's invoice for a period.
    Bill(money::BillArgs),
    /// Utilisation and revenue by tier for a period (admin).
    Report(money::ReportArgs),
    /// Replay job traces through the scheduler in virtual time.
    Sim(sim::SimArgs),
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
fn man(out_dir: Option<std::path::PathBuf>) -> Result<String, String> {
    use clap::CommandFactory;
    let command = Cli::command();
    match out_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("--out-dir {}: {e}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .map_err(|e| format!("--out-dir {}: {e}", dir.display()))?;
            Ok(format!("wrote the manual pages into {}\n", dir.display()))
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command).render(&mut out).map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&out).into_owned())
        }
    }
}

/// Seconds since the epoch, by this machine's clock.
fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Writes command output; a closed pipe (`ebb ... | head`) is not an error.
fn write_stdout(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing output: {e}")),
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

async fn dispatch(cli: Cli) -> Result<(), String> {
    let conn = &cli.conn;
    let text = match cli.command {
        Command::Server(args) => {
            init_logging();
            return daemons::server(args).await;
        }
        Command::Agent(args) => {
            init_logging();
            return daemons::agent(conn.server.clone(), args).await;
        }
        Command::Up(args) => return daemons::up(args).await,
        Command::Sim(args) => return sim::run(args),
        Command::Completions { shell } => completions(shell),
        Command::Man { out_dir } => man(out_dir)?,
        Command::Submit(args) => commands::submit(conn, &args).await?,
        Command::Jobs(args) => commands::jobs(conn, &args).await?,
        Command::Show { id, out } => commands::show(conn, id, &out).await?,
        Command::Logs { id, follow, out } => return commands::logs(conn, id, follow, out.json).await,
        Command::Cancel { ids, array, grace, out } => {
            commands::cancel(conn, &ids, array, grace, &out).await?
        }
        Command::Nodes { command: None, out } => commands::nodes(conn, &out).await?,
        Command::Nodes { command: Some(command), .. } => commands::nodes_command(conn, &command).await?,
        Command::Drain { node, out } => commands::drain(conn, &node, &out).await?,
        Command::Undrain { node, out } => commands::undrain(conn, &node, &out).await?,
        Command::Reclaim { gpus: Some(gpus), gpu_model, out, .. } => {
            commands::reclaim(conn, gpus, gpu_model, &out).await?
        }
        Command::Reclaim { gpus: None, gpu_model, out, .. } => {
            commands::release(conn, gpu_model, &out).await?
        }
        Command::Tenant { command } => commands::tenant(conn, &command).await?,
        Command::Price { command } => money::price(conn, &command).await?,
        Command::Reservation { command } => money::reservation(conn, &command).await?,
        Command::Bill(args) => money::bill(conn, &args).await?,
        Command::Report(args) => money::report(conn, &args).await?,
    };
    write_stdout(&text)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
