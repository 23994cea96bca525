//! Webhooks: `ebb tenant webhook …` (a tenant's, on its jobs' events) and
//! `ebb nodes webhook …` (the operators', on nodes' events).

use std::fmt::Write;

use clap::{Args, Subcommand};
use ebb_api as api;

use crate::client::Connection;
use crate::error::CliError;
use crate::output::{json, JsonFlag};

/// A webhook to add.
#[derive(Args)]
pub struct HookArgs {
    /// Where each event is POSTed: http:// or https://.
    pub url: String,
    /// Which events, comma-separated. A tenant's: preempted, requeued,
    /// promoted, failed, succeeded, cancelled, drill. The operators':
    /// gpu_out, node_drained, node_lost, node_back.
    #[arg(long, value_delimiter = ',', required = true, value_name = "EVENT,...")]
    pub events: Vec<String>,
    /// Send `{"text": …}`, what a Slack incoming webhook takes, instead of
    /// the documented JSON body.
    #[arg(long)]
    pub slack: bool,
    #[command(flatten)]
    pub out: JsonFlag,
}

#[derive(Subcommand)]
pub enum TenantWebhookCommand {
    /// Add a webhook for the tenant's jobs' events; prints its signing
    /// secret, shown this once (see docs/webhooks.md).
    Add {
        /// The tenant.
        name: String,
        #[command(flatten)]
        hook: HookArgs,
    },
    /// The tenant's webhooks and what each has still to deliver.
    List {
        /// The tenant.
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Remove a webhook, with what it had still to deliver.
    Remove {
        /// The tenant.
        name: String,
        /// The webhook's id, as `list` gives it.
        id: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// A webhook's latest tries, newest first: delivered, failed (tried
    /// again later), given up or dropped.
    Log {
        /// The tenant.
        name: String,
        /// The webhook's id.
        id: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
}

#[derive(Subcommand)]
pub enum NodesWebhookCommand {
    /// Add an operators' webhook for nodes' events; prints its signing
    /// secret, shown this once.
    Add {
        #[command(flatten)]
        hook: HookArgs,
    },
    /// The operators' webhooks.
    List(JsonFlag),
    /// Remove a webhook.
    Remove {
        /// The webhook's id, as `list` gives it.
        id: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// A webhook's latest tries, newest first.
    Log {
        /// The webhook's id.
        id: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
}

pub async fn tenant_webhook(conn: &Connection, command: &TenantWebhookCommand) -> Result<String, CliError> {
    match command {
        TenantWebhookCommand::Add { name, hook } => add(conn, Some(name), hook).await,
        TenantWebhookCommand::List { name, out } => list(conn, Some(name), out).await,
        TenantWebhookCommand::Remove { name: _, id, out } => remove(conn, *id, out).await,
        TenantWebhookCommand::Log { name: _, id, out } => log(conn, *id, out).await,
    }
}

pub async fn nodes_webhook(conn: &Connection, command: &NodesWebhookCommand) -> Result<String, CliError> {
    match command {
        NodesWebhookCommand::Add { hook } => add(conn, None, hook).await,
        NodesWebhookCommand::List(out) => list(conn, None, out).await,
        NodesWebhookCommand::Remove { id, out } => remove(conn, *id, out).await,
        NodesWebhookCommand::Log { id, out } => log(conn, *id, out).await,
    }
}

async fn add(conn: &Connection, tenant: Option<&str>, hook: &HookArgs) -> Result<String, CliError> {
    let req = api::WebhookRequest {
        tenant: tenant.map(String::from),
        url: hook.url.clone(),
        events: hook.events.clone(),
        format: hook.slack.then(|| "slack".to_string()),
    };
    let made: api::Webhook = conn.client()?.post("/v1/webhooks", &req).await?;
    if hook.out.json {
        return Ok(json(&made));
    }
    Ok(format!(
        "webhook {}: {} for {} ({})\nsigning secret (shown once; Ebb-Signature is HMAC-SHA256 of \"<t>.<body>\" \
         under it, see docs/webhooks.md):\n{}\n",
        made.id,
        made.url,
        made.events.join(", "),
        made.format,
        made.secret.unwrap_or_default()
    ))
}

async fn list(conn: &Connection, tenant: Option<&str>, out: &JsonFlag) -> Result<String, CliError> {
    let client = conn.client()?;
    let hooks: Vec<api::Webhook> = match tenant {
        Some(name) => client.get_query("/v1/webhooks", &[("tenant", name)]).await?,
        None => client.get("/v1/webhooks").await?,
    };
    // The operators' list holds theirs only; a tenant's, that tenant's.
    let hooks: Vec<api::Webhook> = hooks.into_iter().filter(|h| h.tenant.as_deref() == tenant).collect();
    if out.json {
        return Ok(json(&hooks));
    }
    if hooks.is_empty() {
        return Ok("no webhooks\n".into());
    }
    let mut text = format!("{:>4}  {:<6} {:>7}  {:<40} EVENTS\n", "ID", "FORMAT", "PENDING", "URL");
    for h in hooks {
        writeln!(text, "{:>4}  {:<6} {:>7}  {:<40} {}", h.id, h.format, h.pending, h.url, h.events.join(","))
            .unwrap();
    }
    Ok(text)
}

async fn remove(conn: &Connection, id: u64, out: &JsonFlag) -> Result<String, CliError> {
    let gone: api::Webhook = conn.client()?.delete(&format!("/v1/webhooks/{id}")).await?;
    Ok(if out.json {
        json(&gone)
    } else {
        format!("webhook {}: removed, with {} deliveries it had still to make\n", gone.id, gone.pending)
    })
}

async fn log(conn: &Connection, id: u64, out: &JsonFlag) -> Result<String, CliError> {
    let log: api::WebhookLog = conn.client()?.get(&format!("/v1/webhooks/{id}/log")).await?;
    if out.json {
        return Ok(json(&log));
    }
    let mut text =
        format!("webhook {}: {} ({} waiting)\n", log.webhook.id, log.webhook.url, log.webhook.pending);
    for d in &log.deliveries {
        let about = match (&d.job, &d.node) {
            (Some(job), _) => format!("job {job}"),
            (None, Some(node)) => format!("node {node}"),
            (None, None) => String::new(),
        };
        let how = match (d.status, &d.error) {
            (Some(status), None) => format!("HTTP {status}"),
            (_, Some(error)) => error.clone(),
            (None, None) => String::new(),
        };
        writeln!(
            text,
            "{}  delivery {} try {}  {:<9} {} {}: {how}",
            d.at, d.delivery, d.attempt, d.outcome, d.event, about
        )
        .unwrap();
    }
    Ok(text)
}
