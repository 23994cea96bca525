//! `sinfo`: the nodes by partition and state, in Slurm's formats, so that
//! the tools that read it (SkyPilot's node list among them) work.

use std::fmt::Write;

use ebb_api as api;

use super::options::{self, Command};
use super::query::{render, say_ignored};
use crate::client::Client;
use crate::error::{usage, CliError};

/// A node's state as `sinfo` prints it: compact (`%t`) and long (`%T`).
pub fn node_state(node: &api::Node) -> (&'static str, &'static str) {
    // A GPU out of service for a fault is as good as taken.
    let taken = node.gpus_used + node.gpus_held + node.gpus_out.len() as u32;
    match (node.status.as_str(), taken) {
        ("up", 0) => ("idle", "idle"),
        ("up", used) if used >= u32::from(node.gpus) => ("alloc", "allocated"),
        ("up", _) => ("mix", "mixed"),
        ("draining", 0) => ("drain", "drained"),
        ("draining", _) => ("drng", "draining"),
        ("lost", _) => ("down", "down"),
        (_, _) => ("fail", "fail"),
    }
}

/// The `sinfo` format letters Ebb prints, with their headers.
const SINFO_FIELDS: &[(char, &str)] = &[
    ('P', "PARTITION"),
    ('R', "PARTITION"),
    ('a', "AVAIL"),
    ('l', "TIMELIMIT"),
    ('D', "NODES"),
    ('F', "NODES(A/I/O/T)"),
    ('t', "STATE"),
    ('T', "STATE"),
    ('N', "NODELIST"),
    ('n', "HOSTNAMES"),
    ('G', "GRES"),
    ('c', "CPUS"),
    ('m', "MEMORY"),
    ('E', "REASON"),
];

/// `sinfo -O`'s field names and the `%` letters that print them.
const SINFO_NAMES: &[(&str, char)] = &[
    ("partition", 'P'),
    ("partitionname", 'R'),
    ("available", 'a'),
    ("time", 'l'),
    ("nodes", 'D'),
    ("nodeaiot", 'F'),
    ("statecompact", 't'),
    ("statelong", 'T'),
    ("nodelist", 'N'),
    ("nodehost", 'n'),
    ("gres", 'G'),
    ("cpus", 'c'),
    ("memory", 'm'),
    ("reason", 'E'),
];

/// One row of `sinfo`: a partition's nodes in one state, or one node.
pub struct SinfoRow<'a> {
    partition: &'a str,
    default: bool,
    nodes: Vec<&'a api::Node>,
}

fn sinfo_field(row: &SinfoRow, letter: char) -> String {
    let names: Vec<&str> = row.nodes.iter().map(|n| n.name.as_str()).collect();
    let first = row.nodes.first();
    match letter {
        'P' if row.default => format!("{}*", row.partition),
        'P' | 'R' => row.partition.to_string(),
        'a' => "up".into(),
        'l' => "infinite".into(),
        'D' => row.nodes.len().to_string(),
        'F' => {
            let count =
                |states: &[&str]| row.nodes.iter().filter(|n| states.contains(&node_state(n).0)).count();
            let (busy, idle) = (count(&["alloc", "mix", "drng"]), count(&["idle"]));
            format!("{busy}/{idle}/{}/{}", row.nodes.len() - busy - idle, row.nodes.len())
        }
        't' => first.map_or("", |n| node_state(n).0).to_string(),
        'T' => first.map_or("", |n| node_state(n).1).to_string(),
        'N' | 'n' => ebb_core::hostlist::compress(&names),
        'G' => first.map_or("(null)".into(), |n| format!("gpu:{}:{}", n.gpu_model, n.gpus)),
        // What its agent said; unsaid, Slurm's own default for a node
        // whose line names none: 1.
        'c' => first.and_then(|n| n.cpus).unwrap_or(1).to_string(),
        'm' => first.and_then(|n| n.memory_mib).unwrap_or(1).to_string(),
        'E' => first
            .and_then(|n| n.drained_for.clone().or_else(|| n.unhealthy.clone()))
            .unwrap_or_else(|| "none".into()),
        _ => String::new(),
    }
}

/// `sinfo`'s rows for `format`: the nodes of each partition grouped by
/// state and, where the format shows it, GPUs (Slurm groups by every
/// field shown), or a row a node with `per_node`.
pub fn sinfo_rows(
    nodes: &[api::Node],
    partitions: &[(String, bool)],
    format: &str,
    per_node: bool,
) -> Vec<String> {
    let mut rows = Vec::new();
    for (partition, default) in partitions {
        let mut groups: Vec<SinfoRow> = Vec::new();
        for node in nodes {
            fn key<'n>(format: &str, n: &'n api::Node) -> Vec<&'n str> {
                let state = format.contains(['t', 'T', 'E']).then(|| node_state(n).0);
                state.into_iter().chain(format.contains('G').then_some(n.gpu_model.as_str())).collect()
            }
            let key = |n| key(format, n);
            match groups.iter_mut().find(|g| !per_node && key(g.nodes[0]) == key(node)) {
                Some(group) => group.nodes.push(node),
                None => groups.push(SinfoRow { partition, default: *default, nodes: vec![node] }),
            }
        }
        rows.extend(groups.iter().map(|row| render(format, |letter| sinfo_field(row, letter))));
    }
    rows
}

