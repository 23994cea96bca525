//! Reports sized by what they weigh on the wire. The server refuses bodies
//! over [`ebb_api::MAX_REQUEST_BYTES`]; output weighs up to six times its
//! length once JSON escapes it (`\x01` is `\u0001`), so the agent measures
//! each event as serialised and packs reports under
//! [`ebb_api::MAX_REPORT_BYTES`], splitting output that would not fit.

use ebb_api::{AgentEvent, AttemptRef, Report};

/// Bytes `s` takes inside a JSON string, as serde_json writes it.
pub(crate) fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Bytes an output event of `attempt` with no data takes serialised.
fn output_overhead(attempt: AttemptRef) -> usize {
    let empty = AgentEvent::Output { attempt, data: String::new() };
    serde_json::to_vec(&empty).map_or(0, |v| v.len())
}

/// Bytes `event` takes serialised.
pub(crate) fn encoded_len(event: &AgentEvent) -> usize {
    match event {
        AgentEvent::Output { attempt, data } => output_overhead(*attempt) + escaped_len(data),
        other => serde_json::to_vec(other).map_or(0, |v| v.len()),
    }
}

/// `data` cut at character boundaries into pieces that each take at most
/// `max` bytes escaped (at least one character each).
pub(crate) fn split_escaped(data: &str, max: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut weight = 0;
    for (i, c) in data.char_indices() {
        let w = escaped_len(c.encode_utf8(&mut [0; 4]));
        if weight + w > max && i > start {
            pieces.push(data[start..i].to_string());
            start = i;
            weight = 0;
        }
        weight += w;
    }
    if start < data.len() {
        pieces.push(data[start..].to_string());
    }
    pieces
}

/// Events packed into reports from `node` whose bodies each take at most
/// `bound` bytes serialised, in order. Adjacent output of one attempt is
/// joined while it fits; output too large for any report is split. An
/// event other than output never is (each is far under any bound).
pub(crate) fn pack(node: &str, events: Vec<AgentEvent>, bound: usize) -> Vec<Vec<AgentEvent>> {
    let empty = Report { node: node.to_string(), events: Vec::new() };
    let base = serde_json::to_vec(&empty).map_or(0, |v| v.len());
    // Room for events (and the commas between them) in one report.
    let room = bound.saturating_sub(base).max(1);
    let mut reports = Vec::new();
    let mut current: Vec<AgentEvent> = Vec::new();
    let mut used = 0;
    let mut push = |event: AgentEvent, reports: &mut Vec<Vec<AgentEvent>>, current: &mut Vec<AgentEvent>| {
        let size = encoded_len(&event) + usize::from(!current.is_empty());
        if used + size > room && !current.is_empty() {
            reports.push(std::mem::take(current));
            used = 0;
        }
        let size = encoded_len(&event) + usize::from(!current.is_empty());
        // Joined to the output before it when the joined event fits.
        if let (
            Some(AgentEvent::Output { attempt: last, data }),
            AgentEvent::Output { attempt, data: more },
        ) = (current.last_mut(), &event)
        {
            let grow = escaped_len(more);
            if *last == *attempt && used + grow <= room {
                data.push_str(more);
                used += grow;
                return;
            }
        }
        used += size;
        current.push(event);
    };
    for event in events {
        match event {
            AgentEvent::Output { attempt, data } if encoded_len_of(attempt, &data) > room => {
                // Each piece fits a report of its own.
                let max = room.saturating_sub(output_overhead(attempt) + 1).max(1);
                for piece in split_escaped(&data, max) {
                    push(AgentEvent::Output { attempt, data: piece }, &mut reports, &mut current);
                }
            }
            event => push(event, &mut reports, &mut current),
        }
    }
    if !current.is_empty() {
        reports.push(current);
    }
    reports
}

