//! Waiting for admission: one line per key, first come first served, for every limiter's
//! `until_ready_n`.
//!
//! The waiters of a key stand in a FIFO line. Only the one at the head decides: it asks its
//! limiter, sleeps for the retry time the decision gives, asks again, and once admitted leaves
//! the line and wakes the next one. Everyone else is parked, and woken exactly once, when it
//! reaches the head. So an admission costs one wake and a few decisions however many tasks
//! wait, and a waiter of a large cost at the head is served before any later waiter of a
//! small one (which could otherwise take every unit as it comes back, forever).
//!
//! Requests decided without waiting (`check`, the HTTP layers) do not stand in the line: the
//! line orders the waiters of one limiter, in one process, among themselves.
//!
//! Cancel-safe: a waiter dropped anywhere in the line leaves it (its entry removed, the next
//! one woken if it was at the head) and consumes nothing unless its decision was already on
//! its way (a Redis decision in flight, as for `check`). A key's line is removed with its last
//! waiter, so the table holds only keys that have waiters.

use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::hash::Hash;
use std::sync::Mutex;
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};

/// The cost asked for can never be admitted: it is larger than a quota's burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsufficientCapacity {
    /// The cost asked for.
    pub cost: u32,
    /// The smallest burst among the quotas.
    pub burst: u64,
}

impl std::fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a cost of {} can never be admitted by a burst of {}",
            self.cost, self.burst
        )
    }
}

impl std::error::Error for InsufficientCapacity {}

/// How long the head waits before asking again when a rejection carries no retry time.
const RETRY_WITHOUT_TIME: Duration = Duration::from_millis(1);

/// The lines of waiters of one limiter, by key.
pub(crate) struct Lines<K> {
    lines: Mutex<HashMap<K, Line, foldhash::fast::RandomState>>,
}

/// The waiters of one key, in arrival order (ids grow from front to back).
#[derive(Default)]
struct Line {
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

struct Waiter {
    id: u64,
    /// Set while the waiter is parked behind the head.
    waker: Option<Waker>,
}

impl<K> Default for Lines<K> {
    fn default() -> Self {
        Lines {
            lines: Mutex::new(HashMap::default()),
        }
    }
}

impl<K: Hash + Eq + Clone> Lines<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Line, foldhash::fast::RandomState>> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the back of `key`'s line.
    fn join(&self, key: &K) -> Place<'_, K> {
        let mut lines = self.lock();
        let line = lines.entry(key.clone()).or_default();
        let id = line.next_id;
        line.next_id += 1;
        line.waiters.push_back(Waiter { id, waker: None });
        Place {
            lines: self,
            key: key.clone(),
            id,
        }
    }

    /// The number of keys with waiters.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.lock().len()
    }

    /// The number of waiters in `key`'s line.
    #[cfg(test)]
    pub(crate) fn waiting(&self, key: &K) -> usize {
        self.lock().get(key).map_or(0, |l| l.waiters.len())
    }
}

/// A waiter's place in a line; leaving the line when dropped.
struct Place<'a, K: Hash + Eq + Clone> {
    lines: &'a Lines<K>,
    key: K,
    id: u64,
}

impl<K: Hash + Eq + Clone> Place<'_, K> {
    /// Resolves once this place is at the head of its line.
    fn head(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            let mut lines = self.lines.lock();
            let Some(line) = lines.get_mut(&self.key) else {
                // Unreachable while the place exists; never hang if it were.
                return Poll::Ready(());
            };
            if line.waiters.front().map_or(true, |w| w.id == self.id) {
                return Poll::Ready(());
            }
            if let Ok(i) = line.waiters.binary_search_by_key(&self.id, |w| w.id) {
                let waker = &mut line.waiters[i].waker;
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
            }
            Poll::Pending
        })
    }
}

