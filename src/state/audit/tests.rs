use super::read::Entry;
use super::*;

#[test]
fn the_audit_log_rotates_by_size_and_count_without_splitting_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(AUDIT_FILE);
    let log = AuditLog::with_rotation(
        path.clone(),
        Rotation {
            max_bytes: 200,
            keep: 2,
        },
    );
    for i in 0..20 {
        log.append(&serde_json::json!({"event": "tick", "n": i, "pad": "x".repeat(40)}))
            .unwrap();
    }
    let mut seen = Vec::new();
    for name in ["audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"] {
        let text = fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(text.len() <= 200, "{name}: {}", text.len());
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            seen.push(v["n"].as_u64().unwrap());
        }
    }
    assert!(!dir.path().join("audit.jsonl.3").exists());
    // The newest records, in order, none split.
    assert_eq!(seen.last(), Some(&19));
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
}

#[test]
fn a_record_too_long_for_the_reader_keeps_its_newest_periods() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(AUDIT_FILE);
    let log = AuditLog::new(path.clone());
    // A rule over 2,000 periods of 8 GPUs: about 1 MB of evidence.
    let period = |i: usize| serde_json::json!({"start": i, "value": 0.01, "gpus": vec![0.01; 8], "note": "x".repeat(400)});
    let periods: Vec<_> = (0..2000).map(period).collect();
    log.append(&serde_json::json!({"event": "warning", "rule": "idle", "evidence": {"breaching": true, "periods": periods}}))
        .unwrap();
    // And one whose evidence is too large even without periods.
    log.append(&serde_json::json!({"event": "breach", "rule": "idle", "evidence": {"gpus": "y".repeat(100_000)}}))
        .unwrap();
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines.iter().all(|l| l.len() < MAX_RECORD_BYTES),
        "{:?}",
        lines.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    let warning: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let kept = warning["evidence"]["periods"].as_array().unwrap();
    let omitted = warning["evidence"]["periods_omitted"].as_u64().unwrap() as usize;
    assert_eq!(kept.len() + omitted, 2000);
    assert!(kept.len() > 50, "{}", kept.len());
    assert_eq!(
        kept.last().unwrap()["start"],
        1999,
        "the newest periods are kept"
    );
    assert_eq!(warning["evidence"]["breaching"], true);
    let breach: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert!(breach["evidence"]["omitted"]
        .as_str()
        .unwrap()
        .contains("too large"));
    // Short records are written as they are.
    log.append(&serde_json::json!({"event": "recovered", "rule": "idle"}))
        .unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().last(),
        Some("{\"event\":\"recovered\",\"rule\":\"idle\"}")
    );
}

#[test]
fn a_torn_line_never_merges_with_the_next_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(AUDIT_FILE);
    fs::write(&path, "{\"event\":\"ok\"}\n{\"event\":\"tor").unwrap();
    AuditLog::new(path.clone())
        .append(&serde_json::json!({"event": "next"}))
        .unwrap();
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[2], "{\"event\":\"next\"}");
}

/// One record of every kind, as the daemon writes it: the JSONL on disk is an interface
/// (scripts and `jq` read it), so a change to any line is a change a reviewer sees here.
#[test]
fn every_kind_of_record_is_written_as_its_golden_line() {
    use serde_json::json;
    let evidence = json!({"breaching_periods": 3, "periods": [0.01, 0.02, 0.0], "threshold": 0.05});
    let records = [
        AuditRecord::Started {
            rules: vec!["idle".into()],
            grace_until: "2026-12-01T00:10:00Z".into(),
        },
        AuditRecord::Stopped,
        AuditRecord::Breach {
            rule: "idle".into(),
            at: 1_796_083_200.0,
            evidence: evidence.clone(),
        },
        AuditRecord::Recovered {
            rule: "idle".into(),
            at: 1_796_083_200.0,
        },
        AuditRecord::Warning {
            rule: "idle".into(),
            at: 1_796_083_200.0,
            action: Action::Stop,
            due_at: "2026-12-01T00:15:00Z".into(),
            unless: "the GPUs are used again".into(),
            evidence: evidence.clone(),
        },
        AuditRecord::Cancelled {
            rule: "idle".into(),
            at: 1_796_083_200.0,
            action: Action::Stop,
            reason: "the GPUs are in use again".into(),
        },
        AuditRecord::Postponed {
            rule: "idle".into(),
            at: 1_796_083_200.0,
            action: Action::Terminate,
            reason: "held until 2026-12-01T02:00:00Z".into(),
        },
        AuditRecord::ActionAttempt {
            rule: "idle".into(),
            at: 1_796_083_200.0,
            action: Action::Stop,
            evidence,
        },
        AuditRecord::ActionResult {
            rule: "idle".into(),
            action: Action::Stop,
            result: "done".into(),
            detail: String::new(),
        },
        AuditRecord::ApiCall {
            rule: "idle".into(),
            operation: "StopInstances".into(),
            request_id: Some("req-1".into()),
        },
        AuditRecord::ApiError {
            rule: "idle".into(),
            operation: "StopInstances".into(),
            error: "UnauthorizedOperation".into(),
            request_id: None,
        },
        AuditRecord::InFlightAtRestart {
            rule: "idle".into(),
            action: Action::Stop,
            sent_at: "2026-12-01T00:15:00Z".into(),
            instance_state: Some("stopping".into()),
            repeated: false,
        },
        AuditRecord::BudgetAlert {
            budget: "monthly".into(),
            threshold: 0.8,
            basis: Basis::Actual,
            ratio: 0.81,
            limit: 1000.0,
        },
        AuditRecord::TopicPublish {
            budget: "monthly".into(),
            topic: "arn:cloud:topic:budgets".into(),
            message_id: Some("msg-1".into()),
        },
        AuditRecord::PeriodClosed {
            period_start: "2026-11-01T00:00:00Z".into(),
            period_end: "2026-12-01T00:00:00Z".into(),
            spent_usd: 712.5,
        },
        AuditRecord::SpotInterruption {
            notice: "Interruption { action: \"terminate\" }".into(),
        },
        AuditRecord::SpotRebalance,
        AuditRecord::InterruptionHook {
            command: vec!["/usr/local/bin/drain".into()],
            result: "done".into(),
        },
        AuditRecord::StateReset {
            reason: "state.json is corrupt".into(),
        },
    ];
    let mut got = String::new();
    for (i, r) in records.iter().enumerate() {
        let instance = (i % 2 == 0).then_some("i-0123456789abcdef0");
        got += &serde_json::to_string(&r.stamped(1_796_083_260.0, "enforce", instance)).unwrap();
        got.push('\n');
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audit/records.jsonl");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::write(&path, &got).unwrap();
    }
    assert_eq!(
        got,
        fs::read_to_string(&path).unwrap(),
        "rerun with UPDATE_GOLDEN=1 and review"
    );
    // The one reader reads every line back as the record it was.
    for (line, want) in got.lines().zip(&records) {
        let entry = Entry::parse(line).unwrap();
        assert_eq!(entry.record.as_ref(), Some(want), "{line}");
        assert_eq!(entry.time(), Some(1_796_083_260.0));
        assert!(!entry.sentence().contains(": {"), "{}", entry.sentence());
    }
}

