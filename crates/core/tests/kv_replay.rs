//! Replaying the same log gives the same keyspace, Lua scripts included (also under an ACL
//! restriction that refuses some of their calls), and a snapshot taken anywhere continues
//! identically.

use fenced_core::kv::{Argv, KvCommand, Restriction};
use fenced_core::{Command, Request, RequestId, StateMachine};
use proptest::prelude::*;

const SCRIPTS: &[&str] = &[
    "return redis.call('INCRBY', KEYS[1], math.random(100))",
    "local t = {} for i = 1, 5 do t[i] = math.random() end redis.call('SET', KEYS[1], table.concat(t, ',')) return 1",
    "local n = tonumber(redis.call('GET', KEYS[1]) or '0') or 0 redis.call('HSET', 'h', KEYS[1], n + 1) return n",
    "redis.call('RPUSH', KEYS[1], ARGV[1]) error('fails after a write')",
    "redis.call('SET', KEYS[1], redis.call('TIME')[1]) return redis.call('TIME')",
    "local t = {} for k, v in pairs({a=1, b=2, c=3, d=4}) do t[#t+1] = k end redis.call('SET', KEYS[1], table.concat(t)) return t",
];

fn cmd_strategy() -> impl Strategy<Value = Argv> {
    let key = prop::sample::select(vec!["a", "b", "c", "h", "l"]);
    let s = |v: Vec<String>| v.into_iter().map(String::into_bytes).collect::<Argv>();
    prop_oneof![
        (key.clone(), 0u32..1000).prop_map(move |(k, v)| s(vec![
            "SET".into(),
            k.into(),
            v.to_string()
        ])),
        (key.clone(), 1u32..500).prop_map(move |(k, ms)| s(vec![
            "SET".into(),
            k.into(),
            "x".into(),
            "PX".into(),
            ms.to_string()
        ])),
        key.clone()
            .prop_map(move |k| s(vec!["INCR".into(), k.into()])),
        key.clone()
            .prop_map(move |k| s(vec!["DEL".into(), k.into()])),
        (key.clone(), 0u32..9).prop_map(move |(k, v)| s(vec![
            "RPUSH".into(),
            k.into(),
            v.to_string()
        ])),
        key.clone()
            .prop_map(move |k| s(vec!["LPOP".into(), k.into()])),
        (key.clone(), 0u32..9).prop_map(move |(k, v)| s(vec![
            "ZADD".into(),
            k.into(),
            v.to_string(),
            format!("m{v}")
        ])),
        (key.clone(), 1u32..300).prop_map(move |(k, ms)| s(vec![
            "PEXPIRE".into(),
            k.into(),
            ms.to_string()
        ])),
        (key.clone(), 0u64..50).prop_map(move |(k, t)| s(vec![
            "FENCE.SET".into(),
            k.into(),
            "v".into(),
            t.to_string()
        ])),
        (key, 0..SCRIPTS.len(), 0u32..9).prop_map(move |(k, i, a)| s(vec![
            "EVAL".into(),
            SCRIPTS[i].into(),
            "1".into(),
            k.into(),
            a.to_string()
        ])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn replay_is_deterministic(cmds in prop::collection::vec((cmd_strategy(), 0u64..200, any::<bool>()), 1..60), cut in 0usize..60) {
        let mut time = 1_000_000u64;
        let log: Vec<Request> = cmds.into_iter().enumerate().map(|(i, (argv, dt, restricted))| {
            time += dt;
            let mut cmd = KvCommand::Batch(vec![argv]);
            if restricted {
                // Keys a, b and h only: commands on c or l are refused, and a script on c
                // fails at its first call (one on a may still write h first).
                cmd = KvCommand::Restricted {
                    limits: Restriction {
                        user: "u".into(),
                        keys: Some(vec![b"a".to_vec(), b"b".to_vec(), b"h".to_vec()]),
                        channels: None,
                        commands: None,
                    },
                    cmd: Box::new(cmd),
                };
            }
            Request {
                time_ms: time,
                client: Some(RequestId { client_id: 7, seq: i as u64 + 1 }),
                cmd: Command::Kv(cmd),
            }
        }).collect();
        let mut a = StateMachine::new();
        let mut b = StateMachine::new();
        let mut outs = Vec::new();
        for (i, r) in log.iter().enumerate() {
            outs.push(a.apply(i as u64 + 1, r));
        }
        let cut = cut.min(log.len());
        for (i, r) in log.iter().enumerate().take(cut) {
            prop_assert_eq!(&b.apply(i as u64 + 1, r), &outs[i]);
        }
        // Continue from a snapshot of b.
        let mut c = StateMachine::from_bytes(&b.to_bytes()).expect("snapshot decodes");
        for (i, r) in log.iter().enumerate().skip(cut) {
            prop_assert_eq!(&c.apply(i as u64 + 1, r), &outs[i]);
        }
        prop_assert_eq!(&a, &c);
    }
}
