//! The quotas in force: read by every decision, replaced whole while serving.
//!
//! # Implementation details
//! The whole set ([`Limits`]) sits behind an `ArcSwap`. Loading it costs a guard: two
//! read-modify-writes of a per-thread slot, with a full barrier, on every decision. A policy
//! of GCRA quotas only needs three numbers per quota, so those are also kept in plain atomics
//! under a sequence number (a sequence lock made of atomics, in the manner of crossbeam's
//! `AtomicCell`): a decision reads the sequence, the numbers and the sequence again, all plain
//! loads, and takes the numbers when nothing changed between. A reader that meets a change
//! being written loads the `ArcSwap` instead: it never waits for the writer, and it sees
//! either the old quotas or the new ones, as before.
//!
//! A policy whose numbers are not in atomics (several quotas with a kind other than GCRA
//! among them, or a sliding log) does not load the `ArcSwap` at every decision either: each
//! thread keeps the last few sets it decided with (`RECENT`), each set numbered once for the
//! life of the process, and a decision takes the set whose number the limiter says is in
//! force (one plain load), loading the `ArcSwap` only when its thread does not keep that set.

use std::cell::RefCell;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, Guard};

use crate::algo::gcra::Gcra;
use crate::algo::{Rule, TwoQuota, WithKind, QUOTA_WORDS};
use crate::decision::{Decision, MAX_QUOTAS};
use crate::quota::Quota;

/// A set of quotas and the numbers the algorithms take from them, swapped as one.
pub(super) struct Limits {
    pub(super) quotas: Arc<[Quota]>,
    /// The quotas as GCRA when every quota is one (else empty).
    pub(super) gcras: Box<[Gcra]>,
    pub(super) rules: Box<[Rule]>,
    /// This set's own number, never given to another set in the process (see [`RECENT`]).
    id: u64,
    /// How many changes were made before these quotas (wrapping): what a decision they
    /// judge is stamped with ([`Decision::stamped`]). `seq` is twice it.
    pub(super) generation: u16,
}

/// The number of the next set of quotas made.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Limits {
    pub(super) fn new(quotas: Vec<Quota>) -> Self {
        let rules: Box<[Rule]> = quotas.iter().map(Quota::rule).collect();
        let gcras: Box<[Gcra]> = rules.iter().filter_map(Rule::as_gcra).copied().collect();
        Limits {
            quotas: quotas.into(),
            gcras,
            rules,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            generation: 0,
        }
    }
}

/// How many sets of quotas a thread keeps in [`RECENT`].
const KEPT: usize = 4;

thread_local! {
    /// The sets of quotas this thread decided with last, of any limiters, the latest first:
    /// a check of a policy whose numbers are not kept in atomics (several quotas with
    /// another kind than GCRA among them, or a sliding log) finds its quotas here while they
    /// are still in force ([`Live::with_limits`]), by the number of the set in force, one
    /// plain load, instead of loading the `ArcSwap` (two read-modify-writes of a per-thread
    /// slot, with full barriers). A set stays here until four other sets came after it, or
    /// the thread ends.
    static RECENT: RefCell<[Option<Arc<Limits>>; KEPT]> =
        const { RefCell::new([const { None }; KEPT]) };
}

/// The quotas in force (see the module documentation).
pub(super) struct Live {
    limits: ArcSwap<Limits>,
    /// Even while `words` hold the GCRA numbers of `limits`; odd while a change writes them.
    seq: AtomicU64,
    /// [`Gcra::words`] of each quota, when every quota is GCRA.
    words: [[AtomicU64; 3]; MAX_QUOTAS],
    /// How many quotas `words` holds: all of them when every quota is GCRA, else none. A
    /// change keeps the number and the kind of each quota.
    gcras: usize,
    /// The number of the set in `limits`, written after it (see [`RECENT`]).
    current: AtomicU64,
    /// Held by a change from reading the quotas it replaces to publishing the new ones, so
    /// that two changes at once never replace the same quotas.
    writer: Mutex<()>,
    /// The numbers of a policy's single quota kept in two words, other than GCRA.
    two: TwoRule,
}

