//! The malformed-input corpus, checked in under `tests/corpus/`:
//!
//! - `rollup/EXPECT--NAME.bin`: encoded `RollupRequest`s (or bytes that are
//!   not one), fed to [`Master::rollup_bytes`] at a fixed time. `EXPECT` is
//!   the outcome: `ok`, a gRPC code (`invalid_argument`,
//!   `resource_exhausted`), or `any` for inputs the fuzzer found, which
//!   must only be answered without a panic. After each, the master must
//!   still serve a good rollup.
//! - `config/NAME.toml`: master configs whose first line is
//!   `# expect: TEXT`, the text the error must contain (`ok` for valid).
//!
//! The hand-written cases are built by `regenerate_the_rollup_corpus`
//! (ignored: run it with `--ignored` after changing them); the fuzz targets
//! in `crates/damper-master/fuzz` add what they find.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};
use prost::Message;

const T0_MS: u64 = 1_800_000_000_000;

fn corpus(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind)
}

fn master() -> Master {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let mut options = MasterOptions::default();
    options.max_entries = 1_000;
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)));
    Master::with_clock(config, options, clock)
}

fn counts(account: &str, attempted: u64, admitted: u64) -> AccountCounts {
    AccountCounts {
        op_cost: 0,
        ops: 0,
        id: 0,
        account: account.into(),
        attempted,
        admitted,
        start_unix_ms: 0,
    }
}

fn request(ops: Vec<(&str, Vec<AccountCounts>)>) -> RollupRequest {
    RollupRequest {
        agent_id: "corpus".into(),
        interval_start_unix_ms: T0_MS - 2_000,
        interval_end_unix_ms: T0_MS,
        ops: ops
            .into_iter()
            .map(|(op, accounts)| OpCounts {
                op_costs: Vec::new(),
                op_counts: Vec::new(),
                attempted: Vec::new(),
                ids: Vec::new(),
                rejected: Vec::new(),
                op: op.into(),
                accounts,
            })
            .collect(),
        ring_version: 0,
        ..Default::default()
    }
}

fn good() -> RollupRequest {
    request(vec![("messages", vec![counts("acme", 8_000, 8_000)])])
}

/// The hand-written cases: (file name, bytes).
fn cases() -> Vec<(String, Vec<u8>)> {
    let long = "x".repeat(257);
    let with = |f: &dyn Fn(&mut RollupRequest)| {
        let mut r = good();
        f(&mut r);
        r.encode_to_vec()
    };
    let mut cases = vec![
        ("ok--basic", good().encode_to_vec()),
        ("ok--empty-request", Vec::new()),
        // A claim no node could make (it once saturated and was counted).
        (
            "invalid_argument--implausible-counts",
            request(vec![("messages", vec![counts("acme", u64::MAX, u64::MAX)])]).encode_to_vec(),
        ),
        // The most one agent may claim, 10 M cost/s over the 2-s interval.
        (
            "ok--counts-at-the-ceiling",
            request(vec![(
                "messages",
                vec![counts("acme", 20_000_000, 20_000_000)],
            )])
            .encode_to_vec(),
        ),
        (
            "ok--clock-slightly-ahead",
            with(&|r| {
                r.interval_start_unix_ms += 30_000;
                r.interval_end_unix_ms += 30_000;
            }),
        ),
        (
            "invalid_argument--empty-account",
            request(vec![("messages", vec![counts("", 1, 1)])]).encode_to_vec(),
        ),
        (
            "invalid_argument--empty-op",
            request(vec![("", vec![counts("acme", 1, 1)])]).encode_to_vec(),
        ),
        (
            "invalid_argument--long-account",
            request(vec![("messages", vec![counts(&long, 1, 1)])]).encode_to_vec(),
        ),
        (
            "invalid_argument--long-op",
            request(vec![(&long, vec![counts("acme", 1, 1)])]).encode_to_vec(),
        ),
        (
            "invalid_argument--admitted-above-attempted",
            request(vec![("messages", vec![counts("acme", 1, 2)])]).encode_to_vec(),
        ),
        (
            "invalid_argument--ends-before-it-starts",
            with(&|r| r.interval_end_unix_ms = r.interval_start_unix_ms - 1),
        ),
        (
            "invalid_argument--entry-starts-after-the-end",
            with(&|r| r.ops[0].accounts[0].start_unix_ms = T0_MS + 1),
        ),
        (
            "invalid_argument--ends-an-hour-ahead",
            with(&|r| {
                r.interval_start_unix_ms += 3_600_000;
                r.interval_end_unix_ms += 3_600_000;
            }),
        ),
        (
            "invalid_argument--starts-at-the-epoch",
            with(&|r| r.interval_start_unix_ms = 0),
        ),
        (
            "invalid_argument--zero-interval-at-the-epoch",
            with(&|r| {
                r.interval_start_unix_ms = 0;
                r.interval_end_unix_ms = u64::MAX;
            }),
        ),
        (
            "invalid_argument--not-utf8-account",
            // Field 4 (ops) > field 2 (accounts) > field 1 (account) = 0xff 0xfe.
            vec![
                0x22, 0x0a, 0x0a, 0x01, b'm', 0x12, 0x05, 0x0a, 0x03, 0xff, 0xfe, 0x41,
            ],
        ),
        (
            "invalid_argument--truncated",
            good().encode_to_vec()[..10].to_vec(),
        ),
        (
            "invalid_argument--garbage",
            b"\xff\xff\xff\xff\xff\xff".to_vec(),
        ),
        (
            "invalid_argument--length-past-the-end",
            vec![0x22, 0xff, 0xff, 0xff, 0x0f, 0x00],
        ),
        (
            "resource_exhausted--too-many-entries",
            request(vec![(
                "messages",
                (0..1_001).map(|i| counts(&format!("a{i}"), 1, 1)).collect(),
            )])
            .encode_to_vec(),
        ),
    ];
    cases.sort();
    cases
        .into_iter()
        .map(|(name, bytes)| (format!("{name}.bin"), bytes))
        .collect()
}

