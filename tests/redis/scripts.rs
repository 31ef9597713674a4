//! The dedicated decision scripts against the general one: on random sequences, both reply
//! alike, store the same value and give the key the same time to live.
//!
//! * The GCRA-only script: requests, refunds, charges and reports over one to four GCRA
//!   quotas, with quotas held to their tolerance, with and without the zeros that end a
//!   request's arguments (which the store leaves out).
//! * The script of quotas without warm-up: requests and reports over one to four quotas of
//!   GCRA, fixed windows, sliding logs and sliding counters, some of them changed while
//!   serving (what had left their windows), with refunds and charges made by the general
//!   script on both keys between them, as the store sends them, with and without the zeros
//!   that end a request's arguments.
//!
//! Pins docs/design.md section 1 ("GCRA decision") and section 4 (the scripts).
#![cfg(feature = "redis")]

use crate::common;

use common::redis_server::RedisServer;

const GENERAL: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/gcra.lua")
);
const GCRA_ONLY: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/gcra_only.lua")
);
const PLAIN: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/plain.lua")
);

/// One script that runs the general script on `KEYS[1]` and `fast` on `KEYS[2]` with the same
/// arguments (the general one on both for a refund or a charge, as the store sends them),
/// then reads what each key holds (its value, or its sorted set's members and scores) and its
/// expiry time and the server's clock (ms) before and after, and makes both keys persist.
fn side_by_side(fast: &str) -> String {
    format!(
        "local function general()\n{GENERAL}\nend\nlocal function fast()\n{fast}\nend\n{}",
        r#"
local args, keys = {}, {KEYS[1], KEYS[2]}
for i, v in ipairs(ARGV) do args[i] = v end
local run = {general, fast}
local sign = string.byte(ARGV[1])
if sign == 45 or sign == 43 then run[2] = general end
local function ms() local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000) end
local out = {}
local start = ms()
for i = 1, 2 do
  for j = #ARGV, 1, -1 do ARGV[j] = nil end
  for j, v in ipairs(args) do ARGV[j] = v end
  KEYS[1], KEYS[2] = keys[i], nil
  out[i] = run[i]()
end
KEYS[1], KEYS[2] = keys[1], keys[2]
for i = 1, 2 do
  local k = keys[i]
  local t = redis.call('TYPE', k).ok
  local stored = {}
  if t == 'string' then stored = {redis.call('GET', k)}
  elseif t == 'zset' then stored = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end
  out[2 + i] = stored
  out[4 + i] = redis.call('PEXPIRETIME', k)
  redis.call('PERSIST', k)
end
out[7], out[8] = start, ms()
return out
"#
    )
}

/// Two replies, what each key holds, each key's expiry time in ms (-2: no key, -1: none) and
/// the server's clock before and after.
type Side = (
    Vec<i64>,
    Vec<i64>,
    Vec<String>,
    Vec<String>,
    i64,
    i64,
    i64,
    i64,
);

/// SplitMix64: a fixed sequence, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Half the time, leaves out the zeros that end `args` after the `n` quotas' numbers, as the
/// store sends a request: every script reads them as 0.
fn maybe_trim(args: &mut Vec<String>, n: usize, rng: &mut Rng) {
    if rng.below(2) == 0 {
        while args.len() > 3 + 3 * n && args.last().is_some_and(|a| a == "0") {
            args.pop();
        }
    }
}