impl Live {
    pub(super) fn new(limits: Limits) -> Self {
        let gcras = if limits.gcras.len() == limits.rules.len() {
            limits.gcras.len()
        } else {
            0
        };
        let current = AtomicU64::new(limits.id);
        let live = Live {
            limits: ArcSwap::from_pointee(limits),
            current,
            seq: AtomicU64::new(0),
            words: Default::default(),
            gcras,
            writer: Mutex::new(()),
            two: TwoRule::default(),
        };
        live.write_words(&live.limits.load());
        live.two.write(&live.limits.load());
        live
    }

    /// Every quota in force, with the numbers each kind reads.
    #[inline]
    pub(super) fn load(&self) -> Guard<Arc<Limits>> {
        self.limits.load()
    }

    /// `f` of every quota in force, found among the sets this thread decided with last
    /// ([`RECENT`]) by the number of the set in force, else loaded (and kept there for the
    /// next check). A change is in force once its number is written, after its set: a check
    /// that reads the number before sees the set it replaces, as a check that loaded the
    /// `ArcSwap` a moment earlier would.
    #[inline]
    pub(super) fn with_limits<T>(&self, f: impl FnOnce(&Limits) -> T) -> T {
        let id = self.current.load(Ordering::Acquire);
        let mut f = Some(f);
        let found = RECENT.try_with(|recent| {
            let recent = recent.try_borrow().ok()?;
            let limits = recent.iter().flatten().find(|l| l.id == id)?;
            f.take().map(|f| f(limits))
        });
        if let Ok(Some(out)) = found {
            return out;
        }
        match f {
            Some(f) => self.with_loaded_limits(f),
            // `f` is taken only to make `out`, which was returned.
            None => unreachable!("the quotas were found and decided with"),
        }
    }

    /// [`with_limits`](Self::with_limits) of a set this thread does not keep: loaded, and
    /// kept as the latest.
    #[cold]
    #[inline(never)]
    fn with_loaded_limits<T>(&self, f: impl FnOnce(&Limits) -> T) -> T {
        let limits = self.limits.load_full();
        let _ = RECENT.try_with(|recent| {
            if let Ok(mut recent) = recent.try_borrow_mut() {
                recent.rotate_right(1);
                recent[0] = Some(limits.clone());
            }
        });
        f(&limits)
    }

    /// The GCRA quotas in force, into `out`: how many there are and their generation, or
    /// `None` when a quota is of another kind or a change was being written (then read
    /// [`load`](Self::load)).
    #[inline]
    pub(super) fn gcras(&self, out: &mut [Gcra; MAX_QUOTAS]) -> Option<(usize, u16)> {
        let n = self.gcras;
        if n == 0 {
            return None;
        }
        self.read(&mut out[..n]).map(|g| (n, g))
    }

    /// The single GCRA quota in force, of a policy of one GCRA quota: [`read`](Self::read)
    /// of one quota, kept in registers; with its generation.
    #[inline]
    pub(super) fn one(&self) -> (Gcra, u16) {
        let before = self.seq.load(Ordering::Acquire);
        let w = &self.words[0];
        let g = Gcra::from_words([
            w[0].load(Ordering::Relaxed),
            w[1].load(Ordering::Relaxed),
            w[2].load(Ordering::Relaxed),
        ]);
        // As in `read`.
        fence(Ordering::Acquire);
        let after = self.seq.load(Ordering::Relaxed);
        if before == after && before & 1 == 0 && self.gcras > 0 {
            (g, generation(before))
        } else {
            self.slow_one()
        }
    }

    /// Reads the numbers of the first `out.len()` quotas (at most `self.gcras`); their
    /// generation if no change was written meanwhile.
    #[inline]
    fn read(&self, out: &mut [Gcra]) -> Option<u16> {
        let before = self.seq.load(Ordering::Acquire);
        for (g, w) in out.iter_mut().zip(&self.words) {
            *g = Gcra::from_words([
                w[0].load(Ordering::Relaxed),
                w[1].load(Ordering::Relaxed),
                w[2].load(Ordering::Relaxed),
            ]);
        }
        // Orders the loads of the words before the second reading of the sequence: a word a
        // change wrote is seen with the odd number it wrote first, or a later one.
        fence(Ordering::Acquire);
        let after = self.seq.load(Ordering::Relaxed);
        (before == after && before & 1 == 0).then(|| generation(before))
    }

    #[cold]
    #[inline(never)]
    fn slow_one(&self) -> (Gcra, u16) {
        let limits = self.load();
        let g = limits.gcras.first().copied().unwrap_or(Gcra::new(1, 1));
        (g, limits.generation)
    }