fn encoded_len_of(attempt: AttemptRef, data: &str) -> usize {
    output_overhead(attempt) + escaped_len(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: AttemptRef = AttemptRef { job: 7, attempt: 1 };
    const B: AttemptRef = AttemptRef { job: 8, attempt: 1 };

    fn body(node: &str, events: &[AgentEvent]) -> usize {
        serde_json::to_vec(&Report { node: node.into(), events: events.to_vec() }).unwrap().len()
    }

    fn output(attempt: AttemptRef, data: &str) -> AgentEvent {
        AgentEvent::Output { attempt, data: data.into() }
    }

    fn exited(attempt: AttemptRef) -> AgentEvent {
        AgentEvent::Exited {
            attempt,
            code: Some(0),
            signal: None,
            completed: false,
            at_ms: 1,
            peak_memory_bytes: None,
        }
    }

    /// Output of `attempt` in `reports`, joined.
    fn joined(reports: &[Vec<AgentEvent>], attempt: AttemptRef) -> String {
        reports
            .iter()
            .flatten()
            .filter_map(|e| match e {
                AgentEvent::Output { attempt: a, data } if *a == attempt => Some(data.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn escaped_length_is_what_serde_json_writes() {
        for s in [
            "",
            "plain",
            "\x01\x02\x1f",
            "quote \" back \\ slash",
            "\n\r\t\x08\x0c",
            "é ✓ 🦀",
            "\x7f\u{fffd}",
        ] {
            assert_eq!(escaped_len(s), serde_json::to_string(s).unwrap().len() - 2, "{s:?}");
        }
    }

    #[test]
    fn a_megabyte_of_control_characters_is_split_into_reports_under_the_bound() {
        let data = "\x01".repeat(1_000_000) + "end";
        let events = vec![AgentEvent::Started { attempt: A, pid: 1, at_ms: 1 }, output(A, &data), exited(A)];
        let bound = 100_000;
        let reports = pack("node-1", events, bound);
        assert!(reports.len() >= 60, "6 MB escaped in 100 kB reports: {}", reports.len());
        for r in &reports {
            let size = body("node-1", r);
            assert!(size <= bound, "a report of {size} bytes");
        }
        assert_eq!(joined(&reports, A), data, "every byte, in order");
        let all: Vec<&AgentEvent> = reports.iter().flatten().collect();
        assert!(matches!(all.first(), Some(AgentEvent::Started { .. })));
        assert!(matches!(all.last(), Some(AgentEvent::Exited { .. })));
    }

    #[test]
    fn small_events_share_reports_and_output_is_joined_per_attempt_in_order() {
        let mut events = Vec::new();
        for i in 0..2000 {
            events.push(output(if i % 3 == 0 { B } else { A }, &format!("line {i}\n")));
        }
        events.push(exited(A));
        let bound = 4096;
        let reports = pack("n", events.clone(), bound);
        assert!(reports.len() > 1);
        for r in &reports {
            assert!(body("n", r) <= bound);
        }
        let expect = |attempt| -> String {
            events
                .iter()
                .filter_map(|e| match e {
                    AgentEvent::Output { attempt: a, data } if *a == attempt => Some(data.as_str()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(joined(&reports, A), expect(A));
        assert_eq!(joined(&reports, B), expect(B));
        assert!(matches!(reports.last().unwrap().last(), Some(AgentEvent::Exited { .. })));
    }

    #[test]
    fn adjacent_output_of_one_attempt_is_one_event() {
        let reports =
            pack("n", vec![output(A, "a"), output(A, "b"), output(B, "c"), output(A, "d")], 1 << 20);
        assert_eq!(reports, vec![vec![output(A, "ab"), output(B, "c"), output(A, "d")]]);
    }

    #[test]
    fn splitting_keeps_characters_whole() {
        let pieces = split_escaped("é✓🦀\x01ab", 4);
        assert_eq!(pieces.concat(), "é✓🦀\x01ab");
        assert!(pieces.iter().all(|p| escaped_len(p) <= 6), "{pieces:?}");
        assert_eq!(pieces, vec!["é", "✓", "🦀", "\x01", "ab"]);
    }
}