#[test]
fn the_rotated_files_are_the_names_rotation_writes_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "audit.jsonl",
        "audit.jsonl.1",
        "audit.jsonl.2",
        "audit.jsonl.01",
        "audit.jsonl.+3",
        "audit.jsonl.x",
    ] {
        fs::write(dir.path().join(name), "{}\n").unwrap();
    }
    let names: Vec<String> = files(dir.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"]);
}

/// A breach, a recovery and an action's result have one sentence: `gpuwatch audit` reads each
/// record in the words `simulate` reports its event with (`Event::sentence`, `action_result`).
#[test]
fn the_reader_says_each_event_as_simulate_says_it() {
    use crate::rules::engine::Event;
    use crate::rules::window::{Assessment, Datapoint, DatapointState};
    let period = |start: f64| Datapoint {
        start,
        values: vec![(0, 0.01)],
        state: DatapointState::Breaching,
    };
    let evidence = Assessment {
        breaching: true,
        breaching_periods: 2,
        threshold: 0.05,
        periods: vec![period(0.0), period(600.0)],
        budget: None,
        problems: Vec::new(),
        gpus: Vec::new(),
    };
    let said = |record: AuditRecord| {
        let line = serde_json::to_string(&record.stamped(1_796_083_260.0, "enforce", None));
        let sentence = Entry::parse(&line.unwrap()).unwrap().sentence();
        sentence.split_once("  ").unwrap().1.to_string()
    };
    let breach = Event::Breach {
        rule: "idle".into(),
        evidence: evidence.clone(),
    };
    let recorded = said(AuditRecord::Breach {
        rule: "idle".into(),
        at: 0.0,
        evidence: serde_json::to_value(&evidence).unwrap(),
    });
    assert_eq!(
        recorded,
        format!("rule idle: {}", breach.sentence().unwrap())
    );
    assert_eq!(
        recorded,
        "rule idle: 2 of 2 periods breach the threshold 0.05"
    );
    let recovered = Event::Recovered {
        rule: "idle".into(),
    };
    assert_eq!(
        said(AuditRecord::Recovered {
            rule: "idle".into(),
            at: 0.0,
        }),
        format!("rule idle: {}", recovered.sentence().unwrap())
    );
    // A record whose oldest periods were left out to fit its line still counts them.
    let mut fitted = serde_json::to_value(&evidence).unwrap();
    fitted["periods"].as_array_mut().unwrap().remove(0);
    fitted["periods_omitted"] = 1.into();
    assert_eq!(
        said(AuditRecord::Breach {
            rule: "idle".into(),
            at: 0.0,
            evidence: fitted,
        }),
        recorded
    );
    // A dry run says what it would have done, as every action of a replay does.
    let result = |result: &str, detail: &str| {
        said(AuditRecord::ActionResult {
            rule: "idle".into(),
            action: Action::Stop,
            result: result.into(),
            detail: detail.into(),
        })
    };
    assert_eq!(
        result("dry_run", "would stop"),
        format!(
            "rule idle: {}",
            action_result(Action::Stop, "dry_run", "would stop")
        )
    );
    assert_eq!(result("dry_run", "would stop"), "rule idle: would stop");
    assert_eq!(result("done", ""), "rule idle: stop done");
    assert_eq!(
        result("refused", "no cloud"),
        "rule idle: stop refused: no cloud"
    );
}

/// A log written before budget alerts were published to any cloud's topic says `sns_publish`:
/// it reads as the same record, and `audit --kind budget` still lists it.
#[test]
fn an_older_log_s_sns_publish_reads_as_a_topic_publish() {
    let line = r#"{"budget":"monthly","event":"sns_publish","message_id":"msg-1","mode":"enforce","time":"2026-12-01T00:01:00Z"}"#;
    let entry = Entry::parse(line).unwrap();
    assert_eq!(
        entry.record,
        Some(AuditRecord::TopicPublish {
            budget: "monthly".into(),
            topic: String::new(),
            message_id: Some("msg-1".into()),
        })
    );
    assert_eq!(
        entry.sentence(),
        "2026-12-01 00:01  budget monthly alert published to its topic"
    );
}
