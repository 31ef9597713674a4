//! The shaper's bounded table against the documented rule (docs/design.md section 1,
//! "Shaping"; `ShaperBuilder::max_keys`): on tokio's paused clock, requests of five keys take
//! their place through `Shaper::reserve` in a table of one to three keys, and some go away
//! before their turn (never at the very instant of it). A full table forgets first the keys
//! that are idle (which changes nothing), then a key nobody waits on whose schedule is at most
//! one interval ahead, whose next request may then leave up to one interval early. So every
//! request that stays leaves between its key's last departure and
//! `max(its arrival, that departure + T)`, at the latter whenever a request of its key is
//! still waiting; none leaves after it went away; a request is refused only when its key's
//! queue is full or every key the table holds has a waiter; and the table never tracks more
//! than its bound.
//!
//! Pins docs/design.md section 1 ("Shaping") and section 3 ("Keyed state").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::{Quota, Shaper};

/// `T`, in ms: 10 a second.
const T: u64 = 100;

/// A request: its key, its arrival (ms from the start), and when it goes away if it has not
/// left by then (ms after its arrival).
#[derive(Debug, Clone)]
struct Arrival {
    key: u8,
    at: u64,
    gives_up: Option<u64>,
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    let gives_up = prop::option::weighted(0.4, 1u64..300);
    prop::collection::vec((0u8..5, 1u64..90, gives_up), 1..40).prop_map(|v| {
        let mut at = 0;
        v.into_iter()
            .map(|(key, gap, gives_up)| {
                at += gap;
                Arrival { key, at, gives_up }
            })
            .collect()
    })
}

/// What became of a request in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Left(u64),
    Refused,
    Gone,
}

async fn run(arrivals: Vec<Arrival>, max_keys: usize, max_waiting: usize) -> (Vec<Fate>, usize) {
    let shaper = Shaper::<u8>::builder(Quota::per_second(10))
        .max_waiting(max_waiting)
        .max_keys(max_keys)
        .build();
    let start = Instant::now();
    let fates = Arc::new(Mutex::new(vec![Fate::Gone; arrivals.len()]));
    let most = Arc::new(Mutex::new(0usize));
    let tasks: Vec<_> = arrivals
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let (shaper, fates, most) = (shaper.clone(), fates.clone(), most.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(a.at)).await;
                let slot = shaper.reserve(&a.key);
                {
                    let mut most = most.lock().unwrap();
                    *most = (*most).max(shaper.len());
                }
                let Ok(slot) = slot else {
                    fates.lock().unwrap()[i] = Fate::Refused;
                    return;
                };
                let give_up = Duration::from_millis(a.gives_up.unwrap_or(1 << 30));
                tokio::select! {
                    () = slot => {
                        let ms = (Instant::now() - start).as_millis() as u64;
                        fates.lock().unwrap()[i] = Fate::Left(ms);
                    }
                    () = tokio::time::sleep(give_up) => {}
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let fates = fates.lock().unwrap().clone();
    let most = *most.lock().unwrap();
    (fates, most)
}

/// Checks the run against the documented rule; `Err(None)` when a request went away at the
/// very instant of its turn (either may come first), `Err(Some(why))` when the run breaks a
/// promise.
fn judge(
    arrivals: &[Arrival],
    fates: &[Fate],
    max_keys: usize,
    max_waiting: usize,
) -> Result<(), Option<String>> {
    let mut last: [Option<u64>; 5] = [None; 5];
    for (i, a) in arrivals.iter().enumerate() {
        let gone = a.gives_up.map(|g| a.at + g);
        // Requests of `k` let in before and still waiting at this arrival (lenient at the
        // instant).
        let waiting = |k: u8| {
            (0..i)
                .filter(|&j| arrivals[j].key == k && fates[j] != Fate::Refused)
                .filter(|&j| match fates[j] {
                    Fate::Left(d) => d >= a.at,
                    _ => arrivals[j]
                        .gives_up
                        .map_or(true, |g| arrivals[j].at + g >= a.at),
                })
                .count()
        };
        if let Fate::Refused = fates[i] {
            // Its key's queue held `max_waiting`, or every key the table holds is busy.
            let full_queue = waiting(a.key) >= max_waiting;
            let busy = (0..5u8).filter(|&k| k != a.key && waiting(k) > 0).count();
            if !full_queue && busy < max_keys {
                return Err(Some(format!("request {i} ({a:?}) refused with room")));
            }
            continue;
        }
        // One interval after the key's last departure; one interval sooner, at the earliest,
        // for a key nobody waits on that the full table forgot.
        let latest = last[a.key as usize].map_or(a.at, |l| a.at.max(l + T));
        let earliest = last[a.key as usize].map_or(a.at, |l| a.at.max(l));
        match (fates[i], gone) {
            (Fate::Left(d), Some(g)) if d == g => return Err(None),
            (Fate::Left(d), _) if d < earliest || d > latest => {
                return Err(Some(format!(
                    "request {i} ({a:?}) left at {d}, not in [{earliest}, {latest}]"
                )))
            }
            (Fate::Left(d), _) if d < latest && waiting(a.key) > 0 => {
                return Err(Some(format!(
                    "request {i} ({a:?}) left at {d} before {latest} behind a waiter"
                )))
            }
            (Fate::Left(d), Some(g)) if d > g => {
                return Err(Some(format!(
                    "request {i} ({a:?}) left at {d} after going away"
                )))
            }
            (Fate::Left(d), _) => last[a.key as usize] = Some(d),
            (Fate::Gone, Some(g)) if g == latest => return Err(None),
            (Fate::Gone, Some(g)) if g < latest => {}
            (fate, _) => {
                return Err(Some(format!(
                    "request {i} ({a:?}): {fate:?}, due by {latest}"
                )))
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_global_rejects: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_key_the_full_table_forgot_leaves_at_most_one_interval_early_and_never_ahead_of_a_waiter(
        arrivals in arrivals(),
        max_keys in 1usize..4,
        max_waiting in 1usize..4,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (fates, most) = rt.block_on(run(arrivals.clone(), max_keys, max_waiting));
        prop_assert!(most <= max_keys, "{most} keys tracked, at most {max_keys}");
        match judge(&arrivals, &fates, max_keys, max_waiting) {
            Ok(()) => {}
            Err(None) => prop_assume!(false),
            Err(Some(why)) => prop_assert!(false, "{why}; fates {fates:?}"),
        }
    }
}
