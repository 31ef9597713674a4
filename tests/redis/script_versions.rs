//! Keys written by the scripts before the cheaper Redis requests (commit 44ac33d, kept in
//! `scripts_before/`) read by these scripts, and the other way round, as instances of two
//! versions serve one key while a deployment rolls: the same replies, stored values and times
//! to live as a key only the earlier scripts served. A limit that reset at an upgrade would
//! show here as a reply of the mixed key with more remaining.
//!
//! And a sliding log of more than ten thousand entries of costs above 1, admitted by
//! `plain.lua`, given back from its newest, its oldest and a middle entry by the general
//! script, held to the general script alone and to the sum of costs.
#![cfg(feature = "redis")]

use std::collections::HashMap;

use crate::common;

use common::redis_server::RedisServer;

const BEFORE_GENERAL: &str = concat!(
    include_str!("scripts_before/prelude.lua"),
    include_str!("scripts_before/gcra.lua")
);
const BEFORE_PLAIN: &str = concat!(
    include_str!("scripts_before/prelude.lua"),
    include_str!("scripts_before/plain.lua")
);
const GENERAL: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/gcra.lua")
);
const PLAIN: &str = concat!(
    include_str!("../../src/redis/prelude.lua"),
    include_str!("../../src/redis/plain.lua")
);

/// One script that runs one of the four on `KEYS[1]` (`ARGV[1]`: "bg", "bp", "g", "p", the
/// rest its arguments), then gives its reply, what the key holds, its expiry time and the
/// server's clock (ms) before and after, and makes the key persist (so that only the
/// scripts' own idea of time moves its state).
fn runner() -> String {
    format!(
        "local function bg()\n{BEFORE_GENERAL}\nend\nlocal function bp()\n{BEFORE_PLAIN}\nend\n\
         local function g()\n{GENERAL}\nend\nlocal function p()\n{PLAIN}\nend\n{}",
        r#"
local which = ARGV[1]
local args = {}
for i = 2, #ARGV do args[i - 1] = ARGV[i] end
for j = #ARGV, 1, -1 do ARGV[j] = nil end
for j, v in ipairs(args) do ARGV[j] = v end
local function ms() local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000) end
local start = ms()
local run = {bg = bg, bp = bp, g = g, p = p}
local reply = run[which]()
local k = KEYS[1]
local t = redis.call('TYPE', k).ok
local stored = {}
if t == 'string' then stored = {redis.call('GET', k)}
elseif t == 'zset' then stored = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end
local expiry = redis.call('PEXPIRETIME', k)
redis.call('PERSIST', k)
return {reply, stored, expiry, start, ms()}
"#
    )
}

type Run = (Vec<i64>, Vec<String>, i64, i64, i64);

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

async fn run(
    conn: &mut redis::aio::MultiplexedConnection,
    sha: &str,
    key: &str,
    which: &str,
    args: &[String],
) -> Run {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(which)
        .arg(args)
        .query_async(conn)
        .await
        .unwrap()
}

/// The time to live a run gave its key, as the range of ms it can be from the server's clock
/// around it (-1, -2: none, no key).
fn ttl(expiry: i64, start: i64, end: i64) -> (i64, i64) {
    if expiry < 0 {
        (expiry, expiry)
    } else {
        (expiry - end, expiry - start)
    }
}