/// `sinfo`.
pub async fn sinfo(client: &Client, args: &[String]) -> Result<String, CliError> {
    let (given, words) = options::parse(Command::Sinfo, args, "")?;
    if let Some(word) = words.first() {
        return Err(usage(format!("{word:?} is not an option")));
    }
    if options::flag(&given, "helpformat") {
        return Ok(SINFO_FIELDS.iter().map(|(l, _)| format!("%{l}")).collect::<Vec<_>>().join(" ") + "\n");
    }
    if options::flag(&given, "helpstate") {
        return Ok("idle mix alloc drain drng down fail\n".into());
    }
    say_ignored(Command::Sinfo, &given);
    let flag = |long: &str| options::flag(&given, long);
    let per_node = flag("Node");
    let long = options::last(&given, "Format")
        .map(|spec| super::fields::long_format(spec, SINFO_NAMES, "node"))
        .transpose()?;
    let format = match options::last(&given, "format").map(str::to_string).or(long) {
        Some(format) => format,
        None if flag("list-reasons") => "%20E %N".into(),
        None if flag("summarize") => "%9P %.5a %.10l %.16F %N".into(),
        None if per_node && flag("long") => "%9N %.6D %9P %.11T %.10G".into(),
        None if per_node => "%9N %.6D %9P %6t".into(),
        None if flag("long") => "%9P %.5a %.10l %.6D %.11T %.12G %N".into(),
        None => "%9P %.5a %.10l %.6D %.6t %N".into(),
    };
    let lists = |long: &str| -> Vec<String> {
        given
            .iter()
            .filter(|(l, _)| *l == long)
            .flat_map(|(_, v)| v.split(',').map(|s| s.trim().to_ascii_lowercase()).collect::<Vec<_>>())
            .collect()
    };
    let mut wanted_nodes = Vec::new();
    for list in lists("nodes") {
        wanted_nodes
            .extend(ebb_core::hostlist::expand(&list).map_err(|e| usage(format!("--nodes={list}: {e}")))?);
    }
    let (states, wanted_partitions) = (lists("states"), lists("partition"));
    let mut nodes: Vec<api::Node> = client.get("/v1/nodes").await?;
    nodes.retain(|node| {
        let (compact, long) = node_state(node);
        (wanted_nodes.is_empty() || wanted_nodes.iter().any(|w| w.eq_ignore_ascii_case(&node.name)))
            && (states.is_empty() || states.iter().any(|s| s == compact || s == long || s == "all"))
            && (!flag("dead") || compact == "down")
            && (!flag("responding") || compact != "down")
            && (!flag("list-reasons") || ["drain", "drng", "down", "fail"].contains(&compact))
    });
    let partitions: Vec<api::Partition> = client.get("/v1/partitions").await?;
    let partitions: Vec<(String, bool)> = partitions
        .into_iter()
        .filter(|p| wanted_partitions.is_empty() || wanted_partitions.contains(&p.name.to_ascii_lowercase()))
        .map(|p| (p.name, p.default))
        .collect();
    if options::flag(&given, "json") {
        super::json::data_parser(&given)?;
        return Ok(super::json::sinfo(&nodes, &partitions));
    }
    let mut out = String::new();
    if !flag("noheader") {
        writeln!(
            out,
            "{}",
            render(&format, |letter| {
                SINFO_FIELDS.iter().find(|(l, _)| *l == letter).map_or("", |(_, name)| name).to_string()
            })
        )
        .unwrap();
    }
    // A node's reason is the node's, whatever its partitions.
    let partitions = if flag("list-reasons") { partitions.into_iter().take(1).collect() } else { partitions };
    for row in sinfo_rows(&nodes, &partitions, &format, per_node) {
        writeln!(out, "{row}").unwrap();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_grouped_by_state() {
        let node = |name: &str, used: u32, status: &str| api::Node {
            name: name.into(),
            gpu_model: "H100".into(),
            gpus: 4,
            status: status.into(),
            unhealthy: None,
            gpus_used: used,
            gpus_held: 0,
            held: Vec::new(),
            last_heartbeat: String::new(),
            jobs: Vec::new(),
            placements: Vec::new(),
            drained_for: None,
            gpus_out: Vec::new(),
            warnings: Vec::new(),
            address: None,
            cpus: (name != "node-1").then_some(32),
            memory_mib: (name != "node-1").then_some(257_000),
        };
        let mut faulted = node("node-4", 0, "up");
        faulted.gpus_out.push(api::GpuOutOfService {
            gpu: 3,
            reason: "GPU 3: Xid 79 (fallen off the bus)".into(),
            since: String::new(),
            until_returned: false,
        });
        let nodes = [
            node("node-0", 0, "up"),
            node("node-1", 0, "up"),
            node("node-2", 4, "up"),
            node("node-3", 1, "draining"),
            faulted,
        ];
        let text =
            sinfo_rows(&nodes, &[("spot".into(), true)], "%9P %.5a %.10l %.6D %.6t %N", false).join("\n");
        assert!(text.contains("spot*        up   infinite      1  alloc node-2"), "{text}");
        assert!(text.contains("spot*        up   infinite      2   idle node-[0-1]"), "{text}");
        assert!(
            text.contains("spot*        up   infinite      1    mix node-4"),
            "a GPU out is taken: {text}"
        );
        assert!(text.contains("drng node-3"), "{text}");
        // Node by node, with the fields SkyPilot reads; a node whose agent
        // did not say its CPUs and memory has Slurm's default, 1.
        let rows = sinfo_rows(&nodes, &[("spot".into(), true)], "%N|%t|%G|%c|%m|%P", true);
        assert_eq!(rows[0], "node-0|idle|gpu:H100:4|32|257000|spot*");
        assert_eq!(rows[1], "node-1|idle|gpu:H100:4|1|1|spot*");
        assert_eq!(rows[3], "node-3|drng|gpu:H100:4|32|257000|spot*");
        assert_eq!(rows.len(), 5);
    }
}
