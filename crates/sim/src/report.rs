//! The `--report` page: one self-contained HTML file (inline SVG charts
//! drawn with plotters, inline CSS, no scripts, nothing fetched), readable
//! offline.

use plotters::prelude::*;

use crate::summary::{SimOutput, Summary};

const TIERS: [&str; 3] = ["reserved", "on-demand", "preemptible"];
/// The dashboard's tier colours (`crates/server/web/app.css`): one tier
/// reads the same on both.
const COLOURS: [RGBColor; 3] =
    [RGBColor(0x5b, 0x2a, 0x86), RGBColor(0x0b, 0x4f, 0x9c), RGBColor(0x1d, 0x6b, 0x38)];
const SIZE: (u32, u32) = (960, 360);
/// Axis labels and their descriptions, at a size read without zooming
/// (plotters writes 21 as about 17 px).
const FONT: (&str, u32) = ("sans-serif", 21);

/// Renders the whole page.
pub fn html(output: &SimOutput) -> String {
    let s = &output.summary;
    let mut page = String::new();
    page.push_str(concat!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>ebb sim report</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#111}",
        "table{border-collapse:collapse;margin:1em 0}td,th{padding:.25em .8em;border-bottom:1px solid #ddd;text-align:right}",
        "th:first-child,td:first-child{text-align:left}h2{margin-top:2em}figure{margin:0}",
        ".legend span{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;vertical-align:middle}",
        "</style></head><body>\n<h1>ebb sim report</h1>\n"
    ));
    page.push_str(&format!("<p>{}</p>\n", escape(&describe(s))));
    page.push_str(&summary_table(s));
    page.push_str("<p class=\"legend\">");
    for (name, c) in TIERS.iter().zip(COLOURS) {
        page.push_str(&format!("<span style=\"background:rgb({},{},{})\"></span>{name}", c.0, c.1, c.2));
    }
    page.push_str("</p>\n");
    let charts: [(&str, String); 4] = [
        ("GPU utilisation by tier (share of the cluster, hourly mean)", utilisation_chart(output)),
        ("Jobs waiting, by tier", queue_chart(output)),
        ("Preemptions per hour", preemption_chart(output)),
        ("Cumulative revenue (USD)", revenue_chart(output)),
    ];
    for (title, svg) in charts {
        page.push_str(&format!("<h2>{title}</h2>\n<figure>{svg}</figure>\n"));
    }
    page.push_str("</body></html>\n");
    page
}

fn describe(s: &Summary) -> String {
    let c = &s.config;
    format!(
        "{} on {} nodes x {} {} GPUs; drain window {} s, notice {}, victim policy {}, min runtime {} s; \
         traces: {}.",
        if c.preemptible_fraction > 0.0 {
            format!("{:.0}% of untagged jobs preemptible", c.preemptible_fraction * 100.0)
        } else {
            "tiers as given".into()
        },
        c.nodes,
        c.gpus_per_node,
        c.gpu_model,
        c.drain_window_s,
        c.notice,
        c.victim_policy,
        c.min_runtime_s,
        c.traces.join(", ")
    )
}

fn summary_table(s: &Summary) -> String {
    let rows = s.rows();
    let mut table = String::from("<table>\n");
    for (name, value) in rows {
        table.push_str(&format!("<tr><th>{}</th><td>{}</td></tr>\n", escape(name), escape(&value)));
    }
    table.push_str("</table>\n");
    table
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A y axis: what it measures, and how its ticks read.
struct Axis {
    desc: &'static str,
    max: f64,
    label: fn(f64) -> String,
}

/// Draws one chart into an SVG string. `series` are (label colour, points).
fn chart(y: Axis, series: Vec<(RGBColor, Vec<(f64, f64)>)>, stacked_area: bool) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).expect("svg fill");
        let x_max = series.iter().flat_map(|(_, p)| p.last()).map(|p| p.0).fold(1.0, f64::max);
        let mut ctx = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(52)
            .y_label_area_size(88)
            .build_cartesian_2d(0.0..x_max, 0.0..y.max.max(1e-9) * 1.05)
            .expect("chart axes");
        ctx.configure_mesh()
            .x_desc("hours since the first submission")
            .y_desc(y.desc)
            .x_label_formatter(&|x| count(*x))
            .y_label_formatter(&|v| (y.label)(*v))
            .label_style(FONT)
            .axis_desc_style(FONT)
            .light_line_style(RGBColor(240, 240, 240))
            .draw()
            .expect("mesh");
        for (colour, points) in series {
            if stacked_area {
                ctx.draw_series(AreaSeries::new(points, 0.0, colour.mix(0.85)).border_style(colour))
                    .expect("area");
            } else {
                ctx.draw_series(LineSeries::new(points, colour.stroke_width(2))).expect("line");
            }
        }
        root.present().expect("svg present");
    }
    svg
}

