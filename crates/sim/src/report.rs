//! The `--report` page: one self-contained HTML file (inline SVG charts
//! drawn with plotters, inline CSS, no scripts, nothing fetched), readable
//! offline.

use plotters::prelude::*;

use crate::summary::{SimOutput, Summary};

const TIERS: [&str; 3] = ["reserved", "on-demand", "preemptible"];
const COLOURS: [RGBColor; 3] = [RGBColor(124, 58, 237), RGBColor(37, 99, 235), RGBColor(245, 158, 11)];
const SIZE: (u32, u32) = (960, 320);

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

/// Draws one chart into an SVG string. `series` are (label colour, points).
fn chart(y_desc: &str, y_max: f64, series: Vec<(RGBColor, Vec<(f64, f64)>)>, stacked_area: bool) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).expect("svg fill");
        let x_max = series.iter().flat_map(|(_, p)| p.last()).map(|p| p.0).fold(1.0, f64::max);
        let mut ctx = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max.max(1e-9) * 1.05)
            .expect("chart axes");
        ctx.configure_mesh()
            .x_desc("hours since first submission")
            .y_desc(y_desc)
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
    chart("% of GPUs", 100.0, tier_points(&rows, true), true)
}

fn queue_chart(output: &SimOutput) -> String {
    let rows: Vec<[f64; 3]> = output.series.queued.iter().map(|r| r.map(|q| q as f64)).collect();
    let y_max = rows.iter().flatten().copied().fold(1.0, f64::max);
    chart("jobs queued", y_max, tier_points(&rows, false), false)
}

fn preemption_chart(output: &SimOutput) -> String {
    let points: Vec<(f64, f64)> =
        output.series.preemptions.iter().enumerate().map(|(h, n)| (h as f64, *n as f64)).collect();
    let y_max = points.iter().map(|p| p.1).fold(1.0, f64::max);
    chart("preemptions", y_max, vec![(RGBColor(220, 38, 38), points)], false)
}

fn revenue_chart(output: &SimOutput) -> String {
    let rows = &output.series.revenue_usd;
    let y_max = rows.last().map_or(1.0, |r| r.iter().sum::<f64>()).max(1.0);
    chart("USD", y_max, tier_points(rows, true), true)
}
