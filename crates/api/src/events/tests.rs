use super::*;

fn stored(kind: EventKind, detail: &str) -> Event {
    match Event::from_stored(kind, detail) {
        (event, None) => event,
        (_, Some(why)) => panic!("{why}"),
    }
}

#[test]
fn every_kind_has_its_variant_and_writes_its_name() {
    for kind in EventKind::ALL {
        let event = Event::unknown(kind);
        assert_eq!(event.kind(), kind);
        let wire = serde_json::to_value(JobEvent {
            at: "t".into(),
            at_ms: 1,
            attempt: 2,
            event,
            text: String::new(),
        })
        .unwrap();
        assert_eq!(wire["kind"], kind.as_str(), "{wire}");
        assert!(wire["detail"].is_object(), "{wire}");
    }
}

#[test]
fn an_event_reads_back_as_written() {
    let events = [
        Event::Placed(PlacedDetail {
            placement: vec![NodeGpus { node: "a".into(), gpus: vec![0, 1] }],
            from_hold: true,
            checkpoint_interval: Some(CheckpointInterval { seconds: 60, why: "because".into() }),
        }),
        Event::Requeued(RequeuedDetail {
            reason: "preempted".into(),
            preemptions: Some(3),
            lost_gpu_seconds: Some(1.5),
            ..Default::default()
        }),
        Event::DrainNotice(DrainNoticeDetail {
            reason: "preempted by job 7".into(),
            detail: DrainCause { by: Some(7), node: None },
            ..Default::default()
        }),
        Event::Drill(DrillDetail::Notice(DrillNotice { attempt: 4, ..Default::default() })),
        Event::Cancelled(CancelledDetail { while_: Some("queued".into()) }),
    ];
    for event in events {
        assert_eq!(stored(event.kind(), &event.detail_json()), event);
        let whole =
            JobEvent { at: "t".into(), at_ms: 1, attempt: 2, event: event.clone(), text: String::new() };
        let back: JobEvent = serde_json::from_str(&serde_json::to_string(&whole).unwrap()).unwrap();
        assert_eq!(back, whole);
    }
}

/// Details as earlier versions stored them read as their kind's, with
/// what they said kept and what they lacked empty.
#[test]
fn details_an_earlier_version_stored_still_read() {
    assert_eq!(
        stored(EventKind::Requeued, r#"{"reason":"lost","node":"a"}"#),
        Event::Requeued(RequeuedDetail {
            reason: "lost".into(),
            node: Some("a".into()),
            ..Default::default()
        })
    );
    assert_eq!(
        stored(EventKind::Failed, r#"{"code":null,"signal":9}"#),
        Event::Failed(FailedDetail { signal: Some(9), ..Default::default() })
    );
    assert_eq!(
        stored(EventKind::Placed, r#"{"placement":[{"node":"a","gpus":[3]}],"from_hold":false}"#),
        Event::Placed(PlacedDetail {
            placement: vec![NodeGpus { node: "a".into(), gpus: vec![3] }],
            ..Default::default()
        })
    );
    assert_eq!(
        stored(EventKind::Submitted, r#"{"tier":"preemptible","gpus":2}"#),
        Event::Submitted(SubmittedDetail { tier: "preemptible".into(), gpus: 2, max_gpus: None, task: None })
    );
    assert_eq!(
        stored(EventKind::CancelRequested, r#"{"at":"2026-12-01T00:00:00Z"}"#),
        Event::CancelRequested(CancelRequestedDetail {
            at: Some("2026-12-01T00:00:00Z".into()),
            ..Default::default()
        })
    );
    let verdict = stored(
        EventKind::Drill,
        r#"{"phase":"verdict","attempt":1,"nodes":["a"],"notice_at":"x","notice_at_ms":1,
            "deadline":"y","deadline_ms":2,"window_seconds":3.0,"verdict":"ready"}"#,
    );
    let Event::Drill(DrillDetail::Verdict(drill)) = verdict else { panic!("{verdict:?}") };
    assert_eq!((drill.attempt, drill.verdict.as_deref()), (1, Some("ready")));
    // Unknown fields (a newer version's) are passed over.
    assert_eq!(
        stored(EventKind::Succeeded, r#"{"ran_ms":5,"later":true}"#),
        Event::Succeeded(SucceededDetail { ran_ms: Some(5) })
    );
}

/// Whatever a stored detail holds, reading it neither panics nor loses
/// the event's kind.
#[test]
fn an_unreadable_detail_keeps_its_kind() {
    let odd = [
        "",
        "null",
        "[]",
        "\"x\"",
        "{",
        r#"{"pid":-1}"#,
        r#"{"pid":"7"}"#,
        r#"{"phase":"later"}"#,
        r#"{"gpus":18446744073709551616}"#,
        r#"{"placement":{"node":1}}"#,
        "{}}",
        "\u{0}",
    ];
    for kind in EventKind::ALL {
        for detail in odd {
            let (event, why) = Event::from_stored(kind, detail);
            assert_eq!(event.kind(), kind, "{detail}");
            if let Some(why) = why {
                assert_eq!(event, Event::unknown(kind));
                assert!(why.contains(kind.as_str()), "{why}");
            }
        }
    }
}
