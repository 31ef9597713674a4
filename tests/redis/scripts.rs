//! The GCRA-only decision script against the general one: on random sequences of requests,
//! refunds, charges and reports over one to four GCRA quotas, with quotas held to their
//! tolerance, both reply alike, store the same value and give the key the same time to live.
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

#[tokio::test]
async fn the_gcra_only_script_decides_as_the_general_one() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
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