impl<K: Hash + Eq + Clone> Drop for Place<'_, K> {
    fn drop(&mut self) {
        let next = {
            let mut lines = self.lines.lock();
            let Some(line) = lines.get_mut(&self.key) else {
                return;
            };
            let Ok(i) = line.waiters.binary_search_by_key(&self.id, |w| w.id) else {
                return;
            };
            line.waiters.remove(i);
            if line.waiters.is_empty() {
                lines.remove(&self.key);
                None
            } else if i == 0 {
                // The head left: the next one takes its turn.
                line.waiters.front_mut().and_then(|w| w.waker.take())
            } else {
                None
            }
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}

/// The decision of a wait for a cost of 1 (`until_ready`), which every valid quota admits
/// in time (a burst is at least 1).
pub(crate) fn admitted_one(waited: Result<Decision, InsufficientCapacity>) -> Decision {
    match waited {
        Ok(d) => d,
        Err(_) => unreachable!("a burst is at least 1"),
    }
}

/// A limiter whose callers may wait in line until it admits them: the memory and the Redis
/// limiters wait alike, through [`until_ready_n`].
pub(crate) trait Admit<K> {
    /// Decides a request of `cost` for `key` (at once, or after a round trip).
    fn admit(&self, key: &K, cost: u32) -> impl Future<Output = Decision>;
    /// The lines of this limiter's waiters.
    fn lines(&self) -> &Lines<K>;
    /// The clock its decisions are made with.
    fn clock(&self) -> &Clock;
    /// The smallest burst among the quotas in force: no cost above it is ever admitted.
    fn smallest_burst(&self) -> u64;
}

/// Waits in `key`'s line until `limiter` admits a request of `cost` (see the limiters'
/// `until_ready_n`).
pub(crate) async fn until_ready_n<K, L>(
    limiter: &L,
    key: &K,
    cost: u32,
) -> Result<Decision, InsufficientCapacity>
where
    K: Hash + Eq + Clone,
    L: Admit<K>,
{
    let burst = limiter.smallest_burst();
    let check = || limiter.admit(key, cost);
    until_admitted(limiter.lines(), key, burst, limiter.clock(), cost, check).await
}

/// The smallest limit among `rules` (see [`Admit::smallest_burst`]).
pub(crate) fn smallest_burst(rules: &[Rule]) -> u64 {
    rules.iter().map(Rule::limit).min().unwrap_or(0)
}

/// Waits in `key`'s line until `check` admits a request of `cost`, sleeping at the head for
/// each retry time in between.
///
/// Returns [`InsufficientCapacity`] at once, without waiting, when `cost` is larger than
/// `burst`, the smallest burst among the quotas.
pub(crate) async fn until_admitted<K, F, Fut>(
    lines: &Lines<K>,
    key: &K,
    burst: u64,
    clock: &Clock,
    cost: u32,
    mut check: F,
) -> Result<Decision, InsufficientCapacity>
where
    K: Hash + Eq + Clone,
    F: FnMut() -> Fut,
    Fut: Future<Output = Decision>,
{
    let exceeds = || InsufficientCapacity { cost, burst };
    if u64::from(cost) > burst {
        return Err(exceeds());
    }
    let place = lines.join(key);
    loop {
        place.head().await;
        let d = check().await;
        match d.outcome() {
            // Leaving the line (dropping `place`) wakes the next waiter.
            Outcome::Allowed => return Ok(d),
            Outcome::Exceeds => return Err(exceeds()),
            Outcome::Limited | Outcome::Banned => {
                let wait = d.retry_after().unwrap_or(RETRY_WITHOUT_TIME);
                if !clock.follows_sleep() {
                    // A manual clock never moves by itself; yield so the caller's test can.
                    tokio::task::yield_now().await;
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::gcra::Gcra;
    use std::collections::BTreeMap;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    use proptest::prelude::*;

    #[derive(Default)]
    struct CountWake(AtomicUsize);

    impl Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Polls `place.head()` once with `wake`'s waker.
    fn at_head(place: &Place<'_, u8>, wake: &Arc<CountWake>) -> bool {
        let waker = Waker::from(wake.clone());
        let mut cx = Context::from_waker(&waker);
        let fut = pin!(place.head());
        fut.poll(&mut cx).is_ready()
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join(u8),
        /// Drops the live waiter at this index (mod their number): cancelled anywhere in line,
        /// or admitted at the head.
        Leave(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3).prop_map(Op::Join),
            any::<usize>().prop_map(Op::Leave)
        ]
    }

    struct Live<'a> {
        key: u8,
        id: u64,
        place: Place<'a, u8>,
        wake: Arc<CountWake>,
        wakes_seen: usize,
        parked: bool,
    }

    proptest! {
        /// Against a model of one FIFO line per key: the head is the oldest waiter still
        /// there; a parked waiter is woken exactly once, when it becomes the head, and never
        /// otherwise; a key without waiters has no line.
        #[test]
        fn lines_follow_a_fifo_model(ops in prop::collection::vec(op(), 1..80)) {
            let lines = Lines::<u8>::default();
            let mut model: BTreeMap<u8, VecDeque<u64>> = BTreeMap::new();
            let mut live: Vec<Live<'_>> = Vec::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Join(key) => {
                        let place = lines.join(&key);
                        model.entry(key).or_default().push_back(next);
                        let wake = Arc::new(CountWake::default());
                        live.push(Live { key, id: next, place, wake, wakes_seen: 0, parked: false });
                        next += 1;
                    }
                    Op::Leave(i) if !live.is_empty() => {
                        let gone = live.remove(i % live.len());
                        let line = model.get_mut(&gone.key).unwrap();
                        line.retain(|&id| id != gone.id);
                        if line.is_empty() {
                            model.remove(&gone.key);
                        }
                    }
                    Op::Leave(_) => {}
                }
                for w in &mut live {
                    let wakes = w.wake.0.load(Ordering::Relaxed);
                    let head = model[&w.key].front() == Some(&w.id);
                    // Woken once on reaching the head after being parked; never otherwise.
                    let expected = usize::from(head && w.parked);
                    prop_assert_eq!(wakes - w.wakes_seen, expected);
                    w.wakes_seen = wakes;
                    prop_assert_eq!(at_head(&w.place, &w.wake), head);
                    w.parked = !head;
                }
                prop_assert_eq!(lines.keys(), model.len());
                for (key, line) in &model {
                    prop_assert_eq!(lines.waiting(key), line.len());
                }
            }
            drop(live);
            prop_assert_eq!(lines.keys(), 0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_is_removed_with_its_last_waiter_however_it_leaves() {
        let lines = Lines::<u8>::default();
        let gcras = [Rule::Gcra(Gcra::new(100_000_000, 100_000_000))];
        let burst = smallest_burst(&gcras);
        let clock = Clock::tokio();
        // Always rejected: every waiter waits until it is dropped.
        let check = || std::future::ready(Decision::degraded(&gcras, false, 1_000_000));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(until_admitted(&lines, &1, burst, &clock, 1, check));
        }
        let mut tasks: Vec<_> = tasks.into_iter().map(Box::pin).collect();
        let waker = Waker::from(Arc::new(CountWake::default()));
        let mut cx = Context::from_waker(&waker);
        for t in &mut tasks {
            assert!(t.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(lines.waiting(&1), 3);
        // The middle one, the head, the last one.
        drop(tasks.remove(1));
        assert_eq!(lines.waiting(&1), 2);
        drop(tasks.remove(0));
        assert_eq!(lines.waiting(&1), 1);
        drop(tasks);
        assert_eq!(lines.keys(), 0);
        // Admitted at once: the line is gone too.
        let admit = || std::future::ready(Decision::degraded(&gcras, true, 0));
        let _ = until_admitted(&lines, &2, burst, &clock, 1, admit)
            .await
            .unwrap();
        assert_eq!(lines.keys(), 0);
        // A cost above the burst never joins.
        let err = until_admitted(&lines, &3, burst, &clock, 2, admit)
            .await
            .unwrap_err();
        assert_eq!(err, InsufficientCapacity { cost: 2, burst: 1 });
        assert_eq!(lines.keys(), 0);
    }
}
