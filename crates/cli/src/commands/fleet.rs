//! The operator's commands: nodes, drain and undrain, reclaim and
//! release, tenants and their tokens.

use std::fmt::Write;

use clap::Subcommand;
use ebb_api as api;
use ebb_core::count;

use crate::client::Connection;

use crate::error::{usage, CliError};
use crate::output::{json, JsonFlag};

#[derive(Subcommand)]
pub enum TenantCommand {
    /// List the tenants: their working tokens, unfinished jobs and
    /// reservations not yet ended.
    List(JsonFlag),
    /// Create a tenant and print its token (shown once).
    Create {
        /// 1 to 64 letters, digits, `-` or `_`.
        name: String,
        /// Its fair-share weight within each tier (default 1).
        #[arg(long, value_name = "W")]
        weight: Option<u32>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Show a tenant's limits and usage; with a flag, set its own limits
    /// (admin). Unset ones follow the server's defaults.
    #[command(visible_alias = "update")]
    Limits {
        /// The tenant.
        name: String,
        /// Unfinished jobs (queued, waiting or running).
        #[arg(long, value_name = "N")]
        max_jobs: Option<u64>,
        /// Jobs admitted to the scheduler at once.
        #[arg(long, value_name = "N")]
        max_running_jobs: Option<u64>,
        /// Bytes of arguments and environments its unfinished jobs may keep.
        #[arg(long, value_name = "BYTES")]
        max_stored_bytes: Option<u64>,
        /// Its fair-share weight within each tier: a tenant of weight 2 is
        /// given twice the GPU time of one of weight 1 when both wait.
        #[arg(long, value_name = "W")]
        weight: Option<u32>,
        /// A quota in one tier on one GPU model: TIER:MODEL:NOMINAL, then
        /// optionally :BORROWING_LIMIT and :LENDING_LIMIT (empty for none),
        /// e.g. on-demand:H100-80GB:64:0 or preemptible:H100-80GB:16::8.
        /// Repeatable; given, it replaces the tenant's quotas.
        #[arg(long = "quota", value_name = "TIER:MODEL:NOMINAL[:BORROW[:LEND]]", value_parser = parse_quota)]
        quotas: Vec<api::TenantQuota>,
        /// Drop the tenant's quotas.
        #[arg(long, conflicts_with = "quotas")]
        no_quotas: bool,
        /// Drop the tenant's own limits, weight and quotas: the server's defaults apply.
        #[arg(long, conflicts_with_all = ["max_jobs", "max_running_jobs", "max_stored_bytes", "weight", "quotas"])]
        defaults: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Give the login a tenant's images are pulled from REGISTRY with
    /// (the tenant's own token or an operator's). The password is read
    /// from standard input, never from the command line.
    RegistryLogin {
        /// The tenant.
        name: String,
        /// The registry: HOST or HOST:PORT, as image references begin.
        registry: String,
        /// The user name the registry knows.
        #[arg(long, short = 'u')]
        username: String,
        /// Read the password from standard input (the only way).
        #[arg(long, required = true)]
        password_stdin: bool,
    },
    /// Remove a tenant's login for REGISTRY.
    RegistryLogout {
        /// The tenant.
        name: String,
        /// The registry: HOST or HOST:PORT.
        registry: String,
    },
    /// List the registries a tenant has logins for.
    RegistryLogins {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// A tenant's tokens: rotate or revoke.
    Token {
        #[command(subcommand)]
        command: TenantTokenCommand,
    },
    /// A tenant's webhooks: an HTTP POST for each event of its jobs
    /// (preempted, requeued, promoted, failed, succeeded, cancelled, drill).
    Webhook {
        #[command(subcommand)]
        command: super::TenantWebhookCommand,
    },
}

#[derive(Subcommand)]
pub enum TenantTokenCommand {
    /// Issue a new token (shown once) and revoke every older one.
    Rotate {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Revoke every token of the tenant.
    Revoke {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
}

#[derive(Subcommand)]
pub enum NodesCommand {
    /// Take a node out: revoke its credential at once and requeue its
    /// attempts as lost. It may join again with the join token.
    Remove {
        /// The node's name, as `ebb nodes` lists it.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// The agents' join token.
    JoinToken {
        #[command(subcommand)]
        command: JoinTokenCommand,
    },
    /// The operators' webhooks: an HTTP POST for each node event (gpu_out,
    /// node_drained, node_lost, node_back).
    Webhook {
        #[command(subcommand)]
        command: super::NodesWebhookCommand,
    },
}

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Issue a new join token (written to the server's join.token and
    /// printed); the old one is refused at once, joined nodes keep working.
    Rotate {
        #[command(flatten)]
        out: JsonFlag,
    },
}

/// What the cluster has and what a job of each tier could get now, per
/// GPU model: for anyone, as `sinfo` is.
pub async fn capacity(conn: &Connection, out: &JsonFlag) -> Result<String, CliError> {
    let capacity: api::Capacity = conn.client()?.get("/v1/capacity").await?;
    if out.json {
        return Ok(json(&capacity));
    }
    if capacity.models.is_empty() {
        return Ok("no nodes have joined yet\n".into());
    }
    Ok(capacity.models.iter().map(capacity_text).collect())
}

/// One model's capacity for people.
fn capacity_text(m: &api::ModelCapacity) -> String {
    let gpus = |n: u32| count(u64::from(n), "GPU");
    let mut text =
        format!("{}: {} in service on {}", m.gpu_model, gpus(m.gpus), count(u64::from(m.nodes), "node"));
    if m.nodes_out_of_service > 0 {
        write!(
            text,
            "; {} out of service on {} (drained, unhealthy or lost)",
            gpus(m.gpus_out_of_service - m.gpus_faulted),
            count(u64::from(m.nodes_out_of_service), "node")
        )
        .unwrap();
    }
    if m.gpus_faulted > 0 {
        write!(text, "; {} out of service for a fault (ebb nodes says which)", gpus(m.gpus_faulted)).unwrap();
    }
    let u = &m.in_use;
    writeln!(
        text,
        "\n  in use       reserved {}, on-demand {}, preemptible {}; draining or held {}",
        u.reserved, u.on_demand, u.preemptible, m.draining
    )
    .unwrap();
    writeln!(text, "  idle         {} (at most {} on one node)", m.idle, m.idle_on_one_node).unwrap();
    if m.reserved > 0 {
        writeln!(
            text,
            "  reserved     {} by reservations in force, {} of them yours",
            gpus(m.reserved),
            m.reserved_for_you
        )
        .unwrap();
    }
    let a = &m.available;
    writeln!(text, "  a job now    preemptible up to {} (the idle ones)", gpus(a.preemptible)).unwrap();
    writeln!(
        text,
        "               on-demand up to {} (idle, and what preemptible work is drained from)",
        gpus(a.on_demand)
    )
    .unwrap();
    let reserved = match a.reserved {
        0 => "no reservation of yours is in force".to_string(),
        n => format!("up to {} of your reservations", gpus(n)),
    };
    writeln!(text, "               reserved {reserved}").unwrap();
    text
}

pub async fn nodes(conn: &Connection, out: &JsonFlag) -> Result<String, CliError> {
    let nodes: Vec<api::Node> = conn.client()?.get("/v1/nodes").await?;
    if out.json {
        return Ok(json(&nodes));
    }
    let mut text = format!(
        "{:<16} {:<10} {:<14} {:>4} {:>5} {:>5}  {}\n",
        "NODE", "STATUS", "MODEL", "GPUS", "USED", "HELD", "JOB IDS"
    );
    for n in nodes {
        let jobs = n.jobs.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        writeln!(
            text,
            "{:<16} {:<10} {:<14} {:>4} {:>5} {:>5}  {}",
            n.name, n.status, n.gpu_model, n.gpus, n.gpus_used, n.gpus_held, jobs
        )
        .unwrap();
        if let Some(why) = &n.unhealthy {
            writeln!(text, "  {}: unhealthy, takes no new work: {why}", n.name).unwrap();
        }
        text.push_str(&health_lines(&n));
    }
    Ok(text)
}

/// What a node's health took out of service, drained or warns of, a line
/// each under its row.
fn health_lines(n: &api::Node) -> String {
    let mut text = String::new();
    if let Some(why) = &n.drained_for {
        writeln!(text, "  {}: drained for its health: {why} (ebb undrain {} returns it)", n.name, n.name)
            .unwrap();
    }
    for o in &n.gpus_out {
        let until = match o.until_returned {
            true => format!("faulted twice in a day: out until ebb undrain {} --gpu {}", n.name, o.gpu),
            false => "out until its fault clears or ebb undrain".to_string(),
        };
        writeln!(
            text,
            "  {}: GPU {} out of service since {}: {} ({until})",
            n.name, o.gpu, o.since, o.reason
        )
        .unwrap();
    }
    for w in &n.warnings {
        writeln!(text, "  {}: warning: {w}", n.name).unwrap();
    }
    text
}

pub async fn nodes_command(conn: &Connection, command: &NodesCommand) -> Result<String, CliError> {
    match command {
        NodesCommand::Remove { name, out } => {
            let removed: api::NodeRemoved = conn.client()?.delete(&format!("/v1/nodes/{name}")).await?;
            Ok(if out.json {
                json(&removed)
            } else {
                let jobs = removed.requeued.iter().map(u64::to_string).collect::<Vec<_>>();
                format!(
                    "node {}: removed; {}; {}\n",
                    removed.node,
                    if removed.credential_revoked {
                        "its credential is revoked"
                    } else {
                        "it had no credential"
                    },
                    if jobs.is_empty() {
                        "no attempts were running there".to_string()
                    } else {
                        format!("jobs requeued as lost: {}", jobs.join(", "))
                    }
                )
            })
        }
        NodesCommand::Webhook { command } => super::nodes_webhook(conn, command).await,
        NodesCommand::JoinToken { command: JoinTokenCommand::Rotate { out } } => {
            let rotated: api::JoinToken =
                conn.client()?.post("/v1/agent/join-token", &serde_json::json!({})).await?;
            Ok(if out.json {
                json(&rotated)
            } else {
                format!(
                    "new join token (written to {} on the server; the old one is refused from now, joined nodes \
                     keep their own credentials):\n{}\n",
                    rotated.path, rotated.token
                )
            })
        }
    }
}

pub async fn drain(conn: &Connection, node: &str, out: &JsonFlag) -> Result<String, CliError> {
    let n: api::Node =
        conn.client()?.post(&format!("/v1/nodes/{node}/drain"), &serde_json::json!({})).await?;
    Ok(if out.json { json(&n) } else { format!("node {}: {}\n", n.name, n.status) })
}

pub async fn undrain(
    conn: &Connection,
    node: &str,
    gpu: Option<u8>,
    out: &JsonFlag,
) -> Result<String, CliError> {
    let route = match gpu {
        Some(gpu) => format!("/v1/nodes/{node}/undrain?gpu={gpu}"),
        None => format!("/v1/nodes/{node}/undrain"),
    };
    let n: api::Node = conn.client()?.post(&route, &serde_json::json!({})).await?;
    Ok(if out.json {
        json(&n)
    } else {
        let back = match gpu {
            Some(gpu) => format!("GPU {gpu} back in service; "),
            None => String::new(),
        };
        format!("node {}: {back}{}\n{}", n.name, n.status, health_lines(&n))
    })
}

pub async fn release(
    conn: &Connection,
    gpu_model: Option<String>,
    out: &JsonFlag,
) -> Result<String, CliError> {
    let reply: api::ReclaimReleased =
        conn.client()?.post("/v1/reclaim/release", &api::ReclaimRelease { gpu_model }).await?;
    Ok(if out.json {
        json(&reply)
    } else {
        match reply.released_limit {
            Some(limit) => format!(
                "released the reclaim of {} (preemptible work was held to {}): it may use any idle GPU again\n",
                reply.gpu_model,
                count(u64::from(limit), "GPU")
            ),
            None => format!("{}: no reclaim to release\n", reply.gpu_model),
        }
    })
}

pub async fn reclaim(
    conn: &Connection,
    gpus: u32,
    gpu_model: Option<String>,
    out: &JsonFlag,
) -> Result<String, CliError> {
    let reply: api::ReclaimReply =
        conn.client()?.post("/v1/reclaim", &api::ReclaimRequest { gpus, gpu_model }).await?;
    Ok(if out.json {
        json(&reply)
    } else {
        format!(
            "reclaimed {}: preemptible work may now hold at most {}\n",
            count(u64::from(gpus), &format!("{} GPU", reply.gpu_model)),
            reply.preemptible_limit
        )
    })
}

/// `--quota TIER:MODEL:NOMINAL[:BORROWING[:LENDING]]`.
fn parse_quota(text: &str) -> Result<api::TenantQuota, CliError> {
    let parts: Vec<&str> = text.split(':').collect();
    let number = |what: &str, s: &str| -> Result<Option<u32>, CliError> {
        match s {
            "" => Ok(None),
            s => s
                .parse::<u32>()
                .map(Some)
                .map_err(|_| usage(format!("{what} must be a whole number of GPUs, got {s:?}"))),
        }
    };
    let [tier, model, nominal, rest @ ..] = parts.as_slice() else {
        return Err(usage("expected TIER:MODEL:NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]]"));
    };
    if rest.len() > 2 || model.is_empty() {
        return Err(usage("expected TIER:MODEL:NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]]"));
    }
    Ok(api::TenantQuota {
        tier: tier.to_string(),
        gpu_model: model.to_string(),
        nominal: number("NOMINAL", nominal)?.ok_or_else(|| usage("NOMINAL is required"))?,
        borrowing_limit: number("BORROWING_LIMIT", rest.first().unwrap_or(&""))?,
        lending_limit: number("LENDING_LIMIT", rest.get(1).unwrap_or(&""))?,
    })
}

/// One quota and its use, as `ebb tenant list` and `ebb tenant limits`
/// print it.
fn quota_line(lead: &str, q: &api::QuotaUsage) -> String {
    let limit = |l: Option<u32>, none: &str| l.map_or_else(|| none.to_string(), |l| l.to_string());
    format!(
        "{lead}{} {}: uses {} of {}; borrows at most {}, lends at most {}\n",
        q.quota.tier,
        q.quota.gpu_model,
        q.used,
        q.quota.nominal,
        limit(q.quota.borrowing_limit, "any"),
        limit(q.quota.lending_limit, "all")
    )
}

pub async fn tenant(conn: &Connection, command: &TenantCommand) -> Result<String, CliError> {
    match command {
        TenantCommand::List(out) => {
            let tenants: Vec<api::TenantSummary> = conn.client()?.get("/v1/tenants").await?;
            if out.json {
                return Ok(json(&tenants));
            }
            let mut text = format!(
                "{:<24} {:>6} {:>8} {:>8} {:>8} {:>12} {:>6}  SHARE OF TIER (USAGE) AGAINST WEIGHT\n",
                "TENANT", "TOKENS", "JOBS", "ADMITTED", "WAITING", "RESERVATIONS", "WEIGHT"
            );
            for t in tenants {
                let shares: Vec<String> = t
                    .shares
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {:.1}% (${}) of {:.1}%",
                            s.tier, s.share_percent, s.usage_usd, s.weight_percent
                        )
                    })
                    .collect();
                writeln!(
                    text,
                    "{:<24} {:>6} {:>8} {:>8} {:>8} {:>12} {:>6}  {}",
                    t.tenant,
                    t.tokens,
                    t.jobs,
                    t.admitted,
                    t.waiting,
                    t.reservations,
                    t.weight,
                    if shares.is_empty() { "-".to_string() } else { shares.join(", ") }
                )
                .unwrap();
                text.extend(t.quotas.iter().map(|q| quota_line("  quota ", q)));
            }
            Ok(text)
        }
        TenantCommand::Create { name, weight, out } => {
            let client = conn.client()?;
            let created: api::TenantCreated =
                client.post("/v1/tenants", &api::TenantRequest { name: name.clone() }).await?;
            if weight.is_some() {
                let set = api::TenantLimits { weight: *weight, ..Default::default() };
                let _: api::TenantUsage = client.put(&format!("/v1/tenants/{name}/limits"), &set).await?;
            }
            Ok(if out.json {
                json(&created)
            } else {
                format!("tenant {} created; its token (shown once):\n{}\n", created.tenant, created.token)
            })
        }
        TenantCommand::Limits {
            name,
            max_jobs,
            max_running_jobs,
            max_stored_bytes,
            weight,
            quotas,
            no_quotas,
            defaults,
            out,
        } => {
            let client = conn.client()?;
            let path = format!("/v1/tenants/{name}/limits");
            let asked = api::TenantLimits {
                max_jobs: *max_jobs,
                max_running_jobs: *max_running_jobs,
                max_stored_bytes: *max_stored_bytes,
                weight: *weight,
                quotas: if *no_quotas {
                    Some(Vec::new())
                } else {
                    (!quotas.is_empty()).then(|| quotas.clone())
                },
            };
            let usage: api::TenantUsage = if *defaults {
                client.put(&path, &asked).await?
            } else if asked != api::TenantLimits::default() {
                // A flag sets its own setting and keeps the others.
                let own = client.get::<api::TenantUsage>(&path).await?.own;
                let set = api::TenantLimits {
                    max_jobs: asked.max_jobs.or(own.max_jobs),
                    max_running_jobs: asked.max_running_jobs.or(own.max_running_jobs),
                    max_stored_bytes: asked.max_stored_bytes.or(own.max_stored_bytes),
                    weight: asked.weight.or(own.weight),
                    quotas: asked.quotas.or(own.quotas),
                };
                client.put(&path, &set).await?
            } else {
                client.get(&path).await?
            };
            if out.json {
                return Ok(json(&usage));
            }
            Ok(format!(
                "tenant {}\n  jobs          {} unfinished of at most {} ({} admitted, {} waiting)\n  \
                 running jobs  at most {} admitted at once\n  stored        {} bytes of at most {}\n  \
                 weight        {} (fair share within each tier)\n",
                usage.tenant,
                usage.jobs,
                usage.max_jobs,
                usage.admitted,
                usage.waiting,
                usage.max_running_jobs,
                usage.stored_bytes,
                usage.max_stored_bytes,
                usage.weight
            ) + &usage.quotas.iter().map(|q| quota_line("  quota         ", q)).collect::<String>())
        }
        TenantCommand::RegistryLogin { name, registry, username, password_stdin: _ } => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password).map_err(CliError::Input)?;
            let password = password.trim_end_matches(['\n', '\r']).to_string();
            if password.is_empty() {
                return Err(usage("no password on standard input"));
            }
            let login = api::RegistryLogin { username: username.clone(), password };
            let path = format!("/v1/tenants/{name}/registry-logins/{registry}");
            let _: Vec<api::RegistryLoginInfo> = conn.client()?.put(&path, &login).await?;
            Ok(format!("tenant {name}: pulls from {registry} log in as {username}\n"))
        }
        TenantCommand::RegistryLogout { name, registry } => {
            let path = format!("/v1/tenants/{name}/registry-logins/{registry}");
            let _: Vec<api::RegistryLoginInfo> = conn.client()?.delete(&path).await?;
            Ok(format!("tenant {name}: no login for {registry}\n"))
        }
        TenantCommand::RegistryLogins { name, out } => {
            let logins: Vec<api::RegistryLoginInfo> =
                conn.client()?.get(&format!("/v1/tenants/{name}/registry-logins")).await?;
            if out.json {
                return Ok(json(&logins));
            }
            let mut text = String::new();
            for l in &logins {
                writeln!(text, "{}  {}", l.registry, l.username).unwrap();
            }
            if logins.is_empty() {
                text = format!("tenant {name} has no registry logins\n");
            }
            Ok(text)
        }
        TenantCommand::Webhook { command } => super::tenant_webhook(conn, command).await,
        TenantCommand::Token { command } => {
            let client = conn.client()?;
            let (reply, out): (api::TenantTokens, &JsonFlag) = match command {
                TenantTokenCommand::Rotate { name, out } => {
                    (client.post(&format!("/v1/tenants/{name}/tokens"), &serde_json::json!({})).await?, out)
                }
                TenantTokenCommand::Revoke { name, out } => {
                    (client.delete(&format!("/v1/tenants/{name}/tokens")).await?, out)
                }
            };
            Ok(if out.json {
                json(&reply)
            } else {
                match &reply.token {
                    Some(token) => format!(
                        "tenant {}: {} older token(s) revoked; its new token (shown once):\n{token}\n",
                        reply.tenant, reply.revoked
                    ),
                    None => format!("tenant {}: {} token(s) revoked\n", reply.tenant, reply.revoked),
                }
            })
        }
    }
}
