//! The money commands: `price`, `reservation`, `bill`, `report`. Amounts
//! come from the server as integer micro-dollars; this file lays them out,
//! every amount to the cent and every rate per GPU-hour to four decimals
//! (`amount`, `rate`: the one formatter, also used by `ebb show`). The
//! exact figures are in `--json` and `--csv`.

use std::fmt::Write;

use clap::{Args, Subcommand};
use ebb_api as api;
use ebb_core::MicroUsd;

use crate::client::Connection;
use crate::error::CliError;
use crate::output::{json, JsonFlag};

/// An amount of micro-dollars for people: `12.35`.
pub fn amount(micro_usd: i64) -> String {
    MicroUsd(micro_usd).amount_text()
}

/// The savings as the invoice shows them: the shown on-demand figure
/// less what the same work cost, each rounded to the cent once, so that
/// the lines people subtract agree (1.41 - 1.26 = 0.15, never 0.14).
fn shown_savings(on_demand: i64, savings: i64) -> i64 {
    let cents = |m: i128| (m.abs() + 5_000) / 10_000 * m.signum() * 10_000;
    let (on_demand, savings) = (i128::from(on_demand), i128::from(savings));
    let shown = cents(on_demand) - cents(on_demand - savings);
    shown.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// A price per GPU-hour, in micro-dollars, for people: `3.6000`.
pub fn rate(micro_usd: i64) -> String {
    MicroUsd(micro_usd).rate_text()
}

#[derive(Subcommand)]
pub enum PriceCommand {
    /// The price book: per GPU model, per GPU-hour.
    List(JsonFlag),
    /// Set a model's on-demand price (and reserved contract rate), in dollars per GPU-hour (admin).
    Set {
        /// The GPU model, as nodes report it (H100-80GB).
        gpu_model: String,
        /// On-demand dollars per GPU-hour (2.50); preemptible is this less the fixed discount.
        #[arg(long, allow_hyphen_values = true, value_name = "USD")]
        on_demand: String,
        /// Contract rate of new reservations, dollars per GPU-hour (default: unchanged, or on-demand).
        #[arg(long, allow_hyphen_values = true, value_name = "USD")]
        reserved: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
}

pub async fn price(conn: &Connection, command: &PriceCommand) -> Result<String, CliError> {
    let client = conn.client()?;
    match command {
        PriceCommand::List(out) => {
            let book: api::PriceBook = client.get("/v1/prices").await?;
            if out.json {
                return Ok(json(&book));
            }
            let mut text = format!(
                "preemptible = on-demand less {}% (fixed)\n{:<16} {:>12} {:>12} {:>12}  (USD per GPU-hour)\n",
                book.preemptible_discount_percent, "GPU MODEL", "ON-DEMAND", "PREEMPTIBLE", "RESERVED"
            );
            for p in &book.prices {
                writeln!(
                    text,
                    "{:<16} {:>12} {:>12} {:>12}",
                    p.gpu_model,
                    rate(p.on_demand_micro_usd),
                    rate(p.preemptible_micro_usd),
                    rate(p.reserved_micro_usd)
                )
                .unwrap();
            }
            Ok(text)
        }
        PriceCommand::Set { gpu_model, on_demand, reserved, out } => {
            let update =
                api::PriceUpdate { on_demand_usd: on_demand.clone(), reserved_usd: reserved.clone() };
            let p: api::Price = client.put(&format!("/v1/prices/{gpu_model}"), &update).await?;
            Ok(if out.json {
                json(&p)
            } else {
                format!(
                    "{}: on-demand ${}, preemptible ${}, reserved ${} per GPU-hour\n",
                    p.gpu_model,
                    rate(p.on_demand_micro_usd),
                    rate(p.preemptible_micro_usd),
                    rate(p.reserved_micro_usd)
                )
            })
        }
    }
}

#[derive(Subcommand)]
pub enum ReservationCommand {
    /// Reserve GPUs of a model for a tenant over a period (admin).
    Create {
        /// The tenant whose reserved jobs draw on it.
        #[arg(long)]
        tenant: String,
        /// The GPU model reserved.
        #[arg(long)]
        gpu_model: String,
        /// GPUs reserved.
        #[arg(long)]
        gpus: u32,
        /// Start: RFC 3339 or a date (midnight UTC); now if left out.
        #[arg(long)]
        start: Option<String>,
        /// Accept a start in the past: a contract that began before it is
        /// entered, charged from that start.
        #[arg(long)]
        backdate: bool,
        /// End (exclusive): RFC 3339 or a date (midnight UTC).
        #[arg(long)]
        end: String,
        /// Contract rate, dollars per GPU-hour (default: the price book's).
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// List reservations (a tenant's own; every one for an admin).
    List(JsonFlag),
    /// Delete a reservation (admin): one not started is withdrawn; one in
    /// force ends now; what it charged stays on the invoices.
    Delete {
        /// The reservation's id, as `ebb reservation list` shows it.
        id: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
}

/// Reservations as a table, under a header.
fn reservation_table(list: &[api::Reservation]) -> String {
    let mut text = format!(
        "{:>4}  {:<12} {:>4}  {:<14} {:<24} {:<24} {:>12}  {:>6} {:>4}  {}\n",
        "ID", "TENANT", "GPUS", "GPU MODEL", "START", "END", "USD/GPU-HOUR", "IN USE", "LENT", "BORROWERS"
    );
    for r in list {
        let borrowers: Vec<String> = r.borrowers.iter().map(|b| format!("{} ({})", b.job, b.gpus)).collect();
        let (in_use, lent) = match r.active {
            true => (r.in_use.to_string(), r.lent.to_string()),
            false => ("-".into(), "-".into()),
        };
        writeln!(
            text,
            "{:>4}  {:<12} {:>4}  {:<14} {:<24} {:<24} {:>12}  {:>6} {:>4}  {}",
            r.id,
            r.tenant,
            r.gpus,
            r.gpu_model,
            r.start,
            r.end,
            rate(r.rate_micro_usd),
            in_use,
            lent,
            borrowers.join(", ")
        )
        .unwrap();
    }
    text
}

pub async fn reservation(conn: &Connection, command: &ReservationCommand) -> Result<String, CliError> {
    let client = conn.client()?;
    match command {
        ReservationCommand::Create { tenant, gpu_model, gpus, start, backdate, end, rate, out } => {
            let now =
                || ebb_core::time::rfc3339_seconds(ebb_core::time::unix_ms(std::time::SystemTime::now()));
            let req = api::ReservationRequest {
                tenant: tenant.clone(),
                gpu_model: gpu_model.clone(),
                gpus: *gpus,
                start: start.clone().unwrap_or_else(now),
                end: end.clone(),
                rate_usd: rate.clone(),
                backdate: *backdate,
            };
            let r: api::Reservation = client.post("/v1/reservations", &req).await?;
            Ok(if out.json {
                json(&r)
            } else {
                format!("created reservation {}\n{}", r.id, reservation_table(std::slice::from_ref(&r)))
            })
        }
        ReservationCommand::List(out) => {
            let list: Vec<api::Reservation> = client.get("/v1/reservations").await?;
            if out.json {
                return Ok(json(&list));
            }
            if list.is_empty() {
                return Ok("no reservations\n".into());
            }
            Ok(reservation_table(&list))
        }
        ReservationCommand::Delete { id, out } => {
            let r: api::Reservation = client.delete(&format!("/v1/reservations/{id}")).await?;
            Ok(if out.json {
                json(&r)
            } else if r.end_ms <= r.start_ms {
                format!(
                    "reservation {}: withdrawn before its start ({}); it charged nothing\n",
                    r.id, r.start
                )
            } else {
                format!(
                    "reservation {}: deleted; its charge from {} to {} stays on the invoices of that time, \
                     and nothing after {} is charged or reserved\n",
                    r.id, r.start, r.end, r.end
                )
            })
        }
    }
}

#[derive(Args)]
pub struct BillArgs {
    /// Another tenant's bill (admin).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start of the period: RFC 3339 or a date (midnight UTC); the first
    /// of this month (UTC) if left out.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the period (exclusive); the first of next month if left out.
    #[arg(long)]
    pub to: Option<String>,
    /// Print the invoice as JSON (exact micro-dollars) for scripts.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print the invoice as CSV: a row per line, reservation and total.
    #[arg(long)]
    pub csv: bool,
}

/// The period `--from`/`--to` name, this month (UTC) filling what they
/// leave out, as the dashboard's bill and report default to.
fn period(from: &Option<String>, to: &Option<String>) -> (String, String) {
    let today = ebb_core::time::rfc3339_seconds(ebb_core::time::unix_ms(std::time::SystemTime::now()));
    let (year, month) = (today[..4].parse::<u32>().unwrap_or(1970), today[5..7].parse::<u32>().unwrap_or(1));
    let next =
        if month == 12 { format!("{}-01-01", year + 1) } else { format!("{year}-{:02}-01", month + 1) };
    (from.clone().unwrap_or_else(|| format!("{year}-{month:02}-01")), to.clone().unwrap_or(next))
}

pub async fn bill(conn: &Connection, args: &BillArgs) -> Result<String, CliError> {
    let (from, to) = period(&args.from, &args.to);
    let mut query = vec![("from", from.as_str()), ("to", to.as_str())];
    if let Some(t) = &args.tenant {
        query.push(("tenant", t.as_str()));
    }
    let inv: api::Invoice = conn.client()?.get_query("/v1/bill", &query).await?;
    if args.json {
        return Ok(json(&inv));
    }
    if args.csv {
        return invoice_csv(&inv).map_err(|e| CliError::Output(std::io::Error::other(e)));
    }
    let mut text = format!("invoice for {}, {} to {}\n\n", inv.tenant, inv.from, inv.to);
    writeln!(
        text,
        "{:<12} {:<14} {:>12} {:>14} {:>14}",
        "TIER", "GPU MODEL", "GPU-HOURS", "USD/GPU-HOUR", "AMOUNT USD"
    )
    .unwrap();
    for l in &inv.lines {
        let line_rate = if l.tier == "reserved" { "reservation".to_string() } else { rate(l.rate_micro_usd) };
        writeln!(
            text,
            "{:<12} {:<14} {:>12.2} {:>14} {:>14}",
            l.tier,
            l.gpu_model,
            l.gpu_hours,
            line_rate,
            amount(l.amount_micro_usd)
        )
        .unwrap();
    }
    for c in &inv.reservations {
        writeln!(
            text,
            "{:<12} {:<14} {:>12.2} {:>14} {:>14}   reservation {}: {}, {} to {}",
            "reservation",
            c.gpu_model,
            c.gpu_hours,
            rate(c.rate_micro_usd),
            amount(c.amount_micro_usd),
            c.reservation,
            ebb_core::count(u64::from(c.gpus), "GPU"),
            c.from,
            c.to
        )
        .unwrap();
    }
    writeln!(text, "\n{:<42} {:>14}", "total", amount(inv.total_micro_usd)).unwrap();
    writeln!(text, "{:<42} {:>14}", "at on-demand prices", amount(inv.on_demand_equivalent_micro_usd))
        .unwrap();
    writeln!(
        text,
        "{:<42} {:>14}",
        "saved by running preemptible",
        amount(shown_savings(inv.on_demand_equivalent_micro_usd, inv.preemptible_savings_micro_usd))
    )
    .unwrap();
    writeln!(
        text,
        "\n{}, {} preempted{}; {:.2} GPU-hours in drain windows, {:.2} GPU-hours of work lost",
        ebb_core::count(inv.attempts, "attempt"),
        inv.preemptions,
        repeats_text(&inv),
        inv.drain_gpu_hours,
        inv.lost_gpu_hours
    )
    .unwrap();
    text.push_str(
        "\nGPU-hours here are what was billed: each attempt that ended in the period, per started second\n\
         from its start to its exit; an attempt still running is billed when it ends. `ebb report`\n\
         counts GPU time as it is used, running attempts included.\n",
    );
    Ok(text)
}

/// How many preemptions took a job preempted before, and how many of those
/// came within the server's minimum run time of its resuming (only when
/// nothing else would make room): nothing when there were none.
fn repeats_text(inv: &api::Invoice) -> String {
    if inv.repeat_preemptions == 0 {
        return String::new();
    }
    format!(
        " ({} again after an earlier preemption, {} of them within the minimum run time)",
        inv.repeat_preemptions, inv.preemptions_within_min_runtime
    )
}

/// One row per line, reservation charge and summary figure; amounts in
/// micro-dollars (exact) and dollars; then the attempts and preemptions,
/// in `count`.
fn invoice_csv(inv: &api::Invoice) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "kind",
        "tier",
        "gpu_model",
        "gpu_seconds",
        "gpu_hours",
        "rate_micro_usd",
        "amount_micro_usd",
        "amount_usd",
        "count",
    ])?;
    for l in &inv.lines {
        w.write_record([
            "usage",
            &l.tier,
            &l.gpu_model,
            &l.gpu_seconds.to_string(),
            &format!("{:.6}", l.gpu_hours),
            &l.rate_micro_usd.to_string(),
            &l.amount_micro_usd.to_string(),
            &l.amount_usd,
            "",
        ])?;
    }
    for c in &inv.reservations {
        w.write_record([
            &format!("reservation {}", c.reservation),
            "reserved",
            &c.gpu_model,
            &c.gpu_seconds.to_string(),
            &format!("{:.6}", c.gpu_hours),
            &c.rate_micro_usd.to_string(),
            &c.amount_micro_usd.to_string(),
            &c.amount_usd,
            "",
        ])?;
    }
    for (kind, micro, usd) in [
        ("total", inv.total_micro_usd, &inv.total_usd),
        ("on_demand_equivalent", inv.on_demand_equivalent_micro_usd, &inv.on_demand_equivalent_usd),
        ("preemptible_savings", inv.preemptible_savings_micro_usd, &inv.preemptible_savings_usd),
    ] {
        w.write_record([kind, "", "", "", "", "", &micro.to_string(), usd, ""])?;
    }
    for (kind, count) in [
        ("attempts", inv.attempts),
        ("preemptions", inv.preemptions),
        ("repeat_preemptions", inv.repeat_preemptions),
        ("preemptions_within_min_runtime", inv.preemptions_within_min_runtime),
    ] {
        w.write_record([kind, "", "", "", "", "", "", "", &count.to_string()])?;
    }
    let bytes = w.into_inner().map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8(bytes).expect("CSV of text is text"))
}

