//! A sliding log's running totals on Redis are Lua doubles, exact below 2^53, and a debt is
//! logged whole (up to 2^32 - 1 a charge): a charge that would take the total past 2^52
//! counts the log's totals from 0 again first (src/redis/gcra.lua `log_rebase`). The key then
//! holds what a key counted from 0 holds, decides alike, and lives until the debt leaves the
//! window; a charge below leaves the totals as they are.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis").
#![cfg(feature = "redis")]

use crate::common::redis_server::{connection, RedisServer};

const GENERAL: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/gcra.lua")
);
const PLAIN: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/plain.lua")
);

/// 1 000 s, 60 s, in µs.
const NOW: u64 = 1_000_000_000;
const WIDTH: u64 = 60_000_000;

fn member(t: u64, total: u64, c: u64) -> String {
    format!("{t}:{total:016}:{c}")
}

async fn eval(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &str,
    key: &str,
    cost: &str,
    now: u64,
) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg(key)
        .arg(cost)
        .arg(now)
        .arg(1)
        .arg(2)
        .arg(10_000)
        .arg(WIDTH)
        .query_async(conn)
        .await
        .unwrap()
}

/// Three keys whose logs hold 40 and 20 units, counted from 2^52 - 1 000, from 2^40 and from
/// 0, each charged u32::MAX: the first is counted from 0 again, the second is not; all three
/// reply alike, hold the same costs, and refuse the next request until the debt has left.
#[tokio::test]
async fn a_charge_near_2_pow_52_counts_the_log_from_zero_and_decides_as_before() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let (t1, t2) = (NOW - 30_000_000, NOW - 10_000_000);
    let max = u64::from(u32::MAX);
    let mut replies = Vec::new();
    for (key, before) in [
        ("high", (1u64 << 52) - 1_000),
        ("mid", 1 << 40),
        ("zero", 0),
    ] {
        let _: i64 = redis::cmd("ZADD")
            .arg(key)
            .arg(t1)
            .arg(member(t1, before + 40, 40))
            .arg(t2)
            .arg(member(t2, before + 60, 20))
            .query_async(&mut conn)
            .await
            .unwrap();
        let charged = eval(&mut conn, GENERAL, key, &format!("+{max}"), NOW).await;
        let stored: Vec<String> = redis::cmd("ZRANGE")
            .arg(key)
            .arg("(-inf")
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut conn)
            .await
            .unwrap();
        let from = if key == "high" { 0 } else { before };
        assert_eq!(
            stored,
            vec![
                member(t1, from + 40, 40),
                member(t2, from + 60, 20),
                member(NOW, from + 60 + max, max),
            ],
            "{key}"
        );
        // Redis keeps the key until the debt, its newest entry, leaves the window: 60 s on
        // (of the server's clock, which ran a little since).
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((59_000..=60_000).contains(&ttl), "{key}: {ttl} ms");
        // A second later: refused until the debt leaves the window, 59 s on.
        let refused = eval(&mut conn, PLAIN, key, "1", NOW + 1_000_000).await;
        // The debt's last second: the 20 of t2 have left, the debt has not.
        let last = eval(&mut conn, PLAIN, key, "1", NOW + WIDTH - 1).await;
        let after = eval(&mut conn, PLAIN, key, "1", NOW + WIDTH).await;
        replies.push((charged, refused, last, after));
    }
    let (charged, refused, last, after) = &replies[0];
    assert_eq!(charged, &vec![0, 0, 0, WIDTH as i64]);
    assert_eq!(refused, &vec![1, 59_000_000, 0, 59_000_000]);
    assert_eq!(last, &vec![1, 1, 0, 1]);
    assert_eq!(after[..4], [0, 0, 9_999, WIDTH as i64]);
    assert!(replies.iter().all(|r| r == &replies[0]), "{replies:?}");
}