/// Which script runs a step on one key, and whether it is sent without the zeros that end its
/// arguments.
type Pick<'a> = &'a mut dyn FnMut(bool, &mut Rng) -> (&'static str, bool);

/// What a replay met: outcomes of requests, quotas of each kind, steps run by each choice.
struct Met {
    outcomes: [u32; 3],
    kinds: [u32; 5],
    picks: HashMap<&'static str, u32>,
    /// Steps after which a key was gone on one side only, by the server's clock.
    vanished: u32,
}

/// Random sequences of 40 steps on 300 policies of one to four quotas (a warm-up quota in one
/// policy of four when `warm_up`), run on two keys, each step by the script `first` and
/// `second` pick (told whether the store would send it to the general script: a refund, a
/// charge or a warm-up quota); both keys must give the same replies, hold the same values
/// and get the same times to live. What had left replaced windows is strictly before the
/// request's time, or when `ahead`, anywhere up to a window after it (quotas changed on a
/// clock ahead of the server's). Times count from near 0 or from the Unix epoch.
async fn replay(seed: u64, warm_up: bool, ahead: bool, first: Pick<'_>, second: Pick<'_>) -> Met {
    let server = RedisServer::start();
    let mut conn = crate::common::redis_server::connection(&server).await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(runner())
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut rng = Rng(seed);
    let mut met = Met {
        outcomes: [0; 3],
        kinds: [0; 5],
        picks: HashMap::new(),
        vanished: 0,
    };
    for case in 0..300 {
        let n = 1 + rng.below(4) as usize;
        let scale = [1, 1_000, 1_000_000][rng.below(3) as usize];
        // Kind and two numbers; a warm-up quota (kind 4) in one case of four.
        let warm_case = warm_up && rng.below(4) == 0;
        let quotas: Vec<(u64, u64, u64)> = (0..n)
            .map(|_| {
                let kind = rng.below(if warm_case { 5 } else { 4 });
                met.kinds[kind as usize] += 1;
                if kind == 0 || kind == 4 {
                    let interval = 1 + rng.below(5 * scale);
                    (kind, interval, interval * (1 + rng.below(20)))
                } else {
                    (kind, 1 + rng.below(20), 1 + rng.below(20 * scale))
                }
            })
            .collect();
        let warm: Vec<(u64, u64)> = quotas
            .iter()
            .filter(|q| q.0 == 4)
            .map(|q| (q.1 * (1 + rng.below(40)), 1 + rng.below(5)))
            .collect();
        // Times from a clock started near 0, or from the Unix epoch (µs of a 2025 date, where
        // a time takes 16 digits).
        let base = [1_000_000_000, 1_764_000_000_000_000][rng.below(2) as usize];
        let mut now = base + rng.below(1_000_000);
        // What had left a replaced window.
        let left = |rng: &mut Rng, width: u64| {
            if ahead {
                now + rng.below(width + 1) - rng.below(2 * width)
            } else {
                now - 1 - rng.below(2 * width)
            }
        };
        let gone: Vec<(u64, u64)> = quotas
            .iter()
            .map(|&(kind, _, width)| match (kind, rng.below(3)) {
                (2 | 3, 0) => (left(&mut rng, width), 0),
                (3, 1) => {
                    let g = left(&mut rng, width);
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
            for (p, c) in &warm {
                args.extend([p.to_string(), c.to_string()]);
            }
            for (g, c) in &gone {
                args.extend([g.to_string(), c.to_string()]);
            }
            if let Some((_, spots)) = &reservation {
                args.extend(spots.iter().map(|s| s.to_string()));
            }
            // This store leaves out the zeros at the end without a reservation (never a
            // warm-up quota's settings, which are not 0); the earlier one sent every argument.
            let mut trimmed = args.clone();
            if reservation.is_none() {
                while trimmed.len() > 3 + 3 * n && trimmed.last().is_some_and(|a| a == "0") {
                    trimmed.pop();
                }
            }
            let general = adjust || !warm.is_empty();
            // A charge above every log limit: the earlier scripts logged it capped at the
            // largest, these log it whole. Both keys take it from the first pick, and every
            // step after reads the entry as it was written.
            let largest_log = quotas.iter().filter(|q| q.0 == 2).map(|q| q.1).max();
            let capped = cost
                .strip_prefix('+')
                .and_then(|c| c.parse::<u64>().ok())
                .zip(largest_log)
                .is_some_and(|(c, l)| c > l);
            let mut runs = Vec::new();
            let mut chosen = Vec::new();
            for key in ["one", "two"] {
                let (which, trim) = if key == "one" {
                    first(general, &mut rng)
                } else {
                    let pick = second(general, &mut rng);
                    if capped {
                        *met.picks.entry("capped").or_default() += 1;
                        chosen[0]
                    } else {
                        pick
                    }
                };
                *met.picks.entry(which).or_default() += 1;
                chosen.push((which, trim));
                let sent = if trim { &trimmed } else { &args };
                runs.push(run(&mut conn, &sha, key, which, sent).await);
            }
            let (one, two) = (&runs[0], &runs[1]);
            let context = format!(
                "case {case} step {step}: quotas {quotas:?}, warm {warm:?}, gone {gone:?}, \
                 args {args:?}, run by {chosen:?}, stored {:?} and {:?}",
                one.1, two.1
            );
            // Redis deletes a key at once when the expiry it is given (in whole ms from the
            // script's start) is already past, which a loaded machine can make of a key due
            // within a ms: gone on one side only, after a step that writes or while the other
            // side's key was due. Both keys are forgotten then, and the sequence goes on.
            let due = |r: &Run| !r.1.is_empty() && r.2 <= r.4 + 1;
            let writes = cost.starts_with('+')
                || (!adjust && cost != "0" && (one.0[0] == 0 || two.0[0] == 0));
            if (one.1.is_empty() && (writes || due(two)))
                || (two.1.is_empty() && (writes || due(one)))
            {
                met.vanished += 1;
                let _: i64 = redis::cmd("DEL")
                    .arg("one")
                    .arg("two")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                last = None;
                continue;
            }
            assert_eq!(one.0, two.0, "replies differ, {context}");
            assert_eq!(one.1, two.1, "stored values differ, {context}");
            let (lo_1, hi_1) = ttl(one.2, one.3, one.4);
            let (lo_2, hi_2) = ttl(two.2, two.3, two.4);
            assert!(
                lo_1 <= hi_2 && lo_2 <= hi_1,
                "times to live {lo_1}..{hi_1} and {lo_2}..{hi_2} ms, {context}"
            );
            let reply = &one.0;
            if !adjust {
                met.outcomes[reply[0] as usize] += 1;
            }
            if let (Ok(c), [0, ..]) = (cost.parse::<u64>(), reply.as_slice()) {
                if c > 0 && reply.len() == 2 + 4 * n {
                    last = Some((c, reply[2 + 2 * n..].to_vec()));
                }
            }
        }
        let _: i64 = redis::cmd("DEL")
            .arg("one")
            .arg("two")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    met
}

/// The earlier scripts on one key; on the other, at random each step, the earlier scripts
/// with every argument (an instance not yet upgraded) or these as this store sends them.
#[tokio::test]
async fn keys_of_the_previous_scripts_keep_their_limits_under_these() {
    let before = |general: bool| if general { "bg" } else { "bp" };
    let met = replay(
        44,
        true,
        false,
        &mut |general, _| (before(general), false),
        &mut |general, rng| {
            if rng.below(2) == 0 {
                (before(general), false)
            } else {
                (if general { "g" } else { "p" }, true)
            }
        },
    )
    .await;
    assert!(met.kinds.iter().all(|&k| k > 20), "{:?}", met.kinds);
    assert!(met.outcomes.iter().all(|&o| o > 100), "{:?}", met.outcomes);
    assert!(
        met.picks["g"] > 500 && met.picks["p"] > 3_000 && met.picks["capped"] > 20,
        "{:?}",
        met.picks
    );
}

/// Quotas changed on an instance whose clock is ahead of the server's: what left a window
/// may be at or after the request's time. `plain.lua` decides a request as the general
/// script does, on keys both of them write (refunds and charges by the general script).
#[tokio::test]
async fn the_plain_script_decides_as_the_general_one_after_changes_made_on_a_clock_ahead() {
    let met = replay(
        45,
        false,
        true,
        &mut |_, rng| ("g", rng.below(2) == 0),
        &mut |general, rng| (if general { "g" } else { "p" }, rng.below(2) == 0),
    )
    .await;
    assert!(met.kinds[..4].iter().all(|&k| k > 50), "{:?}", met.kinds);
    assert!(met.outcomes.iter().all(|&o| o > 100), "{:?}", met.outcomes);
    assert!(met.picks["p"] > 6_000, "{:?}", met.picks);
    assert!(
        met.vanished < 100,
        "{} of 12 000 steps lost a key",
        met.vanished
    );
}

/// The log entries of `key` in order (time, running total, cost), and its words member.
async fn log_of(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (Vec<(u64, u64, u64)>, Vec<String>) {
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    let mut entries = Vec::new();
    let mut words = Vec::new();
    for m in members {
        if m.starts_with('w') {
            words.push(m);
            continue;
        }
        let parts: Vec<u64> = m.split(':').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{m}");
        assert_eq!(m.split(':').nth(1).map(str::len), Some(16), "{m}");
        entries.push((parts[0], parts[1], parts[2]));
    }
    (entries, words)
}

/// Where two logs part, without printing thousands of entries.
fn first_difference(a: &[(u64, u64, u64)], b: &[(u64, u64, u64)]) -> String {
    let at = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    format!(
        "{} and {} entries, from entry {at}: {:?} and {:?}",
        a.len(),
        b.len(),
        &a[at..a.len().min(at + 3)],
        &b[at..b.len().min(at + 3)]
    )
}

/// A sliding log of 12 000 entries of costs 1 to 3 (24 000 units, some entries sharing a
/// time), admitted by `plain.lua` on one key and by the general script on another, then given
/// back from by the general script on both: all of its oldest entry, one unit of a middle
/// request's (which the newest entry of its time gives, entries of one time being alike), all of its newest, and 5 units of the newest entries without a reservation (an
/// expired lease's). After each, both keys hold the same log, whose entries are the model's
/// (each request's time and cost less what was given back) with running totals that add up,
/// and the reply's remaining is the limit less the model's sum; a request above what remains
/// is refused until exactly the oldest entries that make room have left the window, and one
/// that fits is admitted by `plain.lua` as by the general script.
#[tokio::test]
async fn a_log_of_twelve_thousand_entries_gives_back_from_either_end_and_the_middle() {
    let server = RedisServer::start();
    let mut conn = crate::common::redis_server::connection(&server).await;
    let mut shas = Vec::new();
    for script in [GENERAL, PLAIN] {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut conn)
            .await
            .unwrap();
        shas.push(sha);
    }
    let (general, plain) = (shas[0].clone(), shas[1].clone());
    const LIMIT: u64 = 30_000;
    const WIDTH: u64 = 100_000_000;
    const BASE: u64 = 1_000_000_000;
    let quota = ["2".to_owned(), LIMIT.to_string(), WIDTH.to_string()];
    // Request i at BASE + i - i % 4 / 2 (of each four, the middle two share a time), of cost
    // 1 + i % 3.
    let at = |i: u64| BASE + i - i % 4 / 2;
    let cost = |i: u64| 1 + i % 3;
    let count = 12_000u64;
    let mut model: Vec<(u64, u64)> = Vec::new();
    let mut spots: Vec<(u64, i64, i64)> = Vec::new();
    for from in (0..count).step_by(500) {
        let mut pipe = redis::pipe();
        for i in from..from + 500 {
            for (sha, key) in [(&general, "g"), (&plain, "p")] {
                pipe.cmd("EVALSHA")
                    .arg(sha)
                    .arg(1)
                    .arg(key)
                    .arg(cost(i).to_string())
                    .arg(at(i).to_string())
                    .arg("1")
                    .arg(&quota[..]);
            }
        }
        let replies: Vec<Vec<i64>> = pipe.query_async(&mut conn).await.unwrap();
        for (j, pair) in replies.chunks(2).enumerate() {
            let i = from + j as u64;
            assert_eq!(pair[0], pair[1], "request {i}");
            model.push((at(i), cost(i)));
            let used: u64 = model.iter().map(|e| e.1).sum();
            assert_eq!(pair[0][..3], [0, 0, (LIMIT - used) as i64], "request {i}");
            spots.push((cost(i), pair[0][4], pair[0][5]));
        }
    }
    let now = BASE + count + 10;
    let mut refunds = 0;
    // (request, units): its whole oldest entry, one unit of a middle entry of cost 2, its whole
    // newest; then 5 units of the newest entries without a reservation.
    for (request, units) in [
        (Some(0u64), 1u64),
        (Some(6_001), 1),
        (Some(count - 1), 3),
        (None, 5),
    ] {
        let mut args = vec![format!("-{units}"), now.to_string(), "1".to_owned()];
        args.extend(quota.iter().cloned());
        match request {
            Some(i) => {
                let (c, a, b) = spots[i as usize];
                assert_eq!((c, a, b), (cost(i), at(i) as i64, 0), "spot of {i}");
                args.extend([
                    c.to_string(),
                    "0".into(),
                    "0".into(),
                    a.to_string(),
                    b.to_string(),
                ]);
                // Entries of one time are alike: the newest of them gives back first.
                let mut left = units;
                for e in model.iter_mut().rev().filter(|e| e.0 == at(i)) {
                    let back = e.1.min(left);
                    e.1 -= back;
                    left -= back;
                }
                assert_eq!(left, 0);
            }
            None => {
                args.push("0".to_owned());
                let mut left = units;
                for e in model.iter_mut().rev() {
                    let back = e.1.min(left);
                    e.1 -= back;
                    left -= back;
                }
            }
        }
        model.retain(|e| e.1 > 0);
        refunds += 1;
        let mut replies = Vec::new();
        for key in ["g", "p"] {
            let reply: Vec<i64> = redis::cmd("EVALSHA")
                .arg(&general)
                .arg(1)
                .arg(key)
                .arg(&args)
                .query_async(&mut conn)
                .await
                .unwrap();
            replies.push(reply);
        }
        let used: u64 = model.iter().map(|e| e.1).sum();
        let newest = model.last().unwrap().0;
        assert_eq!(
            replies[0],
            [0, 0, (LIMIT - used) as i64, (newest + WIDTH - now) as i64],
            "refund {refunds}"
        );
        assert_eq!(replies[0], replies[1], "refund {refunds}");
        let (g_log, g_words) = log_of(&mut conn, "g").await;
        let (p_log, p_words) = log_of(&mut conn, "p").await;
        assert!(
            g_log == p_log,
            "refund {refunds}: {}",
            first_difference(&g_log, &p_log)
        );
        assert_eq!(g_words, p_words, "refund {refunds}");
        let mut total = 0;
        let expected: Vec<(u64, u64, u64)> = model
            .iter()
            .map(|&(t, c)| {
                total += c;
                (t, total, c)
            })
            .collect();
        assert!(
            g_log == expected,
            "refund {refunds}: {}",
            first_difference(&g_log, &expected)
        );
    }
    let used: u64 = model.iter().map(|e| e.1).sum();
    // Above what remains by 7: refused until the oldest entries holding 7 units have left.
    let over = LIMIT - used + 7;
    let mut sum = 0;
    let leaves = model
        .iter()
        .find(|e| {
            sum += e.1;
            sum >= 7
        })
        .unwrap()
        .0;
    let later = now + 1_000;
    let mut args = vec![over.to_string(), later.to_string(), "1".to_owned()];
    args.extend(quota.iter().cloned());
    for (sha, key) in [(&general, "g"), (&plain, "p")] {
        let reply: Vec<i64> = redis::cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(key)
            .arg(&args)
            .query_async(&mut conn)
            .await
            .unwrap();
        let newest = model.last().unwrap().0;
        assert_eq!(
            reply,
            [
                1,
                (leaves + WIDTH - later) as i64,
                (LIMIT - used) as i64,
                (newest + WIDTH - later) as i64
            ],
            "{key}"
        );
    }
    // What remains exactly: admitted, and the log is full.
    args[0] = (LIMIT - used).to_string();
    let mut replies = Vec::new();
    for (sha, key) in [(&general, "g"), (&plain, "p")] {
        let reply: Vec<i64> = redis::cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(key)
            .arg(&args)
            .query_async(&mut conn)
            .await
            .unwrap();
        replies.push(reply);
    }
    assert_eq!(replies[0], replies[1]);
    assert_eq!(
        replies[0],
        [0, 0, 0, WIDTH as i64, later as i64, 0],
        "the admission of what remains"
    );
    let (g_log, _) = log_of(&mut conn, "g").await;
    let (p_log, _) = log_of(&mut conn, "p").await;
    assert!(g_log == p_log, "{}", first_difference(&g_log, &p_log));
    assert_eq!(g_log.last(), Some(&(later, LIMIT, LIMIT - used)));
}

/// A policy decided by `plain.lua` cannot gain a warm-up quota while serving, nor one decided
/// by the general script for its warm-up quota lose it: a key's words are laid out by kind
/// (a warm-up quota has two, GCRA one), so either change would have the other script read a
/// word of one quota as another's. The quotas in force stay, and so does every key's count.
#[tokio::test]
async fn a_redis_policy_neither_gains_nor_loses_a_warm_up_quota_while_serving() {
    use std::time::Duration;
    use tollgate::redis::{RedisRateLimiter, RedisStore};
    use tollgate::{Clock, ConfigError, Quota};

    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, _time) = Clock::manual();
    let window = Quota::fixed_window(5, Duration::from_secs(60));
    let plain = Quota::per_minute(3);
    let warm = Quota::per_minute(3).warm_up(Duration::from_secs(60), 3);
    for (name, from, to) in [("gains", &plain, &warm), ("loses", &warm, &plain)] {
        let limiter = RedisRateLimiter::<u8>::builder(store.clone(), window.clone())
            .quota(from.clone())
            .name(name)
            .clock(clock.clone())
            .build();
        let first = limiter.check(&1).await;
        assert!(first.is_allowed(), "{name}");
        assert!(
            matches!(
                limiter.set_quotas([window.clone(), to.clone()]),
                Err(ConfigError::NotChangeable(_))
            ),
            "{name}"
        );
        assert_eq!(limiter.quotas()[1].kind(), from.kind(), "{name}");
        // The window still counts the first request.
        let now = limiter.peek(&1).await;
        assert_eq!(now.states()[0].remaining(), 4, "{name}");
    }
}