    /// Replaces the quotas in force with those `f` makes of them, or leaves them if it says
    /// why not.
    pub(super) fn replace<E>(&self, f: impl FnOnce(&Limits) -> Result<Limits, E>) -> Result<(), E> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.limits.load();
        let mut new = f(&old)?;
        new.generation = old.generation.wrapping_add(1);
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd number before the words: a reader that sees a new word sees it.
        fence(Ordering::Release);
        self.write_words(&new);
        self.two.write(&new);
        let id = new.id;
        self.limits.store(Arc::new(new));
        self.current.store(id, Ordering::Release);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
        Ok(())
    }

    fn write_words(&self, limits: &Limits) {
        for (w, g) in self.words.iter().zip(limits.gcras.iter()).take(self.gcras) {
            for (word, value) in w.iter().zip(g.words()) {
                word.store(value, Ordering::Relaxed);
            }
        }
    }
}

impl Live {
    /// `v` with the single quota in force, of a policy of one quota kept in two words other
    /// than GCRA (a fixed window, a sliding counter, a warm-up quota), as its own kind: read
    /// without loading the quotas, unless a change was being written or the policy is of
    /// another shape (then its first quota, from [`load`](Self::load), as a [`Rule`]).
    ///
    /// Kept out of line: a check of one GCRA quota, decided in the same function as the
    /// other shapes, then keeps its own registers (inlined, the three kinds' arms cost it 2 to
    /// 6 instructions, and saved a fixed window about 19).
    #[inline(never)]
    pub(super) fn with_two<V: WithKind<Out = Decision>>(&self, v: V) -> Decision {
        let generation = std::cell::Cell::new(None);
        let mut d = (self.two).with(v, &generation, |v| self.with_loaded(v, &generation));
        d.stamp(generation.get().unwrap_or_default());
        d
    }

    #[cold]
    #[inline(never)]
    fn with_loaded<V: WithKind>(&self, v: V, generation: &std::cell::Cell<Option<u16>>) -> V::Out {
        let limits = self.load();
        generation.set(Some(limits.generation));
        v.with(&limits.rules[0])
    }
}

/// The generation of the quotas a reader found under the even sequence number `seq`.
#[inline]
fn generation(seq: u64) -> u16 {
    (seq >> 1) as u16
}

/// The numbers of a policy's single quota kept in two words, other than GCRA, in atomics
/// under their own sequence number (see the module documentation): a decision of a fixed
/// window, a sliding counter or a warm-up quota reads them without loading the `ArcSwap`.
/// The tag says the kind, so that a reader takes the words as the quota that wrote them; it
/// is 0 (read the `ArcSwap`) while the policy is of any other shape.
#[derive(Default)]
struct TwoRule {
    /// Even while `tag` and `words` hold the quota in force; odd while a change writes them.
    seq: AtomicU64,
    /// [`TwoQuota::words`]'s tag.
    tag: AtomicU64,
    words: [AtomicU64; QUOTA_WORDS],
}