#[derive(Args)]
pub struct ReportArgs {
    /// Start of the period: RFC 3339 or a date (midnight UTC); the first
    /// of this month (UTC) if left out.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the period (exclusive); the first of next month if left out.
    #[arg(long)]
    pub to: Option<String>,
    /// Print the report as JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

pub async fn report(conn: &Connection, args: &ReportArgs) -> Result<String, CliError> {
    let (from, to) = period(&args.from, &args.to);
    let query = [("from", from.as_str()), ("to", to.as_str())];
    let r: api::OperatorReport = conn.client()?.get_query("/v1/report", &query).await?;
    if args.json {
        return Ok(json(&r));
    }
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    let mut text = format!("cluster report, {} to {}\n\n", r.from, r.to);
    writeln!(
        text,
        "capacity {:.2} GPU-h, used {:.2} ({}), idle {:.2}",
        r.capacity_gpu_hours,
        r.used_gpu_hours,
        pct(r.utilisation),
        r.idle_gpu_hours
    )
    .unwrap();
    writeln!(text, "\n{:<12} {:>12} {:>12} {:>14}", "TIER", "GPU-HOURS", "UTILISATION", "REVENUE USD")
        .unwrap();
    for t in &r.tiers {
        writeln!(
            text,
            "{:<12} {:>12.2} {:>12} {:>14}",
            t.tier,
            t.gpu_hours,
            pct(t.utilisation),
            amount(t.revenue_micro_usd)
        )
        .unwrap();
    }
    writeln!(
        text,
        "{:<12} {:>12} {:>12} {:>14}",
        "reservations",
        "",
        "",
        amount(r.reservation_revenue_micro_usd)
    )
    .unwrap();
    writeln!(text, "{:<12} {:>12} {:>12} {:>14}", "total", "", "", amount(r.total_revenue_micro_usd))
        .unwrap();
    writeln!(
        text,
        "\nthe preemptible tier sold {:.2} GPU-h of otherwise idle capacity for ${}; utilisation {} without it, {} with it",
        r.idle_capacity_sold_gpu_hours,
        amount(r.idle_capacity_sold_micro_usd),
        pct(r.utilisation_without_preemptible),
        pct(r.utilisation)
    )
    .unwrap();
    text.push_str(
        "\nGPU-hours here are GPU time used in the period, to the millisecond, running attempts\n\
         included; revenue is what was billed for the attempts that ended in it, as `ebb bill`\n\
         counts them (per started second), and the reservations' charges.\n",
    );
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The total, the on-demand figure and the savings are each rounded to
    /// the cent; the savings shown are the difference of the other two as
    /// shown.
    #[test]
    fn the_savings_shown_are_the_difference_of_the_figures_shown() {
        // 1.414_999 and 1.264_999: shown 1.41 and 1.26; the savings,
        // 0.150_000, shown 0.15 either way.
        assert_eq!(amount(shown_savings(1_414_999, 150_000)), "0.15");
        // 1.415_000 (1.42) less 0.144_999: 1.270_001 (1.27): 0.15, where
        // rounding the savings alone gives 0.14.
        assert_eq!(amount(144_999), "0.14");
        assert_eq!(amount(shown_savings(1_415_000, 144_999)), "0.15");
        assert_eq!(amount(shown_savings(0, 0)), "0.00");
        assert_eq!(shown_savings(i64::MAX, i64::MIN), shown_savings(i64::MAX, i64::MIN), "no overflow");
    }
}
