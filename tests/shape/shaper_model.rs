//! The shaper against a model of its promise, on random arrivals and cancellations (docs/design.md
//! section 1, "Shaping": requests leave at a fixed rate, first in first out; output never
//! exceeds the rate; a waiter that is cancelled does not burn a slot): on tokio's paused clock,
//! requests of two keys take their place in their key's queue at random instants, and some go
//! away before their turn (never at the very instant of it). Each key is its own queue, and every request that stays leaves at
//! exactly `max(its arrival, the previous departure of its key + T)`, the previous departure
//! being that of the last request of the key that stayed: a request that went away left no
//! gap, and no two departures of a key are closer than `T`.
//!
//! With a bound on those waiting, a request that finds its key's queue full is refused and
//! told the time until the first waiter leaves (`Shaper::reserve`).
//!
//! Pins docs/design.md section 1 ("Shaping").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::{Quota, Shaper};

/// `T`, in µs: 10 a second.
const T: u64 = 100_000;

/// A request: its key, its arrival (µs from the start), and when it goes away if it has not
/// left by then (µs after its arrival).
#[derive(Debug, Clone)]
struct Arrival {
    key: u8,
    at: u64,
    gives_up: Option<u64>,
}

/// Arrivals at distinct whole milliseconds (tokio's timer counts milliseconds), in order,
/// and give-ups after whole milliseconds.
fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec((0u8..2, 1u64..120, prop::option::of(0u64..400)), 1..40).prop_map(|v| {
        let mut at = 0;
        v.into_iter()
            .map(|(key, gap, gives_up)| {
                at += gap * 1_000;
                Arrival {
                    key,
                    at,
                    gives_up: gives_up.map(|ms| ms * 1_000),
                }
            })
            .collect()
    })
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Left its queue at this instant (µs).
    Left(u64),
    /// Went away before its turn.
    GaveUp,
    /// Refused by a full queue, told to retry after this long (µs).
    Refused(u64),
}

/// What becomes of each request when each key's queue holds at most `bound` waiting (none:
/// no bound); `Err` when a request would go away, or arrive, at the very instant another
/// leaves or goes away (either may come first).
fn model(arrivals: &[Arrival], bound: Option<usize>) -> Result<Vec<Fate>, ()> {
    let mut next = [0u64; 2];
    // Per key, the requests that joined and stay: (departure, when it goes away).
    let mut queues: [Vec<(u64, Option<u64>)>; 2] = Default::default();
    let mut out = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        let k = usize::from(a.key);
        if queues[k].iter().any(|&(d, g)| d == a.at || g == Some(a.at)) {
            return Err(());
        }
        let waiting: Vec<u64> = queues[k]
            .iter()
            .filter(|&&(d, g)| d > a.at && g.map_or(true, |g| g > a.at))
            .map(|&(d, _)| d)
            .collect();
        let leaves = a.at.max(next[k]);
        // One whose turn has come does not wait.
        if leaves > a.at && bound.is_some_and(|b| waiting.len() >= b) {
            let first = waiting.iter().min().copied().unwrap_or(leaves);
            out.push(Fate::Refused(first - a.at));
            continue;
        }
        let gone = a.gives_up.map(|g| a.at + g);
        if gone == Some(leaves) {
            return Err(());
        }
        if gone.is_some_and(|g| g < leaves) {
            out.push(Fate::GaveUp);
            // It waited until then: a place taken until it went away, and no slot.
            queues[k].push((leaves, gone));
            continue;
        }
        next[k] = leaves + T;
        queues[k].push((leaves, None));
        out.push(Fate::Left(leaves));
    }
    Ok(out)
}

async fn run(arrivals: Vec<Arrival>, bound: Option<usize>) -> Vec<Fate> {
    let shaper: Shaper<u8> = match bound {
        Some(n) => Shaper::builder(Quota::per_second(10))
            .max_waiting(n)
            .build(),
        None => Shaper::new(Quota::per_second(10)),
    };
    let start = Instant::now();
    let fates = Arc::new(Mutex::new(vec![Fate::GaveUp; arrivals.len()]));
    let tasks: Vec<_> = arrivals
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let (shaper, fates) = (shaper.clone(), fates.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_micros(a.at)).await;
                let slot = match bound {
                    None => shaper.until_slot(&a.key),
                    Some(_) => match shaper.reserve(&a.key) {
                        Ok(slot) => slot,
                        Err(full) => {
                            let r = full.retry_after().as_micros() as u64;
                            fates.lock().unwrap()[i] = Fate::Refused(r);
                            return;
                        }
                    },
                };
                let give_up = a.gives_up.unwrap_or(u64::MAX / 4);
                tokio::select! {
                    _ = slot => {
                        let at = start.elapsed().as_micros() as u64;
                        fates.lock().unwrap()[i] = Fate::Left(at);
                    }
                    _ = tokio::time::sleep(Duration::from_micros(give_up)) => {}
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let fates = fates.lock().unwrap().clone();
    fates
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn each_request_that_stays_leaves_one_interval_after_the_last_that_stayed(
        arrivals in arrivals(),
    ) {
        let want = model(&arrivals, None);
        prop_assume!(want.is_ok());
        prop_assert_eq!(paused().block_on(run(arrivals, None)), want.unwrap());
    }

    /// With at most `bound` waiting per key: a request that finds its key's queue full is
    /// refused, told to retry when the first of those waiting leaves; one that went away
    /// freed its place at once.
    #[test]
    fn a_full_queue_refuses_until_its_first_waiter_leaves_or_goes_away(
        arrivals in arrivals(),
        bound in 0usize..4,
    ) {
        let want = model(&arrivals, Some(bound));
        prop_assume!(want.is_ok());
        prop_assert_eq!(paused().block_on(run(arrivals, Some(bound))), want.unwrap());
    }
}