#[test]
#[ignore = "writes the corpus files; run after changing the cases"]
fn regenerate_the_rollup_corpus() {
    let dir = corpus("rollup");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in cases() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn the_checked_in_cases_are_the_hand_written_ones() {
    for (name, bytes) in cases() {
        let on_disk = std::fs::read(corpus("rollup").join(&name))
            .unwrap_or_else(|e| panic!("{name}: {e}: run regenerate_the_rollup_corpus"));
        assert_eq!(
            on_disk, bytes,
            "{name} is stale: run regenerate_the_rollup_corpus"
        );
    }
}

#[test]
fn every_malformed_rollup_gets_its_status_and_the_master_stays_up() {
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(corpus("rollup"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let expect = name.split("--").next().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let m = master();
        let outcome = m.rollup_bytes(&bytes);
        match (expect, &outcome) {
            ("any", _) | ("ok", Ok(_)) => {}
            ("invalid_argument", Err(s)) if s.code() == tonic::Code::InvalidArgument => {}
            ("resource_exhausted", Err(s)) if s.code() == tonic::Code::ResourceExhausted => {}
            _ => panic!("{name}: expected {expect}, got {outcome:?}"),
        }
        if let Err(status) = &outcome {
            assert!(
                !status.message().is_empty(),
                "{name}: a status without a reason"
            );
            if expect != "any" && !status.message().starts_with("not a RollupRequest") {
                // A refused rollup counts nothing.
                assert!(m.is_empty(), "{name}: counted part of a refused rollup");
            }
        }
        // Still serving.
        assert!(m.rollup(&good()).is_ok(), "{name}: the master broke");
        seen += 1;
    }
    assert!(seen >= cases().len());
}

#[test]
fn every_config_in_the_corpus_is_refused_naming_what_is_wrong() {
    let mut seen = 0;
    for entry in std::fs::read_dir(corpus("config")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be `# expect: ...`", path.display()));
        match (expect, MasterConfig::from_toml(&text)) {
            ("ok", Ok(_)) => {}
            ("ok", Err(e)) => panic!("{}: {e}", path.display()),
            (_, Ok(_)) => panic!("{}: accepted", path.display()),
            (want, Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains(want),
                    "{}: {e:?} does not name {want:?}",
                    path.display()
                );
            }
        }
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} configs");
}