impl TwoRule {
    /// Publishes the quota of `limits`, or the tag 0 when it is not one quota of these kinds.
    /// Changes are written one at a time (under [`Live`]'s writer lock, or at its making).
    fn write(&self, limits: &Limits) {
        let (tag, words) = match &*limits.rules {
            [rule] => TwoQuota::of(rule).map_or((0, [0; QUOTA_WORDS]), |q| q.words()),
            _ => (0, [0; QUOTA_WORDS]),
        };
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd number before the words: a reader that sees a new word sees it.
        fence(Ordering::Release);
        self.tag.store(tag, Ordering::Relaxed);
        for (word, value) in self.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// `v` with the quota published, as its own kind, its generation into `generation`;
    /// `otherwise(v)` when there is none or a change was written while reading it.
    #[inline]
    fn with<V: WithKind>(
        &self,
        v: V,
        generation: &std::cell::Cell<Option<u16>>,
        otherwise: impl FnOnce(V) -> V::Out,
    ) -> V::Out {
        let before = self.seq.load(Ordering::Acquire);
        let whole = || {
            // Orders the loads of the words before the second reading of the sequence.
            fence(Ordering::Acquire);
            let after = self.seq.load(Ordering::Relaxed);
            // Written once at the making, then once per change: one ahead of `Live::seq`.
            generation.set(Some(self::generation(before).wrapping_sub(1)));
            before == after && before & 1 == 0
        };
        TwoQuota::with_words(
            self.tag.load(Ordering::Relaxed),
            |i| self.words[i].load(Ordering::Relaxed),
            whole,
            v,
            otherwise,
        )
    }

    /// The quota published, if one is and no change was written while reading it.
    #[cfg(test)]
    fn get(&self) -> Option<Rule> {
        self.with(crate::algo::AsRule, &std::cell::Cell::new(None), |_| None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::quota::Quota;

    fn limits(quotas: &[Quota]) -> Limits {
        Limits::new(quotas.to_vec())
    }

    /// A check finds, among the sets of quotas its thread decided with last, the set in
    /// force of its own limiter: with more limiters than a thread keeps sets of, checked in
    /// turns, each changed between turns from this thread or from another; and a limiter
    /// made after others were dropped finds its own set, never one of theirs.
    #[test]
    fn a_check_finds_the_quotas_in_force_of_its_own_limiter_among_those_its_thread_kept() {
        let s = std::time::Duration::from_secs(1);
        let policy = |n: u32| vec![Quota::fixed_window(n, s), Quota::sliding_log(n, 2 * s)];
        let lives: Vec<Live> = (1..=2 * KEPT as u32)
            .map(|n| Live::new(limits(&policy(n))))
            .collect();
        let in_force = |live: &Live| live.with_limits(|l| l.quotas.to_vec());
        for round in 0..3u32 {
            for (i, live) in lives.iter().enumerate() {
                assert_eq!(in_force(live), live.load().quotas.to_vec(), "{round} {i}");
                // Found again at once, then changed from this thread.
                assert_eq!(in_force(live), live.load().quotas.to_vec(), "{round} {i}");
                let next = policy(100 * (round + 1) + i as u32);
                live.replace(|_| Ok::<_, ()>(limits(&next))).unwrap();
                assert_eq!(in_force(live), next, "{round} {i}");
            }
            // Changed from another thread: seen here at the next check.
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    for live in &lives {
                        live.replace(|_| Ok::<_, ()>(limits(&policy(7 + round))))
                            .unwrap();
                    }
                });
            });
            // The latest kept first: each one's set was found before the change.
            for live in lives.iter().rev() {
                assert_eq!(in_force(live), policy(7 + round));
            }
        }
        drop(lives);
        for n in 1..=2 * KEPT as u32 {
            let live = Live::new(limits(&policy(1_000 + n)));
            assert_eq!(in_force(&live), policy(1_000 + n));
        }
    }

    #[test]
    fn the_gcra_numbers_read_without_a_guard_are_those_of_the_quotas_in_force() {
        let live = Live::new(limits(&[Quota::per_second(5), Quota::per_minute(20)]));
        let mut out = [Gcra::new(1, 1); MAX_QUOTAS];
        assert_eq!(live.gcras(&mut out), Some((2, 0)));
        assert_eq!(&out[..2], &*live.load().gcras);
        live.replace(|_| Ok::<_, ()>(limits(&[Quota::per_hour(7), Quota::per_second(3).burst(9)])))
            .unwrap();
        assert_eq!(live.gcras(&mut out), Some((2, 1)));
        assert_eq!(&out[..2], &*live.load().gcras);
        assert_eq!(
            out[0],
            Quota::per_hour(7).rule().as_gcra().copied().unwrap()
        );
    }

    #[test]
    fn a_policy_with_a_quota_of_another_kind_is_read_whole() {
        let live = Live::new(limits(&[
            Quota::per_second(5),
            Quota::fixed_window(6, std::time::Duration::from_secs(1)),
        ]));
        let mut out = [Gcra::new(1, 1); MAX_QUOTAS];
        assert_eq!(live.gcras(&mut out), None);
    }

    #[test]
    fn a_refused_change_leaves_the_quotas_and_the_numbers() {
        let live = Live::new(limits(&[Quota::per_second(5)]));
        let before = live.one();
        assert_eq!(live.replace(|_| Err("no")), Err("no"));
        assert_eq!(live.one(), before);
        assert_eq!(live.seq.load(Ordering::Relaxed), 0);
        assert_eq!(live.load().generation, 0);
    }

    /// Readers racing a writer that flips between two policies only ever read one of the two
    /// whole, never the numbers of one with those of the other, and with its own generation
    /// (`b` odd, `a` even), by every path that reads them.
    #[test]
    fn readers_racing_changes_read_one_policy_whole() {
        let a = [Quota::per_second(5), Quota::per_minute(20).burst(3)];
        let b = [Quota::per_hour(9).burst(4), Quota::per_second(1000)];
        let gcras = |q: &[Quota]| -> Vec<Gcra> { limits(q).gcras.to_vec() };
        let (ga, gb) = (gcras(&a), gcras(&b));
        let live = Live::new(limits(&a));
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut out = [Gcra::new(1, 1); MAX_QUOTAS];
                    while !done.load(Ordering::Relaxed) {
                        if let Some((n, g)) = live.gcras(&mut out) {
                            let read = &out[..n];
                            let expect = if g % 2 == 0 { &ga } else { &gb };
                            assert_eq!(read, &expect[..], "torn read of generation {g}");
                        }
                        let (one, g) = live.one();
                        assert_eq!(one, if g % 2 == 0 { ga[0] } else { gb[0] });
                        let whole = live.load();
                        let expect = if whole.generation % 2 == 0 { &ga } else { &gb };
                        assert_eq!(&whole.gcras[..], &expect[..]);
                    }
                });
            }
            for i in 0..20_000 {
                let next = if i % 2 == 0 { &b } else { &a };
                live.replace(|_| Ok::<_, ()>(limits(next))).unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
    }

    /// A small model of GCRA on one key: each quota's time, all or nothing.
    struct Model {
        tats: Vec<u64>,
    }

    impl Model {
        /// Whether a request of `cost` is admitted at `now` under `gcras`, and its retry time.
        fn check(&mut self, gcras: &[Gcra], now: u64, cost: u32) -> (bool, Option<u64>) {
            let mut news = Vec::new();
            let (mut never, mut retry) = (false, 0);
            for (g, &tat) in gcras.iter().zip(&self.tats) {
                let inc = g.interval * u64::from(cost);
                let new = tat.max(now) + inc;
                if inc > g.tolerance {
                    never = true;
                } else if new - now > g.tolerance {
                    retry = retry.max(new - now - g.tolerance);
                }
                news.push(new);
            }
            if never {
                return (false, None);
            }
            if retry > 0 {
                return (false, Some(retry));
            }
            if cost > 0 {
                self.tats = news;
            }
            (true, None)
        }
    }

    mod model {
        use std::time::Duration;

        use proptest::prelude::*;

        use super::Model;
        use crate::algo::gcra::Gcra;
        use crate::{Clock, Quota, RateLimiter};

        #[derive(Debug, Clone)]
        enum Op {
            Check(u32),
            Wait(u64),
            /// Puts the policy of this index in force (of the limiter's number of quotas).
            Change(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0u32..4).prop_map(Op::Check),
                2 => (0u64..400).prop_map(Op::Wait),
                1 => (0usize..4).prop_map(Op::Change),
            ]
        }

        /// Policies of one GCRA quota and of two, four of each, to change among.
        fn policies(n: usize) -> Vec<Vec<Quota>> {
            let ones = [
                Quota::per_second(5),
                Quota::per_second(20).burst(2),
                Quota::per_second(1).burst(4),
                Quota::per_minute(90).burst(3),
            ];
            (0..4)
                .map(|i| (0..n).map(|j| ones[(i + j * 3) % 4].clone()).collect())
                .collect()
        }

        fn build<K>(quotas: &[Quota], clock: &Clock) -> RateLimiter<K>
        where
            K: std::hash::Hash + Eq + Clone + Send + Sync,
        {
            crate::limiter::test_builder(quotas, clock).build()
        }

        fn gcras(quotas: &[Quota]) -> Vec<Gcra> {
            quotas
                .iter()
                .filter_map(|q| q.rule().as_gcra().copied())
                .collect()
        }

        proptest! {
            /// A change of quotas judges the very next check, on the path that reads the GCRA
            /// numbers without loading the quotas: the single key of `()` and a key of a table,
            /// with one quota and with two, decide as the model under the quotas in force.
            #[test]
            fn every_check_is_judged_by_the_quotas_in_force_at_once(
                ops in prop::collection::vec(op(), 1..80)
            ) {
                for n in [1, 2] {
                    let policies = policies(n);
                    let (clock, time) = Clock::manual();
                    let direct = build::<()>(&policies[0], &clock);
                    let keyed = build::<u8>(&policies[0], &clock);
                    let mut in_force = gcras(&policies[0]);
                    let (mut a, mut b) = (Model { tats: vec![0; n] }, Model { tats: vec![0; n] });
                    for op in &ops {
                        match *op {
                            Op::Check(cost) => {
                                let now = clock.now();
                                let want = a.check(&in_force, now, cost);
                                prop_assert_eq!(want, b.check(&in_force, now, cost));
                                for d in [direct.check_n(&(), cost), keyed.check_n(&3, cost)] {
                                    prop_assert_eq!(d.is_allowed(), want.0);
                                    if !want.0 {
                                        prop_assert_eq!(
                                            d.retry_after(),
                                            want.1.map(Duration::from_nanos)
                                        );
                                    }
                                }
                            }
                            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                            Op::Change(i) => {
                                direct.set_quotas(policies[i].clone()).unwrap();
                                keyed.set_quotas(policies[i].clone()).unwrap();
                                in_force = gcras(&policies[i]);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod two_tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;
    use crate::quota::Quota;

    fn limits(quotas: &[Quota]) -> Limits {
        Limits::new(quotas.to_vec())
    }

    fn second() -> Duration {
        Duration::from_secs(1)
    }

    #[test]
    fn the_quota_in_two_words_read_without_a_guard_is_the_quota_in_force() {
        for (a, b) in [
            (
                Quota::fixed_window(5, second()),
                Quota::fixed_window(9, Duration::from_millis(300)),
            ),
            (
                Quota::sliding_window(5, second()),
                Quota::sliding_window(2, Duration::from_secs(7)),
            ),
            (
                Quota::new(5, second()).warm_up(Duration::from_secs(60), 3),
                Quota::new(40, second()).burst(7).warm_up(second(), 5),
            ),
        ] {
            let live = Live::new(limits(&[a]));
            assert_eq!(live.two.get(), Some(live.load().rules[0]));
            let mut new = limits(&[b]);
            Rule::replacing(&mut new.rules, &live.load().rules, 5_000_000_000);
            let want = new.rules[0];
            live.replace(|_| Ok::<_, ()>(new)).unwrap();
            assert_eq!(live.two.get(), Some(want));
            assert_eq!(live.two.get(), Some(live.load().rules[0]));
        }
    }

    #[test]
    fn a_policy_of_another_shape_reads_no_quota_in_two_words() {
        let window = Quota::fixed_window(5, second());
        for other in [
            vec![Quota::per_second(5)],
            vec![Quota::sliding_log(5, second())],
            vec![window.clone(), Quota::per_second(5)],
            vec![
                window.clone(),
                Quota::fixed_window(50, Duration::from_secs(60)),
            ],
        ] {
            assert_eq!(Live::new(limits(&other)).two.get(), None, "{other:?}");
            // A change to another kind or another number of quotas (which `set_quotas`
            // refuses, but the words must not outlive) leaves the words, and back again.
            let live = Live::new(limits(std::slice::from_ref(&window)));
            live.replace(|_| Ok::<_, ()>(limits(&other))).unwrap();
            assert_eq!(live.two.get(), None, "{other:?}");
            live.replace(|_| Ok::<_, ()>(limits(std::slice::from_ref(&window))))
                .unwrap();
            assert_eq!(live.two.get(), Some(window.rule()));
        }
        let live = Live::new(limits(std::slice::from_ref(&window)));
        assert_eq!(live.replace(|_| Err("no")), Err("no"));
        assert_eq!(live.two.get(), Some(window.rule()));
    }

    /// Readers racing a writer that moves among a fixed window, a warm-up quota (ten words)
    /// and a GCRA quota only ever read one quota whole, of its own kind, or none for GCRA.
    #[test]
    fn readers_racing_changes_read_one_quota_in_two_words_whole() {
        let policies = [
            vec![Quota::fixed_window(5, second())],
            vec![Quota::new(40, second()).burst(7).warm_up(second(), 5)],
            vec![Quota::per_minute(9)],
            vec![Quota::sliding_window(3, Duration::from_secs(9))],
        ];
        let rules: Vec<Rule> = policies.iter().map(|p| p[0].rule()).collect();
        let live = Live::new(limits(&policies[0]));
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !done.load(Ordering::Relaxed) {
                        if let Some(rule) = live.two.get() {
                            assert!(rules.contains(&rule), "torn read {rule:?}");
                            assert!(!matches!(rule, Rule::Gcra(_)));
                        }
                    }
                });
            }
            for i in 0..20_000 {
                let next = &policies[i % policies.len()];
                live.replace(|_| Ok::<_, ()>(limits(next))).unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
    }

    mod model {
        use std::time::Duration;

        use proptest::prelude::*;

        use crate::algo::{self, KeyState};
        use crate::{Clock, Quota, RateLimiter};

        #[derive(Debug, Clone)]
        enum Op {
            Check(u32),
            Wait(u64),
            /// Puts the policy of this index in force.
            Change(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0u32..4).prop_map(Op::Check),
                2 => (0u64..700).prop_map(Op::Wait),
                1 => (0usize..4).prop_map(Op::Change),
            ]
        }

        /// Four policies of one quota of each kind kept in two words, to change among.
        fn policies() -> [[Quota; 4]; 3] {
            let ms = Duration::from_millis;
            [
                [
                    Quota::fixed_window(5, ms(1000)),
                    Quota::fixed_window(2, ms(300)),
                    Quota::fixed_window(8, ms(2500)),
                    Quota::fixed_window(3, ms(700)),
                ],
                [
                    Quota::sliding_window(5, ms(1000)),
                    Quota::sliding_window(2, ms(300)),
                    Quota::sliding_window(8, ms(2500)),
                    Quota::sliding_window(3, ms(700)),
                ],
                [
                    Quota::per_second(5).warm_up(ms(3000), 3),
                    Quota::per_second(20).burst(2).warm_up(ms(500), 4),
                    Quota::per_second(1).burst(4).warm_up(ms(8000), 2),
                    Quota::per_minute(90).burst(3).warm_up(ms(1000), 3),
                ],
            ]
        }

        fn build<K>(quota: &Quota, clock: &Clock) -> RateLimiter<K>
        where
            K: std::hash::Hash + Eq + Clone + Send + Sync,
        {
            crate::limiter::test_builder(std::slice::from_ref(quota), clock).build()
        }

        proptest! {
            /// A change of quota judges the very next check, on the path that reads a quota
            /// kept in two words without loading the quotas: the single key of `()` and a key
            /// of a table decide as the general state does under the quota in force (read
            /// from the whole set), made new at a change when idle under the quota it
            /// replaces, for a fixed window, a sliding counter and a warm-up.
            #[test]
            fn every_check_of_a_quota_in_two_words_is_judged_by_the_quota_in_force_at_once(
                ops in prop::collection::vec(op(), 1..80)
            ) {
                for policies in policies() {
                    let (clock, time) = Clock::manual();
                    time.advance(Duration::from_secs(10));
                    let direct = build::<()>(&policies[0], &clock);
                    let keyed = build::<u8>(&policies[0], &clock);
                    let (mut a, mut b) = (KeyState::default(), KeyState::default());
                    for op in &ops {
                        match *op {
                            Op::Check(cost) => {
                                let now = clock.now();
                                let rules = direct.inner.live.load().rules.clone();
                                prop_assert_eq!(&rules, &keyed.inner.live.load().rules);
                                prop_assert!(direct.inner.live.two.get().is_some());
                                let (want, _) = algo::decide(&rules, &mut a, now, cost);
                                let (again, _) = algo::decide(&rules, &mut b, now, cost);
                                prop_assert_eq!(want, again);
                                prop_assert_eq!(direct.check_n(&(), cost), want);
                                prop_assert_eq!(keyed.check_n(&3, cost), want);
                            }
                            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                            Op::Change(i) => {
                                // A key idle under the quota in force is new under the next.
                                let rules = direct.inner.live.load().rules.clone();
                                for s in [&mut a, &mut b] {
                                    if s.idle_at(&rules) <= clock.now() {
                                        *s = KeyState::default();
                                    }
                                }
                                direct.set_quotas([policies[i].clone()]).unwrap();
                                keyed.set_quotas([policies[i].clone()]).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }
}
