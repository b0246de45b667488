//! Property-based fuzzing of the RESP parser and of command-argument parsing: malformed
//! frames, huge claimed lengths, deep nesting and random commands give a clear error, never a
//! panic or an unbounded allocation.
//!
//! Runs for `FENCED_FUZZ_SECS` seconds (default 3) per target, so CI stays fast and a long run
//! is `FENCED_FUZZ_SECS=300 cargo test -p fenced-resp --release --test fuzz -- --nocapture`.

use std::time::{Duration, Instant};

use fenced_core::kv::{command_table, Argv, Keyspace, KvCommand};
use fenced_resp::frame::{parse_frame, parse_request, Limits};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn budget() -> Duration {
    let secs = std::env::var("FENCED_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    Duration::from_secs(secs)
}

/// Run `test` on values of `strategy` until the time budget is spent; returns the case count.
fn run_for<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) -> u64
where
    S::Value: std::fmt::Debug,
{
    let deadline = Instant::now() + budget();
    let cases = std::sync::atomic::AtomicU64::new(0);
    while Instant::now() < deadline {
        // A fresh runner (randomly seeded) per round: a runner that passed stays passed.
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        });
        let counted = |v: S::Value| {
            cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            test(v)
        };
        if let Err(e) = runner.run(&strategy, counted) {
            panic!("{e}");
        }
    }
    cases.into_inner()
}

/// A RESP element, possibly lying about its lengths.
fn element(depth: u32) -> BoxedStrategy<Vec<u8>> {
    let len = prop_oneof![
        Just(-1i64),
        Just(-2),
        0i64..20,
        Just(i64::MAX),
        Just(1 << 40),
        Just(16 * 1024 * 1024 + 1)
    ];
    let leaf = prop_oneof![
        (len.clone(), prop::collection::vec(any::<u8>(), 0..24)).prop_map(|(n, data)| {
            let mut v = format!("${n}\r\n").into_bytes();
            v.extend(data);
            v.extend(b"\r\n");
            v
        }),
        "[a-zA-Z0-9 ]{0,12}".prop_map(|s| format!("+{s}\r\n").into_bytes()),
        any::<i64>().prop_map(|i| format!(":{i}\r\n").into_bytes()),
        Just(b"_\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        leaf,
        (len, prop::collection::vec(element(depth - 1), 0..6)).prop_map(|(n, items)| {
            let mut v = format!("*{n}\r\n").into_bytes();
            for it in items {
                v.extend(it);
            }
            v
        }),
    ]
    .boxed()
}

fn check_parse(buf: &[u8]) -> Result<(), TestCaseError> {
    let limits = Limits::default();
    // Feed it in pieces, like a socket would; every prefix must be "incomplete" or a result.
    let mut offset = 0;
    while offset < buf.len() {
        match parse_request(&buf[offset..], &limits) {
            Ok(Some((argv, n))) => {
                prop_assert!(n > 0 && n <= buf.len() - offset);
                prop_assert!(argv.len() <= limits.max_elements);
                offset += n;
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = parse_frame(buf, &limits);
    Ok(())
}

#[test]
fn fuzz_parser_random_bytes() {
    let n = run_for(prop::collection::vec(any::<u8>(), 0..2048), |b| {
        check_parse(&b)
    });
    eprintln!("parser, random bytes: {n} cases");
}

#[test]
fn fuzz_parser_structured_frames() {
    let s = (
        prop::collection::vec(element(4), 1..4),
        any::<prop::sample::Index>(),
        any::<u8>(),
    );
    let n = run_for(s, |(frames, cut, flip)| {
        let buf: Vec<u8> = frames.concat();
        check_parse(&buf)?;
        // A truncated frame and one with a flipped byte.
        check_parse(&buf[..cut.index(buf.len() + 1)])?;
        let mut b = buf.clone();
        if !b.is_empty() {
            let i = cut.index(b.len());
            b[i] ^= flip;
        }
        check_parse(&b)
    });
    eprintln!("parser, structured frames: {n} cases");
}

#[test]
fn deep_nesting_and_huge_claims_are_errors() {
    let limits = Limits::default();
    let deep = "*1\r\n".repeat(100_000);
    assert!(parse_request(deep.as_bytes(), &limits).is_err());
    assert!(parse_request(b"*1048577\r\n", &limits).is_err());
    assert!(parse_request(b"*1\r\n$17179869184\r\n", &limits).is_err());
    let long_header = format!("*{}\r\n", "1".repeat(10_000));
    assert!(parse_request(long_header.as_bytes(), &limits).is_err());
}

fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"k".to_vec()),
        Just(b"h".to_vec()),
        Just(b"l".to_vec()),
        Just(b"z".to_vec()),
        prop::sample::select(vec![
            "NX",
            "XX",
            "GT",
            "LT",
            "EX",
            "PX",
            "EXAT",
            "PXAT",
            "KEEPTTL",
            "GET",
            "CH",
            "INCR",
            "WITHSCORES",
            "LIMIT",
            "BYSCORE",
            "REV",
            "MATCH",
            "COUNT",
            "TYPE",
            "LOAD",
            "EXISTS",
            "FLUSH",
            "(1",
            "-inf",
            "+inf",
            "inf",
            "nan",
            "-0",
            "0",
            "1",
            "-1",
            "2",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "1e308",
            "3.5",
            "*",
            "[a-",
            "\\",
            "return 1",
            "return redis.call('GET', KEYS[1])",
            "return redis.call(ARGV[1], KEYS[1], ARGV[2])",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        any::<i64>().prop_map(|i| i.to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..16),
    ]
}

fn command() -> impl Strategy<Value = Argv> {
    let names: Vec<&'static str> = command_table().iter().map(|c| c.name).collect();
    (
        prop::sample::select(names),
        prop::collection::vec(arg(), 0..7),
    )
        .prop_map(|(n, args)| {
            let mut v = vec![n.as_bytes().to_vec()];
            v.extend(args);
            v
        })
}

#[test]
fn fuzz_command_arguments() {
    let n = run_for(prop::collection::vec(command(), 1..12), |cmds| {
        let mut ks = Keyspace::default();
        let mut events = Vec::new();
        let mut now = 1_000_000;
        for (i, c) in cmds.iter().enumerate() {
            now += 7;
            ks.expire_due(now);
            let _ = ks.read(now, c);
            let r = ks.apply(
                &mut (i as u64 + 1),
                fenced_core::Semantics::NEWEST,
                now,
                &KvCommand::Batch(vec![c.clone()]),
                &mut events,
            );
            prop_assert_eq!(r.replies.len(), 1);
        }
        let multi = KvCommand::Multi {
            watches: vec![(b"k".to_vec(), 0)],
            cmds: cmds.clone(),
        };
        let _ = ks.apply(
            &mut 1000,
            fenced_core::Semantics::NEWEST,
            now,
            &multi,
            &mut events,
        );
        Ok(())
    });
    eprintln!("command arguments: {n} cases");
}