/// Per-tier points of `values` (one row per hour), optionally stacked.
fn tier_points(rows: &[[f64; 3]], stack: bool) -> Vec<(RGBColor, Vec<(f64, f64)>)> {
    // Stacked areas are drawn top layer first so lower layers stay visible.
    let order: Vec<usize> = if stack { vec![2, 1, 0] } else { vec![0, 1, 2] };
    order
        .into_iter()
        .map(|tier| {
            let points = rows
                .iter()
                .enumerate()
                .map(|(h, row)| {
                    let v = if stack { row[..=tier].iter().sum() } else { row[tier] };
                    (h as f64, v)
                })
                .collect();
            (COLOURS[tier], points)
        })
        .collect()
}

fn utilisation_chart(output: &SimOutput) -> String {
    let capacity = output.capacity_gpus.max(1) as f64;
    let rows: Vec<[f64; 3]> =
        output.series.busy_gpus.iter().map(|r| r.map(|g| g / capacity * 100.0)).collect();
    chart(Axis { desc: "share of the GPUs", max: 100.0, label: percent }, tier_points(&rows, true), true)
}

fn queue_chart(output: &SimOutput) -> String {
    let rows: Vec<[f64; 3]> = output.series.queued.iter().map(|r| r.map(|q| q as f64)).collect();
    let y_max = rows.iter().flatten().copied().fold(1.0, f64::max);
    chart(Axis { desc: "jobs queued", max: y_max, label: count }, tier_points(&rows, false), false)
}

fn preemption_chart(output: &SimOutput) -> String {
    let points: Vec<(f64, f64)> =
        output.series.preemptions.iter().enumerate().map(|(h, n)| (h as f64, *n as f64)).collect();
    let y_max = points.iter().map(|p| p.1).fold(1.0, f64::max);
    // The dashboard's draining colour: a preemption is a drain.
    chart(
        Axis { desc: "preemptions", max: y_max, label: count },
        vec![(RGBColor(0x9a, 0x3a, 0x00), points)],
        false,
    )
}

fn revenue_chart(output: &SimOutput) -> String {
    let rows = &output.series.revenue_usd;
    let y_max = rows.last().map_or(1.0, |r| r.iter().sum::<f64>()).max(1.0);
    chart(Axis { desc: "revenue", max: y_max, label: dollars }, tier_points(rows, true), true)
}

/// `40%`.
fn percent(v: f64) -> String {
    format!("{v:.0}%")
}

/// A count as people read a tick: `850`, `12k`, `1.5k`, `2.4M`.
fn count(v: f64) -> String {
    short(v, "")
}

/// Dollars as people read a tick: `$0`, `$950`, `$160k`, `$1.2M`.
fn dollars(v: f64) -> String {
    short(v, "$")
}

fn short(v: f64, unit: &str) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    // One decimal where a tick needs it (1.5k), none where it does not.
    let text = format!("{scaled:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{unit}{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_people_write_them() {
        assert_eq!(dollars(160_000.0), "$160k");
        assert_eq!(dollars(1_250_000.0), "$1.2M");
        assert_eq!(dollars(0.0), "$0");
        assert_eq!(dollars(950.0), "$950");
        assert_eq!(dollars(12.5), "$12.5");
        assert_eq!(count(1500.0), "1.5k");
        assert_eq!(count(40.0), "40");
        assert_eq!(percent(100.0), "100%");
        assert_eq!(percent(37.4), "37%");
    }
}