#[tokio::test]
async fn the_gcra_only_script_decides_as_the_general_one() {
    let server = RedisServer::start();
    let mut conn = crate::common::redis_server::connection(&server).await;
    let mut shas = Vec::new();
    for script in [GENERAL, GCRA_ONLY] {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut conn)
            .await
            .unwrap();
        shas.push(sha);
    }
    let (general_sha, fast_sha) = (shas[0].clone(), shas[1].clone());
    let mut rng = Rng(42);
    for case in 0..300 {
        let n = 1 + rng.below(4) as usize;
        // Intervals up to 5 µs, 5 ms or 5 s.
        let scale = [1, 1_000, 1_000_000][rng.below(3) as usize];
        // Interval and tolerance in microseconds; a tolerance of at least one interval.
        let quotas: Vec<(u64, u64)> = (0..n)
            .map(|_| {
                let interval = 1 + rng.below(5 * scale);
                (interval, interval * (1 + rng.below(20)))
            })
            .collect();
        let mut now = 1_000_000_000 + rng.below(1_000_000);
        let mut last: Option<(u64, Vec<i64>)> = None;
        for step in 0..40 {
            now += rng.below(3) * rng.below(20 * scale);
            let cost = match rng.below(10) {
                0 => "0".to_owned(),
                1 => format!("-{}", 1 + rng.below(5)),
                2 => format!("+{}", 1 + rng.below(5)),
                _ => (1 + rng.below(8)).to_string(),
            };
            let mut args = vec![cost.clone(), now.to_string(), n.to_string()];
            for (interval, tolerance) in &quotas {
                args.extend(["0".to_owned(), interval.to_string(), tolerance.to_string()]);
            }
            // A refund gives back from the last admission's reservation, or (a lease's units)
            // from none.
            let reservation = last
                .clone()
                .filter(|_| cost.starts_with('-') && rng.below(2) == 0);
            args.push(reservation.as_ref().map_or(0, |r| r.0).to_string());
            args.extend(std::iter::repeat_n("0".to_owned(), 2 * n));
            if let Some((_, spots)) = &reservation {
                args.extend(spots.iter().map(|s| s.to_string()));
            } else {
                maybe_trim(&mut args, n, &mut rng);
            }
            // Both scripts back to back in one transaction, so that they run a moment apart on
            // the server's clock, then what each stored and until when.
            let mut pipe = redis::pipe();
            pipe.atomic();
            // The server's clock around the two scripts: how far apart they can have run.
            pipe.cmd("TIME");
            for (sha, key) in [(&general_sha, "general"), (&fast_sha, "fast")] {
                pipe.cmd("EVALSHA").arg(sha).arg(1).arg(key).arg(&args);
            }
            pipe.cmd("TIME");
            for key in ["general", "fast"] {
                pipe.cmd("GET").arg(key);
            }
            for key in ["general", "fast"] {
                pipe.cmd("PEXPIRETIME").arg(key);
            }
            // The scripts' times are the test's, not the server's: a key they set to expire in
            // a millisecond must not vanish on the server's clock before the next step.
            for key in ["general", "fast"] {
                pipe.cmd("PERSIST").arg(key).ignore();
            }
            type Both = (
                (u64, u64),
                Vec<i64>,
                Vec<i64>,
                (u64, u64),
                Option<String>,
                Option<String>,
                i64,
                i64,
            );
            let (before, g, f, after, g_stored, f_stored, g_expiry, f_expiry): Both =
                pipe.query_async(&mut conn).await.unwrap();
            let millis = |(s, us): (u64, u64)| (s * 1_000 + us / 1_000) as i64;
            // The two scripts ran between these milliseconds of the server's clock (a loaded
            // machine can stop the server between them): their expiry times may differ by
            // that much and no more.
            let apart = millis(after) - millis(before);
            let context = format!("case {case} step {step}: quotas {quotas:?}, args {args:?}");
            assert_eq!(g, f, "replies differ, {context}");
            if let (Ok(c), [0, ..]) = (cost.parse::<u64>(), g.as_slice()) {
                if c > 0 && g.len() == 2 + 4 * n {
                    last = Some((c, g[2 + 2 * n..].to_vec()));
                }
            }
            assert_eq!(g_stored, f_stored, "stored values differ, {context}");
            // The same time to live, from a server clock that may tick between the two.
            assert!(
                (g_expiry - f_expiry).abs() <= apart,
                "expiry {g_expiry} and {f_expiry}, {apart} ms apart at most, {context}"
            );
        }
        for key in ["general", "fast"] {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn the_script_of_quotas_without_warm_up_decides_as_the_general_one() {
    let server = RedisServer::start();
    let mut conn = crate::common::redis_server::connection(&server).await;
    let side_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(side_by_side(PLAIN))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut rng = Rng(7);
    let mut kinds_seen = [0u32; 4];
    let mut outcomes = [0u32; 3];
    let mut vanished = 0;
    for case in 0..400 {
        let n = 1 + rng.below(4) as usize;
        // Times up to 5 µs, 5 ms or 5 s.
        let scale = [1, 1_000, 1_000_000][rng.below(3) as usize];
        // Kind and two numbers: GCRA interval and tolerance, or a window's count and width.
        let quotas: Vec<(u64, u64, u64)> = (0..n)
            .map(|_| {
                let kind = rng.below(4);
                kinds_seen[kind as usize] += 1;
                if kind == 0 {
                    let interval = 1 + rng.below(5 * scale);
                    (0, interval, interval * (1 + rng.below(20)))
                } else {
                    (kind, 1 + rng.below(20), 1 + rng.below(20 * scale))
                }
            })
            .collect();
        // Near the clock's 0 (a window reaching before it) or far from it.
        let mut now = if rng.below(4) == 0 {
            rng.below(10 * scale)
        } else {
            1_000_000_000 + rng.below(1_000_000)
        };
        // What had left a replaced window: before now, or nothing.
        let gone: Vec<(u64, u64)> = quotas
            .iter()
            .map(|&(kind, _, width)| match (kind, rng.below(3)) {
                (2 | 3, 0) => (now.saturating_sub(rng.below(2 * width)), 0),
                (3, 1) => {
                    let g = now.saturating_sub(rng.below(2 * width));
                    (g, g.saturating_sub(rng.below(width)))
                }
                _ => (0, 0),
            })
            .collect();
        let mut last: Option<(u64, Vec<i64>)> = None;
        for step in 0..40 {
            now += rng.below(3) * rng.below(8 * scale);
            let cost = match rng.below(12) {
                0 => "0".to_owned(),
                1 => format!("-{}", 1 + rng.below(5)),
                2 => format!("+{}", 1 + rng.below(5)),
                _ => (1 + rng.below(6)).to_string(),
            };
            let adjust = cost.starts_with(['-', '+']);
            let mut args = vec![cost.clone(), now.to_string(), n.to_string()];
            for (kind, a, b) in &quotas {
                args.extend([kind.to_string(), a.to_string(), b.to_string()]);
            }
            let reservation = last
                .clone()
                .filter(|_| cost.starts_with('-') && rng.below(2) == 0);
            args.push(reservation.as_ref().map_or(0, |r| r.0).to_string());
            for (g, c) in &gone {
                args.extend([g.to_string(), c.to_string()]);
            }
            if let Some((_, spots)) = &reservation {
                args.extend(spots.iter().map(|s| s.to_string()));
            } else {
                maybe_trim(&mut args, n, &mut rng);
            }
            let (g, p, g_stored, p_stored, g_expiry, p_expiry, start, end): Side =
                redis::cmd("EVALSHA")
                    .arg(&side_sha)
                    .arg(2)
                    .arg("general")
                    .arg("plain")
                    .arg(&args)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            let context = format!(
                "case {case} step {step}: quotas {quotas:?}, gone {gone:?}, args {args:?}, \
                 stored {g_stored:?}"
            );
            // Redis deletes a key at once when the expiry it is given (in whole ms of its own
            // clock) is past by the time it looks, which a loaded machine can make a key due
            // within a ms: gone on one side only, or during an admission (which always leaves
            // a key). Both keys are forgotten then, and the sequence goes on from there.
            let due = |stored: &[String], expiry: i64| !stored.is_empty() && expiry <= end + 1;
            let admitted = !adjust && cost != "0" && (g[0] == 0 || p[0] == 0);
            if (g_stored.is_empty() && (admitted || due(&p_stored, p_expiry)))
                || (p_stored.is_empty() && (admitted || due(&g_stored, g_expiry)))
            {
                vanished += 1;
                let _: i64 = redis::cmd("DEL")
                    .arg("general")
                    .arg("plain")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                last = None;
                continue;
            }
            assert_eq!(g, p, "replies differ, {context}");
            if !adjust {
                outcomes[g[0] as usize] += 1;
            }
            if let (Ok(c), [0, ..]) = (cost.parse::<u64>(), g.as_slice()) {
                if c > 0 && g.len() == 2 + 4 * n {
                    last = Some((c, g[2 + 2 * n..].to_vec()));
                }
            }
            assert_eq!(g_stored, p_stored, "stored values differ, {context}");
            // The same time to live, from a server clock that may tick between the two.
            assert!(
                g_expiry == p_expiry
                    || (g_expiry > 0 && (g_expiry - p_expiry).abs() <= end - start),
                "expiry {g_expiry} and {p_expiry}, {start}..{end} ms, {context}"
            );
        }
        for key in ["general", "plain"] {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    // Every kind, and every outcome, was met.
    assert!(kinds_seen.iter().all(|&k| k > 50), "{kinds_seen:?}");
    assert!(outcomes.iter().all(|&o| o > 100), "{outcomes:?}");
    assert!(
        vanished < 100,
        "{vanished} of 16 000 steps lost a key to the server's clock"
    );
}

/// A refund rewrites the running totals of every log entry after the one it gives back from:
/// with thousands of them (more values than Lua's `unpack` gives at once), the log keeps
/// every other entry and its totals, instead of the script failing halfway with the entries
/// it had already removed gone.
#[tokio::test]
async fn a_refund_before_thousands_of_log_entries_keeps_the_others() {
    let server = RedisServer::start();
    let mut conn = crate::common::redis_server::connection(&server).await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(GENERAL)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A log of 10 000 per 100 s; 5 000 requests of cost 1, one µs apart.
    let quota = ["1", "2", "10000", "100000000"];
    let entries = 5_000u64;
    for from in (1..=entries).step_by(250) {
        let mut pipe = redis::pipe();
        for i in from..from + 250 {
            let now = (1_000_000_000 + i).to_string();
            pipe.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg("log")
                .arg("1")
                .arg(&now);
            pipe.arg(&quota[..]).arg(&["0", "0", "0"][..]).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    // The first request gives its unit back, from its reservation (its entry's time).
    let reply: Vec<i64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg("log")
        .arg(&["-1", "1000006000"][..])
        .arg(&quota[..])
        .arg(&["1", "0", "0", "1000000001", "0"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply, [0, 0, 10_000 - 4_999, 100_000_000 - 1_000]);
    let members: i64 = redis::cmd("ZCARD")
        .arg("log")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The words member and every entry but the first.
    assert_eq!(members, 1 + 4_999);
    let newest: Vec<String> = redis::cmd("ZRANGE")
        .arg("log")
        .arg(-1)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(newest, ["1000005000:0000000000004999:1"]);
    let oldest: Vec<String> = redis::cmd("ZRANGE")
        .arg("log")
        .arg(1)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(oldest, ["1000000002:0000000000000001:1"]);
}
